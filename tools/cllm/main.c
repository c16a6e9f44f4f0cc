/*
 * cllm: the command-line front end. A table maps each subcommand to its
 * function and one line of help; `cllm <cmd> --help` lists the command's
 * flags with their defaults.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cllm/core.h"
#include "cllm/cpu.h"
#include "cllm/io.h"
#include "cllm/kernels.h"
#include "commands.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"init", cmd_init, "write a randomly initialised HF model folder (gpt2, llama, bloom)"},
    {"train", cmd_train, "train a model (DeepSpeed-style config, checkpoints, resume, eval)"},
    {"eval", cmd_eval, "report loss and perplexity of a model (or checkpoint) on data"},
    {"score", cmd_score, "rewards of texts or preference pairs under a reward model (JSON lines, pairwise accuracy)"},
    {"generate", cmd_generate, "continue a prompt with a model (KV cache, sampling), streaming text"},
    {"serve", cmd_serve, "serve a model over HTTP: TGI and OpenAI APIs, continuous batching, streaming"},
    {"plot", cmd_plot, "draw loss and learning-rate curves of a training run as SVG"},
    {"launch", cmd_launch, "run a command on N ranks / several hosts through mpirun (hostfile, include/exclude)"},
    {"estimate", cmd_estimate, "estimate the per-rank memory of a training run; suggest a setup that fits"},
    {"convert", cmd_convert, "turn a training checkpoint (sharded or not) into an HF model folder"},
    {"grad", cmd_grad, "compute loss and parameter gradients for one batch (debugging, tests)"},
    {"data", cmd_data, "prepare datasets: cllm data prepare --input FILE... --tokenizer DIR --out PREFIX"},
    {"tokenize", cmd_tokenize, "encode text to token ids with an HF tokenizer.json"},
    {"detokenize", cmd_detokenize, "decode token ids to text"},
    {"model", cmd_model, "model folder operations (cllm model resize-vocab)"},
    {"lora", cmd_lora, "LoRA adapter folders (cllm lora merge: fold an adapter into its base)"},
    {"tokenizer", cmd_tokenizer, "train or extend a BPE tokenizer (cllm tokenizer train|extend)"},
};

static void sub_usage(FILE *f, const char *cmd, const tool_subcommand *subs, int n) {
    fprintf(f, "usage: cllm %s <subcommand> [flags]    (cllm %s <subcommand> --help)\n\nsubcommands:\n", cmd, cmd);
    for (int i = 0; i < n; i++) fprintf(f, "  %-14s %s\n", subs[i].name, subs[i].help);
}

int tool_dispatch(const char *cmd, const tool_subcommand *subs, int n, int argc, char **argv) {
    if (argc < 1) {
        sub_usage(stderr, cmd, subs, n);
        return 2;
    }
    if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "help") == 0) {
        sub_usage(stdout, cmd, subs, n);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(argv[0], subs[i].name) == 0) return subs[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "cllm %s: unknown subcommand '%s'\n\n", cmd, argv[0]);
    sub_usage(stderr, cmd, subs, n);
    return 2;
}

int tool_fail(const char *cmd) {
    fprintf(stderr, "cllm %s: %s\n", cmd, cllm_last_error());
    return 1;
}

int tool_copy_if_present(const char *cmd, const char *dir, const char *out, const char *name) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    struct stat sb;
    if (stat(src, &sb) != 0) return 0;
    char *data = NULL;
    size_t len = 0;
    int rc = cllm_read_file(src, &data, &len) || cllm_write_file_atomic(dst, data, len) ? tool_fail(cmd) : 0;
    free(data);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "usage: cllm <command> [flags]    (cllm <command> --help for its flags)\n"
               "       cllm --version            (the CPU, its ISA and the kernels chosen on it)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
#ifdef M_MMAP_THRESHOLD
    /* glibc raises its mmap threshold to the size of each large block freed
     * (up to 32 MB), after which oneDNN's per-call GEMM buffers come from
     * the heap and their pages stay resident once freed: 12-25 MB more peak
     * RSS, varying from run to run. A fixed threshold keeps every block
     * above 128 KiB in its own mapping, given back on free
     * (docs/memory.md). */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        char info[1024];
        cllm_kernels_describe(info, sizeof info);
        printf("cllm %s\n%s", CLLM_VERSION_STRING, info);
        return 0;
    }
    if (cllm_cpu_check_env()) {
        fprintf(stderr, "cllm: %s\n", cllm_last_error());
        return 2;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "cllm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
