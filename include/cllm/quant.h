/*
 * cllm quant: the weight formats of inference (fp32, bf16, int8, q4) and the
 * matrix-vector / small-batch kernels that read them at the memory-bandwidth
 * limit.
 *
 * Generating a token reads every weight once, so decode speed is memory
 * bandwidth divided by the bytes of the weights. A weight matrix of `rows`
 * output channels by `cols` inputs is stored in one of these formats
 * (docs/formats/quantized.md has the byte tables):
 *
 *   fp32  4 bytes a value; [rows, cols] row-major, or [cols, rows] (`in_out`,
 *         GPT-2's Conv1D layout, read in place from the parameter buffer).
 *   bf16  2 bytes a value; [rows, cols] row-major (the upper half of fp32).
 *   int8  ggml's Q8_0 block: 32 consecutive values of a row as an fp16 scale
 *         d = max|x| / 127 and 32 int8 q = round(x / d); value = d * q.
 *         34 bytes per 32 values (8.5 bits a value).
 *   q4    ggml's Q4_0 block: 32 values as an fp16 scale d = m / -8, where m is
 *         the value of largest magnitude (sign kept), and 16 bytes of 4-bit
 *         codes q in 0..15 (byte j: value j in the low nibble, value j + 16 in
 *         the high one); value = d * (q - 8). 18 bytes per 32 values (4.5 bits).
 *
 * Rows of the block formats are padded with zeros to a multiple of 32
 * values, so any `cols` works (ggml's own files need cols % 32 == 0; those
 * rows are byte-identical to ggml's).
 *
 * Kernels: out[M, rows] = x[M, cols] . W^T (+ bias), for the small M of
 * decoding (1 .. about 16 rows: one row per running sequence). Each output is
 * a dot product computed the same way whatever M is, so a sequence gets the
 * same logits alone or in a batch. They run on OpenMP threads over output
 * rows, never allocate, and come in variants chosen once at run time from
 * cllm_cpu() (CLLM_MAX_ISA lowers the choice): avx512 (x86-64-v4; int8 /
 * q4 dots on AVX512-VNNI where the CPU has it), avx2 (AVX2 + FMA) and a
 * portable C build. Output rows are cut into chunks that a small thread
 * pool (omp_get_max_threads() threads, the caller included) claims, so a
 * thread that loses its core delays one chunk, not every matmul. fp32 and bf16 weights multiply fp32
 * activations (bf16 widened by a shift): the fp32 product up to the order
 * of the sum. int8 and q4 weights multiply activations quantized per block
 * of 32 like Q8_0 (fp32 scale max|x| / 127, int8 codes rounded half away
 * from zero): each block adds d_w * d_x * (integer dot of the codes), as
 * llama.cpp computes Q8_0 / Q4_0 times Q8_0. int8 and q4 take any M: 4
 * or more rows run on register tiles of 2 weight rows by 4 rows of x, each
 * weight block unpacked once per tile, with every output computed by the
 * same operations as alone (bit for bit). Long prompts are faster on
 * cllm_qgemm (below): oneDNN's fp32 GEMM over panels of widened rows.
 */
#ifndef CLLM_QUANT_H
#define CLLM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_WFMT_FP32 = 0, CLLM_WFMT_BF16, CLLM_WFMT_INT8, CLLM_WFMT_Q4, CLLM_WFMT_COUNT } cllm_wfmt;

enum {
    CLLM_QBLOCK = 32,          /* values per block of int8 / q4 */
    CLLM_Q8_BLOCK_BYTES = 34,  /* fp16 scale + 32 int8 */
    CLLM_Q4_BLOCK_BYTES = 18,  /* fp16 scale + 16 bytes of nibbles */
};

/* "fp32", "bf16", "int8", "q4"; NULL for anything else. */
const char *cllm_wfmt_name(cllm_wfmt f);
/* Parses those names; false for anything else. */
bool cllm_wfmt_from_name(const char *name, cllm_wfmt *out);
/* Bytes of one stored row of `cols` values (block formats padded to 32). */
size_t cllm_wfmt_row_bytes(cllm_wfmt f, int64_t cols);

/* Quantizes one row of n values (any n >= 1) into ceil(n / 32) blocks; the
 * last block is padded with zeros. dst holds cllm_wfmt_row_bytes(.., n). */
void cllm_quant_q8_0_row(unsigned char *dst, const float *src, int64_t n);
void cllm_quant_q4_0_row(unsigned char *dst, const float *src, int64_t n);
/* An int8 code: round(v) half away from zero; NaN gives 0, values beyond
 * +-127 give +-127 (never an undefined conversion). */
int8_t cllm_quant_code8(float v);
/* The values of one stored row of format f (n values; fp32 rows copied). */
void cllm_quant_dequant_row(float *dst, const void *src, cllm_wfmt f, int64_t n);

/* A weight matrix as the kernels read it: `rows` output channels of `cols`
 * inputs in format fmt. data is borrowed. in_out is for fp32 only: the data
 * is [cols, rows] (GPT-2 Conv1D); every other format is [rows, cols]. */
typedef struct {
    cllm_wfmt fmt;
    const void *data;
    int rows, cols;
    bool in_out;
} cllm_qweight;

/* Bytes of the stored matrix (rows * cllm_wfmt_row_bytes). */
size_t cllm_qweight_bytes(cllm_wfmt f, int rows, int cols);

/* Stores a [rows, cols] fp32 matrix (or [cols, rows] when `transpose`,
 * written out transposed) in format f at dst (cllm_qweight_bytes bytes).
 * Runs on OpenMP threads over rows; a transposed source needs one row of
 * scratch per thread (CLLM_ERR_NOMEM when it cannot be had). */
cllm_status cllm_quant_matrix(void *dst, cllm_wfmt f, const float *src, int rows, int cols, bool transpose);

/* Bytes of scratch cllm_qmatmul needs for M rows of `cols` inputs in
 * format f: the quantized activations of int8 / q4 (per 32 inputs per row,
 * 36 bytes for int8, 68 for q4); 0 for fp32 and bf16. */
size_t cllm_qmatmul_scratch_bytes(cllm_wfmt f, int cols, int M);
/* out[M, w.rows] = x[M, w.cols] . W^T + bias (bias [w.rows] or NULL).
 * out must not alias x. M >= 1. scratch: cllm_qmatmul_scratch_bytes(w.fmt,
 * w.cols, M) bytes of the caller's (NULL when that is 0). */
void cllm_qmatmul(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
/* The same through a given variant: isa is lowered to the best variant
 * built for it and allowed by the CPU (portable always exists). For tests
 * that compare the variants in one process. */
void cllm_qmatmul_isa(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch,
                      cllm_isa isa);
/* "portable", "avx2", "avx512" or "avx512-vnni" (the avx512 build with
 * int8 / q4 dots on vpdpbusd): the variant cllm_qmatmul uses. */
const char *cllm_qmatmul_variant(void);

/* ------------------------------------------------------ prompts: panels
 * cllm_qgemm: the same product for the many rows of a prompt, on oneDNN's
 * fp32 GEMM. The weight rows are widened to fp32 (their stored values,
 * exactly) one panel of output channels at a time into the caller's
 * scratch (at most CLLM_QGEMM_PANEL_ROWS rows and about
 * CLLM_QGEMM_PANEL_FLOATS values, equal parts), and each panel multiplies
 * all M rows of x, so widening costs O(rows * cols) against the GEMM's
 * O(M * rows * cols). For int8 / q4 the activations first take the values
 * their quantized blocks have in cllm_qmatmul (d * q, the same codes): both
 * compute the sum over k of the same products, cllm_qmatmul with exact
 * integer dots per block and cllm_qgemm in fp32, so their outputs differ by
 * fp32 rounding only (not bit for bit). On AVX2 without VNNI this runs long
 * prompts faster than cllm_qmatmul's integer tiles (docs/inference.md); for
 * few rows widening dominates and cllm_qmatmul is the faster one
 * (CLLM_QGEMM_MIN_ROWS: the row count from which a model uses this).
 *
 * On a CPU with AVX512-VNNI, int8 / q4 take integer tiles instead
 * (src/quant/qgemm_vnni.c): the activations quantized exactly as
 * cllm_qmatmul quantizes them, 32 weight rows at a time repacked for
 * vpdpbusd, every output the sum of cllm_qmatmul's block terms d_w * d_x *
 * (exact integer dot) in another fp32 order; no widening, no oneDNN. */
enum { CLLM_QGEMM_PANEL_FLOATS = 1 << 21, CLLM_QGEMM_PANEL_ROWS = 2048, CLLM_QGEMM_MIN_ROWS = 64 };
/* Bytes of scratch cllm_qgemm needs for M rows of `cols` inputs: a panel
 * (CLLM_QGEMM_PANEL_FLOATS + 8 * cols floats), its [M, CLLM_QGEMM_PANEL_ROWS]
 * output, and for int8 / q4 the [M, cols] rounded activations (more than
 * the VNNI tiles' 40 bytes per 32 inputs per row); 0 for fp32. */
size_t cllm_qgemm_scratch_bytes(cllm_wfmt f, int cols, int M);
/* out[M, w.rows] = x[M, w.cols] . W^T + bias, as cllm_qmatmul (same
 * arguments; fp32 weights, in_out too, go to oneDNN directly). The
 * widening and copies run on cllm_qmatmul's thread pool, the GEMMs on
 * oneDNN's OpenMP threads; allocates nothing of its own. Fails only where
 * oneDNN does (its message left). */
cllm_status cllm_qgemm(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch);
/* The same through a given level: below CLLM_ISA_AVX512 int8 / q4 take
 * the panels even where the CPU has VNNI (for tests comparing the two). */
cllm_status cllm_qgemm_isa(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch,
                           cllm_isa isa);
/* The path cllm_qgemm takes for format f: "avx512-vnni", "onednn-panels"
 * (bf16, and int8 / q4 without VNNI) or "onednn" (fp32). */
const char *cllm_qgemm_variant(cllm_wfmt f);

/* The decode step's threads: runs fn(ctx, c) once for every c in [0, n) on
 * the pool that runs cllm_qmatmul's chunks (the calling thread and up to
 * omp_get_max_threads() - 1 helpers) and returns when all are done. A
 * decode step's other parallel work (attention over the cache, the
 * pointwise activations, the per-sequence draws) goes through it too, so
 * the step keeps one set of threads busy instead of waking an OpenMP team
 * between matmuls whose idle threads spin against the pool's (and the
 * reverse). Inside an OpenMP region, with one thread, or while another
 * thread's job holds the pool, the chunks run in order on the caller. fn
 * must write disjoint outputs per chunk and must not call this again. */
typedef void (*cllm_quant_task_fn)(void *ctx, int chunk);
void cllm_quant_parallel(cllm_quant_task_fn fn, void *ctx, int n);
/* Threads cllm_quant_parallel would use now (the caller included). */
int cllm_quant_threads(void);


/* ------------------------------------------------------------ bitsandbytes
 * The formats of a frozen QLoRA base (bitsandbytes' numerics, as
 * transformers' BitsAndBytesConfig selects them; docs/lora.md#qlora). A
 * matrix of `rows` output channels by `cols` inputs ([out, in], row-major;
 * GPT-2's Conv1D weights transposed first) is quantized as one flat vector
 * of n = rows * cols values, as bitsandbytes quantizes a weight tensor:
 *
 *   nf4 / fp4  blocks of 64 consecutive values (a block may span rows): an
 *              fp32 absmax a = max|x|, each value x * (1 / a) (fp32) coded
 *              as the nearest of 16 values of the code book (nf4: the
 *              NormalFloat quantiles; fp4: 1 sign, 2 exponent, 1 mantissa
 *              bits with bias 3, over 12), ties to the lower code (fp4:
 *              bitsandbytes' own decision thresholds, which are not all
 *              exact midpoints); two codes a byte, the first value in the
 *              high nibble. Value = code * a (fp32).
 *   double quantization (bnb_4bit_use_double_quant): the fp32 absmax
 *              values are stored in 8 bits: offset = their mean (the fp32
 *              rounding of the exact mean), a - offset quantized in blocks
 *              of 256 with the signed dynamic 8-bit map (fp32 absmax2 per
 *              block, bitsandbytes' binary-search rounding); a = map[q] *
 *              absmax2 + offset (two fp32 roundings).
 *   int8       LLM.int8()'s vector-wise weights: per row an fp32 absmax s,
 *              q = round-half-even(x * (127 / s)); value = (q * s) * (1/127)
 *              (bitsandbytes' int8_vectorwise_dequant, 1/127 in fp32).
 *
 * Storage of one matrix (cllm_bnb_bytes): the codes, then (4-byte aligned)
 * the fp32 absmax values, or with double quantization the uint8 quantized
 * absmax values then (aligned) the fp32 absmax2 values. Nothing here
 * allocates; the model dequantizes a matrix into scratch for each GEMM.
 */
typedef enum { CLLM_BNB_NONE = 0, CLLM_BNB_INT8, CLLM_BNB_NF4, CLLM_BNB_FP4 } cllm_bnb_type;

enum { CLLM_BNB_BLOCK = 64, CLLM_BNB_DQ_BLOCK = 256 };

typedef struct {
    cllm_bnb_type type;
    bool double_quant;      /* nf4 / fp4 only */
    int rows, cols;
    unsigned char *codes;   /* int8: n int8; nf4 / fp4: ceil(n / 2) bytes */
    float *absmax;          /* nf4 / fp4 without double quant: [ceil(n / 64)]; int8: [rows] */
    unsigned char *qabsmax; /* double quant: [ceil(n / 64)] */
    float *absmax2;         /* double quant: [ceil(ceil(n / 64) / 256)] */
    float offset;           /* double quant: the mean the codes are centred on */
} cllm_bnb_matrix;

/* "int8", "nf4", "fp4"; NULL for anything else. */
const char *cllm_bnb_type_name(cllm_bnb_type t);
/* Bytes of one stored matrix (a multiple of 4). */
size_t cllm_bnb_bytes(cllm_bnb_type t, bool double_quant, int rows, int cols);
/* Points q's arrays into buf (cllm_bnb_bytes bytes, 4-byte aligned). */
void cllm_bnb_view(cllm_bnb_matrix *q, cllm_bnb_type t, bool double_quant, int rows, int cols, void *buf);
/* Floats of scratch cllm_bnb_quantize needs (the unquantized absmax values
 * of double quantization; 0 otherwise). */
size_t cllm_bnb_quantize_scratch(const cllm_bnb_matrix *q);
/* Quantizes src [rows, cols] into q's arrays. */
void cllm_bnb_quantize(cllm_bnb_matrix *q, const float *src, float *scratch);
/* dst[nrows, cols] = the values of rows r0 .. r0 + nrows - 1. OpenMP over
 * blocks; the same values whatever the split. */
void cllm_bnb_dequantize(float *dst, const cllm_bnb_matrix *q, int r0, int nrows);
/* The 16 values of the nf4 or fp4 code book (index = code); the 256 values
 * of the signed dynamic map of double quantization. */
const float *cllm_bnb_code4(cllm_bnb_type t);
const float *cllm_bnb_dynamic_map(void);

/* bnb_4bit_compute_dtype: the dtype a 4-bit layer's matmul runs in, as
 * bitsandbytes' Linear4bit. FP32: the dequantized weight times the fp32
 * input. BF16 / FP16: weight and input rounded to that type (nearest even),
 * multiplied with fp32 accumulation, the output rounded to it; the input
 * gradient likewise (docs/lora.md#qlora). 8-bit layers ignore it, as
 * transformers does. */
typedef enum { CLLM_BNB_COMPUTE_FP32 = 0, CLLM_BNB_COMPUTE_BF16, CLLM_BNB_COMPUTE_FP16 } cllm_bnb_compute;
/* "float32", "bfloat16", "float16" (torch's names); NULL out of range. */
const char *cllm_bnb_compute_name(cllm_bnb_compute c);

/* The "quantization" section of a training config: transformers'
 * BitsAndBytesConfig keys. Strings are owned (cllm_bnb_config_free). */
typedef struct {
    bool enabled;              /* load_in_8bit or load_in_4bit */
    bool load_in_8bit, load_in_4bit;
    cllm_bnb_type quant_type;  /* bnb_4bit_quant_type: "fp4" (transformers' default) or "nf4" */
    bool double_quant;         /* bnb_4bit_use_double_quant: false */
    cllm_bnb_compute compute;  /* bnb_4bit_compute_dtype: float32 (transformers' default) */
    double int8_threshold;     /* llm_int8_threshold: 6.0 (see docs/lora.md: activations stay fp32) */
    char **skip_modules;       /* llm_int8_skip_modules: modules kept in fp32 */
    int n_skip_modules;
} cllm_bnb_config;

void cllm_bnb_config_default(cllm_bnb_config *c);
void cllm_bnb_config_free(cllm_bnb_config *c); /* NULL and defaults are no-ops */
cllm_status cllm_bnb_config_copy(cllm_bnb_config *dst, const cllm_bnb_config *src);
/* Parses BitsAndBytesConfig keys from obj (a json_t object) into c (which
 * holds defaults or earlier values); `where` is the key path in messages
 * ("quantization"), `path` the file. Unknown keys, both load_in_8bit and
 * load_in_4bit, neither, and values cllm cannot honour are errors naming
 * the key. */
struct json_t;
cllm_status cllm_bnb_config_parse(cllm_bnb_config *c, const struct json_t *obj, const char *where, const char *path);
/* The matrix format c selects (CLLM_BNB_NONE when not enabled). */
cllm_bnb_type cllm_bnb_config_type(const cllm_bnb_config *c);

#ifdef __cplusplus
}
#endif

#endif
