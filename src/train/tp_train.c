/*
 * Tensor parallelism in the trainer: the groups, this rank's part of the
 * model, the tensors left out of the gradient norm, and the whole model
 * gathered back for saving. The forward and backward passes over the part
 * are the model's (src/model/tp.c); the data-parallel machinery (zero.c)
 * runs unchanged over the data group, on the part's flat buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/split.h"
#include "train_impl.h"

struct train_tp {
    cllm_model *whole; /* the model as loaded; refilled by train_tp_gather */
    cllm_dist_group *tp_grp, *data_grp, *model_grp;
    int rank, size;
};

static cllm_status make_group(cllm_dist_group **g, const cllm_topo *topo, cllm_axis axis) {
    int n = topo->dims[axis];
    int *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_topo_group(topo, axis, ranks);
    cllm_status st = cllm_dist_group_init(g, ranks, n);
    free(ranks);
    return st;
}

cllm_status train_tp_init(train_tp **out, cllm_model **m, const cllm_topo *topo) {
    train_tp *t = calloc(1, sizeof *t);
    *out = t;
    if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    t->size = topo->dims[CLLM_AXIS_TENSOR];
    t->rank = topo->coord[CLLM_AXIS_TENSOR];
    /* groups first: their creation is collective over the world, so every
     * rank gets there even when the model then cannot be cut */
    cllm_status st = make_group(&t->tp_grp, topo, CLLM_AXIS_TENSOR);
    if (!st) st = make_group(&t->data_grp, topo, CLLM_AXIS_DATA);
    if (st) return st;
    /* the ranks of one model replica: every pipe and tensor coordinate, this data coordinate */
    int P = topo->dims[CLLM_AXIS_PIPE], *ranks = calloc((size_t)P * (size_t)t->size, sizeof *ranks);
    if (!ranks) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int c[CLLM_AXIS_COUNT];
    memcpy(c, topo->coord, sizeof c);
    for (int p = 0; p < P; p++)
        for (int r = 0; r < t->size; r++) {
            c[CLLM_AXIS_PIPE] = p;
            c[CLLM_AXIS_TENSOR] = r;
            ranks[p * t->size + r] = cllm_topo_rank_of(topo, c);
        }
    st = cllm_dist_group_init(&t->model_grp, ranks, P * t->size);
    free(ranks);
    if (st) return st;
    cllm_model *part = NULL;
    if ((st = cllm_tp_model_part(&part, *m, t->size, t->rank)))
        return cllm_fail_context(st, "model_topo.process_topology: tensor axis %d", t->size);
    if ((st = cllm_model_set_tensor_parallel(part, t->tp_grp, t->rank, t->size))) {
        cllm_model_free(part);
        return st;
    }
    t->whole = *m;
    *m = part;
    return CLLM_OK;
}

void train_tp_free(train_tp *t) {
    if (!t) return;
    cllm_model_free(t->whole);
    cllm_dist_group_free(t->tp_grp);
    cllm_dist_group_free(t->data_grp);
    cllm_dist_group_free(t->model_grp);
    free(t);
}

const cllm_dist_group *train_tp_group(const train_tp *t) { return t->tp_grp; }
const cllm_dist_group *train_tp_data_group(const train_tp *t) { return t->data_grp; }
const cllm_dist_group *train_tp_model_group(const train_tp *t) { return t->model_grp; }
bool train_tp_is_first(const train_tp *t) { return t->rank == 0; }

cllm_status train_tp_norm_skip(const train_tp *t, const cllm_model *part, cllm_param_range **out, int *n) {
    *out = NULL;
    *n = 0;
    if (t->rank == 0) return CLLM_OK;
    int nt = cllm_model_n_tensors(t->whole);
    cllm_param_range *r = calloc((size_t)nt, sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++) {
        if (cllm_tp_rule_of(t->whole, i).cut != CLLM_TP_REPLICATE) continue;
        const cllm_tensor_info *ti = cllm_model_tensor(part, i);
        r[(*n)++] = (cllm_param_range){ti->offset, ti->offset + ti->numel, false};
    }
    *out = r;
    return CLLM_OK;
}

const cllm_model *train_tp_whole(const train_tp *t) { return t->whole; }

cllm_status train_tp_gather(train_tp *t, const cllm_model *part, cllm_model **whole, float *repl_diff) {
    *whole = t->whole;
    return cllm_tp_model_gather(t->whole, part, t->tp_grp, repl_diff);
}

cllm_status train_tp_sequence_parallel(cllm_model *m, const cllm_topo *topo, const cllm_train_config *c) {
    if (!c->sequence_parallel) return CLLM_OK;
    const int tp = topo->dims[CLLM_AXIS_TENSOR];
    if (tp <= 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence_parallel needs tensor parallelism: a \"tensor\" axis > 1 in "
                         "model_topo.process_topology");
    if (c->seq_len % tp)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence_parallel: data.seq_len %d is not divisible by the tensor axis %d",
                         c->seq_len, tp);
    cllm_status st = cllm_model_set_sequence_parallel(m, true);
    if (st) return cllm_fail_context(st, "sequence_parallel");
    if (c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0) {
        const cllm_model_config *mc = cllm_model_get_config(m);
        const int B = (int)c->train_micro_batch_size_per_gpu, T = c->seq_len;
        cllm_act_bytes on, off;
        cllm_model_activation_bytes_sp(mc, B, T, true, c->use_grad_ckpt, tp, &on);
        cllm_model_activation_bytes_sp(mc, B, T, true, c->use_grad_ckpt, 1, &off);
        fprintf(stderr, "cllm train: sequence parallelism on over the %d tensor ranks: norms, residual adds and the "
                "embedding output on %d of %d positions per rank (all-gather / reduce-scatter around the tensor-parallel "
                "linears); activations %.2f MB per rank (%.2f MB without)\n",
                tp, T / tp, T, (double)on.total / 1e6, (double)off.total / 1e6);
    }
    return CLLM_OK;
}
