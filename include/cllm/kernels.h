/*
 * cllm kernels: the operators of GPT-2, LLaMA and BLOOM, each forward with
 * its backward. All tensors are fp32, row-major and contiguous unless a
 * stride argument says otherwise. Shapes are written in brackets.
 *
 * Conventions:
 * - Outputs first, then inputs, then dimensions.
 * - Backward functions ACCUMULATE (+=) into every gradient buffer they are
 *   given, so a caller zeroes gradients once per step and residual/tied
 *   paths add up naturally. A NULL gradient pointer means "not needed".
 * - Kernels never allocate on the heap. Scratch, where needed, is passed in.
 * - Parallelism is OpenMP over independent outer dimensions, with no float
 *   atomics: a run with the same thread count is bit-for-bit repeatable.
 * - Dimension names: B batch, T sequence, C channels, V vocabulary, NH query
 *   heads, NKV key/value heads, HS head size, N = rows (usually B*T).
 */
#ifndef CLLM_KERNELS_H
#define CLLM_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- matmul
 * General fp32 GEMM on oneDNN:
 *   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N]
 * op(A) = A stored [M,K] (trans_a=false) or A stored [K,M] (trans_a=true);
 * op(B) = B stored [K,N] (trans_b=false) or B stored [N,K] (trans_b=true).
 * beta is 0 (overwrite) or 1 (accumulate); other values are CLLM_ERR_ARG.
 * oneDNN primitives are created once per shape and cached inside the module;
 * thread-safe, and calls from different threads run at the same time (the
 * cache lookup is locked, the execution is not). cllm_matmul_cleanup()
 * releases the cache, after waiting for GEMMs running on other threads. */
cllm_status cllm_matmul(float *C, const float *A, const float *B, int M, int N, int K, bool trans_a,
                        bool trans_b, float alpha, float beta);
void cllm_matmul_cleanup(void);

/* Bytes oneDNN allocates (and frees again) inside one fp32 cllm_matmul call
 * of this shape on this CPU with n_threads OpenMP threads (0: this
 * process's omp_get_max_threads()): the packed operand panels of oneDNN's
 * copy-based sgemm, whose blocking depends on the ISA oneDNN runs
 * (dnnl_get_effective_cpu_isa(), so ONEDNN_MAX_CPU_ISA counts), plus, for
 * the layouts that run the matmul primitive (trans_b), the scratchpad that
 * primitive reports. The sgemm part follows oneDNN 2.6's driver (blocking,
 * thread split, no-copy rule), see docs/memory.md. 0 for empty shapes.
 * Thread-safe; does not run the GEMM. */
size_t cllm_matmul_workspace(int M, int N, int K, bool trans_a, bool trans_b, int n_threads);

/* The same GEMM with bf16 operands (raw bfloat16 bit patterns, see
 * cllm_f32_to_bf16), fp32 accumulation and fp32 C; beta=1 accumulates into
 * the fp32 C. Same argument rules and cache as cllm_matmul. Runs on every
 * CPU: oneDNN's bf16 kernels where it has them (AVX-512, AVX512-BF16, AMX),
 * else the operands are widened to fp32 (exact) in slices of at most 32 MiB
 * held by this module and the fp32 GEMM runs: the same numerics up to the
 * summation order. The module's widening buffer serves one call at a time
 * (concurrent calls wait for it); see cllm_matmul_bf16_ws. */
cllm_status cllm_matmul_bf16(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                             bool trans_a, bool trans_b, float alpha, float beta);
/* cllm_matmul_bf16 with the widened operands in the caller's workspace
 * ws[ws_bytes] (NULL: the module's buffer), so that calls on different
 * threads do not wait for each other; the same results. A workspace smaller
 * than cllm_matmul_bf16_scratch_bytes(M, N, K) is CLLM_ERR_ARG. Unused on
 * the native path. */
cllm_status cllm_matmul_bf16_ws(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                                bool trans_a, bool trans_b, float alpha, float beta, float *ws, size_t ws_bytes);

/* Whether cllm_matmul_bf16 runs on oneDNN's bf16 kernels (probed once with
 * a small primitive; false when oneDNN answers "unimplemented", e.g. on
 * AVX2 CPUs or under ONEDNN_MAX_CPU_ISA=AVX2, or when CLLM_MAX_ISA is below
 * avx512). Thread-safe. */
bool cllm_matmul_bf16_native(void);
/* "onednn" or "fp32-widened": the path cllm_matmul_bf16 takes. */
const char *cllm_matmul_bf16_backend(void);
/* Bytes of widened-operand scratch the fallback path holds for an
 * [M,K]x[K,N] bf16 GEMM (0 on the native path): (M + N) x kc floats, kc
 * the K slice that keeps it within 32 MiB. The module keeps the largest
 * such buffer of the run until cllm_matmul_cleanup. */
size_t cllm_matmul_bf16_scratch_bytes(int M, int N, int K);
/* A workspace size that covers cllm_matmul_bf16_scratch_bytes(M, N, K) for
 * every M in 1..M_max (0 on the native path): at most max(32 MiB,
 * 64 (M_max + N)) bytes. For callers sized once for a range of rows. */
size_t cllm_matmul_bf16_scratch_bound(int M_max, int N, int K);

/* Describes the CPU and the kernels chosen on it, one "key: value" per
 * line (cpu, cpu features, isa, onednn version and ISA, fp32 gemm, bf16
 * gemm, kernels, decode matvec), into buf (NUL-terminated, truncated to
 * cap). Probes oneDNN on the
 * first call. */
void cllm_kernels_describe(char *buf, size_t cap);
/* The build of the element-wise, norm, attention and loss kernels this
 * process runs: "avx512" (x86-64-v4), "avx2" (x86-64-v3) or "portable",
 * the best that cllm_cpu()->isa allows (CLLM_MAX_ISA lowers it). Every
 * kernel of this header but the GEMMs exists in each build; the choice is
 * made once per process. */
const char *cllm_kernels_variant(void);

/* Linear layer. The weight is kept in the layout its HF file stores:
 *   w_in_out=false: W[OUT,IN] (torch nn.Linear), out = inp @ W^T + b
 *   w_in_out=true:  W[IN,OUT] (GPT-2 Conv1D),    out = inp @ W + b
 * out[N,OUT], inp[N,IN], bias[OUT] or NULL. */
cllm_status cllm_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                                int N, int IN, int OUT, bool w_in_out);
/* dinp[N,IN] += dout @ W ; dweight += dout^T @ inp (in W's layout);
 * dbias[OUT] += column sums of dout. Any gradient pointer may be NULL. */
cllm_status cllm_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IN, int OUT,
                                 bool w_in_out);

/* ------------------------------------------------------------- embedding
 * out[N,C] = wte[tokens[n]] (+ wpe[pos[n]] if wpe != NULL), where
 * pos[n] = n % T (N = B*T rows, positions restart every T rows).
 * Token ids must already be validated against V by the caller. */
void cllm_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int N, int T, int C);
/* dwte[V,C] += scattered dout rows; dwpe[T,C] += dout summed over the batch
 * (dwpe may be NULL). Deterministic: no atomics. */
void cllm_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int N, int T, int C, int V);

/* ------------------------------------------------------------- layernorm
 * out[N,C] = (x - mean) * rstd * weight + bias, statistics in fp32 with the
 * biased variance, as torch.nn.LayerNorm. mean[N], rstd[N] are saved for
 * backward. */
void cllm_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
void cllm_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);

/* --------------------------------------------------------------- rmsnorm
 * out[N,C] = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps), as HF's
 * LlamaRMSNorm in fp32. rstd[N] saved for backward. */
void cllm_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps);
void cllm_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

/* ------------------------------------------------------------------ rope
 * Rotary embedding in HF's rotate-half convention, applied in place to
 * x[B,T,nh,HS] viewed with a row stride: element (b,t,h,i) lives at
 * x[(b*T+t)*row_stride + h*head_stride + i].
 *   y = x * cos + rotate_half(x) * sin,  rotate_half([x1,x2]) = [-x2, x1]
 * cos/sin tables are [T,HS/2] (the first half of HF's duplicated table):
 *   cos[t,i] = cos(t * theta^(-2i/HS)). Build them with cllm_rope_tables().
 * The backward applies the inverse rotation (same call with sign=-1). */
void cllm_rope_tables(float *cos_t, float *sin_t, int T, int HS, float theta);
void cllm_rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int HS,
                     int row_stride, int head_stride, int sign);

/* ------------------------------------------------------------- attention
 * Causal scaled-dot-product attention with grouped-query heads and optional
 * ALiBi, computed blockwise with an online softmax: no T x T matrix is ever
 * stored. Query head h reads key/value head h / (NH/NKV).
 *
 * Layout: each of q, k, v, out is a view of a [B,T,...] activation described
 * by a row stride (elements between consecutive tokens) and a head stride
 * (elements between consecutive heads of one token); element i of head h at
 * token (b,t) is at p[(b*T+t)*rs + h*hs + i]. This lets GPT-2's [Q|K|V]
 * columns, BLOOM's per-head [q,k,v] and LLaMA's separate projections be read
 * in place.
 *
 * scores(t,s) = scale * q_t.k_s + (alibi ? alibi[h] * (s - t) : 0), s <= t
 * lse[B,NH,T] (log-sum-exp of each score row) is saved for backward.
 *
 * HS must be at most CLLM_ATTN_MAX_HS (asserted, not reported: callers check
 * it where the model config is validated). Scratch tiles live on the stack,
 * about 8 * CLLM_ATTN_MAX_HS * 32 floats (~256 KB) per thread in backward.
 * Views must not overlap outputs with inputs; dq/dk/dv may share one fused
 * buffer (disjoint columns). Results are bit-identical for any thread count. */
#define CLLM_ATTN_MAX_HS 256
typedef struct {
    float *p;
    int rs; /* row stride */
    int hs; /* head stride */
} cllm_view;
typedef struct {
    const float *p;
    int rs;
    int hs;
} cllm_cview;

void cllm_attention_forward(cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v,
                            const float *alibi, int B, int T, int NH, int NKV, int HS, float scale);
/* Accumulates into dq, dk, dv (views laid out like q, k, v). dk/dv of a
 * shared key/value head receive the sum over its query heads. Recomputes
 * probabilities blockwise from lse. */
void cllm_attention_backward(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout,
                             cllm_cview out, const float *lse, cllm_cview q, cllm_cview k,
                             cllm_cview v, const float *alibi, int B, int T, int NH, int NKV,
                             int HS, float scale);

/* The same with a sliding window (Mistral/Mixtral sliding_window): query t
 * sees keys t - window < s <= t; window 0 is the whole causal prefix. */
void cllm_attention_forward_window(cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v,
                                   const float *alibi, int B, int T, int NH, int NKV, int HS, float scale,
                                   int window);
void cllm_attention_backward_window(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout,
                                    cllm_cview out, const float *lse, cllm_cview q, cllm_cview k,
                                    cllm_cview v, const float *alibi, int B, int T, int NH, int NKV,
                                    int HS, float scale, int window);

/* HF BLOOM's ALiBi slopes for any head count (including non-powers of two):
 * slopes[NH]. */
void cllm_alibi_slopes(float *slopes, int NH);

/* ------------------------------------------------------------ activations
 * GELU, tanh approximation (torch gelu(approximate="tanh"), HF "gelu_new"
 * / BLOOM's bloom_gelu). out[N] = gelu(inp); dinp[N] += dout * gelu'(inp). */
void cllm_gelu_forward(float *out, const float *inp, long N);
void cllm_gelu_backward(float *dinp, const float *dout, const float *inp, long N);

/* SwiGLU: out[N] = silu(gate) * up. Backward accumulates dgate, dup. */
void cllm_swiglu_forward(float *out, const float *gate, const float *up, long N);
void cllm_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, long N);

/* out[N] = a + b (out may alias a or b). */
void cllm_add(float *out, const float *a, const float *b, long N);

/* ------------------------------------------------- precision conversion
 * dst[N] = bf16(src), round to nearest even (NaN stays NaN, as
 * cllm_f32_to_bf16). dst[N] = the fp16 value nearest src, kept as fp32
 * (round to nearest even, beyond the fp16 range -> +-inf, as
 * cllm_f32_to_f16; dst may alias src). */
void cllm_to_bf16(uint16_t *dst, const float *src, long N);
void cllm_round_f16(float *dst, const float *src, long N);
/* dst[N] = the bf16 value of src (as cllm_to_bf16), kept as fp32; dst may
 * alias src. */
void cllm_round_bf16(float *dst, const float *src, long N);

/* -------------------------------------------------------- cross-entropy
 * Fused softmax + cross-entropy over logits[N,V], working in place so no
 * separate probability tensor exists:
 *   losses[n] = logsumexp(logits[n]) - logits[n, target[n]]   (0 if ignored)
 *   logits[n] is overwritten by dscale * (softmax(logits[n]) - onehot)
 *   (rows with target -100 are overwritten by zeros).
 * Targets other than -100 must be in [0, V) (validated by the caller).
 * Returns the number of counted (non-ignored) rows. */
long cllm_xent_forward_backward(float *losses, float *logits, const int32_t *targets, int N, int V,
                                float dscale);
/* Forward only (evaluation): losses[n] as above, logits untouched. */
long cllm_xent_forward(float *losses, const float *logits, const int32_t *targets, int N, int V);
/* ln sum_v exp(x[v]) over one row of V >= 1 logits, in double (the
 * normaliser of log-probabilities: ln softmax(x)[i] = x[i] - this):
 * max + ln(sum exp(x - max)), exp vectorised (within 2 ulp of fp32's),
 * summed in fp32 blocks of 512 and in double across them. A row whose max
 * is not finite returns that max. Serial (one row per caller). */
double cllm_logsumexp(const float *x, int V);

/* ------------------------------------------- vocabulary-parallel pieces
 * For tensor parallelism: a rank holds the vocabulary rows [v0, v0 + V) of
 * the embedding and of the head, so its logits[N,V] are columns [v0, v0+V)
 * of the whole row. The cross-entropy runs in three passes with two
 * reductions over the tensor group in between (the caller's):
 *   cllm_xent_vp_max:  rmax[n] = max of the local logits   -> all-reduce max
 *   cllm_xent_vp_sum:  st[2n] = sum exp(x - rmax[n]), st[2n+1] = x[target]
 *                      if this rank owns the target, else 0 -> all-reduce sum
 *                      (with `store`, x <- exp(x - rmax[n]) on the way)
 *   cllm_xent_vp_finish: losses as cllm_xent_forward; with logits (after a
 *                      storing sum) the gradient as cllm_xent_forward_backward
 * Rows with target -100 get loss 0 and a zero gradient. */
void cllm_xent_vp_max(float *rmax, const float *logits, int N, int V);
void cllm_xent_vp_sum(double *st, float *logits, const int32_t *targets, const float *rmax, int N, int V, int v0,
                      bool store);
long cllm_xent_vp_finish(float *losses, float *logits, const int32_t *targets, const float *rmax, const double *st,
                         int N, int V, int v0, float dscale);
/* out[n] = wte[tokens[n] - v0] for ids in [v0, v0 + V), zeros otherwise;
 * dwte[id - v0] += dout[n] for the same ids (deterministic, no atomics). */
void cllm_embedding_vp_forward(float *out, const int32_t *tokens, const float *wte, int N, int C, int v0, int V);
void cllm_embedding_vp_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C, int v0, int V);

/* ------------------------------------------- attention over a paged cache
 * Causal attention of new rows against cached keys and values, for
 * incremental decoding of several sequences at once, each at its own
 * position (ragged). The N = rows[n_seq] new rows are packed sequence after
 * sequence: sequence i owns rows rows[i]..rows[i+1]-1, and its row t sits
 * at absolute position past[i] + t and attends keys 0..past[i]+t of its own
 * sequence.
 *   out, q:       views over the N rows as in cllm_attention_forward
 *   kpool, vpool: one layer's blocks [n_blocks, NKV, BS, HS]
 *   table:        [n_seq, max_blocks] block ids: position s of sequence i
 *                 is row s % BS of block table[i * max_blocks + s / BS];
 *                 every position up to the sequence's last new row must be
 *                 filled (the new rows' own keys and values included)
 *   rows:         [n_seq + 1] row offsets (rows[0] = 0); past: [n_seq]
 *   alibi:        [NH] slopes or NULL; the bias is slope * (s - position)
 * A contiguous cache [B, NKV, S, HS] is the case BS = S, table[i] = i.
 * Requires HS <= CLLM_ATTN_MAX_HS, NH % NKV == 0, enough table entries
 * (asserted). No scratch, no lse: inference only. Bit-identical for any
 * thread count. */
void cllm_attention_forward_paged(cllm_view out, cllm_cview q, const float *kpool, const float *vpool,
                                  const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                  const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS,
                                  float scale);

/* The same with a sliding window: the row at position p sees positions
 * p - window < s <= p (window 0: all). The cache still holds every
 * position; the window only limits what a row reads. */
void cllm_attention_forward_paged_window(cllm_view out, cllm_cview q, const float *kpool, const float *vpool,
                                         const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                         const int32_t *past, const float *alibi, int n_seq, int NH, int NKV,
                                         int HS, float scale, int window);

/* The same over a cache that stores keys and values as bf16 (the upper 16
 * bits of the fp32 value): each is widened exactly, products, softmax and
 * sums are fp32, so the output is cllm_attention_forward_paged_window's on
 * the widened values. */
void cllm_attention_forward_paged_bf16(cllm_view out, cllm_cview q, const uint16_t *kpool, const uint16_t *vpool,
                                       const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                       const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS,
                                       float scale, int window);

#ifdef __cplusplus
}
#endif
#endif
