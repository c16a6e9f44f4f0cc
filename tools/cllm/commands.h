/*
 * The cllm subcommands. Each lives in cmd_<name>.c and has the signature
 * int cmd_<name>(int argc, char **argv), where argv[0] is the first argument
 * after the subcommand name. Exit codes: 0 ok, 1 failure, 2 usage error.
 */
#ifndef CLLM_TOOL_COMMANDS_H
#define CLLM_TOOL_COMMANDS_H

int cmd_init(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_model(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_estimate(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_launch(int argc, char **argv);

/* A command made of subcommands (cllm model ..., cllm tokenizer ...). */
typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} tool_subcommand;

/* Runs the subcommand named by argv[0] from subs[n]; with no argument or an
 * unknown one prints the list (exit 2), with --help prints it to stdout. */
int tool_dispatch(const char *cmd, const tool_subcommand *subs, int n, int argc, char **argv);

/* Prints "cllm <cmd>: <last error>" to stderr and returns 1. */
int tool_fail(const char *cmd);

/* Copies dir/name into out/name (atomically) when it exists: 0, or
 * tool_fail(cmd)'s 1. */
int tool_copy_if_present(const char *cmd, const char *dir, const char *out, const char *name);

#endif
