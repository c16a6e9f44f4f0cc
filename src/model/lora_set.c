/*
 * Several LoRA adapters on one frozen base (cllm/lora.h, cllm_lora_set):
 * loading them with cllm_lora_load's own files and checks, keeping each
 * outside the model, and their part of a forward pass whose rows choose
 * different adapters (model_lora_rows_forward, called by the linear seam
 * model_linear_forward for a scratch that carries a row map).
 *
 * Loading: the adapter is attached to the model as cllm_lora_load does
 * (config, targets, shapes, every tensor named on error), its A and B are
 * copied out of the trainable buffer into the set, and the model's
 * trainable set is dropped again: the base is left exactly as loaded.
 *
 * Per-row forward of a layer with weight w, for each adapter a of the
 * call that adapts w (X_a: the rows that chose a, in order):
 *     H = X_a A_a^T   [n_a, r_a]      Y_a += scale_a H B_a^T   [n_a, out]
 * the rows of a taken in place when they are one run, else gathered into
 * the scratch and scattered back. Adapters compute in fp32 whatever the
 * base's weight format, as in training.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lora/lora_impl.h"
#include "cllm/kernels.h"
#include "model_impl.h"

typedef struct {
    int in, out, r;
    float scale;
    size_t a_off, b_off; /* A [r, in], B [out, r] in the adapter's buffer */
} set_layer;

typedef struct {
    char *name, *dir;
    cllm_lora_config cfg;
    float *buf;          /* A and B of every layer */
    size_t numel;
    set_layer *layer;
    int n_layer;
    int *of_tensor;      /* [n_tensors] layer index or -1 */
} set_adapter;

struct cllm_lora_set {
    cllm_model *m;
    set_adapter *a;
    int n;
    int max_in, max_out, max_r;
    model_lora_rows whole; /* cllm_lora_set_apply */
};

cllm_status cllm_lora_set_init(cllm_lora_set **out, cllm_model *m) {
    *out = NULL;
    if (!m) return CLLM_FAIL(CLLM_ERR_ARG, "no model");
    if (m->lora || m->frozen)
        return CLLM_FAIL(CLLM_ERR_ARG, "the base model already carries adapters or a trainable set");
    if (m->tp_size > 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "LoRA adapters on a tensor-parallel part: not supported (serve "
                         "adapters without --tensor, or merge them with `cllm lora merge`)");
    cllm_lora_set *s = calloc(1, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->m = m;
    s->whole = (model_lora_rows){.set = s, .all = -1};
    *out = s;
    return CLLM_OK;
}

static void adapter_free(set_adapter *a) {
    free(a->name);
    free(a->dir);
    cllm_lora_config_free(&a->cfg);
    cllm_free(a->buf);
    free(a->layer);
    free(a->of_tensor);
}

void cllm_lora_set_free(cllm_lora_set *s) {
    if (!s) return;
    if (s->m && s->m->lp_run.rows == &s->whole) s->m->lp_run.rows = NULL;
    for (int i = 0; i < s->n; i++) adapter_free(&s->a[i]);
    free(s->a);
    free(s);
}

/* Options that replace base tensors cannot differ between rows. */
static cllm_status check_config(const cllm_lora_config *c, const char *dir) {
    if (c->bias != CLLM_LORA_BIAS_NONE)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s/adapter_config.json: bias \"%s\" trains base biases, which every "
                         "request shares: serve it merged (`cllm lora merge`) or use bias \"none\"", dir,
                         c->bias == CLLM_LORA_BIAS_ALL ? "all" : "lora_only");
    if (c->n_modules_to_save)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s/adapter_config.json: modules_to_save (%s) replaces base tensors, "
                         "which every request shares: serve it merged (`cllm lora merge`)", dir,
                         c->modules_to_save[0]);
    return CLLM_OK;
}

/* Copies the adapter now attached to the model into a: its layers (found
 * by their PEFT names) and their A and B. */
static cllm_status take_attached(cllm_lora_set *s, set_adapter *a) {
    cllm_model *m = s->m;
    const float *tp = cllm_model_trainable_params(m);
    int nv = cllm_model_n_trainable(m);
    a->of_tensor = malloc((size_t)m->n_tensors * sizeof *a->of_tensor);
    a->layer = calloc((size_t)(nv / 2 + 1), sizeof *a->layer);
    if (!a->of_tensor || !a->layer) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int t = 0; t < m->n_tensors; t++) a->of_tensor[t] = -1;
    size_t len = 0;
    for (int i = 0; i < nv; i++) len += (cllm_model_trainable(m, i)->numel + 15) & ~(size_t)15;
    a->buf = cllm_alloc((len ? len : 16) * sizeof(float), "LoRA adapter");
    if (!a->buf) return CLLM_ERR_NOMEM;
    const char *suffix = ".lora_A.weight";
    size_t ls = strlen(suffix), lp = strlen(LORA_PREFIX), off = 0;
    for (int i = 0; i + 1 < nv; i++) {
        const cllm_tensor_info *A = cllm_model_trainable(m, i), *B = cllm_model_trainable(m, i + 1);
        size_t ln = strlen(A->name);
        if (ln <= ls + lp || strcmp(A->name + ln - ls, suffix)) continue;
        char wname[200], mod[160];
        snprintf(mod, sizeof mod, "%.*s", (int)(ln - ls - lp), A->name + lp);
        snprintf(wname, sizeof wname, "%s.weight", mod);
        const cllm_tensor_info *wt = cllm_model_find_tensor(m, wname);
        if (!wt) return CLLM_FAIL(CLLM_ERR_INTERNAL, "adapter layer %s: no base weight", mod);
        set_layer *L = &a->layer[a->n_layer];
        L->r = (int)A->shape[0];
        L->in = (int)A->shape[1];
        L->out = (int)B->shape[0];
        double alpha;
        int r;
        lora_module_rank(&a->cfg, mod, &r, &alpha, &L->scale);
        L->a_off = off;
        memcpy(a->buf + off, tp + A->offset, A->numel * sizeof(float));
        off += (A->numel + 15) & ~(size_t)15;
        L->b_off = off;
        memcpy(a->buf + off, tp + B->offset, B->numel * sizeof(float));
        off += (B->numel + 15) & ~(size_t)15;
        a->numel += A->numel + B->numel;
        a->of_tensor[wt - cllm_model_tensor(m, 0)] = a->n_layer++;
        if (L->in > s->max_in) s->max_in = L->in;
        if (L->out > s->max_out) s->max_out = L->out;
        if (L->r > s->max_r) s->max_r = L->r;
    }
    return a->n_layer ? CLLM_OK : CLLM_FAIL(CLLM_ERR_FORMAT, "the adapter adapts no layer");
}

cllm_status cllm_lora_set_add(cllm_lora_set *s, const char *name, const char *dir) {
    if (!name || !*name || !dir) return CLLM_FAIL(CLLM_ERR_ARG, "an adapter needs a name and a folder");
    if (cllm_lora_set_find(s, name) >= 0) return CLLM_FAIL(CLLM_ERR_ARG, "adapter name '%s' given twice", name);
    set_adapter *grown = realloc(s->a, (size_t)(s->n + 1) * sizeof *grown);
    if (!grown) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->a = grown;
    set_adapter *a = &s->a[s->n];
    memset(a, 0, sizeof *a);
    cllm_lora_config_default(&a->cfg);
    a->name = strdup(name);
    a->dir = strdup(dir);
    cllm_status st = a->name && a->dir ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) st = cllm_lora_config_load(&a->cfg, dir);
    if (!st) st = check_config(&a->cfg, dir);
    if (!st) st = cllm_lora_load(s->m, dir); /* targets, shapes, every tensor */
    if (!st) st = take_attached(s, a);
    cllm_model_train_all(s->m); /* the base as it was */
    if (st) {
        adapter_free(a);
        return cllm_fail_context(st, "adapter '%s'", name);
    }
    s->n++;
    return CLLM_OK;
}

int cllm_lora_set_count(const cllm_lora_set *s) { return s ? s->n : 0; }

static const set_adapter *at(const cllm_lora_set *s, int i) { return s && i >= 0 && i < s->n ? &s->a[i] : NULL; }
const char *cllm_lora_set_name(const cllm_lora_set *s, int i) { return at(s, i) ? at(s, i)->name : NULL; }
const char *cllm_lora_set_dir(const cllm_lora_set *s, int i) { return at(s, i) ? at(s, i)->dir : NULL; }
const cllm_lora_config *cllm_lora_set_config(const cllm_lora_set *s, int i) { return at(s, i) ? &at(s, i)->cfg : NULL; }
int cllm_lora_set_layers(const cllm_lora_set *s, int i) { return at(s, i) ? at(s, i)->n_layer : 0; }
size_t cllm_lora_set_numel(const cllm_lora_set *s, int i) { return at(s, i) ? at(s, i)->numel : 0; }

int cllm_lora_set_find(const cllm_lora_set *s, const char *name) {
    for (int i = 0; s && name && i < s->n; i++)
        if (!strcmp(s->a[i].name, name)) return i;
    return -1;
}

cllm_status cllm_lora_set_apply(cllm_lora_set *s, int i) {
    if (i < -1 || i >= s->n) return CLLM_FAIL(CLLM_ERR_ARG, "adapter %d of %d", i, s->n);
    s->whole.all = i;
    s->m->lp_run.rows = i >= 0 ? &s->whole : NULL;
    return CLLM_OK;
}

/* ------------------------------------------------------------ forward */

size_t model_lora_rows_scratch(const cllm_lora_set *set, int rows) {
    return (size_t)rows * ((size_t)set->max_in + (size_t)set->max_out + (size_t)set->max_r);
}

/* O[n, out] += scale (X[n, in] A^T) B^T with H [n, r] the intermediate. */
static cllm_status layer_forward(const set_adapter *a, const set_layer *L, float *O, const float *X, float *H, int n) {
    const float *A = a->buf + L->a_off, *B = a->buf + L->b_off;
    cllm_status st = cllm_matmul(H, X, A, n, L->r, L->in, false, true, 1.0f, 0.0f);
    if (!st) st = cllm_matmul(O, H, B, n, L->out, L->r, false, true, L->scale, 1.0f);
    return st;
}

void model_lora_small_forward(float *out, const float *inp, const model_lora_row *ad, int N, int IN, int OUT,
                              float *h) {
    int R = 0;
    for (int n = 0; n < N; n++)
        if (ad[n].A && ad[n].r > R) R = ad[n].r;
    if (!R) return;
#pragma omp parallel
    {
        /* h[n, k] = A_n[k, :] . x[n, :] */
#pragma omp for schedule(static)
        for (long i = 0; i < (long)N * R; i++) {
            int n = (int)(i / R), k = (int)(i % R);
            if (!ad[n].A || k >= ad[n].r) continue;
            const float *a = ad[n].A + (size_t)k * IN, *x = inp + (size_t)n * IN;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int j = 0; j < IN; j++) acc += a[j] * x[j];
            h[(size_t)n * R + k] = acc;
        }
        /* out[n, o] += scale_n (B_n[o, :] . h[n, :]) */
#pragma omp for schedule(static)
        for (long i = 0; i < (long)N * OUT; i++) {
            int n = (int)(i / OUT), o = (int)(i % OUT);
            if (!ad[n].A) continue;
            const float *b = ad[n].B + (size_t)o * ad[n].r, *hn = h + (size_t)n * R;
            float acc = 0.0f;
            for (int k = 0; k < ad[n].r; k++) acc += b[k] * hn[k];
            out[i] += ad[n].scale * acc;
        }
    }
}

static model_lora_row row_of(const set_adapter *a, int k) {
    const set_layer *L = &a->layer[k];
    return (model_lora_row){a->buf + L->a_off, a->buf + L->b_off, L->r, L->scale};
}

cllm_status model_lora_rows_forward(const model_lora_rows *r, int w, float *out, const float *inp, int N) {
    const cllm_lora_set *s = r->set;
    if (r->all >= 0) { /* every row: in place, H from the heap as the single-adapter pass does */
        const set_adapter *a = &s->a[r->all];
        int k = a->of_tensor[w];
        if (k < 0) return CLLM_OK;
        float *H = cllm_alloc((size_t)N * (size_t)a->layer[k].r * sizeof(float), "LoRA activations");
        cllm_status st = H ? CLLM_OK : CLLM_ERR_NOMEM;
        if (!st && N <= WEIGHTS_SMALL_ROWS) {
            model_lora_row rows[WEIGHTS_SMALL_ROWS];
            for (int n = 0; n < N; n++) rows[n] = row_of(a, k);
            model_lora_small_forward(out, inp, rows, N, a->layer[k].in, a->layer[k].out, H);
        } else if (!st) {
            st = layer_forward(a, &a->layer[k], out, inp, H, N);
        }
        cllm_free(H);
        return st;
    }
    bool any = false; /* a layer no adapter of the call adapts (an expert's rows, the head) is left alone */
    for (int g = 0; g < r->n_seg && !any; g++) any = r->seg_adapter[g] >= 0 && s->a[r->seg_adapter[g]].of_tensor[w] >= 0;
    if (!any) return CLLM_OK;
    if (r->seg_rows[r->n_seg] != N)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "adapter rows: %d rows mapped, the layer has %d", r->seg_rows[r->n_seg], N);
    if (N <= WEIGHTS_SMALL_ROWS) { /* decode-sized: every adapter's rows in one pass */
        model_lora_row rows[WEIGHTS_SMALL_ROWS] = {{0}};
        int IN = 0, OUT = 0;
        for (int g = 0; g < r->n_seg; g++) {
            int ai = r->seg_adapter[g], k = ai >= 0 ? s->a[ai].of_tensor[w] : -1;
            if (k < 0) continue;
            IN = s->a[ai].layer[k].in;
            OUT = s->a[ai].layer[k].out;
            for (int n = r->seg_rows[g]; n < r->seg_rows[g + 1]; n++) rows[n] = row_of(&s->a[ai], k);
        }
        if (IN) model_lora_small_forward(out, inp, rows, N, IN, OUT, r->scratch);
        return CLLM_OK;
    }
    for (int ai = 0; ai < s->n; ai++) {
        const set_adapter *a = &s->a[ai];
        int k = a->of_tensor[w];
        if (k < 0) continue;
        const set_layer *L = &a->layer[k];
        int n = 0, runs = 0, first = -1;
        for (int g = 0; g < r->n_seg; g++)
            if (r->seg_adapter[g] == ai && r->seg_rows[g + 1] > r->seg_rows[g]) {
                n += r->seg_rows[g + 1] - r->seg_rows[g];
                runs++;
                if (first < 0) first = g;
            }
        if (!n) continue;
        float *X = r->scratch, *O = X + (size_t)n * L->in, *H = O + (size_t)n * L->out;
        if (runs == 1) { /* one run of rows: in place */
            size_t r0 = (size_t)r->seg_rows[first];
            cllm_status st = layer_forward(a, L, out + r0 * L->out, inp + r0 * L->in, H, n);
            if (st) return st;
            continue;
        }
        size_t j = 0;
        for (int g = 0; g < r->n_seg; g++) {
            if (r->seg_adapter[g] != ai) continue;
            size_t r0 = (size_t)r->seg_rows[g], m = (size_t)(r->seg_rows[g + 1] - r->seg_rows[g]);
            memcpy(X + j * L->in, inp + r0 * L->in, m * L->in * sizeof(float));
            memcpy(O + j * L->out, out + r0 * L->out, m * L->out * sizeof(float));
            j += m;
        }
        cllm_status st = layer_forward(a, L, O, X, H, n);
        if (st) return st;
        j = 0;
        for (int g = 0; g < r->n_seg; g++) {
            if (r->seg_adapter[g] != ai) continue;
            size_t r0 = (size_t)r->seg_rows[g], m = (size_t)(r->seg_rows[g + 1] - r->seg_rows[g]);
            memcpy(out + r0 * L->out, O + j * L->out, m * L->out * sizeof(float));
            j += m;
        }
    }
    return CLLM_OK;
}
