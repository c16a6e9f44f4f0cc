/*
 * PPO's rollout batch, shared by the objective (ppo.c) and the rollout
 * sources (ppo_rollout.c).
 */
#ifndef CLLM_TASKS_PPO_IMPL_H
#define CLLM_TASKS_PPO_IMPL_H

#include "cllm/objective.h"

/* R rollouts as rows of T tokens: query then response, then padding. Per
 * token arrays are indexed by target position (row * T + t, the position
 * that predicts token t + 1), as cllm_token_io's are. */
typedef struct {
    int R, T, cap_R, cap_T;
    int32_t *tokens, *labels; /* [R*T]: labels -100 on the query and the padding */
    int *q_len, *r_len;       /* [R] */
    float *score;             /* [R] */
    float *old_lp, *old_v, *ref_lp; /* [R*T] */
    bool have_lp, have_v, have_ref; /* given by the source (else computed) */
} ppo_batch;

/* Sizes the batch for R rows of T tokens (reallocating when larger). */
cllm_status ppo_batch_reserve(ppo_batch *b, int R, int T);
void ppo_batch_free(ppo_batch *b);
/* Fills rows [0, R) with rollouts first, first + 1, ... of the source's
 * stream (file records, or prompts answered by `policy`); pad is the pad
 * token id. */
cllm_status ppo_source_fill(cllm_ppo_source *s, cllm_model *policy, const cllm_ppo_params *p, uint64_t first,
                            ppo_batch *b, int32_t pad);
/* The policy's whole parameters from on until off, when they are
 * partitioned (the lender of cllm_ppo_source_set_lender; collective);
 * otherwise nothing. */
cllm_status ppo_source_lend(cllm_ppo_source *s, bool on);
/* trl's kl_penalty "full": at every response position n of the batch,
 * out[n] = sum_v p(v) (log p(v) - log q(v)) for the next-token
 * distributions p of the policy and q of the reference (logits from the
 * key/value-cache forward of query + response); ref NULL: the policy with
 * its LoRA adapters disabled. */
cllm_status ppo_full_kl(const ppo_batch *b, cllm_model *policy, cllm_model *ref, float *out);

#endif
