/*
 * Fuzz target: data files as users write them (src/data/records.c,
 * jsonl.c). The first input byte picks the file kind (.jsonl, .json array
 * with comments, .txt paragraphs); the rest is the file. Every record is
 * read with cllm_records_next and parsed with cllm_sample_parse (default
 * template, vocabulary 1<<17); a .jsonl file is also loaded whole as
 * pre-tokenized samples with cllm_dataset_load_jsonl. The default template
 * is built once, before the inputs.
 */
#include "cllm/data.h"
#include "cllm/sample.h"
#include "data/data_impl.h"
#include "fuzz_util.h"

#include <stdlib.h>

static cllm_template t;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    (void)fuzz_dir();
    if (cllm_template_load(&t, NULL) != CLLM_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const names[] = {"data.jsonl", "data.json", "data.txt"};
    const char *path = fuzz_write(0, names[data[0] % 3], data + 1, size - 1);
    cllm_record_reader *r = NULL;
    if (fuzz_note(cllm_records_open(&r, path)) == CLLM_OK) {
        cllm_sample s = {0};
        cllm_record rec;
        bool got = false;
        while (cllm_records_next(r, &rec, &got) == CLLM_OK && got) {
            if (rec.kind == CLLM_REC_JSON) (void)fuzz_note(cllm_sample_parse(&s, rec.text, rec.len, &rec.loc, &t, 1 << 17));
            else (void)cllm_sample_from_text(&s, rec.text, rec.len, &t);
        }
        (void)cllm_records_bytes(r);
        cllm_sample_free(&s);
    }
    cllm_records_close(r);
    if (data[0] % 3 == 0) {
        cllm_dataset *d = NULL;
        if (fuzz_note(cllm_dataset_load_jsonl(&d, path, 1 << 17)) == CLLM_OK) {
            (void)cllm_dataset_count(d);
            (void)cllm_dataset_tokens(d);
        }
        cllm_dataset_free(d);
    }
    return 0;
}
