/*
 * The QLoRA flags of train, grad, eval and generate: transformers'
 * BitsAndBytesConfig as flags (--load-in-4bit, --load-in-8bit,
 * --bnb-4bit-quant-type, --bnb-4bit-use-double-quant,
 * --bnb-4bit-compute-dtype), written into a
 * "quantization" object and read by the one reader of cllm/quant.h.
 */
#ifndef CLLM_TOOL_QUANT_FLAGS_H
#define CLLM_TOOL_QUANT_FLAGS_H

#include <jansson.h>
#include <stdbool.h>

#include "args.h"
#include "cllm/model.h"
#include "cllm/quant.h"

typedef struct {
    bool load_in_4bit, load_in_8bit, double_quant;
    const char *quant_type, *compute_dtype;
} quant_flags;

#define QUANT_FLAG_SPECS(f)                                                                                         \
    {"load-in-4bit", ARG_FLAG, &(f).load_in_4bit, NULL, false,                                                      \
     "QLoRA: keep the base's linear layers in 4 bits (quantization.load_in_4bit; docs/lora.md#qlora)"},            \
        {"load-in-8bit", ARG_FLAG, &(f).load_in_8bit, NULL, false,                                                  \
         "QLoRA: keep them in 8 bits, LLM.int8() row-wise (quantization.load_in_8bit)"},                           \
        {"bnb-4bit-quant-type", ARG_STR, &(f).quant_type, NULL, false,                                              \
         "nf4 or fp4 (quantization.bnb_4bit_quant_type; default fp4, as transformers)"},                           \
        {"bnb-4bit-use-double-quant", ARG_FLAG, &(f).double_quant, NULL, false,                                     \
         "quantize the absmax values too (quantization.bnb_4bit_use_double_quant)"},                            \
        {"bnb-4bit-compute-dtype", ARG_STR, &(f).compute_dtype, NULL, false,                                        \
         "float32, bfloat16 or float16: the 4-bit layers' matmul dtype (quantization.bnb_4bit_compute_dtype)"}

/* Whether any of the flags is set. */
bool quant_flags_any(const quant_flags *f);
/* Sets the flags' keys in obj (a "quantization" object). */
void quant_flags_to_json(const quant_flags *f, json_t *obj);
/* Loads model dir: quantized as the flags say when any is set (errors
 * name the key), else fp32 weights by `weights` (cllm_model_load_weights).
 * Returns a cllm_status; the message is in cllm_last_error(). */
cllm_status quant_flags_load(const quant_flags *f, cllm_model **out, const char *dir, const char *weights);

#endif
