/*
 * cllm optim: optimizers over the flat parameter buffer, with PyTorch's
 * exact update rules (torch.optim.SGD, Adam, AdamW and the published Lion
 * update), and global-norm gradient clipping as
 * torch.nn.utils.clip_grad_norm_.
 *
 * The optimizer state (momentum buffers, moments) lives in flat buffers
 * with the parameters' layout. Weight decay is applied per range: callers
 * pass the ranges that are decayed (by default every tensor except biases
 * and norm weights, see cllm_optim_decay_ranges in the trainer).
 */
#ifndef CLLM_OPTIM_H
#define CLLM_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_OPT_SGD = 0, CLLM_OPT_ADAM, CLLM_OPT_ADAMW, CLLM_OPT_LION, CLLM_OPT_COUNT } cllm_opt_type;

/* "sgd", "adam", "adamw", "lion" (case-insensitive); CLLM_OPT_COUNT if unknown. */
cllm_opt_type cllm_opt_from_name(const char *name);
const char *cllm_opt_name(cllm_opt_type t);

typedef struct {
    cllm_opt_type type;
    /* Hyper-parameters are doubles, as Python floats are in torch.optim:
     * derived coefficients (1 - beta1, bias corrections...) are computed in
     * double and rounded once to fp32, which keeps results bit-close. */
    double lr;
    double beta1, beta2;  /* Adam/AdamW/Lion betas */
    double eps;           /* Adam/AdamW */
    double weight_decay;
    double momentum;      /* SGD */
    double dampening;     /* SGD */
    bool nesterov;        /* SGD */
} cllm_optim_params;

/* PyTorch's defaults for a type (Lion: betas 0.9, 0.99 as published). */
cllm_optim_params cllm_optim_defaults(cllm_opt_type t);

typedef struct {
    size_t begin, end; /* floats [begin, end) of the flat buffer */
    bool decay;        /* apply weight decay to this range */
} cllm_param_range;

typedef struct cllm_optimizer cllm_optimizer;

/* Allocates state for n parameters (zeroed, as torch's lazily created state). */
cllm_status cllm_optim_init(cllm_optimizer **out, const cllm_optim_params *p, size_t n);
void cllm_optim_free(cllm_optimizer *o);

/* One update of params[n] from grads[n] at learning rate lr (the schedule's
 * value for this step; p->lr is only the default). Ranges not covered by
 * `ranges` are not updated. Increments the step count. */
void cllm_optim_step(cllm_optimizer *o, float *params, const float *grads, const cllm_param_range *ranges,
                     int n_ranges, double lr);
long cllm_optim_step_count(const cllm_optimizer *o);
/* Sets the step count (restoring a checkpoint: bias corrections and SGD's
 * first-step rule depend on it). */
void cllm_optim_set_step_count(cllm_optimizer *o, long step);
/* The parameters the optimizer was created with. */
const cllm_optim_params *cllm_optim_get_params(const cllm_optimizer *o);
/* State buffers for checkpoints: state(o, 0) / state(o, 1) are the first and
 * second moment (or momentum) buffers, NULL where the optimizer has none. */
float *cllm_optim_state(cllm_optimizer *o, int which);

/* ---- streamed state (optimizer state kept outside, e.g. offloaded to a
 * file and brought in window by window) ---- */
/* Whether an optimizer of these parameters keeps state buffer `which`
 * (0: momentum / first moment, 1: second moment). */
bool cllm_optim_has_state(const cllm_optim_params *p, int which);
/* Like cllm_optim_init, but allocates no state: cllm_optim_state returns
 * NULL and updates go through cllm_optim_step_begin + _step_window. */
cllm_status cllm_optim_init_streamed(cllm_optimizer **out, const cllm_optim_params *p, size_t n);
/* Starts one update (increments the step count, as cllm_optim_step does). */
void cllm_optim_step_begin(cllm_optimizer *o);
/* The update of floats [begin, end) of params/grads (full-buffer pointers
 * and ranges, as for cllm_optim_step), with that window's state in
 * s0[end - begin] / s1[end - begin] (NULL where the optimizer has none).
 * Windows covering the buffer give bit-identical results to one
 * cllm_optim_step: the update is element-wise with the same coefficients. */
void cllm_optim_step_window(cllm_optimizer *o, float *params, const float *grads, float *s0, float *s1, size_t begin,
                            size_t end, const cllm_param_range *ranges, int n_ranges, double lr);

/* L2 norm of grads[n] (accumulated in double). */
double cllm_grad_norm(const float *grads, size_t n);
/* clip_grad_norm_: if max_norm > 0, scales grads by
 * min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping. */
double cllm_grad_clip(float *grads, size_t n, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
