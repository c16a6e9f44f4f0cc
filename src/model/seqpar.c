/*
 * Sequence parallelism (Megatron's, Korthikanti et al. 2022) on a tensor
 * part: the switch and the two collectives of the sequence-parallel regions.
 *
 * Under tensor parallelism alone every rank holds the whole [B*T, C]
 * residual stream, norm outputs and statistics, identical on each rank.
 * With sequence parallelism rank r holds positions r*T/tp .. (r+1)*T/tp - 1
 * of every sequence of those (B*T/tp rows, sequence-major within each
 * sample). The passes (run.c, tp.c) then
 *   gather   (all-gather along the sequence) a norm's local output into the
 *            whole rows before a column-parallel linear reads them, and
 *            the output gradient of a row-parallel linear in the backward;
 *   scatter  (reduce-scatter along the sequence) the partial sums a
 *            row-parallel linear (or the vocabulary-parallel embedding, or
 *            the head's input gradient) leaves, where tensor parallelism
 *            alone all-reduces them.
 * The wire holds rank-major blocks: rank s's block is [B, T/tp, C]. With
 * B == 1 that is the [T, C] order itself and the whole buffer is used in
 * place; with B > 1 the rows are packed into (gathered from) sp_pack.
 */
#include <string.h>

#include "cllm/dist.h"
#include "model_impl.h"

cllm_status cllm_model_set_sequence_parallel(cllm_model *m, bool on) {
    if (on && m->tp_size <= 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence parallelism needs tensor parallelism (a tensor size > 1, "
                         "model_topo.process_topology axis \"tensor\")");
    if (on && m->cfg.n_experts)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "sequence parallelism of a mixture-of-experts model");
    if (on && !m->sp_counts) {
        m->sp_counts = calloc((size_t)m->tp_size, sizeof *m->sp_counts);
        if (!m->sp_counts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    m->sp = on;
    return CLLM_OK;
}

bool cllm_model_sequence_parallel(const cllm_model *m) { return m->sp && m->tp_size > 1; }

int model_sp_rows(const cllm_model *m, int B, int T) { return m->acts_sp ? B * (T / m->tp_size) : B * T; }

/* Packs the [B, T, C] rows into the wire's rank-major blocks [S][B, Ts, C]
 * (pack) or unpacks them back: dst and src are the two sides. */
static void move_blocks(float *dst, const float *src, int B, int T, int S, int C, bool pack) {
    const int Ts = T / S;
    const size_t blk = (size_t)Ts * C;
#pragma omp parallel for collapse(2) schedule(static)
    for (int s = 0; s < S; s++)
        for (int b = 0; b < B; b++) {
            size_t rows = ((size_t)b * T + (size_t)s * Ts) * C, wire = ((size_t)s * B + b) * blk;
            memcpy(dst + (pack ? wire : rows), src + (pack ? rows : wire), blk * sizeof(float));
        }
}

static size_t *counts(const cllm_model *m, size_t blk) {
    for (int s = 0; s < m->tp_size; s++) m->sp_counts[s] = blk;
    return m->sp_counts;
}

cllm_status model_sp_gather(const cllm_model *m, float *full, const float *local, int B, int T) {
    const int S = m->tp_size, C = m->cfg.n_embd;
    const size_t blk = (size_t)B * (T / S) * C;
    float *wire = B > 1 ? m->sp_pack : full;
    if (!wire) return CLLM_FAIL(CLLM_ERR_INTERNAL, "sequence parallelism: no pack buffer for %d sequences", B);
    memcpy(wire + (size_t)m->tp_rank * blk, local, blk * sizeof(float));
    cllm_status st = cllm_dist_g_allgather_f32(m->tp_grp, wire, counts(m, blk));
    if (st || B == 1) return st;
    move_blocks(full, wire, B, T, S, C, false);
    return CLLM_OK;
}

cllm_status model_sp_scatter(const cllm_model *m, float *local, const float *full, int B, int T) {
    const int S = m->tp_size, C = m->cfg.n_embd;
    const size_t blk = (size_t)B * (T / S) * C;
    const float *wire = full;
    if (B > 1) {
        if (!m->sp_pack) return CLLM_FAIL(CLLM_ERR_INTERNAL, "sequence parallelism: no pack buffer for %d sequences", B);
        move_blocks(m->sp_pack, full, B, T, S, C, true);
        wire = m->sp_pack;
    }
    return cllm_dist_g_reduce_scatter_sum_f32(m->tp_grp, wire, local, counts(m, blk));
}
