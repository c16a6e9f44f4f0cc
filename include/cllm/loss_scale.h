/*
 * cllm loss scale: the fp16 loss scaler, with DeepSpeed's semantics
 * (fp16.loss_scale, initial_scale_power, loss_scale_window, hysteresis,
 * consecutive_hysteresis, min_loss_scale; docs/training.md).
 *
 * The backward runs with the loss multiplied by the current scale; the
 * caller checks the summed gradients for non-finite values (on every rank)
 * and reports the result with cllm_loss_scaler_update, which says whether
 * the step must be skipped. A step with an overflow is always skipped.
 *
 * Static scaling (loss_scale > 0) keeps the scale. Dynamic scaling
 * (loss_scale == 0) starts at 2^initial_scale_power and, per update:
 *   overflow:  if the hysteresis allowance is down to one (or hysteresis is
 *              1), the scale is halved, never below min_loss_scale; when it
 *              is already at min_loss_scale the update fails with
 *              "Current loss scale already at minimum - cannot decrease scale
 *              anymore. Exiting run." Otherwise the allowance drops by one
 *              and the scale stays. The step is remembered as the last
 *              overflow.
 *   no overflow: with consecutive_hysteresis the allowance is refilled;
 *              when (iter - last_overflow_iter) is a multiple of the window,
 *              the scale doubles (and without consecutive_hysteresis the
 *              allowance is refilled then).
 *   iter counts every update (skipped or not), starting at 0; the last
 *   overflow starts at -1.
 *
 * A plain struct: no allocation, nothing to free. Its counters are saved in
 * trainer_state.json so that a resumed run continues the same sequence.
 */
#ifndef CLLM_LOSS_SCALE_H
#define CLLM_LOSS_SCALE_H

#include <stdbool.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fp16 config block, as DeepSpeed names it. */
typedef struct {
    double loss_scale;       /* 0 = dynamic, else the static scale */
    int initial_scale_power; /* dynamic: the scale starts at 2^p */
    long window;             /* loss_scale_window: clean steps before doubling */
    int hysteresis;          /* overflows tolerated before halving (>= 1) */
    bool consecutive;        /* consecutive_hysteresis */
    double min_scale;        /* min_loss_scale */
} cllm_loss_scale_params;

typedef struct {
    cllm_loss_scale_params p;
    bool dynamic;
    double scale;            /* the current scale */
    int cur_hysteresis;      /* the allowance left */
    long iter;               /* updates so far */
    long last_overflow_iter; /* -1 before the first overflow */
} cllm_loss_scaler;

/* Sets up a scaler from the parameters; fails (CLLM_ERR_ARG, naming the
 * fp16 key) on a window or hysteresis below 1, a negative scale or minimum,
 * or a power outside 0..126. */
cllm_status cllm_loss_scaler_init(cllm_loss_scaler *s, cllm_loss_scale_params p);

/* Reports whether this step's gradients overflowed; *skip gets whether the
 * optimizer step must be skipped (== overflow). Fails (CLLM_ERR_ARG, with
 * DeepSpeed's text) when a dynamic scale at its minimum would have to be
 * lowered; the state is then left unchanged. */
cllm_status cllm_loss_scaler_update(cllm_loss_scaler *s, bool overflow, bool *skip);

/* The scale to multiply the loss (the backward's grad_scale) with. */
double cllm_loss_scaler_scale(const cllm_loss_scaler *s);

#ifdef __cplusplus
}
#endif
#endif
