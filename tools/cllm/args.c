/* Flag parsing for the cllm command (see args.h). */
#include "args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/core.h"

static const char *kind_meta(arg_kind k) {
    switch (k) {
    case ARG_STR: return " VALUE";
    case ARG_INT: case ARG_I64: return " N";
    case ARG_F64: return " X";
    case ARG_FLAG: return "";
    case ARG_LIST: return " VALUE...";
    }
    return "";
}

void args_usage(const char *cmd, const char *summary, const arg_spec *specs, int n) {
    printf("usage: cllm %s [flags]\n\n%s\n\nflags:\n", cmd, summary);
    for (int i = 0; i < n; i++) {
        char left[96];
        snprintf(left, sizeof left, "--%s%s", specs[i].name, kind_meta(specs[i].kind));
        printf("  %-28s %s", left, specs[i].help);
        if (specs[i].required)
            printf(" (required)");
        else if (specs[i].def)
            printf(" (default: %s)", specs[i].def);
        printf("\n");
    }
    printf("  %-28s %s\n", "--help", "show this help");
}

static int set_value(const char *cmd, arg_spec *s, const char *v) {
    bool ok = true;
    switch (s->kind) {
    case ARG_STR: *(const char **)s->dst = v; break;
    case ARG_INT: ok = cllm_parse_int(v, (int *)s->dst); break;
    case ARG_I64: {
        int64_t x;
        ok = cllm_parse_i64(v, &x);
        if (ok) *(long long *)s->dst = (long long)x;
        break;
    }
    case ARG_F64: ok = cllm_parse_f64(v, (double *)s->dst); break;
    case ARG_FLAG: *(bool *)s->dst = true; break;
    case ARG_LIST: break;
    }
    if (!ok) {
        fprintf(stderr, "cllm %s: --%s: '%s' is not a valid %s\n", cmd, s->name, v,
                s->kind == ARG_F64 ? "number" : "integer");
        return 2;
    }
    return 0;
}

static int list_push(arg_list *l, const char *v) {
    const char **items = realloc(l->items, sizeof(*items) * (size_t)(l->n + 1));
    if (!items) return -1;
    items[l->n++] = v;
    l->items = items;
    return 0;
}

int args_parse(const char *cmd, const char *summary, int argc, char **argv, arg_spec *specs, int n) {
    bool *seen = calloc((size_t)n + 1, sizeof(bool));
    if (!seen) return 2;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (specs[i].kind == ARG_LIST) {
            arg_list *l = specs[i].dst;
            l->items = NULL;
            l->n = 0;
        } else if (specs[i].kind == ARG_FLAG) {
            *(bool *)specs[i].dst = false;
        } else if (specs[i].def) {
            if (set_value(cmd, &specs[i], specs[i].def)) { rc = 2; goto done; }
        } else if (specs[i].kind == ARG_STR) {
            *(const char **)specs[i].dst = NULL;
        }
    }
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            args_usage(cmd, summary, specs, n);
            rc = 1;
            goto done;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "cllm %s: unexpected argument '%s' (see cllm %s --help)\n", cmd, arg, cmd);
            rc = 2;
            goto done;
        }
        const char *name = arg + 2, *inline_val = NULL;
        char namebuf[128];
        const char *eq = strchr(name, '=');
        if (eq) {
            size_t len = (size_t)(eq - name);
            if (len >= sizeof namebuf) len = sizeof namebuf - 1;
            memcpy(namebuf, name, len);
            namebuf[len] = '\0';
            name = namebuf;
            inline_val = eq + 1;
        }
        int k = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(specs[i].name, name) == 0) k = i;
        if (k < 0) {
            fprintf(stderr, "cllm %s: unknown flag '--%s' (see cllm %s --help)\n", cmd, name, cmd);
            rc = 2;
            goto done;
        }
        arg_spec *s = &specs[k];
        if (s->kind != ARG_LIST && s->kind != ARG_FLAG && seen[k]) {
            fprintf(stderr, "cllm %s: --%s given twice\n", cmd, s->name);
            rc = 2;
            goto done;
        }
        seen[k] = true;
        if (s->kind == ARG_FLAG) {
            if (inline_val) {
                fprintf(stderr, "cllm %s: --%s takes no value\n", cmd, s->name);
                rc = 2;
                goto done;
            }
            *(bool *)s->dst = true;
            continue;
        }
        if (s->kind == ARG_LIST) {
            arg_list *l = s->dst;
            int before = l->n;
            if (inline_val && list_push(l, inline_val)) { rc = 2; goto done; }
            while (a + 1 < argc && strncmp(argv[a + 1], "--", 2) != 0)
                if (list_push(l, argv[++a])) { rc = 2; goto done; }
            if (l->n == before) {
                fprintf(stderr, "cllm %s: --%s needs at least one value\n", cmd, s->name);
                rc = 2;
                goto done;
            }
            continue;
        }
        const char *v = inline_val;
        if (!v) {
            if (a + 1 >= argc) {
                fprintf(stderr, "cllm %s: --%s needs a value\n", cmd, s->name);
                rc = 2;
                goto done;
            }
            v = argv[++a];
        }
        if (set_value(cmd, s, v)) { rc = 2; goto done; }
    }
    for (int i = 0; i < n; i++)
        if (specs[i].required && !seen[i]) {
            fprintf(stderr, "cllm %s: missing required flag --%s (see cllm %s --help)\n", cmd,
                    specs[i].name, cmd);
            rc = 2;
            goto done;
        }
done:
    free(seen);
    if (rc == 2 || rc == 1) args_free(specs, n);
    return rc;
}

void args_free(arg_spec *specs, int n) {
    for (int i = 0; i < n; i++)
        if (specs[i].kind == ARG_LIST) {
            arg_list *l = specs[i].dst;
            free(l->items);
            l->items = NULL;
            l->n = 0;
        }
}
