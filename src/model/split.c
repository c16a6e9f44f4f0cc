/*
 * Tensor-parallel cutting rules and stage-layout folders; see
 * include/cllm/split.h.
 */
#include "cllm/split.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "model_impl.h"

#define LAYOUT_FORMAT "cllm-stage-layout"

/* ---------------------------------------------------------------- rules */

static cllm_tp_rule block_rule(const cllm_model_config *c, int slot) {
    bool conv1d = c->arch == CLLM_ARCH_GPT2; /* W[in,out] */
    cllm_tp_rule r = {CLLM_TP_REPLICATE, 1, 0};
    switch (slot) {
    case L_QKV_W: /* gpt2 [C, 3C] columns Q|K|V; bloom [NH*3*HS, C] rows by head */
        r.cut = conv1d ? CLLM_TP_COLS : CLLM_TP_ROWS;
        r.segments = conv1d ? 3 : 1;
        break;
    case L_QKV_B:
        r.cut = CLLM_TP_ROWS;
        r.segments = conv1d ? 3 : 1;
        break;
    case L_Q_W: case L_K_W: case L_V_W: case L_UP_W:
        r.cut = CLLM_TP_ROWS; /* llama nn.Linear [out, in] */
        break;
    case L_Q_B: case L_K_B: case L_V_B: case L_UP_B: case L_FC_B:
        r.cut = CLLM_TP_ROWS;
        break;
    case L_FC_W: /* column-parallel */
        r.cut = conv1d ? CLLM_TP_COLS : CLLM_TP_ROWS;
        break;
    case L_O_W: case L_DOWN_W: /* row-parallel: the input features */
        r.cut = conv1d ? CLLM_TP_ROWS : CLLM_TP_COLS;
        break;
    default: /* norms and the row-parallel biases */
        break;
    }
    return r;
}

cllm_tp_rule cllm_tp_rule_of(const cllm_model *m, int i) {
    const cllm_model_config *c = &m->cfg;
    /* the unit is the tensor's parameter group (model_impl.h) */
    cllm_tp_rule r = {CLLM_TP_REPLICATE, 1, m->tgroup[i]};
    if (r.unit >= 1 && r.unit <= c->n_layer) {
        for (int s = 0; s < L_NSLOTS; s++)
            if (m->lslot[r.unit - 1][s] == i) {
                r = block_rule(c, s);
                r.unit = m->tgroup[i];
                break;
            }
        return r;
    }
    if (i == m->gslot[G_WTE] || i == m->gslot[G_HEAD]) r.cut = CLLM_TP_ROWS; /* vocabulary-parallel */
    return r;
}

static void dims(const cllm_tensor_info *t, int64_t *R, int64_t *C) {
    *R = t->shape[0];
    *C = t->ndim > 1 ? t->shape[1] : 1;
}

void cllm_tp_shape(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int64_t *out) {
    out[0] = t->shape[0];
    out[1] = t->ndim > 1 ? t->shape[1] : 0;
    /* an unsegmented row cut that tp does not divide (the vocabulary) is
     * padded: every part has ceil(R / tp) rows, the last ones zero */
    if (rule.cut == CLLM_TP_ROWS) out[0] = rule.segments == 1 ? (out[0] + tp - 1) / tp : out[0] / tp;
    if (rule.cut == CLLM_TP_COLS) out[1] /= tp;
}

/* One routine for both directions: `to_part` copies full -> part. */
static void move(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int r, float *full, float *part, bool to_part) {
    int64_t R, C;
    dims(t, &R, &C);
    if (rule.cut == CLLM_TP_REPLICATE) {
        if (to_part) memcpy(part, full, (size_t)(R * C) * sizeof(float));
        else memcpy(full, part, (size_t)(R * C) * sizeof(float));
        return;
    }
    int g = rule.segments;
    if (rule.cut == CLLM_TP_ROWS) {
        int64_t seg = R / g, pr = g == 1 ? (R + tp - 1) / tp : seg / tp;
        /* rows of the whole tensor this part holds; the padded rest (past R,
         * the vocabulary's padding) are zeros in the part and dropped on the
         * way back */
        int64_t have = g == 1 ? R - r * pr : pr;
        if (have > pr) have = pr;
        if (have < 0) have = 0;
        for (int s = 0; s < g; s++) {
            float *p = part + s * pr * C;
            if (to_part) {
                if (have) memcpy(p, full + (s * seg + r * pr) * C, (size_t)(have * C) * sizeof(float));
                if (have < pr) memset(p + have * C, 0, (size_t)((pr - have) * C) * sizeof(float));
            } else if (have) {
                memcpy(full + (s * seg + r * pr) * C, p, (size_t)(have * C) * sizeof(float));
            }
        }
        return;
    }
    int64_t seg = C / g, pc = seg / tp, PC = pc * g;
    for (int64_t i = 0; i < R; i++)
        for (int s = 0; s < g; s++) {
            float *f = full + i * C + s * seg + r * pc, *p = part + i * PC + s * pc;
            if (to_part) memcpy(p, f, (size_t)pc * sizeof(float));
            else memcpy(f, p, (size_t)pc * sizeof(float));
        }
}

void cllm_tp_slice(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int r, const float *full, float *part) {
    move(t, rule, tp, r, (float *)(uintptr_t)full, part, true);
}

void cllm_tp_unslice(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int r, const float *part, float *full) {
    move(t, rule, tp, r, full, (float *)(uintptr_t)part, false);
}

/* --------------------------------------------------------------- folders */

/* buf[4096] <- "a/b"; fails when the path does not fit. */
static cllm_status pjoin(char *buf, const char *a, const char *b) {
    int n = snprintf(buf, 4096, "%s/%s", a, b);
    if (n < 0 || n >= 4096) return CLLM_FAIL(CLLM_ERR_ARG, "path too long: %s/%s", a, b);
    return CLLM_OK;
}

static void unit_file(char *buf, size_t cap, int unit, int r) {
    snprintf(buf, cap, "unit_%03d-tp_%02d.safetensors", unit, r);
}

/* Removes a folder holding only files (a stage layout or its temp). */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (pjoin(path, dir, e->d_name)) continue;
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int cllm_split_is_layout(const char *dir) {
    char path[4096];
    if (pjoin(path, dir, "layout.json")) return 0;
    json_t *j = json_load_file(path, 0, NULL);
    int ok = j && json_is_string(json_object_get(j, "format")) &&
             strcmp(json_string_value(json_object_get(j, "format")), LAYOUT_FORMAT) == 0;
    json_decref(j);
    return ok;
}

static cllm_status copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t len = 0;
    cllm_status st = cllm_read_file(from, &data, &len);
    if (!st) st = cllm_write_file_atomic(to, data, len);
    free(data);
    return st;
}

static cllm_status write_unit(const cllm_model *m, int tp, int unit, int r, const char *dir, json_t *files) {
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (cllm_tp_rule_of(m, i).unit == unit) n++;
    if (n == 0) return CLLM_OK; /* a tied head has only its norm; never empty in practice */
    cllm_st_entry *e = calloc((size_t)n, sizeof *e);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    cllm_status st = (!e || !bufs) ? CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory") : CLLM_OK;
    int k = 0;
    for (int i = 0; !st && i < m->n_tensors; i++) {
        cllm_tp_rule rule = cllm_tp_rule_of(m, i);
        if (rule.unit != unit) continue;
        const cllm_tensor_info *t = &m->tensors[i];
        int64_t shape[2];
        cllm_tp_shape(t, rule, tp, shape);
        size_t numel = (size_t)shape[0] * (size_t)(t->ndim > 1 ? shape[1] : 1);
        bufs[k] = malloc(numel * sizeof(float) + 1);
        if (!bufs[k]) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        cllm_tp_slice(t, rule, tp, r, m->params + t->offset, bufs[k]);
        e[k].name = t->name;
        e[k].dtype = CLLM_F32;
        e[k].ndim = t->ndim;
        e[k].shape[0] = shape[0];
        e[k].shape[1] = shape[1];
        e[k].data = bufs[k];
        k++;
    }
    char name[64], path[4096];
    unit_file(name, sizeof name, unit, r);
    if (!st) st = pjoin(path, dir, name);
    if (!st) st = cllm_st_save(path, e, k);
    if (!st) json_array_append_new(files, json_string(name));
    for (int i = 0; bufs && i < k; i++) free(bufs[i]);
    free(bufs);
    free(e);
    return st;
}

cllm_status cllm_split_save(const cllm_model *m, int tp, const char *src_dir, const char *const *copy_files,
                            const char *out_dir) {
    const cllm_model_config *c = &m->cfg;
    if (tp < 1) return CLLM_FAIL(CLLM_ERR_ARG, "tensor parallel size %d", tp);
    struct stat sb;
    if (stat(out_dir, &sb) == 0 && !cllm_split_is_layout(out_dir))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s exists and is not a stage layout: refusing to replace it", out_dir);
    /* every cut dimension must divide (the topology check names the config key) */
    for (int i = 0; i < m->n_tensors; i++) {
        cllm_tp_rule rule = cllm_tp_rule_of(m, i);
        const cllm_tensor_info *t = &m->tensors[i];
        int64_t R, C;
        dims(t, &R, &C);
        int64_t d = rule.cut == CLLM_TP_ROWS ? R : rule.cut == CLLM_TP_COLS ? C : 0;
        if (rule.cut == CLLM_TP_ROWS && rule.segments == 1) d = 0; /* the vocabulary: padded */
        if (d && (d % rule.segments != 0 || (d / rule.segments) % tp != 0))
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: dimension %lld cannot be cut into %d tensor-parallel parts", t->name,
                             (long long)d, tp);
    }
    char tmp[4096], path[4096], old[4096];
    if (strlen(out_dir) > 4000) return CLLM_FAIL(CLLM_ERR_ARG, "path too long: %s", out_dir);
    snprintf(tmp, sizeof tmp - 8, "%s", out_dir);
    strcat(tmp, ".tmp");
    snprintf(old, sizeof old - 8, "%s", out_dir);
    strcat(old, ".old");
    remove_flat_dir(tmp);
    cllm_status st = cllm_make_dirs(tmp);
    if (st) return st;
    json_t *files = json_array();
    for (int u = 0; !st && u < c->n_layer + 2; u++)
        for (int r = 0; !st && r < tp; r++) st = write_unit(m, tp, u, r, tmp, files);
    if (!st) {
        st = pjoin(path, tmp, "config.json");
        if (!st) st = cllm_json_save_file(m->config_json, path);
    }
    for (int i = 0; !st && copy_files && copy_files[i] && src_dir; i++) {
        char from[4096];
        if ((st = pjoin(from, src_dir, copy_files[i]))) break;
        if (access(from, R_OK) != 0) continue;
        if ((st = pjoin(path, tmp, copy_files[i]))) break;
        st = copy_file(from, path);
    }
    if (!st) {
        json_t *lay = json_pack("{s:s, s:i, s:s, s:i, s:i, s:i, s:O}", "format", LAYOUT_FORMAT, "version", 1,
                                "model_type", cllm_arch_name(c->arch), "tensor", tp, "units", c->n_layer + 2,
                                "n_layer", c->n_layer, "files", files);
        st = lay ? pjoin(path, tmp, "layout.json") : CLLM_OK;
        if (!st) st = lay ? cllm_json_save_file(lay, path) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        json_decref(lay);
    }
    json_decref(files);
    if (st) {
        remove_flat_dir(tmp);
        return st;
    }
    /* swap: the previous layout stays whole until the new one is in place */
    remove_flat_dir(old);
    bool had_old = stat(out_dir, &sb) == 0;
    if (had_old && rename(out_dir, old) != 0)
        return CLLM_FAIL(CLLM_ERR_IO, "%s: cannot move the previous layout aside: %s", out_dir, strerror(errno));
    if (rename(tmp, out_dir) != 0) {
        int e = errno;
        if (had_old) rename(old, out_dir);
        return CLLM_FAIL(CLLM_ERR_IO, "%s: cannot rename %s into place: %s", out_dir, tmp, strerror(e));
    }
    if (had_old) remove_flat_dir(old);
    return CLLM_OK;
}

/* Reads one unit file of rank r into m, counting what each tensor received. */
static cllm_status read_unit(cllm_model *m, const char *dir, const char *name, int tp, int *seen) {
    char path[4096];
    cllm_status st0 = pjoin(path, dir, name);
    if (st0) return st0;
    int unit = -1, r = -1;
    if (sscanf(name, "unit_%d-tp_%d.safetensors", &unit, &r) != 2 || r < 0 || r >= tp || unit < 0 ||
        unit > m->cfg.n_layer + 1)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s/layout.json: file '%s' is not a unit file of this layout", dir, name);
    cllm_st_file *f = NULL;
    cllm_status st = cllm_st_open(&f, path);
    if (st) return st;
    float *buf = NULL;
    for (int k = 0; !st && k < cllm_st_count(f); k++) {
        const cllm_st_tensor *x = cllm_st_at(f, k);
        const cllm_tensor_info *t = cllm_model_find_tensor(m, x->name);
        if (!t) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' is not part of this model", path, x->name);
            break;
        }
        int i = (int)(t - m->tensors);
        cllm_tp_rule rule = cllm_tp_rule_of(m, i);
        int64_t shape[2];
        cllm_tp_shape(t, rule, tp, shape);
        bool ok = rule.unit == unit && x->ndim == t->ndim && x->shape[0] == shape[0] &&
                  (t->ndim < 2 || x->shape[1] == shape[1]);
        if (!ok) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' has the wrong shape or unit for tensor rank %d of %d",
                           path, x->name, r, tp);
            break;
        }
        float *nb = realloc(buf, (size_t)x->numel * sizeof(float) + 1);
        if (!nb) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        buf = nb;
        if ((st = cllm_st_read_f32(x, buf, x->numel))) break;
        cllm_tp_unslice(t, rule, tp, r, buf, m->params + t->offset);
        seen[i * tp + r]++;
    }
    free(buf);
    cllm_st_close(f);
    return st;
}

cllm_status cllm_split_load(cllm_model **out, const char *dir) {
    char path[4096];
    *out = NULL;
    cllm_status st0 = pjoin(path, dir, "layout.json");
    if (st0) return st0;
    json_t *lay = NULL, *config = NULL;
    cllm_model *m = NULL;
    int *seen = NULL;
    cllm_status st = cllm_json_load_file(&lay, path);
    if (st) return st;
    const char *fmt = json_string_value(json_object_get(lay, "format"));
    json_t *files = json_object_get(lay, "files");
    json_int_t tp = json_integer_value(json_object_get(lay, "tensor"));
    if (!fmt || strcmp(fmt, LAYOUT_FORMAT) != 0 || !json_is_array(files) || tp < 1 || tp > 4096) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: not a stage layout (format, tensor and files are required)", path);
        goto done;
    }
    if ((st = pjoin(path, dir, "config.json"))) goto done;
    if ((st = cllm_json_load_file(&config, path))) goto done;
    if ((st = model_from_config(&m, config, path))) goto done;
    seen = calloc((size_t)m->n_tensors * (size_t)tp, sizeof *seen);
    if (!seen) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t k = 0; !st && k < json_array_size(files); k++) {
        const char *name = json_string_value(json_array_get(files, k));
        if (!name || strchr(name, '/')) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s/layout.json: files[%zu] is not a file name", dir, k);
            break;
        }
        st = read_unit(m, dir, name, (int)tp, seen);
    }
    for (int i = 0; !st && i < m->n_tensors; i++)
        for (int r = 0; r < tp; r++)
            if (seen[i * tp + r] != 1) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' of tensor rank %d appears %d times (expected once)",
                               dir, m->tensors[i].name, r, seen[i * tp + r]);
                break;
            }
done:
    free(seen);
    json_decref(lay);
    json_decref(config);
    if (st) {
        cllm_model_free(m);
        return st;
    }
    *out = m;
    return CLLM_OK;
}
