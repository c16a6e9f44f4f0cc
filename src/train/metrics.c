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

#include "cllm/cpu.h"
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

void rec_ints(train_record *r, const char *key, const long long *v, int n) {
    rec_add(r, "%s\"%s\": [", sep(r), key);
    for (int i = 0; i < n; i++) rec_add(r, "%s%lld", i ? ", " : "", v[i]);
    rec_add(r, "]");
}

const char *rec_end(train_record *r) {
    rec_add(r, "}");
    return r->buf;
}

/* --------------------------------------------------------------- peak */

/* One N x N x N GEMM of either precision on fixed operands. */
typedef struct {
    int n;
    bool bf16;
    void *a, *b;
    float *c;
} peak_gemm;

static cllm_status peak_run(const peak_gemm *g) {
    return g->bf16 ? cllm_matmul_bf16(g->c, g->a, g->b, g->n, g->n, g->n, false, false, 1.0f, 0.0f)
                   : cllm_matmul(g->c, g->a, g->b, g->n, g->n, g->n, false, false, 1.0f, 0.0f);
}

/* The best GFLOP/s of repeated GEMMs over `seconds` (the first call, which
 * creates the oneDNN primitive, is not timed); 0 when out of memory. */
static double peak_gflops(int n, bool bf16, double seconds) {
    size_t nn = (size_t)n * (size_t)n, esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    peak_gemm g = {n, bf16, cllm_alloc(nn * esize, "peak A"), cllm_alloc(nn * esize, "peak B"),
                   cllm_alloc(nn * sizeof(float), "peak C")};
    double best = 0;
    if (g.a && g.b && g.c) {
        for (size_t i = 0; i < nn; i++) {
            float x = (float)(i % 7) * 0.1f, y = (float)(i % 5) * 0.1f;
            if (bf16) {
                ((uint16_t *)g.a)[i] = cllm_f32_to_bf16(x);
                ((uint16_t *)g.b)[i] = cllm_f32_to_bf16(y);
            } else {
                ((float *)g.a)[i] = x;
                ((float *)g.b)[i] = y;
            }
        }
        if (peak_run(&g) == CLLM_OK) {
            double start = cllm_time_sec();
            while (cllm_time_sec() - start < seconds) {
                double t0 = cllm_time_sec();
                peak_run(&g);
                double dt = cllm_time_sec() - t0;
                double r = 2.0 * n * n * (double)n / dt * 1e-9;
                if (dt > 0 && r > best) best = r;
            }
        }
    }
    cllm_free(g.a);
    cllm_free(g.b);
    cllm_free(g.c);
    return best;
}

double cllm_train_measure_peak_gflops(double seconds) { return peak_gflops(512, false, seconds); }

double cllm_train_measure_peak_gflops_bf16(double seconds) { return peak_gflops(1024, true, seconds); }

const char *cllm_train_gemm_summary(bool bf16) {
    static _Thread_local char buf[160];
    const cllm_cpu_info *c = cllm_cpu();
    snprintf(buf, sizeof buf, "%s gemm %s on %s, %s", bf16 ? "bf16" : "fp32", bf16 ? cllm_matmul_bf16_backend() : "onednn",
             cllm_isa_name(c->isa), c->model[0] ? c->model : "unknown CPU");
    return buf;
}
