/*
 * `cllm launch` runs mpirun as a child and watches it, for one failure that
 * mpirun does not end by itself: a host that becomes unreachable (a network
 * partition, a host frozen or powered off). The ranks notice it (the
 * heartbeat, src/dist/heartbeat_mpi.c) and call MPI_Abort, but mpirun then
 * waits for the daemon on the far side to confirm that its ranks are gone,
 * which it never does: the job would hang until TCP gives up (minutes to
 * hours). So the launcher passes mpirun's stderr through unchanged and,
 * from the moment a line says the job is being ended ("MPI_ABORT was
 * invoked", or a "cllm dist: ... ending" line), gives mpirun
 * LAUNCH_GRACE_S seconds to exit; past that it stops mpirun (SIGTERM, then
 * SIGKILL) and exits 1 saying so. Ranks on the unreachable side end on
 * their own (their heartbeat sees the launcher's side go silent, and a rank
 * whose MPI_Abort does not return exits anyway).
 *
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher go to mpirun,
 * as they would with mpirun in its place. stdout is not touched.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_supervise.h"

static volatile sig_atomic_t child_pid = 0;

static void forward(int sig) {
    if (child_pid > 0) kill((pid_t)child_pid, sig);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return; /* stderr gone: keep supervising all the same */
        }
        p += w;
        n -= (size_t)w;
    }
}

/* True when a line of mpirun's stderr says that the job is being ended. */
static bool is_abort_line(const char *line) {
    if (strstr(line, "MPI_ABORT was invoked")) return true;
    return strncmp(line, "cllm dist: ", 11) == 0 && strstr(line, "ending ");
}

/* The exit status the shell would report for the child's wait status. */
static int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

static bool wait_for(pid_t pid, int *status, double seconds) {
    double end = now_s() + seconds;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return true;
        if (r < 0 && errno != EINTR) return true; /* nothing left to wait for */
        if (now_s() >= end) return false;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int launch_supervise(char *const argv[], double grace_s) {
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "cllm launch: pipe: %s\n", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "cllm launch: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        if (dup2(fds[1], STDERR_FILENO) < 0) _exit(127);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "cllm launch: cannot run %s: %s (install openmpi-bin, or give --mpirun PATH)\n", argv[0],
                strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    child_pid = pid;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);

    char line[1024];
    size_t ll = 0;
    double deadline = -1; /* set once the job is being ended */
    bool open_ = true;
    int status = 0;
    for (;;) {
        int wait_ms = 200;
        if (open_) {
            struct pollfd p = {fds[0], POLLIN, 0};
            int r = poll(&p, 1, wait_ms);
            if (r > 0) {
                char buf[4096];
                ssize_t n = read(fds[0], buf, sizeof buf);
                if (n > 0) {
                    write_all(STDERR_FILENO, buf, (size_t)n);
                    for (ssize_t i = 0; i < n; i++) {
                        if (buf[i] != '\n') {
                            if (ll < sizeof line - 1) line[ll++] = buf[i];
                            continue;
                        }
                        line[ll] = '\0';
                        if (deadline < 0 && is_abort_line(line)) deadline = now_s() + grace_s;
                        ll = 0;
                    }
                } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                    open_ = false; /* mpirun closed stderr: it is exiting */
                }
            }
        } else {
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) break;
        if (deadline >= 0 && now_s() >= deadline) {
            fprintf(stderr,
                    "cllm launch: mpirun did not end the job within %g s after it was told to (a host it cannot "
                    "reach?); stopping mpirun. Ranks on a host cut off from this one end on their own once their "
                    "heartbeat limit passes.\n",
                    grace_s);
            kill(pid, SIGTERM);
            if (!wait_for(pid, &status, 5)) {
                kill(pid, SIGKILL);
                wait_for(pid, &status, 5);
            }
            close(fds[0]);
            child_pid = 0;
            return 1;
        }
    }
    /* what mpirun wrote after it exited (its children may hold the pipe:
     * read only what is there) */
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (!open_ || poll(&p, 1, 0) <= 0) break;
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0) break;
        write_all(STDERR_FILENO, buf, (size_t)n);
    }
    close(fds[0]);
    child_pid = 0;
    return exit_code(status);
}
