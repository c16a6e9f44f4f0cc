/*
 * The tiny random models the C tests of generation, batching and
 * objectives run on: a family's "tiny" preset with some config keys
 * overridden (a JSON object), its parameters drawn from `seed`.
 */
#ifndef CLLM_TEST_TINY_MODEL_H
#define CLLM_TEST_TINY_MODEL_H

#include <jansson.h>
#include <stdio.h>

#include "cllm/model.h"

/* NULL on failure (the message is printed). */
static inline cllm_model *tiny_model(cllm_arch arch, const char *extra_json, uint64_t seed) {
    json_t *cfg = NULL;
    cllm_model *m = NULL;
    if (cllm_model_preset(&cfg, arch, "tiny")) return NULL;
    json_error_t err;
    json_t *extra = json_loads(extra_json, 0, &err);
    if (!extra) {
        fprintf(stderr, "bad test json %s: %s\n", extra_json, err.text);
        json_decref(cfg);
        return NULL;
    }
    json_object_update(cfg, extra);
    json_decref(extra);
    if (cllm_model_init_random(&m, cfg, seed)) fprintf(stderr, "init: %s\n", cllm_last_error());
    json_decref(cfg);
    return m;
}

#endif
