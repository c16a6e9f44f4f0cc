/*
 * cllm model <subcommand>: operations on a model folder.
 *
 *   cllm model resize-vocab --model DIR --tokenizer DIR --out DIR
 *       grows the embedding (and an untied lm_head) to the tokenizer's
 *       vocabulary size, optionally rounded up to a multiple of K; new rows
 *       start at the mean of the old rows (cllm_model_resize_vocab). Writes
 *       the model, config.json with the new vocab_size, and copies the
 *       tokenizer files next to it. Nothing is written when a check fails.
 * Exit codes: 0 ok, 1 failure, 2 usage (including a refused shrink).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"
#include "commands.h"

static int resize_vocab(int argc, char **argv) {
    const char *model_dir, *tok_dir, *out;
    int multiple;
    long long seed;
    double noise;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder to resize"},
        {"tokenizer", ARG_STR, &tok_dir, NULL, true, "folder with the tokenizer.json the model will use"},
        {"out", ARG_STR, &out, NULL, true, "output folder (model, config.json and tokenizer files)"},
        {"pad-to-multiple-of", ARG_INT, &multiple, "1", false, "round the new vocabulary size up to a multiple of K"},
        {"noise-std", ARG_F64, &noise, "0", false, "add normal noise of this std to the new rows (0 = exactly the mean)"},
        {"seed", ARG_I64, &seed, "0", false, "seed of the noise"},
    };
    const char *summary = "Grows a model's embedding (and untied lm_head) to a tokenizer's vocabulary; new rows start "
                          "at the mean of the old rows.";
    int rc = args_parse("model resize-vocab", summary, argc, argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_tokenizer *tok = NULL;
    if (multiple < 1 || multiple > (1 << 20) || noise < 0) {
        fprintf(stderr, "cllm model resize-vocab: --pad-to-multiple-of must be in [1, 1048576], --noise-std >= 0\n");
        rc = 2;
        goto done;
    }
    if (cllm_tokenizer_load(&tok, tok_dir) || cllm_model_load(&m, model_dir)) {
        rc = tool_fail("model resize-vocab");
        goto done;
    }
    long long want = cllm_tokenizer_vocab_size(tok);
    want = (want + multiple - 1) / multiple * multiple;
    int old = cllm_model_get_config(m)->vocab_size;
    if (want > (1 << 24)) {
        fprintf(stderr, "cllm model resize-vocab: a vocabulary of %lld is too large\n", want);
        rc = 2;
        goto done;
    }
    if (want < old) {
        fprintf(stderr,
                "cllm model resize-vocab: the tokenizer needs %lld rows but the model already has %d; refusing to "
                "shrink (rows %lld..%d may hold ids in use). Use a larger --pad-to-multiple-of or keep the model.\n",
                want, old, want, old - 1);
        rc = 2;
        goto done;
    }
    if (cllm_model_resize_vocab(&m, (int)want, (float)noise, (uint64_t)seed) || cllm_model_save(m, out, 0)) {
        rc = tool_fail("model resize-vocab");
        goto done;
    }
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0] && !rc; i++)
        rc = tool_copy_if_present("model resize-vocab", tok_dir, out, files[i]);
    if (!rc) rc = tool_copy_if_present("model resize-vocab", model_dir, out, "generation_config.json");
    if (!rc)
        fprintf(stderr, "cllm model resize-vocab: vocabulary %d -> %lld rows, written to %s\n", old, want, out);
done:
    cllm_model_free(m);
    cllm_tokenizer_free(tok);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}

static const tool_subcommand subcommands[] = {
    {"resize-vocab", resize_vocab, "grow the embedding (and untied head) to a tokenizer's vocabulary size"},
};

int cmd_model(int argc, char **argv) {
    return tool_dispatch("model", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]), argc, argv);
}
