/*
 * cllm quant: the weight formats of inference (fp32, bf16, int8, q4) and the
 * matrix-vector / small-batch kernels that read them at the memory-bandwidth
 * limit.
 *
 * Generating a token reads every weight once, so decode speed is memory
 * bandwidth divided by the bytes of the weights. A weight matrix of `rows`
 * output channels by `cols` inputs is stored in one of these formats
 * (docs/formats/quantized.md has the byte tables):
 *
 *   fp32  4 bytes a value; [rows, cols] row-major, or [cols, rows] (`in_out`,
 *         GPT-2's Conv1D layout, read in place from the parameter buffer).
 *   bf16  2 bytes a value; [rows, cols] row-major (the upper half of fp32).
 *   int8  ggml's Q8_0 block: 32 consecutive values of a row as an fp16 scale
 *         d = max|x| / 127 and 32 int8 q = round(x / d); value = d * q.
 *         34 bytes per 32 values (8.5 bits a value).
 *   q4    ggml's Q4_0 block: 32 values as an fp16 scale d = m / -8, where m is
 *         the value of largest magnitude (sign kept), and 16 bytes of 4-bit
 *         codes q in 0..15 (byte j: value j in the low nibble, value j + 16 in
 *         the high one); value = d * (q - 8). 18 bytes per 32 values (4.5 bits).
 *
 * Rows of the block formats are padded with zeros to a multiple of 32
 * values, so any `cols` works (ggml's own files need cols % 32 == 0; those
 * rows are byte-identical to ggml's).
 *
 * Kernels: out[M, rows] = x[M, cols] . W^T (+ bias), for the small M of
 * decoding (1 .. about 16 rows: one row per running sequence). Each output is
 * a dot product computed the same way whatever M is, so a sequence gets the
 * same logits alone or in a batch. They run on OpenMP threads over output
 * rows, never allocate, and come in variants chosen once at run time from
 * cllm_cpu() (CLLM_MAX_ISA lowers the choice): avx512 (x86-64-v4; int8 /
 * q4 dots on AVX512-VNNI where the CPU has it), avx2 (AVX2 + FMA) and a
 * portable C build. Output rows are cut into chunks that a small thread
 * pool (omp_get_max_threads() threads, the caller included) claims, so a
 * thread that loses its core delays one chunk, not every matmul. fp32 and bf16 weights multiply fp32
 * activations (bf16 widened by a shift): the fp32 product up to the order
 * of the sum. int8 and q4 weights multiply activations quantized per block
 * of 32 like Q8_0 (fp32 scale max|x| / 127, int8 codes rounded half away
 * from zero): each block adds d_w * d_x * (integer dot of the codes), as
 * llama.cpp computes Q8_0 / Q4_0 times Q8_0.
 */
#ifndef CLLM_QUANT_H
#define CLLM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_WFMT_FP32 = 0, CLLM_WFMT_BF16, CLLM_WFMT_INT8, CLLM_WFMT_Q4, CLLM_WFMT_COUNT } cllm_wfmt;

enum {
    CLLM_QBLOCK = 32,          /* values per block of int8 / q4 */
    CLLM_Q8_BLOCK_BYTES = 34,  /* fp16 scale + 32 int8 */
    CLLM_Q4_BLOCK_BYTES = 18,  /* fp16 scale + 16 bytes of nibbles */
};

/* "fp32", "bf16", "int8", "q4"; NULL for anything else. */
const char *cllm_wfmt_name(cllm_wfmt f);
/* Parses those names; false for anything else. */
bool cllm_wfmt_from_name(const char *name, cllm_wfmt *out);
/* Bytes of one stored row of `cols` values (block formats padded to 32). */
size_t cllm_wfmt_row_bytes(cllm_wfmt f, int64_t cols);

/* Quantizes one row of n values (any n >= 1) into ceil(n / 32) blocks; the
 * last block is padded with zeros. dst holds cllm_wfmt_row_bytes(.., n). */
void cllm_quant_q8_0_row(unsigned char *dst, const float *src, int64_t n);
void cllm_quant_q4_0_row(unsigned char *dst, const float *src, int64_t n);
/* An int8 code: round(v) half away from zero; NaN gives 0, values beyond
 * +-127 give +-127 (never an undefined conversion). */
int8_t cllm_quant_code8(float v);
/* The values of one stored row of format f (n values; fp32 rows copied). */
void cllm_quant_dequant_row(float *dst, const void *src, cllm_wfmt f, int64_t n);

/* A weight matrix as the kernels read it: `rows` output channels of `cols`
 * inputs in format fmt. data is borrowed. in_out is for fp32 only: the data
 * is [cols, rows] (GPT-2 Conv1D); every other format is [rows, cols]. */
typedef struct {
    cllm_wfmt fmt;
    const void *data;
    int rows, cols;
    bool in_out;
} cllm_qweight;

/* Bytes of the stored matrix (rows * cllm_wfmt_row_bytes). */
size_t cllm_qweight_bytes(cllm_wfmt f, int rows, int cols);

/* Stores a [rows, cols] fp32 matrix (or [cols, rows] when `transpose`,
 * written out transposed) in format f at dst (cllm_qweight_bytes bytes).
 * Runs on OpenMP threads over rows; a transposed source needs one row of
 * scratch per thread (CLLM_ERR_NOMEM when it cannot be had). */
cllm_status cllm_quant_matrix(void *dst, cllm_wfmt f, const float *src, int rows, int cols, bool transpose);

/* Bytes of scratch cllm_qmatmul needs for M rows of `cols` inputs in
 * format f: the quantized activations of int8 / q4 (36 bytes per 32
 * inputs per row); 0 for fp32 and bf16. */
size_t cllm_qmatmul_scratch_bytes(cllm_wfmt f, int cols, int M);
/* out[M, w.rows] = x[M, w.cols] . W^T + bias (bias [w.rows] or NULL).
 * out must not alias x. M >= 1. scratch: cllm_qmatmul_scratch_bytes(w.fmt,
 * w.cols, M) bytes of the caller's (NULL when that is 0). */
void cllm_qmatmul(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
/* The same through a given variant: isa is lowered to the best variant
 * built for it and allowed by the CPU (portable always exists). For tests
 * that compare the variants in one process. */
void cllm_qmatmul_isa(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch,
                      cllm_isa isa);
/* "portable", "avx2", "avx512" or "avx512-vnni" (the avx512 build with
 * int8 / q4 dots on vpdpbusd): the variant cllm_qmatmul uses. */
const char *cllm_qmatmul_variant(void);

#ifdef __cplusplus
}
#endif

#endif
