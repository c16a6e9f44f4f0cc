/*
 * Prompts on oneDNN (cllm_qgemm, cllm/quant.h): the weight matrix widened
 * to fp32 one panel of output channels at a time into the caller's
 * scratch, each panel multiplied by every row of the prompt with oneDNN's
 * fp32 GEMM, its outputs copied into their columns of out (a matrix that
 * fits one panel is written in place).
 *
 * Why panels of widened weights rather than integer tiles: without VNNI an
 * int8 dot of 32 codes costs AVX2 about as many instructions (sign,
 * maddubs, madd, convert, multiply-add) as four fp32 FMAs of 8 lanes, so the
 * integer kernel has no arithmetic advantage over an fp32 GEMM, and oneDNN's
 * sgemm blocks for the caches far better than a register tile does. The
 * widening is O(rows * cols) per call, against the GEMM's O(M * rows * cols):
 * noise for a prompt, the whole cost for a decode step (cllm_qmatmul then).
 * (oneDNN's own int8 GEMM takes one scale per output channel; Q8_0 / Q4_0
 * have one per 32 values, so it cannot run these weights without
 * requantizing them.)
 *
 * Panels are as large as CLLM_QGEMM_PANEL_FLOATS and CLLM_QGEMM_PANEL_ROWS
 * allow, cut into equal parts: every GEMM call is an OpenMP region of
 * oneDNN's that ends at a barrier, and on a busy machine each barrier waits
 * out a descheduled thread's time slice, so a prompt should make as few
 * calls as a plain fp32 model does. For the same reason the widening, the
 * rounding of the activations and the copies run on the decode kernels'
 * chunk-claiming pool (pool.c), not on OpenMP teams.
 *
 * int8 / q4: the activations are rounded to the values of their quantized
 * blocks first (quant_round_x, the variant cllm_qmatmul uses), so this is
 * the decode kernel's product up to fp32 rounding.
 */
#include <string.h>

#include "cllm/cpu.h"
#include "cllm/kernels.h"
#include "quant_impl.h"

enum { PANEL_FLOATS = CLLM_QGEMM_PANEL_FLOATS, PANEL_ROWS = CLLM_QGEMM_PANEL_ROWS, CHUNK = 16 };

/* Rows per panel for R rows of K inputs: the fewest equal panels (up to a
 * multiple of 8 rows) of at most PANEL_ROWS rows and about PANEL_FLOATS
 * values (at most PANEL_FLOATS + 8 K). */
static int panel_rows(int R, int K) {
    long np = ((long)R * K + PANEL_FLOATS - 1) / PANEL_FLOATS, np_rows = (R + PANEL_ROWS - 1) / PANEL_ROWS;
    if (np < np_rows) np = np_rows;
    if (np < 1) np = 1;
    long p = (R + np - 1) / np;
    p = (p + 7) / 8 * 8;
    return p < R ? (int)p : R;
}

/* One pass over rows [c * CHUNK, (c + 1) * CHUNK) of n, on the pool. */
typedef struct {
    float *dst;
    const void *src;
    const cllm_qweight *w;
    int n, K, ld, r0; /* copy: dst row stride ld, columns from r0 */
} pass;

static void round_chunk(void *ctx, int c) {
    const pass *p = ctx;
    const int m0 = c * CHUNK, m = p->n - m0 < CHUNK ? p->n - m0 : CHUNK;
    quant_round_x(p->dst + (size_t)m0 * p->K, (const float *)p->src + (size_t)m0 * p->K, m, p->K);
}

static void widen_chunk(void *ctx, int c) {
    const pass *p = ctx;
    const size_t rb = cllm_wfmt_row_bytes(p->w->fmt, p->K);
    for (int r = c * CHUNK; r < p->n && r < (c + 1) * CHUNK; r++)
        cllm_quant_dequant_row(p->dst + (size_t)r * p->K, (const unsigned char *)p->w->data + (size_t)(p->r0 + r) * rb,
                               p->w->fmt, p->K);
}

/* rows of the panel output (K = the panel's width) into their columns of out */
static void copy_chunk(void *ctx, int c) {
    const pass *p = ctx;
    for (int i = c * CHUNK; i < p->n && i < (c + 1) * CHUNK; i++)
        memcpy(p->dst + (size_t)i * p->ld + p->r0, (const float *)p->src + (size_t)i * p->K, (size_t)p->K * sizeof(float));
}

static int chunks(int n) { return (n + CHUNK - 1) / CHUNK; }

/* int8 / q4 on qgemm_vnni.c's integer tiles: the avx512 build allowed and
 * VNNI on the CPU. */
static bool on_vnni(cllm_wfmt f, cllm_isa isa) {
#ifdef CLLM_KV_X86
    const cllm_cpu_info *c = cllm_cpu();
    return (f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) && isa >= CLLM_ISA_AVX512 && c->isa >= CLLM_ISA_AVX512 &&
           c->avx512_vnni;
#else
    (void)f, (void)isa;
    return false;
#endif
}

const char *cllm_qgemm_variant(cllm_wfmt f) {
    if (on_vnni(f, CLLM_ISA_COUNT)) return "avx512-vnni";
    return f == CLLM_WFMT_FP32 ? "onednn" : "onednn-panels";
}

size_t cllm_qgemm_scratch_bytes(cllm_wfmt f, int cols, int M) {
    if (f == CLLM_WFMT_FP32) return 0;
    size_t n = (size_t)PANEL_FLOATS + 8 * (size_t)cols + (size_t)M * PANEL_ROWS;
    if (f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) n += (size_t)M * (size_t)cols;
    size_t b = n * sizeof(float);
#ifdef CLLM_KV_X86
    if (f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) { /* the VNNI path's needs, should a caller force it */
        size_t v = cllm_qgemm_vnni_scratch_bytes(cols, M);
        if (v > b) b = v;
    }
#endif
    return b;
}

cllm_status cllm_qgemm_isa(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch,
                           cllm_isa isa) {
    const int R = w->rows, K = w->cols;
    if (w->fmt == CLLM_WFMT_FP32) return cllm_linear_forward(out, x, w->data, bias, M, K, R, w->in_out);
#ifdef CLLM_KV_X86
    if (on_vnni(w->fmt, isa)) {
        cllm_qgemm_vnni_avx512(out, x, w, bias, M, scratch);
        return CLLM_OK;
    }
#endif
    float *pan = scratch, *ot = pan + PANEL_FLOATS + 8 * (size_t)K;
    const float *a = x;
    if (w->fmt == CLLM_WFMT_INT8 || w->fmt == CLLM_WFMT_Q4) {
        pass p = {.dst = ot + (size_t)M * PANEL_ROWS, .src = x, .n = M, .K = K};
        quant_pool_run(round_chunk, &p, chunks(M));
        a = p.dst;
    }
    const int P = panel_rows(R, K);
    for (int r0 = 0; r0 < R; r0 += P) {
        const int n = R - r0 < P ? R - r0 : P;
        pass wp = {.dst = pan, .w = w, .n = n, .K = K, .r0 = r0};
        quant_pool_run(widen_chunk, &wp, chunks(n));
        float *o = n == R ? out : ot; /* one panel covering every output: straight into out */
        cllm_status st = cllm_linear_forward(o, a, pan, bias ? bias + r0 : NULL, M, K, n, false);
        if (st) return st;
        if (o == ot) {
            pass cp = {.dst = out, .src = ot, .n = M, .K = n, .ld = R, .r0 = r0};
            quant_pool_run(copy_chunk, &cp, chunks(M));
        }
    }
    return CLLM_OK;
}

cllm_status cllm_qgemm(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    return cllm_qgemm_isa(out, x, w, bias, M, scratch, CLLM_ISA_COUNT);
}
