/*
 * Fuzz target: one training record (src/data/sample.c, template.c). The
 * input is a JSON record, optionally followed by FUZZ_SEP and a prompt
 * template file. The template is loaded with cllm_template_load (the
 * defaults when absent or refused), the record parsed and rendered with
 * cllm_sample_parse (ids checked against a vocabulary of 100) and, for
 * pre-tokenized records, turned into ids and labels with
 * cllm_sample_encode. The default template is built once, before the
 * inputs.
 */
#include "cllm/sample.h"
#include "cllm/tokenizer.h"
#include "fuzz_util.h"

#include <stdlib.h>

static cllm_template defaults;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    (void)fuzz_dir();
    if (cllm_template_load(&defaults, NULL) != CLLM_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int n = fuzz_split(data, size, part, len, 2);
    cllm_template own, *t = &defaults;
    if (n == 2 && fuzz_note(cllm_template_load(&own, fuzz_write(0, "template.json", part[1], len[1]))) == CLLM_OK)
        t = &own;
    cllm_sample s = {0};
    cllm_loc where = {"data.jsonl", 1, 1};
    if (fuzz_note(cllm_sample_parse(&s, (const char *)part[0], len[0], &where, t, 100)) == CLLM_OK &&
        s.type == CLLM_SAMPLE_TOKENS) {
        cllm_token_buf ids = {0}, labels = {0};
        (void)cllm_sample_encode(&s, NULL, t, 100, &where, &ids, &labels);
        cllm_token_buf_free(&ids);
        cllm_token_buf_free(&labels);
    }
    cllm_sample_free(&s);
    if (t == &own) cllm_template_free(&own);
    return 0;
}
