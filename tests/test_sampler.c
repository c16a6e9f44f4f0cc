/*
 * Sampler tests for the processors a TGI/OpenAI server exposes: logit bias,
 * OpenAI frequency/presence penalties (generated tokens only), typical-p,
 * and the top-n alternatives of the raw distribution.
 *
 *   test_sampler             checks that need no reference: every bad value
 *                            is refused with a message naming it, the bias is
 *                            copied, seeded draws repeat, zero-valued new
 *                            fields leave the distribution unchanged, top-n
 *                            bounds.
 *   test_sampler DIR         also runs the cases that tests/ref/sampler_ref.py
 *                            wrote to DIR: for each, the distribution of
 *                            cllm_sampler_probs_ex against the PyTorch one
 *                            (within 1e-6), cllm_sampler_top_logprobs against
 *                            torch.topk of log_softmax (ids exactly, values
 *                            within 1e-6), and for some the frequencies of
 *                            many seeded draws.
 *
 * DIR/manifest.txt: one case per line,
 *   NAME V N_HIST N_PROMPT GREEDY TEMPERATURE TOP_K TOP_P REP TYPICAL_P
 *   FREQUENCY PRESENCE N_BIAS TOP_N DRAWS
 * and raw little-endian files NAME.logits (f32 [V]), NAME.hist (i32),
 * NAME.bias_ids (i32), NAME.bias_vals (f32), NAME.probs (f64 [V]),
 * NAME.top_ids (i32 [TOP_N]), NAME.top_lp (f64 [TOP_N]).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/generate.h"

/* Reads exactly n bytes of DIR/NAME.EXT into a new buffer (n may be 0). */
static void *read_raw(const char *dir, const char *name, const char *ext, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    void *buf = malloc(n ? n : 1);
    FILE *f = fopen(path, "rb");
    bool ok = buf && f && fread(buf, 1, n, f) == n && fgetc(f) == EOF;
    if (f) fclose(f);
    CHECK(ok, "%s: cannot read %zu bytes", path, n);
    if (!ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

typedef struct {
    char name[64];
    int V, n_hist, n_prompt, greedy, top_k, n_bias, top_n, draws;
    double temperature, top_p, rep, typical, freq, pres;
} tcase;

static void run_case(const char *dir, const tcase *c) {
    const size_t V = (size_t)c->V;
    float *logits = read_raw(dir, c->name, "logits", V * 4);
    int32_t *hist = read_raw(dir, c->name, "hist", (size_t)c->n_hist * 4);
    int32_t *bias_ids = read_raw(dir, c->name, "bias_ids", (size_t)c->n_bias * 4);
    float *bias_vals = read_raw(dir, c->name, "bias_vals", (size_t)c->n_bias * 4);
    double *want = read_raw(dir, c->name, "probs", V * 8);
    int32_t *top_ids = read_raw(dir, c->name, "top_ids", (size_t)c->top_n * 4);
    double *top_lp = read_raw(dir, c->name, "top_lp", (size_t)c->top_n * 8);
    float *got = malloc(V * sizeof *got);
    int32_t *gids = malloc(((size_t)c->top_n + 1) * sizeof *gids);
    float *glp = malloc(((size_t)c->top_n + 1) * sizeof *glp);
    long *count = calloc(V, sizeof *count);
    cllm_sampler *s = NULL, *s2 = NULL;
    if (!logits || !hist || !bias_ids || !bias_vals || !want || !top_ids || !top_lp || !got || !gids || !glp ||
        !count)
        goto done;
    cllm_sample_params sp = {.greedy = c->greedy != 0, .temperature = (float)c->temperature, .top_k = c->top_k,
                             .top_p = (float)c->top_p, .repetition_penalty = (float)c->rep,
                             .typical_p = (float)c->typical, .frequency_penalty = (float)c->freq,
                             .presence_penalty = (float)c->pres, .bias_ids = bias_ids, .bias_values = bias_vals,
                             .n_bias = (size_t)c->n_bias};
    CHECK(cllm_sampler_init(&s, c->V, sp, 7) == CLLM_OK, "%s: init: %s", c->name, cllm_last_error());
    CHECK(cllm_sampler_init(&s2, c->V, sp, 7) == CLLM_OK, "%s: second sampler: %s", c->name, cllm_last_error());
    if (!s || !s2) goto done;
    /* the samplers keep their own copy of the bias */
    for (int i = 0; i < c->n_bias; i++) bias_ids[i] = -1;
    cllm_status st = cllm_sampler_probs_ex(s, got, logits, hist, (size_t)c->n_hist, (size_t)c->n_prompt);
    CHECK(st == CLLM_OK, "%s: probs: %s", c->name, cllm_last_error());
    double worst = 0;
    int kept = 0;
    for (size_t i = 0; !st && i < V; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]));
        kept += want[i] > 0;
        /* a probability below FLT_TRUE_MIN reads 0 in float */
        CHECK((got[i] > 0) == ((float)want[i] > 0), "%s: token %zu kept differently: p %.8g, PyTorch %.8g", c->name, i,
              got[i], want[i]);
    }
    CHECK(worst <= 1e-6, "%s: probabilities differ from PyTorch by %.3g", c->name, worst);

    st = cllm_sampler_top_logprobs(gids, glp, c->top_n, logits, c->V);
    CHECK(st == CLLM_OK, "%s: top-n: %s", c->name, cllm_last_error());
    double worst_top = 0;
    for (int i = 0; !st && i < c->top_n; i++) {
        CHECK(gids[i] == top_ids[i], "%s: top-n rank %d is token %d, PyTorch's is %d", c->name, i, gids[i],
              top_ids[i]);
        worst_top = fmax(worst_top, fabs(glp[i] - top_lp[i]));
    }
    CHECK(worst_top <= 1e-6, "%s: top-n log-probabilities differ from PyTorch by %.3g", c->name, worst_top);

    /* draws: the seeded sequence repeats, and the frequencies follow the
     * PyTorch distribution (0.01 is > 6 standard errors at 1e5 draws) */
    if (c->draws > 0) {
        int same = 1;
        for (int d = 0; d < c->draws; d++) {
            int32_t a = -1, b = -1;
            double la = 0;
            cllm_sampler_sample_ex(s, &a, &la, logits, hist, (size_t)c->n_hist, (size_t)c->n_prompt);
            if (d < 1000) {
                cllm_sampler_sample_ex(s2, &b, NULL, logits, hist, (size_t)c->n_hist, (size_t)c->n_prompt);
                same &= a == b;
            }
            if (a < 0 || a >= c->V) {
                CHECK(0, "%s: drew %d", c->name, a);
                break;
            }
            count[a]++;
            if (d < 10)
                CHECK(c->greedy ? la == 0 : fabs(la - log(want[a])) < 1e-6, "%s: logprob %g of token %d, expected %g",
                      c->name, la, a, c->greedy ? 0.0 : log(want[a]));
        }
        CHECK(same, "%s: the same seed gives other draws", c->name);
        for (size_t i = 0; i < V; i++) {
            double f = (double)count[i] / c->draws;
            CHECK(fabs(f - want[i]) < 0.01, "%s: token %zu drawn with frequency %.4f, expected %.4f", c->name, i, f,
                  want[i]);
            if (want[i] == 0) CHECK(count[i] == 0, "%s: removed token %zu drawn %ld times", c->name, i, count[i]);
        }
    }
    printf("%-28s V %5d kept %5d  max |dp| %.2e  top-%d max |dlogp| %.2e%s\n", c->name, c->V, kept, worst,
           c->top_n, worst_top, c->draws ? "  (draws checked)" : "");
done:
    cllm_sampler_free(s);
    cllm_sampler_free(s2);
    free(logits);
    free(hist);
    free(bias_ids);
    free(bias_vals);
    free(want);
    free(top_ids);
    free(top_lp);
    free(got);
    free(gids);
    free(glp);
    free(count);
}

static void run_cases(const char *dir) {
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        tcase c;
        int k = sscanf(line, "%63s %d %d %d %d %lf %d %lf %lf %lf %lf %lf %d %d %d", c.name, &c.V, &c.n_hist,
                       &c.n_prompt, &c.greedy, &c.temperature, &c.top_k, &c.top_p, &c.rep, &c.typical, &c.freq,
                       &c.pres, &c.n_bias, &c.top_n, &c.draws);
        CHECK(k == 15 && c.V > 0 && c.n_hist >= 0 && c.n_bias >= 0 && c.top_n >= 0 && c.top_n <= c.V,
              "%s: bad manifest line: %s", path, line);
        if (k != 15) continue;
        run_case(dir, &c);
        n++;
    }
    fclose(f);
    CHECK(n >= 20, "only %d PyTorch cases", n);
}

/* ----------------------------------------------- checks without a reference */

static void expect_refused(const char *what, cllm_sample_params sp, const char *needle) {
    cllm_sampler *s = NULL;
    cllm_status st = cllm_sampler_init(&s, 8, sp, 1);
    CHECK(st == CLLM_ERR_ARG && !s, "%s: accepted (status %d)", what, (int)st);
    CHECK(st != CLLM_ERR_ARG || strstr(cllm_last_error(), needle), "%s: message '%s' does not name '%s'", what,
          cllm_last_error(), needle);
    if (st == CLLM_OK) cllm_sampler_free(s);
}

static void test_refusals(void) {
    cllm_sample_params d = cllm_sample_params_default(), sp;
    const int32_t ids[3] = {1, 5, 1}, bad_id[1] = {8}, neg_id[1] = {-1};
    const float vals[3] = {1.0f, -2.0f, 3.0f}, big[1] = {100.5f}, nan_v[1] = {NAN};
    const struct {
        const char *what, *needle;
        float typical, freq, pres;
    } num[] = {
        {"typical_p -0.1", "typical_p", -0.1f, 0, 0}, {"typical_p 1.5", "typical_p", 1.5f, 0, 0},
        {"typical_p NaN", "typical_p", NAN, 0, 0},     {"frequency 2.5", "frequency_penalty", 0, 2.5f, 0},
        {"frequency -2.5", "frequency_penalty", 0, -2.5f, 0}, {"frequency NaN", "frequency_penalty", 0, NAN, 0},
        {"presence 2.01", "presence_penalty", 0, 0, 2.01f},   {"presence -inf", "presence_penalty", 0, 0, -INFINITY},
    };
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        sp = d;
        sp.typical_p = num[i].typical;
        sp.frequency_penalty = num[i].freq;
        sp.presence_penalty = num[i].pres;
        expect_refused(num[i].what, sp, num[i].needle);
    }
    sp = d;
    sp.n_bias = 1;
    expect_refused("bias count without lists", sp, "n_bias");
    sp.bias_ids = bad_id;
    sp.bias_values = vals;
    expect_refused("bias id = V", sp, "bias_ids[0] = 8");
    sp.bias_ids = neg_id;
    expect_refused("bias id -1", sp, "bias_ids[0] = -1");
    sp.bias_ids = ids;
    sp.bias_values = big;
    expect_refused("bias 100.5", sp, "bias_values[0]");
    sp.bias_values = nan_v;
    expect_refused("bias NaN", sp, "bias_values[0]");
    sp.bias_values = vals;
    sp.n_bias = 3;
    expect_refused("bias id twice", sp, "token 1 is listed twice");
    sp.n_bias = (size_t)1 << 62;
    expect_refused("n_bias beyond V", sp, "n_bias");
    /* the duplicate check leaves no marks behind: a good list after a bad one */
    sp.n_bias = 2;
    cllm_sampler *s = NULL;
    CHECK(cllm_sampler_init(&s, 8, sp, 1) == CLLM_OK, "two distinct bias ids: %s", cllm_last_error());
    float l[8] = {0}, p[8];
    int32_t hist[4] = {1, 2, 3, 3};
    CHECK(s && cllm_sampler_probs_ex(s, p, l, hist, 4, 5) == CLLM_ERR_ARG && strstr(cllm_last_error(), "n_prompt"),
          "n_prompt beyond the history: %s", cllm_last_error());
    /* a boundary value is accepted */
    cllm_sampler_free(s);
    s = NULL;
    sp = d;
    sp.typical_p = 1.0f;
    sp.frequency_penalty = -2.0f;
    sp.presence_penalty = 2.0f;
    CHECK(cllm_sampler_init(&s, 8, sp, 1) == CLLM_OK, "boundary values refused: %s", cllm_last_error());
    cllm_sampler_free(s);

    int32_t tid[3];
    float tlp[3];
    const float lt[2] = {0.0f, 1.0f}, lnan[2] = {0.0f, NAN};
    CHECK(cllm_sampler_top_logprobs(tid, tlp, 3, lt, 2) == CLLM_ERR_ARG, "top-n above V accepted");
    CHECK(cllm_sampler_top_logprobs(tid, tlp, -1, lt, 2) == CLLM_ERR_ARG, "negative top-n accepted");
    CHECK(cllm_sampler_top_logprobs(tid, tlp, 1, lnan, 2) == CLLM_ERR_ARG, "top-n of NaN logits accepted");
    CHECK(cllm_sampler_top_logprobs(tid, tlp, 0, lt, 2) == CLLM_OK, "top-0 refused");
}

/* Zero-valued new fields change nothing: the same distribution as with the
 * default, whatever the history; and typical_p 0 and 1 are both off. */
static void test_off_values(void) {
    enum { V = 16 };
    float l[V], a[V], b[V];
    int32_t hist[6] = {3, 3, 7, 1, 3, 9};
    for (int i = 0; i < V; i++) l[i] = (float)sin(i * 1.7) * 3.0f;
    cllm_sample_params d = cllm_sample_params_default(), z = d;
    d.top_p = 0.9f;
    z.top_p = 0.9f;
    z.typical_p = 1.0f;
    cllm_sampler *s = NULL, *t = NULL;
    CHECK(cllm_sampler_init(&s, V, d, 1) == CLLM_OK && cllm_sampler_init(&t, V, z, 1) == CLLM_OK, "init");
    if (s && t) {
        cllm_sampler_probs_ex(s, a, l, hist, 6, 2);
        cllm_sampler_probs(t, b, l, hist, 6);
        CHECK(memcmp(a, b, sizeof a) == 0, "typical_p 1 or a prompt length changes a distribution without penalties");
    }
    cllm_sampler_free(s);
    cllm_sampler_free(t);
}

int main(int argc, char **argv) {
    test_refusals();
    test_off_values();
    if (argc > 1) run_cases(argv[1]);
    return check_summary();
}
