/*
 * cllm launch: the inputs of the `cllm launch` front end, parsed here so that
 * they can be tested without starting anything.
 *
 * Hostfile (DeepSpeed's format): one host per line, `NAME slots=N` (N >= 1);
 * `#` starts a comment, blank lines are ignored, a host may appear once.
 * Slots are rank slots: on this CPU build a host with slots=4 can run up to
 * 4 ranks, numbered 0..3.
 *
 * Include / exclude filters (DeepSpeed's syntax): hosts separated by `@`,
 * each optionally followed by `:` and a comma-separated list of slot ids,
 * e.g. `worker-0@worker-1:0,2`. An include keeps only what it names (a bare
 * host keeps all its slots); an exclude removes what it names (a bare host
 * removes the host). Naming a host that is not in the hostfile, or a slot the
 * host does not have, is an error; include and exclude together are an
 * error. Hosts keep their hostfile order and slot ids end up sorted.
 *
 * Environment file (.cllm_env, like DeepSpeed's .deepspeed_env): KEY=VALUE
 * lines, `#` comments and blank lines ignored; KEY is [A-Za-z_][A-Za-z0-9_]*.
 *
 * Errors name FILE:LINE (or the filter and the offending part).
 *
 * Slurm allocation (salloc, sbatch): the hosts come from SLURM_JOB_NODELIST,
 * a compressed host list (`node[01-03,07]`, `a,b[1-2]`, `rack[1-2]-n[1-2]`:
 * bracket groups of numbers and LO-HI ranges, a range keeping the width of
 * its first number, several groups expanded with the last varying fastest),
 * and their slots from SLURM_TASKS_PER_NODE, counts `N` or `N(xM)` (N
 * repeated M times: `2(x3),1` is 2,2,2,1) one per host; SLURM_NTASKS, when
 * set, is the rank count unless -n says otherwise (the first that many
 * slots in host order), and
 * SLURM_JOB_CPUS_PER_NODE (the same count syntax) gives each host's CPUs.
 * Errors name the variable, its value and the offending part.
 */
#ifndef CLLM_LAUNCH_H
#define CLLM_LAUNCH_H

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *name;
    int slots;     /* slots declared in the hostfile */
    int n_sel;     /* selected slot ids, ascending, in sel[0..n_sel) */
    int *sel;
    int cpus;      /* CPUs this job has on the host (Slurm); 0 = unknown */
} cllm_launch_host;

typedef struct {
    cllm_launch_host *hosts;
    int n;
} cllm_launch_hosts;

/* Parses hostfile text; `path` is used in messages only. On success *out
 * owns its hosts (every slot selected); free with cllm_launch_hosts_free. */
cllm_status cllm_launch_hostfile_parse(const char *text, const char *path, cllm_launch_hosts *out);
/* Reads and parses the file at path. */
cllm_status cllm_launch_hostfile_load(const char *path, cllm_launch_hosts *out);
/* One host `name` with `slots` slots, all selected (runs without a hostfile). */
cllm_status cllm_launch_hosts_single(const char *name, int slots, cllm_launch_hosts *out);
/* Applies an include or exclude filter (either may be NULL or empty, not
 * both set). Hosts left without slots are dropped; an empty result is an
 * error. On failure *h is unchanged. */
cllm_status cllm_launch_hosts_filter(cllm_launch_hosts *h, const char *include, const char *exclude);
/* Keeps the first n selected slots in host order (n <= total selected). */
cllm_status cllm_launch_hosts_limit(cllm_launch_hosts *h, int n);
/* Total selected slots over all hosts. */
int cllm_launch_hosts_count(const cllm_launch_hosts *h);
void cllm_launch_hosts_free(cllm_launch_hosts *h);

/* The Slurm variables an allocation sets; NULL where unset. */
typedef struct {
    const char *nodelist;       /* SLURM_JOB_NODELIST (required) */
    const char *tasks_per_node; /* SLURM_TASKS_PER_NODE (required) */
    const char *ntasks;         /* SLURM_NTASKS */
    const char *cpus_per_node;  /* SLURM_JOB_CPUS_PER_NODE */
} cllm_launch_slurm;

/* Expands a Slurm host list into *n names (*names owns them; free with
 * cllm_launch_env_free). `what` names the list in messages. A name listed
 * twice, an unbalanced or nested bracket, an empty name or group, a range
 * that runs backwards or a non-number is an error. */
cllm_status cllm_launch_slurm_hostlist(const char *list, const char *what, char ***names, int *n);
/* Expands Slurm counts (`2(x3),1`) into exactly n values out[0..n), each
 * 1..65536; fewer or more than n is an error naming `what`. */
cllm_status cllm_launch_slurm_counts(const char *spec, const char *what, int n, int *out);
/* The hosts of a Slurm allocation: one per node, slots = its task count,
 * cpus from cpus_per_node (0 without it). *ntasks is SLURM_NTASKS (0 when
 * unset; more tasks than the nodes place is an error): the caller cuts the
 * hosts to it with cllm_launch_hosts_limit unless told another count. */
cllm_status cllm_launch_hosts_slurm(const cllm_launch_slurm *env, cllm_launch_hosts *out, int *ntasks);

/* Parses environment-file text into n "KEY=VALUE" strings (*kv owns them;
 * free with cllm_launch_env_free). Surrounding blanks of KEY and VALUE are
 * trimmed; VALUE may be empty and may contain '='. */
cllm_status cllm_launch_env_parse(const char *text, const char *path, char ***kv, int *n);
void cllm_launch_env_free(char **kv, int n);

#ifdef __cplusplus
}
#endif
#endif
