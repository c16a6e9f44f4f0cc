/*
 * safetensors writer: one file (cllm_st_save) or a HF model folder with
 * optional sharding and model.safetensors.index.json (cllm_st_save_dir).
 *
 * The header is compact JSON: {"__metadata__":{"format":"pt"}} first, then
 * the tensors in the caller's order with contiguous data_offsets, padded with
 * spaces so the data buffer starts at a multiple of 8 bytes. Nothing depends
 * on time, pid or hash order, so equal inputs give equal bytes. Every file is
 * written through a temp file and renamed into place.
 * Deliberately left out: aligning each tensor inside the buffer (readers
 * must not assume alignment anyway) and big-endian hosts.
 */
#include "io/io_impl.h"

#include "cllm/io.h"
#include "cllm/json.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor data is written in host order and safetensors is little-endian"
#endif

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"
#define MAX_SHARDS 99999 /* the five-digit names HF uses */

/* Checks one entry and returns its data size. */
static cllm_status entry_bytes(const cllm_st_entry *e, int idx, size_t *nbytes) {
    if (!e->name || !e->name[0])
        return CLLM_FAIL(CLLM_ERR_ARG, "entry %d has no name", idx);
    if (strcmp(e->name, "__metadata__") == 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "entry %d: '__metadata__' is reserved and cannot name a tensor", idx);
    if ((int)e->dtype < 0 || e->dtype >= CLLM_DTYPE_COUNT)
        return CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s': invalid dtype %d", e->name, (int)e->dtype);
    if (e->ndim < 0 || e->ndim > CLLM_ST_MAX_DIMS)
        return CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s': ndim %d outside [0, %d]", e->name, e->ndim,
                         CLLM_ST_MAX_DIMS);
    size_t n = cllm_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0)
            return CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s': negative shape[%d] = %lld", e->name, d,
                             (long long)e->shape[d]);
        if ((uint64_t)e->shape[d] > SIZE_MAX || !cllm_size_mul(n, (size_t)e->shape[d], &n) ||
            n > (size_t)INT64_MAX)
            return CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s': byte size overflows", e->name);
    }
    if (n > 0 && !e->data) return CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s': NULL data", e->name);
    *nbytes = n;
    return CLLM_OK;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sizes every entry into sizes[n] and refuses repeated names. */
static cllm_status check_entries(const cllm_st_entry *entries, int n, size_t *sizes, size_t *total) {
    cllm_status st = CLLM_OK;
    *total = 0;
    if (n < 0) return CLLM_FAIL(CLLM_ERR_ARG, "negative tensor count %d", n);
    for (int i = 0; i < n; i++) {
        st = entry_bytes(&entries[i], i, &sizes[i]);
        if (st != CLLM_OK) return st;
        if (!cllm_size_add(*total, sizes[i], total))
            return CLLM_FAIL(CLLM_ERR_ARG, "total tensor size overflows");
    }
    const char **names = malloc((n ? (size_t)n : 1) * sizeof *names);
    if (!names) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %d names", n);
    for (int i = 0; i < n; i++) names[i] = entries[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i], names[i - 1]) == 0) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "tensor '%s' given twice", names[i]);
            break;
        }
    }
    free(names);
    return st;
}

/* The compact header JSON for entries whose sizes are known. */
static cllm_status build_header(const cllm_st_entry *entries, int n, const size_t *sizes,
                                char **out) {
    cllm_status st = CLLM_OK;
    json_t *root = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    if (!root || !meta || json_object_set_new(root, "__metadata__", meta) != 0) {
        json_decref(root);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory building the header");
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const cllm_st_entry *e = &entries[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < e->ndim; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)e->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *t = shape ? json_pack("{s:s, s:o, s:[I,I]}", "dtype", cllm_dtype_name(e->dtype), "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + sizes[i]))
                          : NULL;
        if (!t) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory building the header");
            goto free_root;
        }
        /* jansson only takes UTF-8 keys; safetensors names are UTF-8 too */
        if (json_object_set_new(root, e->name, t) != 0) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "tensor name '%s' is not valid UTF-8", e->name);
            goto free_root;
        }
        off += sizes[i];
    }
    *out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*out) st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot serialise the header");
free_root:
    json_decref(root);
    return st;
}

/* Writes entries whose sizes are already checked. */
static cllm_status save_checked(const char *path, const cllm_st_entry *entries, int n,
                                const size_t *sizes) {
    char *header = NULL;
    cllm_status st = build_header(entries, n, sizes, &header);
    if (st != CLLM_OK) return cllm_fail_context(st, "%s", path);
    size_t hlen = strlen(header);
    /* pad so the data buffer (at 8 + hlen) starts on an 8-byte boundary */
    size_t padded = (hlen + 7) & ~(size_t)7;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
    cllm_io_atomic a;
    st = cllm_io_atomic_begin(&a, path);
    if (st != CLLM_OK) goto free_header;
    st = cllm_io_atomic_write(&a, lenbuf, 8);
    if (st == CLLM_OK) st = cllm_io_atomic_write(&a, header, hlen);
    if (st == CLLM_OK) st = cllm_io_atomic_write(&a, spaces, padded - hlen);
    for (int i = 0; i < n && st == CLLM_OK; i++) st = cllm_io_atomic_write(&a, entries[i].data, sizes[i]);
    if (st != CLLM_OK) {
        cllm_io_atomic_abort(&a);
        goto free_header;
    }
    st = cllm_io_atomic_commit(&a);
free_header:
    free(header);
    return st;
}

cllm_status cllm_st_save(const char *path, const cllm_st_entry *entries, int n) {
    if (!path || n < 0 || (n > 0 && !entries)) return CLLM_FAIL(CLLM_ERR_ARG, "bad arguments");
    size_t *sizes = malloc((n ? (size_t)n : 1) * sizeof *sizes), total;
    if (!sizes) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = check_entries(entries, n, sizes, &total);
    if (st == CLLM_OK) st = save_checked(path, entries, n, sizes);
    else cllm_fail_context(st, "%s", path);
    free(sizes);
    return st;
}

/* ---------------------------------------------------------- folders */

/* Parses "model-KKKKK-of-NNNNN.safetensors"; false for any other name. */
static bool shard_name(const char *s, int *k, int *of) {
    static const char pat[] = "model-#####-of-#####.safetensors";
    if (strlen(s) != sizeof pat - 1) return false;
    int v[2] = {0, 0}, which = 0;
    for (size_t i = 0; pat[i]; i++) {
        if (pat[i] == '#') {
            if (s[i] < '0' || s[i] > '9') return false;
            v[which] = v[which] * 10 + (s[i] - '0');
            if (pat[i + 1] != '#') which++;
        } else if (s[i] != pat[i]) {
            return false;
        }
    }
    *k = v[0];
    *of = v[1];
    return true;
}

static cllm_status remove_file(const char *dir, const char *name) {
    char *p = cllm_io_join(dir, name);
    if (!p) return CLLM_ERR_NOMEM;
    cllm_status st = CLLM_OK;
    if (unlink(p) != 0 && errno != ENOENT) {
        char eb[128];
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot remove stale '%s': %s", p, cllm_io_errstr(errno, eb, sizeof eb));
    }
    free(p);
    return st;
}

/* Removes shards of an earlier save that are not part of the current
 * layout of `n_shards` shards (0 = single file, so every shard is stale). */
static cllm_status remove_stale_shards(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) {
        char eb[128];
        return CLLM_FAIL(CLLM_ERR_IO, "cannot list '%s': %s", dir, cllm_io_errstr(errno, eb, sizeof eb));
    }
    cllm_status st = CLLM_OK;
    struct dirent *ent;
    while (st == CLLM_OK && (ent = readdir(d)) != NULL) {
        int k, of;
        if (!shard_name(ent->d_name, &k, &of)) continue;
        if (of == n_shards && k >= 1 && k <= n_shards) continue;
        st = remove_file(dir, ent->d_name);
    }
    closedir(d);
    return st;
}

typedef struct {
    const char *name;
    int shard;
} map_row;

static int cmp_map_row(const void *a, const void *b) {
    return strcmp(((const map_row *)a)->name, ((const map_row *)b)->name);
}

static cllm_status write_index(const char *dir, const cllm_st_entry *entries, int n,
                               const int *shard_of, int n_shards, size_t total) {
    cllm_status st = CLLM_OK;
    char *path = NULL;
    map_row *rows = malloc((n ? (size_t)n : 1) * sizeof *rows);
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    if (!rows || !root || !meta || !map) {
        json_decref(meta);
        json_decref(map);
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory building the index");
        goto free_all;
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    if (json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) != 0) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory building the index");
        goto free_all;
    }
    /* HF writes weight_map sorted by tensor name */
    for (int i = 0; i < n; i++) rows[i] = (map_row){entries[i].name, shard_of[i]};
    qsort(rows, (size_t)n, sizeof *rows, cmp_map_row);
    for (int i = 0; i < n; i++) {
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", rows[i].shard + 1, n_shards);
        if (json_object_set_new(map, rows[i].name, json_string(fname)) != 0) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "tensor name '%s' is not valid UTF-8", rows[i].name);
            goto free_all;
        }
    }
    path = cllm_io_join(dir, INDEX_NAME);
    st = path ? cllm_json_save_file(root, path) : CLLM_ERR_NOMEM;
free_all:
    free(path);
    free(rows);
    json_decref(root);
    return st;
}

cllm_status cllm_st_save_dir(const char *dir, const cllm_st_entry *entries, int n,
                             size_t max_shard_bytes) {
    if (!dir || n < 0 || (n > 0 && !entries)) return CLLM_FAIL(CLLM_ERR_ARG, "bad arguments");
    cllm_status st;
    char *path = NULL;
    size_t total;
    size_t *sizes = malloc((n ? (size_t)n : 1) * sizeof *sizes);
    int *shard_of = malloc((n ? (size_t)n : 1) * sizeof *shard_of);
    if (!sizes || !shard_of) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto free_all;
    }
    st = check_entries(entries, n, sizes, &total);
    if (st != CLLM_OK) {
        cllm_fail_context(st, "%s", dir);
        goto free_all;
    }
    if (max_shard_bytes == 0 || total <= max_shard_bytes) {
        path = cllm_io_join(dir, SINGLE_NAME);
        if (!path) {
            st = CLLM_ERR_NOMEM;
            goto free_all;
        }
        st = save_checked(path, entries, n, sizes);
        /* the index goes first: without it readers already use the new file */
        if (st == CLLM_OK) st = remove_file(dir, INDEX_NAME);
        if (st == CLLM_OK) st = remove_stale_shards(dir, 0);
        goto sync_dir;
    }
    /* Greedy in the given order, so each shard is a contiguous run of
     * entries; a tensor above the limit ends up alone in its shard. */
    int n_shards = 0;
    size_t cur = 0;
    for (int i = 0; i < n; i++) {
        if (n_shards == 0 || (cur > 0 && cur + sizes[i] > max_shard_bytes)) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += sizes[i];
    }
    if (n_shards > MAX_SHARDS) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "%s: %d shards exceed the %d that five-digit names allow; raise "
                       "the shard size", dir, n_shards, MAX_SHARDS);
        goto free_all;
    }
    for (int s = 0, first = 0; s < n_shards; s++) {
        int last = first;
        while (last < n && shard_of[last] == s) last++;
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        free(path);
        path = cllm_io_join(dir, fname);
        if (!path) {
            st = CLLM_ERR_NOMEM;
            goto free_all;
        }
        st = save_checked(path, entries + first, last - first, sizes + first);
        if (st != CLLM_OK) goto free_all;
        first = last;
    }
    /* the index is written after every shard it names is in place */
    st = write_index(dir, entries, n, shard_of, n_shards, total);
    if (st == CLLM_OK) st = remove_file(dir, SINGLE_NAME);
    if (st == CLLM_OK) st = remove_stale_shards(dir, n_shards);
sync_dir:
    if (st == CLLM_OK) {
        free(path);
        path = cllm_io_join(dir, INDEX_NAME);
        st = path ? cllm_io_fsync_parent(path) : CLLM_ERR_NOMEM;
    }
free_all:
    free(path);
    free(sizes);
    free(shard_of);
    return st;
}
