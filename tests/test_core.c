/* Core: status messages, size checks, allocation, strict parsing, dtype rounding, rng. */
#include "check.h"
#include "cllm/core.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static void test_errors(void) {
    cllm_error_clear();
    CHECK(strcmp(cllm_last_error(), "") == 0, "cleared error not empty");
    cllm_status st = CLLM_FAIL(CLLM_ERR_ARG, "bad value %d", 7);
    CHECK(st == CLLM_ERR_ARG, "status not returned");
    CHECK(strcmp(cllm_last_error(), "test_errors: bad value 7") == 0, "got '%s'", cllm_last_error());
    cllm_fail_context(st, "file %s", "x.json");
    CHECK(strcmp(cllm_last_error(), "file x.json: test_errors: bad value 7") == 0, "got '%s'",
          cllm_last_error());
}

static void test_sizes(void) {
    size_t out;
    CHECK(cllm_size_mul(1u << 20, 1u << 10, &out) && out == (size_t)1 << 30, "mul");
    CHECK(!cllm_size_mul(SIZE_MAX / 2 + 1, 2, &out), "mul overflow not caught");
    CHECK(!cllm_size_add(SIZE_MAX, 1, &out), "add overflow not caught");
    void *p = cllm_calloc(SIZE_MAX / 4, 8, "huge");
    CHECK(p == NULL && strstr(cllm_last_error(), "huge") != NULL, "huge calloc: %s", cllm_last_error());
    cllm_free(NULL);
}

/* cllm_alloc_huge: 64-byte aligned below CLLM_HUGE_MIN, 2 MiB aligned from
 * it (what THP needs), the whole size writable, freed by cllm_free, and a
 * size that overflows the rounding refused naming the buffer. */
static void test_alloc_huge(void) {
    unsigned char *s = cllm_alloc_huge(1000, "small");
    CHECK(s && (uintptr_t)s % 64 == 0, "small: %p", (void *)s);
    if (s) memset(s, 1, 1000);
    cllm_free(s);
    const size_t n = (size_t)CLLM_HUGE_MIN + 12345;
    unsigned char *p = cllm_alloc_huge(n, "big");
    CHECK(p && (uintptr_t)p % ((size_t)2 << 20) == 0, "big: %p not 2 MiB aligned", (void *)p);
    if (p) {
        p[0] = 7;
        p[n - 1] = 9;
        CHECK(p[0] == 7 && p[n - 1] == 9, "big: first and last byte");
    }
    cllm_free(p);
    cllm_error_clear();
    void *q = cllm_alloc_huge(SIZE_MAX - 10, "the weights");
    CHECK(q == NULL && strstr(cllm_last_error(), "the weights") != NULL, "overflow: %s", cllm_last_error());
    /* the zeroing variant: every byte zero on the huge path (memory the
     * allocator hands out again need not be; under ASan, whose allocator
     * fills fresh blocks, a missing memset fails here), n x size overflow
     * refused */
    const size_t nf = (size_t)CLLM_HUGE_MIN / sizeof(float) + 999;
    for (int k = 0; k < 2; k++) { /* dirty memory the allocator may hand out again */
        float *d = cllm_alloc_huge(nf * sizeof(float), "dirty");
        if (d) memset(d, 0x5a, nf * sizeof(float));
        cllm_free(d);
    }
    float *z = cllm_calloc_huge(nf, sizeof(float), "zeros");
    CHECK(z && (uintptr_t)z % ((size_t)2 << 20) == 0, "calloc_huge: %p not 2 MiB aligned", (void *)z);
    size_t nonzero = 0;
    for (size_t i = 0; z && i < nf; i++) nonzero += z[i] != 0.0f;
    CHECK(nonzero == 0, "calloc_huge: %zu values not zero", nonzero);
    cllm_free(z);
    cllm_error_clear();
    void *o = cllm_calloc_huge(SIZE_MAX / 2, 4, "the parts");
    CHECK(o == NULL && strstr(cllm_last_error(), "the parts") != NULL, "calloc_huge overflow: %s", cllm_last_error());
}

/* the system's free memory: a reading between nothing and all of it */
static void test_mem_available(void) {
    const size_t a = cllm_mem_available();
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    CHECK(a > 0, "mem_available: 0 on a system with /proc/meminfo");
    CHECK(pages <= 0 || a <= (size_t)pages * (size_t)page, "mem_available %zu above the %ld x %ld bytes of RAM", a,
          pages, page);
}

static void test_parse(void) {
    int v;
    double d;
    CHECK(cllm_parse_int("42", &v) && v == 42, "42");
    CHECK(!cllm_parse_int("42x", &v), "trailing junk accepted");
    CHECK(!cllm_parse_int("", &v), "empty accepted");
    CHECK(!cllm_parse_int("99999999999", &v), "overflow accepted");
    CHECK(cllm_parse_f64("1e-3", &d) && d == 1e-3, "1e-3");
    CHECK(!cllm_parse_f64("nan", &d), "nan accepted");
    CHECK(!cllm_parse_f64("1.0.0", &d), "1.0.0 accepted");
}

static void test_dtype(void) {
    /* Values and their expected bit patterns (IEEE round-to-nearest-even). */
    CHECK(cllm_f32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    CHECK(cllm_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie rounds to even (down)");
    CHECK(cllm_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie rounds to even (up)");
    CHECK(cllm_bf16_to_f32(0xc000) == -2.0f, "bf16 -2");
    CHECK(cllm_f32_to_f16(1.0f) == 0x3c00, "f16 1.0");
    CHECK(cllm_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
    CHECK(cllm_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow to inf");
    CHECK(cllm_f32_to_f16(5.9604644775390625e-8f) == 0x0001, "f16 smallest subnormal");
    CHECK(cllm_f32_to_f16(2.9802322387695312e-8f) == 0x0000, "f16 half of smallest ties to 0");
    CHECK(cllm_f16_to_f32(0x0001) == 5.9604644775390625e-8f, "f16 subnormal decode");
    CHECK(cllm_f16_to_f32(0xbc00) == -1.0f, "f16 -1");
    /* every f16 value round-trips through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        if (cllm_f32_to_f16(cllm_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);
}

static void test_rng(void) {
    cllm_rng a, b;
    cllm_rng_seed(&a, 1234);
    cllm_rng_seed(&b, 1234);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= cllm_rng_u64(&a) == cllm_rng_u64(&b);
    CHECK(same, "same seed, different streams");
    double mean = 0, var = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = cllm_rng_normal(&a);
        mean += x;
        var += x * x;
    }
    mean /= n;
    var = var / n - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.02, "normal mean %f var %f", mean, var);
    int hits[7] = {0};
    for (int i = 0; i < 70000; i++) hits[cllm_rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++) CHECK(hits[i] > 9500 && hits[i] < 10500, "below(7) bucket %d: %d", i, hits[i]);
}

int main(void) {
    test_errors();
    test_sizes();
    test_alloc_huge();
    test_mem_available();
    test_parse();
    test_dtype();
    test_rng();
    return check_summary();
}
