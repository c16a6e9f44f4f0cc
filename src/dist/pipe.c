/*
 * Pipeline schedules (GPipe and 1F1B); see include/cllm/pipe.h.
 */
#include "cllm/pipe.h"

#include <string.h>

cllm_status cllm_pipe_schedule_parse(const char *name, cllm_pipe_schedule *out) {
    if (name && strcmp(name, "gpipe") == 0) {
        *out = CLLM_PIPE_GPIPE;
        return CLLM_OK;
    }
    if (name && (strcmp(name, "1f1b") == 0 || strcmp(name, "pipedream-flush") == 0)) {
        *out = CLLM_PIPE_1F1B;
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_ARG, "pipeline schedule '%s': expected \"gpipe\" or \"1f1b\"", name ? name : "(null)");
}

const char *cllm_pipe_schedule_name(cllm_pipe_schedule s) { return s == CLLM_PIPE_GPIPE ? "gpipe" : "1f1b"; }

void cllm_pipe_ops(cllm_pipe_schedule sch, int K, int s, int M, cllm_pipe_op *ops) {
    int n = 0;
    if (sch == CLLM_PIPE_GPIPE) {
        for (int i = 0; i < M; i++) ops[n++] = (cllm_pipe_op){CLLM_PIPE_FWD, i};
        for (int i = 0; i < M; i++) ops[n++] = (cllm_pipe_op){CLLM_PIPE_BWD, i};
        return;
    }
    int warm = K - s - 1 < M ? K - s - 1 : M;
    int steady = M - warm;
    for (int i = 0; i < warm; i++) ops[n++] = (cllm_pipe_op){CLLM_PIPE_FWD, i};
    for (int i = 0; i < steady; i++) {
        ops[n++] = (cllm_pipe_op){CLLM_PIPE_FWD, warm + i};
        ops[n++] = (cllm_pipe_op){CLLM_PIPE_BWD, i};
    }
    for (int i = 0; i < warm; i++) ops[n++] = (cllm_pipe_op){CLLM_PIPE_BWD, steady + i};
}

int cllm_pipe_max_in_flight(cllm_pipe_schedule sch, int K, int s, int M) {
    if (sch == CLLM_PIPE_GPIPE) return M;
    return K - s < M ? K - s : M;
}
