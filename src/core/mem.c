/*
 * Aligned allocation, overflow-checked size arithmetic, strict number
 * parsing and a monotonic clock.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#include "cllm/core.h"

#include <errno.h>
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

void *cllm_alloc(size_t bytes, const char *what) {
    /* aligned_alloc needs a multiple of the alignment; round up */
    size_t rounded;
    if (!cllm_size_add(bytes ? bytes : 1, 63, &rounded)) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "size overflow allocating %s", what ? what : "buffer");
        return NULL;
    }
    rounded &= ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes, what ? what : "buffer");
    return p;
}

void *cllm_alloc_huge(size_t bytes, const char *what) {
    if (bytes < CLLM_HUGE_MIN) return cllm_alloc(bytes, what);
    const size_t huge = (size_t)2 << 20;
    size_t rounded;
    if (!cllm_size_add(bytes, huge - 1, &rounded)) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "size overflow allocating %s", what ? what : "buffer");
        return NULL;
    }
    rounded &= ~(huge - 1);
    void *p = aligned_alloc(huge, rounded);
    if (!p) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes, what ? what : "buffer");
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE); /* an advice: a kernel without THP keeps 4 KiB pages */
#endif
    return p;
}

void cllm_mem_release(void *p, size_t bytes) {
    if (!p || !bytes) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + bytes) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

size_t cllm_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                fclose(f);
                return kib > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kib * 1024;
            }
        fclose(f);
    }
#ifdef _SC_AVPHYS_PAGES
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return (size_t)pages > SIZE_MAX / (size_t)page ? SIZE_MAX : (size_t)pages * (size_t)page;
#endif
    return 0;
}

static void *zeroed(size_t n, size_t size, const char *what, bool huge) {
    size_t bytes;
    if (!cllm_size_mul(n, size, &bytes)) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "size overflow allocating %zu x %zu bytes for %s", n, size,
                  what ? what : "buffer");
        return NULL;
    }
    void *p = huge ? cllm_alloc_huge(bytes, what) : cllm_alloc(bytes, what);
    if (p) memset(p, 0, bytes);
    return p;
}

void *cllm_calloc(size_t n, size_t size, const char *what) { return zeroed(n, size, what, false); }

void *cllm_calloc_huge(size_t n, size_t size, const char *what) { return zeroed(n, size, what, true); }

void cllm_free(void *p) { free(p); }

bool cllm_size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

bool cllm_size_add(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}

bool cllm_parse_i64(const char *s, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0' || end == s) return false;
    *out = (int64_t)v;
    return true;
}

bool cllm_parse_int(const char *s, int *out) {
    int64_t v;
    if (!cllm_parse_i64(s, &v) || v < INT_MIN || v > INT_MAX) return false;
    *out = (int)v;
    return true;
}

bool cllm_parse_f64(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || end == s || !isfinite(v)) return false;
    *out = v;
    return true;
}

double cllm_time_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
