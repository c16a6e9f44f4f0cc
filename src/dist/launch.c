/*
 * Hostfiles, include/exclude filters and environment files for `cllm
 * launch` (cllm/launch.h). Pure parsing: nothing here starts a process, so
 * tests/test_launch.c checks every rule and message directly.
 *
 * Limits: lines of a hostfile or environment file up to 4095 bytes, up to
 * 65536 slots per host (a rank count, not a core count).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/launch.h"

#define MAX_SLOTS 65536
#define MAX_LINE 4095

void cllm_launch_hosts_free(cllm_launch_hosts *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) {
        free(h->hosts[i].name);
        free(h->hosts[i].sel);
    }
    free(h->hosts);
    h->hosts = NULL;
    h->n = 0;
}

int cllm_launch_hosts_count(const cllm_launch_hosts *h) {
    int n = 0;
    for (int i = 0; i < h->n; i++) n += h->hosts[i].n_sel;
    return n;
}

/* Appends host `name` (len bytes) with every slot selected. */
static cllm_status add_host(cllm_launch_hosts *h, const char *name, size_t len, int slots) {
    cllm_launch_host *hs = realloc(h->hosts, (size_t)(h->n + 1) * sizeof *hs);
    if (!hs) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    h->hosts = hs;
    cllm_launch_host *x = &hs[h->n];
    x->name = malloc(len + 1);
    x->sel = malloc((size_t)slots * sizeof *x->sel);
    if (!x->name || !x->sel) {
        free(x->name);
        free(x->sel);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    memcpy(x->name, name, len);
    x->name[len] = '\0';
    x->slots = x->n_sel = slots;
    x->cpus = 0;
    for (int s = 0; s < slots; s++) x->sel[s] = s;
    h->n++;
    return CLLM_OK;
}

cllm_status cllm_launch_hosts_single(const char *name, int slots, cllm_launch_hosts *out) {
    memset(out, 0, sizeof *out);
    if (slots < 1 || slots > MAX_SLOTS) return CLLM_FAIL(CLLM_ERR_ARG, "%d ranks: expected 1..%d", slots, MAX_SLOTS);
    return add_host(out, name, strlen(name), slots);
}

/* A line of `text` starting at *p: [start, end) without the newline and
 * without a comment; *p moves past the newline. */
static void next_line(const char **p, const char **start, const char **end, bool strip_comment) {
    const char *s = *p, *e = strchr(s, '\n');
    if (!e) e = s + strlen(s);
    *p = *e ? e + 1 : e;
    *start = s;
    if (strip_comment) {
        const char *c = memchr(s, '#', (size_t)(e - s));
        if (c) e = c;
    }
    while (e > s && isspace((unsigned char)e[-1])) e--;
    while (s < e && isspace((unsigned char)*s)) s++;
    *start = s;
    *end = e;
}

/* Parses a decimal integer in [lo, hi] spanning exactly [s, e). */
static bool parse_int(const char *s, const char *e, int lo, int hi, int *v) {
    if (s == e || e - s > 9) return false;
    long x = 0;
    for (const char *q = s; q < e; q++) {
        if (!isdigit((unsigned char)*q)) return false;
        x = x * 10 + (*q - '0');
    }
    if (x < lo || x > hi) return false;
    *v = (int)x;
    return true;
}

static int find_host(const cllm_launch_hosts *h, const char *name, size_t len) {
    for (int i = 0; i < h->n; i++)
        if (strlen(h->hosts[i].name) == len && memcmp(h->hosts[i].name, name, len) == 0) return i;
    return -1;
}

cllm_status cllm_launch_hostfile_parse(const char *text, const char *path, cllm_launch_hosts *out) {
    memset(out, 0, sizeof *out);
    cllm_launch_hosts h = {0};
    cllm_status st = CLLM_OK;
    const char *p = text;
    for (int line = 1; *p; line++) {
        const char *raw = p, *s, *e;
        next_line(&p, &s, &e, true);
        if (p - raw > MAX_LINE + 1) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: line longer than %d bytes", path, line, MAX_LINE);
            break;
        }
        if (s == e) continue;
        const char *ne = s;
        while (ne < e && !isspace((unsigned char)*ne)) ne++;
        const char *v = ne;
        while (v < e && isspace((unsigned char)*v)) v++;
        int slots = 0;
        if (v == e || (size_t)(e - v) < 6 || strncmp(v, "slots=", 6) != 0) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: expected 'HOST slots=N', got '%.*s'", path, line, (int)(e - s), s);
            break;
        }
        if (!parse_int(v + 6, e, 1, MAX_SLOTS, &slots)) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: slots must be an integer in 1..%d, got '%.*s'", path, line, MAX_SLOTS,
                           (int)(e - v - 6), v + 6);
            break;
        }
        if (memchr(s, '@', (size_t)(ne - s)) || memchr(s, ':', (size_t)(ne - s)) || memchr(s, ',', (size_t)(ne - s))) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: host name '%.*s' contains '@', ':' or ','", path, line,
                           (int)(ne - s), s);
            break;
        }
        if (find_host(&h, s, (size_t)(ne - s)) >= 0) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: host '%.*s' is listed twice", path, line, (int)(ne - s), s);
            break;
        }
        if ((st = add_host(&h, s, (size_t)(ne - s), slots))) break;
    }
    if (!st && h.n == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no hosts (expected lines 'HOST slots=N')", path);
    if (st) {
        cllm_launch_hosts_free(&h);
        return st;
    }
    *out = h;
    return CLLM_OK;
}

cllm_status cllm_launch_hostfile_load(const char *path, cllm_launch_hosts *out) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    cllm_status st = cllm_read_file(path, &text, &len);
    if (st) return st;
    if (strlen(text) != len) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: contains a NUL byte", path);
    else st = cllm_launch_hostfile_parse(text, path, out);
    free(text);
    return st;
}

/* One parsed filter: per host of *h, a mark per slot (or the whole host). */
typedef struct {
    bool *host;  /* [h->n] host named */
    bool **slot; /* [h->n][slots] slot named; NULL row = bare host */
} marks;

static void marks_free(marks *m, int n) {
    if (m->slot)
        for (int i = 0; i < n; i++) free(m->slot[i]);
    free(m->slot);
    free(m->host);
}

static cllm_status parse_filter(const cllm_launch_hosts *h, const char *spec, const char *what, marks *m) {
    m->host = calloc((size_t)h->n, sizeof *m->host);
    m->slot = calloc((size_t)h->n, sizeof *m->slot);
    if (!m->host || !m->slot) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    const char *p = spec;
    while (true) {
        const char *e = strchr(p, '@');
        if (!e) e = p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(e - p));
        const char *ne = colon ? colon : e;
        if (ne == p) return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s': empty host name", what, spec);
        int hi = find_host(h, p, (size_t)(ne - p));
        if (hi < 0) return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s': host '%.*s' is not in the hostfile", what, spec, (int)(ne - p), p);
        if (m->host[hi] && (!colon) != (!m->slot[hi]))
            return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s': host '%s' given both with and without slots", what, spec,
                             h->hosts[hi].name);
        m->host[hi] = true;
        if (colon) {
            if (!m->slot[hi] && !(m->slot[hi] = calloc((size_t)h->hosts[hi].slots, sizeof **m->slot)))
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            const char *q = colon + 1;
            while (true) {
                const char *c = memchr(q, ',', (size_t)(e - q));
                if (!c) c = e;
                int id = 0;
                if (!parse_int(q, c, 0, INT_MAX - 1, &id))
                    return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s': slot '%.*s' of host '%s' is not a slot number", what, spec,
                                     (int)(c - q), q, h->hosts[hi].name);
                if (id >= h->hosts[hi].slots)
                    return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s': host '%s' has no slot %d (slots=%d: 0..%d)", what, spec,
                                     h->hosts[hi].name, id, h->hosts[hi].slots, h->hosts[hi].slots - 1);
                m->slot[hi][id] = true;
                if (c == e) break;
                q = c + 1;
            }
        }
        if (!*e) break;
        p = e + 1;
    }
    return CLLM_OK;
}

cllm_status cllm_launch_hosts_filter(cllm_launch_hosts *h, const char *include, const char *exclude) {
    bool inc = include && *include, exc = exclude && *exclude;
    if (inc && exc) return CLLM_FAIL(CLLM_ERR_ARG, "--include and --exclude are mutually exclusive");
    if (!inc && !exc) return CLLM_OK;
    const char *spec = inc ? include : exclude, *what = inc ? "--include" : "--exclude";
    marks m = {0};
    cllm_status st = parse_filter(h, spec, what, &m);
    if (st) {
        marks_free(&m, h->n);
        return st;
    }
    /* the new selection of each host, then the hosts that keep a slot */
    int kept = 0;
    for (int i = 0; i < h->n; i++) {
        cllm_launch_host *x = &h->hosts[i];
        int n = 0;
        for (int k = 0; k < x->n_sel; k++) {
            int s = x->sel[k];
            bool named = m.host[i] && (!m.slot[i] || m.slot[i][s]);
            if (named == inc) n++;
        }
        if (n) kept++;
    }
    if (kept == 0) {
        marks_free(&m, h->n);
        return CLLM_FAIL(CLLM_ERR_ARG, "%s '%s' leaves no slot to run on", what, spec);
    }
    int j = 0;
    for (int i = 0; i < h->n; i++) {
        cllm_launch_host x = h->hosts[i];
        int n = 0;
        for (int k = 0; k < x.n_sel; k++) {
            int s = x.sel[k];
            bool named = m.host[i] && (!m.slot[i] || m.slot[i][s]);
            if (named == inc) x.sel[n++] = s;
        }
        x.n_sel = n;
        if (n) {
            h->hosts[j++] = x;
        } else {
            free(x.name);
            free(x.sel);
        }
    }
    marks_free(&m, h->n);
    h->n = j;
    return CLLM_OK;
}

cllm_status cllm_launch_hosts_limit(cllm_launch_hosts *h, int n) {
    int total = cllm_launch_hosts_count(h);
    if (n < 1 || n > total)
        return CLLM_FAIL(CLLM_ERR_ARG, "%d ranks requested, but the hosts offer %d slot%s", n, total, total == 1 ? "" : "s");
    int left = n, j = 0;
    for (int i = 0; i < h->n; i++) {
        cllm_launch_host x = h->hosts[i];
        if (left == 0) {
            free(x.name);
            free(x.sel);
            continue;
        }
        if (x.n_sel > left) x.n_sel = left;
        left -= x.n_sel;
        h->hosts[j++] = x;
    }
    h->n = j;
    return CLLM_OK;
}

void cllm_launch_env_free(char **kv, int n) {
    if (!kv) return;
    for (int i = 0; i < n; i++) free(kv[i]);
    free(kv);
}

cllm_status cllm_launch_env_parse(const char *text, const char *path, char ***kv, int *n) {
    *kv = NULL;
    *n = 0;
    char **list = NULL;
    int cnt = 0;
    cllm_status st = CLLM_OK;
    const char *p = text;
    for (int line = 1; *p; line++) {
        const char *raw = p, *s, *e;
        next_line(&p, &s, &e, false);
        if (p - raw > MAX_LINE + 1) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: line longer than %d bytes", path, line, MAX_LINE);
            break;
        }
        if (s == e || *s == '#') continue;
        const char *eq = memchr(s, '=', (size_t)(e - s));
        const char *ke = eq ? eq : e;
        while (ke > s && isspace((unsigned char)ke[-1])) ke--;
        bool ok = eq && ke > s && (isalpha((unsigned char)*s) || *s == '_');
        for (const char *q = s; ok && q < ke; q++) ok = isalnum((unsigned char)*q) || *q == '_';
        if (!ok) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d: expected KEY=VALUE with KEY made of letters, digits and '_', got '%.*s'",
                           path, line, (int)(e - s), s);
            break;
        }
        const char *v = eq + 1;
        while (v < e && isspace((unsigned char)*v)) v++;
        char **l = realloc(list, (size_t)(cnt + 1) * sizeof *l);
        char *item = malloc((size_t)(ke - s) + (size_t)(e - v) + 2);
        if (l) list = l;
        if (!l || !item) {
            free(item);
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(item, s, (size_t)(ke - s));
        item[ke - s] = '=';
        memcpy(item + (ke - s) + 1, v, (size_t)(e - v));
        item[(ke - s) + 1 + (e - v)] = '\0';
        list[cnt++] = item;
    }
    if (st) {
        cllm_launch_env_free(list, cnt);
        return st;
    }
    *kv = list;
    *n = cnt;
    return CLLM_OK;
}
