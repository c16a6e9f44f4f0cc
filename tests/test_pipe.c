/*
 * Pipeline schedules: each stage's operation list is complete and ordered,
 * a simulation of K stages with blocking hand-offs never deadlocks, the
 * step takes (M + K - 1)(f + b) with uniform stage times (the bubble theory),
 * and 1F1B holds min(K - s, M) micro-batches where GPipe holds M.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/pipe.h"

#define MAXK 8
#define MAXM 12

/* Runs the schedule with forward time f and backward time b; returns the
 * step time, or -1 on a deadlock. */
static double simulate(cllm_pipe_schedule sch, int K, int M, double f, double b) {
    cllm_pipe_op ops[MAXK][2 * MAXM];
    double fdone[MAXK][MAXM], bdone[MAXK][MAXM], clock[MAXK];
    int next[MAXK];
    for (int s = 0; s < K; s++) {
        cllm_pipe_ops(sch, K, s, M, ops[s]);
        next[s] = 0;
        clock[s] = 0;
        for (int i = 0; i < M; i++) fdone[s][i] = bdone[s][i] = -1;
    }
    int remaining = 2 * M * K;
    while (remaining > 0) {
        int progressed = 0;
        for (int s = 0; s < K; s++) {
            while (next[s] < 2 * M) {
                cllm_pipe_op op = ops[s][next[s]];
                double ready;
                if (op.kind == CLLM_PIPE_FWD) {
                    ready = s == 0 ? 0 : fdone[s - 1][op.micro];
                } else {
                    if (fdone[s][op.micro] < 0) return -1; /* backward before its forward */
                    ready = s == K - 1 ? fdone[s][op.micro] : bdone[s + 1][op.micro];
                }
                if (ready < 0) break; /* waits on a neighbour */
                double start = clock[s] > ready ? clock[s] : ready;
                clock[s] = start + (op.kind == CLLM_PIPE_FWD ? f : b);
                (op.kind == CLLM_PIPE_FWD ? fdone : bdone)[s][op.micro] = clock[s];
                next[s]++;
                remaining--;
                progressed = 1;
            }
        }
        if (!progressed) return -1;
    }
    double t = 0;
    for (int s = 0; s < K; s++) t = clock[s] > t ? clock[s] : t;
    return t;
}


/* Progress check with rendezvous sends and bounded send buffers: a stage
 * sending micro-batch i's activation (or input gradient) through buffer
 * i % S must first see micro-batch i - S's message received, S being its
 * in-flight bound. Returns 1 when every stage finishes. */
static int rendezvous_ok(cllm_pipe_schedule sch, int K, int M) {
    cllm_pipe_op ops[MAXK][2 * MAXM];
    int next[MAXK], S[MAXK];
    /* done[s][kind][i]: stage s has run op (kind, i) */
    static char done[MAXK][2][MAXM];
    memset(done, 0, sizeof done);
    for (int s = 0; s < K; s++) {
        cllm_pipe_ops(sch, K, s, M, ops[s]);
        next[s] = 0;
        S[s] = cllm_pipe_max_in_flight(sch, K, s, M);
    }
    for (;;) {
        int progressed = 0, finished = 1;
        for (int s = 0; s < K; s++) {
            if (next[s] == 2 * M) continue;
            finished = 0;
            cllm_pipe_op op = ops[s][next[s]];
            int i = op.micro, ok = 1;
            if (op.kind == CLLM_PIPE_FWD) {
                if (s > 0 && !done[s - 1][0][i]) ok = 0;                          /* input not sent yet */
                if (s < K - 1 && i >= S[s] && !done[s + 1][0][i - S[s]]) ok = 0;   /* buffer still in flight */
            } else {
                if (s < K - 1 && !done[s + 1][1][i]) ok = 0;
                if (s > 0 && i >= S[s] && !done[s - 1][1][i - S[s]]) ok = 0;
            }
            if (!ok) continue;
            done[s][op.kind][i] = 1;
            next[s]++;
            progressed = 1;
        }
        if (finished) return 1;
        if (!progressed) return 0;
    }
}

int main(void) {
    for (int sch = 0; sch < 2; sch++)
        for (int K = 1; K <= MAXK; K++)
            for (int M = 1; M <= MAXM; M++) {
                const char *name = cllm_pipe_schedule_name((cllm_pipe_schedule)sch);
                for (int s = 0; s < K; s++) {
                    cllm_pipe_op ops[2 * MAXM];
                    cllm_pipe_ops((cllm_pipe_schedule)sch, K, s, M, ops);
                    int fwd[MAXM] = {0}, bwd[MAXM] = {0}, live = 0, peak = 0, order_ok = 1, last_b = -1;
                    for (int i = 0; i < 2 * M; i++) {
                        if (ops[i].kind == CLLM_PIPE_FWD) {
                            fwd[ops[i].micro]++;
                            live++;
                        } else {
                            if (!fwd[ops[i].micro]) order_ok = 0;
                            if (ops[i].micro != last_b + 1) order_ok = 0;
                            last_b = ops[i].micro;
                            bwd[ops[i].micro]++;
                            live--;
                        }
                        peak = live > peak ? live : peak;
                    }
                    int complete = 1;
                    for (int i = 0; i < M; i++) complete &= fwd[i] == 1 && bwd[i] == 1;
                    CHECK(complete && order_ok, "%s K=%d s=%d M=%d: each micro-batch once, backward after forward", name,
                          K, s, M);
                    int want = sch == CLLM_PIPE_GPIPE ? M : (K - s < M ? K - s : M);
                    CHECK(peak == want && cllm_pipe_max_in_flight((cllm_pipe_schedule)sch, K, s, M) == want,
                          "%s K=%d s=%d M=%d: %d in flight, expected %d", name, K, s, M, peak, want);
                }
                CHECK(rendezvous_ok((cllm_pipe_schedule)sch, K, M), "%s K=%d M=%d: deadlock with %s", name, K, M,
                      "rendezvous sends through in-flight-bounded buffers");
                for (int fb = 0; fb < 2; fb++) {
                    double f = 1.0, b = fb ? 2.0 : 1.0;
                    double t = simulate((cllm_pipe_schedule)sch, K, M, f, b);
                    CHECK(t == (M + K - 1) * (f + b), "%s K=%d M=%d f=%g b=%g: step time %g, theory %g", name, K, M, f,
                          b, t, (M + K - 1) * (f + b));
                }
            }
    cllm_pipe_schedule s;
    CHECK(cllm_pipe_schedule_parse("1f1b", &s) == CLLM_OK && s == CLLM_PIPE_1F1B, "parse 1f1b");
    CHECK(cllm_pipe_schedule_parse("gpipe", &s) == CLLM_OK && s == CLLM_PIPE_GPIPE, "parse gpipe");
    CHECK(cllm_pipe_schedule_parse("interleaved", &s) != CLLM_OK && strstr(cllm_last_error(), "interleaved"),
          "unknown schedule named");
    return check_summary();
}
