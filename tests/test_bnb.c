/*
 * The bitsandbytes formats of a QLoRA base (cllm/quant.h).
 *
 * Without arguments: sizes and views, the code books' order and extremes,
 * a quantize/dequantize round trip within each format's error bound, and
 * dequantizing any row range equal to the same rows of the whole.
 * With a directory (written by tests/ref/bnb_ref.py, PyTorch): every case's
 * codes, absmax values and dequantized matrix bit for bit, and the tables.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/quant.h"

static void *read_all(const char *dir, const char *name, const char *key, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, key);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static int same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static cllm_bnb_type type_of(const char *s) {
    return !strcmp(s, "nf4") ? CLLM_BNB_NF4 : !strcmp(s, "fp4") ? CLLM_BNB_FP4 : CLLM_BNB_INT8;
}

/* First index where two float arrays differ in bits, or -1. */
static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof *a)) return (long)i;
    return -1;
}

static void check_case(const char *dir, const char *name, cllm_bnb_type t, bool dq, int rows, int cols) {
    size_t n = (size_t)rows * cols, len, nb = (n + 63) / 64;
    float *W = read_all(dir, name, "W", &len), *deq = read_all(dir, name, "deq", &len);
    unsigned char *codes = read_all(dir, name, "codes", &len);
    CHECK(W && deq && codes, "%s: files", name);
    if (!W || !deq || !codes) return;
    size_t bytes = cllm_bnb_bytes(t, dq, rows, cols);
    void *buf = calloc(1, bytes);
    float *scratch = calloc(nb + 1, sizeof(float)), *got = calloc(n, sizeof(float));
    cllm_bnb_matrix q;
    cllm_bnb_view(&q, t, dq, rows, cols, buf);
    cllm_bnb_quantize(&q, W, scratch);
    size_t ncode = t == CLLM_BNB_INT8 ? n : (n + 1) / 2;
    CHECK(same_bytes(q.codes, codes, ncode), "%s: codes bit for bit", name);
    if (dq) {
        float *a2 = read_all(dir, name, "absmax2", &len), *off = read_all(dir, name, "offset", &len);
        unsigned char *qa = read_all(dir, name, "qabsmax", &len);
        CHECK(a2 && off && qa, "%s: dq files", name);
        if (a2 && off && qa) {
            CHECK(!memcmp(&q.offset, off, sizeof(float)), "%s: offset %.9g vs %.9g", name, (double)q.offset,
                  (double)off[0]);
            CHECK(same_bytes(q.qabsmax, qa, nb), "%s: quantized absmax bit for bit", name);
            CHECK(first_diff(q.absmax2, a2, (nb + 255) / 256) < 0, "%s: absmax2 bit for bit", name);
        }
        free(a2);
        free(off);
        free(qa);
    } else {
        float *am = read_all(dir, name, "absmax", &len);
        size_t na = t == CLLM_BNB_INT8 ? (size_t)rows : nb;
        CHECK(am && first_diff(q.absmax, am, na) < 0, "%s: absmax bit for bit", name);
        free(am);
    }
    cllm_bnb_dequantize(got, &q, 0, rows);
    long d = first_diff(got, deq, n);
    CHECK(d < 0, "%s: dequantized bit for bit (first difference at %ld: %.9g vs %.9g)", name, d,
          d >= 0 ? (double)got[d] : 0.0, d >= 0 ? (double)deq[d] : 0.0);
    free(buf);
    free(scratch);
    free(got);
    free(W);
    free(deq);
    free(codes);
}

static int run_dir(const char *dir) {
    size_t len;
    float *nf4 = read_all(dir, "nf4", "code", &len), *fp4 = read_all(dir, "fp4", "code", &len),
          *dyn = read_all(dir, "dynamic", "map", &len);
    CHECK(nf4 && fp4 && dyn, "tables in %s", dir);
    if (nf4 && fp4 && dyn) {
        CHECK(first_diff(cllm_bnb_code4(CLLM_BNB_NF4), nf4, 16) < 0, "nf4 code book");
        CHECK(first_diff(cllm_bnb_code4(CLLM_BNB_FP4), fp4, 16) < 0, "fp4 code book");
        long d = first_diff(cllm_bnb_dynamic_map(), dyn, 256);
        CHECK(d < 0, "dynamic map (first difference at %ld)", d);
    }
    free(nf4);
    free(fp4);
    free(dyn);
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s", path);
    int cases = 0;
    while (f && fgets(line, sizeof line, f)) {
        char name[128], type[16];
        int dq, rows, cols;
        if (sscanf(line, "bnb %127s %15s %d %d %d", name, type, &dq, &rows, &cols) != 5) continue;
        check_case(dir, name, type_of(type), dq != 0, rows, cols);
        cases++;
    }
    if (f) fclose(f);
    CHECK(cases > 0, "no cases in %s", dir);
    return check_summary();
}

/* Round trips of the C side alone. */
static void self_checks(void) {
    const float *nf4 = cllm_bnb_code4(CLLM_BNB_NF4), *dyn = cllm_bnb_dynamic_map();
    CHECK(nf4[0] == -1.0f && nf4[7] == 0.0f && nf4[15] == 1.0f, "nf4 extremes");
    CHECK(cllm_bnb_code4(CLLM_BNB_FP4)[3] == 1.0f && cllm_bnb_code4(CLLM_BNB_FP4)[11] == -1.0f, "fp4 +-1 at 3, 11");
    int sorted = 1;
    for (int i = 1; i < 256; i++) sorted &= dyn[i] > dyn[i - 1];
    CHECK(sorted && dyn[255] == 1.0f && dyn[0] < -0.99f, "dynamic map sorted, ends %g %g", (double)dyn[0],
          (double)dyn[255]);
    CHECK(cllm_bnb_bytes(CLLM_BNB_NF4, false, 64, 64) == 2048 + 64 * 4, "nf4 bytes");
    CHECK(cllm_bnb_bytes(CLLM_BNB_NF4, true, 64, 64) == 2048 + 64 + 4, "nf4 dq bytes");
    CHECK(cllm_bnb_bytes(CLLM_BNB_INT8, false, 3, 5) == 16 + 12, "int8 bytes");
    const int rows = 37, cols = 70;
    const size_t n = (size_t)rows * cols;
    float *W = malloc(n * sizeof *W), *D = malloc(n * sizeof *D), *part = malloc(n * sizeof *part),
          *scr = malloc((n / 64 + 1) * sizeof *scr);
    unsigned int s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        W[i] = ((float)((s >> 8) & 0xffff) / 65536.0f - 0.5f) * 0.2f;
    }
    const cllm_bnb_type types[] = {CLLM_BNB_NF4, CLLM_BNB_FP4, CLLM_BNB_INT8};
    /* worst |x - x'| relative to the block's (row's) absmax: half the largest gap of each code book */
    const double bound[] = {0.5 * (1.0 - 0.6961928009986877) + 1e-6, 0.5 * (1.0 - 8.0 / 12.0) + 1e-6, 0.5 / 127 + 1e-6};
    for (int ti = 0; ti < 3; ti++)
        for (int dq = 0; dq < 2; dq++) {
            if (types[ti] == CLLM_BNB_INT8 && dq) continue;
            void *buf = calloc(1, cllm_bnb_bytes(types[ti], dq, rows, cols));
            cllm_bnb_matrix q;
            cllm_bnb_view(&q, types[ti], dq, rows, cols, buf);
            cllm_bnb_quantize(&q, W, scr);
            cllm_bnb_dequantize(D, &q, 0, rows);
            double worst = 0.0;
            for (size_t i = 0; i < n; i++) {
                size_t b0 = types[ti] == CLLM_BNB_INT8 ? i / cols * cols : i / 64 * 64,
                       b1 = types[ti] == CLLM_BNB_INT8 ? b0 + cols : (b0 + 64 < n ? b0 + 64 : n);
                double a = 0.0;
                for (size_t k = b0; k < b1; k++) a = fmax(a, fabs(W[k]));
                worst = fmax(worst, fabs(W[i] - D[i]) / a);
            }
            /* double quantization adds the absmax's own 8-bit error */
            CHECK(worst <= bound[ti] * (dq ? 1.05 : 1.0), "%s%s round trip: worst %.4g of absmax (bound %.4g)",
                  cllm_bnb_type_name(types[ti]), dq ? " dq" : "", worst, bound[ti]);
            cllm_bnb_dequantize(part, &q, 5, 11); /* rows 5..15: blocks straddle the range's ends */
            CHECK(!memcmp(part, D + 5 * cols, 11 * (size_t)cols * sizeof *D), "%s%s row range = the rows of the whole",
                  cllm_bnb_type_name(types[ti]), dq ? " dq" : "");
            free(buf);
        }
    free(W);
    free(D);
    free(part);
    free(scr);
}

int main(int argc, char **argv) {
    if (argc > 1) return run_dir(argv[1]);
    self_checks();
    return check_summary();
}
