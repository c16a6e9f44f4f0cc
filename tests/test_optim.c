/*
 * Optimizers against torch.optim: reads the trajectories written by
 * tests/ref/optim_ref.py (argument: its folder) and replays them through
 * cllm_optim_step, comparing parameters after every step (relative 1e-6:
 * rel-L2 and max difference over the largest magnitude).
 * Without an argument it runs the torch-free checks only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/optim.h"

static float *read_f32(const char *dir, const char *name, const char *ext, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "rb");
    float *p = malloc(n * sizeof(float));
    size_t got = (f && p) ? fread(p, sizeof(float), n, f) : 0;
    if (f) fclose(f);
    if (got != n) {
        free(p);
        return NULL;
    }
    return p;
}

static void run_case(const char *dir, const char *line) {
    char name[64], type[16];
    size_t n, steps, split;
    double lr, b1, b2, eps, wd, mom, damp, clip;
    int nest;
    if (sscanf(line, "%63s %15s %zu %zu %lf %lf %lf %lf %lf %lf %lf %d %zu %lf", name, type, &n, &steps, &lr, &b1, &b2,
               &eps, &wd, &mom, &damp, &nest, &split, &clip) != 14) {
        CHECK(0, "bad manifest line: %s", line);
        return;
    }
    float *p = read_f32(dir, name, "params0", n), *g = read_f32(dir, name, "grads", n * steps),
          *e = read_f32(dir, name, "expect", n * steps), *gs = malloc(n * sizeof(float));
    CHECK(p && g && e && gs, "%s: cannot read reference files", name);
    cllm_optimizer *o = NULL;
    if (p && g && e && gs) {
        cllm_optim_params op = cllm_optim_defaults(cllm_opt_from_name(type));
        op.lr = lr;
        op.beta1 = b1;
        op.beta2 = b2;
        op.eps = eps;
        op.weight_decay = wd;
        op.momentum = mom;
        op.dampening = damp;
        op.nesterov = nest != 0;
        CHECK(cllm_optim_init(&o, &op, n) == CLLM_OK, "%s: init: %s", name, cllm_last_error());
        cllm_param_range ranges[2] = {{0, split, true}, {split, n, false}};
        for (size_t s = 0; o && s < steps; s++) {
            memcpy(gs, g + s * n, n * sizeof(float));
            if (clip > 0) cllm_grad_clip(gs, n, clip);
            cllm_optim_step(o, p, gs, ranges, 2, lr);
            /* relative to the tensor: rel-L2, and the largest elementwise
             * difference against the largest magnitude (elementwise relative
             * error is meaningless where an update cancels to near zero) */
            double rel = check_rel_l2(p, e + s * n, n), maxd = 0, maxref = 0;
            for (size_t i = 0; i < n; i++) {
                maxd = fmax(maxd, fabs(p[i] - e[s * n + i]));
                maxref = fmax(maxref, fabs(e[s * n + i]));
            }
            CHECK(rel <= 1e-6 && maxd <= 1e-6 * maxref, "%s: step %zu: rel-L2 %.3g, max diff %.3g of max %.3g", name,
                  s + 1, rel, maxd, maxref);
        }
    }
    cllm_optim_free(o);
    free(p);
    free(g);
    free(e);
    free(gs);
}

/* Torch-free properties: names, clipping arithmetic, ranges left alone. */
static void test_basics(void) {
    CHECK(cllm_opt_from_name("AdamW") == CLLM_OPT_ADAMW, "AdamW name");
    CHECK(cllm_opt_from_name("adamx") == CLLM_OPT_COUNT, "unknown name accepted");
    float g[4] = {3, 4, 0, 0};
    double norm = cllm_grad_clip(g, 4, 1.0);
    CHECK(fabs(norm - 5.0) < 1e-12, "norm %g", norm);
    CHECK(fabs(g[0] - 3.0 / (5.0 + 1e-6)) < 1e-7 && fabs(g[1] - 4.0 / (5.0 + 1e-6)) < 1e-7, "clipped %g %g", g[0], g[1]);
    float h[2] = {0.1f, 0.1f};
    cllm_grad_clip(h, 2, 1.0);
    CHECK(h[0] == 0.1f && h[1] == 0.1f, "clip below the limit changed the gradient");
    cllm_optimizer *o;
    cllm_optim_params op = cllm_optim_defaults(CLLM_OPT_SGD);
    op.nesterov = true;
    CHECK(cllm_optim_init(&o, &op, 4) == CLLM_ERR_ARG, "nesterov without momentum accepted");
    op.nesterov = false;
    CHECK(cllm_optim_init(&o, &op, 4) == CLLM_OK, "sgd init");
    float p[4] = {1, 1, 1, 1}, gr[4] = {1, 1, 1, 1};
    cllm_param_range r = {0, 2, false};
    cllm_optim_step(o, p, gr, &r, 1, 0.5f);
    CHECK(p[0] == 0.5f && p[1] == 0.5f && p[2] == 1.0f && p[3] == 1.0f, "range not respected");
    cllm_optim_free(o);
    cllm_optim_free(NULL);
}

int main(int argc, char **argv) {
    test_basics();
    if (argc > 1) {
        char path[1024], line[512];
        snprintf(path, sizeof path, "%s/manifest.txt", argv[1]);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL, "cannot open %s", path);
        int cases = 0;
        while (f && fgets(line, sizeof line, f)) {
            run_case(argv[1], line);
            cases++;
        }
        if (f) fclose(f);
        CHECK(cases >= 7, "only %d reference cases", cases);
    }
    return check_summary();
}
