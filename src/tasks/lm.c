/*
 * The causal language-modelling objective and the objective dispatch (see
 * cllm/objective.h): the loss sum of every counted target, the model's
 * fused head + cross-entropy doing the work.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/objective.h"
#include "pair_metrics.h"

static cllm_status lm_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                          float grad_scale, double *loss_sum, long *n_counted) {
    (void)o;
    return cllm_model_forward_backward(m, b->tokens, b->targets, b->B, b->T, backward, grad_scale, loss_sum,
                                       n_counted);
}

static void lm_free(cllm_objective *o) { free(o); }

static const cllm_objective_ops lm_ops = {"lm", lm_run, lm_free, NULL, NULL, NULL, NULL, NULL};

cllm_status cllm_objective_lm_init(cllm_objective **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    (*out)->ops = &lm_ops;
    return CLLM_OK;
}

cllm_status cllm_objective_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                               float grad_scale, double *loss_sum, long *n_counted) {
    return o->ops->run(o, m, b, backward, grad_scale, loss_sum, n_counted);
}

int cllm_objective_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return o && o->ops->take_metrics ? o->ops->take_metrics(o, out, cap) : 0;
}

int cllm_objective_take_eval_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return o && o->ops->take_eval_metrics ? o->ops->take_eval_metrics(o, out, cap) : 0;
}

int pair_metrics_take(pair_metrics *a, const char *const *names, int count, cllm_objective_metric *out, int cap) {
    int n = 0;
    for (int i = 0; i < count && i < PAIR_METRICS_MAX && n < cap && a->n_pairs > 0; i++, n++) {
        out[n].name = names[i];
        out[n].value = a->sums[i] / (double)a->n_pairs;
    }
    memset(a, 0, sizeof *a);
    return n;
}

bool cllm_objective_has_rows(const cllm_objective *o) { return o && o->ops->rows; }

cllm_status cllm_objective_rows(cllm_objective *o, cllm_model *m, long step, int n, int T, int32_t *tokens,
                                int32_t *labels) {
    return o->ops->rows(o, m, step, n, T, tokens, labels);
}

const char *cllm_objective_name(const cllm_objective *o) { return o->ops->name; }

int cllm_objective_get_state(const cllm_objective *o, long next_step, double *out, int cap) {
    return o && o->ops->get_state ? o->ops->get_state(o, next_step, out, cap) : 0;
}

cllm_status cllm_objective_set_state(cllm_objective *o, const double *v, int n) {
    if (!o || !o->ops->set_state)
        return n ? CLLM_FAIL(CLLM_ERR_FORMAT, "the checkpoint holds %d numbers of objective state, task \"%s\" keeps "
                             "none", n, o ? o->ops->name : "lm") : CLLM_OK;
    return o->ops->set_state(o, v, n);
}

void cllm_objective_free(cllm_objective *o) {
    if (o) o->ops->free(o);
}
