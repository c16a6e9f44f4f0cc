/*
 * cllm gguf: export a model and its tokenizer as one GGUF file (version 3,
 * little-endian, alignment 32) that llama.cpp loads and runs.
 *
 * What is written (docs/inference.md has the full mapping):
 *   - general.architecture ("llama" or "gpt2"), general.name,
 *     general.alignment, general.file_type (0 all F32, 1 mostly F16);
 *   - the hyperparameters llama.cpp reads for the architecture: context,
 *     embedding, feed-forward length, block count, head counts (LLaMA: kv
 *     heads, RoPE dimension count and freq base, RMS epsilon; GPT-2:
 *     LayerNorm epsilon), vocab size;
 *   - tokenizer.ggml.*: model "llama" (SentencePiece-style BPE: tokens,
 *     scores, token types) or "gpt2" (byte-level BPE: tokens, token types,
 *     merges, pre-tokenizer "gpt-2"), bos/eos/unk/pad ids where the
 *     tokenizer has them, add_bos_token / add_eos_token as encode adds them;
 *     ids the tokenizer does not use (a model vocabulary padded beyond the
 *     tokenizer's) become "[PADn]" tokens of type UNUSED;
 *   - the tensors under llama.cpp's names, in the layout its HF converter
 *     writes: LLaMA q/k rows permuted per head from HF's rotate-half RoPE
 *     layout into interleaved pairs, GPT-2 Conv1D weights transposed to
 *     [out, in], GPT-2's output.weight a copy of token_embd.
 * With CLLM_GGUF_F16 every matrix is stored as F16 (round to nearest
 * even); one-dimensional tensors (norm weights, biases) stay F32, as
 * llama.cpp's converter keeps them. With CLLM_GGUF_Q8_0 matrices are
 * stored in ggml's Q8_0 blocks (32 values: an f16 scale max|x|/127 and 32
 * int8, rounded half away from zero), those whose rows are not a multiple
 * of 32 long as F16 and position embeddings as F32 (the converter's rules);
 * general.file_type is then 7 and general.quantization_version 2.
 *
 * Left out: BLOOM (CLLM_ERR_UNSUPPORTED), quantized types other than Q8_0, tokenizers
 * other than BPE. Byte-level tokenizers are declared with GPT-2's
 * pre-tokenizer; one whose split pattern differs encodes differently in
 * llama.cpp.
 */
#ifndef CLLM_GGUF_H
#define CLLM_GGUF_H

#include <stdbool.h>

#include "cllm/core.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage type of the matrices; the values are ggml's type ids. */
typedef enum { CLLM_GGUF_F32 = 0, CLLM_GGUF_F16 = 1, CLLM_GGUF_Q8_0 = 8 } cllm_gguf_type;

/* "f32", "f16", "q8_0"; false / NULL for anything else. */
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
 * CLLM_ERR_UNSUPPORTED for BLOOM, CLLM_ERR_ARG when the tokenizer uses ids
 * beyond the model's vocab_size or a parameter is missing, CLLM_ERR_IO on
 * a write error, CLLM_ERR_NOMEM. Not thread-safe with respect to m. */
cllm_status cllm_gguf_export(cllm_model *m, const cllm_tokenizer *tok, const cllm_gguf_params *p, const char *path);

#ifdef __cplusplus
}
#endif
#endif
