/*
 * The fp16 loss scaler (cllm/loss_scale.h): static or dynamic, with
 * DeepSpeed's hysteresis (delayed shift) and scale window rules.
 */
#include "cllm/loss_scale.h"

#include <math.h>
#include <string.h>

cllm_status cllm_loss_scaler_init(cllm_loss_scaler *s, cllm_loss_scale_params p) {
    memset(s, 0, sizeof *s);
    if (!(p.loss_scale >= 0) || !isfinite(p.loss_scale))
        return CLLM_FAIL(CLLM_ERR_ARG, "fp16.loss_scale: %g (expected 0 for dynamic scaling or a positive scale)",
                         p.loss_scale);
    if (p.initial_scale_power < 0 || p.initial_scale_power > 126)
        return CLLM_FAIL(CLLM_ERR_ARG, "fp16.initial_scale_power: %d (expected 0..126)", p.initial_scale_power);
    if (p.window < 1) return CLLM_FAIL(CLLM_ERR_ARG, "fp16.loss_scale_window: %ld (expected >= 1)", p.window);
    if (p.hysteresis < 1) return CLLM_FAIL(CLLM_ERR_ARG, "fp16.hysteresis: %d (expected >= 1)", p.hysteresis);
    if (!(p.min_scale >= 0) || !isfinite(p.min_scale))
        return CLLM_FAIL(CLLM_ERR_ARG, "fp16.min_loss_scale: %g (expected >= 0)", p.min_scale);
    s->p = p;
    s->dynamic = p.loss_scale == 0;
    s->scale = s->dynamic ? ldexp(1.0, p.initial_scale_power) : p.loss_scale;
    s->cur_hysteresis = p.hysteresis;
    s->last_overflow_iter = -1;
    return CLLM_OK;
}

cllm_status cllm_loss_scaler_update(cllm_loss_scaler *s, bool overflow, bool *skip) {
    *skip = overflow;
    if (!s->dynamic) return CLLM_OK;
    if (overflow) {
        if (s->p.hysteresis == 1 || s->cur_hysteresis == 1) {
            if (s->scale == s->p.min_scale)
                return CLLM_FAIL(CLLM_ERR_ARG,
                                 "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
            double next = s->scale / 2;
            s->scale = next > s->p.min_scale ? next : s->p.min_scale;
        } else {
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->iter;
    } else {
        if (s->p.consecutive) s->cur_hysteresis = s->p.hysteresis;
        if ((s->iter - s->last_overflow_iter) % s->p.window == 0) {
            if (!s->p.consecutive) s->cur_hysteresis = s->p.hysteresis;
            s->scale *= 2;
        }
    }
    s->iter++;
    return CLLM_OK;
}

double cllm_loss_scaler_scale(const cllm_loss_scaler *s) { return s->scale; }
