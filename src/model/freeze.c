/*
 * Frozen tensors by name (cllm_model_freeze): the training config's
 * "freeze" list. Each pattern is a regular expression searched in the
 * tensor names of the model's safetensors, as the usual PyTorch recipe
 * `if re.search(pattern, name): p.requires_grad = False` does; the tensors
 * left train, through the trainable set (trainable.c), which gives them
 * alone gradients and optimizer state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lora/lora_impl.h"
#include "model_impl.h"

/* frozen[t] for each tensor of m; every pattern must match one. */
static cllm_status match(const cllm_model *m, const char *const *pat, int n, bool *frozen) {
    if (n <= 0) return CLLM_FAIL(CLLM_ERR_ARG, "freeze: no patterns");
    cllm_status st = CLLM_OK;
    for (int p = 0; p < n && !st; p++) {
        if (!pat[p] || !*pat[p]) return CLLM_FAIL(CLLM_ERR_ARG, "freeze: pattern %d is empty", p);
        /* a search: the whole name matches .*(?:pattern).* */
        size_t len = strlen(pat[p]) + 16;
        char *full = malloc(len);
        if (!full) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        snprintf(full, len, ".*(?:%s).*", pat[p]);
        lora_regex re;
        st = lora_regex_compile(&re, full, false);
        free(full);
        if (st) return cllm_fail_context(st, "freeze: pattern '%s'", pat[p]);
        int hits = 0;
        for (int t = 0; t < m->n_tensors; t++)
            if (lora_regex_match(&re, m->tensors[t].name)) {
                frozen[t] = true;
                hits++;
            }
        lora_regex_free(&re);
        if (!hits)
            st = CLLM_FAIL(CLLM_ERR_ARG, "freeze: pattern '%s' matches no tensor of the model (names as in its "
                           "safetensors, e.g. '%s')", pat[p], m->tensors[0].name);
    }
    int left = 0;
    for (int t = 0; t < m->n_tensors && !st; t++) left += !frozen[t];
    if (!st && !left) st = CLLM_FAIL(CLLM_ERR_ARG, "freeze: the patterns freeze every tensor: nothing would train");
    return st;
}

cllm_status cllm_model_freeze(cllm_model *m, const char *const *patterns, int n) {
    bool *frozen = calloc((size_t)m->n_tensors, sizeof *frozen);
    cllm_trainable_spec *spec = calloc((size_t)m->n_tensors, sizeof *spec);
    cllm_status st = frozen && spec ? match(m, patterns, n, frozen) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int t = 0; t < m->n_tensors && !st; t++)
        if (!frozen[t]) spec[k++] = (cllm_trainable_spec){.name = m->tensors[t].name, .base = t};
    if (!st) st = cllm_model_set_trainable(m, spec, k);
    free(frozen);
    free(spec);
    return st;
}

cllm_status cllm_model_config_freeze(const struct json_t *config, const char *const *patterns, int n, size_t *len,
                                     size_t *numel) {
    cllm_model *m = NULL;
    cllm_status st = model_from_config_ex(&m, config, "config", false);
    if (st) return st;
    bool *frozen = calloc((size_t)m->n_tensors, sizeof *frozen);
    st = frozen ? match(m, patterns, n, frozen) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    *len = *numel = 0;
    for (int t = 0; t < m->n_tensors && !st; t++)
        if (!frozen[t]) { /* as the trainable set lays its copies out: 64-byte aligned, back to back */
            *len += (m->tensors[t].numel + 15) & ~(size_t)15;
            *numel += m->tensors[t].numel;
        }
    free(frozen);
    cllm_model_free(m);
    return st;
}
