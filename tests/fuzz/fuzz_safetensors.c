/*
 * Fuzz target: safetensors files (src/io/safetensors.c, st_dir.c) through
 * cllm_st_open / cllm_st_set_open, then every tensor read back as fp32.
 *
 * The first input byte picks the mode:
 *   even: the rest of the input is the file, as is.
 *   odd:  the rest drives a builder that writes a well-formed header from
 *         fuzzed fields (tensor count, dtype, shape, data_offsets: exact,
 *         shifted, arbitrary or overlapping) and a data buffer of about the
 *         right size, so the offset/shape/overlap checks are reached; with
 *         bit 1 set a model.safetensors.index.json naming the tensors (and,
 *         by fuzzed choice, a missing shard or one outside the folder) is
 *         written too and the folder is opened as a set.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "fuzz_util.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} cursor;

static unsigned take(cursor *c) {
    if (!c->n) return 0;
    c->n--;
    return *c->p++;
}

static unsigned take16(cursor *c) { return take(c) | take(c) << 8; }

static void read_all(const cllm_st_tensor *t) {
    if (!t || t->numel > (1 << 16)) return;
    float *dst = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
    if (!dst) abort();
    (void)cllm_st_read_f32(t, dst, t->numel);
    free(dst);
}

static void check_file(const char *path) {
    cllm_st_file *f = NULL;
    if (fuzz_note(cllm_st_open(&f, path)) == CLLM_OK) {
        for (int i = 0; i < cllm_st_count(f); i++) {
            const cllm_st_tensor *t = cllm_st_at(f, i);
            if (cllm_st_find(f, t->name) == NULL) abort(); /* a listed tensor must be found */
            read_all(t);
        }
        (void)cllm_st_metadata(f, "format");
    }
    cllm_st_close(f);
}

static void check_set(const char *dir) {
    cllm_st_set *s = NULL;
    if (fuzz_note(cllm_st_set_open(&s, dir)) == CLLM_OK) {
        for (int i = 0; i < cllm_st_set_count(s); i++) {
            const cllm_st_tensor *t = cllm_st_set_at(s, i);
            if (cllm_st_set_find(s, t->name) == NULL) abort();
            read_all(t);
        }
    }
    cllm_st_set_close(s);
}

static const char *const DTYPES[] = {"F32", "F16", "BF16", "I32", "I64", "U8", "F64", "BOOL"};
static const int DSIZE[] = {4, 2, 2, 4, 8, 1, 8, 1};

static int64_t dim(cursor *c) {
    unsigned b = take(c);
    if (b < 240) return b % 6;
    switch (b & 7) {
    case 0: return -1;
    case 1: return INT64_C(1) << 31;
    case 2: return INT64_C(1) << 40;
    case 3: return INT64_MAX;
    case 4: return 1000;
    default: return 65537;
    }
}

static void build(cursor *c, bool as_set) {
    char hdr[16384];
    size_t h = 0;
#define PUT(...) h += (size_t)snprintf(hdr + h, h < sizeof hdr ? sizeof hdr - h : 0, __VA_ARGS__)
    int n = 1 + (int)(take(c) % 4);
    int64_t end = 0, prev_begin = 0;
    PUT("{");
    if (take(c) & 1) PUT("\"__metadata__\":{\"format\":\"pt\"},");
    char names[4][8];
    for (int i = 0; i < n; i++) {
        unsigned k = take(c);
        int dt = (int)(k & 7);            /* bits 0-2: dtype */
        int nd = (int)((k >> 3) & 7) % 5; /* bits 3-5: ndim 0..4 */
        if ((k & 0x80) && i) memcpy(names[i], names[i - 1], sizeof names[i]); /* bit 7: repeat a name */
        else snprintf(names[i], sizeof names[i], "t%d", i);
        PUT("%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", names[i], DTYPES[dt]);
        int64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            int64_t v = dim(c);
            PUT("%s%" PRId64, d ? "," : "", v);
            numel = (v >= 0 && v < 65536 && numel < 65536) ? numel * v : 65536;
        }
        int64_t bytes = numel * DSIZE[dt], begin, stop;
        switch (take(c) % 4) {
        case 0: begin = end; stop = end + bytes; break;
        case 1: begin = end + (int64_t)(take(c) % 5) - 2; stop = begin + bytes + (int64_t)(take(c) % 5) - 2; break;
        case 2: begin = take16(c); stop = take16(c); break;
        default: begin = prev_begin; stop = prev_begin + bytes; break;
        }
        prev_begin = begin;
        if (stop > end) end = stop;
        PUT("],\"data_offsets\":[%" PRId64 ",%" PRId64 "]}", begin, stop);
    }
    PUT("}");
    if (h >= sizeof hdr) return;
    unsigned shard = take(c) % 4, pad = take(c) % 4; /* spaces after the JSON (the format pads to 8) */
    size_t hl = h + pad;
    int64_t data_len = end + (int64_t)(take(c) % 5) - 2;
    if (data_len < 0) data_len = 0;
    if (data_len > (1 << 20)) data_len = 1 << 20;
    /* the data: the input's remaining bytes, then zeros (a hole) */
    size_t total = 8 + hl + (size_t)data_len, fill = 8 + hl + (c->n < (size_t)data_len ? c->n : (size_t)data_len);
    unsigned char *buf = malloc(fill);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, h);
    memset(buf + 8 + h, ' ', pad);
    for (size_t i = 8 + hl; i < fill; i++) buf[i] = (unsigned char)take(c);
    const char *path = fuzz_write_padded(0, "model.safetensors", buf, fill, total);
    free(buf);
    check_file(path);
    if (!as_set) return;
    char idx[1024];
    size_t x = 0;
    const char *shard_name = shard == 0 ? "missing.safetensors" : shard == 1 ? "../model.safetensors"
                                                                              : "model.safetensors";
    x += (size_t)snprintf(idx + x, sizeof idx - x, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < n; i++)
        x += (size_t)snprintf(idx + x, sizeof idx - x, "%s\"%s\":\"%s\"", i ? "," : "", names[i], shard_name);
    x += (size_t)snprintf(idx + x, sizeof idx - x, "}}");
    fuzz_write(1, "model.safetensors.index.json", idx, x);
    check_set(fuzz_dir());
#undef PUT
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    cursor c = {data + 1, size - 1};
    if (data[0] & 1) {
        build(&c, data[0] & 2);
    } else {
        const char *path = fuzz_write(0, "model.safetensors", data + 1, size - 1);
        check_file(path);
        fuzz_absent(1); /* the folder holds the file alone */
        if (data[0] & 2) check_set(fuzz_dir());
    }
    return 0;
}
