/*
 * metrics.jsonl (one JSON object per line, appended and flushed record by
 * record so a crash keeps every line written so far) and the matmul peak
 * used for MFU. Not here: what goes into a record (engine.c).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cllm/io.h"
#include "cllm/kernels.h"
#include "train_impl.h"

/* Keeps the records of steps <= keep (a resumed run rewrites what a killed
 * run logged after its last checkpoint). */
static cllm_status trim_metrics(const char *path, long keep) {
    char *text = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return CLLM_OK;
    cllm_status st = cllm_read_file(path, &text, &len);
    if (st) return st;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    size_t olen = 0;
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        json_t *j = json_loadb(line, n, 0, NULL);
        json_t *s = j ? json_object_get(j, "step") : NULL;
        /* a torn last line (no newline) is dropped as well */
        if (nl && s && json_is_integer(s) && json_integer_value(s) <= keep) {
            memcpy(out + olen, line, n + 1);
            olen += n + 1;
        }
        json_decref(j);
        line += n + 1;
    }
    st = cllm_write_file_atomic(path, out, olen);
    free(out);
    free(text);
    return st;
}

cllm_status train_metrics_open(train_metrics *mt, const char *dir, long keep_until_step) {
    memset(mt, 0, sizeof *mt);
    size_t n = strlen(dir) + sizeof "/metrics.jsonl";
    if (!(mt->path = malloc(n))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    snprintf(mt->path, n, "%s/metrics.jsonl", dir);
    cllm_status st = keep_until_step >= 0 ? trim_metrics(mt->path, keep_until_step) : CLLM_OK;
    if (st) return st;
    if (keep_until_step < 0) {
        /* a fresh run starts a fresh file */
        if (unlink(mt->path) != 0 && errno != ENOENT)
            return CLLM_FAIL(CLLM_ERR_IO, "cannot remove old '%s': %s", mt->path, strerror(errno));
    }
    if (!(mt->f = fopen(mt->path, "a")))
        return CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s' for appending: %s", mt->path, strerror(errno));
    return CLLM_OK;
}

cllm_status train_metrics_write(train_metrics *mt, const char *record) {
    if (!mt->f) return CLLM_OK;
    if (fputs(record, mt->f) < 0 || fputc('\n', mt->f) == EOF || fflush(mt->f) != 0)
        return CLLM_FAIL(CLLM_ERR_IO, "cannot write '%s': %s", mt->path, strerror(errno));
    return CLLM_OK;
}

void train_metrics_close(train_metrics *mt) {
    if (mt->f) fclose(mt->f);
    free(mt->path);
    memset(mt, 0, sizeof *mt);
}

/* ------------------------------------------------------------ records */

static void rec_add(train_record *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rec_add(train_record *r, const char *fmt, ...) {
    if (r->len >= sizeof r->buf) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->buf + r->len, sizeof r->buf - r->len, fmt, ap);
    va_end(ap);
    if (n > 0) r->len += (size_t)n;
    if (r->len >= sizeof r->buf) r->len = sizeof r->buf - 1;
}

void rec_begin(train_record *r) {
    r->len = 0;
    r->buf[0] = '\0';
    rec_add(r, "{");
}

static const char *sep(const train_record *r) { return r->len > 1 ? ", " : ""; }

void rec_num(train_record *r, const char *key, double v) {
    if (isfinite(v))
        rec_add(r, "%s\"%s\": %.9g", sep(r), key, v);
    else
        rec_add(r, "%s\"%s\": null", sep(r), key);
}

void rec_int(train_record *r, const char *key, long long v) { rec_add(r, "%s\"%s\": %lld", sep(r), key, v); }

void rec_bool(train_record *r, const char *key, bool v) {
    rec_add(r, "%s\"%s\": %s", sep(r), key, v ? "true" : "false");
}

const char *rec_end(train_record *r) {
    rec_add(r, "}");
    return r->buf;
}

/* --------------------------------------------------------------- peak */

double cllm_train_measure_peak_gflops(double seconds) {
    enum { N = 512 };
    float *a = cllm_alloc((size_t)N * N * sizeof(float), "peak A");
    float *b = cllm_alloc((size_t)N * N * sizeof(float), "peak B");
    float *c = cllm_alloc((size_t)N * N * sizeof(float), "peak C");
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)N * N; i++) {
            a[i] = (float)(i % 7) * 0.1f;
            b[i] = (float)(i % 5) * 0.1f;
        }
        /* first call creates the oneDNN primitive: not timed */
        if (cllm_matmul(c, a, b, N, N, N, false, false, 1.0f, 0.0f) == CLLM_OK) {
            double start = cllm_time_sec();
            while (cllm_time_sec() - start < seconds) {
                double t0 = cllm_time_sec();
                cllm_matmul(c, a, b, N, N, N, false, false, 1.0f, 0.0f);
                double dt = cllm_time_sec() - t0;
                double g = 2.0 * N * N * N / dt * 1e-9;
                if (dt > 0 && g > best) best = g;
            }
        }
    }
    cllm_free(a);
    cllm_free(b);
    cllm_free(c);
    return best;
}

double cllm_train_measure_peak_gflops_bf16(double seconds) {
    enum { N = 1024 };
    uint16_t *a = cllm_alloc((size_t)N * N * sizeof(uint16_t), "peak A");
    uint16_t *b = cllm_alloc((size_t)N * N * sizeof(uint16_t), "peak B");
    float *c = cllm_alloc((size_t)N * N * sizeof(float), "peak C");
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)N * N; i++) {
            a[i] = cllm_f32_to_bf16((float)(i % 7) * 0.1f);
            b[i] = cllm_f32_to_bf16((float)(i % 5) * 0.1f);
        }
        if (cllm_matmul_bf16(c, a, b, N, N, N, false, false, 1.0f, 0.0f) == CLLM_OK) {
            double start = cllm_time_sec();
            while (cllm_time_sec() - start < seconds) {
                double t0 = cllm_time_sec();
                cllm_matmul_bf16(c, a, b, N, N, N, false, false, 1.0f, 0.0f);
                double dt = cllm_time_sec() - t0;
                double g = 2.0 * N * N * N / dt * 1e-9;
                if (dt > 0 && g > best) best = g;
            }
        }
    }
    cllm_free(a);
    cllm_free(b);
    cllm_free(c);
    return best;
}
