/*
 * Fuzz target: tokenizer.json (src/tokenizer/load.c and the structures it
 * builds). The input is tokenizer.json, optionally followed by FUZZ_SEP and
 * a tokenizer_config.json; both are written to a temporary folder and
 * loaded with cllm_tokenizer_load. A loaded tokenizer encodes a short
 * mixed text (ASCII, accents, CJK, emoji, digits, whitespace runs, a NUL)
 * with and without special tokens, and decodes the ids back.
 */
#include <stdlib.h>

#include "cllm/tokenizer.h"
#include "fuzz_util.h"

static const char TEXT[] = "Hello world!  It's 2024: caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\n\tend\0x <s></s>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int n = fuzz_split(data, size, part, len, 2);
    const char *path = fuzz_write(0, "tokenizer.json", part[0], len[0]);
    if (n > 1) fuzz_write(1, "tokenizer_config.json", part[1], len[1]);
    else fuzz_absent(1);
    cllm_tokenizer *tok = NULL;
    if (fuzz_note(cllm_tokenizer_load(&tok, path)) != CLLM_OK) return 0;
    for (int special = 0; special < 2; special++) {
        cllm_token_buf ids = {0};
        if (cllm_tokenizer_encode(tok, TEXT, sizeof TEXT - 1, special, &ids) == CLLM_OK) {
            char *text = NULL;
            size_t tl = 0;
            if (cllm_tokenizer_decode(tok, ids.ids, ids.n, special, &text, &tl) == CLLM_OK) free(text);
        }
        cllm_token_buf_free(&ids);
    }
    (void)cllm_tokenizer_vocab_size(tok);
    cllm_tokenizer_free(tok);
    return 0;
}
