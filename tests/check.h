/*
 * Minimal test support shared by the C tests: CHECK records a failure and
 * keeps going, check_close compares floats with a relative tolerance, and
 * check_summary prints the closing "N passed, N failed" line and returns the
 * process exit code (non-zero on any failure).
 */
#ifndef CLLM_TEST_CHECK_H
#define CLLM_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_passed_, check_failed_;

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (cond) {                                                                     \
            check_passed_++;                                                            \
        } else {                                                                        \
            check_failed_++;                                                            \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
        }                                                                               \
    } while (0)

/* |a-b| <= rtol * max(|a|,|b|) + atol */
static inline int check_close_f(double a, double b, double rtol, double atol) {
    double d = fabs(a - b), m = fmax(fabs(a), fabs(b));
    return d <= rtol * m + atol;
}

/* Relative L2 error ||a-b|| / max(||b||, tiny). */
static inline double check_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
