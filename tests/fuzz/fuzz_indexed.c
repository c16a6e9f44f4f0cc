/*
 * Fuzz target: Megatron indexed datasets (src/data/indexed.c). The input is
 * split at FUZZ_SEP into PREFIX.idx, PREFIX.bin and (when a third part is
 * present) PREFIX.mask, opened with cllm_indexed_open; an accepted dataset
 * has every token and loss bit read (up to 1<<16 of them).
 */
#include "data/data_impl.h"
#include "fuzz_util.h"

#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    int n = fuzz_split(data, size, part, len, 3);
    static const char *const ext[] = {"d.idx", "d.bin", "d.mask"};
    for (int i = 0; i < 3; i++) {
        if (i < n) fuzz_write(i, ext[i], part[i], len[i]);
        else fuzz_absent(i);
    }
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/d", fuzz_dir());
    cllm_indexed d = {0};
    if (fuzz_note(cllm_indexed_open(&d, prefix)) == CLLM_OK) {
        uint64_t sum = 0;
        for (uint64_t i = 0; i < d.n_tokens && i < (1u << 16); i++)
            sum += (uint64_t)cllm_indexed_token(&d, i) + cllm_indexed_loss(&d, i);
        for (uint64_t i = 0; i < d.n_seq; i++) sum += (uint64_t)d.lengths[i] + (uint64_t)d.pointers[i];
        for (uint64_t i = 0; i <= d.n_doc; i++) sum += (uint64_t)d.docs[i];
        if (sum == 42) fputc(' ', stderr); /* keeps the reads */
    }
    cllm_indexed_close(&d);
    return 0;
}
