/*
 * cllm data: dataset tools. `cllm data prepare` turns users' .json, .jsonl
 * and .txt files into a Megatron-compatible indexed dataset plus cllm's
 * loss-mask file (see include/cllm/prepare.h and docs/data.md). It prints a
 * human summary on stderr and one JSON report line on stdout. SIGINT and
 * SIGTERM stop the run cleanly: temporary files are removed and an existing
 * dataset under the same prefix is left untouched.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cllm/prepare.h"
#include "cllm/sample.h"
#include "commands.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int data_prepare(int argc, char **argv) {
    arg_list inputs = {0};
    const char *tok, *out, *split, *tmpl;
    int seq_len, workers;
    long long skip_bad;
    bool pack, pairs;
    arg_spec specs[] = {
        {"input", ARG_LIST, &inputs, NULL, true, "data files (.json array, .jsonl, .txt), read in order"},
        {"tokenizer", ARG_STR, &tok, NULL, true, "folder with tokenizer.json"},
        {"out", ARG_STR, &out, NULL, true, "output prefix: writes PREFIX.bin, PREFIX.idx, PREFIX.mask"},
        {"seq-len", ARG_INT, &seq_len, "0", false, "truncate unpacked samples to this many tokens (0 = never)"},
        {"pack", ARG_FLAG, &pack, NULL, false, "pack all tokens into seq-len windows when loading (pretraining)"},
        {"split", ARG_STR, &split, NULL, false, "default train,valid,test weights stored with the data, e.g. 950,30,20"},
        {"workers", ARG_INT, &workers, "1", false, "tokenizing threads (output is identical for any count)"},
        {"skip-bad", ARG_I64, &skip_bad, "0", false, "skip up to N bad records instead of stopping"},
        {"template", ARG_STR, &tmpl, NULL, false, "prompt template file (JSON; see docs/data.md)"},
        {"pairs", ARG_FLAG, &pairs, NULL, false,
         "preference pairs for cllm train --task dpo|reward (docs/alignment.md); --seq-len keeps each row's end"},
    };
    int rc = args_parse("data prepare", "Tokenizes data files into a Megatron-compatible indexed dataset.", argc,
                        argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    if (workers < 1 || workers > 256 || seq_len < 0 || skip_bad < 0) {
        fprintf(stderr, "cllm data prepare: --workers must be in [1, 256], --seq-len and --skip-bad non-negative\n");
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    cllm_prepare_opts o = {
        .inputs = inputs.items, .n_inputs = inputs.n, .tokenizer = tok, .template_path = tmpl, .out_prefix = out,
        .seq_len = seq_len, .pack = pack, .split = split, .workers = workers, .skip_bad = (long)skip_bad,
        .cancel = &g_stop, .pairs = pairs,
    };
    cllm_prepare_report r;
    cllm_status st = cllm_prepare(&o, &r);
    for (uint64_t i = 0; i < r.bad && i < CLLM_PREPARE_MAX_REPORTED; i++)
        fprintf(stderr, "cllm data prepare: skipped: %s\n", r.bad_where[i]);
    if (st) {
        rc = tool_fail("data prepare");
        goto done;
    }
    if (pairs)
        fprintf(stderr, "cllm data prepare: %llu preference pairs, %llu tokens (%s) in %.2f s\n",
                (unsigned long long)r.records, (unsigned long long)r.tokens, r.dtype == 8 ? "uint16" : "int32",
                r.seconds);
    double mb = (double)r.bytes_in / 1e6;
    if (!pairs)
        fprintf(stderr, "cllm data prepare: %llu records (%llu pretrain, %llu instruct, %llu conversation, %llu ref_qa, "
                    "%llu tokenized), %llu tokens (%s) from %.1f MB in %.2f s (%.2f MB/s)\n",
            (unsigned long long)r.records, (unsigned long long)r.by_type[0], (unsigned long long)r.by_type[1],
            (unsigned long long)r.by_type[2], (unsigned long long)r.by_type[3], (unsigned long long)r.by_type[4],
            (unsigned long long)r.tokens, r.dtype == 8 ? "uint16" : "int32", mb, r.seconds,
            r.seconds > 0 ? mb / r.seconds : 0.0);
    if (seq_len > 0 && !pack && !pairs)
        fprintf(stderr, "cllm data prepare: %llu samples truncated to %d tokens (%llu tokens cut in all, at most %llu "
                        "from one sample); %llu samples have no trained token left\n",
                (unsigned long long)r.truncated, seq_len, (unsigned long long)r.tokens_cut,
                (unsigned long long)r.max_cut, (unsigned long long)r.no_loss);
    if (r.bad) fprintf(stderr, "cllm data prepare: skipped %llu bad records\n", (unsigned long long)r.bad);
    if (split)
        fprintf(stderr, "cllm data prepare: split %s -> %llu / %llu / %llu documents\n", split,
                (unsigned long long)r.split_docs[0], (unsigned long long)r.split_docs[1],
                (unsigned long long)r.split_docs[2]);
    fprintf(stderr, "cllm data prepare: wrote %s.bin, %s.idx, %s.mask\n", out, out, out);
    printf("{\"records\": %llu, \"tokens\": %llu, \"dtype\": \"%s\", \"bytes_in\": %llu, \"seconds\": %.3f, "
           "\"mb_per_s\": %.3f, \"truncated\": %llu, \"tokens_cut\": %llu, \"max_cut\": %llu, \"no_loss\": %llu, "
           "\"bad\": %llu, \"bad_first\": [",
           (unsigned long long)r.records, (unsigned long long)r.tokens, r.dtype == 8 ? "uint16" : "int32",
           (unsigned long long)r.bytes_in, r.seconds, r.seconds > 0 ? mb / r.seconds : 0.0,
           (unsigned long long)r.truncated, (unsigned long long)r.tokens_cut, (unsigned long long)r.max_cut,
           (unsigned long long)r.no_loss, (unsigned long long)r.bad);
    for (uint64_t i = 0; i < r.bad && i < CLLM_PREPARE_MAX_REPORTED; i++) {
        if (i) printf(", ");
        json_str(stdout, r.bad_where[i]);
    }
    printf("], \"by_type\": {");
    for (int i = 0; i < CLLM_SAMPLE_TYPE_COUNT; i++)
        printf("%s\"%s\": %llu", i ? ", " : "", cllm_sample_type_name((cllm_sample_type)i),
               (unsigned long long)r.by_type[i]);
    printf("}, \"split_docs\": [%llu, %llu, %llu]}\n", (unsigned long long)r.split_docs[0],
           (unsigned long long)r.split_docs[1], (unsigned long long)r.split_docs[2]);
done:
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}

int cmd_data(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fprintf(argc < 1 ? stderr : stdout,
                "usage: cllm data <subcommand> [flags]\n\nsubcommands:\n"
                "  prepare    tokenize .json/.jsonl/.txt files into PREFIX.bin/.idx/.mask\n");
        return argc < 1 ? 2 : 0;
    }
    if (!strcmp(argv[0], "prepare")) return data_prepare(argc - 1, argv + 1);
    fprintf(stderr, "cllm data: unknown subcommand '%s' (prepare)\n", argv[0]);
    return 2;
}
