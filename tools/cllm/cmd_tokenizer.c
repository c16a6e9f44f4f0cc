/*
 * cllm tokenizer <subcommand>: tokenizer tools other than encoding.
 *
 *   cllm tokenizer train  --input FILE... --vocab-size N --type byte-bpe|sp-bpe --out DIR
 *       learns a BPE tokenizer and writes DIR/tokenizer.json and
 *       DIR/tokenizer_config.json (see cllm_tokenizer_train).
 *   cllm tokenizer extend --tokenizer DIR --input FILE... --add N --out DIR
 *       appends N tokens learned from new text to an existing tokenizer.
 * Subcommands live in a table like the top-level commands. Exit codes: 0 ok,
 * 1 failure (unreadable input, unwritable output), 2 usage (bad flags or
 * values such as a vocabulary too small for the special tokens).
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cllm/tokenizer.h"
#include "commands.h"

static int finish(const char *cmd, cllm_status st, const cllm_tokenizer_train_stats *s, const char *out) {
    if (st) {
        fprintf(stderr, "cllm %s: %s\n", cmd, cllm_last_error());
        return st == CLLM_ERR_ARG ? 2 : 1;
    }
    fprintf(stderr,
            "cllm %s: %zu bytes, %zu distinct words, %zu merges, vocabulary of %d tokens written to %s "
            "(counting %.2f s, merging %.2f s)\n",
            cmd, s->n_bytes, s->n_words, s->n_merges, s->vocab_size, out, s->seconds_count, s->seconds_merge);
    return 0;
}

static int tok_train(int argc, char **argv) {
    const char *type, *out;
    arg_list inputs, specials;
    int vocab, workers;
    long long min_freq;
    double coverage;
    arg_spec specs[] = {
        {"input", ARG_LIST, &inputs, NULL, true, "text files to learn from"},
        {"vocab-size", ARG_INT, &vocab, NULL, true, "size of the final vocabulary, special tokens included"},
        {"type", ARG_STR, &type, NULL, true, "byte-bpe (GPT-2 style) or sp-bpe (LLaMA/SentencePiece style)"},
        {"special-tokens", ARG_LIST, &specials, NULL, false,
         "special tokens, ids 0.. (byte-bpe default: <|endoftext|>; sp-bpe: added after <unk> <s> </s>)"},
        {"min-frequency", ARG_I64, &min_freq, "2", false, "never merge a pair seen fewer times"},
        {"character-coverage", ARG_F64, &coverage, "0.9995", false,
         "sp-bpe: share of character occurrences the base characters cover (the rest use byte fallback)"},
        {"workers", ARG_INT, &workers, "0", false, "threads for reading the corpus (0 = all cores)"},
        {"out", ARG_STR, &out, NULL, true, "output folder"},
    };
    const char *summary = "Learns a BPE tokenizer and writes tokenizer.json + tokenizer_config.json.";
    int rc = args_parse("tokenizer train", summary, argc, argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_tokenizer_train_params p = {0};
    if (strcmp(type, "byte-bpe") == 0) {
        p.type = CLLM_TOKENIZER_BYTE_BPE;
    } else if (strcmp(type, "sp-bpe") == 0) {
        p.type = CLLM_TOKENIZER_SP_BPE;
    } else {
        fprintf(stderr, "cllm tokenizer train: --type: unknown type '%s' (byte-bpe, sp-bpe)\n", type);
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    if (min_freq < 1 || coverage <= 0 || coverage > 1 || workers < 0) {
        fprintf(stderr, "cllm tokenizer train: --min-frequency must be >= 1, --character-coverage in (0, 1], "
                        "--workers >= 0\n");
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    p.vocab_size = vocab;
    p.special_tokens = specials.n ? specials.items : NULL;
    p.n_special = specials.n;
    p.min_frequency = min_freq;
    p.character_coverage = coverage;
    p.n_workers = workers;
    cllm_tokenizer_train_stats s;
    cllm_status st = cllm_tokenizer_train(inputs.items, inputs.n, &p, out, &s);
    rc = finish("tokenizer train", st, &s, out);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}

static int tok_extend(int argc, char **argv) {
    const char *base, *out;
    arg_list inputs;
    int add, workers;
    long long min_freq;
    double coverage;
    arg_spec specs[] = {
        {"tokenizer", ARG_STR, &base, NULL, true, "folder with the tokenizer.json to extend"},
        {"input", ARG_LIST, &inputs, NULL, true, "text files to learn the new tokens from"},
        {"add", ARG_INT, &add, NULL, true, "number of new tokens (ids after the largest id in use)"},
        {"min-frequency", ARG_I64, &min_freq, "2", false, "never merge a pair seen fewer times"},
        {"character-coverage", ARG_F64, &coverage, "0.9995", false,
         "SentencePiece-style tokenizers: share of character occurrences to cover with character tokens"},
        {"workers", ARG_INT, &workers, "0", false, "threads for reading the corpus (0 = all cores)"},
        {"out", ARG_STR, &out, NULL, true, "output folder"},
    };
    const char *summary = "Adds tokens learned from new text to a BPE tokenizer; existing ids never change.";
    int rc = args_parse("tokenizer extend", summary, argc, argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    if (min_freq < 1 || coverage <= 0 || coverage > 1 || workers < 0) {
        fprintf(stderr, "cllm tokenizer extend: --min-frequency must be >= 1, --character-coverage in (0, 1], "
                        "--workers >= 0\n");
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    cllm_tokenizer_train_params p = {0};
    p.n_add = add;
    p.min_frequency = min_freq;
    p.character_coverage = coverage;
    p.n_workers = workers;
    cllm_tokenizer_train_stats s;
    cllm_status st = cllm_tokenizer_extend(base, inputs.items, inputs.n, &p, out, &s);
    rc = finish("tokenizer extend", st, &s, out);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}

static const tool_subcommand subcommands[] = {
    {"train", tok_train, "learn a BPE tokenizer (byte-bpe or sp-bpe) from text files"},
    {"extend", tok_extend, "add tokens learned from new text to an existing BPE tokenizer"},
};

int cmd_tokenizer(int argc, char **argv) {
    return tool_dispatch("tokenizer", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]), argc, argv);
}
