/*
 * Declarative flag parsing for cllm subcommands. Each subcommand lists its
 * flags in a table; the parser fills the destinations, rejects unknown flags,
 * malformed numbers and missing required flags with a message naming the
 * flag, and prints `--help` from the same table, defaults included.
 */
#ifndef CLLM_TOOL_ARGS_H
#define CLLM_TOOL_ARGS_H

#include <stdbool.h>

typedef enum {
    ARG_STR,   /* const char *           --name VALUE */
    ARG_INT,   /* int                    --name 12 */
    ARG_I64,   /* long long              --name 12 */
    ARG_F64,   /* double                 --name 1e-3 */
    ARG_FLAG,  /* bool                   --name (no value) */
    ARG_LIST   /* arg_list               --name A B C (until the next --flag; may repeat) */
} arg_kind;

typedef struct {
    const char **items; /* borrowed from argv; allocated array freed by args_free */
    int n;
} arg_list;

typedef struct {
    const char *name;  /* without the leading "--" */
    arg_kind kind;
    void *dst;
    const char *def;   /* default shown in help and applied before parsing; NULL = none */
    bool required;
    const char *help;
} arg_spec;

/* Parses argv[0..argc) (argv[0] is the first flag, not the command name).
 * Returns 0 on success, 1 if --help was printed (caller exits 0), 2 on a
 * usage error (message already printed to stderr). */
int args_parse(const char *cmd, const char *summary, int argc, char **argv, arg_spec *specs, int n);
void args_usage(const char *cmd, const char *summary, const arg_spec *specs, int n);
/* Frees list arrays allocated by args_parse. */
void args_free(arg_spec *specs, int n);

#define ARGS_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
