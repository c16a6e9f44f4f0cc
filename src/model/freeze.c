/*
 * Frozen tensors by name: the training config's "freeze" (cllm_model_freeze:
 * each pattern a regular expression searched in the tensor names, as the
 * usual PyTorch recipe `if re.search(pattern, name): p.requires_grad =
 * False` does) and its inverse "unfrozen_parameters" (cllm_model_freeze_except:
 * axolotl's key and rule, the patterns name the tensors that train, each
 * matched from the start of the name with "." literal). The tensors left
 * train through the trainable set (trainable.c), which gives them alone
 * gradients and optimizer state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lora/lora_impl.h"
#include "model_impl.h"

/* frozen[t] for each tensor of m: matched by a pattern, or (except) by
 * none. Every pattern must match a tensor, and something must be frozen
 * and something train. */
static cllm_status match(const cllm_model *m, const char *const *pat, int n, bool except, bool *frozen) {
    const char *key = except ? "unfrozen_parameters" : "freeze";
    if (n <= 0) return CLLM_FAIL(CLLM_ERR_ARG, "%s: no patterns", key);
    bool *hit = calloc((size_t)m->n_tensors, sizeof *hit);
    if (!hit) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = CLLM_OK;
    for (int p = 0; p < n && !st; p++) {
        if (!pat[p] || !*pat[p]) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "%s: pattern %d is empty", key, p);
            break;
        }
        /* the whole name matches .*(?:pattern).* (a search), or (except)
         * (?:pattern).* with each "." escaped (a match at the start) */
        size_t len = 2 * strlen(pat[p]) + 16, o = 0;
        char *full = malloc(len);
        if (!full) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        o += (size_t)snprintf(full, len, "%s", except ? "(?:" : ".*(?:");
        for (const char *c = pat[p]; *c; c++) {
            if (except && *c == '.') full[o++] = '\\';
            full[o++] = *c;
        }
        snprintf(full + o, len - o, ").*");
        lora_regex re;
        st = lora_regex_compile(&re, full, false);
        free(full);
        if (st) {
            st = cllm_fail_context(st, "%s: pattern '%s'", key, pat[p]);
            break;
        }
        int hits = 0;
        for (int t = 0; t < m->n_tensors; t++)
            if (lora_regex_match(&re, m->tensors[t].name)) {
                hit[t] = true;
                hits++;
            }
        lora_regex_free(&re);
        if (!hits)
            st = CLLM_FAIL(CLLM_ERR_ARG, "%s: pattern '%s' matches no tensor of the model (names as in its "
                           "safetensors, e.g. '%s')", key, pat[p], m->tensors[0].name);
    }
    int nf = 0;
    for (int t = 0; t < m->n_tensors; t++) nf += frozen[t] = hit[t] != except;
    free(hit);
    if (!st && nf == m->n_tensors)
        st = CLLM_FAIL(CLLM_ERR_ARG, "%s: the patterns freeze every tensor: nothing would train", key);
    if (!st && nf == 0)
        st = CLLM_FAIL(CLLM_ERR_ARG, "%s: the patterns name every tensor: nothing is frozen", key);
    return st;
}

static cllm_status freeze(cllm_model *m, const char *const *patterns, int n, bool except) {
    bool *frozen = calloc((size_t)m->n_tensors, sizeof *frozen);
    cllm_trainable_spec *spec = calloc((size_t)m->n_tensors, sizeof *spec);
    cllm_status st = frozen && spec ? match(m, patterns, n, except, frozen) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int t = 0; t < m->n_tensors && !st; t++)
        if (!frozen[t]) spec[k++] = (cllm_trainable_spec){.name = m->tensors[t].name, .base = t};
    if (!st) st = cllm_model_set_trainable(m, spec, k);
    free(frozen);
    free(spec);
    return st;
}

cllm_status cllm_model_freeze(cllm_model *m, const char *const *patterns, int n) {
    return freeze(m, patterns, n, false);
}

cllm_status cllm_model_freeze_except(cllm_model *m, const char *const *patterns, int n) {
    return freeze(m, patterns, n, true);
}

cllm_status cllm_model_config_freeze(const struct json_t *config, const char *const *patterns, int n, bool except,
                                     size_t *len, size_t *numel) {
    cllm_model *m = NULL;
    cllm_status st = model_from_config_ex(&m, config, "config", false);
    if (st) return st;
    bool *frozen = calloc((size_t)m->n_tensors, sizeof *frozen);
    st = frozen ? match(m, patterns, n, except, frozen) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
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
