/*
 * Causal attention kernels and ALiBi slopes.
 *
 * Without arguments: checks forward and backward against a naive float64
 * implementation written out below (explicit score rows, no tiling), on
 * padded strided views whose gaps hold NaN (inputs: reading a gap poisons
 * the result) or a sentinel (outputs: writing a gap is caught), with
 * gradients pre-filled so accumulation is checked; then that results do not
 * depend on the thread count.
 *
 * With --ref DIR: reads the cases and ALiBi slopes that tests/ref/
 * attention_ref.py wrote from PyTorch (manifest.txt, raw little-endian
 * float32 files) and compares out, lse and the gradients of every input
 * buffer, for GPT-2, BLOOM and LLaMA layouts.
 */
#include "check.h"
#include "cllm/core.h"
#include "cllm/kernels.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances against a float64 reference: relative L2 over the tensor and
 * max abs error relative to the largest reference magnitude (at least 1). */
#define TOL_REL_L2 1e-5
#define TOL_MAX_ABS 1e-5

static float grad_fill(size_t i) { return 0.25f * (float)((int)(i % 5) - 2); }

/* Compares got (minus base, if given) with ref over n elements. */
static void expect_close(const char *what, const char *name, const float *got, const float *base,
                         const float *ref, size_t n) {
    double num = 0, den = 0, maxerr = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double d = g - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
        if (!(fabs(d) <= maxerr)) maxerr = fabs(d); /* NaN sticks */
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    /* An all-zero reference (dq, dk at T=1) has no relative error to speak
     * of: only the absolute bound applies. */
    double rel = den > 0 ? sqrt(num) / sqrt(den) : 0.0;
    CHECK(rel <= TOL_REL_L2 && maxerr <= TOL_MAX_ABS * fmax(1.0, maxref),
          "%s %s: rel-L2 %.3g, max abs %.3g (max |ref| %.3g)", name, what, rel, maxerr, maxref);
    if (getenv("CLLM_TEST_VERBOSE"))
        printf("  %-48s %-5s rel-L2 %.2e max abs %.2e\n", name, what, rel, maxerr);
}

/* ---------------------------------------------------------- naive float64
 * q [B,T,NH,HS], k and v [B,T,NKV,HS], out and dout [B,T,NH,HS] (compact),
 * lse [B,NH,T]. Gradients are overwritten. One score row at a time. */
enum { NAIVE_TMAX = 256 };

static void naive_attention(double *out, double *lse, double *dq, double *dk, double *dv,
                            const double *q, const double *k, const double *v, const double *dout,
                            const float *alibi, int B, int T, int NH, int NKV, int HS,
                            double scale, int window) {
    const int group = NH / NKV;
    size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
    memset(dq, 0, nq * sizeof(double));
    memset(dk, 0, nkv * sizeof(double));
    memset(dv, 0, nkv * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const int g = h / group;
                const double slope = alibi ? alibi[h] : 0.0;
                const double *qt = q + (((size_t)b * T + t) * NH + h) * HS;
                const double *dot = dout + (((size_t)b * T + t) * NH + h) * HS;
                double *ot = out + (((size_t)b * T + t) * NH + h) * HS;
                double p[NAIVE_TMAX], mx = -INFINITY, sum = 0;
                const int s_lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; /* first visible key */
                for (int s = s_lo; s <= t; s++) {
                    const double *ks = k + (((size_t)b * T + s) * NKV + g) * HS;
                    double x = 0;
                    for (int i = 0; i < HS; i++) x += qt[i] * ks[i];
                    p[s] = scale * x + slope * (s - t);
                    if (p[s] > mx) mx = p[s];
                }
                for (int s = s_lo; s <= t; s++) sum += exp(p[s] - mx);
                const double l = mx + log(sum);
                lse[((size_t)b * NH + h) * T + t] = l;
                for (int i = 0; i < HS; i++) ot[i] = 0;
                for (int s = s_lo; s <= t; s++) {
                    const double *vs = v + (((size_t)b * T + s) * NKV + g) * HS;
                    p[s] = exp(p[s] - l);
                    for (int i = 0; i < HS; i++) ot[i] += p[s] * vs[i];
                }
                double D = 0;
                for (int i = 0; i < HS; i++) D += dot[i] * ot[i];
                for (int s = s_lo; s <= t; s++) {
                    const size_t ko = (((size_t)b * T + s) * NKV + g) * HS;
                    double dp = 0;
                    for (int i = 0; i < HS; i++) dp += dot[i] * v[ko + i];
                    const double ds = p[s] * (dp - D);
                    double *dqt = dq + (((size_t)b * T + t) * NH + h) * HS;
                    for (int i = 0; i < HS; i++) {
                        dqt[i] += scale * ds * k[ko + i];
                        dk[ko + i] += scale * ds * qt[i];
                        dv[ko + i] += p[s] * dot[i];
                    }
                }
            }
}

/* A padded strided view of a [B,T,nh,HS] tensor: heads HS+hgap apart, rows
 * nh*(HS+hgap)+rgap apart, starting `lead` floats into the buffer. */
typedef struct {
    float *buf;
    size_t len;
    int lead, rs, hs;
} padded;

static padded padded_make(int B, int T, int nh, int HS, int hgap, int rgap, int lead, float gap) {
    padded p;
    p.hs = HS + hgap;
    p.rs = nh * p.hs + rgap;
    p.lead = lead;
    p.len = (size_t)lead + (size_t)B * T * p.rs;
    p.buf = malloc(p.len * sizeof(float));
    for (size_t i = 0; i < p.len; i++) p.buf[i] = gap;
    return p;
}

static size_t padded_at(const padded *p, size_t row, int h, int i) {
    return (size_t)p->lead + row * p->rs + (size_t)h * p->hs + i;
}

/* Copies compact [N,nh,HS] doubles into the view (and back out). */
static void padded_put(padded *p, const double *x, size_t N, int nh, int HS) {
    for (size_t r = 0; r < N; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < HS; i++) p->buf[padded_at(p, r, h, i)] = (float)x[(r * nh + h) * HS + i];
}
static void padded_get(float *x, const padded *p, size_t N, int nh, int HS) {
    for (size_t r = 0; r < N; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < HS; i++) x[(r * nh + h) * HS + i] = p->buf[padded_at(p, r, h, i)];
}

static cllm_view vw(padded *p) { return (cllm_view){p->buf + p->lead, p->rs, p->hs}; }
static cllm_cview cvw(const padded *p) { return (cllm_cview){p->buf + p->lead, p->rs, p->hs}; }

static void to_float(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* Gaps of an output view (everything outside its N x nh x HS elements)
 * still hold the sentinel. */
static void expect_gaps(const char *what, const char *name, const padded *p, size_t N, int nh,
                        int HS, float sentinel) {
    char *inside = calloc(p->len, 1);
    for (size_t r = 0; r < N; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < HS; i++) inside[padded_at(p, r, h, i)] = 1;
    size_t bad = 0;
    for (size_t e = 0; e < p->len; e++)
        if (!inside[e] && p->buf[e] != sentinel) bad++;
    CHECK(bad == 0, "%s %s: %zu gap elements written", name, what, bad);
    free(inside);
}

static void naive_case(int B, int T, int NH, int NKV, int HS, int use_alibi, int window, uint64_t seed) {
    char name[96];
    snprintf(name, sizeof name, "naive B%d T%d NH%d NKV%d HS%d%s window %d", B, T, NH, NKV, HS,
             use_alibi ? " alibi" : "", window);
    const size_t N = (size_t)B * T, nq = N * NH * HS, nkv = N * NKV * HS;
    const float sentinel = 777.0f;
    const double scale = (float)(1.0 / sqrt((double)HS));
    cllm_rng rng;
    cllm_rng_seed(&rng, seed);

    double *q = malloc(nq * sizeof(double)), *k = malloc(nkv * sizeof(double));
    double *v = malloc(nkv * sizeof(double)), *dout = malloc(nq * sizeof(double));
    double *out = malloc(nq * sizeof(double)), *lse = malloc((size_t)B * NH * T * sizeof(double));
    double *dq = malloc(nq * sizeof(double)), *dk = malloc(nkv * sizeof(double));
    double *dv = malloc(nkv * sizeof(double));
    float slopes[64];
    cllm_alibi_slopes(slopes, NH);
    /* Inputs are stored as float, so the reference sees the rounded values. */
    for (size_t i = 0; i < nq; i++) q[i] = (float)(1.5f * cllm_rng_normal(&rng));
    for (size_t i = 0; i < nkv; i++) k[i] = (float)(1.5f * cllm_rng_normal(&rng));
    for (size_t i = 0; i < nkv; i++) v[i] = cllm_rng_normal(&rng);
    for (size_t i = 0; i < nq; i++) dout[i] = cllm_rng_normal(&rng);
    naive_attention(out, lse, dq, dk, dv, q, k, v, dout, use_alibi ? slopes : NULL, B, T, NH, NKV,
                    HS, scale, window);

    padded pq = padded_make(B, T, NH, HS, 3, 5, 2, NAN), pk = padded_make(B, T, NKV, HS, 1, 2, 1, NAN);
    padded pv = padded_make(B, T, NKV, HS, 2, 0, 3, NAN), pdo = padded_make(B, T, NH, HS, 1, 1, 0, NAN);
    padded po = padded_make(B, T, NH, HS, 1, 3, 1, sentinel);
    padded pdq = padded_make(B, T, NH, HS, 2, 1, 1, sentinel);
    padded pdk = padded_make(B, T, NKV, HS, 3, 2, 0, sentinel);
    padded pdv = padded_make(B, T, NKV, HS, 1, 4, 2, sentinel);
    padded_put(&pq, q, N, NH, HS);
    padded_put(&pk, k, N, NKV, HS);
    padded_put(&pv, v, N, NKV, HS);
    padded_put(&pdo, dout, N, NH, HS);

    float *fill_q = malloc(nq * sizeof(float)), *fill_kv = malloc(nkv * sizeof(float));
    for (size_t i = 0; i < nq; i++) fill_q[i] = grad_fill(i);
    for (size_t i = 0; i < nkv; i++) fill_kv[i] = grad_fill(i);
    for (size_t r = 0; r < N; r++) {
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HS; i++) pdq.buf[padded_at(&pdq, r, h, i)] = fill_q[(r * NH + h) * HS + i];
        for (int h = 0; h < NKV; h++)
            for (int i = 0; i < HS; i++) {
                pdk.buf[padded_at(&pdk, r, h, i)] = fill_kv[(r * NKV + h) * HS + i];
                pdv.buf[padded_at(&pdv, r, h, i)] = fill_kv[(r * NKV + h) * HS + i];
            }
    }

    float *flse = malloc((size_t)B * NH * T * sizeof(float));
    cllm_attention_forward_window(vw(&po), flse, cvw(&pq), cvw(&pk), cvw(&pv), use_alibi ? slopes : NULL,
                                  B, T, NH, NKV, HS, (float)scale, window);
    cllm_attention_backward_window(vw(&pdq), vw(&pdk), vw(&pdv), cvw(&pdo), cvw(&po), flse, cvw(&pq),
                                   cvw(&pk), cvw(&pv), use_alibi ? slopes : NULL, B, T, NH, NKV, HS,
                                   (float)scale, window);

    float *got = malloc(nq * sizeof(float)), *ref = malloc(nq * sizeof(float));
    padded_get(got, &po, N, NH, HS);
    to_float(ref, out, nq);
    expect_close("out", name, got, NULL, ref, nq);
    to_float(ref, lse, (size_t)B * NH * T);
    expect_close("lse", name, flse, NULL, ref, (size_t)B * NH * T);
    padded_get(got, &pdq, N, NH, HS);
    to_float(ref, dq, nq);
    expect_close("dq", name, got, fill_q, ref, nq);
    padded_get(got, &pdk, N, NKV, HS);
    to_float(ref, dk, nkv);
    expect_close("dk", name, got, fill_kv, ref, nkv);
    padded_get(got, &pdv, N, NKV, HS);
    to_float(ref, dv, nkv);
    expect_close("dv", name, got, fill_kv, ref, nkv);
    expect_gaps("out", name, &po, N, NH, HS, sentinel);
    expect_gaps("dq", name, &pdq, N, NH, HS, sentinel);
    expect_gaps("dk", name, &pdk, N, NKV, HS, sentinel);
    expect_gaps("dv", name, &pdv, N, NKV, HS, sentinel);

    free(got), free(ref), free(flse), free(fill_q), free(fill_kv);
    free(pq.buf), free(pk.buf), free(pv.buf), free(pdo.buf), free(po.buf);
    free(pdq.buf), free(pdk.buf), free(pdv.buf);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* Forward and backward give bit-identical results with 1 thread and with
 * the default count, and across repeated calls. Compact layouts. B x NKV
 * of 2 runs the two-pass backward, 4 the fused one. */
static void determinism_case(int B, int NKV) {
    const int T = 100, NH = 4, HS = 32;
    const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
    const size_t nl = (size_t)B * NH * T;
    cllm_rng rng;
    cllm_rng_seed(&rng, 99);
    float *buf = malloc((3 * nq + 2 * nkv) * sizeof(float));
    float *q = buf, *k = q + nq, *v = k + nkv, *dout = v + nkv;
    for (size_t i = 0; i < 2 * nq + 2 * nkv; i++) buf[i] = cllm_rng_normal(&rng);
    float *res[2];
    float slopes[4];
    cllm_alibi_slopes(slopes, NH);
    const int threads[2] = {1, omp_get_max_threads()};
    for (int r = 0; r < 2; r++) {
        /* out | lse | dq | dk | dv */
        res[r] = calloc(2 * nq + nl + 2 * nkv, sizeof(float));
        float *out = res[r], *lse = out + nq, *dq = lse + nl, *dk = dq + nq, *dv = dk + nkv;
        omp_set_num_threads(threads[r]);
        cllm_attention_forward((cllm_view){out, NH * HS, HS}, lse, (cllm_cview){q, NH * HS, HS},
                               (cllm_cview){k, NKV * HS, HS}, (cllm_cview){v, NKV * HS, HS}, slopes,
                               B, T, NH, NKV, HS, 0.17f);
        cllm_attention_backward(
            (cllm_view){dq, NH * HS, HS}, (cllm_view){dk, NKV * HS, HS}, (cllm_view){dv, NKV * HS, HS},
            (cllm_cview){dout, NH * HS, HS}, (cllm_cview){out, NH * HS, HS}, lse,
            (cllm_cview){q, NH * HS, HS}, (cllm_cview){k, NKV * HS, HS}, (cllm_cview){v, NKV * HS, HS},
            slopes, B, T, NH, NKV, HS, 0.17f);
    }
    omp_set_num_threads(threads[1]);
    CHECK(memcmp(res[0], res[1], (2 * nq + nl + 2 * nkv) * sizeof(float)) == 0,
          "B %d NKV %d: results differ between 1 and %d threads", B, NKV, threads[1]);
    free(res[0]), free(res[1]), free(buf);
}

/* ------------------------------------------------------ PyTorch reference */

/* Reads exactly n elements of `size` bytes from dir/name, or returns NULL
 * (and fails a check). */
static void *read_raw(const char *dir, const char *name, size_t n, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    void *x = malloc((n ? n : 1) * size);
    size_t got = f ? fread(x, size, n, f) : 0;
    int extra = f ? fgetc(f) != EOF : 0;
    if (f) fclose(f);
    CHECK(f && got == n && !extra, "%s: expected %zu values (read %zu)", path, n, got);
    if (!f || got != n) {
        free(x);
        return NULL;
    }
    return x;
}
static float *read_f32(const char *dir, const char *name, size_t n) {
    return read_raw(dir, name, n, sizeof(float));
}

static void ref_case(const char *dir, const char *line) {
    char name[256];
    int B, T, NH, NKV, HS, use_alibi, nbuf;
    float scale;
    long len[3];
    int view[3][4]; /* buffer, offset, rs, hs for q, k, v */
    int n = sscanf(line, "case %255s %d %d %d %d %d %d %f %d %ld %ld %ld %d %d %d %d %d %d %d %d %d %d %d %d",
                   name, &B, &T, &NH, &NKV, &HS, &use_alibi, &scale, &nbuf, &len[0], &len[1], &len[2],
                   &view[0][0], &view[0][1], &view[0][2], &view[0][3], &view[1][0], &view[1][1],
                   &view[1][2], &view[1][3], &view[2][0], &view[2][1], &view[2][2], &view[2][3]);
    CHECK(n == 24 && nbuf >= 1 && nbuf <= 3, "bad manifest line: %s", line);
    if (n != 24 || nbuf < 1 || nbuf > 3) return;
    const size_t nq = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    char fn[300];
    float *in[3] = {0}, *din[3] = {0}, *dref[3] = {0}, *fill[3] = {0};
    snprintf(fn, sizeof fn, "%s.dout", name);
    float *dout = read_f32(dir, fn, nq);
    snprintf(fn, sizeof fn, "%s.out", name);
    float *out_ref = read_f32(dir, fn, nq);
    snprintf(fn, sizeof fn, "%s.lse", name);
    float *lse_ref = read_f32(dir, fn, nl);
    snprintf(fn, sizeof fn, "%s.slopes", name);
    float *slopes = read_f32(dir, fn, (size_t)NH);
    int ok = dout && out_ref && lse_ref && slopes;
    for (int i = 0; i < nbuf; i++) {
        snprintf(fn, sizeof fn, "%s.in%d", name, i);
        in[i] = read_f32(dir, fn, (size_t)len[i]);
        snprintf(fn, sizeof fn, "%s.din%d", name, i);
        dref[i] = read_f32(dir, fn, (size_t)len[i]);
        ok = ok && in[i] && dref[i];
        din[i] = malloc((size_t)len[i] * sizeof(float));
        fill[i] = malloc((size_t)len[i] * sizeof(float));
        for (long e = 0; e < len[i]; e++) din[i][e] = fill[i][e] = grad_fill((size_t)e);
    }
    if (ok) {
        cllm_cview qkv[3];
        cllm_view dqkv[3];
        for (int j = 0; j < 3; j++) {
            qkv[j] = (cllm_cview){in[view[j][0]] + view[j][1], view[j][2], view[j][3]};
            dqkv[j] = (cllm_view){din[view[j][0]] + view[j][1], view[j][2], view[j][3]};
        }
        float *out = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
        const float *al = use_alibi ? slopes : NULL;
        cllm_attention_forward((cllm_view){out, NH * HS, HS}, lse, qkv[0], qkv[1], qkv[2], al, B, T,
                               NH, NKV, HS, scale);
        cllm_attention_backward(dqkv[0], dqkv[1], dqkv[2], (cllm_cview){dout, NH * HS, HS},
                                (cllm_cview){out, NH * HS, HS}, lse, qkv[0], qkv[1], qkv[2], al, B,
                                T, NH, NKV, HS, scale);
        expect_close("out", name, out, NULL, out_ref, nq);
        expect_close("lse", name, lse, NULL, lse_ref, nl);
        for (int i = 0; i < nbuf; i++) {
            snprintf(fn, sizeof fn, "din%d", i);
            expect_close(fn, name, din[i], fill[i], dref[i], (size_t)len[i]);
        }
        free(out), free(lse);
    }
    for (int i = 0; i < 3; i++) free(in[i]), free(din[i]), free(dref[i]), free(fill[i]);
    free(dout), free(out_ref), free(lse_ref), free(slopes);
}

/* Our slopes against the formula evaluated with float64 powers (1e-7
 * relative: a correctly rounded fp32 result is within 6e-8) and against the
 * fp32 tensor HF builds (2 ulp: torch's fp32 pow is itself 1 ulp off in a
 * few places). */
static void ref_slopes(const char *dir, int NH) {
    char fn[64];
    snprintf(fn, sizeof fn, "slopes_%d", NH);
    float *hf = read_f32(dir, fn, (size_t)NH);
    snprintf(fn, sizeof fn, "slopes_%d.f64", NH);
    double *exact = read_raw(dir, fn, (size_t)NH, sizeof(double));
    if (hf && exact) {
        float got[128];
        cllm_alibi_slopes(got, NH);
        int bad_exact = -1, bad_hf = -1;
        for (int h = 0; h < NH; h++) {
            if (!check_close_f(got[h], exact[h], 1e-7, 0)) bad_exact = h;
            if (!check_close_f(got[h], hf[h], 2.4e-7, 0)) bad_hf = h;
        }
        CHECK(bad_exact < 0, "alibi slopes NH=%d: head %d got %.9g want %.9g", NH, bad_exact,
              bad_exact < 0 ? 0 : got[bad_exact], bad_exact < 0 ? 0 : exact[bad_exact]);
        CHECK(bad_hf < 0, "alibi slopes NH=%d: head %d got %.9g, HF has %.9g", NH, bad_hf,
              bad_hf < 0 ? 0 : got[bad_hf], bad_hf < 0 ? 0 : hf[bad_hf]);
    }
    free(hf);
    free(exact);
}

static void run_ref(const char *dir) {
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    int ncase = 0, nslope = 0;
    while (fgets(line, sizeof line, f)) {
        int nh;
        if (strncmp(line, "case ", 5) == 0) {
            ref_case(dir, line);
            ncase++;
        } else if (sscanf(line, "slopes %d", &nh) == 1 && nh >= 1 && nh <= 128) {
            ref_slopes(dir, nh);
            nslope++;
        } else {
            CHECK(0, "bad manifest line: %s", line);
        }
    }
    fclose(f);
    CHECK(ncase > 0 && nslope > 0, "manifest had %d cases, %d slope sets", ncase, nslope);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--ref") == 0) {
        run_ref(argv[2]);
        return check_summary();
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_attention [--ref DIR]\n");
        return 2;
    }
    /* B x NKV < 4: the two-pass backward */
    naive_case(1, 70, 3, 3, 7, 0, 0, 2);
    naive_case(1, 65, 6, 1, 33, 1, 0, 3);
    naive_case(2, 1, 2, 1, 256, 1, 0, 4);
    naive_case(1, 33, 1, 1, 256, 0, 0, 5);
    naive_case(1, 90, 4, 2, 16, 1, 23, 6);
    /* B x NKV >= 4: the fused backward (odd lengths, a window inside a block and across blocks) */
    naive_case(2, 37, 4, 2, 24, 1, 0, 1);
    naive_case(2, 70, 8, 4, 24, 1, 0, 7);
    naive_case(1, 97, 8, 8, 64, 0, 0, 8);
    naive_case(4, 100, 4, 2, 32, 0, 19, 9);
    naive_case(8, 45, 2, 1, 80, 1, 40, 10);
    determinism_case(1, 2);
    determinism_case(2, 2);
    return check_summary();
}
