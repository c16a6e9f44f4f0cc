/*
 * Slurm's host lists and counts (cllm/launch.h): the expansions below are
 * written out by hand from Slurm's documented syntax (sbatch(1), "hostlist
 * expression"; SLURM_TASKS_PER_NODE's `N(xM)`), and every malformed value
 * must fail with a message naming the variable and the bad part.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/launch.h"

/* Expands `list` and compares the names joined by spaces with `want`
 * (NULL: expect a failure whose message holds `err`). */
static void hl(const char *list, const char *want, const char *err) {
    char **v = NULL;
    int n = -1;
    cllm_status st = cllm_launch_slurm_hostlist(list, "SLURM_JOB_NODELIST", &v, &n);
    if (!want) {
        CHECK(st != CLLM_OK && v == NULL && n == 0, "'%s': accepted", list);
        CHECK(st == CLLM_OK || strstr(cllm_last_error(), err), "'%s': message '%s' lacks '%s'", list, cllm_last_error(), err);
        return;
    }
    CHECK(st == CLLM_OK, "'%s': %s", list, cllm_last_error());
    char got[1024] = "";
    size_t o = 0;
    for (int i = 0; i < n && o < sizeof got; i++) o += (size_t)snprintf(got + o, sizeof got - o, "%s%s", i ? " " : "", v[i]);
    CHECK(strcmp(got, want) == 0, "'%s': got '%s', want '%s'", list, got, want);
    cllm_launch_env_free(v, n);
}

/* Expands `spec` into n counts, joined by commas. */
static void counts(const char *spec, int n, const char *want, const char *err) {
    int out[16];
    cllm_status st = cllm_launch_slurm_counts(spec, "SLURM_TASKS_PER_NODE", n, out);
    if (!want) {
        CHECK(st != CLLM_OK, "'%s' (%d): accepted", spec, n);
        CHECK(st == CLLM_OK || strstr(cllm_last_error(), err), "'%s': message '%s' lacks '%s'", spec, cllm_last_error(), err);
        return;
    }
    CHECK(st == CLLM_OK, "'%s': %s", spec, cllm_last_error());
    char got[256] = "";
    size_t o = 0;
    for (int i = 0; st == CLLM_OK && i < n; i++) o += (size_t)snprintf(got + o, sizeof got - o, "%s%d", i ? "," : "", out[i]);
    CHECK(strcmp(got, want) == 0, "'%s': got '%s', want '%s'", spec, got, want);
}

/* The hosts of an allocation rendered as "name:slots/cpus ..." */
static void alloc(const char *nodes, const char *tasks, const char *ntasks, const char *cpus, const char *want,
                  const char *err) {
    cllm_launch_slurm env = {nodes, tasks, ntasks, cpus};
    cllm_launch_hosts h;
    int nt = -1;
    cllm_status st = cllm_launch_hosts_slurm(&env, &h, &nt);
    if (!want) {
        CHECK(st != CLLM_OK && h.n == 0, "%s %s: accepted", nodes, tasks);
        CHECK(st == CLLM_OK || strstr(cllm_last_error(), err), "%s %s: message '%s' lacks '%s'", nodes, tasks,
              cllm_last_error(), err);
        return;
    }
    CHECK(st == CLLM_OK, "%s %s: %s", nodes, tasks, cllm_last_error());
    char got[512] = "";
    size_t o = 0;
    for (int i = 0; i < h.n && o < sizeof got; i++)
        o += (size_t)snprintf(got + o, sizeof got - o, "%s%s:%d/%d", i ? " " : "", h.hosts[i].name, h.hosts[i].n_sel,
                              h.hosts[i].cpus);
    CHECK(strcmp(got, want) == 0, "%s %s: got '%s', want '%s'", nodes, tasks, got, want);
    CHECK(nt == (ntasks ? atoi(ntasks) : 0), "%s %s: ntasks %d", nodes, tasks, nt);
    cllm_launch_hosts_free(&h);
}

int main(void) {
    /* host lists */
    hl("vm", "vm", NULL);
    hl("node[01-03,07]", "node01 node02 node03 node07", NULL);
    hl("a,b[1-2],c", "a b1 b2 c", NULL);
    hl("n[8-11]", "n8 n9 n10 n11", NULL);
    hl("n[08-11]", "n08 n09 n10 n11", NULL);         /* the first number's width */
    hl("n[098-101]", "n098 n099 n100 n101", NULL);
    hl("rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2", NULL); /* last group fastest */
    hl("n[3]", "n3", NULL);
    hl("gpu-[1-2].cluster", "gpu-1.cluster gpu-2.cluster", NULL);
    hl("n[5,1-2]x,m", "n5x n1x n2x m", NULL);                /* order kept, not sorted */
    /* malformed host lists: the variable, the value and the bad part */
    hl("", NULL, "SLURM_JOB_NODELIST is empty");
    hl(NULL, NULL, "SLURM_JOB_NODELIST is empty");
    hl("node[01-03", NULL, "SLURM_JOB_NODELIST 'node[01-03': '[' without a matching ']' in 'node[01-03'");
    hl("node01-03]", NULL, "']' without a '['");
    hl("n[1-[2]]", NULL, "'[' inside '[...]' in 'n[1-[2]]'");
    hl("n[3-1]", NULL, "SLURM_JOB_NODELIST 'n[3-1]': range '3-1' in 'n[3-1]' runs backwards");
    hl("n[a-b]", NULL, "'a-b' in 'n[a-b]' is not a number or a range LO-HI");
    hl("n[]", NULL, "'' in 'n[]' is not a number");
    hl("n[1,]", NULL, "'' in 'n[1,]' is not a number");
    hl("n[1-]", NULL, "'1-' in 'n[1-]'");
    hl("n[-1]", NULL, "'-1' in 'n[-1]'");
    hl("n[1234567890]", NULL, "is not a number");
    hl("a,,b", NULL, "SLURM_JOB_NODELIST 'a,,b': empty host name");
    hl(",a", NULL, "empty host name");
    hl("a,", NULL, "empty host name after the last ','");
    hl("a,b,a", NULL, "host 'a' is listed twice");
    hl("n[1-2],n2", NULL, "host 'n2' is listed twice");
    hl("n[0-70000]", NULL, "more than 65536 hosts");

    /* counts */
    counts("2", 1, "2", NULL);
    counts("2(x3),1", 4, "2,2,2,1", NULL);
    counts("1,4(x2)", 3, "1,4,4", NULL);
    counts("16(x1)", 1, "16", NULL);
    counts("2(x3)", 4, NULL, "SLURM_TASKS_PER_NODE '2(x3)' gives 3 counts for 4 hosts");
    counts("2,2", 1, NULL, "gives more than the 1 count its host list needs");
    counts("2(x99999999)", 4, NULL, "gives more than the 4 counts");
    counts("0", 1, NULL, "'0' is not a count N (1..65536) or N(xM)");
    counts("2(3)", 1, NULL, "'2(3)' is not a count");
    counts("2(x0)", 1, NULL, "'2(x0)' is not a count");
    counts("2(x)", 1, NULL, "'2(x)'");
    counts("2(x2", 2, NULL, "'2(x2'");
    counts("(x2)", 2, NULL, "'(x2)'");
    counts("a", 1, NULL, "'a'");
    counts("1,", 1, NULL, "'' is not a count");
    counts("", 1, NULL, "SLURM_TASKS_PER_NODE is empty");

    /* allocations */
    alloc("vm", "2", "2", "2", "vm:2/2", NULL);
    alloc("node[01-03,07]", "2(x3),1", NULL, "8(x4)", "node01:2/8 node02:2/8 node03:2/8 node07:1/8", NULL);
    alloc("a,b", "2(x2)", "3", NULL, "a:2/0 b:2/0", NULL); /* SLURM_NTASKS: returned, not applied */
    alloc("a,b", "2(x2)", "4", NULL, "a:2/0 b:2/0", NULL);
    alloc("a,b", "2(x2)", "5", NULL, NULL, "SLURM_NTASKS=5 but SLURM_TASKS_PER_NODE '2(x2)' places only 4 tasks");
    alloc("a,b", "2(x2)", "two", NULL, NULL, "SLURM_NTASKS 'two' is not a positive task count");
    alloc("a,b", "2(x2)", "0", NULL, NULL, "SLURM_NTASKS '0'");
    alloc("a,b", NULL, NULL, NULL, NULL, "SLURM_TASKS_PER_NODE is not");
    alloc("a,b", "2", NULL, NULL, NULL, "SLURM_TASKS_PER_NODE '2' gives 1 count for 2 hosts");
    alloc("a,b", "1(x2)", NULL, "4", NULL, "SLURM_JOB_CPUS_PER_NODE '4' gives 1 count for 2 hosts");
    alloc("a[", "1", NULL, NULL, NULL, "SLURM_JOB_NODELIST 'a['");
    alloc("n[1-20]", "65536(x20)", NULL, NULL, NULL, "SLURM_TASKS_PER_NODE '65536(x20)' places 1310720 tasks, more than 1048576");
    /* a filter and a limit work on Slurm's hosts as on a hostfile's */
    cllm_launch_slurm env = {"n[1-3]", "2(x3)", NULL, "4(x3)"};
    cllm_launch_hosts h;
    int nt;
    CHECK(cllm_launch_hosts_slurm(&env, &h, &nt) == CLLM_OK && nt == 0, "%s", cllm_last_error());
    CHECK(cllm_launch_hosts_filter(&h, NULL, "n1:0@n2") == CLLM_OK && h.n == 2 && strcmp(h.hosts[0].name, "n1") == 0 &&
              h.hosts[0].n_sel == 1 && h.hosts[0].cpus == 4 && strcmp(h.hosts[1].name, "n3") == 0,
          "exclude on Slurm hosts: %s", cllm_last_error());
    CHECK(cllm_launch_hosts_limit(&h, 2) == CLLM_OK && cllm_launch_hosts_count(&h) == 2 && h.hosts[1].n_sel == 1,
          "limit on Slurm hosts");
    cllm_launch_hosts_free(&h);
    return check_summary();
}
