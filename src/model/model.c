/*
 * Model objects: loading an HF folder into the flat parameter buffer, random
 * initialisation, saving, and allocating the activation buffers used by the
 * forward and backward passes (run.c).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/kernels.h"
#include "model_impl.h"

cllm_status model_from_config(cllm_model **out, const json_t *config, const char *path) {
    return model_from_config_ex(out, config, path, true);
}

cllm_status model_from_config_ex(cllm_model **out, const json_t *config, const char *path, bool alloc) {
    return model_from_config_vh(out, config, path, alloc, false);
}

cllm_status model_from_config_vh(cllm_model **out, const json_t *config, const char *path, bool alloc,
                                 bool value_head) {
    *out = NULL;
    cllm_model *m = calloc(1, sizeof *m);
    if (!m) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_model_config_from_json(&m->cfg, config, path);
    if (st) goto fail;
    if (value_head && m->cfg.num_labels > 0) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a value head (v_head.summary.weight) on a sequence-classification "
                       "model", path);
        goto fail;
    }
    m->cfg.value_head = value_head;
    m->config_json = json_deep_copy(config);
    if (!m->config_json) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot copy config");
        goto fail;
    }
    if ((st = model_build_layout(m))) goto fail;
    if (!alloc) {
        *out = m;
        return CLLM_OK;
    }
    m->params = cllm_calloc(m->n_params, sizeof(float), "model parameters");
    if (!m->params) {
        st = CLLM_ERR_NOMEM;
        goto fail;
    }
    *out = m;
    return CLLM_OK;
fail:
    cllm_model_free(m);
    return st;
}

void cllm_model_free(cllm_model *m) {
    if (!m) return;
    model_shared_detach(m); /* a run over shared weights: forget what it borrowed */
    json_decref(m->config_json);
    free(m->tensors);
    free(m->lslot);
    free(m->tgroup);
    free(m->groups);
    cllm_free(m->params);
    cllm_free(m->grads);
    cllm_free(m->acts);
    model_lp_release(m);
    model_weights_free(m);
    model_qbase_free(m);
    model_trainable_free(m);
    model_lora_free(m);
    free(m->layers);
    free(m->tp_max);
    free(m->tp_sum);
    free(m->sp_counts);
    free(m->moe_load);
    model_moe_ep_free(m);
    free(m->prof);
    free(m);
}

/* ------------------------------------------------------------ profile */

static const char *const prof_names[CLLM_PROF_N] = {
    "gemm_fwd", "gemm_bwd", "head_gemm", "xent", "attn_fwd", "attn_bwd",
    "norm", "act", "rope", "residual", "zero", "embed"};

const char *cllm_prof_name(int phase) { return phase >= 0 && phase < CLLM_PROF_N ? prof_names[phase] : "?"; }

cllm_status cllm_model_set_profile(cllm_model *m, bool on) {
    if (!on) {
        free(m->prof);
        m->prof = NULL;
        return CLLM_OK;
    }
    if (!m->prof) {
        m->prof = calloc(CLLM_PROF_N, sizeof(double));
        if (!m->prof) return CLLM_FAIL(CLLM_ERR_NOMEM, "profile counters");
    }
    memset(m->prof, 0, CLLM_PROF_N * sizeof(double));
    return CLLM_OK;
}

void cllm_model_take_profile(cllm_model *m, double seconds[CLLM_PROF_N]) {
    for (int i = 0; i < CLLM_PROF_N; i++) seconds[i] = m->prof ? m->prof[i] : 0.0;
    if (m->prof) memset(m->prof, 0, CLLM_PROF_N * sizeof(double));
}

/* ------------------------------------------------------------ loading */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Buffers that HF files may carry but that are not parameters. */
static bool ignored_buffer(const cllm_model *m, const char *name) {
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return m->cfg.arch == CLLM_ARCH_GPT2;
    if (ends_with(name, "rotary_emb.inv_freq")) return true;
    if (strcmp(name, "lm_head.weight") == 0) return m->cfg.tie_embeddings;
    return false;
}

/* Maps a file's tensor name to our tensor index: exact, or with the family's
 * prefix ("transformer." / "model.") that some exports leave out. */
static int find_index(const cllm_model *m, const char *name) {
    const cllm_tensor_info *t = cllm_model_find_tensor(m, name);
    if (!t) {
        char buf[160];
        const char *prefix = m->cfg.arch == CLLM_ARCH_LLAMA ? "model." : "transformer.";
        snprintf(buf, sizeof buf, "%s%s", prefix, name);
        t = cllm_model_find_tensor(m, buf);
    }
    return t ? (int)(t - m->tensors) : -1;
}

/* The format config.json's "cllm_weights" names (a folder written by
 * cllm convert --quantize), else bf16 when the first stored matrix of the
 * files is BF16, else fp32. */
cllm_status model_stored_format(const cllm_model *m, const json_t *config, const cllm_st_set *set, const char *path,
                                 cllm_wfmt *out) {
    json_t *q = json_object_get(config, "cllm_weights");
    *out = CLLM_WFMT_FP32;
    if (q) {
        const char *name = json_string_value(json_object_get(q, "format"));
        if (!json_is_object(q) || !cllm_wfmt_from_name(name, out))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'cllm_weights.format' must be \"fp32\", \"bf16\", \"int8\" or "
                             "\"q4\"", path);
        return CLLM_OK;
    }
    for (int i = 0; i < cllm_st_set_count(set); i++) {
        const cllm_st_tensor *t = cllm_st_set_at(set, i);
        int idx = find_index(m, t->name);
        if (idx >= 0 && (idx == m->gslot[G_HEAD] || (m->tensors[idx].ndim == 2 && idx != m->gslot[G_WTE] &&
                                                      idx != m->gslot[G_WPE]))) {
            if (t->dtype == CLLM_BF16) *out = CLLM_WFMT_BF16;
            break;
        }
    }
    return CLLM_OK;
}

/* The flat buffer of a model whose matrices live in a weight store: zero
 * pages from calloc that the system maps only where written (norms,
 * biases, position embeddings), not 64-byte aligned (nothing there needs
 * it). */
static cllm_status lazy_params(cllm_model *m) {
    float *p = calloc(m->n_params ? m->n_params : 1, sizeof(float));
    if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
    cllm_free(m->params);
    m->params = p;
    m->params_lazy = true;
    return CLLM_OK;
}

cllm_status model_load_tensors(const cllm_model *m, const char *dir, model_tensor_fn put, void *ctx) {
    cllm_st_set *set = NULL;
    bool *seen = NULL;
    cllm_status st = cllm_st_set_open(&set, dir);
    if (st) return st;
    seen = calloc((size_t)m->n_tensors, sizeof *seen);
    if (!seen) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    model_moe_file mf = {0};
    for (int i = 0; i < cllm_st_set_count(set); i++) {
        const cllm_st_tensor *t = cllm_st_set_at(set, i);
        bool fused;
        if ((st = model_moe_file_tensor(m, t, put, ctx, seen, &mf, &fused))) goto done;
        if (fused) continue;
        int idx = find_index(m, t->name);
        if (idx < 0) {
            if (ignored_buffer(m, t->name)) continue;
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: unexpected tensor '%s' for a %s model", t->file, t->name,
                           cllm_arch_name(m->cfg.arch));
            goto done;
        }
        const cllm_tensor_info *ti = &m->tensors[idx];
        /* U8: a matrix of a folder written by cllm convert --quantize, raw
         * blocks whose size is the put callback's to check */
        bool shape_ok = t->dtype == CLLM_U8 || (t->ndim == ti->ndim && t->shape[0] == ti->shape[0] &&
                                                (ti->ndim == 1 || t->shape[1] == ti->shape[1]));
        if (!shape_ok) {
            char got[128] = "", want[64];
            size_t len = 0;
            for (int d = 0; d < t->ndim && len < sizeof got - 24; d++)
                len += (size_t)snprintf(got + len, sizeof got - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            if (ti->ndim == 1)
                snprintf(want, sizeof want, "%lld", (long long)ti->shape[0]);
            else
                snprintf(want, sizeof want, "%lld, %lld", (long long)ti->shape[0], (long long)ti->shape[1]);
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' has shape [%s], the config needs [%s]", t->file, t->name, got,
                           want);
            goto done;
        }
        if (seen[idx]) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' appears twice", t->file, ti->name);
            goto done;
        }
        if ((st = put(ctx, idx, t))) goto done;
        seen[idx] = true;
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (!seen[i]) {
            char buf[96];
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: missing tensor '%s'%s", dir,
                           model_moe_file_name(m, i, &mf, buf, sizeof buf),
                           i == m->gslot[G_SCORE] ? " (the score head [1, hidden] that config.json's "
                           "*ForSequenceClassification architecture needs)" : "");
            goto done;
        }
done:
    free(seen);
    cllm_st_set_close(set);
    return st;
}

static cllm_status put_whole(void *ctx, int idx, const cllm_st_tensor *t) {
    cllm_model *m = ctx;
    if (t->dtype == CLLM_U8)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' holds U8 values but config.json has no cllm_weights",
                         t->file, t->name);
    cllm_status st = cllm_st_read_f32(t, m->params + m->tensors[idx].offset, (int64_t)m->tensors[idx].numel);
    /* the file's pages of this tensor are copied: out of the resident set
     * (a later read maps them again), so that loading holds the parameter
     * buffer and one tensor of the file, not the whole file beside it */
    cllm_mem_release((void *)(uintptr_t)t->data, t->nbytes);
    return st;
}

/* Loading with a weight store: matrices in the run's format, the rest fp32. */
typedef struct {
    cllm_model *m;
    cllm_wfmt file_fmt;
} put_fmt_ctx;

static cllm_status put_weights(void *ctx, int idx, const cllm_st_tensor *t) {
    put_fmt_ctx *c = ctx;
    cllm_model *m = c->m;
    float *dst = m->params + m->tensors[idx].offset;
    if (t->dtype == CLLM_U8) { /* a matrix of a folder written by cllm convert --quantize */
        if (c->file_fmt == CLLM_WFMT_FP32) return put_whole(m, idx, t);
        return model_weights_stored(m, idx) ? model_weights_read(m, idx, t, c->file_fmt)
                                            : model_weights_widen(m, idx, t, c->file_fmt, dst);
    }
    if (model_weights_stored(m, idx)) return model_weights_read(m, idx, t, c->file_fmt);
    return put_whole(m, idx, t);
}

/* huge: an fp32 flat buffer on transparent huge pages (cllm_alloc_huge),
 * for the runs that only read it (generate, eval, serve); a training run's
 * buffer stays on 4 KiB pages, whose parts ZeRO and pipeline stages give
 * back (cllm_mem_release) and the kernel must not fold into huge pages
 * again. */
static cllm_status load_weights(cllm_model **out, const char *dir, const char *weights, bool huge);

cllm_status cllm_model_load(cllm_model **out, const char *dir) { return load_weights(out, dir, "fp32", false); }

cllm_status cllm_model_load_weights(cllm_model **out, const char *dir, const char *weights) {
    return load_weights(out, dir, weights, true);
}

static cllm_status load_weights(cllm_model **out, const char *dir, const char *weights, bool huge) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *config = NULL;
    cllm_model *m = NULL;
    cllm_st_set *set = NULL;
    cllm_status st = cllm_json_load_file(&config, path);
    if (st) return st;
    /* the layout first, the flat buffer once the format is known */
    if ((st = model_from_config_ex(&m, config, path, false)) || (st = cllm_st_set_open(&set, dir))) goto done;
    /* trl's value-head models keep v_head.summary.* beside the model's tensors */
    if (cllm_st_set_find(set, "v_head.summary.weight")) {
        cllm_model_free(m);
        if ((st = model_from_config_vh(&m, config, path, false, true))) goto done;
    }
    put_fmt_ctx pc = {m, CLLM_WFMT_FP32};
    st = model_stored_format(m, config, set, path, &pc.file_fmt);
    cllm_st_set_close(set);
    set = NULL;
    if (st) goto done;
    cllm_wfmt fmt = pc.file_fmt;
    if (weights && !cllm_wfmt_from_name(weights, &fmt)) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "unknown weight format '%s' (expected fp32, bf16, int8 or q4)", weights);
        goto done;
    }
    if (fmt != CLLM_WFMT_FP32) {
        if ((st = model_weights_init(m, fmt)) || (st = lazy_params(m))) goto done;
    } else if (!(m->params = huge ? cllm_calloc_huge(m->n_params, sizeof(float), "model parameters")
                                  : cllm_calloc(m->n_params, sizeof(float), "model parameters"))) {
        st = CLLM_ERR_NOMEM;
        goto done;
    }
    st = model_load_tensors(m, dir, put_weights, &pc);
done:
    cllm_st_set_close(set);
    json_decref(config);
    if (st) {
        cllm_model_free(m);
        return st;
    }
    *out = m;
    return CLLM_OK;
}

/* ------------------------------------------------------------ init */

cllm_status cllm_model_init_random(cllm_model **out, const json_t *config, uint64_t seed) {
    cllm_status st = model_from_config(out, config, "config");
    if (st) return st;
    cllm_model *m = *out;
    double std = 0.02;
    cllm_json_get_num_opt(config, "initializer_range", &std, "config");
    cllm_rng rng;
    cllm_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_tensors; i++) {
        const cllm_tensor_info *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            /* norm weights start at 1, biases at 0 */
            float v = (ends_with(t->name, ".weight")) ? 1.0f : 0.0f;
            for (size_t k = 0; k < t->numel; k++) p[k] = v;
            continue;
        }
        double s = std;
        /* GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) */
        if (m->cfg.arch == CLLM_ARCH_GPT2 && ends_with(t->name, "c_proj.weight")) s /= sqrt(2.0 * m->cfg.n_layer);
        for (size_t k = 0; k < t->numel; k++) p[k] = (float)(s * cllm_rng_normal(&rng));
    }
    return CLLM_OK;
}

/* ------------------------------------------------------------ saving */

cllm_status cllm_model_save(const cllm_model *m, const char *dir, size_t max_shard_bytes) {
    cllm_status st = cllm_make_dirs(dir);
    if (st) return st;
    cllm_st_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    float **copies = calloc((size_t)m->n_tensors, sizeof *copies); /* file-layout copies of conv_rows matrices */
    if (!e || !copies) {
        free(e);
        free(copies);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < m->n_tensors && !st; i++) {
        const cllm_tensor_info *t = &m->tensors[i];
        e[i].name = t->name;
        e[i].dtype = CLLM_F32;
        e[i].ndim = t->ndim;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
        e[i].data = m->params + t->offset;
        if (!m->conv_rows) continue;
        float *tmp;
        if (!(e[i].data = model_conv_file_layout(m, i, &tmp))) st = CLLM_ERR_NOMEM;
        copies[i] = tmp;
    }
    int n = m->n_tensors;
    model_moe_fused *fused = NULL;
    if (!st) st = model_moe_fuse_entries(m, e, &n, &fused);
    if (!st) st = cllm_st_save_dir(dir, e, n, max_shard_bytes);
    model_moe_fused_free(fused);
    for (int i = 0; i < m->n_tensors; i++) cllm_free(copies[i]);
    free(copies);
    free(e);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return cllm_json_save_file(m->config_json, path);
}

/* ------------------------------------------------------------ accessors */

const cllm_model_config *cllm_model_get_config(const cllm_model *m) { return &m->cfg; }
int cllm_model_n_tensors(const cllm_model *m) { return m->n_tensors; }
const json_t *cllm_model_config_json(const cllm_model *m) { return m->config_json; }
const cllm_tensor_info *cllm_model_tensor(const cllm_model *m, int i) {
    return (i >= 0 && i < m->n_tensors) ? &m->tensors[i] : NULL;
}
const cllm_tensor_info *cllm_model_find_tensor(const cllm_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}
size_t cllm_model_n_params(const cllm_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) n += m->tensors[i].numel;
    return n;
}
size_t cllm_model_buffer_len(const cllm_model *m) { return m->n_params; }
float *cllm_model_params(cllm_model *m) {
    /* the caller may write through the pointer (never into shared weights) */
    if (!m->shared || m->own_params) atomic_store(&m->lp_stale, true);
    return m->params;
}
float *cllm_model_grads(cllm_model *m) { return m->grads; }

int cllm_model_n_groups(const cllm_model *m) { return m->cfg.n_layer + 2; }
void cllm_model_group_range(const cllm_model *m, int group, size_t *begin, size_t *end) {
    *begin = m->groups[group].begin;
    *end = m->groups[group].end;
}
void cllm_model_set_hooks(cllm_model *m, const cllm_model_hooks *hooks) {
    memset(&m->hooks, 0, sizeof m->hooks);
    if (hooks) m->hooks = *hooks;
    for (int g = 0; g < m->cfg.n_layer + 2; g++) {
        m->groups[g].p = m->groups[g].g = NULL;
        m->groups[g].lp = NULL;
    }
}
void cllm_model_drop_params(cllm_model *m) {
    if (m->shared && !m->own_params) m->params = m->lp_params = NULL; /* borrowed: only forgotten */
    cllm_free(m->params);
    m->params = NULL;
    cllm_free(m->lp_params);
    m->lp_params = NULL;
}
void cllm_model_set_params(cllm_model *m, float *params) {
    if (m->shared && !m->own_params) { /* borrowed: never freed here; the run's own from now on */
        m->params = m->lp_params = NULL;
        m->own_params = true;
    }
    cllm_free(m->params);
    m->params = params;
    atomic_store(&m->lp_stale, true); /* a bf16/fp16 copy is made from them when first needed */
}

void cllm_model_zero_grads(cllm_model *m) {
    if (m->grads) memset(m->grads, 0, cllm_model_trainable_len(m) * sizeof(float));
}

/* ------------------------------------------------------------ buffers */

/* Carves consecutive 64-byte-aligned regions out of one allocation. Called
 * twice: once with base == NULL to measure, once to assign. */
typedef struct {
    float *base;
    size_t used;
} carver;

static float *carve(carver *cv, size_t n) {
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (n + 15) & ~(size_t)15;
    return p;
}

/* Part boundaries of one carving (in floats), for cllm_act_bytes. */
typedef struct {
    size_t inputs, set, saved, logits, head, backward;
} carve_parts;

/* Lays out every activation in carving order and records the parts. Without
 * recompute each block gets its own set (interleaved, x first); with it,
 * the n_layer inputs come first and one set follows that every layer points
 * to. `layers` may be NULL when only measuring. */

/* The activations one block saves for its backward (all but its input x). */
/* With sequence parallelism over sp ranks the norms' outputs and
 * statistics and the residual x1 hold N / sp rows (this rank's positions). */
static void carve_block_set(carver *cv, layer_acts *a, const cllm_model_config *c, int B, int T, int sp) {
    size_t N = (size_t)B * T, C = (size_t)c->n_embd, F = (size_t)c->n_inner, Nl = N / (size_t)sp;
    size_t QKV = (size_t)model_qkv_width(c), Q = (size_t)c->n_head * c->head_dim;
    a->ln1 = carve(cv, Nl * C);
    a->ln1_mean = carve(cv, Nl);
    a->ln1_rstd = carve(cv, Nl);
    a->qkv = carve(cv, N * QKV);
    a->atty = carve(cv, N * Q);
    a->lse = carve(cv, (size_t)B * c->n_head * T);
    a->x1 = carve(cv, Nl * C);
    a->ln2 = carve(cv, Nl * C);
    a->ln2_mean = carve(cv, Nl);
    a->ln2_rstd = carve(cv, Nl);
    if (c->n_experts) { /* Mixtral: the sparse FFN's own state instead */
        a->fc = a->up = a->act = NULL;
        a->moe = carve(cv, model_moe_act_floats(c, N));
        return;
    }
    a->fc = carve(cv, N * F);
    a->up = c->arch == CLLM_ARCH_LLAMA ? carve(cv, N * F) : NULL;
    a->act = carve(cv, N * F);
}

static void assign_acts(const cllm_model_config *c, cllm_model *m, layer_acts *layers, carver *cv, int B, int T,
                        bool train, bool recompute, int sp, carve_parts *parts) {
    size_t N = (size_t)B * T, C = (size_t)c->n_embd, F = (size_t)c->n_inner, Nl = N / (size_t)sp;
    size_t QKV = (size_t)model_qkv_width(c), Q = (size_t)c->n_head * c->head_dim;
    layer_acts scratch, shared;
    memset(&shared, 0, sizeof shared);
    size_t mark, inputs = 0, set = 0, saved = 0;
    for (int l = 0; l < c->n_layer; l++) {
        layer_acts *a = layers ? &layers[l] : &scratch;
        mark = cv->used;
        a->x = carve(cv, Nl * C);
        inputs += cv->used - mark;
        if (recompute) continue; /* the shared set is carved after all inputs */
        mark = cv->used;
        carve_block_set(cv, a, c, B, T, sp);
        set = cv->used - mark;
        saved += set;
    }
    if (recompute) {
        /* one set after the inputs; every layer points at it */
        layer_acts *a = &shared;
        mark = cv->used;
        carve_block_set(cv, a, c, B, T, sp);
        set = saved = cv->used - mark;
        for (int l = 0; layers && l < c->n_layer; l++) {
            float *x = layers[l].x;
            layers[l] = shared;
            layers[l].x = x;
        }
    }
    parts->inputs = inputs;
    parts->set = set;
    parts->saved = saved;
    mark = cv->used;
    float *x_out = carve(cv, Nl * C);
    float *lnf = carve(cv, N * C); /* the head's input: gathered whole under sequence parallelism */
    float *lnf_mean = carve(cv, Nl);
    float *lnf_rstd = carve(cv, Nl);
    float *emb = NULL, *emb_mean = NULL, *emb_rstd = NULL;
    if (c->arch == CLLM_ARCH_BLOOM) {
        emb = carve(cv, Nl * C);
        emb_mean = carve(cv, Nl);
        emb_rstd = carve(cv, Nl);
    }
    /* sequence parallelism: the gathered and packed [N,C] buffers, the
     * local [N/sp,C] one and a norm's local parameter gradients */
    float *sp_full = NULL, *sp_pack = NULL, *sp_loc = NULL, *sp_dnorm = NULL;
    if (sp > 1) {
        sp_full = carve(cv, N * C);
        sp_pack = B > 1 ? carve(cv, N * C) : NULL;
        sp_loc = carve(cv, Nl * C);
        sp_dnorm = train ? carve(cv, 2 * C) : NULL;
    }
    size_t lmark = cv->used;
    float *logits = carve(cv, (size_t)model_logit_chunk(c, (int)N) * c->vocab_size);
    parts->logits = cv->used - lmark;
    float *losses = carve(cv, N);
    float *rope_cos = carve(cv, (size_t)T * (c->head_dim / 2));
    float *rope_sin = carve(cv, (size_t)T * (c->head_dim / 2));
    float *alibi = carve(cv, (size_t)c->n_head);
    float *moe_scratch = c->n_experts ? carve(cv, model_moe_scratch_floats(c, N, train)) : NULL;
    parts->head = cv->used - mark - parts->logits;
    mark = cv->used;
    float *d[8] = {NULL};
    if (train) {
        d[0] = carve(cv, Nl * C);  /* dx */
        d[1] = carve(cv, N * C);   /* dln */
        d[2] = carve(cv, N * C);   /* dlnf */
        d[3] = carve(cv, N * QKV); /* dqkv */
        d[4] = carve(cv, N * Q);   /* datty */
        d[5] = carve(cv, N * F);   /* dfc */
        if (c->arch == CLLM_ARCH_LLAMA) d[6] = carve(cv, N * F); /* dup */
        d[7] = carve(cv, N * F);   /* dact */
    }
    parts->backward = cv->used - mark;
    if (!m) return;
    m->x_out = x_out;
    m->lnf = lnf;
    m->lnf_mean = lnf_mean;
    m->lnf_rstd = lnf_rstd;
    m->emb = emb;
    m->emb_mean = emb_mean;
    m->emb_rstd = emb_rstd;
    m->logits = logits;
    m->losses = losses;
    m->rope_cos = rope_cos;
    m->rope_sin = rope_sin;
    m->alibi = alibi;
    m->moe_scratch = moe_scratch;
    m->moe_stats = (double *)(void *)moe_scratch; /* the scratch starts with the statistics (moe.c) */
    m->sp_full = sp_full;
    m->sp_pack = sp_pack;
    m->sp_loc = sp_loc;
    m->sp_dnorm = sp_dnorm;
    m->dx = d[0];
    m->dln = d[1];
    m->dlnf = d[2];
    m->dqkv = d[3];
    m->datty = d[4];
    m->dfc = d[5];
    m->dup = d[6];
    m->dact = d[7];
}

void cllm_model_activation_bytes(const cllm_model_config *c, int B, int T, bool train, bool recompute,
                                 cllm_act_bytes *out) {
    cllm_model_activation_bytes_sp(c, B, T, train, recompute, 1, out);
}

void cllm_model_activation_bytes_sp(const cllm_model_config *c, int B, int T, bool train, bool recompute, int sp,
                                    cllm_act_bytes *out) {
    carver cv = {NULL, 0};
    carve_parts p;
    if (sp < 1 || T % sp) sp = 1;
    assign_acts(c, NULL, NULL, &cv, B, T, train, recompute, sp, &p);
    out->block_inputs = p.inputs * sizeof(float);
    out->block_set = p.set * sizeof(float);
    out->block_saved = p.saved * sizeof(float);
    out->logits = p.logits * sizeof(float);
    out->head = p.head * sizeof(float);
    out->backward = p.backward * sizeof(float);
    out->total = cv.used * sizeof(float);
}

void cllm_model_set_recompute(cllm_model *m, bool on) { m->recompute = on; }
bool cllm_model_recomputes(const cllm_model *m) { return m->acts && m->acts_recompute; }
size_t cllm_model_activation_alloc(const cllm_model *m) { return m->acts ? m->acts_floats * sizeof(float) : 0; }

cllm_status cllm_model_config_params(const cllm_model_config *c, size_t *n_params, size_t *buffer_len) {
    cllm_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *c;
    cllm_status st = model_build_layout(&tmp);
    if (!st) {
        *buffer_len = tmp.n_params;
        *n_params = cllm_model_n_params(&tmp);
    }
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    return st;
}

cllm_status cllm_model_config_groups(const cllm_model_config *c, size_t *first, size_t *last, size_t *max_block) {
    cllm_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *c;
    cllm_status st = model_build_layout(&tmp);
    if (!st) {
        const struct model_group *g = tmp.groups;
        int L = c->n_layer;
        *first = g[0].end - g[0].begin;
        *last = g[L + 1].end - g[L + 1].begin;
        *max_block = 0;
        for (int l = 1; l <= L; l++)
            if (g[l].end - g[l].begin > *max_block) *max_block = g[l].end - g[l].begin;
    }
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    return st;
}

cllm_status cllm_model_config_unit_small(const cllm_model_config *c, double threshold, size_t *units) {
    cllm_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *c;
    cllm_status st = model_build_layout(&tmp);
    for (int u = 0; !st && u < c->n_layer + 2; u++) units[u] = 0;
    for (int i = 0; !st && i < tmp.n_tensors; i++) /* the groups are the units */
        if ((double)tmp.tensors[i].numel < threshold) units[tmp.tgroup[i]] += tmp.tensors[i].numel;
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    return st;
}

cllm_status cllm_model_config_unit_params(const cllm_model_config *c, size_t *units) {
    cllm_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *c;
    cllm_status st = model_build_layout(&tmp);
    if (!st) {
        int L = c->n_layer;
        for (int u = 0; u < L + 2; u++) units[u] = 0;
        for (int i = 0; i < tmp.n_tensors; i++) /* every tensor of block l (Mixtral's experts included) */
            if (tmp.tgroup[i] >= 1 && tmp.tgroup[i] <= L) units[tmp.tgroup[i]] += tmp.tensors[i].numel;
        static const int embed[] = {G_WTE, G_WPE, G_EMB_LN_W, G_EMB_LN_B}, head[] = {G_LNF_W, G_LNF_B, G_HEAD};
        for (size_t i = 0; i < sizeof embed / sizeof *embed; i++)
            if (tmp.gslot[embed[i]] >= 0) units[0] += tmp.tensors[tmp.gslot[embed[i]]].numel;
        for (size_t i = 0; i < sizeof head / sizeof *head; i++)
            if (tmp.gslot[head[i]] >= 0) units[L + 1] += tmp.tensors[tmp.gslot[head[i]]].numel;
        /* a tied head still needs the embedding matrix on the head's stage */
        if (tmp.gslot[G_HEAD] < 0) units[L + 1] += tmp.tensors[tmp.gslot[G_WTE]].numel;
    }
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    return st;
}

cllm_status cllm_model_prepare(cllm_model *m, int B, int T, bool train) {
    const cllm_model_config *c = &m->cfg;
    if (B <= 0 || T <= 0) return CLLM_FAIL(CLLM_ERR_ARG, "batch size and sequence length must be positive");
    if (c->n_ctx > 0 && T > c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence length %d exceeds the model's maximum of %d positions", T, c->n_ctx);
    if ((size_t)B * (size_t)T > (size_t)1 << 28) return CLLM_FAIL(CLLM_ERR_ARG, "batch of %d x %d tokens is too large", B, T);
    if (train && m->ws)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a model with %s weights runs forwards only: train from fp32 weights",
                         cllm_wfmt_name(cllm_model_weights(m)));
    if (train && m->shared && !m->frozen)
        return model_shared_refuse("training the model's own tensors (declare a trainable set of extra tensors)");
    if (train) {
        cllm_status rs = model_conv_restore(m); /* the backward reads the file layout */
        if (rs) return rs;
    }
    if (train && !m->grads && !m->hooks.fetch_grads) {
        m->grads = cllm_calloc(cllm_model_trainable_len(m), sizeof(float), "gradients");
        if (!m->grads) return CLLM_ERR_NOMEM;
    }
    const bool sp = m->sp && m->tp_size > 1;
    if (sp && T % m->tp_size)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence parallelism: sequence length %d is not divisible by the %d tensor "
                         "ranks", T, m->tp_size);
    if (m->acts && B <= m->act_B && T <= m->act_T && (!train || m->has_backward) && m->acts_recompute == m->recompute &&
        m->acts_sp == sp)
        return CLLM_OK;
    if (!m->layers) {
        m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
        if (!m->layers) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    carver cv = {NULL, 0};
    carve_parts parts;
    const int ways = sp ? m->tp_size : 1;
    assign_acts(c, NULL, NULL, &cv, B, T, train, m->recompute, ways, &parts);
    cllm_free(m->acts);
    m->acts = cllm_alloc(cv.used * sizeof(float), "activations");
    if (!m->acts) return CLLM_ERR_NOMEM;
    m->acts_floats = cv.used;
    cv.base = m->acts;
    cv.used = 0;
    assign_acts(c, m, m->layers, &cv, B, T, train, m->recompute, ways, &parts);
    m->acts_sp = sp;
    m->act_B = B;
    m->act_T = T;
    m->has_backward = train;
    m->acts_recompute = m->recompute;
    if (c->arch == CLLM_ARCH_LLAMA) cllm_rope_tables(m->rope_cos, m->rope_sin, T, c->head_dim, c->rope_theta);
    if (c->arch == CLLM_ARCH_BLOOM) cllm_alibi_slopes(m->alibi, c->n_head);
    cllm_status st = model_lp_prepare(m);
    return st ? st : model_tp_prepare(m);
}

long cllm_model_make_targets(int32_t *targets, const int32_t *labels, int B, int T) {
    long n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t y = t + 1 < T ? labels[(size_t)b * T + t + 1] : -100;
            targets[(size_t)b * T + t] = y;
            n += y != -100;
        }
    return n;
}

cllm_status cllm_model_check_ids(const cllm_model *m, const int32_t *tokens, const int32_t *targets, size_t n) {
    int V = cllm_model_vocab(m); /* a tensor part: the whole vocabulary */
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return CLLM_FAIL(CLLM_ERR_ARG, "token id %d at position %zu is outside the vocabulary [0, %d)", tokens[i], i, V);
        if (targets && targets[i] != -100 && (targets[i] < 0 || targets[i] >= V))
            return CLLM_FAIL(CLLM_ERR_ARG, "label %d at position %zu is outside the vocabulary [0, %d)", targets[i], i, V);
    }
    return CLLM_OK;
}
