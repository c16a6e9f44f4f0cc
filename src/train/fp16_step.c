/*
 * fp16 loss scaling inside the training step (train_impl.h): the scaler
 * set up from the config (and from a checkpoint on resume), and the
 * overflow check + unscale of the reduced gradient.
 *
 * The backward runs with grad_scale multiplied by the loss scale; after the
 * data-parallel reduction each rank looks at the part of the summed
 * gradient it updates (all of it at stage 0, its slice at stages 1-2), the
 * ranks agree on whether any value is non-finite, and if none is, that part
 * is multiplied by 1/scale before clipping and the optimizer. With a power
 * of two scale both multiplications are exact in fp32 (barring overflow or
 * denormals), so a run without overflows matches an unscaled run.
 */
#include <math.h>

#include "cllm/loss_scale.h"
#include "train_impl.h"

cllm_status train_fp16_init(cllm_loss_scaler *s, const cllm_train_config *c, const cllm_ckpt_state *resumed) {
    cllm_loss_scale_params p = {.loss_scale = c->fp16_loss_scale,
                                .initial_scale_power = c->fp16_initial_scale_power,
                                .window = c->fp16_loss_scale_window,
                                .hysteresis = c->fp16_hysteresis,
                                .consecutive = c->fp16_consecutive_hysteresis,
                                .min_scale = c->fp16_min_loss_scale};
    cllm_status st = cllm_loss_scaler_init(s, p);
    if (st || !resumed || !resumed->has_loss_scaler) return st;
    if (s->dynamic) {
        if (!(resumed->loss_scale > 0) || !isfinite(resumed->loss_scale))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "trainer_state.json: loss_scale %g is not a positive number",
                             resumed->loss_scale);
        s->scale = resumed->loss_scale;
    }
    s->iter = resumed->loss_scaler_iter;
    s->last_overflow_iter = resumed->loss_scaler_last_overflow;
    s->cur_hysteresis = resumed->loss_scaler_hysteresis > p.hysteresis ? p.hysteresis : resumed->loss_scaler_hysteresis;
    return CLLM_OK;
}

void train_fp16_store(const cllm_loss_scaler *s, cllm_ckpt_state *st) {
    st->loss_scale = s->scale;
    st->has_loss_scaler = true;
    st->loss_scaler_iter = s->iter;
    st->loss_scaler_last_overflow = s->last_overflow_iter;
    st->loss_scaler_hysteresis = s->cur_hysteresis;
}

cllm_status train_fp16_unscale(const train_zero *z, float *grads, double scale, bool *overflow) {
    float *g = grads + z->begin;
    const size_t k = z->end - z->begin;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (size_t i = 0; i < k; i++) bad |= !isfinite(g[i]);
    bool flag = bad != 0;
    cllm_status st = train_zero_agree(z, &flag);
    if (st) return cllm_fail_context(st, "gradient overflow check");
    *overflow = flag;
    if (flag) return CLLM_OK;
    const float inv = (float)(1.0 / scale);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < k; i++) g[i] *= inv;
    return CLLM_OK;
}
