/*
 * cllm schedule: learning-rate schedules as pure functions of the step.
 *
 * The DeepSpeed schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR,
 * OneCycle) use DeepSpeed's formulas and parameter names and defaults;
 * "constant", "linear" and "cosine" are HF-style schedules with a linear
 * warmup from 0 to the optimizer's lr (our names). docs/training.md lists
 * every formula.
 *
 * Position: `iter` is DeepSpeed's last_batch_iteration, the number of
 * optimizer updates applied before the one being computed, so the first
 * update of a run uses iter 0 and update s (1-based) uses iter s - 1.
 * Skipped (non-finite) steps do not advance it.
 *
 * OneCycle's momentum cycling (cycle_momentum, cycle_min_mom, cycle_max_mom,
 * decay_mom_rate) and the stair counts are parsed and stored; the stair
 * counts have no effect (as in DeepSpeed) and momentum cycling is not
 * applied (documented in docs/training.md).
 */
#ifndef CLLM_SCHEDULE_H
#define CLLM_SCHEDULE_H

#include <stdbool.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CLLM_SCHED_CONSTANT = 0,
    CLLM_SCHED_WARMUP_LR,
    CLLM_SCHED_WARMUP_DECAY_LR,
    CLLM_SCHED_WARMUP_COSINE_LR,
    CLLM_SCHED_ONE_CYCLE,
    CLLM_SCHED_LINEAR, /* HF get_linear_schedule_with_warmup */
    CLLM_SCHED_COSINE, /* HF get_cosine_schedule_with_warmup (half a cosine) */
    CLLM_SCHED_COUNT
} cllm_sched_type;

typedef struct {
    cllm_sched_type type;
    /* WarmupLR / WarmupDecayLR */
    double warmup_min_lr, warmup_max_lr;
    long warmup_num_steps;  /* also WarmupCosineLR, linear, cosine */
    bool warmup_linear;     /* warmup_type "linear" (false: "log") */
    long total_num_steps;   /* WarmupDecayLR, WarmupCosineLR, linear, cosine */
    /* WarmupCosineLR: ratios of the optimizer's lr */
    double warmup_min_ratio, cos_min_ratio;
    /* OneCycle */
    double cycle_min_lr, cycle_max_lr, decay_lr_rate;
    /* The peak (warmup_max_lr of WarmupLR / WarmupDecayLR, cycle_max_lr of
     * OneCycle) is base_lr, the optimizer's lr, instead of the field: a
     * config's "auto" peak. Default false. */
    bool peak_is_base_lr;
    long cycle_first_step_size, cycle_second_step_size; /* second: -1 = same as first */
    long cycle_first_stair_count, cycle_second_stair_count; /* second: -1 = same as first */
    long decay_step_size;
    bool cycle_momentum;
    double cycle_min_mom, cycle_max_mom, decay_mom_rate;
} cllm_sched_params;

/* DeepSpeed's type names ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
 * "OneCycle") and ours ("constant", "linear", "cosine"); matching is
 * case-insensitive. CLLM_SCHED_COUNT for an unknown name. */
cllm_sched_type cllm_sched_from_name(const char *name);
const char *cllm_sched_name(cllm_sched_type t);

/* DeepSpeed's defaults for a type (total_num_steps 0 = "the run's steps"). */
cllm_sched_params cllm_sched_defaults(cllm_sched_type t);

/* Checks the parameters (non-negative steps, total >= warmup where needed,
 * positive cycle sizes); the message names the parameter. */
cllm_status cllm_sched_check(const cllm_sched_params *p);

/* Learning rate at position iter (>= 0). base_lr is the optimizer's lr,
 * used by the schedules defined as ratios (WarmupCosineLR, constant,
 * linear, cosine) and as the peak when p->peak_is_base_lr; the others
 * ignore it. Pure: no state, thread-safe. */
double cllm_sched_lr(const cllm_sched_params *p, double base_lr, long iter);

#ifdef __cplusplus
}
#endif
#endif
