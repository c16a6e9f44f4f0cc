/*
 * The trainer's reporting: the progress line on stderr and each step's
 * metrics.jsonl record (field meanings in docs/training.md). The loop
 * (engine.c) measures; this file only formats and writes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

static void fmt_eta(char *buf, size_t cap, double sec) {
    if (!(sec >= 0) || sec > 1e8) {
        snprintf(buf, cap, "?");
        return;
    }
    long s = (long)sec;
    if (s >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else
        snprintf(buf, cap, "%ldm%02lds", s / 60, s % 60);
}

void train_end_line(trainer *tr) {
    if (tr->line_open) fputc('\n', stderr);
    tr->line_open = false;
}

void train_show_step(trainer *tr, long step, double loss, double lr, double gnorm, double tps, double mfu,
                     double avg_step) {
    cllm_train_config *c = tr->cfg;
    if (c->log == CLLM_LOG_MODE_QUIET) return;
    char eta[32];
    fmt_eta(eta, sizeof eta, avg_step * (double)(c->train_iters - step));
    char mfu_s[32] = "";
    if (mfu > 0) snprintf(mfu_s, sizeof mfu_s, " | MFU %.1f%%", mfu * 100);
    if (tr->progress) {
        fprintf(stderr, "\rstep %ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s%s | ETA %s   ", step,
                c->train_iters, loss, lr, gnorm, tps, mfu_s, eta);
        fflush(stderr);
        tr->line_open = true;
    } else if (step % c->steps_per_print == 0 || step == c->train_iters) {
        fprintf(stderr, "step %5ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s%s | ETA %s\n", step,
                c->train_iters, loss, lr, gnorm, tps, mfu_s, eta);
    }
}

double train_hidden_fraction(double comm, double wait) { return comm > 0 && wait < comm ? 1.0 - wait / comm : 0.0; }

cllm_status train_record_step(trainer *tr, const train_step_report *s) {
    train_record r;
    rec_begin(&r);
    rec_int(&r, "step", s->step);
    rec_num(&r, "loss", s->loss);
    const cllm_model_config *mc = cllm_model_get_config(tr->m);
    if (mc->n_experts && tr->moe_aux_count > 0) {
        /* Mixtral: the load-balancing loss (this rank's micro-batches) and
         * the cross-entropy part of "loss" */
        double aux = tr->moe_aux_sum / (double)tr->moe_aux_count;
        rec_num(&r, "aux_loss", aux);
        rec_num(&r, "ce_loss", s->loss - (mc->router_aux ? mc->router_aux_coef * aux : 0.0));
    }
    train_moe_record(tr, &r); /* expert load, dropped choices, all-to-all traffic */
    rec_num(&r, "lr", s->lr);
    rec_num(&r, "grad_norm", s->gnorm);
    rec_int(&r, "tokens", s->count);
    rec_num(&r, "step_time", s->dt);
    rec_num(&r, "tokens_per_sec", s->tok / s->dt);
    rec_num(&r, "gflops", s->gflops);
    rec_num(&r, "mfu", s->mfu);
    rec_num(&r, "time_data", s->t_data);
    rec_num(&r, "time_fwdbwd", s->t_fwdbwd);
    rec_num(&r, "time_optim", s->t_optim);
    rec_num(&r, "time_save", tr->time_save_pending);
    rec_int(&r, "samples", (long long)tr->state.next_sample);
    if (tr->train) rec_num(&r, "epoch", (double)tr->state.next_sample / (double)cllm_loader_size(tr->train));
    rec_num(&r, "tokens_seen", tr->state.tokens_seen);
    rec_int(&r, "state_bytes_params", (long long)tr->zero.mem.params);
    rec_int(&r, "state_bytes_grads", (long long)tr->zero.mem.grads);
    rec_int(&r, "state_bytes_optim", (long long)tr->zero.mem.optim);
    rec_int(&r, "state_bytes_work", (long long)tr->zero.mem.work);
    /* communication: each collective from start to completion, and the
     * part of it the computation did not wait for (overlap_comm) */
    rec_num(&r, "time_comm", s->comm);
    rec_num(&r, "comm_hidden_fraction", train_hidden_fraction(s->comm, s->comm_wait));
    if (tr->shard) { /* stages 2-3: the bytes this rank received in the step's collectives */
        uint64_t bp = 0, bg = 0;
        train_shard_take_bytes(tr->shard, &bp, &bg);
        rec_int(&r, "comm_bytes_params", (long long)bp);
        rec_int(&r, "comm_bytes_grads", (long long)bg);
    }
    rec_int(&r, "activation_bytes", (long long)tr->act_bytes);
    if (tr->offload) {
        double io = 0, wait = 0;
        train_offload_take_step_times(tr->offload, &io, &wait);
        rec_num(&r, "offload_io_time", io);
        rec_num(&r, "offload_wait_time", wait);
    }
    if (tr->fp16) rec_num(&r, "loss_scale", s->loss_scale);
    if (tr->profile) { /* the model's phases; prof_other: the rest of time_fwdbwd */
        double ph[CLLM_PROF_N], sum = 0;
        char key[32];
        cllm_model_take_profile(tr->m, ph);
        for (int i = 0; i < CLLM_PROF_N; i++) {
            snprintf(key, sizeof key, "prof_%s", cllm_prof_name(i));
            rec_num(&r, key, ph[i]);
            sum += ph[i];
        }
        rec_num(&r, "prof_other", s->t_fwdbwd > sum ? s->t_fwdbwd - sum : 0.0);
    }
    /* the objective's own metrics (DPO's rewards/..., logps/...): means over
     * each rank's units, averaged over the data-parallel ranks (every rank
     * runs the same number of them, and the same names) */
    cllm_objective_metric om[32];
    double ov[32];
    int n_om = cllm_objective_take_metrics(tr->obj, om, 32);
    for (int i = 0; i < n_om; i++) ov[i] = om[i].value;
    if (n_om > 0 && cllm_dist_size() > 1) {
        cllm_status st = cllm_dist_allreduce_sum_f64(ov, n_om);
        if (st) return st;
        for (int i = 0; i < n_om; i++) ov[i] /= (double)cllm_dist_size();
    }
    for (int i = 0; i < n_om; i++) rec_num(&r, om[i].name, ov[i]);
    if (!s->finite) rec_bool(&r, "skipped", true);
    tr->time_save_pending = 0;
    return train_metrics_write(&tr->metrics, rec_end(&r));
}

cllm_status train_profile_init(trainer *tr) {
    const char *env = getenv("CLLM_PROFILE");
    if (!env || !*env || strcmp(env, "0") == 0) return CLLM_OK;
    if (strcmp(env, "1") != 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "environment variable CLLM_PROFILE=\"%s\": expected 1 (per-phase times in "
                         "metrics.jsonl) or 0", env);
    tr->profile = true;
    return cllm_model_set_profile(tr->m, true);
}

void train_profile_begin(trainer *tr) {
    double ph[CLLM_PROF_N];
    if (tr->profile) cllm_model_take_profile(tr->m, ph);
}
