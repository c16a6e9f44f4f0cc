/*
 * The settings of the collective watchdog (cllm_dist_set_timeout,
 * cllm_dist_set_step) and of the heartbeat (cllm_dist_set_heartbeat_timeout),
 * built with and without MPI so that callers never #ifdef; the watchdog and
 * the heartbeat themselves are watchdog_mpi.c and heartbeat_mpi.c.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cllm/dist.h"
#include "dist/watchdog.h"

#define DEFAULT_TIMEOUT 600.0
#define DEFAULT_HEARTBEAT 30.0

static double set_timeout;       /* 0 = not set */
static double set_heartbeat = -1; /* < 0 = not set; 0 = off */
static atomic_long cur_step; /* also read by the heartbeat thread */

void cllm_dist_set_timeout(double seconds) { set_timeout = seconds > 0 ? seconds : 0; }
void cllm_dist_set_heartbeat_timeout(double seconds) { set_heartbeat = seconds >= 0 ? seconds : -1; }
void cllm_dist_set_step(long step) { atomic_store(&cur_step, step); }
long dist_watch_step(void) { return atomic_load(&cur_step); }

/* *out <- the number in `name` when it is a number of seconds in [min, 1e9);
 * false when unset, empty or not such a number. */
static bool env_seconds(const char *name, double min, bool min_ok, double *out) {
    const char *e = getenv(name);
    if (!e || !*e) return false;
    char *end;
    double v = strtod(e, &end);
    if (*end != '\0' || !(min_ok ? v >= min : v > min) || !(v < 1e9)) return false;
    *out = v;
    return true;
}

double dist_watch_timeout(void) {
    double v;
    if (env_seconds("CLLM_DIST_TIMEOUT", 0, false, &v)) return v;
    return set_timeout > 0 ? set_timeout : DEFAULT_TIMEOUT;
}

double dist_heartbeat_timeout(void) {
    double v;
    if (env_seconds("CLLM_HEARTBEAT_TIMEOUT", 0, true, &v)) return v;
    return set_heartbeat >= 0 ? set_heartbeat : DEFAULT_HEARTBEAT;
}

cllm_status dist_watch_check_env(void) {
    double v;
    const char *e = getenv("CLLM_DIST_TIMEOUT");
    if (e && *e && !env_seconds("CLLM_DIST_TIMEOUT", 0, false, &v))
        return CLLM_FAIL(CLLM_ERR_ARG, "CLLM_DIST_TIMEOUT='%s': expected seconds, a number > 0 (e.g. 600)", e);
    e = getenv("CLLM_HEARTBEAT_TIMEOUT");
    if (e && *e && !env_seconds("CLLM_HEARTBEAT_TIMEOUT", 0, true, &v))
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "CLLM_HEARTBEAT_TIMEOUT='%s': expected seconds, a number >= 0 (e.g. 30; 0 turns the heartbeat "
                         "off)",
                         e);
    return CLLM_OK;
}
