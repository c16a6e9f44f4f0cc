/*
 * Fuzz target: the request bodies of `cllm serve` (src/serve/request.c).
 * The input is a JSON body; it is parsed as the server parses it and read
 * as a TGI request, an OpenAI completion and an OpenAI chat completion
 * (rendered with a ChatML template) against a server description with the
 * GPT-2 tokenizer of the fixtures and small limits. Every outcome must be
 * a validated request or an error status with a message; nothing is run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/chat_template.h"
#include "fuzz_util.h"
#include "serve/serve_impl.h"

#ifndef CLLM_FUZZ_GPT2
#define CLLM_FUZZ_GPT2 "../shared/fixtures/hf/gpt2"
#endif

static const char CHATML[] =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static cllm_server srv;

static void setup(void) {
    static cllm_tokenizer *tok;
    static cllm_chat_template *tmpl;
    if (tok) return;
    /* CLLM_FUZZ_GPT2 in the environment: the fixture on a machine the
     * binary was copied to */
    const char *gpt2 = getenv("CLLM_FUZZ_GPT2");
    if (!gpt2 || !*gpt2) gpt2 = CLLM_FUZZ_GPT2;
    if (cllm_tokenizer_load(&tok, gpt2) != CLLM_OK) {
        fprintf(stderr, "fuzz_serve_request: %s (set CLLM_FUZZ_GPT2 to the fixtures' hf/gpt2 folder)\n",
                cllm_last_error());
        abort();
    }
    if (cllm_chat_template_init(&tmpl, CHATML, "fuzz")) abort();
    srv.tok = tok;
    srv.tmpl = tmpl;
    srv.vocab = cllm_tokenizer_vocab_size(tok);
    srv.n_ctx = 256;
    srv.p.max_total_tokens = 256;
    srv.p.max_input_tokens = 255;
    srv.p.max_stop_sequences = 4;
    srv.p.max_top_n_tokens = 5;
    srv.p.max_n = 4;
}

/* The tokenizer loads once, before the inputs (and outside their time limit). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    (void)fuzz_dir();
    setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
    if (!body) return 0;
    for (int kind = 0; kind < 3; kind++) {
        srv_gen g;
        srv_err e = {0};
        int rc = kind == 0 ? srv_parse_tgi(&srv, body, &g, &e) : srv_parse_openai(&srv, body, kind == 2, &g, &e);
        if (rc == 0 && (g.n_ids == 0 || g.n_ids > 255 || g.gp.max_new_tokens < 1 ||
                        g.n_ids + (size_t)g.gp.max_new_tokens > 256))
            abort(); /* a request that passed validation must respect the limits */
        if (rc != 0 && (e.status < 400 || !e.msg[0])) abort();
        srv_gen_free(&g);
    }
    json_decref(body);
    return 0;
}
