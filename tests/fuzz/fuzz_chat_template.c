/*
 * Fuzz target: chat templates (src/serve/jinja_*.c, chat_template.c). The
 * input is a template, optionally followed by FUZZ_SEP and a JSON array of
 * messages (a fixed two-turn conversation when absent or not an array). The
 * template is compiled and, when it compiles, rendered twice (with and
 * without the generation prompt) with a tools list in `extra`. The step
 * budget is lowered to 10^5 so every input runs well within the fuzzer's
 * one-second limit; the output bound (16 MiB) stays as shipped.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/chat_template.h"
#include "fuzz_util.h"
#include "serve/jinja_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jinja_max_steps = 100000;
    const uint8_t *part[2];
    size_t len[2];
    int n = fuzz_split(data, size, part, len, 2);
    char *src = malloc(len[0] + 1);
    if (!src) return 0;
    memcpy(src, part[0], len[0]);
    src[len[0]] = 0;
    json_t *msgs = NULL;
    if (n == 2) msgs = json_loadb((const char *)part[1], len[1], 0, NULL);
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        msgs = json_pack("[{ssss}{ssss}]", "role", "user", "content", "Hi \"there\"\n", "role", "assistant",
                         "content", "ünïcödé");
    }
    json_t *extra = json_pack("{s[{ss}]}", "tools", "name", "get_weather");
    cllm_chat_template *t = NULL;
    if (fuzz_note(cllm_chat_template_init(&t, src, "fuzz")) == CLLM_OK) {
        for (int g = 0; g < 2; g++) {
            char *out = NULL;
            if (fuzz_note(cllm_chat_template_render(t, msgs, g, "<s>", "</s>", extra, &out)) == CLLM_OK &&
                strlen(out) > (16u << 20))
                abort(); /* the output bound was not kept */
            free(out);
        }
    }
    cllm_chat_template_free(t);
    json_decref(extra);
    json_decref(msgs);
    free(src);
    return 0;
}
