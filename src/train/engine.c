/*
 * The training loop (see cllm/train.h): opening model and data, resuming,
 * the step (micro-batches through the objective (cllm/objective.h) ->
 * gradient reduction -> unscale -> clip -> optimizer), evaluation and
 * checkpoints. What differs by parallel layout is behind two strategy
 * objects (step_modes.c: how micro-batches run, local or pipelined; where
 * gradients and optimizer state live, replicated or sharded); the progress
 * line and metrics records are written by report.c; the checkpoints of
 * tensor-parallel and sliced-expert runs by engine_parts.c.
 *
 * The data position is one integer: sample g of the loader's stream for
 * row i of rank r at a step that starts at position G0 is
 * g = G0 + r * local_batch + i, and every step advances G0 by
 * train_batch_size. A resumed run restores G0 and continues the same stream.
 * Not here: config parsing (config*.c), file formats (checkpoint.c).
 */
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cllm/chat_template.h"
#include "cllm/checkpoint.h"
#include "cllm/dist.h"
#include "cllm/io.h"
#include "cllm/loader.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/objective.h"
#include "cllm/split.h"
#include "engine_impl.h"

static atomic_int stop_requested; /* lock-free on every target: safe from a handler too */

void cllm_train_request_stop(void) { atomic_store(&stop_requested, 1); }


/* ------------------------------------------------------------ set-up */

static bool task_is(const cllm_train_config *c, const char *t) { return c->task && strcmp(c->task, t) == 0; }

/* The starting weights: the model folder or a new model by the init spec. */
static cllm_status open_start(trainer *tr);
static cllm_status train_freeze_open(trainer *tr, const char *resume_dir);

/* A LoRA run: the base from the model (a checkpoint holds only the
 * adapters), then the adapters (lora_train.c); task "reward" turns a
 * causal LM into its reward model first, so that the adapters are those of
 * the reward model's layers and its score head trains beside them (PEFT's
 * task_type SEQ_CLS). */
static cllm_status open_model(trainer *tr, const char *resume_dir) {
    if (train_lora_run(tr->cfg)) {
        cllm_status st = open_start(tr);
        if (!st && task_is(tr->cfg, "reward")) st = train_lora_to_reward(tr);
        return st ? st : train_lora_attach(tr->m, tr->cfg, resume_dir);
    }
    if (tr->cfg->n_freeze) return train_freeze_open(tr, resume_dir);
    if (resume_dir) {
        cllm_status st = cllm_ckpt_load_model(&tr->m, resume_dir); /* either checkpoint format */
        return st || !task_is(tr->cfg, "ppo") ? st : cllm_model_add_value_head(&tr->m, tr->cfg->seed);
    }
    return open_start(tr);
}

static cllm_status open_start_weights(trainer *tr);

/* Frozen tensors ("freeze"): the start's, always (they never change); a
 * checkpoint holds the trainable buffer, the tensors that train. */
static cllm_status train_freeze_open(trainer *tr, const char *resume_dir) {
    cllm_train_config *c = tr->cfg;
    cllm_status st = open_start(tr);
    if (!st)
        st = c->freeze_except ? cllm_model_freeze_except(tr->m, c->freeze, c->n_freeze)
                              : cllm_model_freeze(tr->m, c->freeze, c->n_freeze);
    if (!st && resume_dir)
        st = cllm_ckpt_read_range(resume_dir, tr->m, CLLM_CKPT_PARAMS, 0, cllm_model_trainable_len(tr->m),
                                  cllm_model_trainable_params(tr->m));
    if (!st) cllm_model_params_updated(tr->m);
    return st ? cllm_fail_context(st, "%s", resume_dir ? "resuming the trained tensors" : "freezing tensors") : CLLM_OK;
}

/* PPO's policy carries a value head (before any adapters go on). */
static cllm_status open_start(trainer *tr) {
    cllm_status st = open_start_weights(tr);
    if (!st && task_is(tr->cfg, "ppo")) st = cllm_model_add_value_head(&tr->m, tr->cfg->seed);
    return st;
}

static cllm_status open_start_weights(trainer *tr) {
    cllm_train_config *c = tr->cfg;
    if (c->quant.enabled) { /* QLoRA: the base's linear layers quantized while loading */
        if (!train_lora_run(c))
            return CLLM_FAIL(CLLM_ERR_ARG, "quantization: a quantized base is frozen and trains only with LoRA "
                             "adapters: add a \"lora\" section (--lora-r) or --adapter");
        if (!c->model_dir)
            return CLLM_FAIL(CLLM_ERR_ARG, "quantization: needs \"model\" to be an HF folder (--model)");
        return cllm_model_load_quantized(&tr->m, c->model_dir, &c->quant);
    }
    if (c->model_dir) return cllm_model_load(&tr->m, c->model_dir);
    const cllm_model_init_spec *mi = &c->model_init;
    if (!c->has_model_init)
        return CLLM_FAIL(CLLM_ERR_ARG, "no model: set \"model\" (an HF folder or an init spec) or --model");
    json_t *conf = NULL;
    cllm_status st = cllm_model_preset(&conf, mi->arch, mi->preset);
    if (st) return st;
    if (mi->set) json_object_update(conf, mi->set);
    st = cllm_model_init_random(&tr->m, conf, mi->has_seed ? mi->seed : c->seed);
    json_decref(conf);
    return st;
}

static cllm_status open_data(trainer *tr) {
    cllm_train_config *c = tr->cfg;
    if (task_is(c, "ppo") && c->ppo_rollouts) {
        if (c->data_train || c->data_eval || c->splits)
            return CLLM_FAIL(CLLM_ERR_ARG, "ppo.rollouts (--rollouts): the rollouts are the training data; leave "
                             "data.train, data.eval and data.splits unset");
        return CLLM_OK;
    }
    if (!c->data_train) return CLLM_FAIL(CLLM_ERR_ARG, "no training data: set data.train (or --data)");
    if (task_is(c, "ppo") && (c->data_eval || c->splits))
        return CLLM_FAIL(CLLM_ERR_ARG, "task \"ppo\": no evaluation (it trains on its own rollouts); leave data.eval "
                         "and data.splits unset");
    /* Training always reads the "train" split: all of a dataset without
     * split weights, and never the valid/test documents of one prepared
     * with --split. Raw text is tokenized with data.tokenizer, else with the
     * model folder's tokenizer. */
    cllm_loader_opts o = {.spec = c->data_train,
                          .tokenizer = c->tokenizer ? c->tokenizer : c->model_dir,
                          .seq_len = c->seq_len,
                          .vocab_size = cllm_model_get_config(tr->m)->vocab_size,
                          .shuffle = c->shuffle,
                          .seed = c->seed,
                          .split = "train",
                          .splits = c->splits,
                          .skip_bad = c->skip_bad,
                          .pairs = c->task && (strcmp(c->task, "dpo") == 0 || strcmp(c->task, "reward") == 0)};
    cllm_status st = cllm_loader_open(&tr->train, &o);
    if (st) return st;
    if (c->data_eval || c->splits) {
        o.spec = c->data_eval ? c->data_eval : c->data_train;
        o.split = c->data_eval ? NULL : "valid";
        o.shuffle = false;
        if ((st = cllm_loader_open(&tr->eval, &o))) return cllm_fail_context(st, "eval data");
    }
    return CLLM_OK;
}

/* Weight-decay ranges: biases and norm weights are skipped by default
 * (weight_decay_skip); everything else decays. */
static cllm_status make_ranges(trainer *tr) {
    int nt = cllm_model_n_trainable(tr->m);
    tr->ranges = calloc(nt > 0 ? (size_t)nt : 1, sizeof *tr->ranges);
    if (!tr->ranges) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *t = cllm_model_trainable(tr->m, i);
        size_t len = strlen(t->name);
        bool is_bias = len >= 5 && strcmp(t->name + len - 5, ".bias") == 0;
        bool skip = t->no_decay && (is_bias ? tr->cfg->decay_skip_bias : tr->cfg->decay_skip_norm);
        tr->ranges[i] = (cllm_param_range){t->offset, t->offset + t->numel, !skip};
    }
    tr->n_ranges = nt;
    return CLLM_OK;
}

static cllm_status resume_from(trainer *tr, const char *dir) {
    cllm_status st = cllm_ckpt_read_state(dir, &tr->state);
    if (st) return st;
    if (strcmp(tr->state.optimizer, cllm_opt_name(tr->cfg->optim.type)) != 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "checkpoint %s was written by optimizer %s, the config asks for %s", dir,
                         tr->state.optimizer, cllm_opt_name(tr->cfg->optim.type));
    /* only this rank's slice of the state, whatever world size or stage
     * wrote the checkpoint (the flat layout is the same for all) */
    float *s0 = cllm_optim_state(tr->opt, 0), *s1 = cllm_optim_state(tr->opt, 1);
    if (tr->offload && (st = train_offload_map(tr->offload, true, &s0, &s1))) return st;
    if (tr->tp)
        st = train_tp_read_optim(tr, dir, s0, s1);
    else if (tr->ep_sliced)
        st = train_ep_read_optim(tr, dir, s0, s1);
    else
        st = cllm_ckpt_read_optim_range(dir, tr->m, s0, s1, tr->base + tr->zero.begin, tr->base + tr->zero.end);
    train_offload_unmap(tr->offload);
    if (st) return st;
    cllm_optim_set_step_count(tr->opt, tr->state.optim_step);
    /* (tensor parallelism: the replicated tensors' state came with the cut parts) */
    if (tr->shard && (st = train_shard_ckpt_load(tr->shard, tr->tp ? NULL : dir, tr->state.optim_step))) return st;
    uint64_t h = cllm_train_config_hash(tr->cfg);
    if (h != tr->state.config_hash)
        cllm_log(CLLM_LOG_WARN, "resume: the optimizer, schedule, batch or data settings differ from those of %s; "
                 "continuing with the new ones", dir);
    if (tr->state.data_seed != tr->cfg->seed)
        cllm_log(CLLM_LOG_WARN, "resume: seed %llu differs from the checkpoint's %llu: the data order changes",
                 (unsigned long long)tr->cfg->seed, (unsigned long long)tr->state.data_seed);
    return CLLM_OK;
}

/* --------------------------------------------------------------- eval */

static cllm_status run_eval(trainer *tr, long step) {
    tr->last_eval_step = step; /* on every rank: the final evaluation is collective with a pipeline */
    /* rank 0 evaluates alone; with tensor parallelism, with its tensor
     * group; with a pipeline, the stages of the first data replica pass the
     * batches on, forward only, and the last stage's loss is shared; at
     * ZeRO-3 every rank takes part in the parameter gathers (and computes
     * the same batches) */
    bool evaluates = tr->zero.stage == 3 ||
                     /* sliced experts: rank 0's expert-parallel group, on the same batches */
                     (tr->ep_sliced && cllm_dist_rank() < cllm_model_expert_parallel_size(tr->m)) ||
                     (tr->pipe ? tr->topo.coord[CLLM_AXIS_DATA] == 0
                      : tr->tp ? tr->topo.coord[CLLM_AXIS_DATA] + tr->topo.coord[CLLM_AXIS_PIPE] == 0
                               : cllm_dist_rank() == 0);
    if (!tr->eval || !evaluates) return CLLM_OK;
    double t0 = cllm_time_sec();
    long B = tr->cfg->train_micro_batch_size_per_gpu;
    int T = tr->cfg->seq_len;
    uint64_t n = cllm_loader_size(tr->eval);
    uint64_t batches = (n + (uint64_t)B - 1) / (uint64_t)B;
    if (tr->cfg->eval_iters > 0 && (uint64_t)tr->cfg->eval_iters < batches) batches = (uint64_t)tr->cfg->eval_iters;
    double total = 0;
    long count = 0;
    cllm_status st = CLLM_OK;
    for (uint64_t bi = 0; bi < batches && !st; bi++) {
        uint64_t first = bi * (uint64_t)B;
        int rows = n - first < (uint64_t)B ? (int)(n - first) : (int)B;
        for (int r = 0; r < rows && !st; r++)
            st = cllm_loader_get(tr->eval, first + (uint64_t)r, tr->tokens + (size_t)r * T, tr->labels + (size_t)r * T,
                                 NULL);
        if (st) break;
        for (int r = 0; r < rows / 2 && !st && tr->margins; r++)
            st = cllm_loader_pair_info(tr->eval, first + 2 * (uint64_t)r, &tr->margins[r], NULL);
        if (st) break;
        cllm_model_make_targets(tr->targets, tr->labels, rows, T);
        double sum = 0;
        long k = 0;
        cllm_objective_batch b = {tr->tokens, tr->targets, rows, T, tr->margins};
        st = tr->pipe ? train_pipe_eval(tr->pipe, tr->m, tr->tokens, tr->targets, rows, &sum, &k)
                      : cllm_objective_run(tr->obj, tr->m, &b, false, 0.0f, &sum, &k);
        total += sum;
        count += k;
    }
    if (!st && tr->pipe) { /* the last stage's sums, to every stage of the pipeline */
        double v[2] = {total, (double)count};
        st = cllm_dist_g_allreduce_sum_f64(train_pipe_group(tr->pipe), v, 2);
        total = v[0];
        count = (long)v[1];
    }
    if (st) return cllm_fail_context(st, "evaluation at step %ld", step);
    double loss = count ? total / (double)count : NAN;
    double dt = cllm_time_sec() - t0;
    train_record r;
    rec_begin(&r);
    rec_int(&r, "step", step);
    rec_num(&r, "eval_loss", loss);
    rec_num(&r, "eval_ppl", exp(loss));
    rec_int(&r, "eval_tokens", count);
    rec_int(&r, "eval_batches", (long long)batches);
    rec_num(&r, "eval_time", dt);
    /* the objective's own evaluation metrics (reward: eval_accuracy, ...) */
    cllm_objective_metric om[16];
    int n_om = cllm_objective_take_eval_metrics(tr->obj, om, 16);
    for (int i = 0; i < n_om; i++) {
        char key[96];
        snprintf(key, sizeof key, "eval_%s", om[i].name);
        rec_num(&r, key, om[i].value);
    }
    if (tr->cfg->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0) {
        train_end_line(tr);
        fprintf(stderr, "eval  %5ld | loss %.4f | ppl %.3f | %ld tokens | %.2f s\n", step, loss, exp(loss), count, dt);
    }
    return train_metrics_write(&tr->metrics, rec_end(&r));
}

/* ZeRO-3 with a frozen base: the trainable values the last update left
 * partitioned, gathered before they are read. Collective. */
static cllm_status gather_values(trainer *tr) {
    if (!tr->zero.scattered) return CLLM_OK;
    cllm_status st = train_zero_gather_values(&tr->zero, cllm_model_trainable_params(tr->m) + tr->base);
    if (!st) cllm_model_params_updated(tr->m);
    return st;
}

static cllm_status eval_at(trainer *tr, long step) {
    cllm_status st = gather_values(tr);
    if (st) return cllm_fail_context(st, "evaluation at step %ld", step);
    return run_eval(tr, step);
}

/* --------------------------------------------------------------- save */

/* With the optimizer state partitioned over ranks, every rank writes its
 * slice (collective, synchronous: the shard writer synchronizes the ranks
 * with MPI calls, which must stay on this thread). */
static bool sharded_save(const trainer *tr) {
    return (tr->zero.stage >= 1 && tr->zero.size > 1) || tr->zero.stage == 3 || tr->pipe;
}

/* This rank's part of the flat buffers in a sharded checkpoint: its ZeRO
 * slice, offset by its pipeline stage. At ZeRO 0 with a pipeline the data
 * replicas of a stage hold the same values: only the first writes, the
 * others add an empty part at the stage's end. */
static void ckpt_range(const trainer *tr, size_t *b, size_t *e) {
    *b = tr->base + tr->zero.begin;
    *e = tr->base + tr->zero.end;
    if (tr->pipe && tr->zero.stage == 0 && tr->topo.coord[CLLM_AXIS_DATA] > 0) *b = *e = tr->base + tr->zero.n;
}

/* Whether the ranks' parts tile the flat buffer in rank order, as the
 * sharded format stores them (pipelines whose axis list puts data before
 * pipe, at ZeRO 1, do not). Collective. */
static cllm_status ckpt_tiles(trainer *tr, bool *ok) {
    size_t b, e;
    ckpt_range(tr, &b, &e);
    int W = cllm_dist_size();
    uint64_t mine[2] = {b, e}, *all = malloc(2 * (size_t)W * sizeof *all);
    if (!all) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_dist_allgather_u64(mine, 2, all);
    *ok = !st;
    for (int r = 0; r < W && *ok; r++)
        if (all[2 * r] != (r ? all[2 * r - 1] : 0) || (r == W - 1 && all[2 * r + 1] != tr->zero.n_total)) *ok = false;
    free(all);
    return st;
}

static cllm_status save_sharded(trainer *tr) {
    if (!tr->output_dir) return CLLM_OK; /* c->output_dir is NULL on ranks > 0 */
    tr->state.optim_step = cllm_optim_step_count(tr->opt);
    double t0 = cllm_time_sec();
    const train_zero *z = &tr->zero;
    float *s0 = cllm_optim_state(tr->opt, 0), *s1 = cllm_optim_state(tr->opt, 1);
    /* offloaded state: written from the mapped file (a failure here ends
     * every rank through the front end's abort) */
    cllm_status st = tr->offload ? train_offload_map(tr->offload, false, &s0, &s1) : CLLM_OK;
    if (st) return st;
    /* stage 3: the rank holds only its parameter slice; the replicated small
     * tensors are copied into their places in it first */
    float *pslice = tr->shard ? train_shard_param_slice(tr->shard) : NULL;
    if (tr->shard) train_shard_ckpt_fill(tr->shard, s0, s1);
    size_t b, e;
    ckpt_range(tr, &b, &e);
    cllm_ckpt_slice s = {pslice ? pslice : cllm_model_trainable_params(tr->m) + b, s0, s1, b, e, z->n_total};
    st = cllm_ckpt_write_sharded(tr->output_dir, tr->m, &s, &tr->state, tr->cfg->save_total_limit);
    train_offload_unmap(tr->offload);
    double wait = cllm_time_sec() - t0;
    tr->save_wait_total += wait;
    tr->time_save_pending += wait;
    tr->last_save_step = tr->state.global_step;
    tr->n_saves++;
    return st;
}

static cllm_status save_checkpoint(trainer *tr, bool sync) {
    cllm_train_config *c = tr->cfg;
    if (tr->tp || tr->ep_sliced) {
        double t0 = cllm_time_sec();
        cllm_status st = tr->tp ? train_save_tp(tr) : train_save_ep(tr);
        double wait = cllm_time_sec() - t0;
        tr->save_wait_total += wait;
        tr->time_save_pending += wait;
        tr->last_save_step = tr->state.global_step;
        tr->n_saves++;
        return st;
    }
    if (sharded_save(tr)) return save_sharded(tr);
    if (!c->output_dir) return CLLM_OK;
    tr->state.optim_step = cllm_optim_step_count(tr->opt);
    double wait = 0;
    /* offloaded state: written straight from the mapped file (the saver is synchronous then) */
    float *s0 = cllm_optim_state(tr->opt, 0), *s1 = cllm_optim_state(tr->opt, 1);
    cllm_status st = tr->offload ? train_offload_map(tr->offload, false, &s0, &s1) : CLLM_OK;
    if (!st)
        st = train_saver_save(tr->saver, c->output_dir, tr->m, cllm_model_trainable_params(tr->m), s0, s1, &tr->state,
                              c->max_shard_bytes, c->save_total_limit, &wait);
    train_offload_unmap(tr->offload);
    if (!st && sync) st = train_saver_wait(tr->saver, &wait);
    tr->save_wait_total += wait;
    tr->time_save_pending += wait;
    tr->last_save_step = tr->state.global_step;
    tr->n_saves++;
    return st;
}

/* --------------------------------------------------------------- step */

/* Reads this rank's rows of the step starting at data position g0 and
 * builds targets; returns the number of counted targets in *count. */
static cllm_status load_rows(trainer *tr, uint64_t g0, long *count) {
    int T = tr->cfg->seq_len;
    uint64_t base = g0 + (uint64_t)tr->cfg->dp_rank * (uint64_t)tr->local;
    if (cllm_objective_has_rows(tr->obj)) { /* the objective's own rows (PPO's rollouts) */
        cllm_status st = cllm_objective_rows(tr->obj, tr->m, tr->state.global_step + 1, (int)tr->local, T, tr->tokens,
                                             tr->labels);
        if (st) return st;
    }
    for (long i = 0; i < tr->local && !cllm_objective_has_rows(tr->obj); i++) {
        cllm_status st = cllm_loader_get(tr->train, base + (uint64_t)i, tr->tokens + (size_t)i * T,
                                         tr->labels + (size_t)i * T, NULL);
        if (st) return st;
    }
    *count = cllm_model_make_targets(tr->targets, tr->labels, (int)tr->local, T);
    if (tr->pairs) *count = tr->local / 2; /* DPO, reward: the loss is a mean over pairs */
    for (long i = 0; i < tr->local / 2 && tr->margins; i++) {
        cllm_status st = cllm_loader_pair_info(tr->train, base + 2 * (uint64_t)i, &tr->margins[i], NULL);
        if (st) return st;
    }
    return cllm_model_check_ids(tr->m, tr->tokens, tr->targets, (size_t)tr->local * (size_t)T);
}

/* The data-parallel reductions (sums over ranks, zero.c); identities with
 * one rank. The target count comes first: it sets every rank's grad_scale. */
static cllm_status reduce_count(trainer *tr, long *count) {
    if (tr->pipe || tr->tp) { /* the stages of one pipeline (the ranks of one tensor group) read the same rows:
                                 sum over the data group */
        double v = (double)*count;
        cllm_status st = cllm_dist_g_allreduce_sum_f64(tr->pipe ? tr->data_grp : train_tp_data_group(tr->tp), &v, 1);
        *count = (long)v;
        return st;
    }
    int64_t v = *count;
    cllm_status st = cllm_dist_allreduce_sum_i64(&v, 1);
    *count = (long)v;
    return st;
}
static cllm_status reduce_grads(trainer *tr, float *grads, double *loss_sum) {
    /* every rank of a tensor group holds the whole loss: tensor rank 0's counts */
    if (tr->tp && !train_tp_is_first(tr->tp)) *loss_sum = 0;
    cllm_status st = cllm_dist_allreduce_sum_f64(loss_sum, 1);
    return st ? st : tr->smode->reduce(tr, grads);
}

static double comm_seconds(const trainer *tr) { return tr->smode ? tr->smode->comm_seconds(tr) : 0; }
static double wait_seconds(const trainer *tr) { return tr->smode ? tr->smode->wait_seconds(tr) : 0; }

static cllm_status train_step(trainer *tr, double *avg_step) {
    cllm_train_config *c = tr->cfg;
    const long step = tr->state.global_step + 1;
    const int T = c->seq_len;
    double t0 = cllm_time_sec();
    cllm_dist_set_step(step); /* named by the collective timeout's message */
    long count = 0;
    cllm_status st = gather_values(tr);
    if (!st) st = load_rows(tr, tr->state.next_sample, &count);
    if (st) return cllm_fail_context(st, "step %ld", step);
    if ((st = reduce_count(tr, &count))) return cllm_fail_context(st, "step %ld", step);
    double t1 = cllm_time_sec(), comm0 = comm_seconds(tr), wait0 = wait_seconds(tr);
    train_profile_begin(tr);
    tr->exec->zero_grads(tr);
    tr->smode->zero_grads(tr);
    double loss_sum = 0;
    const double loss_scale = tr->fp16 ? cllm_loss_scaler_scale(&tr->scaler) : 1.0;
    if (count > 0) {
        float scale = (float)(1.0 / (double)count);
        if (tr->fp16) scale *= (float)loss_scale; /* a power of two: exact */
        if ((st = tr->exec->run(tr, scale, &loss_sum))) return cllm_fail_context(st, "step %ld", step);
    }
    float *grads = NULL, *g = tr->smode->grads(tr, &grads);
    /* (the test hook cannot reach gradients already in flight with overlap_comm) */
    if (grads && !tr->overlap && tr->hooks && tr->hooks->poison_grads && tr->hooks->poison_grads(step, tr->hooks->ctx)) grads[0] = NAN;
    if (tr->hooks && tr->hooks->in_step) tr->hooks->in_step(step, tr->hooks->ctx);
    if ((st = tr->exec->sync_grads(tr, grads))) return cllm_fail_context(st, "step %ld", step);
    if ((st = reduce_grads(tr, g, &loss_sum))) return cllm_fail_context(st, "step %ld", step);
    double t2 = cllm_time_sec();
    double loss = count > 0 ? loss_sum / (double)count : 0.0;
    double gnorm = 0;
    bool overflow = false;
    if (tr->fp16 && (st = tr->smode->unscale(tr, g, loss_scale, &overflow)))
        return cllm_fail_context(st, "step %ld", step);
    if ((st = tr->smode->clip(tr, g, c->gradient_clipping, &gnorm))) return cllm_fail_context(st, "step %ld", step);
    bool finite = !overflow && isfinite(loss) && isfinite(gnorm);
    if (tr->fp16) {
        bool skip = false;
        if ((st = cllm_loss_scaler_update(&tr->scaler, !finite, &skip))) {
            train_end_line(tr);
            if (c->dp_rank == 0)
                fprintf(stderr, "step %ld: gradient overflow at loss scale %g, the minimum (fp16.min_loss_scale)\n",
                        step, loss_scale);
            return st;
        }
        train_fp16_store(&tr->scaler, &tr->state);
    }
    tr->state.n_objective = cllm_objective_get_state(tr->obj, step + 1, tr->state.objective, 16);
    double lr = cllm_sched_lr(&c->sched, c->optim.lr, tr->state.sched_iter);
    if (finite && count > 0) {
        if ((st = tr->smode->update(tr, g, lr)) || (st = tr->exec->sync_params(tr, cllm_model_trainable_params(tr->m))))
            return cllm_fail_context(st, "step %ld", step);
        cllm_model_params_updated(tr->m); /* refreshes the bf16/fp16 weight copy */
        tr->state.sched_iter++;
        tr->state.consecutive_skips = 0;
    } else if (!finite) {
        tr->state.skipped_steps++;
        tr->state.consecutive_skips++;
    }
    double t3 = cllm_time_sec();
    tr->state.global_step = step;
    tr->state.next_sample += (uint64_t)c->train_batch_size;
    tr->state.tokens_seen += (double)count;
    double dt = t3 - t0 + tr->time_save_pending;
    tr->state.train_seconds += dt;
    *avg_step = *avg_step > 0 ? 0.9 * *avg_step + 0.1 * dt : dt;
    double tok = (double)tr->local * T * c->dp_size;
    double gflops = tr->flops_per_step / dt * 1e-9;
    double mfu = tr->peak_gflops > 0 ? gflops / tr->peak_gflops : 0;
    train_step_report rep = {step, count, loss, lr, gnorm, dt, tok, gflops, mfu, t1 - t0, t2 - t1, t3 - t2,
                             comm_seconds(tr) - comm0, wait_seconds(tr) - wait0, loss_scale, finite};
    if ((st = train_record_step(tr, &rep))) return st;
    if (!finite && tr->fp16 && tr->scaler.dynamic) {
        /* an overflow is routine with dynamic scaling: the scaler's minimum is the stop */
        train_end_line(tr);
        if (c->dp_rank == 0 && c->log != CLLM_LOG_MODE_QUIET)
            fprintf(stderr, "step %ld: gradient overflow, update skipped; loss scale %g -> %g\n", step, loss_scale,
                    cllm_loss_scaler_scale(&tr->scaler));
        return CLLM_OK;
    }
    if (!finite) {
        train_end_line(tr);
        fprintf(stderr, "step %ld: non-finite %s (loss %g, grad norm %g): update skipped (%ld in a row)\n", step,
                isfinite(loss) ? "gradients" : "loss", loss, gnorm, tr->state.consecutive_skips);
        if (tr->state.consecutive_skips >= c->max_consecutive_skips)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "%ld consecutive steps with non-finite loss or gradients (last: step %ld); the run "
                             "diverged: lower the learning rate, enable gradient_clipping, or resume from an earlier "
                             "checkpoint (max_consecutive_skips = %d)",
                             tr->state.consecutive_skips, step, c->max_consecutive_skips);
        return CLLM_OK;
    }
    train_show_step(tr, step, loss, lr, gnorm, tok / dt, mfu, *avg_step);
    return CLLM_OK;
}

/* ----------------------------------------------------------- pipeline */

/* This rank's stage, its data-parallel group, and ZeRO over the stage's
 * range of the flat buffer. */
static cllm_status setup_pipeline(trainer *tr) {
    cllm_train_config *c = tr->cfg;
    if (c->comm_dtype != CLLM_F32)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "communication_data_type %s with pipeline parallelism: the stages' "
                         "reductions run in fp32", (c->comm_dtype == CLLM_BF16 ? "bf16" : "fp16"));
    cllm_status st = train_pipe_init(&tr->pipe, c, tr->m, &tr->topo, "config");
    if (st) return st;
    int D = tr->topo.dims[CLLM_AXIS_DATA];
    int *ranks = calloc((size_t)D, sizeof *ranks);
    if (!ranks) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_topo_group(&tr->topo, CLLM_AXIS_DATA, ranks);
    st = cllm_dist_group_init(&tr->data_grp, ranks, D);
    free(ranks);
    if (st) return st;
    size_t b, e, tied_at = 0, tied_len = 0;
    train_pipe_range(tr->pipe, &b, &e);
    tr->base = b;
    const cllm_dist_group *tied = train_pipe_tied(tr->pipe, &tied_at, &tied_len);
    bool tied_decay = false;
    for (int i = 0; i < tr->n_ranges; i++)
        if (tied && tr->ranges[i].begin <= tied_at && tied_at < tr->ranges[i].end) tied_decay = tr->ranges[i].decay;
    /* decay ranges relative to the stage */
    int k = 0;
    for (int i = 0; i < tr->n_ranges; i++) {
        cllm_param_range r = tr->ranges[i];
        if (r.end <= b || r.begin >= e) continue;
        r.begin = (r.begin > b ? r.begin : b) - b;
        r.end = (r.end < e ? r.end : e) - b;
        tr->ranges[k++] = r;
    }
    tr->n_ranges = k;
    /* the gradient norm adds up over the model replica: the stages (and their tensor ranks) */
    st = train_zero_init_group(&tr->zero, c, e - b, cllm_model_buffer_len(tr->m), tr->ranges, tr->n_ranges,
                               tr->data_grp, tr->tp ? train_tp_model_group(tr->tp) : train_pipe_group(tr->pipe));
    tr->zero.base = b;
    /* stage 3: the first and the last stage each keep the tied embedding
     * whole (zero3.c), its gradients summed between them */
    if (c->zero.stage == 3 && tied) {
        tr->zero.tied_grp = tied;
        tr->zero.tied_at = tied_at;
        tr->zero.tied_len = tied_len;
        tr->zero.tied_decay = tied_decay;
    }
    return st;
}

/* ZeRO-3 with a tied head: the first and the last stage each updated their
 * own copy of the embedding; rank 0 says whether the copies are still the
 * same bits in every pipeline. Collective. */
static cllm_status tied_report(trainer *tr) {
    bool differ = false;
    cllm_status st = train_shard_tied_check(tr->shard, &differ);
    double n = differ;
    if (!st) st = cllm_dist_allreduce_sum_f64(&n, 1);
    if (!st && cllm_dist_rank() == 0 && tr->cfg->log != CLLM_LOG_MODE_QUIET) {
        train_end_line(tr);
        if (n > 0)
            fprintf(stderr, "cllm train: warning: the tied embedding's copy differs from the first stage's on %.0f "
                    "last stage(s); the first stage's is saved\n", n);
        else
            fprintf(stderr, "cllm train: the tied embedding's copies on the first and the last stage are identical\n");
    }
    return st;
}

/* Tensor parallelism: replicated tensors that this rank leaves out of the
 * gradient norm, relative to the part of the flat buffer zero works on. */
static cllm_status tp_norm_skip(trainer *tr) {
    cllm_param_range *r = NULL;
    int n = 0, k = 0;
    cllm_status st = train_tp_norm_skip(tr->tp, tr->m, &r, &n);
    if (st) return st;
    size_t b = tr->base, e = b + tr->zero.n;
    for (int i = 0; i < n; i++) {
        if (r[i].end <= b || r[i].begin >= e) continue;
        size_t lo = r[i].begin > b ? r[i].begin : b, hi = r[i].end < e ? r[i].end : e;
        r[k++] = (cllm_param_range){lo - b, hi - b, false};
    }
    tr->zero.norm_skip = r;
    tr->zero.n_norm_skip = k;
    return CLLM_OK;
}

/* Rank 0 prints each rank's stage; at the end, the time each stage computed
 * and waited (the bubble). Collective. */
static cllm_status pipe_report(trainer *tr, bool times) {
    int W = cllm_dist_size(), me = cllm_dist_rank();
    double *v = calloc(4 * (size_t)W, sizeof *v);
    if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    const cllm_stage *sg = train_pipe_stage(tr->pipe);
    double busy, wait;
    train_pipe_times(tr->pipe, &busy, &wait);
    v[4 * me] = times ? busy : (double)sg->first_unit;
    v[4 * me + 1] = times ? wait : (double)sg->n_units;
    v[4 * me + 2] = (double)train_pipe_slots(tr->pipe);
    v[4 * me + 3] = (double)train_pipe_inflight_bytes(tr->pipe);
    cllm_status st = cllm_dist_allreduce_sum_f64(v, 4 * (size_t)W);
    if (!st && me == 0 && tr->cfg->log != CLLM_LOG_MODE_QUIET) {
        train_end_line(tr);
        for (int r = 0; r < W; r++) {
            const double *x = v + 4 * r;
            if (times)
                fprintf(stderr, "cllm train: rank %d: stage computed %.2f s, waited %.2f s for its neighbours (%.1f%% "
                        "idle)\n", r, x[0], x[1], x[0] + x[1] > 0 ? 100.0 * x[1] / (x[0] + x[1]) : 0.0);
            else
                fprintf(stderr, "cllm train: rank %d: pipeline stage of units %d..%d (%s schedule), up to %d "
                        "micro-batches in flight holding %.2f MB of stage inputs\n", r, (int)x[0],
                        (int)(x[0] + x[1]) - 1, train_pipe_schedule(tr->pipe), (int)x[2], x[3] / 1e6);
        }
    }
    free(v);
    return st;
}

/* ---------------------------------------------------------------- run */

/* The output folder's tokenizer files and chat template: the default prompt
 * template is the one the data loader renders records with. */
static cllm_status write_chat_template(const cllm_train_config *c) {
    cllm_template t;
    cllm_status st = cllm_template_load(&t, NULL);
    if (st) return st;
    st = cllm_chat_template_write_dir(c->output_dir, c->tokenizer ? c->tokenizer : c->model_dir, &t);
    cllm_template_free(&t);
    return st;
}

static cllm_status run(trainer *tr, cllm_train_result *res) {
    cllm_train_config *c = tr->cfg;
    char *resume_dir = NULL;
    cllm_status st = cllm_topo_init(&tr->topo, &c->model_topo.layout, cllm_dist_size(), cllm_dist_rank(), "config");
    if (st) return st;
    const bool piped = tr->topo.dims[CLLM_AXIS_PIPE] > 1, tensor = tr->topo.dims[CLLM_AXIS_TENSOR] > 1;
    c->dp_size = tr->topo.dims[CLLM_AXIS_DATA];
    c->dp_rank = tr->topo.coord[CLLM_AXIS_DATA];
    st = cllm_ckpt_find(c->output_dir, c->resume, &resume_dir);
    if (st) return st;
    if (c->resume && !resume_dir)
        cllm_log(CLLM_LOG_INFO, "resume: no checkpoint in %s yet; starting from the beginning", c->output_dir);
    /* the optimizer shards of a sharded checkpoint are checked when this
     * rank's slice of them is read (resume_from) */
    if (resume_dir && (st = cllm_ckpt_verify_range(resume_dir, true, 0, 0))) goto done;
    if (train_lora_run(c) && (st = train_lora_check_layout(c, piped, tensor))) goto done;
    if (c->n_freeze && (st = train_freeze_check_layout(c, piped, tensor))) goto done;
    if ((st = open_model(tr, resume_dir))) goto done;
    if ((st = open_data(tr))) goto done;
    /* the data were opened with the whole vocabulary; from here on tr->m is this rank's part */
    const bool reward = c->task && strcmp(c->task, "reward") == 0;
    tr->pairs = reward || (c->task && strcmp(c->task, "dpo") == 0);
    if (reward) {
        st = train_open_reward(tr, piped, tensor);
        if (!st && c->n_freeze && !cllm_model_has_trainable_set(tr->m))
            st = CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "freeze with task \"reward\" from a causal LM (its score head is "
                           "made after the tensors are frozen): start from a reward model folder, or train every "
                           "tensor");
    } else if (tr->pairs) {
        st = train_open_dpo(tr, piped, tensor);
    }
    if (st) goto done;
    const uint64_t n_data = tr->train ? cllm_loader_size(tr->train) : 0;
    if (!reward && cllm_model_get_config(tr->m)->num_labels > 0) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "task \"%s\" on a sequence-classification (reward) model: it has no LM head; "
                       "train it with task \"reward\"", c->task ? c->task : "lm");
        goto done;
    }
    if (tensor && (st = train_tp_init(&tr->tp, &tr->m, &tr->topo))) goto done;
    if ((st = train_moe_setup(tr, piped, tensor))) goto done; /* "moe": capacity, expert parallelism */
    /* DPO: batch sizes count pairs; from here on they count rows (2 a pair) */
    if ((st = cllm_train_config_resolve(c, n_data / (tr->pairs ? 2 : 1)))) goto done;
    if (tr->pairs) {
        c->train_batch_size *= 2;
        c->train_micro_batch_size_per_gpu *= 2;
    }
    if (task_is(c, "ppo") && (st = train_open_ppo(tr, piped, tensor))) goto done;
    const cllm_model_config *mc = cllm_model_get_config(tr->m);
    if (mc->n_ctx > 0 && c->seq_len > mc->n_ctx) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "seq_len %d exceeds the model's %d positions", c->seq_len, mc->n_ctx);
        goto done;
    }
    tr->local = c->train_micro_batch_size_per_gpu * c->gradient_accumulation_steps;
    size_t rows = (size_t)tr->local * (size_t)c->seq_len;
    tr->tokens = malloc(rows * sizeof(int32_t));
    tr->labels = malloc(rows * sizeof(int32_t));
    tr->targets = malloc(rows * sizeof(int32_t));
    if (reward) tr->margins = calloc((size_t)tr->local / 2 + 1, sizeof *tr->margins);
    if (!tr->tokens || !tr->labels || !tr->targets || (reward && !tr->margins)) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %zu batch rows", rows);
        goto done;
    }
    size_t n = cllm_model_trainable_len(tr->m); /* the model's flat buffer, or a LoRA run's adapters */
    if ((st = make_ranges(tr))) goto done;
    /* before the pipeline's buffers: its stages exchange the local positions */
    if ((st = train_tp_sequence_parallel(tr->m, &tr->topo, c))) goto done;
    /* the optimizer keeps state for this rank's slice only (all of it at ZeRO stage 0) */
    if (piped) {
        if ((st = setup_pipeline(tr))) goto done;
    } else if (tensor) {
        if (c->comm_dtype != CLLM_F32) {
            st = CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "communication_data_type %s with tensor parallelism: the 16-bit "
                           "sums run over the whole world, not a tensor rank's data group; use fp32",
                           c->comm_dtype == CLLM_BF16 ? "bf16" : "fp16");
            goto done;
        }
        if ((st = train_zero_init_group(&tr->zero, c, n, n, tr->ranges, tr->n_ranges, train_tp_data_group(tr->tp),
                                        train_tp_model_group(tr->tp))))
            goto done;
    } else if (tr->ep_sliced) {
        if ((st = train_moe_zero_init(tr, n))) goto done;
    } else if ((st = train_zero_init(&tr->zero, c, n, tr->ranges, tr->n_ranges))) {
        goto done;
    }
    if (tensor && (st = tp_norm_skip(tr))) goto done;
    if ((st = train_zero_check_world(&tr->zero, cllm_train_config_hash(c), n_data))) goto done;
    /* stages 2-3: layer hooks before prepare (no flat gradient buffer); at
     * stage 3 the model's flat parameters are freed here. A pipeline whose
     * last stage's head is the tied embedding (another stage's group) keeps
     * the flat gradient at stage 2; at stage 3 the first and the last stage
     * keep that embedding whole. */
    const bool tied_pipe = tr->pipe && cllm_model_get_config(tr->m)->tie_embeddings;
    if (tr->zero.stage >= 2 && !cllm_model_has_trainable_set(tr->m) && !(tied_pipe && tr->zero.stage == 2) &&
        (st = train_shard_init(&tr->shard, &tr->zero, tr->m, c, tr->ranges, tr->n_ranges)))
        goto done; /* a frozen base, a tied pipeline: the trainable buffer (a stage's range) is reduce-scattered
                      after the backward (zero.c) */
    cllm_model_set_recompute(tr->m, c->use_grad_ckpt);
    cllm_precision prec = c->bf16_enabled ? CLLM_PREC_BF16 : c->fp16_enabled ? CLLM_PREC_FP16 : CLLM_PREC_FP32;
    /* CLLM_TRAIN_PRECISION overrides the matmul precision alone (fp16 loss
     * scaling stays on): to look at loss scaling or a precision in isolation */
    const char *penv = getenv("CLLM_TRAIN_PRECISION");
    if (penv && *penv && !cllm_precision_from_name(penv, &prec)) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "CLLM_TRAIN_PRECISION: '%s' (expected fp32, bf16 or fp16)", penv);
        goto done;
    }
    if ((st = cllm_model_set_precision(tr->m, prec))) goto done;
    /* stage 3: a 16-bit copy of each gathered group instead of the whole buffer's */
    if (tr->shard && (st = train_shard_set_precision(tr->shard, prec))) goto done;
    if ((st = cllm_model_prepare(tr->m, (int)c->train_micro_batch_size_per_gpu, c->seq_len, true))) goto done;
    tr->act_bytes = cllm_model_activation_alloc(tr->m);
    /* a stage keeps the memory of its own parameters and gradients only */
    if (tr->pipe) {
        train_pipe_release(tr->pipe, cllm_model_params(tr->m));
        train_pipe_release(tr->pipe, cllm_model_grads(tr->m));
    }
    /* stages 0-1: overlap_comm starts each group's all-reduce during the
     * backward pass (one process, pipelines, tensor parallelism and 16-bit
     * sums keep the reduction after it) */
    if (tr->zero.stage <= 1 && tr->zero.size > 1 && !tr->pipe && !tr->tp && !tr->ep_sliced && c->comm_dtype == CLLM_F32 &&
        c->zero.overlap_comm && !cllm_model_has_trainable_set(tr->m) && (st = train_overlap_init(&tr->overlap, &tr->zero, tr->m)))
        goto done;
    const cllm_offload_config *oc = &c->zero.offload_optimizer;
    if (oc->device == CLLM_OFFLOAD_NVME) {
        size_t slice = train_zero_slice_len(&tr->zero);
        if ((st = cllm_optim_init_streamed(&tr->opt, &c->optim, slice))) goto done;
        if ((st = train_offload_init(&tr->offload, oc, &c->optim, slice, c->dp_rank))) goto done;
        tr->zero.offload = tr->offload;
    } else if ((st = cllm_optim_init(&tr->opt, &c->optim, train_zero_slice_len(&tr->zero)))) {
        goto done;
    }
    if (tr->shard)
        train_shard_count_optim(tr->shard, tr->opt);
    else
        train_zero_count_optim(&tr->zero, tr->opt);
    if (tr->offload) tr->zero.mem.optim = train_offload_buffer_bytes(tr->offload); /* what stays in RAM */
    tr->ckpt_ok = true;
    if (piped && !tr->tp && (st = ckpt_tiles(tr, &tr->ckpt_ok))) goto done;
    if (piped && !tr->ckpt_ok && c->save_interval > 0) {
        st = CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                       "checkpoints with this pipeline layout: the ranks' parts of the flat buffer do not follow rank "
                       "order (list \"pipe\" before \"data\" in model_topo.process_topology.axis, or use ZeRO "
                       "stage 0), or set save_interval 0 (the final model is still saved)");
        goto done;
    }
    memset(&tr->state, 0, sizeof tr->state);
    cllm_rng_seed(&tr->state.rng, c->seed);
    tr->state.data_seed = c->seed;
    tr->state.loss_scale = 1.0;
    if (resume_dir && (st = resume_from(tr, resume_dir))) goto done;
    if (resume_dir && (st = cllm_objective_set_state(tr->obj, tr->state.objective, tr->state.n_objective))) goto done;
    tr->fp16 = c->fp16_enabled;
    if (tr->fp16) {
        if ((st = train_fp16_init(&tr->scaler, c, resume_dir ? &tr->state : NULL))) goto done;
        train_fp16_store(&tr->scaler, &tr->state);
    }
    tr->state.config_hash = cllm_train_config_hash(c);
    snprintf(tr->state.optimizer, sizeof tr->state.optimizer, "%s", cllm_opt_name(c->optim.type));
    tr->state.train_batch_size = c->train_batch_size;
    tr->state.dp_size = c->dp_size;
    if ((st = train_saver_init(&tr->saver, n, cllm_optim_has_state(&c->optim, 0), cllm_optim_has_state(&c->optim, 1),
                               c->async_save && !tr->offload)))
        goto done;
    if (cllm_dist_rank() > 0) c->output_dir = NULL; /* only rank 0 writes: model, checkpoints, metrics */
    if (c->output_dir && (st = cllm_make_dirs(c->output_dir))) goto done;
    if (c->output_dir && (st = cllm_ckpt_clean_stale(c->output_dir, NULL))) goto done;
    if (c->output_dir && (st = train_metrics_open(&tr->metrics, c->output_dir, resume_dir ? tr->state.global_step : -1)))
        goto done;
    tr->flops_per_step = cllm_model_train_flops(tr->m, (int)c->train_micro_batch_size_per_gpu, c->seq_len) *
                         (double)c->gradient_accumulation_steps;
    if ((st = train_profile_init(tr))) goto done;
    tr->peak_gflops = c->peak_gflops;
    const char *env = getenv("CLLM_PEAK_GFLOPS");
    double envv;
    if (!(tr->peak_gflops > 0) && env && cllm_parse_f64(env, &envv) && envv > 0) tr->peak_gflops = envv;
    if (!(tr->peak_gflops > 0))
        tr->peak_gflops = c->bf16_enabled ? cllm_train_measure_peak_gflops_bf16(0.2) : cllm_train_measure_peak_gflops(0.2);
    tr->progress = c->log == CLLM_LOG_MODE_PROGRESS || (c->log == CLLM_LOG_MODE_AUTO && isatty(2));
    tr->last_save_step = tr->last_eval_step = -1;
    long first = tr->state.global_step;
    if (c->log != CLLM_LOG_MODE_QUIET && cllm_lora_attached(tr->m) && cllm_dist_rank() == 0)
        fprintf(stderr, "cllm train: LoRA r=%d alpha=%g: %zu trainable parameters (%.3f%% of %zu) in %d views, the "
                "base frozen\n", cllm_lora_config_of(tr->m)->r, cllm_lora_config_of(tr->m)->lora_alpha,
                cllm_model_trainable_numel(tr->m),
                100.0 * (double)cllm_model_trainable_numel(tr->m) / (double)cllm_model_n_params(tr->m),
                cllm_model_n_params(tr->m), cllm_model_n_trainable(tr->m));
    if (c->log != CLLM_LOG_MODE_QUIET && c->n_freeze && cllm_dist_rank() == 0)
        fprintf(stderr, "cllm train: freeze: %d of %d tensors frozen, %zu trainable parameters (%.3f%% of %zu)\n",
                cllm_model_n_tensors(tr->m) - cllm_model_n_trainable(tr->m), cllm_model_n_tensors(tr->m),
                cllm_model_trainable_numel(tr->m),
                100.0 * (double)cllm_model_trainable_numel(tr->m) / (double)cllm_model_n_params(tr->m),
                cllm_model_n_params(tr->m));
    if (c->log != CLLM_LOG_MODE_QUIET && cllm_model_quantized(tr->m) && cllm_dist_rank() == 0)
        fprintf(stderr, "cllm train: QLoRA base: the blocks' linear layers in %s%s, %.1f MB, computing in %s\n",
                cllm_bnb_type_name(cllm_model_quantized(tr->m)),
                c->quant.double_quant && !c->quant.load_in_8bit ? " with double quantization" : "",
                (double)cllm_model_quantized_bytes(tr->m) / 1e6,
                cllm_bnb_compute_name(c->quant.load_in_8bit ? CLLM_BNB_COMPUTE_FP32 : c->quant.compute));
    if (c->log != CLLM_LOG_MODE_QUIET)
        fprintf(stderr,
                "cllm train: %zu parameters, %llu samples, steps %ld..%ld of %ld x %d tokens "
                "(micro %ld x accumulation %ld x dp %d), %s, %s lr %g, peak %.1f GFLOP/s (%s)%s\n",
                cllm_model_n_params(tr->m), (unsigned long long)(tr->train ? cllm_loader_size(tr->train) : 0), first + 1,
                c->train_iters, c->train_batch_size, c->seq_len, c->train_micro_batch_size_per_gpu,
                c->gradient_accumulation_steps, c->dp_size, cllm_opt_name(c->optim.type),
                cllm_sched_name(c->sched.type), c->optim.lr, tr->peak_gflops,
                cllm_train_gemm_summary(c->bf16_enabled), resume_dir ? " (resumed)" : "");
    train_modes_pick(tr);
    if ((st = train_zero_report(&tr->zero, c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0))) goto done;
    if (c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0) train_zpp_log(c, &tr->zero);
    if (tr->pipe && (st = pipe_report(tr, false))) goto done;
    if (c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0) {
        cllm_act_bytes other;
        cllm_model_activation_bytes_sp(mc, (int)c->train_micro_batch_size_per_gpu, c->seq_len, true,
                                       !c->use_grad_ckpt, cllm_model_sequence_parallel(tr->m) ?
                                       cllm_model_tensor_size(tr->m) : 1, &other);
        fprintf(stderr, "cllm train: activations %.1f MB with activation checkpointing %s (%.1f MB %s)\n",
                (double)tr->act_bytes / 1e6, c->use_grad_ckpt ? "on" : "off", (double)other.total / 1e6,
                c->use_grad_ckpt ? "without" : "with it");
    }
    res->first_step = first + 1;
    double avg_step = 0;
    while (tr->state.global_step < c->train_iters) {
        if ((st = train_step(tr, &avg_step))) goto done;
        long step = tr->state.global_step;
        if (c->eval_interval > 0 && step % c->eval_interval == 0 && (st = eval_at(tr, step))) goto done;
        bool stop = atomic_load(&stop_requested) != 0; /* every rank stops at the same step */
        if ((st = train_zero_agree(&tr->zero, &stop))) goto done;
        if (stop) {
            train_end_line(tr);
            bool can_save = tr->ckpt_ok; /* tensor-parallel checkpoints: not yet */
            if (cllm_dist_rank() == 0)
                fprintf(stderr, "cllm train: stop requested; %s at step %ld\n",
                        can_save ? "saving a checkpoint" : "no checkpoint (this parallel layout has none yet)", step);
            if (can_save && (st = save_checkpoint(tr, true))) goto done;
            res->stopped = true;
            break;
        }
        if (c->save_interval > 0 && step % c->save_interval == 0 && (st = save_checkpoint(tr, false))) goto done;
    }
    train_end_line(tr);
    res->last_step = tr->state.global_step;
    if (tr->offload && c->log != CLLM_LOG_MODE_QUIET && c->dp_rank == 0) {
        double io = 0, wait = 0;
        train_offload_times(tr->offload, &io, &wait);
        fprintf(stderr, "cllm train: optimizer state offloaded (%.3f MB buffer): %.3f s of I/O, %.3f s waited for, "
                "%.3f s (%.0f%%) hidden behind the update\n", (double)train_offload_buffer_bytes(tr->offload) / 1e6,
                io, wait, io > wait ? io - wait : 0.0, io > 0 ? 100.0 * (io > wait ? io - wait : 0.0) / io : 0.0);
    }
    if (c->dp_size > 1 && c->log != CLLM_LOG_MODE_QUIET && c->dp_rank == 0)
        fprintf(stderr, "cllm train: %.2f s in gradient/parameter collectives on rank 0, %.0f%% of it hidden behind "
                "computation\n", comm_seconds(tr), 100.0 * train_hidden_fraction(comm_seconds(tr), wait_seconds(tr)));
    if (!res->stopped) {
        long step = tr->state.global_step;
        if (c->eval_interval > 0 && tr->last_eval_step != step && step > first && (st = eval_at(tr, step))) goto done;
        if (c->save_final_checkpoint && c->save_interval > 0 && tr->last_save_step != step && step > first &&
            (st = save_checkpoint(tr, false)))
            goto done;
        double wait = 0;
        if ((st = train_saver_wait(tr->saver, &wait))) goto done;
        tr->save_wait_total += wait;
        /* ZeRO-3: every rank takes part in gathering the whole model; rank 0
         * writes it. The optimizer state is not needed any more (no
         * checkpoints at stage 3): freed first, to lower the peak. */
        if (tr->zero.stage == 3) {
            cllm_optim_free(tr->opt);
            tr->opt = NULL;
        }
        if (tr->shard && tied_pipe && (st = tied_report(tr))) goto done;
        if (tr->shard && (st = train_shard_gather_model(tr->shard))) goto done;
        if ((st = gather_values(tr))) goto done;
        if (tr->pipe && (st = train_pipe_gather_params_to_first(tr->pipe, cllm_model_params(tr->m)))) goto done;
        if (tr->pipe && (st = pipe_report(tr, true))) goto done;
        cllm_model *whole = tr->m, *ep_whole = NULL;
        float diff = 0, *ep_params = NULL;
        if (tr->tp && (st = train_tp_gather(tr->tp, tr->m, &whole, &diff))) goto done;
        if (tr->ep_sliced) { /* every expert to rank 0, which saves the whole model */
            st = train_moe_gather(tr, cllm_model_params(tr->m), &ep_whole, &ep_params);
            if (ep_whole) whole = ep_whole;
            if (st) {
                cllm_model_free(ep_whole);
                goto done;
            }
        }
        /* norms and row-parallel biases are updated by every tensor rank from gradients that must agree */
        if (tr->tp && cllm_dist_rank() == 0 && c->log != CLLM_LOG_MODE_QUIET)
            fprintf(stderr, "cllm train: replicated tensors differ by at most %.3g over the %d tensor ranks\n",
                    (double)diff, tr->topo.dims[CLLM_AXIS_TENSOR]);
        if (c->output_dir && cllm_lora_attached(whole))
            st = cllm_lora_save(whole, c->output_dir, c->model_dir);
        else if (c->output_dir && !(st = cllm_model_set_expert_layout(whole, c->save_expert_layout)))
            st = cllm_model_save(whole, c->output_dir, c->max_shard_bytes);
        cllm_model_free(ep_whole);
        if (st) goto done;
        /* the tokenizer and a chat template of the format trained on, so that
         * `cllm serve` prompts the model as it was trained */
        if (c->output_dir && cllm_dist_rank() == 0 && (st = write_chat_template(c))) goto done;
    } else {
        double wait = 0;
        st = train_saver_wait(tr->saver, &wait);
        tr->save_wait_total += wait;
    }
done:
    free(resume_dir);
    res->skipped = tr->state.skipped_steps;
    res->save_seconds = tr->save_wait_total;
    res->async_write_seconds = train_saver_write_seconds(tr->saver);
    res->n_saves = tr->n_saves;
    return st;
}

cllm_status cllm_train_run(cllm_train_config *cfg, const cllm_train_hooks *hooks, cllm_train_result *res) {
    cllm_train_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.cfg = cfg;
    tr.hooks = hooks;
    tr.output_dir = cfg->output_dir;
    atomic_store(&stop_requested, 0);
    cllm_status st = cllm_objective_lm_init(&tr.obj);
    if (!st) st = run(&tr, res);
    cfg->output_dir = tr.output_dir;
    if (st) {
        /* keep the message of the failure, not of the clean-up */
        train_end_line(&tr);
        train_saver_wait(tr.saver, NULL);
    }
    train_saver_free(tr.saver);
    train_metrics_close(&tr.metrics);
    free(tr.tokens);
    free(tr.labels);
    free(tr.targets);
    free(tr.margins);
    free(tr.ranges);
    cllm_optim_free(tr.opt);
    train_shard_free(tr.shard);
    train_overlap_free(tr.overlap);
    train_zero_free(&tr.zero);
    train_offload_free(tr.offload);
    train_pipe_free(tr.pipe);
    cllm_dist_group_free(tr.data_grp);
    train_moe_free(&tr);
    train_tp_free(tr.tp);
    cllm_loader_free(tr.train);
    cllm_loader_free(tr.eval);
    cllm_model_free(tr.m);
    cllm_objective_free(tr.obj);
    return st;
}
