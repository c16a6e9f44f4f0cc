/*
 * Slurm's compressed host lists and counts (cllm/launch.h), read by `cllm
 * launch` inside an allocation (salloc, sbatch) from SLURM_JOB_NODELIST,
 * SLURM_TASKS_PER_NODE, SLURM_NTASKS and SLURM_JOB_CPUS_PER_NODE. Pure
 * parsing, checked rule by rule in tests/test_launch_slurm.c.
 *
 * Host list: names separated by commas outside brackets; a name may hold
 * bracket groups of comma-separated numbers and ranges (`node[01-03,07]`,
 * `rack[1-2]-n[1-2]`), expanded as a product with the last group varying
 * fastest. A range keeps the width of its first number (`[08-10]` gives
 * 08 09 10). Counts: comma-separated `N` or `N(xM)` (N repeated M times).
 * At most 65536 hosts or counts, 2^20 tasks in all, numbers of at most 9
 * digits.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/launch.h"

#define MAX_ITEMS 65536
#define MAX_NAME 255
#define MAX_TASKS (1 << 20) /* tasks of a whole allocation: rank counts stay ints */

/* The growing list of expanded names. */
typedef struct {
    char **v;
    int n, cap;
} names;

/* Parses the decimal number spanning exactly [s, e) (1..9 digits). */
static bool parse_num(const char *s, const char *e, long *v) {
    if (s == e || e - s > 9) return false;
    long x = 0;
    for (const char *q = s; q < e; q++) {
        if (!isdigit((unsigned char)*q)) return false;
        x = x * 10 + (*q - '0');
    }
    *v = x;
    return true;
}

static cllm_status push_name(names *l, const char *s, size_t len, const char *what, const char *list) {
    if (l->n >= MAX_ITEMS)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': more than %d hosts", what, list, MAX_ITEMS);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    char **v = l->v;
    if (!(v[l->n] = malloc(len + 1))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(v[l->n], s, len);
    v[l->n][len] = '\0';
    l->n++;
    return CLLM_OK;
}

/* Checks the bracket groups of one name [s, e) without expanding them. */
static cllm_status check_name(const char *s, const char *e, const char *what, const char *list) {
    if (s == e) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': empty host name", what, list);
    for (const char *p = s; p < e; p++) {
        if (*p == ']')
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': ']' without a '[' in '%.*s'", what, list, (int)(e - s), s);
        if (*p != '[') continue;
        const char *c = memchr(p + 1, ']', (size_t)(e - p - 1));
        const char *o = memchr(p + 1, '[', (size_t)(e - p - 1));
        if (o && (!c || o < c))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': '[' inside '[...]' in '%.*s'", what, list, (int)(e - s), s);
        if (!c)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': '[' without a matching ']' in '%.*s'", what, list, (int)(e - s), s);
        for (const char *r = p + 1; r <= c;) {
            const char *re = memchr(r, ',', (size_t)(c - r));
            if (!re) re = c;
            const char *dash = memchr(r, '-', (size_t)(re - r));
            long lo = 0, hi = 0;
            bool ok = dash ? parse_num(r, dash, &lo) && parse_num(dash + 1, re, &hi) : parse_num(r, re, &lo);
            if (!ok)
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': '%.*s' in '%.*s' is not a number or a range LO-HI", what,
                                 list, (int)(re - r), r, (int)(e - s), s);
            if (dash && hi < lo)
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': range '%.*s' in '%.*s' runs backwards", what, list,
                                 (int)(re - r), r, (int)(e - s), s);
            r = re + 1;
        }
        p = c;
    }
    return CLLM_OK;
}

/* Expands name [s, e) (checked) with the text before s already in buf[0..len). */
static cllm_status expand(const char *s, const char *e, char *buf, size_t len, names *l, const char *what,
                          const char *list) {
    const char *b = memchr(s, '[', (size_t)(e - s));
    size_t lit = (size_t)((b ? b : e) - s);
    if (len + lit > MAX_NAME)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': a host name is longer than %d bytes", what, list, MAX_NAME);
    memcpy(buf + len, s, lit);
    len += lit;
    if (!b) return push_name(l, buf, len, what, list);
    const char *c = memchr(b, ']', (size_t)(e - b));
    for (const char *r = b + 1; r <= c;) {
        const char *re = memchr(r, ',', (size_t)(c - r));
        if (!re) re = c;
        const char *dash = memchr(r, '-', (size_t)(re - r));
        long lo = 0, hi = 0;
        parse_num(r, dash ? dash : re, &lo);
        if (dash) parse_num(dash + 1, re, &hi);
        else hi = lo;
        int width = (int)((dash ? dash : re) - r);
        for (long k = lo; k <= hi; k++) {
            char num[32];
            int nl = snprintf(num, sizeof num, "%0*ld", width, k);
            if (len + (size_t)nl > MAX_NAME)
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': a host name is longer than %d bytes", what, list, MAX_NAME);
            memcpy(buf + len, num, (size_t)nl);
            cllm_status st = expand(c + 1, e, buf, len + (size_t)nl, l, what, list);
            if (st) return st;
        }
        r = re + 1;
    }
    return CLLM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A name listed twice (sorted copy: host lists may hold 65536 names). */
static cllm_status check_unique(const names *l, const char *what, const char *list) {
    if (l->n < 2) return CLLM_OK;
    char **v = malloc((size_t)l->n * sizeof *v);
    if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(v, l->v, (size_t)l->n * sizeof *v);
    qsort(v, (size_t)l->n, sizeof *v, cmp_str);
    cllm_status st = CLLM_OK;
    for (int i = 1; i < l->n && !st; i++)
        if (strcmp(v[i - 1], v[i]) == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': host '%s' is listed twice", what, list, v[i]);
    free(v);
    return st;
}

cllm_status cllm_launch_slurm_hostlist(const char *list, const char *what, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    names l = {0};
    cllm_status st = CLLM_OK;
    if (!list || !*list) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s is empty: expected host names such as 'node[01-03,07]'", what);
    for (const char *p = list; !st && p && *p;) {
        /* the name ends at the first comma outside brackets */
        const char *e = p;
        int depth = 0;
        while (*e && !(*e == ',' && depth == 0)) {
            depth += *e == '[' ? 1 : *e == ']' ? -1 : 0;
            e++;
        }
        if (!(st = check_name(p, e, what, list))) {
            char buf[MAX_NAME + 1];
            st = expand(p, e, buf, 0, &l, what, list);
        }
        if (st || !*e) break;
        p = e + 1;
        if (!*p) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': empty host name after the last ','", what, list);
    }
    if (!st) st = check_unique(&l, what, list);
    if (st) {
        cllm_launch_env_free(l.v, l.n);
        return st;
    }
    *out = l.v;
    *n = l.n;
    return CLLM_OK;
}

cllm_status cllm_launch_slurm_counts(const char *spec, const char *what, int n, int *out) {
    int k = 0;
    if (!spec || !*spec) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s is empty: expected counts such as '2(x3),1'", what);
    for (const char *p = spec;;) {
        const char *e = strchr(p, ',');
        if (!e) e = p + strlen(p);
        const char *par = memchr(p, '(', (size_t)(e - p));
        long v = 0, rep = 1;
        bool ok = parse_num(p, par ? par : e, &v) && v >= 1 && v <= MAX_ITEMS;
        if (ok && par)
            ok = e - par >= 4 && par[1] == 'x' && e[-1] == ')' && parse_num(par + 2, e - 1, &rep) && rep >= 1;
        if (!ok)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s': '%.*s' is not a count N (1..%d) or N(xM)", what, spec,
                             (int)(e - p), p, MAX_ITEMS);
        if (rep > n - k)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s' gives more than the %d count%s its host list needs", what, spec,
                             n, n == 1 ? "" : "s");
        for (long r = 0; r < rep; r++) out[k++] = (int)v;
        if (!*e) break;
        p = e + 1;
    }
    if (k != n)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s '%s' gives %d count%s for %d hosts", what, spec, k, k == 1 ? "" : "s", n);
    return CLLM_OK;
}

cllm_status cllm_launch_hosts_slurm(const cllm_launch_slurm *env, cllm_launch_hosts *out, int *ntasks) {
    memset(out, 0, sizeof *out);
    *ntasks = 0;
    char **hn = NULL;
    int n = 0;
    cllm_status st = cllm_launch_slurm_hostlist(env->nodelist, "SLURM_JOB_NODELIST", &hn, &n);
    if (st) return st;
    int *tasks = malloc((size_t)n * sizeof *tasks), *cpus = calloc((size_t)n, sizeof *cpus);
    cllm_launch_hosts h = {0};
    if (!tasks || !cpus) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st && !env->tasks_per_node)
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "SLURM_JOB_NODELIST is set but SLURM_TASKS_PER_NODE is not");
    if (!st) st = cllm_launch_slurm_counts(env->tasks_per_node, "SLURM_TASKS_PER_NODE", n, tasks);
    if (!st && env->cpus_per_node) st = cllm_launch_slurm_counts(env->cpus_per_node, "SLURM_JOB_CPUS_PER_NODE", n, cpus);
    long total = 0;
    for (int i = 0; !st && i < n; i++) total += tasks[i];
    long want = total;
    if (!st && total > MAX_TASKS)
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "SLURM_TASKS_PER_NODE '%s' places %ld tasks, more than %d", env->tasks_per_node,
                       total, MAX_TASKS);
    if (!st && env->ntasks) {
        const char *s = env->ntasks;
        if (!parse_num(s, s + strlen(s), &want) || want < 1)
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "SLURM_NTASKS '%s' is not a positive task count", s);
        else if (want > total)
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "SLURM_NTASKS=%ld but SLURM_TASKS_PER_NODE '%s' places only %ld task%s", want,
                           env->tasks_per_node, total, total == 1 ? "" : "s");
    }
    for (int i = 0; !st && i < n; i++) {
        if (!h.hosts && !(h.hosts = malloc((size_t)n * sizeof *h.hosts))) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        int *sel = malloc((size_t)tasks[i] * sizeof *sel);
        if (!sel) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        for (int s = 0; s < tasks[i]; s++) sel[s] = s;
        h.hosts[h.n++] = (cllm_launch_host){hn[i], tasks[i], tasks[i], sel, cpus[i]};
        hn[i] = NULL; /* owned by h now */
    }
    cllm_launch_env_free(hn, n);
    free(tasks);
    free(cpus);
    if (st) {
        cllm_launch_hosts_free(&h);
        return st;
    }
    *out = h;
    *ntasks = env->ntasks ? (int)want : 0;
    return CLLM_OK;
}
