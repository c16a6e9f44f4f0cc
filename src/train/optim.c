/*
 * SGD, Adam, AdamW and Lion over flat buffers, following torch.optim's
 * single-tensor (for-loop) implementations operation by operation, in fp32,
 * so results match PyTorch to rounding.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/optim.h"

struct cllm_optimizer {
    cllm_optim_params p;
    size_t n;
    long step;
    float *s0; /* SGD momentum buffer, Adam exp_avg, Lion exp_avg */
    float *s1; /* Adam exp_avg_sq */
};

static const char *names[CLLM_OPT_COUNT] = {"sgd", "adam", "adamw", "lion"};

cllm_opt_type cllm_opt_from_name(const char *name) {
    for (int t = 0; t < CLLM_OPT_COUNT; t++) {
        const char *a = name, *b = names[t];
        while (*a && *b && tolower((unsigned char)*a) == *b) a++, b++;
        if (!*a && !*b) return (cllm_opt_type)t;
    }
    return CLLM_OPT_COUNT;
}

const char *cllm_opt_name(cllm_opt_type t) { return t < CLLM_OPT_COUNT ? names[t] : "?"; }

cllm_optim_params cllm_optim_defaults(cllm_opt_type t) {
    cllm_optim_params p = {.type = t, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    if (t == CLLM_OPT_ADAMW) p.weight_decay = 1e-2;
    if (t == CLLM_OPT_LION) {
        p.lr = 1e-4;
        p.beta2 = 0.99;
    }
    return p;
}

static cllm_status optim_make(cllm_optimizer **out, const cllm_optim_params *p, size_t n, bool alloc_state) {
    *out = NULL;
    if (p->type >= CLLM_OPT_COUNT) return CLLM_FAIL(CLLM_ERR_ARG, "unknown optimizer type");
    if (p->type == CLLM_OPT_SGD && p->nesterov && (p->momentum <= 0 || p->dampening != 0))
        return CLLM_FAIL(CLLM_ERR_ARG, "nesterov momentum requires a momentum and zero dampening");
    cllm_optimizer *o = calloc(1, sizeof *o);
    if (!o) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    o->p = *p;
    o->n = n;
    bool need0 = alloc_state && cllm_optim_has_state(p, 0);
    bool need1 = alloc_state && cllm_optim_has_state(p, 1);
    if ((need0 && !(o->s0 = cllm_calloc(n, sizeof(float), "optimizer state"))) ||
        (need1 && !(o->s1 = cllm_calloc(n, sizeof(float), "optimizer state")))) {
        cllm_optim_free(o);
        return CLLM_ERR_NOMEM;
    }
    *out = o;
    return CLLM_OK;
}

cllm_status cllm_optim_init(cllm_optimizer **out, const cllm_optim_params *p, size_t n) {
    return optim_make(out, p, n, true);
}

void cllm_optim_free(cllm_optimizer *o) {
    if (!o) return;
    cllm_free(o->s0);
    cllm_free(o->s1);
    free(o);
}

long cllm_optim_step_count(const cllm_optimizer *o) { return o->step; }
void cllm_optim_set_step_count(cllm_optimizer *o, long step) { o->step = step; }
const cllm_optim_params *cllm_optim_get_params(const cllm_optimizer *o) { return &o->p; }
float *cllm_optim_state(cllm_optimizer *o, int which) { return which == 0 ? o->s0 : which == 1 ? o->s1 : NULL; }

/* torch.optim.SGD: d_p = g + wd*p; buf = d_p (first step) or
 * momentum*buf + (1-dampening)*d_p; d_p = d_p + momentum*buf (nesterov) or
 * buf; p -= lr*d_p. */
static void sgd_range(cllm_optimizer *o, float *p, const float *g, size_t b, size_t e, double lr_d, double wd_d) {
    const float mom = (float)o->p.momentum, damp = (float)(1.0 - o->p.dampening);
    const float lr = (float)lr_d, wd = (float)wd_d;
    float *buf = o->s0;
    /* branch-free loops (one per case) so they vectorise; adding wd * p with
     * wd = 0 is exact for finite parameters */
    if (mom == 0) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = b; i < e; i++) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (o->step == 1) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = b; i < e; i++) {
            float d = g[i] + wd * p[i];
            buf[i] = d;
            p[i] -= lr * (o->p.nesterov ? d + mom * d : d);
        }
    } else {
        const float nest = o->p.nesterov ? 1.0f : 0.0f;
#pragma omp parallel for simd schedule(static)
        for (size_t i = b; i < e; i++) {
            float d = g[i] + wd * p[i];
            float bi = mom * buf[i] + damp * d;
            buf[i] = bi;
            /* nesterov: d + mom*buf; plain: buf */
            p[i] -= lr * (nest != 0 ? d + mom * bi : bi);
        }
    }
}

/* torch.optim.Adam / AdamW:
 *   AdamW: p *= 1 - lr*wd        Adam: g += wd*p
 *   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
 *   p -= (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps) */
static void adam_range(cllm_optimizer *o, float *p, const float *g, size_t b, size_t e, double lr, double wd_d,
                       bool decoupled) {
    /* scalars in double, rounded once to float, as torch computes them in
     * Python before handing them to the fp32 kernels */
    const double b1d = o->p.beta1, b2d = o->p.beta2;
    const float b1 = (float)b1d, b2 = (float)b2d, omb1 = (float)(1.0 - b1d), omb2 = (float)(1.0 - b2d);
    const float eps = (float)o->p.eps, wd = (float)wd_d;
    const double bc1 = 1.0 - pow(b1d, (double)o->step), bc2 = 1.0 - pow(b2d, (double)o->step);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    /* AdamW decays the weight (decay < 1), Adam adds wd * p to the gradient
     * (l2 > 0); the unused one is the identity (1 or 0), so one branch-free
     * loop serves both and vectorises */
    const float decay = decoupled ? (float)(1.0 - lr * wd_d) : 1.0f;
    const float l2 = decoupled ? 0.0f : wd;
    float *m = o->s0, *v = o->s1;
#pragma omp parallel for simd schedule(static)
    for (size_t i = b; i < e; i++) {
        float gi = g[i] + l2 * p[i];
        float pi = p[i] * decay;
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
}

/* Lion: c = beta1*m + (1-beta1)*g; p = p*(1 - lr*wd) - lr*sign(c);
 * m = beta2*m + (1-beta2)*g. */
static void lion_range(cllm_optimizer *o, float *p, const float *g, size_t b, size_t e, double lr_d, double wd) {
    const float b1 = (float)o->p.beta1, b2 = (float)o->p.beta2;
    const float omb1 = (float)(1.0 - o->p.beta1), omb2 = (float)(1.0 - o->p.beta2);
    const float decay = (float)(1.0 - lr_d * wd), lr = (float)lr_d;
    float *m = o->s0;
#pragma omp parallel for simd schedule(static)
    for (size_t i = b; i < e; i++) {
        float c = b1 * m[i] + omb1 * g[i];
        float s = (float)((c > 0) - (c < 0));
        p[i] = p[i] * decay - lr * s;
        m[i] = b2 * m[i] + omb2 * g[i];
    }
}

static void update_range(cllm_optimizer *o, float *params, const float *grads, size_t b, size_t e, double lr,
                         bool decay) {
    double wd = decay ? o->p.weight_decay : 0.0;
    switch (o->p.type) {
    case CLLM_OPT_SGD: sgd_range(o, params, grads, b, e, lr, wd); break;
    case CLLM_OPT_ADAM: adam_range(o, params, grads, b, e, lr, wd, false); break;
    case CLLM_OPT_ADAMW: adam_range(o, params, grads, b, e, lr, wd, true); break;
    case CLLM_OPT_LION: lion_range(o, params, grads, b, e, lr, wd); break;
    default: break;
    }
}

void cllm_optim_step(cllm_optimizer *o, float *params, const float *grads, const cllm_param_range *ranges,
                     int n_ranges, double lr) {
    o->step++;
    for (int r = 0; r < n_ranges; r++) {
        size_t b = ranges[r].begin, e = ranges[r].end < o->n ? ranges[r].end : o->n;
        update_range(o, params, grads, b, e, lr, ranges[r].decay);
    }
}

bool cllm_optim_has_state(const cllm_optim_params *p, int which) {
    if (which == 0) return p->type != CLLM_OPT_SGD || p->momentum != 0;
    return which == 1 && (p->type == CLLM_OPT_ADAM || p->type == CLLM_OPT_ADAMW);
}

cllm_status cllm_optim_init_streamed(cllm_optimizer **out, const cllm_optim_params *p, size_t n) {
    return optim_make(out, p, n, false);
}

void cllm_optim_step_begin(cllm_optimizer *o) { o->step++; }

void cllm_optim_step_window(cllm_optimizer *o, float *params, const float *grads, float *s0, float *s1, size_t begin,
                            size_t end, const cllm_param_range *ranges, int n_ranges, double lr) {
    /* the range kernels index the state like the parameters: point them at
     * the window, with the window's start as index 0 */
    float *keep0 = o->s0, *keep1 = o->s1;
    o->s0 = s0;
    o->s1 = s1;
    if (end > o->n) end = o->n;
    for (int r = 0; r < n_ranges; r++) {
        size_t b = ranges[r].begin > begin ? ranges[r].begin : begin;
        size_t e = ranges[r].end < end ? ranges[r].end : end;
        if (b >= e) continue;
        update_range(o, params + begin, grads + begin, b - begin, e - begin, lr, ranges[r].decay);
    }
    o->s0 = keep0;
    o->s1 = keep1;
}

double cllm_grad_norm(const float *grads, size_t n) {
    double s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
    for (size_t i = 0; i < n; i++) s += (double)grads[i] * grads[i];
    return sqrt(s);
}

double cllm_grad_clip(float *grads, size_t n, double max_norm) {
    double norm = cllm_grad_norm(grads, n);
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            float c = (float)coef;
#pragma omp parallel for simd schedule(static)
            for (size_t i = 0; i < n; i++) grads[i] *= c;
        }
    }
    return norm;
}
