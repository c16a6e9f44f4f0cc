/*
 * The QLoRA flags (quant_flags.h).
 */
#include <string.h>

#include "quant_flags.h"

bool quant_flags_any(const quant_flags *f) {
    return f->load_in_4bit || f->load_in_8bit || f->double_quant || f->quant_type || f->compute_dtype;
}

void quant_flags_to_json(const quant_flags *f, json_t *obj) {
    if (f->load_in_4bit) json_object_set_new(obj, "load_in_4bit", json_true());
    if (f->load_in_8bit) json_object_set_new(obj, "load_in_8bit", json_true());
    if (f->double_quant) json_object_set_new(obj, "bnb_4bit_use_double_quant", json_true());
    if (f->quant_type) json_object_set_new(obj, "bnb_4bit_quant_type", json_string(f->quant_type));
    if (f->compute_dtype) json_object_set_new(obj, "bnb_4bit_compute_dtype", json_string(f->compute_dtype));
}

cllm_status quant_flags_load(const quant_flags *f, cllm_model **out, const char *dir, const char *weights) {
    *out = NULL;
    if (!quant_flags_any(f)) return cllm_model_load_weights(out, dir, weights);
    if (weights && strcmp(weights, "fp32"))
        return CLLM_FAIL(CLLM_ERR_ARG, "--weights %s with --load-in-4bit / --load-in-8bit: choose one", weights);
    json_t *obj = json_object();
    if (!obj) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    quant_flags_to_json(f, obj);
    cllm_bnb_config c;
    cllm_bnb_config_default(&c);
    cllm_status st = cllm_bnb_config_parse(&c, obj, "quantization", "flags");
    if (!st) st = cllm_model_load_quantized(out, dir, &c);
    cllm_bnb_config_free(&c);
    json_decref(obj);
    return st;
}
