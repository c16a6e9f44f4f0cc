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
int cmd_score(int argc, char **argv);

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

/* --tensor N (tensor.c). tool_tp_load: N == 1 leaves *m NULL (load the
 * whole model as usual); N > 1 joins the MPI job (which must have N
 * ranks), loads this rank's part of HF folder dir with its matrices in
 * format `weights` (NULL: as stored) and logs its size and format; a
 * failure on any rank ends the job. tool_tp_follower: true on ranks > 0 of
 * a part, which then call tool_tp_follow (runs rank 0's cache calls until
 * it stops; frees m; returns the exit code). Rank 0 calls tool_tp_end
 * after freeing its caches and before freeing m (releases the followers),
 * then cllm_dist_finalize. */
#include "cllm/model.h"
cllm_status tool_tp_load(cllm_model **m, const char *dir, int tensor, const char *weights, const char *cmd);
bool tool_tp_follower(const cllm_model *m);
int tool_tp_follow(cllm_model *m, const char *cmd);
void tool_tp_end(const cllm_model *m);

/* SIGINT and SIGTERM (signals.c). Threads that compute never accept them
 * (oneDNN's sgemm kernels run with the stack pointer inside a heap buffer,
 * where a handler's frame would land), so a command that acts on them calls
 * tool_signals_start first, before any other thread exists: both signals
 * are blocked in every thread and one waiter thread takes them. Until
 * tool_signals_arm a signal takes its default action (ends the process);
 * once armed, the first calls fn(sig) on the waiter thread and a second
 * takes the default action. tool_signals_ignore discards them from then on
 * (with no waiter started: SIG_IGN). tool_signals_start returns 0, or 1
 * after printing why the thread could not start. */
int tool_signals_start(void);
void tool_signals_arm(void (*fn)(int sig));
void tool_signals_ignore(void);

#endif
