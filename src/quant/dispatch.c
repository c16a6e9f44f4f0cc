/*
 * The public small-batch matmul (cllm/quant.h): the variant of matvec.c that
 * cllm_cpu() allows, chosen once (as src/kernels/dispatch.c chooses the
 * other kernels).
 */
#include <pthread.h>

#include "quant_impl.h"

typedef void (*qmatmul_fn)(float *, const float *, const cllm_qweight *, const float *, int, void *);
typedef void (*qround_fn)(float *, const float *, int, int);

/* The best variant built for level isa; the level is first capped by what
 * the CPU allows. *round: the same variant's activation rounding. */
static qmatmul_fn variant(cllm_isa isa, const char **name, qround_fn *round) {
    cllm_isa cpu = cllm_cpu()->isa;
    if (isa > cpu) isa = cpu;
#ifdef CLLM_KV_X86
    if (isa >= CLLM_ISA_AVX512) {
        /* the avx512 build takes VNNI's integer dots itself where the CPU has them */
        *name = cllm_cpu()->avx512_vnni ? "avx512-vnni" : "avx512";
        *round = cllm_qmatmul_round_avx512;
        return cllm_qmatmul_avx512;
    }
    if (isa >= CLLM_ISA_AVX2) {
        *name = "avx2";
        *round = cllm_qmatmul_round_avx2;
        return cllm_qmatmul_avx2;
    }
#endif
    *name = "portable";
    *round = cllm_qmatmul_round_portable;
    return cllm_qmatmul_portable;
}

static qmatmul_fn g_fn;
static qround_fn g_round;
static const char *g_name = "portable";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void choose(void) { g_fn = variant(cllm_cpu()->isa, &g_name, &g_round); }

void quant_round_x(float *dst, const float *x, int M, int K) {
    pthread_once(&g_once, choose);
    g_round(dst, x, M, K);
}

const char *cllm_qmatmul_variant(void) {
    pthread_once(&g_once, choose);
    return g_name;
}

size_t cllm_qmatmul_scratch_bytes(cllm_wfmt f, int cols, int M) {
    if (f != CLLM_WFMT_INT8 && f != CLLM_WFMT_Q4) return 0;
    const size_t per_block = QUANT_XBLOCK_BYTES + (f == CLLM_WFMT_Q4 ? QUANT_XCORR_BYTES : 0);
    return (size_t)M * (size_t)((cols + CLLM_QBLOCK - 1) / CLLM_QBLOCK) * per_block;
}

void cllm_qmatmul(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    pthread_once(&g_once, choose);
    g_fn(out, x, w, bias, M, scratch);
}

void cllm_qmatmul_isa(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch,
                      cllm_isa isa) {
    const char *name;
    qround_fn round;
    variant(isa, &name, &round)(out, x, w, bias, M, scratch);
}
