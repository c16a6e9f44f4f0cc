/*
 * Private to src/quant/: the variants of the small-batch matmul kernel
 * (matvec.c is compiled once per ISA level, CLLM_KV naming it; dispatch.c
 * picks one).
 */
#ifndef CLLM_QUANT_IMPL_H
#define CLLM_QUANT_IMPL_H

#include "cllm/quant.h"

void cllm_qmatmul_portable(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
void cllm_qmatmul_avx2(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
void cllm_qmatmul_avx512(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
/* dst[M, K] = the values d * q that x[M, K] takes in the variant's
 * quantized activations (cllm_qgemm's int8 / q4 operand); on the calling
 * thread. */
void cllm_qmatmul_round_portable(float *dst, const float *x, int M, int K);
void cllm_qmatmul_round_avx2(float *dst, const float *x, int M, int K);
void cllm_qmatmul_round_avx512(float *dst, const float *x, int M, int K);
/* The variant cllm_qmatmul runs (dispatch.c). */
void quant_round_x(float *dst, const float *x, int M, int K);

/* The decode matmuls' thread pool (pool.c): runs fn(ctx, c) for every c in
 * [0, n) on the calling thread and up to quant_pool_threads() - 1 helpers,
 * returning when all are done. Each chunk runs exactly once, on whichever
 * thread claims it, so fn must write disjoint outputs per chunk. */
typedef cllm_quant_task_fn quant_task_fn; /* cllm/quant.h */
void quant_pool_run(quant_task_fn fn, void *ctx, int n);
/* Threads a job would use: omp_get_max_threads() (1 inside an OpenMP region). */
int quant_pool_threads(void);

/* Bytes of one quantized activation block of matvec.c (fp32 scale + 32
 * int8), and of its 8 int32 lanes of -8 * (sum of 4 codes) that q4 weights
 * also need (src/quant/qdot.h). */
enum { QUANT_XBLOCK_BYTES = 36, QUANT_XCORR_BYTES = 32 };

/* A block of 32 activations quantized as Q8_0 is, with an fp32 scale:
 * value = d * q, d = max|x| / 127, q = round(x / d) half away from zero. */
typedef struct {
    float d;
    int8_t q[CLLM_QBLOCK];
} quant_xblock;

/* xq[M][ceil(K / 32)] = x[M, K] quantized as cllm_qmatmul quantizes it
 * (the same codes; a partial last block zero-padded), on the pool (on the
 * calling thread inside an OpenMP region). The avx512 build's only. */
void cllm_qmatmul_quantx_avx512(quant_xblock *xq, const float *x, int M, int K);

/* cllm_qgemm for int8 / q4 weights on AVX512-VNNI (qgemm_vnni.c; only the
 * avx512 build has it, and only a CPU with VNNI may call it). scratch:
 * cllm_qgemm_vnni_scratch_bytes. */
void cllm_qgemm_vnni_avx512(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
size_t cllm_qgemm_vnni_scratch_bytes(int cols, int M);

#endif
