/*
 * io: safetensors round trips (F32, F16, BF16, integer dtypes, scalars and
 * empty tensors), byte-identical re-saves, sharded folders and stale-file
 * cleanup, hostile headers built byte by byte, a mutation loop over a valid
 * file, JSON helpers, size strings and atomic writes.
 * Everything is written under a fresh mkdtemp() folder removed at the end.
 */
#include "check.h"
#include "cllm/io.h"
#include "cllm/json.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

/* dst = g_root/sub (sub may contain '/'). */
static const char *in_root(char *dst, size_t cap, const char *sub) {
    snprintf(dst, cap, "%s/%s", g_root, sub);
    return dst;
}

static void make_dir(const char *sub) {
    char p[512];
    mkdir(in_root(p, sizeof p, sub), 0755);
}

/* Test scaffolding: only a failure is counted, so the pass count reflects
 * checks of the library. */
static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    bool ok = fp != NULL && fwrite(data, 1, n, fp) == n;
    if (fp && fclose(fp) != 0) ok = false;
    if (!ok) CHECK(0, "cannot write %s", path);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Number of entries in dir whose name contains `part`. */
static int count_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

static void rm_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_tree(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Builds a safetensors image: 8-byte LE length, header text, `pad` spaces,
 * then data. *len receives the total. Caller frees. */
static unsigned char *build_st(const char *header, size_t pad, const void *data, size_t dlen,
                               size_t *len) {
    size_t h = strlen(header) + pad;
    *len = 8 + h + dlen;
    unsigned char *b = malloc(*len ? *len : 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, strlen(header));
    memset(b + 8 + strlen(header), ' ', pad);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    return b;
}

static unsigned char *read_all(const char *path, size_t *len) {
    char *d = NULL;
    *len = 0;
    if (cllm_read_file(path, &d, len) != CLLM_OK) return NULL;
    return (unsigned char *)d;
}

static cllm_st_entry entry(const char *name, cllm_dtype dt, int ndim, const int64_t *shape,
                           const void *data) {
    cllm_st_entry e;
    memset(&e, 0, sizeof e);
    e.name = name;
    e.dtype = dt;
    e.ndim = ndim;
    for (int i = 0; i < ndim; i++) e.shape[i] = shape[i];
    e.data = data;
    return e;
}

/* ------------------------------------------------------- round trip */

static void test_roundtrip(void) {
    make_dir("rt");
    char pa[512], pb[512];
    in_root(pa, sizeof pa, "rt/a.safetensors");
    in_root(pb, sizeof pb, "rt/b.safetensors");
    float w[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    float scalar = 3.5f;
    float bvals[5] = {10, 20, 30, 40, 50};
    int32_t ids[3] = {-7, 0, 2147483647};
    uint8_t bytes[5] = {0, 1, 127, 128, 255};
    int64_t s23[2] = {2, 3}, s04[2] = {0, 4}, s5[1] = {5}, s3[1] = {3};
    cllm_st_entry es[6] = {
        entry("w", CLLM_F32, 2, s23, w),     entry("scalar", CLLM_F32, 0, NULL, &scalar),
        entry("empty", CLLM_F32, 2, s04, NULL), entry("b", CLLM_F32, 1, s5, bvals),
        entry("ids", CLLM_I32, 1, s3, ids),  entry("bytes", CLLM_U8, 1, s5, bytes),
    };
    cllm_status st = cllm_st_save(pa, es, 6);
    CHECK(st == CLLM_OK, "save: %s", cllm_last_error());
    CHECK(count_named(in_root(pb, sizeof pb, "rt"), ".tmp.") == 0, "temp file left behind");
    in_root(pb, sizeof pb, "rt/b.safetensors");

    size_t alen;
    unsigned char *abytes = read_all(pa, &alen);
    CHECK(abytes != NULL && alen > 8, "read back");
    if (!abytes) return;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | abytes[i];
    CHECK((8 + hlen) % 8 == 0, "data start %llu not 8-aligned", (unsigned long long)(8 + hlen));
    CHECK(memcmp(abytes + 8, "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\"", 50) == 0,
          "header starts with '%.60s'", abytes + 8);
    CHECK(alen == 8 + hlen + 24 + 4 + 0 + 20 + 12 + 5, "file size %zu", alen);

    cllm_st_file *f = NULL;
    st = cllm_st_open(&f, pa);
    CHECK(st == CLLM_OK, "open: %s", cllm_last_error());
    if (!f) {
        free(abytes);
        return;
    }
    CHECK(cllm_st_count(f) == 6, "count %d", cllm_st_count(f));
    CHECK(cllm_st_metadata(f, "format") && strcmp(cllm_st_metadata(f, "format"), "pt") == 0, "metadata");
    CHECK(cllm_st_metadata(f, "nope") == NULL, "absent metadata");
    for (int i = 0; i < 6 && i < cllm_st_count(f); i++) {
        const cllm_st_tensor *t = cllm_st_at(f, i);
        CHECK(strcmp(t->name, es[i].name) == 0, "order: %d is '%s'", i, t->name);
        CHECK(t->dtype == es[i].dtype && t->ndim == es[i].ndim, "%s dtype/ndim", t->name);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == es[i].shape[d], "%s shape[%d]", t->name, d);
        CHECK(strcmp(t->file, pa) == 0, "file field");
        CHECK(cllm_st_find(f, es[i].name) == t, "find %s", es[i].name);
    }
    CHECK(cllm_st_find(f, "missing") == NULL, "find missing");
    CHECK(cllm_st_at(f, 6) == NULL && cllm_st_at(f, -1) == NULL, "at out of range");
    const cllm_st_tensor *t = cllm_st_find(f, "w");
    float out[6];
    CHECK(t && cllm_st_read_f32(t, out, 6) == CLLM_OK, "read w");
    CHECK(t && memcmp(out, w, sizeof w) == 0, "w values");
    t = cllm_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4, "scalar meta");
    CHECK(t && cllm_st_read_f32(t, out, 1) == CLLM_OK && out[0] == 3.5f, "scalar value");
    t = cllm_st_find(f, "empty");
    CHECK(t && t->numel == 0 && t->nbytes == 0, "empty meta");
    CHECK(t && cllm_st_read_f32(t, NULL, 0) == CLLM_OK, "empty read");
    t = cllm_st_find(f, "ids");
    CHECK(t && t->nbytes == 12 && memcmp(t->data, ids, 12) == 0, "ids bytes");
    CHECK(t && cllm_st_read_f32(t, out, 3) == CLLM_ERR_UNSUPPORTED, "I32 to f32 refused");
    CHECK(strstr(cllm_last_error(), "'ids'") && strstr(cllm_last_error(), "I32"), "msg: %s",
          cllm_last_error());
    t = cllm_st_find(f, "bytes");
    CHECK(t && memcmp(t->data, bytes, 5) == 0, "u8 bytes");
    t = cllm_st_find(f, "b");
    CHECK(t && cllm_st_read_f32(t, out, 4) == CLLM_ERR_ARG && strstr(cllm_last_error(), "'b'"),
          "wrong count refused: %s", cllm_last_error());

    /* Save what was loaded: the bytes must be identical. */
    cllm_st_entry again[6];
    for (int i = 0; i < 6; i++) {
        const cllm_st_tensor *x = cllm_st_at(f, i);
        again[i] = entry(x->name, x->dtype, x->ndim, x->shape, x->data);
    }
    st = cllm_st_save(pb, again, 6);
    CHECK(st == CLLM_OK, "re-save: %s", cllm_last_error());
    size_t blen;
    unsigned char *bb = read_all(pb, &blen);
    CHECK(bb && blen == alen && memcmp(abytes, bb, alen) == 0, "re-saved file differs");
    free(bb);
    cllm_st_close(f);
    cllm_st_close(NULL);
    free(abytes);

    /* writer refuses bad entries */
    cllm_st_entry dup[2] = {entry("x", CLLM_F32, 1, s5, bvals), entry("x", CLLM_F32, 1, s5, bvals)};
    CHECK(cllm_st_save(pb, dup, 2) == CLLM_ERR_ARG && strstr(cllm_last_error(), "twice"), "dup: %s",
          cllm_last_error());
    int64_t neg[1] = {-1};
    cllm_st_entry bad = entry("x", CLLM_F32, 1, neg, bvals);
    CHECK(cllm_st_save(pb, &bad, 1) == CLLM_ERR_ARG, "negative shape saved");
    bad = entry("__metadata__", CLLM_F32, 1, s5, bvals);
    CHECK(cllm_st_save(pb, &bad, 1) == CLLM_ERR_ARG, "reserved name saved");
    CHECK(count_named(in_root(pa, sizeof pa, "rt"), ".tmp.") == 0, "temp file left after failures");
}

/* --------------------------------------------- half precision by hand */

static void test_half_types(void) {
    /* F16: 1, -2, 65504, smallest subnormal; BF16: 1, -2, 3.140625, +inf;
     * F32 at an odd address (header length 151 is not padded). */
    const uint16_t h16[4] = {0x3c00, 0xc000, 0x7bff, 0x0001};
    const float h16v[4] = {1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f};
    const uint16_t b16[4] = {0x3f80, 0xc000, 0x4049, 0x7f80};
    const float b16v[4] = {1.0f, -2.0f, 3.140625f, INFINITY};
    const float f32v[3] = {0.1f, -7.0f, 1e20f};
    unsigned char data[8 + 8 + 12];
    for (int i = 0; i < 4; i++) {
        data[2 * i] = (unsigned char)(h16[i] & 0xff);
        data[2 * i + 1] = (unsigned char)(h16[i] >> 8);
        data[8 + 2 * i] = (unsigned char)(b16[i] & 0xff);
        data[8 + 2 * i + 1] = (unsigned char)(b16[i] >> 8);
    }
    memcpy(data + 16, f32v, 12);
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]},"
                      "\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16,28]}}";
    size_t len;
    unsigned char *img = build_st(hdr, (strlen(hdr) % 2) ? 0 : 1, data, sizeof data, &len);
    char p[512];
    write_bytes(in_root(p, sizeof p, "half.safetensors"), img, len);
    free(img);
    cllm_st_file *f = NULL;
    CHECK(cllm_st_open(&f, p) == CLLM_OK, "open half: %s", cllm_last_error());
    if (!f) return;
    float out[4];
    const cllm_st_tensor *t = cllm_st_find(f, "h");
    CHECK(t && t->dtype == CLLM_F16 && cllm_st_read_f32(t, out, 4) == CLLM_OK, "read F16");
    for (int i = 0; t && i < 4; i++) CHECK(out[i] == h16v[i], "F16[%d] = %g", i, out[i]);
    t = cllm_st_find(f, "b");
    CHECK(t && t->dtype == CLLM_BF16 && cllm_st_read_f32(t, out, 4) == CLLM_OK, "read BF16");
    for (int i = 0; t && i < 4; i++) CHECK(out[i] == b16v[i], "BF16[%d] = %g", i, out[i]);
    t = cllm_st_find(f, "f");
    CHECK(t && ((uintptr_t)t->data % 4) != 0, "test meant an unaligned F32 tensor");
    CHECK(t && cllm_st_read_f32(t, out, 3) == CLLM_OK, "read unaligned F32");
    for (int i = 0; t && i < 3; i++) CHECK(out[i] == f32v[i], "F32[%d] = %g", i, out[i]);
    CHECK(cllm_st_metadata(f, "format") == NULL, "no metadata expected");
    cllm_st_close(f);
}

/* Large tensors go through the OpenMP paths. */
static void test_large(void) {
    enum { N = 300001 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint16_t *h = malloc(N * sizeof *h), *bf = malloc(N * sizeof *bf);
    cllm_rng r;
    cllm_rng_seed(&r, 7);
    for (int i = 0; i < N; i++) {
        x[i] = cllm_rng_normal(&r);
        h[i] = cllm_f32_to_f16(x[i]);
        bf[i] = cllm_f32_to_bf16(x[i]);
    }
    int64_t s[1] = {N};
    cllm_st_entry es[3] = {entry("x", CLLM_F32, 1, s, x), entry("h", CLLM_F16, 1, s, h),
                           entry("bf", CLLM_BF16, 1, s, bf)};
    char p[512];
    in_root(p, sizeof p, "large.safetensors");
    CHECK(cllm_st_save(p, es, 3) == CLLM_OK, "save large: %s", cllm_last_error());
    cllm_st_file *f = NULL;
    CHECK(cllm_st_open(&f, p) == CLLM_OK, "open large: %s", cllm_last_error());
    if (f) {
        CHECK(cllm_st_read_f32(cllm_st_find(f, "x"), y, N) == CLLM_OK && memcmp(x, y, N * sizeof *x) == 0,
              "large F32 differs");
        int bad = 0;
        CHECK(cllm_st_read_f32(cllm_st_find(f, "h"), y, N) == CLLM_OK, "read large F16");
        for (int i = 0; i < N; i++) bad += y[i] != cllm_f16_to_f32(h[i]);
        CHECK(cllm_st_read_f32(cllm_st_find(f, "bf"), y, N) == CLLM_OK, "read large BF16");
        for (int i = 0; i < N; i++) bad += y[i] != cllm_bf16_to_f32(bf[i]);
        CHECK(bad == 0, "%d converted values differ", bad);
        cllm_st_close(f);
    }
    free(x);
    free(y);
    free(h);
    free(bf);
}

/* ------------------------------------------------------------ folders */

#define NT 10
static float g_vals[NT][600];

static void fill_entries(cllm_st_entry *es, int64_t (*shapes)[1], char (*names)[16]) {
    /* sizes in bytes: 400 each, except t03 (2400, above a 1000-byte limit) */
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], 16, "t%02d", NT - 1 - i); /* reverse order: index must sort */
        shapes[i][0] = i == 3 ? 600 : 100;
        for (int j = 0; j < 600; j++) g_vals[i][j] = (float)(i * 1000 + j);
        es[i] = entry(names[i], CLLM_F32, 1, shapes[i], g_vals[i]);
    }
}

static void check_set(const char *dir, const cllm_st_entry *es, int n) {
    cllm_st_set *s = NULL;
    CHECK(cllm_st_set_open(&s, dir) == CLLM_OK, "set open %s: %s", dir, cllm_last_error());
    if (!s) return;
    CHECK(cllm_st_set_count(s) == n, "set count %d", cllm_st_set_count(s));
    static float buf[600];
    for (int i = 0; i < n; i++) {
        const cllm_st_tensor *t = cllm_st_set_find(s, es[i].name);
        CHECK(t != NULL, "set lacks %s", es[i].name);
        if (!t) continue;
        CHECK(t->shape[0] == es[i].shape[0] && cllm_st_read_f32(t, buf, t->numel) == CLLM_OK &&
                  memcmp(buf, es[i].data, t->nbytes) == 0,
              "%s values", es[i].name);
    }
    CHECK(cllm_st_set_find(s, "nope") == NULL && cllm_st_set_at(s, n) == NULL, "set absent lookups");
    for (int i = 0; i < cllm_st_set_count(s); i++) CHECK(cllm_st_set_at(s, i) != NULL, "set_at %d", i);
    cllm_st_set_close(s);
}

static void test_sharded(void) {
    cllm_st_entry es[NT];
    int64_t shapes[NT][1];
    char names[NT][16];
    fill_entries(es, shapes, names);
    make_dir("sh");
    char dir[512], p[512];
    in_root(dir, sizeof dir, "sh");
    /* leftovers from earlier saves: a single file and a decoy shard */
    write_bytes(in_root(p, sizeof p, "sh/model.safetensors"), "junk", 4);
    write_bytes(in_root(p, sizeof p, "sh/model-00009-of-00009.safetensors"), "junk", 4);
    write_bytes(in_root(p, sizeof p, "sh/notes.txt"), "keep", 4);

    CHECK(cllm_st_save_dir(dir, es, NT, 1000) == CLLM_OK, "sharded save: %s", cllm_last_error());
    /* greedy: [0,1] [2] [3 alone: 2400 > 1000] [4,5] [6,7] [8,9] -> 6 shards */
    CHECK(count_named(dir, "-of-00006.safetensors") == 6, "6 shards expected, got %d",
          count_named(dir, "-of-00006.safetensors"));
    CHECK(!exists(in_root(p, sizeof p, "sh/model.safetensors")), "stale single file kept");
    CHECK(!exists(in_root(p, sizeof p, "sh/model-00009-of-00009.safetensors")), "stale shard kept");
    CHECK(exists(in_root(p, sizeof p, "sh/notes.txt")), "unrelated file removed");
    CHECK(count_named(dir, ".tmp.") == 0, "temp file left");

    json_t *idx = NULL;
    CHECK(cllm_json_load_file(&idx, in_root(p, sizeof p, "sh/model.safetensors.index.json")) == CLLM_OK,
          "index: %s", cllm_last_error());
    if (idx) {
        json_t *map = json_object_get(idx, "weight_map");
        int64_t total = 0;
        CHECK(cllm_json_get_int(json_object_get(idx, "metadata"), "total_size", &total, "index") == CLLM_OK &&
                  total == 9 * 400 + 2400,
              "total_size %lld", (long long)total);
        const char *prev = "", *k;
        json_t *v;
        json_object_foreach(map, k, v) {
            CHECK(strcmp(prev, k) < 0, "weight_map not sorted at %s", k);
            prev = k;
        }
        CHECK(json_object_size(map) == NT, "weight_map size");
        const char *f3 = json_string_value(json_object_get(map, "t06")); /* entry 3 */
        CHECK(f3 && strcmp(f3, "model-00003-of-00006.safetensors") == 0, "t06 in %s", f3 ? f3 : "?");
        json_decref(idx);
    }
    cllm_st_file *f = NULL;
    CHECK(cllm_st_open(&f, in_root(p, sizeof p, "sh/model-00003-of-00006.safetensors")) == CLLM_OK &&
              cllm_st_count(f) == 1,
          "oversized tensor alone in its shard");
    cllm_st_close(f);
    check_set(dir, es, NT);

    /* one file again: index and shards go */
    CHECK(cllm_st_save_dir(dir, es, NT, 0) == CLLM_OK, "single save: %s", cllm_last_error());
    CHECK(exists(in_root(p, sizeof p, "sh/model.safetensors")), "single file missing");
    CHECK(!exists(in_root(p, sizeof p, "sh/model.safetensors.index.json")), "stale index kept");
    CHECK(count_named(dir, "-of-") == 0, "stale shards kept");
    check_set(dir, es, NT);

    /* a limit above the total also gives one file */
    CHECK(cllm_st_save_dir(dir, es, NT, 1u << 20) == CLLM_OK, "big-limit save");
    CHECK(count_named(dir, "-of-") == 0 && exists(in_root(p, sizeof p, "sh/model.safetensors")),
          "big limit should not shard");

    /* 6 shards then 2 ([t0..t4] = 4000 bytes, [t5..t9]): old shards must go */
    CHECK(cllm_st_save_dir(dir, es, NT, 1000) == CLLM_OK, "re-shard");
    CHECK(cllm_st_save_dir(dir, es, NT, 4000) == CLLM_OK, "re-shard 2: %s", cllm_last_error());
    CHECK(count_named(dir, "-of-00006") == 0, "old shards kept");
    CHECK(count_named(dir, "-of-00002.safetensors") == 2, "expected 2 shards, got %d",
          count_named(dir, "-of-00002.safetensors"));
    CHECK(!exists(in_root(p, sizeof p, "sh/model.safetensors")), "stale single file kept");
    check_set(dir, es, NT);
    CHECK(count_named(dir, ".tmp.") == 0, "temp file left");
}

static void expect_set_fail(const char *dir, cllm_status want, const char *part, const char *label) {
    cllm_st_set *s = NULL;
    cllm_error_clear();
    cllm_status st = cllm_st_set_open(&s, dir);
    CHECK(st == want && s == NULL, "%s: status %d", label, (int)st);
    CHECK(strstr(cllm_last_error(), part) != NULL, "%s: message '%s' lacks '%s'", label, cllm_last_error(),
          part);
    cllm_st_set_close(s);
}

static void test_bad_index(void) {
    cllm_st_entry es[NT];
    int64_t shapes[NT][1];
    char names[NT][16];
    fill_entries(es, shapes, names);
    make_dir("bi");
    char dir[512], p[512];
    in_root(dir, sizeof dir, "bi");
    expect_set_fail(dir, CLLM_ERR_IO, "model.safetensors.index.json", "empty folder");
    CHECK(strstr(cllm_last_error(), "neither model.safetensors nor"), "msg: %s", cllm_last_error());

    CHECK(cllm_st_save_dir(dir, es, NT, 1000) == CLLM_OK, "save");
    in_root(p, sizeof p, "bi/model.safetensors.index.json");
    const char *missing_shard = "{\"weight_map\": {\"t09\": \"model-00007-of-00006.safetensors\"}}";
    write_bytes(p, missing_shard, strlen(missing_shard));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "does not exist", "missing shard");
    const char *missing_tensor = "{\"weight_map\": {\"zzz\": \"model-00001-of-00006.safetensors\"}}";
    write_bytes(p, missing_tensor, strlen(missing_tensor));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "does not hold", "missing tensor");
    const char *escape = "{\"weight_map\": {\"t09\": \"../bi/model-00001-of-00006.safetensors\"}}";
    write_bytes(p, escape, strlen(escape));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "plain file names", "path traversal");
    const char *dotdot = "{\"weight_map\": {\"t09\": \"..\"}}";
    write_bytes(p, dotdot, strlen(dotdot));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "plain file names", "'..'");
    const char *twice = "{\"weight_map\": {\"t09\": \"model-00001-of-00006.safetensors\", "
                        "\"t09\": \"model-00001-of-00006.safetensors\"}}";
    write_bytes(p, twice, strlen(twice));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "duplicate", "tensor listed twice");
    const char *nomap = "{\"metadata\": {}}";
    write_bytes(p, nomap, strlen(nomap));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "weight_map", "no weight_map");
    const char *notstr = "{\"weight_map\": {\"t09\": 3}}";
    write_bytes(p, notstr, strlen(notstr));
    expect_set_fail(dir, CLLM_ERR_FORMAT, "'t09'", "file name not a string");
    const char *syntax = "{\n  \"weight_map\": {\n    \"t09\" \"x\"\n  }\n}\n";
    write_bytes(p, syntax, strlen(syntax));
    char want[600];
    snprintf(want, sizeof want, "%s:3:", p);
    expect_set_fail(dir, CLLM_ERR_FORMAT, want, "index syntax error");
    /* an index naming a shard that is not a safetensors file */
    const char *junk = "{\"weight_map\": {\"t09\": \"junk.bin\"}}";
    write_bytes(p, junk, strlen(junk));
    write_bytes(in_root(want, sizeof want, "bi/junk.bin"), "abc", 3);
    expect_set_fail(dir, CLLM_ERR_FORMAT, "junk.bin", "shard not safetensors");
}

/* ---------------------------------------------------- hostile files */

static void expect_bad(const unsigned char *img, size_t len, const char *part, const char *label) {
    char p[512];
    in_root(p, sizeof p, "bad.safetensors");
    write_bytes(p, img, len);
    cllm_st_file *f = NULL;
    cllm_error_clear();
    cllm_status st = cllm_st_open(&f, p);
    CHECK(st == CLLM_ERR_FORMAT && f == NULL, "%s: status %d (%s)", label, (int)st, cllm_last_error());
    CHECK(strstr(cllm_last_error(), part) != NULL, "%s: message '%s' lacks '%s'", label, cllm_last_error(),
          part);
    CHECK(strstr(cllm_last_error(), p) != NULL, "%s: message '%s' does not name the file", label,
          cllm_last_error());
    cllm_st_close(f);
}

static void expect_bad_header(const char *hdr, size_t dlen, const char *part, const char *label) {
    static const unsigned char zeros[64];
    size_t len;
    unsigned char *img = build_st(hdr, 0, zeros, dlen, &len);
    expect_bad(img, len, part, label);
    free(img);
}

static void test_hostile(void) {
    expect_bad((const unsigned char *)"", 0, "too short", "zero-byte file");
    expect_bad((const unsigned char *)"\x10\0\0\0\0", 5, "too short", "5-byte file");
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
    expect_bad(huge, 10, "exceeds the limit", "header length 2^63");
    unsigned char big[16] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_bad(big, 10, "exceeds the file size", "header length beyond file");
    expect_bad_header("{\"a\":", 0, "not valid JSON", "truncated JSON");
    expect_bad_header("", 0, "not valid JSON", "empty header");
    expect_bad_header("[1,2]", 0, "not a JSON object", "array header");
    expect_bad_header("{\"a\":5}", 0, "'a': entry is not a JSON object", "entry not object");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, "overlap", "overlapping ranges");
    expect_bad_header("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
                      12, "overlap", "range inside another");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                      "tensor 'a': data_offsets [0, 8] exceed the file's data size 4", "out of range");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
                      "end before begin", "end < begin");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12,
                      "hold 8 bytes", "size mismatch");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "shape[0]",
                      "negative dim");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]",
                      "float dim");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
                      "\"data_offsets\":[0,0]}}",
                      0, "overflow", "shape overflow");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                      "overflow", "byte size overflow");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                      "9 dimensions", "too many dims");
    expect_bad_header("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                      "unknown dtype 'F64'", "unknown dtype");
    expect_bad_header("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype", "missing dtype");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "shape", "missing shape");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets",
                      "three offsets");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, "data_offsets",
                      "negative offset");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, "duplicate", "duplicate name");
    expect_bad_header("{\"__metadata__\":\"pt\"}", 0, "__metadata__", "metadata not an object");
    expect_bad_header("{\"__metadata__\":{\"format\":1}}", 0, "'format' is not a string",
                      "metadata value not a string");
    expect_bad_header("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name",
                      "empty name");

    /* accepted: padding, gaps, empty tensors sharing an offset, any order */
    static const unsigned char zeros[64];
    const char *ok = "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
                     "\"e1\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                     "\"e2\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[4,4]},"
                     "\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[4,12]}}";
    size_t len;
    unsigned char *img = build_st(ok, 5, zeros, 16, &len);
    char p[512];
    write_bytes(in_root(p, sizeof p, "ok.safetensors"), img, len);
    free(img);
    cllm_st_file *f = NULL;
    CHECK(cllm_st_open(&f, p) == CLLM_OK && cllm_st_count(f) == 4, "valid odd file: %s", cllm_last_error());
    cllm_st_close(f);

    /* a valid file cut at every length is refused, never crashes */
    float v[4] = {1, 2, 3, 4};
    int64_t s4[1] = {4};
    cllm_st_entry e[2] = {entry("x", CLLM_F32, 1, s4, v), entry("y", CLLM_F32, 1, s4, v)};
    CHECK(cllm_st_save(p, e, 2) == CLLM_OK, "save for truncation");
    size_t full;
    unsigned char *good = read_all(p, &full);
    if (!good) return;
    int wrong = 0;
    for (size_t cut = 0; cut < full; cut++) {
        write_bytes(p, good, cut);
        cllm_st_file *g = NULL;
        cllm_status st = cllm_st_open(&g, p);
        if (st != CLLM_ERR_FORMAT) wrong++;
        const char *want = cut < 8            ? "too short"
                           : cut < full - 32 ? "exceeds the file size"
                                             : "exceed the file's data size";
        if (!strstr(cllm_last_error(), want)) {
            wrong++;
            fprintf(stderr, "cut %zu: %s\n", cut, cllm_last_error());
        }
        cllm_st_close(g);
    }
    CHECK(wrong == 0, "%d truncations not refused as expected (of %zu)", wrong, full);
    free(good);
}

/* Independent oracle for an opened file: re-read its header with jansson
 * and check that every tensor's range lies inside the file's data buffer,
 * matches nbytes, and that the data pointers are placed at those offsets. */
static bool ranges_match(const cllm_st_file *f, const unsigned char *img, size_t n) {
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | img[k];
    if (n < 8 || hlen > n - 8) return false;
    json_t *h = json_loadb((const char *)img + 8, hlen, 0, NULL);
    bool ok = h != NULL;
    const unsigned char *base = NULL; /* start of the data buffer in the mapping */
    for (int i = 0; ok && i < cllm_st_count(f); i++) {
        const cllm_st_tensor *t = cllm_st_at(f, i);
        json_t *off = json_object_get(json_object_get(h, t->name), "data_offsets");
        json_int_t b0 = json_integer_value(json_array_get(off, 0));
        json_int_t b1 = json_integer_value(json_array_get(off, 1));
        if (!base) base = (const unsigned char *)t->data - b0;
        ok = b0 >= 0 && b1 >= b0 && (uint64_t)b1 <= n - 8 - hlen && (size_t)(b1 - b0) == t->nbytes &&
             (const unsigned char *)t->data == base + b0;
    }
    json_decref(h);
    return ok;
}

/* Random corruption of a valid file: open must either fail cleanly or give
 * tensors that lie inside the file and do not overlap. */
static void test_mutations(void) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    uint16_t hv[3] = {0x3c00, 0x4000, 0x4200};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s0[1] = {0};
    cllm_st_entry e[4] = {entry("w", CLLM_F32, 2, s23, v), entry("h", CLLM_F16, 1, s3, hv),
                          entry("bf", CLLM_BF16, 1, s3, hv), entry("z", CLLM_F32, 1, s0, NULL)};
    char p[512];
    in_root(p, sizeof p, "mut.safetensors");
    CHECK(cllm_st_save(p, e, 4) == CLLM_OK, "save for mutation");
    size_t len;
    unsigned char *good = read_all(p, &len);
    if (!good) return;
    unsigned char *img = malloc(len + 16);
    cllm_rng r;
    cllm_rng_seed(&r, 12345);
    int opened = 0, bad = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(img, good, len);
        size_t n = len;
        int kind = (int)cllm_rng_below(&r, 4);
        if (kind == 0) { /* random bytes anywhere */
            for (int k = 0, m = 1 + (int)cllm_rng_below(&r, 4); k < m; k++)
                img[cllm_rng_below(&r, len)] = (unsigned char)cllm_rng_u64(&r);
        } else if (kind == 1) { /* digits in the header stay digits: JSON stays valid */
            for (int k = 0, m = 1 + (int)cllm_rng_below(&r, 3); k < m; k++) {
                size_t pos = 8 + cllm_rng_below(&r, len - 8);
                for (size_t tries = 0; tries < len && !(img[pos] >= '0' && img[pos] <= '9'); tries++)
                    pos = 8 + (pos + 1 - 8) % (len - 8);
                if (img[pos] >= '0' && img[pos] <= '9')
                    img[pos] = (unsigned char)('0' + cllm_rng_below(&r, 10));
            }
        } else if (kind == 2) { /* truncate */
            n = cllm_rng_below(&r, len);
        } else { /* nudge the header length */
            img[0] = (unsigned char)(img[0] + (int)cllm_rng_below(&r, 17) - 8);
        }
        write_bytes(p, img, n);
        cllm_st_file *f = NULL;
        cllm_status st = cllm_st_open(&f, p);
        if (st != CLLM_OK) {
            if (st != CLLM_ERR_FORMAT) bad++;
            continue;
        }
        opened++;
        const unsigned char *lo = NULL, *hi = NULL;
        for (int i = 0; i < cllm_st_count(f); i++) {
            const cllm_st_tensor *t = cllm_st_at(f, i);
            if (t->nbytes != (size_t)t->numel * cllm_dtype_size(t->dtype)) bad++;
            const unsigned char *b = t->data, *end = b + t->nbytes;
            if (!lo || b < lo) lo = b;
            if (!hi || end > hi) hi = end;
            unsigned sum = 0;
            for (size_t k = 0; k < t->nbytes; k++) sum += b[k];
            (void)sum;
            if (t->numel <= 64 && (t->dtype == CLLM_F32 || t->dtype == CLLM_F16 || t->dtype == CLLM_BF16)) {
                float out[64];
                if (cllm_st_read_f32(t, out, t->numel) != CLLM_OK) bad++;
            }
        }
        if (lo && (size_t)(hi - lo) > n) bad++;
        bad += !ranges_match(f, img, n);
        cllm_st_close(f);
    }
    CHECK(bad == 0, "%d mutated files misbehaved", bad);
    CHECK(opened > 0, "no mutation produced a valid file (the loop tests nothing)");
    printf("mutations: %d of 4000 still valid\n", opened);
    free(img);
    free(good);
}

/* --------------------------------------------------------------- json */

static void test_json(void) {
    char p[512];
    in_root(p, sizeof p, "cfg.json");
    const char *bad = "{\n  \"a\": 1,\n  \"b\": }\n";
    write_bytes(p, bad, strlen(bad));
    json_t *j = NULL;
    CHECK(cllm_json_load_file(&j, p) == CLLM_ERR_FORMAT && j == NULL, "syntax error accepted");
    char want[600];
    snprintf(want, sizeof want, "%s:3:8:", p);
    CHECK(strstr(cllm_last_error(), want) != NULL, "message '%s' lacks '%s'", cllm_last_error(), want);
    CHECK(cllm_json_load_file(&j, in_root(want, sizeof want, "no-such.json")) == CLLM_ERR_IO &&
              strstr(cllm_last_error(), "No such file"),
          "missing file: %s", cllm_last_error());

    const char *good = "{\"n\": 12, \"big\": 1e5, \"half\": 0.5, \"s\": \"txt\", \"t\": true, \"neg\": -3,"
                       " \"arr\": [1], \"nul\": null}";
    CHECK(cllm_json_parse(&j, good, strlen(good), "mem.json") == CLLM_OK, "parse: %s", cllm_last_error());
    if (!j) return;
    int64_t i = 0;
    double d = 0;
    bool b = false;
    const char *s = NULL;
    CHECK(cllm_json_get_int(j, "n", &i, "c.json") == CLLM_OK && i == 12, "int");
    CHECK(cllm_json_get_int(j, "big", &i, "c.json") == CLLM_OK && i == 100000, "1e5 as int");
    CHECK(cllm_json_get_int(j, "half", &i, "c.json") == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "'half'"),
          "0.5 as int: %s", cllm_last_error());
    CHECK(cllm_json_get_int(j, "s", &i, "c.json") == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "'s'") &&
              strstr(cllm_last_error(), "c.json") && strstr(cllm_last_error(), "a string"),
          "string as int: %s", cllm_last_error());
    CHECK(cllm_json_get_int(j, "t", &i, "c.json") == CLLM_ERR_FORMAT, "bool as int");
    CHECK(cllm_json_get_int(j, "absent", &i, "c.json") == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "missing key 'absent'"),
          "missing: %s", cllm_last_error());
    i = 77;
    CHECK(cllm_json_get_int_opt(j, "absent", &i, "c.json") == CLLM_OK && i == 77, "opt leaves value");
    CHECK(cllm_json_get_int_opt(j, "neg", &i, "c.json") == CLLM_OK && i == -3, "opt present");
    CHECK(cllm_json_get_num(j, "n", &d, "c.json") == CLLM_OK && d == 12.0, "int as num");
    CHECK(cllm_json_get_num(j, "half", &d, "c.json") == CLLM_OK && d == 0.5, "num");
    CHECK(cllm_json_get_num(j, "t", &d, "c.json") == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "'t'"),
          "bool as num");
    d = 9;
    CHECK(cllm_json_get_num_opt(j, "absent", &d, "c.json") == CLLM_OK && d == 9, "num opt");
    CHECK(cllm_json_get_num(j, "absent", &d, "c.json") == CLLM_ERR_FORMAT, "num missing");
    CHECK(cllm_json_get_bool_opt(j, "t", &b, "c.json") == CLLM_OK && b, "bool");
    CHECK(cllm_json_get_bool_opt(j, "n", &b, "c.json") == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "'n'"),
          "int as bool");
    CHECK(cllm_json_get_str(j, "s", &s, "c.json") == CLLM_OK && strcmp(s, "txt") == 0, "str");
    CHECK(cllm_json_get_str(j, "arr", &s, "c.json") == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "an array"),
          "array as str: %s", cllm_last_error());
    CHECK(cllm_json_get_str(j, "nul", &s, "c.json") == CLLM_ERR_FORMAT, "null as str");
    s = "keep";
    CHECK(cllm_json_get_str_opt(j, "absent", &s, "c.json") == CLLM_OK && strcmp(s, "keep") == 0, "str opt");
    CHECK(cllm_json_get_int(json_object_get(j, "arr"), "x", &i, "c.json") == CLLM_ERR_FORMAT,
          "getter on non-object");
    json_decref(j);

    const char *dup = "{\"a\":1,\"a\":2}";
    CHECK(cllm_json_parse(&j, dup, strlen(dup), "dup.json") == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "dup.json:1:"),
          "duplicate key accepted: %s", cllm_last_error());

    /* save: insertion order, 2-space indent, trailing newline, atomic */
    j = json_object();
    json_object_set_new(j, "zeta", json_integer(1));
    json_object_set_new(j, "alpha", json_string("x"));
    CHECK(cllm_json_save_file(j, p) == CLLM_OK, "save json: %s", cllm_last_error());
    json_decref(j);
    size_t len;
    char *text = (char *)read_all(p, &len);
    CHECK(text && strcmp(text, "{\n  \"zeta\": 1,\n  \"alpha\": \"x\"\n}\n") == 0, "saved text '%s'",
          text ? text : "(null)");
    free(text);
    CHECK(count_named(g_root, ".tmp.") == 0, "temp file left");
}

/* -------------------------------------------------- sizes and files */

static void test_sizes(void) {
    static const struct {
        const char *s;
        size_t v;
    } ok[] = {
        {"1000", 1000},          {"0", 0},
        {"5GB", 5000000000u},    {"500MB", 500000000},
        {"2GiB", (size_t)2 << 30}, {"100KB", 100000},
        {"10kB", 10000},         {"10kib", 10240},
        {"1.5GB", 1500000000},   {"12B", 12},
        {"3TiB", (size_t)3 << 40},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t v = 1;
        CHECK(cllm_parse_size(ok[i].s, &v) == CLLM_OK && v == ok[i].v, "'%s' -> %zu", ok[i].s, v);
    }
    static const char *bad[] = {"", "GB", "-5GB", "+5", "5 GB", "5GBx", "5XB", "1.5", "1.GB",
                                "99999999999999999999", "20000000000TB", " 5", "0x10", "5e3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 42;
        CHECK(cllm_parse_size(bad[i], &v) == CLLM_ERR_ARG && v == 42, "'%s' accepted", bad[i]);
    }
    CHECK(cllm_parse_size("5XB", &(size_t){0}) == CLLM_ERR_ARG && strstr(cllm_last_error(), "'5XB'"),
          "message names input: %s", cllm_last_error());
}

static void test_files(void) {
    char p[512];
    in_root(p, sizeof p, "blob.bin");
    unsigned char data[3000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7);
    CHECK(cllm_write_file_atomic(p, data, sizeof data) == CLLM_OK, "write: %s", cllm_last_error());
    CHECK(cllm_write_file_atomic(p, data, sizeof data) == CLLM_OK, "overwrite: %s", cllm_last_error());
    size_t len;
    unsigned char *back = read_all(p, &len);
    CHECK(back && len == sizeof data && memcmp(back, data, len) == 0 && back[len] == '\0', "read back");
    free(back);
    CHECK(cllm_write_file_atomic(p, NULL, 0) == CLLM_OK, "empty write");
    back = read_all(p, &len);
    CHECK(back && len == 0 && back[0] == '\0', "empty read");
    free(back);
    CHECK(count_named(g_root, ".tmp.") == 0, "temp file left");
    char *d = NULL;
    CHECK(cllm_read_file(in_root(p, sizeof p, "nope/x"), &d, &len) == CLLM_ERR_IO && d == NULL &&
              strstr(cllm_last_error(), "nope/x") && strstr(cllm_last_error(), "No such file"),
          "missing: %s", cllm_last_error());
    CHECK(cllm_write_file_atomic(p, data, 4) == CLLM_ERR_IO && strstr(cllm_last_error(), "No such file"),
          "write into missing folder: %s", cllm_last_error());
    CHECK(cllm_read_file(g_root, &d, &len) == CLLM_ERR_IO, "reading a folder");
    cllm_st_file *f = NULL;
    CHECK(cllm_st_open(&f, g_root) == CLLM_ERR_IO && f == NULL, "open a folder as safetensors");
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/cllm_test_io_XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_half_types();
    test_large();
    test_sharded();
    test_bad_index();
    test_hostile();
    test_mutations();
    test_json();
    test_sizes();
    test_files();
    rm_tree(g_root);
    return check_summary();
}
