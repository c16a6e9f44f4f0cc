/*
 * The per-token loss interface that training objectives build on
 * (cllm_model_forward_backward_ex), for all three families:
 * - token_loss: every target's loss; their sum is the pass's loss sum, and
 *   the last position's equals -log_softmax of cllm_model_forward_logits
 *   (a separate pass) at the target;
 * - token_scale: by linearity, per-token scales that take the value a on a
 *   set S of tokens and b elsewhere must give a * grad(S) + b * grad(rest),
 *   where grad(S) comes from the plain uniform-scale pass (checked against
 *   PyTorch elsewhere) with every target outside S set to -100;
 * - hidden states out / their gradient in (reward and value heads): with
 *   no LM head, the gradient of sum(D * hidden) against a central finite
 *   difference; with it, the LM gradient plus that one;
 * - the language-modelling objective's loss and gradient equal the plain
 *   pass's;
 * - the score head of a reward model (check_score).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/model.h"
#include "cllm/objective.h"

enum { B = 3, T = 9 };


/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, nb = 1e-300;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        nb += (double)b[i] * b[i];
    }
    return sqrt(d / nb);
}

static void check_family(const char *name, cllm_arch arch) {
    cllm_model *m = tiny_model(arch, "{\"initializer_range\": 0.2}", 21);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size, N = B * T;
    const size_t P = cllm_model_buffer_len(m);
    int32_t tokens[B * T], targets[B * T], t_s[B * T], t_rest[B * T];
    float scale[B * T], loss[B * T];
    bool in_s[B * T];
    uint64_t x = 99;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((x >> 33) % (uint64_t)V);
        targets[i] = (int32_t)((x >> 13) % (uint64_t)V);
        if (i % 7 == 3) targets[i] = -100; /* some targets not counted */
        in_s[i] = (x >> 50) & 1;
    }
    const float a = 0.75f, b = -0.3f;
    for (int i = 0; i < N; i++) {
        scale[i] = in_s[i] ? a : b;
        t_s[i] = in_s[i] ? targets[i] : -100;
        t_rest[i] = in_s[i] ? -100 : targets[i];
    }
    float *g = malloc(P * sizeof *g), *gs = malloc(P * sizeof *gs), *gr = malloc(P * sizeof *gr),
          *want = malloc(P * sizeof *want);
    CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK, "%s: prepare: %s", name, cllm_last_error());
    double sum = 0, sum_s = 0, sum_r = 0;
    long k = 0, k_s = 0, k_r = 0;
    cllm_token_io io = {.token_loss = loss, .token_scale = scale};
    cllm_model_zero_grads(m);
    CHECK(cllm_model_forward_backward_ex(m, tokens, targets, B, T, true, 1.0f, &io, &sum, &k) == CLLM_OK,
          "%s: weighted pass: %s", name, cllm_last_error());
    memcpy(g, cllm_model_grads(m), P * sizeof *g);
    cllm_model_zero_grads(m);
    CHECK(cllm_model_forward_backward(m, tokens, t_s, B, T, true, 1.0f, &sum_s, &k_s) == CLLM_OK, "%s: S pass", name);
    memcpy(gs, cllm_model_grads(m), P * sizeof *gs);
    cllm_model_zero_grads(m);
    CHECK(cllm_model_forward_backward(m, tokens, t_rest, B, T, true, 1.0f, &sum_r, &k_r) == CLLM_OK, "%s: rest", name);
    memcpy(gr, cllm_model_grads(m), P * sizeof *gr);
    for (size_t i = 0; i < P; i++) want[i] = (float)(a * (double)gs[i] + b * (double)gr[i]);
    double e = rel_l2(g, want, P);
    CHECK(e < 1e-5, "%s: per-token scaled gradient vs a*grad(S) + b*grad(rest): relative L2 %.3g", name, e);
    CHECK(k == k_s + k_r && fabs(sum - (sum_s + sum_r)) <= 1e-5 * fabs(sum), "%s: counts %ld = %ld + %ld, sums", name,
          k, k_s, k_r);
    double tl = 0;
    for (int i = 0; i < N; i++) {
        tl += loss[i];
        if (targets[i] == -100) CHECK(loss[i] == 0.0f, "%s: uncounted target %d has loss %g", name, i, loss[i]);
    }
    CHECK(fabs(tl - sum) <= 1e-5 * fabs(sum), "%s: token losses sum to %.9g, loss sum %.9g", name, tl, sum);

    /* the last position of each row against a separate logits pass */
    float *logits = malloc((size_t)B * V * sizeof *logits);
    CHECK(cllm_model_forward_logits(m, tokens, B, T, logits) == CLLM_OK, "%s: logits", name);
    for (int r = 0; r < B; r++) {
        int n = r * T + T - 1;
        if (targets[n] == -100) continue;
        const float *l = logits + (size_t)r * V;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++) s += exp(l[v] - mx);
        double want_loss = mx + log(s) - l[targets[n]];
        CHECK(fabs(loss[n] - want_loss) <= 1e-5 * fmax(1.0, fabs(want_loss)), "%s: row %d token loss %.7g, want %.7g",
              name, r, loss[n], want_loss);
    }

    /* hidden states out and their gradient in (reward/value heads): with
     * no LM head, the gradient of f = sum(D * hidden) against a central
     * finite difference along a random direction; with the LM head, the
     * gradient is the LM one plus that one (linearity) */
    {
        const int C = cllm_model_get_config(m)->n_embd;
        float *D = malloc((size_t)N * C * sizeof *D), *hid = malloc((size_t)N * C * sizeof *hid);
        float *gh = malloc(P * sizeof *gh), *dir = malloc(P * sizeof *dir), *p0 = malloc(P * sizeof *p0);
        for (int i = 0; i < N * C; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            D[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
        }
        for (size_t i = 0; i < P; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            dir[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
        }
        cllm_token_io hio = {.hidden = hid, .dhidden = D, .no_lm_head = true};
        double sh = 1;
        long kh = 1;
        cllm_model_zero_grads(m);
        CHECK(cllm_model_forward_backward_ex(m, tokens, targets, B, T, true, 1.0f, &hio, &sh, &kh) == CLLM_OK &&
                  sh == 0 && kh == 0,
              "%s: hidden-only pass: %s", name, cllm_last_error());
        memcpy(gh, cllm_model_grads(m), P * sizeof *gh);
        double dd = 0;
        for (size_t i = 0; i < P; i++) dd += (double)gh[i] * dir[i];
        float *params = cllm_model_params(m);
        memcpy(p0, params, P * sizeof *p0);
        const double eps = 1e-3;
        double f[2];
        for (int side = 0; side < 2; side++) {
            for (size_t i = 0; i < P; i++) params[i] = p0[i] + (float)((side ? -eps : eps) * dir[i]);
            cllm_model_params_updated(m);
            cllm_token_io fio = {.hidden = hid, .no_lm_head = true};
            cllm_model_forward_backward_ex(m, tokens, targets, B, T, false, 1.0f, &fio, &sh, &kh);
            f[side] = 0;
            for (int i = 0; i < N * C; i++) f[side] += (double)D[i] * hid[i];
        }
        memcpy(params, p0, P * sizeof *p0);
        cllm_model_params_updated(m);
        double fd = (f[0] - f[1]) / (2 * eps);
        CHECK(fabs(fd - dd) <= 2e-2 * fmax(fabs(dd), 1e-3), "%s: d/d(params) of sum(D * hidden): %.6g, finite "
              "difference %.6g", name, dd, fd);
        /* LM loss and the hidden gradient together = the sum of the two */
        cllm_token_io both = {.dhidden = D};
        cllm_model_zero_grads(m);
        cllm_model_forward_backward_ex(m, tokens, targets, B, T, true, 1.0f, &both, &sh, &kh);
        memcpy(g, cllm_model_grads(m), P * sizeof *g);
        cllm_model_zero_grads(m);
        cllm_model_forward_backward(m, tokens, targets, B, T, true, 1.0f, &sh, &kh);
        for (size_t i = 0; i < P; i++) want[i] = cllm_model_grads(m)[i] + gh[i];
        double eb = rel_l2(g, want, P);
        CHECK(eb < 1e-5, "%s: LM + hidden gradient vs their sum: relative L2 %.3g", name, eb);
        printf("%-6s hidden head: directional derivative %.6g, finite difference %.6g\n", name, dd, fd);
        free(D);
        free(hid);
        free(gh);
        free(dir);
        free(p0);
    }

    /* the language-modelling objective is the plain pass */
    cllm_objective *o = NULL;
    CHECK(cllm_objective_lm_init(&o) == CLLM_OK && !strcmp(cllm_objective_name(o), "lm"), "%s: lm objective", name);
    cllm_objective_batch batch = {tokens, targets, B, T, NULL};
    double so = 0;
    long ko = 0;
    cllm_model_zero_grads(m);
    CHECK(o && cllm_objective_run(o, m, &batch, true, 0.5f, &so, &ko) == CLLM_OK, "%s: lm run", name);
    memcpy(g, cllm_model_grads(m), P * sizeof *g);
    double sp = 0;
    long kp = 0;
    cllm_model_zero_grads(m);
    cllm_model_forward_backward(m, tokens, targets, B, T, true, 0.5f, &sp, &kp);
    CHECK(so == sp && ko == kp && rel_l2(g, cllm_model_grads(m), P) == 0, "%s: lm objective differs from the plain pass",
          name);
    cllm_objective_free(o);
    cllm_objective_free(NULL);
    printf("%-6s per-token scales: relative L2 %.2e\n", name, e);
    free(logits);
    free(g);
    free(gs);
    free(gr);
    free(want);
    cllm_model_free(m);
}

/* score_grad for check_score: fixed d(objective)/d(score) per row */
static cllm_status fixed_dscores(void *ctx, const float *scores, float *dscores, int n) {
    (void)scores;
    memcpy(dscores, ctx, (size_t)n * sizeof *dscores);
    return CLLM_OK;
}

/* The score head (reward models): a causal LM made a reward model keeps
 * its body and has score.weight [1, C] instead of an LM head; HF's scored
 * position; scores = score.weight . hidden at those positions; the
 * backward pass of fixed d(score) equals the hidden-state path with
 * dhidden = d(score) * w at those rows, and score.weight's gradient is
 * sum d(score) * h. */
static void check_score(const char *name, cllm_arch arch) {
    cllm_model *m = tiny_model(arch, "{\"initializer_range\": 0.2, \"pad_token_id\": 7}", 31);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int C = cllm_model_get_config(m)->n_embd, V = cllm_model_get_config(m)->vocab_size, N = B * T;
    int32_t tokens[B * T], pos[B] = {T - 1, 4, 0};
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)((i * 37 + 11) % V);
    float scores[B], dsc[B] = {0.5f, -1.25f, 2.0f}, buf[B];
    cllm_token_io sio = {.score_pos = pos, .scores = scores, .dscores = buf, .score_grad = fixed_dscores,
                         .score_ctx = dsc};
    double s = 0;
    long k = 0;
    CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK, "%s: prepare", name);
    CHECK(cllm_model_forward_backward_ex(m, tokens, NULL, B, T, false, 1.0f, &sio, &s, &k) == CLLM_ERR_ARG,
          "%s: score positions on a causal LM are refused", name);
    const float *e0 = cllm_model_params(m) + cllm_model_tensor(m, 0)->offset;
    float first = e0[0];
    CHECK(cllm_model_to_reward(&m, 3) == CLLM_OK, "%s: to_reward: %s", name, cllm_last_error());
    const cllm_tensor_info *sw = cllm_model_find_tensor(m, "score.weight");
    CHECK(cllm_model_get_config(m)->num_labels == 1 && sw && sw->shape[0] == 1 && sw->shape[1] == C &&
          !cllm_model_find_tensor(m, "lm_head.weight") && cllm_model_params(m)[cllm_model_tensor(m, 0)->offset] == first,
          "%s: reward model layout", name);
    const char *a0 = json_string_value(json_array_get(json_object_get(cllm_model_config_json(m), "architectures"), 0));
    CHECK(a0 && strstr(a0, "ForSequenceClassification"), "%s: architectures %s", name, a0 ? a0 : "?");
    int32_t row[5] = {4, 9, 7, 7, 7}, allpad[2] = {7, 7};
    CHECK(cllm_model_score_position(m, row, 5) == 1 && cllm_model_score_position(m, row, 2) == 1 &&
          cllm_model_score_position(m, allpad, 2) == 0, "%s: HF's last non-pad token", name);
    if (!sw) {
        cllm_model_free(m);
        return;
    }
    const size_t P = cllm_model_buffer_len(m);
    float *hid = malloc((size_t)N * C * sizeof *hid), *D = calloc((size_t)N * C, sizeof *D);
    float *g = malloc(P * sizeof *g), *want = malloc(P * sizeof *want);
    CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK, "%s: prepare the reward model", name);
    CHECK(cllm_model_forward_backward(m, tokens, tokens, B, T, false, 1.0f, &s, &k) == CLLM_ERR_UNSUPPORTED,
          "%s: an LM pass on a reward model is refused", name);
    cllm_model_zero_grads(m);
    CHECK(cllm_model_forward_backward_ex(m, tokens, NULL, B, T, true, 1.0f, &sio, &s, &k) == CLLM_OK && s == 0 &&
          k == 0, "%s: score pass: %s", name, cllm_last_error());
    memcpy(g, cllm_model_grads(m), P * sizeof *g);
    cllm_token_io hio = {.hidden = hid, .dhidden = D, .no_lm_head = true};
    const float *w = cllm_model_params(m) + sw->offset;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < C; i++) D[((size_t)b * T + pos[b]) * C + i] = dsc[b] * w[i];
    cllm_model_zero_grads(m);
    CHECK(cllm_model_forward_backward_ex(m, tokens, NULL, B, T, true, 1.0f, &hio, &s, &k) == CLLM_OK,
          "%s: hidden pass", name);
    memcpy(want, cllm_model_grads(m), P * sizeof *want);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        const float *h = hid + ((size_t)b * T + pos[b]) * C;
        double r = 0;
        for (int i = 0; i < C; i++) {
            r += (double)w[i] * h[i];
            want[sw->offset + i] += dsc[b] * h[i];
        }
        worst = fmax(worst, fabs(r - scores[b]));
    }
    CHECK(worst < 1e-5, "%s: scores = w . hidden at the scored positions (max diff %.3g)", name, worst);
    double e = rel_l2(g, want, P);
    CHECK(e < 1e-6, "%s: score-head backward = hidden path + score.weight gradient: relative L2 %.3g", name, e);
    printf("%-6s score head: relative L2 %.2e\n", name, e);
    free(hid);
    free(D);
    free(g);
    free(want);
    cllm_model_free(m);
}

int main(void) {
    check_family("gpt2", CLLM_ARCH_GPT2);
    check_family("llama", CLLM_ARCH_LLAMA);
    check_family("bloom", CLLM_ARCH_BLOOM);
    check_score("gpt2", CLLM_ARCH_GPT2);
    check_score("llama", CLLM_ARCH_LLAMA);
    check_score("bloom", CLLM_ARCH_BLOOM);
    return check_summary();
}
