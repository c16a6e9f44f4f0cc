/*
 * Fuzz target: a model's config.json (src/model/config.c). The input is
 * parsed as JSON (cllm_json_parse) and handed to
 * cllm_model_config_from_json; an accepted config is then sized
 * (cllm_model_config_params, _unit_params, _groups), which builds the
 * parameter layout without allocating the parameters, so the accepted
 * sizes must stay within what that arithmetic and the layout can hold.
 */
#include <jansson.h>
#include <stdlib.h>

#include "cllm/json.h"
#include "cllm/model.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fuzz_dir(); /* silences warnings */
    json_t *j = NULL;
    if (fuzz_note(cllm_json_parse(&j, (const char *)data, size, "config.json")) != CLLM_OK) return 0;
    cllm_model_config cfg;
    if (fuzz_note(cllm_model_config_from_json(&cfg, j, "config.json")) == CLLM_OK) {
        size_t n_params = 0, buffer_len = 0, first = 0, last = 0, max_block = 0;
        (void)cllm_model_config_params(&cfg, &n_params, &buffer_len);
        (void)cllm_model_config_groups(&cfg, &first, &last, &max_block);
        if (cfg.n_layer >= 0 && cfg.n_layer < 100000) {
            size_t *units = calloc((size_t)cfg.n_layer + 2, sizeof *units);
            if (!units) abort();
            (void)cllm_model_config_unit_params(&cfg, units);
            free(units);
        }
    }
    json_decref(j);
    return 0;
}
