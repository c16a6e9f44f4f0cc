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
int cmd_grad(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* Prints "cllm <cmd>: <last error>" to stderr and returns 1. */
int tool_fail(const char *cmd);

#endif
