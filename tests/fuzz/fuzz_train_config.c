/*
 * Fuzz target: the training config (src/train/config.c,
 * config_resolve.c): the input is parsed as JSON and given to
 * cllm_train_config_parse (strict or lenient, by the last input byte),
 * then cllm_train_config_resolve with a fuzzed training-set size, the
 * resolved config written back (cllm_train_config_to_json) and hashed.
 */
#include <jansson.h>

#include "cllm/json.h"
#include "cllm/train.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fuzz_dir(); /* silences warnings */
    if (size < 1) return 0;
    unsigned ctl = data[size - 1];
    json_t *j = NULL;
    if (fuzz_note(cllm_json_parse(&j, (const char *)data, size - 1, "train.json")) != CLLM_OK) return 0;
    cllm_train_config cfg;
    if (fuzz_note(cllm_train_config_parse(&cfg, j, "train.json", ctl & 1)) == CLLM_OK &&
        fuzz_note(cllm_train_config_resolve(&cfg, (ctl & 2) ? (uint64_t)(ctl >> 2) * 1000u : 0)) == CLLM_OK) {
        json_t *out = cllm_train_config_to_json(&cfg);
        json_decref(out);
        (void)cllm_train_config_hash(&cfg);
    }
    cllm_train_config_free(&cfg);
    return 0;
}
