/*
 * cllm launch: starts a data-parallel cllm command (usually `train`) on one
 * or more hosts through OpenMPI's mpirun.
 *
 *   cllm launch [-n N] [--hostfile FILE] [--include SPEC | --exclude SPEC]
 *               [--timeout SEC] [--heartbeat-timeout SEC] [--launcher-args "ARGS"]
 *               [--dry-run] -- train ...
 *
 * The hosts come from a DeepSpeed-style hostfile, else from the Slurm
 * allocation the launcher runs in (SLURM_JOB_ID set: SLURM_JOB_NODELIST,
 * SLURM_TASKS_PER_NODE, SLURM_NTASKS; src/dist/launch_slurm.c), else this
 * machine alone; they are filtered by --include / --exclude and cut to -n
 * ranks (parsing in src/dist/launch.c). Each host becomes one mpirun
 * application context `-np K --host NAME:K`, so ranks are numbered host by
 * host in hostfile order and every context carries its own
 * OMP_NUM_THREADS: the host's CPUs divided by the ranks on it (the CPUs
 * Slurm gave the job there, SLURM_CPUS_PER_TASK when set, else this
 * machine's core count: hosts are assumed to be alike), unless
 * OMP_NUM_THREADS is set in the environment or .cllm_env. Inside Slurm,
 * OpenMPI's mpirun starts its daemons on the other nodes through srun.
 * Variables of .cllm_env (current directory first, then $HOME), and
 * CLLM_* and OMP_* variables of the environment, reach every rank via
 * `-x`. The exact command is printed before it runs; --dry-run only prints.
 * Ranks run the binary at this binary's absolute path: the other hosts need
 * it at the same path (shared filesystem or copied), see docs/distributed.md.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "launch_supervise.h"
#include "cllm/io.h"
#include "cllm/launch.h"
#include "commands.h"

extern char **environ;

typedef struct {
    char **v;
    int n, cap;
    bool oom;
} strvec;

/* Appends a copy of s. */
static void push(strvec *a, const char *s) {
    if (a->oom) return;
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 64;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    char *c = strdup(s);
    if (!c) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = c;
    a->v[a->n] = NULL;
}

static void pushf(strvec *a, const char *fmt, const char *s, int k) {
    char buf[8192];
    snprintf(buf, sizeof buf, fmt, s, k);
    push(a, buf);
}

static void strvec_free(strvec *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

/* Prints argv as a shell command, quoting what needs it. */
static void print_cmd(FILE *f, char **v) {
    for (int i = 0; v[i]; i++) {
        const char *s = v[i];
        bool plain = *s != '\0';
        for (const char *q = s; *q && plain; q++)
            plain = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || strchr("-_./=:,@+%", *q);
        if (i) fputc(' ', f);
        if (plain) {
            fputs(s, f);
            continue;
        }
        fputc('\'', f);
        for (const char *q = s; *q; q++) {
            if (*q == '\'') fputs("'\\''", f);
            else fputc(*q, f);
        }
        fputc('\'', f);
    }
    fputc('\n', f);
}

/* .cllm_env from the current directory, else from $HOME; none is fine. */
static int load_env_file(char ***kv, int *n, char *used, size_t used_len) {
    *kv = NULL;
    *n = 0;
    used[0] = '\0';
    const char *home = getenv("HOME");
    char cand[2][PATH_MAX];
    snprintf(cand[0], sizeof cand[0], ".cllm_env");
    int hl = snprintf(cand[1], sizeof cand[1], "%s/.cllm_env", home ? home : "");
    int n_cand = home && *home && hl > 0 && (size_t)hl < sizeof cand[1] ? 2 : 1;
    for (int i = 0; i < n_cand; i++) {
        if (access(cand[i], F_OK) != 0) continue;
        char *text = NULL;
        size_t len = 0;
        if (cllm_read_file(cand[i], &text, &len)) return tool_fail("launch");
        cllm_status st = cllm_launch_env_parse(text, cand[i], kv, n);
        free(text);
        if (st) return tool_fail("launch");
        if ((size_t)snprintf(used, used_len, "%s", cand[i]) >= used_len) used[0] = '\0';
        return 0;
    }
    return 0;
}

static bool env_has(char **kv, int n, const char *key) {
    size_t k = strlen(key);
    for (int i = 0; i < n; i++)
        if (strncmp(kv[i], key, k) == 0 && kv[i][k] == '=') return true;
    return false;
}

int cmd_launch(int argc, char **argv) {
    int sep = -1;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            sep = i;
            break;
        }
    bool help = false;
    for (int i = 0; i < (sep < 0 ? argc : sep); i++) help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
    if (sep < 0 && !help) {
        fprintf(stderr, "cllm launch: no command: put it after '--' (cllm launch -n 2 -- train --config run.json)\n");
        return 2;
    }
    int nflags = sep < 0 ? argc : sep;
    /* -n N is the short form of --np N */
    char **flags = malloc((size_t)(nflags + 1) * sizeof *flags);
    if (!flags) return tool_fail("launch");
    for (int i = 0; i < nflags; i++) flags[i] = strcmp(argv[i], "-n") == 0 ? (char *)"--np" : argv[i];
    flags[nflags] = NULL;

    int np = 0;
    double timeout = 0, heartbeat = -1;
    const char *hostfile = NULL, *include = NULL, *exclude = NULL, *largs = NULL, *mpirun = "mpirun";
    bool dry = false;
    arg_spec specs[] = {
        {"np", ARG_INT, &np, "0", false, "ranks (-n N); 0 = SLURM_NTASKS in a Slurm allocation, else every selected slot, or this machine's cores without --hostfile"},
        {"hostfile", ARG_STR, &hostfile, NULL, false,
         "DeepSpeed hostfile: 'HOST slots=N' lines (default: the Slurm allocation when SLURM_JOB_ID is set, else this machine)"},
        {"include", ARG_STR, &include, NULL, false, "only these hosts/slots: host1:0,2@host2"},
        {"exclude", ARG_STR, &exclude, NULL, false, "all but these hosts/slots: host1:1@host3"},
        {"timeout", ARG_F64, &timeout, "0", false, "collective timeout in seconds for every rank (CLLM_DIST_TIMEOUT); 0 = keep the default"},
        {"heartbeat-timeout", ARG_F64, &heartbeat, "-1", false,
         "seconds without a heartbeat before a rank counts as hung, for every rank (CLLM_HEARTBEAT_TIMEOUT); "
         "0 = off; -1 = keep the ranks' own (heartbeat_timeout, default 30)"},
        {"launcher-args", ARG_STR, &largs, NULL, false, "extra mpirun arguments, split at blanks (e.g. \"--mca btl tcp,self\")"},
        {"mpirun", ARG_STR, &mpirun, "mpirun", false, "the mpirun program"},
        {"dry-run", ARG_FLAG, &dry, NULL, false, "print the mpirun command and exit"},
    };
    const char *summary = "run a cllm command on N ranks through mpirun: cllm launch [flags] -- train ...";
    int rc = args_parse("launch", summary, nflags, flags, specs, ARGS_COUNT(specs));
    free(flags);
    if (rc) return rc == 1 ? 0 : 2;
    if (sep < 0 || sep + 1 >= argc) {
        fprintf(stderr, "cllm launch: no command: put it after '--' (cllm launch -n 2 -- train --config run.json)\n");
        return 2;
    }
    if (np < 0) {
        fprintf(stderr, "cllm launch: --np: %d is negative\n", np);
        return 2;
    }
    if (timeout < 0) {
        fprintf(stderr, "cllm launch: --timeout: %g is negative\n", timeout);
        return 2;
    }
    if (heartbeat < 0 && heartbeat != -1) {
        fprintf(stderr, "cllm launch: --heartbeat-timeout: %g is negative (0 turns the heartbeat off)\n", heartbeat);
        return 2;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;

    cllm_launch_hosts hosts = {0};
    char **envkv = NULL;
    int n_env = 0;
    strvec cmd = {0};
    rc = 0;
    const char *slurm_job = getenv("SLURM_JOB_ID");
    int cpus_per_task = 0, slurm_ntasks = 0;
    if (hostfile) {
        if (cllm_launch_hostfile_load(hostfile, &hosts)) {
            rc = tool_fail("launch");
            goto done;
        }
    } else if (slurm_job && *slurm_job) {
        cllm_launch_slurm env = {getenv("SLURM_JOB_NODELIST"), getenv("SLURM_TASKS_PER_NODE"), getenv("SLURM_NTASKS"),
                                 getenv("SLURM_JOB_CPUS_PER_NODE")};
        if (cllm_launch_hosts_slurm(&env, &hosts, &slurm_ntasks)) {
            fprintf(stderr, "cllm launch: Slurm job %s: %s (or give --hostfile)\n", slurm_job, cllm_last_error());
            rc = 1;
            goto done;
        }
        const char *cpt = getenv("SLURM_CPUS_PER_TASK");
        if (cpt && *cpt) {
            char *end = NULL;
            long v = strtol(cpt, &end, 10);
            if (*end || v < 1 || v > 65536) {
                fprintf(stderr, "cllm launch: Slurm job %s: SLURM_CPUS_PER_TASK '%s' is not a CPU count\n", slurm_job, cpt);
                rc = 1;
                goto done;
            }
            cpus_per_task = (int)v;
        }
        fprintf(stderr, "cllm launch: Slurm job %s: hosts from SLURM_JOB_NODELIST=%s SLURM_TASKS_PER_NODE=%s%s%s\n",
                slurm_job, env.nodelist, env.tasks_per_node, env.ntasks ? " SLURM_NTASKS=" : "",
                env.ntasks ? env.ntasks : "");
    } else {
        if ((include && *include) || (exclude && *exclude)) {
            fprintf(stderr, "cllm launch: --include/--exclude need a --hostfile (or a Slurm allocation)\n");
            rc = 2;
            goto done;
        }
        if (cllm_launch_hosts_single("localhost", np ? np : (int)cores, &hosts)) {
            fprintf(stderr, "cllm launch: --np: %s\n", cllm_last_error());
            rc = 2;
            goto done;
        }
    }
    /* SLURM_NTASKS is the default -n (never more than the filters leave) */
    bool np_slurm = !np && slurm_ntasks;
    if (np_slurm) np = slurm_ntasks;
    if (cllm_launch_hosts_filter(&hosts, include, exclude)) {
        fprintf(stderr, "cllm launch: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    if (np_slurm && np > cllm_launch_hosts_count(&hosts)) np = cllm_launch_hosts_count(&hosts);
    if (np && cllm_launch_hosts_limit(&hosts, np)) {
        fprintf(stderr, "cllm launch: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    char env_path[PATH_MAX + 16];
    if ((rc = load_env_file(&envkv, &n_env, env_path, sizeof env_path))) goto done;

    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "cllm launch: cannot find this binary's path (/proc/self/exe): %s\n", strerror(errno));
        rc = 1;
        goto done;
    }
    self[len] = '\0';

    push(&cmd, mpirun);
    if (geteuid() == 0) push(&cmd, "--allow-run-as-root");
    /* ranks set their own OpenMP threads; mpirun's default binding would pin
     * a multi-threaded rank to one core */
    push(&cmd, "--bind-to");
    push(&cmd, "none");
    if (largs) {
        char *copy = strdup(largs);
        if (!copy) cmd.oom = true;
        for (char *save = NULL, *t = copy ? strtok_r(copy, " \t\n", &save) : NULL; t; t = strtok_r(NULL, " \t\n", &save))
            push(&cmd, t);
        free(copy);
    }
    const char *omp = getenv("OMP_NUM_THREADS");
    bool omp_set = (omp && *omp) || env_has(envkv, n_env, "OMP_NUM_THREADS");
    for (int h = 0; h < hosts.n; h++) {
        const cllm_launch_host *x = &hosts.hosts[h];
        if (h) push(&cmd, ":");
        push(&cmd, "-np");
        pushf(&cmd, "%s%d", "", x->n_sel);
        push(&cmd, "--host");
        pushf(&cmd, "%s:%d", x->name, x->n_sel);
        /* the environment's CLLM_* and OMP_* first, .cllm_env after (it wins) */
        for (char **e = environ; *e; e++)
            if ((strncmp(*e, "CLLM_", 5) == 0 || strncmp(*e, "OMP_", 4) == 0) && strchr(*e, '=')) {
                push(&cmd, "-x");
                push(&cmd, *e);
            }
        for (int i = 0; i < n_env; i++) {
            push(&cmd, "-x");
            push(&cmd, envkv[i]);
        }
        if (!omp_set) {
            long t = cpus_per_task ? cpus_per_task : (x->cpus ? x->cpus : cores) / x->n_sel;
            push(&cmd, "-x");
            pushf(&cmd, "OMP_NUM_THREADS=%s%d", "", (int)(t < 1 ? 1 : t));
        }
        if (timeout > 0) {
            char b[64];
            snprintf(b, sizeof b, "CLLM_DIST_TIMEOUT=%g", timeout);
            push(&cmd, "-x");
            push(&cmd, b);
        }
        if (heartbeat >= 0) {
            char b[64];
            snprintf(b, sizeof b, "CLLM_HEARTBEAT_TIMEOUT=%g", heartbeat);
            push(&cmd, "-x");
            push(&cmd, b);
        }
        push(&cmd, self);
        for (int i = sep + 1; i < argc; i++) push(&cmd, argv[i]);
    }
    if (cmd.oom) {
        fprintf(stderr, "cllm launch: out of memory\n");
        rc = 1;
        goto done;
    }
    fprintf(stderr, "cllm launch: %d rank%s on %d host%s", cllm_launch_hosts_count(&hosts),
            cllm_launch_hosts_count(&hosts) == 1 ? "" : "s", hosts.n, hosts.n == 1 ? "" : "s");
    if (env_path[0]) fprintf(stderr, ", environment from %s", env_path);
    fprintf(stderr, "\n");
    print_cmd(dry ? stdout : stderr, cmd.v);
    fflush(stdout);
    fflush(stderr);
    if (dry) goto done;
    rc = launch_supervise(cmd.v, LAUNCH_GRACE_S);
done:
    strvec_free(&cmd);
    cllm_launch_env_free(envkv, n_env);
    cllm_launch_hosts_free(&hosts);
    return rc;
}
