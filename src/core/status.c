/*
 * Status codes, the thread-local last-error message, and stderr logging.
 * Deliberately minimal: no error stacks, one message per thread, which the
 * caller may prefix with context as the error travels up.
 */
#include "cllm/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERR_CAP 2048

static _Thread_local char g_err[ERR_CAP];
static cllm_log_level g_level = CLLM_LOG_INFO;

const char *cllm_status_str(cllm_status st) {
    switch (st) {
    case CLLM_OK: return "ok";
    case CLLM_ERR_ARG: return "bad argument";
    case CLLM_ERR_IO: return "i/o error";
    case CLLM_ERR_FORMAT: return "format error";
    case CLLM_ERR_NOMEM: return "out of memory";
    case CLLM_ERR_UNSUPPORTED: return "unsupported";
    case CLLM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

/* dst = a + ": " + b, cut at ERR_CAP-1 bytes (long messages are truncated on
 * purpose; the beginning says what failed). */
static void join(char *dst, const char *a, const char *b) {
    size_t n = 0;
    for (const char *parts[3] = {a, ": ", b}, **p = parts; p < parts + 3; p++)
        for (const char *c = *p; *c && n < ERR_CAP - 1; c++) dst[n++] = *c;
    dst[n] = '\0';
}

const char *cllm_last_error(void) { return g_err; }

void cllm_error_clear(void) { g_err[0] = '\0'; }

cllm_status cllm_fail(cllm_status st, const char *func, const char *fmt, ...) {
    char msg[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    join(g_err, func ? func : "cllm", msg);
    return st;
}

cllm_status cllm_fail_context(cllm_status st, const char *fmt, ...) {
    char ctx[ERR_CAP], old[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, g_err, sizeof old);
    join(g_err, ctx, old);
    return st;
}

void cllm_log_set_level(cllm_log_level level) { g_level = level; }

void cllm_log(cllm_log_level level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warning", "error"};
    if (level < g_level) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level == CLLM_LOG_INFO)
        fprintf(stderr, "%s\n", msg);
    else
        fprintf(stderr, "%s: %s\n", names[level], msg);
}
