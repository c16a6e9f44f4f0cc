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

/* Bytes of one quantized activation block of matvec.c (fp32 scale + 32 int8). */
enum { QUANT_XBLOCK_BYTES = 36 };

#endif
