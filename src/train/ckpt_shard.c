/*
 * Sharded training checkpoints (see cllm/checkpoint.h): every rank writes
 * its slice of the flat parameter and optimizer buffers; rank 0 adds the
 * layout, trainer state and manifest and publishes the folder. Reading maps
 * any flat range back from either checkpoint format, so a run may resume on
 * another world size or ZeRO stage.
 *
 * layout.json:
 *   {"format": "cllm-sharded-checkpoint", "version": 1, "n": N,
 *    "world_size": W, "buffers": ["params", "state0", ...],
 *    "shards": [{"begin": b, "end": e, "params": FILE, "optim": FILE}...],
 *    "tensors": [{"name", "shape": [...], "offset"}...]}
 * Shard k (0-based, rank order) holds flat elements [begin, end) and its
 * files are params-(k+1)-of-W.safetensors and optim-(k+1)-of-W.safetensors
 * (five digits each); the slices tile [0, N) in order.
 * Not here: the single-process format and `latest` handling (checkpoint.c).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cllm/checkpoint.h"
#include "cllm/dist.h"
#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/lora.h"
#include "train_impl.h"

#define LAYOUT_NAME "layout.json"
#define LAYOUT_FORMAT "cllm-sharded-checkpoint"

static const char *const state_names[2] = {"state0", "state1"};

/* dir + "/" + name into out[4096]; false (and an empty string) if it does
 * not fit, which the next open then reports. */
static bool join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        out[0] = '\0';
        return false;
    }
    return true;
}

static void shard_file(char *buf, size_t cap, const char *kind, int k, int n_shards) {
    snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", kind, k + 1, n_shards);
}

/* Every rank learns whether any rank failed; a rank that did not fail gets
 * a message saying so. */
static cllm_status agree(cllm_status st, const char *what) {
    int64_t v = st != CLLM_OK;
    cllm_status d = cllm_dist_allreduce_max_i64(&v, 1);
    if (st) return st;
    if (d) return d;
    if (v) return CLLM_FAIL(CLLM_ERR_IO, "%s failed on another rank (see its message)", what);
    return CLLM_OK;
}

/* --------------------------------------------------------------- layout */

typedef struct {
    json_t *root;
    size_t n;
    int n_shards;
    size_t *begin, *end; /* [n_shards] */
    bool has[2];         /* state0, state1 present */
    json_t *tensors;
} layout;

static void layout_free(layout *L) {
    json_decref(L->root);
    free(L->begin);
    memset(L, 0, sizeof *L);
}

static bool get_size(const json_t *o, const char *key, size_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (size_t)json_integer_value(v);
    return true;
}

static cllm_status layout_open(layout *L, const char *dir) {
    memset(L, 0, sizeof *L);
    char path[4096];
    join(path, sizeof path, dir, LAYOUT_NAME);
    cllm_status st = cllm_json_load_file(&L->root, path);
    if (st) return st;
    json_t *shards = json_object_get(L->root, "shards"), *bufs = json_object_get(L->root, "buffers");
    const char *fmt = json_string_value(json_object_get(L->root, "format"));
    L->tensors = json_object_get(L->root, "tensors");
    if (!fmt || strcmp(fmt, LAYOUT_FORMAT) != 0 || json_integer_value(json_object_get(L->root, "version")) != 1 ||
        !get_size(L->root, "n", &L->n) || !json_is_array(shards) || json_array_size(shards) == 0 ||
        json_array_size(shards) > 99999 || !json_is_array(bufs) || !json_is_array(L->tensors)) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: not a version 1 %s layout (format, version, n, shards, buffers, tensors)",
                       path, LAYOUT_FORMAT);
        goto fail;
    }
    L->n_shards = (int)json_array_size(shards);
    L->begin = calloc(2 * (size_t)L->n_shards, sizeof *L->begin);
    if (!L->begin) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    L->end = L->begin + L->n_shards;
    size_t prev = 0;
    for (int k = 0; k < L->n_shards; k++) {
        json_t *s = json_array_get(shards, (size_t)k);
        if (!get_size(s, "begin", &L->begin[k]) || !get_size(s, "end", &L->end[k]) || L->begin[k] != prev ||
            L->end[k] < L->begin[k] || L->end[k] > L->n) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: shards[%d] is not the next slice of [0, %zu) (begin %zu expected)",
                           path, k, L->n, prev);
            goto fail;
        }
        prev = L->end[k];
    }
    if (prev != L->n) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: the shards cover [0, %zu) of %zu elements", path, prev, L->n);
        goto fail;
    }
    for (size_t i = 0; i < json_array_size(bufs); i++)
        for (int k = 0; k < 2; k++)
            if (json_is_string(json_array_get(bufs, i)) &&
                strcmp(json_string_value(json_array_get(bufs, i)), state_names[k]) == 0)
                L->has[k] = true;
    return CLLM_OK;
fail:
    layout_free(L);
    return st;
}

/* The layout's tensors must be the model's: same names, shapes, offsets. */
static cllm_status layout_check_model(const layout *L, const cllm_model *m, const char *dir) {
    int nt = cllm_model_n_trainable(m);
    if (L->n != cllm_model_trainable_len(m) || json_array_size(L->tensors) != (size_t)nt)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s/%s: %zu elements in %zu tensors, but the model has %zu in %d (a checkpoint of another "
                         "model?)",
                         dir, LAYOUT_NAME, L->n, json_array_size(L->tensors), cllm_model_trainable_len(m), nt);
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *ti = cllm_model_trainable(m, i);
        json_t *t = json_array_get(L->tensors, (size_t)i), *shape = json_object_get(t, "shape");
        const char *name = json_string_value(json_object_get(t, "name"));
        size_t off = 0;
        bool ok = name && strcmp(name, ti->name) == 0 && get_size(t, "offset", &off) && off == ti->offset &&
                  json_array_size(shape) == (size_t)ti->ndim;
        for (int d = 0; ok && d < ti->ndim; d++)
            ok = json_integer_value(json_array_get(shape, (size_t)d)) == ti->shape[d];
        if (!ok)
            return CLLM_FAIL(CLLM_ERR_FORMAT,
                             "%s/%s: tensor %d ('%s') does not match the model's '%s' (name, shape or offset; a "
                             "checkpoint of another model?)",
                             dir, LAYOUT_NAME, i, name ? name : "?", ti->name);
    }
    return CLLM_OK;
}

static json_t *layout_json(const cllm_model *m, size_t n, int size, const uint64_t *all, int stride, bool has0,
                           bool has1) {
    json_t *shards = json_array(), *tensors = json_array(), *bufs = json_array();
    json_array_append_new(bufs, json_string("params"));
    if (has0) json_array_append_new(bufs, json_string("state0"));
    if (has1) json_array_append_new(bufs, json_string("state1"));
    for (int r = 0; r < size; r++) {
        char p[64], o[64];
        shard_file(p, sizeof p, "params", r, size);
        shard_file(o, sizeof o, "optim", r, size);
        const uint64_t *a = all + (size_t)r * (size_t)stride;
        json_array_append_new(shards, json_pack("{sIsIssss}", "begin", (json_int_t)a[1], "end", (json_int_t)a[2],
                                                "params", p, "optim", o));
    }
    for (int i = 0; i < cllm_model_n_trainable(m); i++) {
        const cllm_tensor_info *ti = cllm_model_trainable(m, i);
        json_t *shape = json_array();
        for (int d = 0; d < ti->ndim; d++) json_array_append_new(shape, json_integer((json_int_t)ti->shape[d]));
        json_array_append_new(tensors, json_pack("{sssosI}", "name", ti->name, "shape", shape, "offset",
                                                 (json_int_t)ti->offset));
    }
    return json_pack("{sssisIsisososo}", "format", LAYOUT_FORMAT, "version", 1, "n", (json_int_t)n, "world_size",
                     size, "buffers", bufs, "shards", shards, "tensors", tensors);
}

bool cllm_ckpt_is_sharded(const char *dir) {
    char path[4096];
    join(path, sizeof path, dir, LAYOUT_NAME);
    return access(path, F_OK) == 0;
}

/* -------------------------------------------------------------- writing */

enum { G_FAIL, G_BEGIN, G_END, G_PBYTES, G_PCRC, G_OBYTES, G_OCRC, G_HAS, G_STRIDE };

/* Writes one rank's files into tmp and fills its row of the gather. */
static cllm_status write_own(const char *tmp, const cllm_ckpt_slice *s, int rank, int size, uint64_t *row) {
    char name[64], path[4096];
    int64_t len = (int64_t)(s->end - s->begin);
    cllm_st_entry e[2] = {{.name = "params", .dtype = CLLM_F32, .ndim = 1, .data = s->params}};
    e[0].shape[0] = len;
    shard_file(name, sizeof name, "params", rank, size);
    join(path, sizeof path, tmp, name);
    cllm_status st = cllm_st_save(path, e, 1);
    uint32_t crc = 0;
    uint64_t bytes = 0;
    if (!st) st = cllm_crc32_file(path, &crc, &bytes);
    row[G_PBYTES] = bytes;
    row[G_PCRC] = crc;
    if (st) return st;
    const float *bufs[2] = {s->state0, s->state1};
    int ne = 0;
    for (int k = 0; k < 2; k++) {
        if (!bufs[k]) continue;
        e[ne] = (cllm_st_entry){.name = state_names[k], .dtype = CLLM_F32, .ndim = 1, .data = bufs[k]};
        e[ne].shape[0] = len;
        ne++;
        row[G_HAS] |= 1u << k;
    }
    shard_file(name, sizeof name, "optim", rank, size);
    join(path, sizeof path, tmp, name);
    st = cllm_st_save(path, e, ne);
    if (!st) st = cllm_crc32_file(path, &crc, &bytes);
    row[G_OBYTES] = bytes;
    row[G_OCRC] = crc;
    return st;
}

static json_t *manifest_row(const char *name, uint64_t bytes, uint32_t crc) {
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
    return json_pack("{sssIss}", "name", name, "bytes", (json_int_t)bytes, "crc32", hex);
}

/* Rank 0, after every shard is in tmp: the shared files, the manifest
 * (shards from the gathered checksums, the rest computed here). */
static cllm_status write_common(const char *tmp, const cllm_model *m, const cllm_ckpt_state *cs,
                                const uint64_t *all, int size, size_t n) {
    char path[4096];
    uint64_t has = 0;
    for (int r = 0; r < size; r++) has |= all[(size_t)r * G_STRIDE + G_HAS];
    /* a LoRA run's checkpoint also says which adapters its buffer holds */
    json_t *files[4] = {json_incref((json_t *)cllm_model_config_json(m)), layout_json(m, n, size, all, G_STRIDE,
                        has & 1, has & 2), train_ckpt_state_json(cs), cllm_lora_config_json(m, NULL)};
    const char *names[4] = {"config.json", LAYOUT_NAME, "trainer_state.json", "adapter_config.json"};
    int nfiles = cllm_lora_attached(m) ? 4 : 3;
    json_t *list = json_array();
    cllm_status st = CLLM_OK;
    for (int i = 0; i < nfiles && !st; i++) {
        join(path, sizeof path, tmp, names[i]);
        st = files[i] ? cllm_json_save_file(files[i], path) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        uint32_t crc;
        uint64_t bytes;
        if (!st) st = cllm_crc32_file(path, &crc, &bytes);
        if (!st) json_array_append_new(list, manifest_row(names[i], bytes, crc));
    }
    for (int i = 0; i < 4; i++) json_decref(files[i]);
    for (int r = 0; r < size && !st; r++) {
        const uint64_t *a = all + (size_t)r * G_STRIDE;
        char name[64];
        shard_file(name, sizeof name, "optim", r, size);
        json_array_append_new(list, manifest_row(name, a[G_OBYTES], (uint32_t)a[G_OCRC]));
        shard_file(name, sizeof name, "params", r, size);
        json_array_append_new(list, manifest_row(name, a[G_PBYTES], (uint32_t)a[G_PCRC]));
    }
    json_t *man = json_pack("{sssisIso}", "format", "cllm-checkpoint", "version", 1, "step",
                            (json_int_t)cs->global_step, "files", list);
    join(path, sizeof path, tmp, "manifest.json");
    if (!st) st = man ? cllm_json_save_file(man, path) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    json_decref(man);
    if (!st) st = train_ckpt_fsync_dir(tmp);
    return st;
}

cllm_status cllm_ckpt_write_sharded(const char *out, const cllm_model *m, const cllm_ckpt_slice *s,
                                    const cllm_ckpt_state *cs, long keep_limit) {
    const int rank = cllm_dist_rank(), size = cllm_dist_size();
    const long step = cs->global_step;
    char tmp[4096], fin[4096];
    snprintf(tmp, sizeof tmp, "%s/.checkpoint-%ld.tmp", out, step);
    snprintf(fin, sizeof fin, "%s/checkpoint-%ld", out, step);
    cllm_status st = CLLM_OK;
    if (s->begin > s->end || s->end > s->n || (s->end > s->begin && !s->params))
        st = CLLM_FAIL(CLLM_ERR_ARG, "slice [%zu, %zu) of %zu elements is not valid", s->begin, s->end, s->n);
    if (!st && rank == 0) {
        st = cllm_make_dirs(out);
        if (!st) st = train_ckpt_remove_dir(tmp); /* a leftover of an interrupted save */
        if (!st) st = cllm_make_dirs(tmp);
    }
    if ((st = agree(st, "creating the checkpoint folder"))) return cllm_fail_context(st, "writing checkpoint %s", fin);
    uint64_t row[G_STRIDE] = {0};
    row[G_BEGIN] = s->begin;
    row[G_END] = s->end;
    st = write_own(tmp, s, rank, size, row);
    row[G_FAIL] = st != CLLM_OK;
    uint64_t *all = malloc((size_t)size * sizeof row);
    if (!all) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory"); /* the others then fail in the gather */
    cllm_status g = cllm_dist_allgather_u64(row, G_STRIDE, all);
    if (!st && g) st = g;
    for (int r = 0; r < size && !st; r++) {
        const uint64_t *a = all + (size_t)r * G_STRIDE;
        if (a[G_FAIL]) st = CLLM_FAIL(CLLM_ERR_IO, "rank %d could not write its shard (see its message)", r);
        else if (a[G_BEGIN] != (r ? all[(size_t)(r - 1) * G_STRIDE + G_END] : 0) || (r == size - 1 && a[G_END] != s->n))
            st = CLLM_FAIL(CLLM_ERR_ARG, "the ranks' slices do not tile [0, %zu) (rank %d starts at %llu)", s->n, r,
                           (unsigned long long)a[G_BEGIN]);
    }
    if (rank == 0) {
        if (!st) st = write_common(tmp, m, cs, all, size, s->n);
        if (!st) st = train_ckpt_publish(out, step, keep_limit);
        else train_ckpt_remove_dir(tmp);
    }
    free(all);
    st = agree(st, "publishing the checkpoint");
    return st ? cllm_fail_context(st, "writing checkpoint %s", fin) : CLLM_OK;
}

/* ----------------------------------------------------------- verifying */

static cllm_status verify_file(const char *dir, json_t *f, const char *man) {
    json_t *jn = json_object_get(f, "name"), *jb = json_object_get(f, "bytes"), *jc = json_object_get(f, "crc32");
    if (!json_is_string(jn) || !json_is_integer(jb) || !json_is_string(jc) || strchr(json_string_value(jn), '/'))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a files entry is malformed", man);
    char fp[4096];
    snprintf(fp, sizeof fp, "%s/%s", dir, json_string_value(jn));
    uint32_t crc;
    uint64_t size;
    cllm_status st = cllm_crc32_file(fp, &crc, &size);
    if (st) return cllm_fail_context(st, "checkpoint '%s' is incomplete", dir);
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
    if (size != (uint64_t)json_integer_value(jb) || strcmp(hex, json_string_value(jc)) != 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "checkpoint file '%s' is corrupted (%llu bytes, crc32 %s; manifest says %lld bytes, crc32 "
                         "%s); resume from another checkpoint-* folder",
                         fp, (unsigned long long)size, hex, (long long)json_integer_value(jb), json_string_value(jc));
    return CLLM_OK;
}

/* Which shard a "params-..."/"optim-..." name is (-1: not a shard file). */
static int shard_of(const char *name, int n_shards, bool *is_params) {
    int k = 0, of = 0, used = 0;
    *is_params = strncmp(name, "params-", 7) == 0;
    const char *s = *is_params ? name + 7 : strncmp(name, "optim-", 6) == 0 ? name + 6 : NULL;
    if (!s || sscanf(s, "%5d-of-%5d.safetensors%n", &k, &of, &used) != 2 || s[used] || of != n_shards || k < 1 ||
        k > n_shards)
        return -1;
    return k - 1;
}

cllm_status cllm_ckpt_verify_range(const char *dir, bool all_params, size_t begin, size_t end) {
    if (!cllm_ckpt_is_sharded(dir)) return cllm_ckpt_verify(dir);
    char man[4096];
    join(man, sizeof man, dir, "manifest.json");
    json_t *m = NULL;
    cllm_status st = cllm_json_load_file(&m, man);
    if (st) return cllm_fail_context(st, "checkpoint '%s' has no readable manifest", dir);
    json_t *files = json_object_get(m, "files");
    layout L = {0};
    if (!json_is_array(files) || json_array_size(files) == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no \"files\" list", man);
    /* the shared files first: the layout says which shards matter */
    size_t i;
    json_t *f;
    bool listed = false;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        if (st || (name && (strncmp(name, "params-", 7) == 0 || strncmp(name, "optim-", 6) == 0))) continue;
        listed |= name && strcmp(name, LAYOUT_NAME) == 0;
        st = verify_file(dir, f, man);
    }
    if (!st && !listed) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s is not listed", man, LAYOUT_NAME);
    if (!st) st = layout_open(&L, dir);
    int found = 0;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        bool is_params;
        int k = name ? shard_of(name, L.n_shards, &is_params) : -1;
        if (st || k < 0) continue;
        found++;
        bool overlap = L.begin[k] < end && begin < L.end[k];
        if (overlap || (is_params && all_params)) st = verify_file(dir, f, man);
    }
    if (!st && found != 2 * L.n_shards)
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: lists %d shard files, %s says %d", man, found, LAYOUT_NAME,
                       2 * L.n_shards);
    layout_free(&L);
    json_decref(m);
    return st;
}

/* -------------------------------------------------------------- reading */

static cllm_status read_sharded(const char *dir, const cllm_model *m, cllm_ckpt_buffer which, size_t begin,
                                size_t end, float *dst) {
    layout L;
    cllm_status st = layout_open(&L, dir);
    if (st) return st;
    const char *tname = which == CLLM_CKPT_PARAMS ? "params" : state_names[which - 1];
    if ((st = layout_check_model(&L, m, dir))) goto done;
    if (end > L.n || begin > end) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "range [%zu, %zu) outside the checkpoint's %zu elements", begin, end, L.n);
        goto done;
    }
    for (int k = 0; k < L.n_shards && !st; k++) {
        size_t lo = begin > L.begin[k] ? begin : L.begin[k], hi = end < L.end[k] ? end : L.end[k];
        if (lo >= hi) continue;
        char name[64], path[4096];
        shard_file(name, sizeof name, which == CLLM_CKPT_PARAMS ? "params" : "optim", k, L.n_shards);
        join(path, sizeof path, dir, name);
        cllm_st_file *f = NULL;
        if ((st = cllm_st_open(&f, path))) break;
        const cllm_st_tensor *t = cllm_st_find(f, tname);
        if (!t || t->dtype != CLLM_F32 || t->ndim != 1 || (uint64_t)t->numel != L.end[k] - L.begin[k])
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected tensor '%s' F32 [%zu] (the slice [%zu, %zu) of %s)", path,
                           tname, L.end[k] - L.begin[k], L.begin[k], L.end[k], LAYOUT_NAME);
        else
            memcpy(dst + (lo - begin), (const float *)t->data + (lo - L.begin[k]), (hi - lo) * sizeof(float));
        cllm_st_close(f);
    }
done:
    layout_free(&L);
    return st;
}

/* The single-process format: params from the HF tensors of the folder, the
 * optimizer buffers from optimizer.safetensors. */
static cllm_status read_single(const char *dir, const cllm_model *m, cllm_ckpt_buffer which, size_t begin,
                               size_t end, float *dst) {
    size_t n = cllm_model_trainable_len(m);
    if (end > n || begin > end)
        return CLLM_FAIL(CLLM_ERR_ARG, "range [%zu, %zu) outside the model's %zu elements", begin, end, n);
    cllm_status st = CLLM_OK;
    if (which != CLLM_CKPT_PARAMS) {
        char path[4096];
        join(path, sizeof path, dir, "optimizer.safetensors");
        cllm_st_file *f = NULL;
        if ((st = cllm_st_open(&f, path))) return st;
        const char *name = state_names[which - 1];
        const cllm_st_tensor *t = cllm_st_find(f, name);
        if (!t || t->dtype != CLLM_F32 || (uint64_t)t->numel != n)
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected tensor '%s' F32 [%zu] (the model's flat buffer)", path,
                           name, n);
        else
            memcpy(dst, (const float *)t->data + begin, (end - begin) * sizeof(float));
        cllm_st_close(f);
        return st;
    }
    memset(dst, 0, (end - begin) * sizeof(float)); /* the alignment gaps between tensors */
    cllm_st_set *set = NULL;
    if ((st = cllm_st_set_open(&set, dir))) return st;
    for (int i = 0; i < cllm_model_n_trainable(m) && !st; i++) {
        const cllm_tensor_info *ti = cllm_model_trainable(m, i);
        size_t lo = begin > ti->offset ? begin : ti->offset;
        size_t hi = end < ti->offset + ti->numel ? end : ti->offset + ti->numel;
        if (lo >= hi) continue;
        const cllm_st_tensor *t = cllm_st_set_find(set, ti->name);
        if (!t || t->dtype != CLLM_F32 || (uint64_t)t->numel != ti->numel)
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected tensor '%s' F32 with %zu elements (a checkpoint of another "
                           "model?)", dir, ti->name, (size_t)ti->numel);
        else
            memcpy(dst + (lo - begin), (const float *)t->data + (lo - ti->offset), (hi - lo) * sizeof(float));
    }
    cllm_st_set_close(set);
    return st;
}

cllm_status cllm_ckpt_read_range(const char *dir, const cllm_model *m, cllm_ckpt_buffer which, size_t begin,
                                 size_t end, float *dst) {
    if (which != CLLM_CKPT_PARAMS && which != CLLM_CKPT_STATE0 && which != CLLM_CKPT_STATE1)
        return CLLM_FAIL(CLLM_ERR_ARG, "unknown buffer %d", (int)which);
    return cllm_ckpt_is_sharded(dir) ? read_sharded(dir, m, which, begin, end, dst)
                                     : read_single(dir, m, which, begin, end, dst);
}

cllm_status cllm_ckpt_read_optim_range(const char *dir, const cllm_model *m, float *state0, float *state1,
                                       size_t begin, size_t end) {
    bool has[2] = {false, false};
    cllm_status st = CLLM_OK;
    char what[4096];
    if (cllm_ckpt_is_sharded(dir)) {
        layout L;
        if ((st = layout_open(&L, dir))) return st;
        has[0] = L.has[0];
        has[1] = L.has[1];
        layout_free(&L);
        join(what, sizeof what, dir, LAYOUT_NAME);
        if ((st = cllm_ckpt_verify_range(dir, false, begin, end))) return st;
    } else {
        join(what, sizeof what, dir, "optimizer.safetensors");
        cllm_st_file *f = NULL;
        if ((st = cllm_st_open(&f, what))) return st;
        for (int k = 0; k < 2; k++) has[k] = cllm_st_find(f, state_names[k]) != NULL;
        cllm_st_close(f);
    }
    float *bufs[2] = {state0, state1};
    for (int k = 0; k < 2 && !st; k++) {
        if (begin == end) break; /* an empty slice has nothing to restore */
        if (!bufs[k] && !has[k]) continue;
        if (!bufs[k] || !has[k]) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s %s, but the optimizer %s one (different optimizer type?)", what,
                           state_names[k], has[k] ? "present" : "missing", has[k] ? "has no" : "needs");
            break;
        }
        st = cllm_ckpt_read_range(dir, m, (cllm_ckpt_buffer)(k + 1), begin, end, bufs[k]);
    }
    return st;
}

cllm_status cllm_ckpt_load_model_weights(cllm_model **out, const char *dir, const char *weights) {
    *out = NULL;
    if (!cllm_ckpt_is_sharded(dir)) return cllm_model_load_weights(out, dir, weights);
    cllm_wfmt f = CLLM_WFMT_FP32;
    if (weights && !cllm_wfmt_from_name(weights, &f))
        return CLLM_FAIL(CLLM_ERR_ARG, "unknown weight format '%s' (expected fp32, bf16, int8 or q4)", weights);
    cllm_status st = cllm_ckpt_load_model(out, dir);
    if (!st && f != CLLM_WFMT_FP32 && (st = cllm_model_set_weights(*out, f))) {
        cllm_model_free(*out);
        *out = NULL;
    }
    return st;
}

cllm_status cllm_ckpt_load_model(cllm_model **out, const char *dir) {
    *out = NULL;
    if (!cllm_ckpt_is_sharded(dir)) return cllm_model_load(out, dir);
    char path[4096];
    join(path, sizeof path, dir, "config.json");
    json_t *conf = NULL;
    cllm_status st = cllm_json_load_file(&conf, path);
    if (st) return st;
    cllm_model *m = NULL;
    st = cllm_model_init_random(&m, conf, 0); /* every parameter is overwritten below */
    json_decref(conf);
    if (st) return cllm_fail_context(st, "%s", path);
    /* a PPO policy's value head is the layout's last tensor */
    layout L;
    if (!(st = layout_open(&L, dir))) {
        size_t nt = json_array_size(L.tensors);
        const char *last = nt ? json_string_value(json_object_get(json_array_get(L.tensors, nt - 1), "name")) : NULL;
        if (last && !strcmp(last, "v_head.summary.bias")) st = cllm_model_add_value_head(&m, 0);
        layout_free(&L);
    }
    if (st) {
        cllm_model_free(m);
        return st;
    }
    st = cllm_ckpt_read_range(dir, m, CLLM_CKPT_PARAMS, 0, cllm_model_buffer_len(m), cllm_model_params(m));
    if (st) {
        cllm_model_free(m);
        return st;
    }
    *out = m;
    return CLLM_OK;
}
