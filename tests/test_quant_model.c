/*
 * Inference weight formats inside the model (cllm_model_set_weights):
 * for GPT-2 (Conv1D weights, tied head; a width of 40, not a multiple of
 * the 32-value block), LLaMA (untied head) and BLOOM tiny models, in bf16,
 * int8 and q4:
 *   - the logits equal those of the fp32 model whose matrices were
 *     replaced by their stored values (dequantized here through the public
 *     row functions): bf16 to fp32 rounding, int8 / q4 to the rounding of
 *     their quantized activations (2.5% / 4% of the largest logit; a matrix
 *     read with the wrong shape or layout is off by its whole size), for
 *     short and long row counts (bf16 from 17 rows, every format from
 *     CLLM_QGEMM_MIN_ROWS: cllm_qgemm's panels on oneDNN);
 *   - a prompt on cllm_qgemm (two sequences of 40 tokens, 80 rows) gives
 *     each sequence the logits it gets alone (40 rows, int8 / q4 on the
 *     integer tiles of cllm_qmatmul) within the bounds above (bf16 2e-5,
 *     int8 2.5%, q4 4% of the largest logit). Both paths compute the same
 *     products up to fp32 rounding (cllm_qgemm is checked against float64
 *     at 2e-6 in test_quant), and most runs agree to 1e-6; but an
 *     activation that sits on a rounding boundary of its 8-bit code can
 *     take the neighbouring code on one path, and the layers after it then
 *     see inputs that differ by a quantization step, which flips further
 *     codes: measured up to 1.4% on these random models (printed);
 *   - the logits stay within a per-format bound of fp32's (the measured
 *     maxima are printed);
 *   - training a converted model is refused, converting back to fp32
 *     gives fp32 logits again, and precision changes are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/model.h"
#include "cllm/quant.h"

enum { B = 2, VMAX = 600 };

/* Replaces each matrix the store holds by its stored values (the
 * reference the quantized model must reproduce). */
static void store_in_place(cllm_model *m, cllm_wfmt f) {
    float *p = cllm_model_params(m);
    const cllm_model_config *c = cllm_model_get_config(m);
    for (int i = 0; i < cllm_model_n_tensors(m); i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        if (t->ndim != 2 || strstr(t->name, "wpe")) continue;
        bool conv = c->arch == CLLM_ARCH_GPT2 && !strstr(t->name, "wte");
        int rows = (int)(conv ? t->shape[1] : t->shape[0]), cols = (int)(conv ? t->shape[0] : t->shape[1]);
        float *w = p + t->offset, *row = malloc((size_t)cols * 4);
        unsigned char *q = malloc(cllm_wfmt_row_bytes(f, cols));
        for (int r = 0; r < rows; r++) {
            for (int k = 0; k < cols; k++) row[k] = conv ? w[(size_t)k * rows + r] : w[(size_t)r * cols + k];
            cllm_quant_matrix(q, f, row, 1, cols, false);
            cllm_quant_dequant_row(row, q, f, cols);
            for (int k = 0; k < cols; k++) *(conv ? &w[(size_t)k * rows + r] : &w[(size_t)r * cols + k]) = row[k];
        }
        free(row);
        free(q);
    }
}

static bool logits_b(cllm_model *m, const int32_t *tok, int b, int T, float *out) {
    return cllm_model_prepare(m, b, T, false) == CLLM_OK && cllm_model_forward_logits(m, tok, b, T, out) == CLLM_OK;
}

static bool logits(cllm_model *m, const int32_t *tok, int T, float *out) { return logits_b(m, tok, B, T, out); }

/* Prompt rows: B sequences of TP tokens run on cllm_qgemm, one alone on
 * cllm_qmatmul (int8 / q4). */
enum { TP = 40 };
_Static_assert(TP < (int)CLLM_QGEMM_MIN_ROWS && B * TP >= (int)CLLM_QGEMM_MIN_ROWS, "TP rows alone on the tiles, B * TP on panels");

static double max_abs(const float *a, size_t n) {
    double x = 0;
    for (size_t i = 0; i < n; i++) x = fmax(x, fabs(a[i]));
    return x;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double x = 0;
    for (size_t i = 0; i < n; i++) x = fmax(x, fabs((double)a[i] - b[i]));
    return x;
}

static void family(const char *name, cllm_arch arch, const char *extra) {
    /* relative bounds on max |logit - fp32 logit| / max |fp32 logit| */
    const double bound[CLLM_WFMT_COUNT] = {0, 0.015, 0.05, 0.6};
    /* ... on the difference to the stored-values model, and between a
     * prompt on cllm_qgemm and each of its sequences alone */
    const double same[CLLM_WFMT_COUNT] = {0, 2e-5, 0.025, 0.04};
    cllm_model *m = tiny_model(arch, extra, 11);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size;
    CHECK(V <= VMAX, "vocab");
    static float ref32[3][B * VMAX], got[B * VMAX], want[B * VMAX];
    int32_t tok[B * TP];
    for (int i = 0; i < B * TP; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    /* 10 rows: the small-batch kernels; 24: bf16 on cllm_qgemm; 80: every format on it */
    const int Ts[3] = {5, 12, TP};
    for (int ti = 0; ti < 3; ti++) CHECK(logits(m, tok, Ts[ti], ref32[ti]), "%s: fp32: %s", name, cllm_last_error());
    double scale = max_abs(ref32[1], (size_t)B * V);
    for (int f = CLLM_WFMT_BF16; f < CLLM_WFMT_COUNT; f++) {
        cllm_model *q = tiny_model(arch, extra, 11), *r = tiny_model(arch, extra, 11);
        CHECK(q && r && cllm_model_set_weights(q, (cllm_wfmt)f) == CLLM_OK, "%s: set_weights: %s", name, cllm_last_error());
        if (!q || !r) goto next;
        CHECK(cllm_model_weights(q) == (cllm_wfmt)f, "format reported");
        store_in_place(r, (cllm_wfmt)f);
        for (int ti = 0; ti < 3; ti++) {
            bool ok = logits(q, tok, Ts[ti], got) && logits(r, tok, Ts[ti], want);
            CHECK(ok, "%s %s: forward: %s", name, cllm_wfmt_name((cllm_wfmt)f), cllm_last_error());
            double d = max_diff(got, want, (size_t)B * V), d32 = max_diff(got, ref32[ti], (size_t)B * V);
            CHECK(d <= same[f] * scale + 1e-6, "%s %s T=%d: logits differ from the stored-values model by %g (max %g)",
                  name, cllm_wfmt_name((cllm_wfmt)f), Ts[ti], d, scale);
            if (ti == 1) printf("%s %-5s max |logit - stored-values fp32 model| = %.3g\n", name,
                                cllm_wfmt_name((cllm_wfmt)f), d);
            CHECK(d32 <= bound[f] * scale, "%s %s T=%d: logits differ from fp32 by %g (%.4f of max %g; bound %.3f)", name,
                  cllm_wfmt_name((cllm_wfmt)f), Ts[ti], d32, d32 / scale, scale, bound[f]);
            if (ti == 1)
                printf("%s %-5s max |logit - fp32| = %.3g (%.5f of max |logit|), %zu bytes per step (fp32 %zu)\n", name,
                       cllm_wfmt_name((cllm_wfmt)f), d32, d32 / scale, cllm_model_weight_bytes(q),
                       cllm_model_weight_bytes(m));
        }
        /* the prompt path against the decode kernels: each sequence alone */
        CHECK(logits(q, tok, TP, got), "%s: forward", name);
        double dp = 0;
        for (int b = 0; b < B; b++) {
            CHECK(logits_b(q, tok + b * TP, 1, TP, want), "%s: forward alone", name);
            dp = fmax(dp, max_diff(got + (size_t)b * V, want, (size_t)V));
        }
        printf("%s %-5s max |logit on panels (%d rows) - logit alone (%d rows)| = %.3g (%.2g of max |logit|)\n", name,
               cllm_wfmt_name((cllm_wfmt)f), B * TP, TP, dp, dp / scale);
        CHECK(dp <= same[f] * scale + 1e-6,
              "%s %s: a sequence's logits in a %d-row prompt differ from its own %d rows by %g (max %g)",
              name, cllm_wfmt_name((cllm_wfmt)f), B * TP, TP, dp, scale);
        CHECK(cllm_model_prepare(q, B, 5, true) == CLLM_ERR_UNSUPPORTED, "%s: training a %s model refused", name,
              cllm_wfmt_name((cllm_wfmt)f));
        CHECK(cllm_model_set_precision(q, CLLM_PREC_BF16) == CLLM_ERR_UNSUPPORTED, "%s: precision change refused", name);
        CHECK(cllm_model_set_weights(q, CLLM_WFMT_FP32) == CLLM_OK && logits(q, tok, Ts[1], got) &&
                  max_diff(got, ref32[1], (size_t)B * V) <= 1e-6 * scale,
              "%s: back to fp32 gives fp32 logits", name);
    next:
        cllm_model_free(q);
        cllm_model_free(r);
    }
    CHECK(cllm_model_set_weights(m, CLLM_WFMT_COUNT) == CLLM_ERR_ARG, "unknown format refused");
    cllm_model_free(m);
}

int main(void) {
    family("gpt2", CLLM_ARCH_GPT2, "{\"n_embd\": 40, \"n_head\": 4, \"vocab_size\": 300, \"initializer_range\": 0.05}");
    family("llama", CLLM_ARCH_LLAMA, "{\"vocab_size\": 520, \"initializer_range\": 0.05}");
    family("bloom", CLLM_ARCH_BLOOM, "{\"vocab_size\": 333, \"initializer_range\": 0.05}");
    return check_summary();
}
