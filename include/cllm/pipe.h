/*
 * cllm pipe: the order in which a pipeline stage runs its micro-batches.
 *
 * A step of pipeline-parallel training splits the batch into M micro-batches
 * (gradient_accumulation_steps) that flow through K stages. Each stage runs
 * 2M operations: the forward of each micro-batch (input from the previous
 * stage, or the tokens on the first; output to the next stage, or the loss
 * on the last) and its backward (output gradient from the next stage, or the
 * loss on the last; input gradient to the previous stage). Two schedules:
 *
 *   gpipe  all M forwards, then all M backwards (GPipe). Every stage holds
 *          the activations of all M micro-batches at once.
 *   1f1b   PipeDream-Flush: stage s runs min(K - s - 1, M) forwards to fill
 *          the pipe, then alternates one forward and one backward, then
 *          drains the remaining backwards. Stage s holds at most
 *          min(K - s, M) micro-batches' activations; the step takes as long
 *          as GPipe's.
 *
 * With forward time f and backward time b per micro-batch and stage, both
 * take (M + K - 1)(f + b): the idle "bubble" is a fraction (K - 1)/(M + K - 1)
 * of each stage's time. Backwards run in micro-batch order on every stage,
 * and messages between two stages are sent in the order they are received,
 * so blocking receives never wait on each other in a cycle.
 */
#ifndef CLLM_PIPE_H
#define CLLM_PIPE_H

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_PIPE_GPIPE = 0, CLLM_PIPE_1F1B } cllm_pipe_schedule;
typedef enum { CLLM_PIPE_FWD = 0, CLLM_PIPE_BWD } cllm_pipe_kind;

typedef struct {
    cllm_pipe_kind kind;
    int micro; /* micro-batch index, 0..M-1 */
} cllm_pipe_op;

/* "gpipe" or "1f1b" (also "pipedream-flush"); anything else fails naming
 * the accepted values. */
cllm_status cllm_pipe_schedule_parse(const char *name, cllm_pipe_schedule *out);
const char *cllm_pipe_schedule_name(cllm_pipe_schedule s);

/* Fills ops[2M] with stage s's operations in the order it runs them.
 * K >= 1 stages, 0 <= s < K, M >= 1. */
void cllm_pipe_ops(cllm_pipe_schedule sch, int K, int s, int M, cllm_pipe_op *ops);

/* Largest number of micro-batches whose activations stage s holds at once
 * (forwarded, not yet backwarded) under the schedule. */
int cllm_pipe_max_in_flight(cllm_pipe_schedule sch, int K, int s, int M);

#ifdef __cplusplus
}
#endif
#endif
