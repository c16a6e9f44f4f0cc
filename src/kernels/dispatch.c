/*
 * The public kernel names, each calling one variant of the kernel files
 * (see variant.h): avx512 (x86-64-v4) when cllm_cpu() allows CLLM_ISA_AVX512,
 * avx2 (x86-64-v3) when it allows CLLM_ISA_AVX2, portable otherwise. The
 * choice is made once, on the first kernel call, and never changes within
 * a process, so a run stays bit-for-bit repeatable; CLLM_MAX_ISA lowers it
 * (CLLM_MAX_ISA=portable runs the portable build of every kernel).
 *
 * The variants compute the same formulas; wider vectors may sum in another
 * order, so results agree to rounding, not bit for bit, across variants.
 */
#include <pthread.h>

#include "cllm/cpu.h"
#include "cllm/kernels.h"

/* XV(return, name, (params), (args)) for void kernels, XR for the others. */
#define CLLM_KERNELS(XV, XR) \
    XV(void, cllm_alibi_slopes, (float *slopes, int NH), (slopes, NH)) \
    XV(void, cllm_attention_forward_window, (cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v, const float *alibi, int B, int T, int NH, int NKV, int HS, float scale, int window), (out, lse, q, k, v, alibi, B, T, NH, NKV, HS, scale, window)) \
    XV(void, cllm_attention_backward_window, (cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout, cllm_cview out, const float *lse, cllm_cview q, cllm_cview k, cllm_cview v, const float *alibi, int B, int T, int NH, int NKV, int HS, float scale, int window), (dq, dk, dv, dout, out, lse, q, k, v, alibi, B, T, NH, NKV, HS, scale, window)) \
    XV(void, cllm_attention_forward_paged_window, (cllm_view out, cllm_cview q, const float *kpool, const float *vpool, const int32_t *table, int max_blocks, int BS, const int32_t *rows, const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS, float scale, int window), (out, q, kpool, vpool, table, max_blocks, BS, rows, past, alibi, n_seq, NH, NKV, HS, scale, window)) \
    XV(void, cllm_attention_forward_paged_bf16, (cllm_view out, cllm_cview q, const uint16_t *kpool, const uint16_t *vpool, const int32_t *table, int max_blocks, int BS, const int32_t *rows, const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS, float scale, int window), (out, q, kpool, vpool, table, max_blocks, BS, rows, past, alibi, n_seq, NH, NKV, HS, scale, window)) \
    XV(void, cllm_add, (float *out, const float *a, const float *b, long N), (out, a, b, N)) \
    XV(void, cllm_to_bf16, (uint16_t *dst, const float *src, long N), (dst, src, N)) \
    XV(void, cllm_round_f16, (float *dst, const float *src, long N), (dst, src, N)) \
    XV(void, cllm_round_bf16, (float *dst, const float *src, long N), (dst, src, N)) \
    XV(void, cllm_embedding_forward, (float *out, const int32_t *tokens, const float *wte, const float *wpe, int N, int T, int C), (out, tokens, wte, wpe, N, T, C)) \
    XV(void, cllm_embedding_backward, (float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int N, int T, int C, int V), (dwte, dwpe, dout, tokens, N, T, C, V)) \
    XV(void, cllm_gelu_forward, (float *out, const float *inp, long N), (out, inp, N)) \
    XV(void, cllm_gelu_backward, (float *dinp, const float *dout, const float *inp, long N), (dinp, dout, inp, N)) \
    XV(void, cllm_layernorm_forward, (float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int N, int C, float eps), (out, mean, rstd, inp, weight, bias, N, C, eps)) \
    XV(void, cllm_layernorm_backward, (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, const float *mean, const float *rstd, int N, int C), (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C)) \
    XV(void, cllm_rmsnorm_forward, (float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps), (out, rstd, inp, weight, N, C, eps)) \
    XV(void, cllm_rmsnorm_backward, (float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const float *rstd, int N, int C), (dinp, dweight, dout, inp, weight, rstd, N, C)) \
    XV(void, cllm_rope_tables, (float *cos_t, float *sin_t, int T, int HS, float theta), (cos_t, sin_t, T, HS, theta)) \
    XV(void, cllm_rope_apply, (float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int HS, int row_stride, int head_stride, int sign), (x, cos_t, sin_t, B, T, nh, HS, row_stride, head_stride, sign)) \
    XV(void, cllm_swiglu_forward, (float *out, const float *gate, const float *up, long N), (out, gate, up, N)) \
    XV(void, cllm_swiglu_backward, (float *dgate, float *dup, const float *dout, const float *gate, const float *up, long N), (dgate, dup, dout, gate, up, N)) \
    XV(void, cllm_xent_vp_max, (float *rmax, const float *logits, int N, int V), (rmax, logits, N, V)) \
    XV(void, cllm_xent_vp_sum, (double *st, float *logits, const int32_t *targets, const float *rmax, int N, int V, int v0, bool store), (st, logits, targets, rmax, N, V, v0, store)) \
    XR(long, cllm_xent_vp_finish, (float *losses, float *logits, const int32_t *targets, const float *rmax, const double *st, int N, int V, int v0, float dscale), (losses, logits, targets, rmax, st, N, V, v0, dscale)) \
    XV(void, cllm_embedding_vp_forward, (float *out, const int32_t *tokens, const float *wte, int N, int C, int v0, int V), (out, tokens, wte, N, C, v0, V)) \
    XV(void, cllm_embedding_vp_backward, (float *dwte, const float *dout, const int32_t *tokens, int N, int C, int v0, int V), (dwte, dout, tokens, N, C, v0, V)) \
    XR(long, cllm_xent_forward_backward, (float *losses, float *logits, const int32_t *targets, int N, int V, float dscale), (losses, logits, targets, N, V, dscale)) \
    XR(long, cllm_xent_forward, (float *losses, const float *logits, const int32_t *targets, int N, int V), (losses, logits, targets, N, V)) \
    XR(double, cllm_logsumexp, (const float *x, int V), (x, V))

/* each variant's definitions */
#define DECL(ret, name, params, args) \
    ret name##_portable params; \
    ret name##_avx2 params; \
    ret name##_avx512 params;
CLLM_KERNELS(DECL, DECL)
#undef DECL

#define FIELD(ret, name, params, args) ret(*name) params;
static struct {
    CLLM_KERNELS(FIELD, FIELD)
} g_k;
#undef FIELD

static const char *g_variant = "portable";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    cllm_isa isa = cllm_cpu()->isa;
#define SET(ret, name, params, args) g_k.name = name##_portable;
    CLLM_KERNELS(SET, SET)
#undef SET
#ifdef CLLM_KV_X86
    if (isa >= CLLM_ISA_AVX512) {
#define SET(ret, name, params, args) g_k.name = name##_avx512;
        CLLM_KERNELS(SET, SET)
#undef SET
        g_variant = "avx512";
    } else if (isa >= CLLM_ISA_AVX2) {
#define SET(ret, name, params, args) g_k.name = name##_avx2;
        CLLM_KERNELS(SET, SET)
#undef SET
        g_variant = "avx2";
    }
#else
    (void)isa;
#endif
}

const char *cllm_kernels_variant(void) {
    pthread_once(&g_once, choose);
    return g_variant;
}

#define DEFV(ret, name, params, args) \
    ret name params { \
        pthread_once(&g_once, choose); \
        g_k.name args; \
    }
#define DEFR(ret, name, params, args) \
    ret name params { \
        pthread_once(&g_once, choose); \
        return g_k.name args; \
    }
CLLM_KERNELS(DEFV, DEFR)

/* The causal kernels without a window: the windowed ones with window 0. */
void cllm_attention_forward(cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v, const float *alibi,
                            int B, int T, int NH, int NKV, int HS, float scale) {
    cllm_attention_forward_window(out, lse, q, k, v, alibi, B, T, NH, NKV, HS, scale, 0);
}
void cllm_attention_backward(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout, cllm_cview out,
                             const float *lse, cllm_cview q, cllm_cview k, cllm_cview v, const float *alibi, int B,
                             int T, int NH, int NKV, int HS, float scale) {
    cllm_attention_backward_window(dq, dk, dv, dout, out, lse, q, k, v, alibi, B, T, NH, NKV, HS, scale, 0);
}
void cllm_attention_forward_paged(cllm_view out, cllm_cview q, const float *kpool, const float *vpool,
                                  const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                  const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS,
                                  float scale) {
    cllm_attention_forward_paged_window(out, q, kpool, vpool, table, max_blocks, BS, rows, past, alibi, n_seq, NH,
                                        NKV, HS, scale, 0);
}
