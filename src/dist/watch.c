/*
 * The collective watchdog's settings (cllm_dist_set_timeout,
 * cllm_dist_set_step), built with and without MPI so that callers never
 * #ifdef; the watchdog itself is watchdog_mpi.c.
 */
#include <stdlib.h>

#include "cllm/dist.h"
#include "dist/watchdog.h"

#define DEFAULT_TIMEOUT 600.0

static double set_timeout; /* 0 = not set */
static long cur_step;

void cllm_dist_set_timeout(double seconds) { set_timeout = seconds > 0 ? seconds : 0; }
void cllm_dist_set_step(long step) { cur_step = step; }
long dist_watch_step(void) { return cur_step; }

double dist_watch_timeout(void) {
    const char *e = getenv("CLLM_DIST_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end == '\0' && v > 0 && v < 1e9) return v;
    }
    return set_timeout > 0 ? set_timeout : DEFAULT_TIMEOUT;
}

cllm_status dist_watch_check_env(void) {
    const char *e = getenv("CLLM_DIST_TIMEOUT");
    if (!e || !*e) return CLLM_OK;
    char *end;
    double v = strtod(e, &end);
    if (*end != '\0' || !(v > 0 && v < 1e9))
        return CLLM_FAIL(CLLM_ERR_ARG, "CLLM_DIST_TIMEOUT='%s': expected seconds, a number > 0 (e.g. 600)", e);
    return CLLM_OK;
}
