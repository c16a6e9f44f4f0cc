/*
 * safetensors reader: maps a file read-only, validates the whole header
 * before handing out any tensor, and converts float tensors to fp32.
 *
 * Layout (see docs/formats/safetensors.md):
 *   bytes [0, 8)        N, header length, unsigned 64-bit little-endian
 *   bytes [8, 8+N)      JSON object {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}
 *   bytes [8+N, end)    data buffer; data_offsets are relative to its start
 *
 * Everything in the file is untrusted: the header length is capped, every
 * shape is overflow-checked, every range is checked against the data size and
 * against the other tensors, and failures are CLLM_ERR_FORMAT messages that
 * name the file and the tensor. Ranges may come in any order and may leave
 * gaps (the format does not forbid padding); they may not overlap.
 * Deliberately left out: big-endian hosts, dtypes other than F32, F16, BF16,
 * I32, I64 and U8, and writing (st_write.c).
 */
#include "io/io_impl.h"

#include "cllm/io.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is used in place: cllm needs a little-endian host"
#endif

/* Conversions below this many elements stay on one thread: starting the
 * OpenMP team costs more than converting a few thousand values. */
#define PAR_MIN_ELEMS (1 << 16)

struct cllm_st_file {
    char *path;
    unsigned char *map;
    size_t map_len;
    int n;
    cllm_st_tensor *t; /* header order */
    int *by_name;      /* indices into t, sorted by name, for bsearch */
    int n_meta;
    const char **meta; /* n_meta key/value pairs, pointing into arena */
    char *arena;       /* every name and metadata string, NUL-terminated */
};

/* qsort/bsearch have no context argument, so the comparators reach the
 * tensor array through the index's owner kept in a small struct. */
typedef struct {
    const cllm_st_tensor *t;
    int i;
} name_key;

static int cmp_name_key(const void *a, const void *b) {
    const name_key *x = a, *y = b;
    return strcmp(x->t[x->i].name, y->t[y->i].name);
}

typedef struct {
    uint64_t begin, end;
    int i;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static uint64_t read_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Copies s into the arena at *pos and returns the copy. */
static const char *arena_put(char *arena, size_t *pos, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = arena + *pos;
    memcpy(d, s, n);
    *pos += n;
    return d;
}

/* Validates one tensor entry and fills *t (name and data set by caller). */
static cllm_status parse_tensor(const char *path, const char *name, json_t *v, uint64_t data_size,
                                cllm_st_tensor *t, range *r) {
    if (!json_is_object(v))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
    if (name[0] == '\0') return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a tensor has an empty name", path);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': \"dtype\" missing or not a string", path, name);
    if (!cllm_io_dtype_parse(json_string_value(jd), &t->dtype))
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: tensor '%s': unknown dtype '%s' (supported: F32, F16, BF16, I32, I64, U8)",
                         path, name, json_string_value(jd));
    if (!json_is_array(js))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': \"shape\" missing or not an array", path, name);
    size_t nd = json_array_size(js);
    if (nd > CLLM_ST_MAX_DIMS)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': %zu dimensions, at most %d supported", path,
                         name, nd, CLLM_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(js, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                             path, name, d);
        uint64_t dim = (uint64_t)json_integer_value(e);
        t->shape[d] = (int64_t)dim;
        /* an empty tensor stays empty whatever the other dims are, but
         * the product must still fit, so check before multiplying */
        if (dim != 0 && numel > (uint64_t)INT64_MAX / dim)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': shape overflows 64-bit element count",
                             path, name);
        numel *= dim;
    }
    for (size_t d = nd; d < CLLM_ST_MAX_DIMS; d++) t->shape[d] = 0;
    size_t esz = cllm_dtype_size(t->dtype), nbytes;
    if (numel > SIZE_MAX || !cllm_size_mul((size_t)numel, esz, &nbytes))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': byte size overflows", path, name);
    t->numel = (int64_t)numel;
    t->nbytes = nbytes;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
        json_integer_value(json_array_get(jo, 1)) < 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: tensor '%s': \"data_offsets\" must be two non-negative integers [begin, end]",
                         path, name);
    uint64_t b = (uint64_t)json_integer_value(json_array_get(jo, 0));
    uint64_t e = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (e < b)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin",
                         path, name, (unsigned long long)b, (unsigned long long)e);
    if (e > data_size)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] exceed the file's data size %llu "
                         "(truncated file?)",
                         path, name, (unsigned long long)b, (unsigned long long)e,
                         (unsigned long long)data_size);
    if (e - b != (uint64_t)nbytes)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s shape needs "
                         "%zu",
                         path, name, (unsigned long long)b, (unsigned long long)e,
                         (unsigned long long)(e - b), cllm_dtype_name(t->dtype), nbytes);
    r->begin = b;
    r->end = e;
    return CLLM_OK;
}

/* Checks __metadata__ and counts the arena bytes for its strings. */
static cllm_status check_metadata(const char *path, json_t *m, size_t *bytes, int *count) {
    if (!json_is_object(m))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: \"__metadata__\" must be an object of strings", path);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: \"__metadata__\" value of '%s' is not a string", path, k);
        *bytes += strlen(k) + strlen(json_string_value(v)) + 2;
        (*count)++;
    }
    return CLLM_OK;
}

/* Builds the tensor table from a parsed header. */
static cllm_status load_header(cllm_st_file *f, json_t *root, const unsigned char *data,
                               uint64_t data_size) {
    const char *path = f->path;
    range *ranges = NULL;
    name_key *keys = NULL;
    cllm_status st = CLLM_OK;
    if (!json_is_object(root))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: header is not a JSON object", path);
    size_t arena_bytes = 1;
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            st = check_metadata(path, v, &arena_bytes, &f->n_meta);
            if (st != CLLM_OK) return st;
        } else {
            arena_bytes += strlen(k) + 1;
            n++;
        }
    }
    f->arena = malloc(arena_bytes);
    f->t = calloc(n ? (size_t)n : 1, sizeof *f->t);
    f->by_name = calloc(n ? (size_t)n : 1, sizeof *f->by_name);
    f->meta = calloc(f->n_meta ? 2 * (size_t)f->n_meta : 1, sizeof *f->meta);
    ranges = calloc(n ? (size_t)n : 1, sizeof *ranges);
    keys = calloc(n ? (size_t)n : 1, sizeof *keys);
    if (!f->arena || !f->t || !f->by_name || !f->meta || !ranges || !keys) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory for %d tensors", path, n);
        goto free_tmp;
    }
    size_t pos = 0;
    int i = 0, m = 0;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                f->meta[2 * m] = arena_put(f->arena, &pos, mk);
                f->meta[2 * m + 1] = arena_put(f->arena, &pos, json_string_value(mv));
                m++;
            }
            continue;
        }
        cllm_st_tensor *t = &f->t[i];
        st = parse_tensor(path, k, v, data_size, t, &ranges[i]);
        if (st != CLLM_OK) goto free_tmp;
        t->name = arena_put(f->arena, &pos, k);
        t->data = data + ranges[i].begin;
        t->file = f->path;
        ranges[i].i = i;
        keys[i].t = f->t;
        keys[i].i = i;
        i++;
    }
    f->n = n;
    /* Overlap: after sorting by begin, every non-empty range must start at
     * or after the furthest end seen so far. Empty ranges overlap nothing. */
    qsort(ranges, (size_t)n, sizeof *ranges, cmp_range);
    uint64_t reach = 0;
    int reach_i = -1;
    for (i = 0; i < n; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (reach_i >= 0 && ranges[i].begin < reach) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [.., %llu]",
                           path, f->t[ranges[i].i].name, (unsigned long long)ranges[i].begin,
                           (unsigned long long)ranges[i].end, f->t[reach_i].name,
                           (unsigned long long)reach);
            goto free_tmp;
        }
        reach = ranges[i].end;
        reach_i = ranges[i].i;
    }
    /* The JSON parser already refuses duplicate keys; the adjacent check
     * after sorting keeps lookups well defined even if that ever changes. */
    qsort(keys, (size_t)n, sizeof *keys, cmp_name_key);
    for (i = 0; i < n; i++) {
        f->by_name[i] = keys[i].i;
        if (i > 0 && strcmp(f->t[keys[i].i].name, f->t[keys[i - 1].i].name) == 0) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' appears twice", path, f->t[keys[i].i].name);
            goto free_tmp;
        }
    }
free_tmp:
    free(ranges);
    free(keys);
    return st;
}

cllm_status cllm_st_open(cllm_st_file **out, const char *path) {
    if (!out || !path) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    *out = NULL;
    char eb[128];
    cllm_status st = CLLM_OK;
    json_t *root = NULL;
    cllm_st_file *f = calloc(1, sizeof *f);
    size_t plen = strlen(path);
    if (!f || !(f->path = malloc(plen + 1))) {
        free(f);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    memcpy(f->path, path, plen + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", path, cllm_io_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot stat '%s': %s", path, cllm_io_errstr(errno, eb, sizeof eb));
        goto close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = CLLM_FAIL(CLLM_ERR_IO, "'%s' is not a regular file", path);
        goto close_fd;
    }
    if (sb.st_size < 8) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT,
                       "%s: file is %lld bytes, too short for a safetensors file (needs an 8-byte "
                       "header length)",
                       path, (long long)sb.st_size);
        goto close_fd;
    }
    if ((uintmax_t)sb.st_size > SIZE_MAX) {
        st = CLLM_FAIL(CLLM_ERR_IO, "'%s' is too large to map", path);
        goto close_fd;
    }
    f->map_len = (size_t)sb.st_size;
    void *map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot map '%s': %s", path, cllm_io_errstr(errno, eb, sizeof eb));
        goto close_fd;
    }
    f->map = map;
    /* the mapping keeps the file alive; the descriptor is no longer needed */
    close(fd);
    fd = -1;

    uint64_t hlen = read_le64(f->map);
    if (hlen > CLLM_ST_MAX_HEADER) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes", path,
                       (unsigned long long)hlen, CLLM_ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > f->map_len - 8) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT,
                       "%s: header length %llu exceeds the file size (%zu bytes; truncated file?)", path,
                       (unsigned long long)hlen, f->map_len);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: header is not valid JSON: %d:%d: %s", path, jerr.line,
                       jerr.column, jerr.text);
        goto fail;
    }
    st = load_header(f, root, f->map + 8 + hlen, (uint64_t)(f->map_len - 8 - hlen));
    if (st != CLLM_OK) goto fail;
    json_decref(root);
    *out = f;
    return CLLM_OK;
close_fd:
    if (fd >= 0) close(fd);
fail:
    json_decref(root);
    cllm_st_close(f);
    return st;
}

void cllm_st_close(cllm_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    free(f->t);
    free(f->by_name);
    free(f->meta);
    free(f->arena);
    free(f->path);
    free(f);
}

int cllm_st_count(const cllm_st_file *f) { return f ? f->n : 0; }

const cllm_st_tensor *cllm_st_at(const cllm_st_file *f, int i) {
    return f && i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const cllm_st_tensor *cllm_st_find(const cllm_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    return st_find_sorted(f->t, f->by_name, f->n, name);
}

const char *cllm_st_metadata(const cllm_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

/* ------------------------------------------------------ conversion */

cllm_status cllm_st_read_f32(const cllm_st_tensor *t, float *dst, int64_t n) {
    if (!t || (!dst && n > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "NULL tensor or destination");
    if (n != t->numel)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: tensor '%s' has %lld elements, expected %lld",
                         t->file ? t->file : "?", t->name, (long long)t->numel, (long long)n);
    /* The mapping gives no alignment guarantee (the header length is
     * arbitrary), so values are read bytewise or through memcpy. */
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case CLLM_F32: {
        const int64_t chunk = PAR_MIN_ELEMS;
        int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
            memcpy(dst + b, src + 4 * b, (size_t)(e - b) * 4);
        }
        return CLLM_OK;
    }
    case CLLM_F16:
#pragma omp parallel for schedule(static) if (n >= PAR_MIN_ELEMS)
        for (int64_t i = 0; i < n; i++)
            dst[i] = cllm_f16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        return CLLM_OK;
    case CLLM_BF16:
#pragma omp parallel for schedule(static) if (n >= PAR_MIN_ELEMS)
        for (int64_t i = 0; i < n; i++)
            dst[i] = cllm_bf16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        return CLLM_OK;
    default:
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has dtype %s; only F32, F16 and BF16 convert to fp32",
                         t->file ? t->file : "?", t->name, cllm_dtype_name(t->dtype));
    }
}
