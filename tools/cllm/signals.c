/*
 * SIGINT and SIGTERM on a thread of their own (see commands.h).
 *
 * Why not a handler: the x86-64 sgemm kernels of oneDNN run with the stack
 * pointer inside a heap buffer (seen in a core: rsp = a heap address, pc in
 * the JIT code). A handler that the kernel starts on such a thread gets its
 * frame written at that address, over live heap data, and the process later
 * aborts in malloc ("corrupted size vs. prev_size"). So no thread that may
 * compute ever accepts these signals: the mask is set before any other
 * thread exists, every thread inherits it, and one waiter takes them with
 * sigwait.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include "commands.h"

enum { MODE_DEFAULT, MODE_ARMED, MODE_FIRED, MODE_IGNORE };

static atomic_int g_mode = MODE_DEFAULT;
static void (*g_fn)(int sig);
static bool g_started;

static void stop_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

/* The default action of sig, taken now: with the disposition reset and the
 * signal unblocked in this thread, raising it ends the process as an
 * unhandled signal would (the exit status shows the signal). */
static void take_default(int sig) {
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    signal(sig, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
}

static void *waiter_main(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "cllm-signals", 0, 0, 0); /* what tests look for in /proc */
    sigset_t set;
    stop_set(&set);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        int mode = atomic_load(&g_mode);
        if (mode == MODE_IGNORE) continue;
        if (mode == MODE_ARMED) { /* only this thread leaves MODE_ARMED */
            atomic_store(&g_mode, MODE_FIRED);
            g_fn(sig);
            continue;
        }
        take_default(sig);
    }
    return NULL;
}

int tool_signals_start(void) {
    if (g_started) return 0;
    sigset_t set;
    stop_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, waiter_main, NULL);
    pthread_attr_destroy(&attr);
    if (err) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        fprintf(stderr, "cllm: cannot start the signal thread: %s\n", strerror(err));
        return 1;
    }
    g_started = true;
    return 0;
}

void tool_signals_arm(void (*fn)(int sig)) {
    g_fn = fn;
    atomic_store(&g_mode, MODE_ARMED);
}

void tool_signals_ignore(void) {
    if (!g_started) {
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
    }
    atomic_store(&g_mode, MODE_IGNORE);
}
