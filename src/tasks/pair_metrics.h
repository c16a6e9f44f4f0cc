/*
 * The running means a preference objective (dpo.c, reward.c) publishes as
 * its metrics: sums over the pairs run since they were last taken, one set
 * for training micro-batches and one for evaluation.
 */
#ifndef CLLM_TASKS_PAIR_METRICS_H
#define CLLM_TASKS_PAIR_METRICS_H

#include "cllm/objective.h"

enum { PAIR_METRICS_MAX = 8 };

typedef struct {
    double sums[PAIR_METRICS_MAX];
    long n_pairs;
} pair_metrics;

/* Writes the means of the first min(count, cap) sums, named names[i], to
 * out and returns how many (0 when no pair ran); then starts over. */
int pair_metrics_take(pair_metrics *a, const char *const *names, int count, cllm_objective_metric *out, int cap);

#endif
