/*
 * Learning-rate schedules (see cllm/schedule.h). Each DeepSpeed schedule is
 * written from its published formula; the position is last_batch_iteration
 * (updates already applied). Nothing here keeps state: the trainer stores
 * only the position, so a resumed run recomputes the same values.
 */
#include <ctype.h>
#include <math.h>

#include "cllm/schedule.h"

static const double SCHED_PI = 3.14159265358979323846;

static const char *names[CLLM_SCHED_COUNT] = {"constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                              "OneCycle", "linear",   "cosine"};

static bool same_nocase(const char *a, const char *b) {
    while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b)) a++, b++;
    return !*a && !*b;
}

cllm_sched_type cllm_sched_from_name(const char *name) {
    if (!name) return CLLM_SCHED_COUNT;
    for (int t = 0; t < CLLM_SCHED_COUNT; t++)
        if (same_nocase(name, names[t])) return (cllm_sched_type)t;
    return CLLM_SCHED_COUNT;
}

const char *cllm_sched_name(cllm_sched_type t) { return t < CLLM_SCHED_COUNT ? names[t] : "?"; }

cllm_sched_params cllm_sched_defaults(cllm_sched_type t) {
    cllm_sched_params p = {
        .type = t,
        .warmup_min_lr = 0.0,
        .warmup_max_lr = 0.001,
        .warmup_num_steps = t == CLLM_SCHED_LINEAR || t == CLLM_SCHED_COSINE ? 0 : 1000,
        .warmup_linear = false,
        .total_num_steps = 0,
        .warmup_min_ratio = 0.0,
        .cos_min_ratio = 0.0001,
        .cycle_min_lr = 0.0,
        .cycle_max_lr = 0.0,
        .decay_lr_rate = 0.0,
        .cycle_first_step_size = 2000,
        .cycle_second_step_size = -1,
        .cycle_first_stair_count = 0,
        .cycle_second_stair_count = -1,
        .decay_step_size = 0,
        .cycle_momentum = true,
        .cycle_min_mom = 0.8,
        .cycle_max_mom = 0.9,
        .decay_mom_rate = 0.0,
    };
    return p;
}

static bool uses_total(cllm_sched_type t) {
    return t == CLLM_SCHED_WARMUP_DECAY_LR || t == CLLM_SCHED_WARMUP_COSINE_LR || t == CLLM_SCHED_LINEAR ||
           t == CLLM_SCHED_COSINE;
}

cllm_status cllm_sched_check(const cllm_sched_params *p) {
    if (p->type >= CLLM_SCHED_COUNT) return CLLM_FAIL(CLLM_ERR_ARG, "unknown scheduler type");
    if (p->warmup_num_steps < 0) return CLLM_FAIL(CLLM_ERR_ARG, "warmup_num_steps must be >= 0");
    if (uses_total(p->type) && p->total_num_steps <= 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s needs total_num_steps > 0 (or train_iters to take it from)",
                         cllm_sched_name(p->type));
    if (p->type == CLLM_SCHED_WARMUP_COSINE_LR && p->total_num_steps <= (p->warmup_num_steps < 2 ? 2 : p->warmup_num_steps))
        return CLLM_FAIL(CLLM_ERR_ARG, "WarmupCosineLR: total_num_steps (%ld) must exceed warmup_num_steps (%ld)",
                         p->total_num_steps, p->warmup_num_steps < 2 ? 2L : p->warmup_num_steps);
    if (p->type == CLLM_SCHED_ONE_CYCLE) {
        long second = p->cycle_second_step_size < 0 ? p->cycle_first_step_size : p->cycle_second_step_size;
        if (p->cycle_first_step_size <= 0 || second <= 0)
            return CLLM_FAIL(CLLM_ERR_ARG, "OneCycle: cycle_first_step_size and cycle_second_step_size must be > 0");
        if (p->decay_step_size < 0) return CLLM_FAIL(CLLM_ERR_ARG, "OneCycle: decay_step_size must be >= 0");
    }
    return CLLM_OK;
}

/* DeepSpeed clamps the warmup length to at least 2 (log(1) = 0). */
static double ds_warmup_gamma(const cllm_sched_params *p, long iter, long warm) {
    if (p->warmup_linear) return (double)iter / (double)warm;
    return log((double)iter + 1.0) / log((double)warm);
}

double cllm_sched_lr(const cllm_sched_params *p, double base_lr, long iter) {
    if (iter < 0) iter = 0;
    const double x = (double)iter;
    long warm = p->warmup_num_steps < 2 ? 2 : p->warmup_num_steps;
    const double warmup_max = p->peak_is_base_lr ? base_lr : p->warmup_max_lr;
    const double cycle_max = p->peak_is_base_lr ? base_lr : p->cycle_max_lr;
    switch (p->type) {
    case CLLM_SCHED_CONSTANT: return base_lr;
    case CLLM_SCHED_WARMUP_LR: {
        double gamma = iter < warm ? ds_warmup_gamma(p, iter, warm) : 1.0;
        return p->warmup_min_lr + (warmup_max - p->warmup_min_lr) * gamma;
    }
    case CLLM_SCHED_WARMUP_DECAY_LR: {
        double gamma;
        if (iter < warm) {
            gamma = ds_warmup_gamma(p, iter, warm);
        } else {
            double rest = (double)(p->total_num_steps - warm);
            gamma = fmax(0.0, (double)(p->total_num_steps - iter) / fmax(1.0, rest));
        }
        return p->warmup_min_lr + (warmup_max - p->warmup_min_lr) * gamma;
    }
    case CLLM_SCHED_WARMUP_COSINE_LR: {
        double ratio;
        if (iter < warm) {
            ratio = p->warmup_min_ratio + (1.0 - p->warmup_min_ratio) * ds_warmup_gamma(p, iter, warm);
        } else {
            double done = (double)(iter - warm + 1), span = (double)(p->total_num_steps - warm);
            double c = (1.0 + cos(SCHED_PI * done / span)) / 2.0;
            ratio = fmax(0.0, p->cos_min_ratio + (1.0 - p->cos_min_ratio) * c);
        }
        return base_lr * ratio;
    }
    case CLLM_SCHED_ONE_CYCLE: {
        double first = (double)p->cycle_first_step_size;
        double second = p->cycle_second_step_size < 0 ? first : (double)p->cycle_second_step_size;
        double total = first + second, step_ratio = first / total;
        if (x < total) {
            /* position inside the cycle is taken one update ahead */
            double b = x + 1.0;
            double cycle = floor(1.0 + b / total);
            double f = 1.0 + b / total - cycle;
            double scale = f <= step_ratio ? f / step_ratio : (f - 1.0) / (step_ratio - 1.0);
            return p->cycle_min_lr + (cycle_max - p->cycle_min_lr) * scale;
        }
        if (p->decay_step_size == 0 || p->decay_lr_rate == 0.0) return p->cycle_min_lr;
        double interval = (x - total + 1.0) / (double)p->decay_step_size;
        return p->cycle_min_lr / (1.0 + p->decay_lr_rate * interval);
    }
    case CLLM_SCHED_LINEAR:
    case CLLM_SCHED_COSINE: {
        long w = p->warmup_num_steps;
        if (iter < w) return base_lr * x / (double)(w > 1 ? w : 1);
        double rest = (double)(p->total_num_steps - w);
        if (rest < 1.0) rest = 1.0;
        if (p->type == CLLM_SCHED_LINEAR) return base_lr * fmax(0.0, (double)(p->total_num_steps - iter) / rest);
        double progress = (x - (double)w) / rest;
        return base_lr * fmax(0.0, 0.5 * (1.0 + cos(SCHED_PI * progress)));
    }
    default: return base_lr;
    }
}
