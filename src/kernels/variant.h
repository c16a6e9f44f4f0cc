/*
 * Kernel variants: every kernel file of this directory except matmul.c is
 * compiled once per ISA level (portable, and on x86-64 also avx2 =
 * x86-64-v3 and avx512 = x86-64-v4), with CLLM_KV naming the level. This
 * header, included first by each of those files, renames the public kernels
 * to NAME_<level> (declarations in cllm/kernels.h included after it follow
 * the rename), and dispatch.c defines the public names, calling the variant
 * that cllm_cpu() allows. A new public kernel in these files is added here
 * and to dispatch.c's list.
 */
#ifndef CLLM_KERNEL_VARIANT_H
#define CLLM_KERNEL_VARIANT_H
#ifndef CLLM_KV
#error "kernel files are compiled through the variant targets (CLLM_KV=portable|avx2|avx512)"
#endif
#define KV_CAT_(a, b) a##_##b
#define KV_CAT(a, b) KV_CAT_(a, b)

#define cllm_alibi_slopes KV_CAT(cllm_alibi_slopes, CLLM_KV)
#define cllm_attention_forward_window KV_CAT(cllm_attention_forward_window, CLLM_KV)
#define cllm_attention_backward_window KV_CAT(cllm_attention_backward_window, CLLM_KV)
#define cllm_attention_forward_paged_window KV_CAT(cllm_attention_forward_paged_window, CLLM_KV)
#define cllm_attention_forward_paged_bf16 KV_CAT(cllm_attention_forward_paged_bf16, CLLM_KV)
#define cllm_add KV_CAT(cllm_add, CLLM_KV)
#define cllm_to_bf16 KV_CAT(cllm_to_bf16, CLLM_KV)
#define cllm_round_f16 KV_CAT(cllm_round_f16, CLLM_KV)
#define cllm_round_bf16 KV_CAT(cllm_round_bf16, CLLM_KV)
#define cllm_embedding_forward KV_CAT(cllm_embedding_forward, CLLM_KV)
#define cllm_embedding_backward KV_CAT(cllm_embedding_backward, CLLM_KV)
#define cllm_gelu_forward KV_CAT(cllm_gelu_forward, CLLM_KV)
#define cllm_gelu_backward KV_CAT(cllm_gelu_backward, CLLM_KV)
#define cllm_layernorm_forward KV_CAT(cllm_layernorm_forward, CLLM_KV)
#define cllm_layernorm_backward KV_CAT(cllm_layernorm_backward, CLLM_KV)
#define cllm_rmsnorm_forward KV_CAT(cllm_rmsnorm_forward, CLLM_KV)
#define cllm_rmsnorm_backward KV_CAT(cllm_rmsnorm_backward, CLLM_KV)
#define cllm_rope_tables KV_CAT(cllm_rope_tables, CLLM_KV)
#define cllm_rope_apply KV_CAT(cllm_rope_apply, CLLM_KV)
#define cllm_swiglu_forward KV_CAT(cllm_swiglu_forward, CLLM_KV)
#define cllm_swiglu_backward KV_CAT(cllm_swiglu_backward, CLLM_KV)
#define cllm_xent_vp_max KV_CAT(cllm_xent_vp_max, CLLM_KV)
#define cllm_xent_vp_sum KV_CAT(cllm_xent_vp_sum, CLLM_KV)
#define cllm_xent_vp_finish KV_CAT(cllm_xent_vp_finish, CLLM_KV)
#define cllm_embedding_vp_forward KV_CAT(cllm_embedding_vp_forward, CLLM_KV)
#define cllm_embedding_vp_backward KV_CAT(cllm_embedding_vp_backward, CLLM_KV)
#define cllm_xent_forward_backward KV_CAT(cllm_xent_forward_backward, CLLM_KV)
#define cllm_xent_forward KV_CAT(cllm_xent_forward, CLLM_KV)
#define cllm_logsumexp KV_CAT(cllm_logsumexp, CLLM_KV)

/* Below this many values an elementwise or per-row pass runs on the calling
 * thread: waking the thread team and meeting it at the barrier costs more
 * than the work (a decode step's norms, residual adds and activations are a
 * few thousand values, several per layer), and a barrier with a thread that
 * lost its core waits out that thread's time slice. */
#define CLLM_PAR_MIN 32768L
#endif
