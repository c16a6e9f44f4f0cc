/*
 * Fuzz target: a checkpoint folder as resume finds it (src/train/
 * checkpoint.c). The input is split at FUZZ_SEP into OUT/latest,
 * OUT/checkpoint-1/manifest.json, OUT/checkpoint-1/trainer_state.json and
 * a data file OUT/checkpoint-1/model.safetensors. cllm_ckpt_find(OUT,
 * "auto") follows `latest`; the folder it names (or checkpoint-1) is then
 * checked with cllm_ckpt_verify and its state read with
 * cllm_ckpt_read_state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cllm/checkpoint.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[4];
    size_t len[4];
    int n = fuzz_split(data, size, part, len, 4);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/checkpoint-1", fuzz_dir());
    if (mkdir(ck, 0700) != 0 && errno != EEXIST) abort(); /* kept from the previous input */
    static const char *const names[] = {"latest", "checkpoint-1/manifest.json", "checkpoint-1/trainer_state.json",
                                        "checkpoint-1/model.safetensors"};
    for (int i = 0; i < 4; i++) {
        if (i < n) fuzz_write(i, names[i], part[i], len[i]);
        else fuzz_absent(i);
    }
    char *dir = NULL;
    if (fuzz_note(cllm_ckpt_find(fuzz_dir(), "auto", &dir)) == CLLM_OK) {
        const char *d = dir ? dir : ck;
        (void)fuzz_note(cllm_ckpt_verify(d));
        cllm_ckpt_state st;
        (void)fuzz_note(cllm_ckpt_read_state(d, &st));
    }
    free(dir);
    return 0;
}
