/*
 * cllm gguf: export a model and its tokenizer as one GGUF file (version 3,
 * little-endian, alignment 32) that llama.cpp loads and runs.
 *
 * What is written (docs/inference.md has the full mapping):
 *   - general.architecture ("llama", "gpt2" or "bloom"), general.name,
 *     general.alignment, general.file_type (0 all F32, 1 mostly F16);
 *   - the hyperparameters llama.cpp reads for the architecture: context,
 *     embedding, feed-forward length, block count, head counts (LLaMA: kv
 *     heads, RoPE dimension count and freq base, RMS epsilon; GPT-2:
 *     LayerNorm epsilon; BLOOM: kv heads = heads, LayerNorm epsilon,
 *     context 2048 since BLOOM has no position limit), vocab size;
 *   - tokenizer.ggml.*: model "llama" (SentencePiece-style BPE: tokens,
 *     scores, token types) or "gpt2" (byte-level BPE: tokens, token types,
 *     merges, pre-tokenizer "gpt-2"), bos/eos/unk/pad ids where the
 *     tokenizer has them, add_bos_token / add_eos_token as encode adds them;
 *     ids the tokenizer does not use (a model vocabulary padded beyond the
 *     tokenizer's) become "[PADn]" tokens of type UNUSED;
 *   - the tensors under llama.cpp's names, in the layout its HF converter
 *     writes: LLaMA q/k rows permuted per head from HF's rotate-half RoPE
 *     layout into interleaved pairs, GPT-2 Conv1D weights transposed to
 *     [out, in], GPT-2's output.weight a copy of token_embd; BLOOM's fused
 *     query_key_value rows reordered from [head][q,k,v][HS] to
 *     [q,k,v][head][HS], its embedding LayerNorm as token_embd_norm and
 *     its tied head written as output.weight.
 * With CLLM_GGUF_F16 every matrix is stored as F16 (round to nearest
 * even); one-dimensional tensors (norm weights, biases) stay F32, as
 * llama.cpp's converter keeps them. With CLLM_GGUF_Q8_0 matrices are
 * stored in ggml's Q8_0 blocks (32 values: an f16 scale max|x|/127 and 32
 * int8, rounded half away from zero), those whose rows are not a multiple
 * of 32 long as F16 and position embeddings as F32 (the converter's rules);
 * general.file_type is then 7 and general.quantization_version 2. With
 * CLLM_GGUF_Q4_0 the same rules with ggml's Q4_0 blocks (llama-quantize
 * --pure: every such matrix, the head included), file_type 2.
 *
 * Left out: k-quants and other quantized types, tokenizers other than BPE. Byte-level tokenizers are declared with GPT-2's
 * pre-tokenizer; one whose split pattern differs encodes differently in
 * llama.cpp.
 */
#ifndef CLLM_GGUF_H
#define CLLM_GGUF_H

#include <stdbool.h>
#include <stddef.h>

#include "cllm/core.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage type of the matrices; the values are ggml's type ids. */
typedef enum { CLLM_GGUF_F32 = 0, CLLM_GGUF_F16 = 1, CLLM_GGUF_Q4_0 = 2, CLLM_GGUF_Q8_0 = 8 } cllm_gguf_type;

/* "f32", "f16", "q8_0", "q4_0"; false / NULL for anything else. */
bool cllm_gguf_type_from_name(const char *name, cllm_gguf_type *out);
const char *cllm_gguf_type_name(cllm_gguf_type t);

typedef struct {
    cllm_gguf_type type; /* of the matrices (default F32) */
    const char *name;    /* general.name; NULL: the architecture's name */
} cllm_gguf_params;

/* F32, no name. */
cllm_gguf_params cllm_gguf_params_default(void);

/* Writes model m with tokenizer tok as the GGUF file `path` (temp file in
 * the same folder, then rename: on failure nothing is left at `path`).
 * m is only read (its parameters through cllm_model_params). Fails with
 * CLLM_ERR_ARG when the tokenizer uses ids
 * beyond the model's vocab_size or a parameter is missing, CLLM_ERR_IO on
 * a write error, CLLM_ERR_NOMEM. Not thread-safe with respect to m. */
cllm_status cllm_gguf_export(cllm_model *m, const cllm_tokenizer *tok, const cllm_gguf_params *p, const char *path);

/* ---- GGML block formats (ggml_blocks.c) ----
 * Blocks of CLLM_GGML_QK consecutive values (n a multiple of it), written
 * bit for bit as llama.cpp's reference quantizers write them:
 *   Q8_0  CLLM_GGML_Q8_0_BYTES per block: f16 scale d = max|x| / 127, then
 *         32 int8 round(x / d); value d * q
 *   Q4_0  CLLM_GGML_Q4_0_BYTES per block: f16 scale d = m / -8 with m the
 *         value of largest magnitude (sign kept), then 16 bytes of 4-bit
 *         codes min(15, trunc(x / d + 8.5)), byte j = value j (low nibble)
 *         and value j + 16 (high nibble); value d * (q - 8)
 * out holds n / 32 blocks. Kernels never allocate; thread-safe. */
enum { CLLM_GGML_QK = 32, CLLM_GGML_Q8_0_BYTES = 34, CLLM_GGML_Q4_0_BYTES = 18 };
void cllm_ggml_quantize_q8_0(const float *x, size_t n, unsigned char *out);
void cllm_ggml_quantize_q4_0(const float *x, size_t n, unsigned char *out);
void cllm_ggml_dequantize_q4_0(const unsigned char *in, size_t n, float *x);

#ifdef __cplusplus
}
#endif
#endif
