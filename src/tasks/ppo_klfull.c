/*
 * PPO's kl_penalty "full" (trl's F.kl_div(ref_logprob, logprob,
 * log_target=True).sum(-1) over the whole vocabulary): the policy and the
 * reference each run query + response through a key/value cache, side by
 * side, and every response position's two next-token distributions give
 * KL(policy || reference). Without a reference model (LoRA) the reference
 * is the policy with its adapters disabled, in a cache of its own.
 */
#include <math.h>
#include <stdlib.h>

#include "cllm/generate.h"
#include "cllm/lora.h"
#include "ppo_impl.h"

/* sum_v p (log p - log q), p = softmax(a), q = softmax(b), in double. */
static double kl_of_logits(const float *a, const float *b, int V) {
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, s = 0;
    for (int v = 0; v < V; v++) {
        ma = fmax(ma, a[v]);
        mb = fmax(mb, b[v]);
    }
    for (int v = 0; v < V; v++) {
        za += exp((double)a[v] - ma);
        zb += exp((double)b[v] - mb);
    }
    const double la0 = ma + log(za), lb0 = mb + log(zb);
    for (int v = 0; v < V; v++) {
        double la = (double)a[v] - la0, lb = (double)b[v] - lb0;
        s += exp(la) * (la - lb);
    }
    return s;
}

/* The reference's next-token logits after n more tokens; base: the policy,
 * run with its adapters disabled. */
static cllm_status ref_forward(cllm_kv_cache *kv, cllm_model *base, const int32_t *ids, int n, float *logits) {
    if (base) cllm_lora_set_enabled(base, false);
    cllm_status st = cllm_kv_cache_forward(kv, ids, n, logits);
    if (base) cllm_lora_set_enabled(base, true);
    return st;
}

cllm_status ppo_full_kl(const ppo_batch *b, cllm_model *policy, cllm_model *ref, float *out) {
    const int T = b->T, V = cllm_model_get_config(policy)->vocab_size;
    cllm_model *base = ref ? NULL : policy;
    if (!ref && !cllm_lora_attached(policy))
        return CLLM_FAIL(CLLM_ERR_ARG, "ppo.kl_penalty \"full\": no reference model and no LoRA adapters to disable");
    if (!ref) ref = policy;
    if (cllm_model_get_config(ref)->vocab_size != V)
        return CLLM_FAIL(CLLM_ERR_ARG, "ppo.kl_penalty \"full\": the reference's vocabulary (%d) is not the "
                         "policy's (%d)", cllm_model_get_config(ref)->vocab_size, V);
    cllm_kv_cache *kp = NULL, *kq = NULL;
    float *lp = malloc((size_t)V * sizeof *lp), *lq = malloc((size_t)V * sizeof *lq);
    cllm_status st = lp && lq ? cllm_kv_cache_init(&kp, policy, 1, T, 0) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) st = cllm_kv_cache_init(&kq, ref, 1, T, 0);
    for (int r = 0; r < b->R && !st; r++) {
        const int32_t *row = b->tokens + (size_t)r * T;
        const int nq = b->q_len[r], nr = b->r_len[r];
        st = cllm_kv_cache_rewind(kp, 0);
        if (!st) st = cllm_kv_cache_rewind(kq, 0);
        if (!st) st = cllm_kv_cache_forward(kp, row, nq, lp);
        if (!st) st = ref_forward(kq, base, row, nq, lq);
        for (int i = 0; i < nr && !st; i++) {
            out[(size_t)r * T + (size_t)(nq - 1 + i)] = (float)kl_of_logits(lp, lq, V);
            if (i + 1 < nr) {
                st = cllm_kv_cache_forward(kp, row + nq + i, 1, lp);
                if (!st) st = ref_forward(kq, base, row + nq + i, 1, lq);
            }
        }
    }
    cllm_kv_cache_free(kp);
    cllm_kv_cache_free(kq);
    free(lp);
    free(lq);
    return st ? cllm_fail_context(st, "ppo.kl_penalty \"full\"") : CLLM_OK;
}
