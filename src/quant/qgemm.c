/*
 * Prompts on oneDNN (cllm_qgemm, cllm/quant.h): the weight matrix widened
 * to fp32 one panel of CLLM_QGEMM_PANEL output channels at a time into the
 * caller's scratch, each panel multiplied by every row of the prompt with
 * oneDNN's fp32 GEMM, its outputs copied into their columns of out.
 *
 * Why panels of widened weights rather than integer tiles: without VNNI an
 * int8 dot of 32 codes costs AVX2 about as many instructions (sign,
 * maddubs, madd, convert, multiply-add) as four fp32 FMAs of 8 lanes, so the
 * integer kernel has no arithmetic advantage over an fp32 GEMM, and oneDNN's
 * sgemm blocks for the caches far better than a register tile does. The
 * widening is O(rows * cols) per call, against the GEMM's O(M * rows * cols):
 * noise for a prompt, the whole cost for a decode step (cllm_qmatmul then).
 * A panel of 128 rows of up to a few thousand inputs stays in L2 / L3 while
 * the prompt's rows go by. (oneDNN's own int8 GEMM needs one scale per
 * output channel; Q8_0 / Q4_0 have one per 32 values, so it cannot run these
 * weights without requantizing them.)
 *
 * int8 / q4: the activations are rounded to the values of their quantized
 * blocks first (quant_round_x, the variant cllm_qmatmul uses), so this is
 * the decode kernel's product up to fp32 rounding.
 */
#include <string.h>

#include "cllm/kernels.h"
#include "quant_impl.h"

enum { PANEL = CLLM_QGEMM_PANEL };

size_t cllm_qgemm_scratch_bytes(cllm_wfmt f, int cols, int M) {
    if (f == CLLM_WFMT_FP32) return 0;
    size_t n = (size_t)PANEL * (size_t)cols + (size_t)M * PANEL;
    if (f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) n += (size_t)M * (size_t)cols;
    return n * sizeof(float);
}

cllm_status cllm_qgemm(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    const int R = w->rows, K = w->cols;
    if (w->fmt == CLLM_WFMT_FP32) return cllm_linear_forward(out, x, w->data, bias, M, K, R, w->in_out);
    float *pan = scratch, *ot = pan + (size_t)PANEL * K;
    const float *a = x;
    if (w->fmt == CLLM_WFMT_INT8 || w->fmt == CLLM_WFMT_Q4) {
        float *xr = ot + (size_t)M * PANEL;
        enum { ROWS = 8 }; /* rows per task */
#pragma omp parallel for schedule(static) if ((long)M * K >= 65536)
        for (int m0 = 0; m0 < M; m0 += ROWS)
            quant_round_x(xr + (size_t)m0 * K, x + (size_t)m0 * K, M - m0 < ROWS ? M - m0 : ROWS, K);
        a = xr;
    }
    const size_t rb = cllm_wfmt_row_bytes(w->fmt, K);
    for (int r0 = 0; r0 < R; r0 += PANEL) {
        const int n = R - r0 < PANEL ? R - r0 : PANEL;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++)
            cllm_quant_dequant_row(pan + (size_t)r * K, (const unsigned char *)w->data + (size_t)(r0 + r) * rb, w->fmt, K);
        /* one panel covering every output: straight into out */
        float *o = n == R ? out : ot;
        cllm_status st = cllm_linear_forward(o, a, pan, bias ? bias + r0 : NULL, M, K, n, false);
        if (st) return st;
        if (o == ot) {
#pragma omp parallel for schedule(static)
            for (int i = 0; i < M; i++) memcpy(out + (size_t)i * R + r0, ot + (size_t)i * n, (size_t)n * sizeof *out);
        }
    }
    return CLLM_OK;
}
