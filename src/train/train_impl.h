/*
 * Private pieces of the training engine shared by its sources: the metrics
 * file and progress display (metrics.c) and the checkpoint saver with its
 * background thread (saver.c). Not part of the public API.
 */
#ifndef CLLM_TRAIN_IMPL_H
#define CLLM_TRAIN_IMPL_H

#include <stdbool.h>
#include <stdio.h>

#include "cllm/checkpoint.h"
#include "cllm/model.h"
#include "cllm/optim.h"
#include "cllm/train.h"

/* ---- metrics.jsonl ---- */
typedef struct {
    FILE *f;
    char *path;
} train_metrics;

/* Opens OUTPUT_DIR/metrics.jsonl for appending. When keep_until_step >= 0
 * (a resumed run), records of later steps (left by a run that went past its
 * last checkpoint) are dropped first, so the file reads as one run. */
cllm_status train_metrics_open(train_metrics *mt, const char *output_dir, long keep_until_step);
/* Appends one record (a JSON object text without newline) and flushes. */
cllm_status train_metrics_write(train_metrics *mt, const char *record);
void train_metrics_close(train_metrics *mt);

/* A small appender for one JSON record: {"k": v, ...}. */
typedef struct {
    char buf[2048];
    size_t len;
} train_record;
void rec_begin(train_record *r);
void rec_num(train_record *r, const char *key, double v); /* null if not finite */
void rec_int(train_record *r, const char *key, long long v);
void rec_bool(train_record *r, const char *key, bool v);
const char *rec_end(train_record *r);

/* ---- the checkpoint saver ---- */
typedef struct train_saver train_saver;

/* n floats of params and optimizer state. async: copy and write on a thread. */
cllm_status train_saver_init(train_saver **out, size_t n, bool has0, bool has1, bool async);
/* Saves a checkpoint of the current state. With async, first waits for the
 * previous write, copies params and state, and returns; the write happens
 * in the background. *wait_seconds gets the time the caller was blocked. */
cllm_status train_saver_save(train_saver *s, const char *out, const cllm_model *m, const float *params,
                             const float *s0, const float *s1, const cllm_ckpt_state *st, size_t max_shard,
                             long keep, double *wait_seconds);
/* Waits for a pending write; returns its status. */
cllm_status train_saver_wait(train_saver *s, double *wait_seconds);
double train_saver_write_seconds(const train_saver *s); /* total background write time */
void train_saver_free(train_saver *s);

#endif
