/*
 * cllm memory: per-rank memory estimate of a training run, and the cheapest
 * setup that fits a budget (behind `cllm estimate`; docs/memory.md).
 *
 * Buffers are fp32 except the low-precision parameter copy and operand
 * scratch of a bf16/fp16 run (cllm_model_precision_bytes). The activation terms come from the carving code of
 * cllm_model_prepare (cllm_model_activation_bytes), the parameter count from
 * the model's tensor layout, so an estimate follows the code that allocates.
 * ZeRO sharding follows DeepSpeed's stages with N = dp ranks: stage 1
 * shards the optimizer state, stage 2 also the gradients, stage 3 also the
 * parameters; a shard is ceil(buffer / N) floats. MPI's temporaries during a
 * gradient reduction are counted (mpi_buffers); the data set held by the
 * loader is not. With the optimizer state
 * offloaded to a file only its stream buffer counts (buffer_count x
 * min(buffer_size, shard) floats per state buffer), and checkpoints are
 * written synchronously (no snapshot).
 *
 * With pipe or tensor ranks the estimate follows what cllm holds: a
 * pipeline stage keeps the memory of its own range of the parameters and
 * gradients (plus the tied embedding on the last stage; the first stage
 * receives the whole parameters for the final save), touches
 * only its blocks' part of the activation buffer, and its optimizer state
 * follows its stage (the largest stage of the "parameters" split is
 * counted: the stage with the largest total), plus its stage inputs in flight (1F1B on stage 0: min(pipe,
 * micro-batches)) and send/receive buffers; a tensor rank holds its part
 * (heads, FFN width and vocabulary divided by tensor) for parameters,
 * gradients, optimizer state and activations, plus one copy of the whole
 * model's parameters kept for the final gather, and that gather's buffer
 * (tensor x its part). Only the pages a pipeline stage touches are counted
 * (its blocks' activations, its message buffers): allocated pages that are
 * never written do not become resident. At ZeRO 3 a pipeline stage
 * holds its slices of its range, its small tensors whole (persistence
 * below), its own groups' working buffers, the tied embedding whole on
 * the first and the last stage, and the whole model at start-up (first
 * stage: at the end) where that exceeds its optimizer state and working
 * buffers.
 *
 * oneDNN's GEMMs allocate packed copies of their operands during each call
 * (cllm_matmul_workspace: its size depends on the CPU's ISA, the thread
 * count and the shapes); the estimate adds the largest over the step's
 * GEMMs (every linear layer's forward and two backward GEMMs, and the
 * head's on a logits chunk), as gemm_work; a pipeline stage counts the
 * head's GEMMs only on the last stage.
 */
#ifndef CLLM_MEMORY_H
#define CLLM_MEMORY_H

#include <stdbool.h>
#include <stddef.h>

#include "cllm/core.h"
#include "cllm/model.h"
#include "cllm/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One training setup. */
typedef struct {
    int micro_batch;       /* samples per forward/backward */
    int grad_accum;        /* micro-batches per step (only the token arrays grow) */
    int seq_len;
    cllm_opt_type optimizer;
    bool sgd_momentum;     /* SGD keeps a momentum buffer */
    bool grad_ckpt;        /* activation checkpointing */
    int zero_stage;        /* 0..3 */
    int dp;                /* data-parallel ranks, >= 1 */
    bool async_save;       /* checkpoints snapshot params + optimizer state */
    bool offload_optimizer;/* optimizer state in a file (offload_optimizer nvme): not in RAM */
    bool offload_param;    /* ZeRO-3 parameter slice in a file (offload_param nvme): not in RAM */
    double persistence;    /* ZeRO-3 with a pipeline: tensors under this many elements stay whole on
                              every rank of their stage, with their gradient and optimizer state
                              (stage3_param_persistence_threshold; 0: none). Not counted without a
                              pipeline */
    long offload_buffer_count, offload_buffer_size; /* its stream: slots x floats per state */
    size_t reduce_bucket;  /* "reduce_bucket_size": floats per gradient reduction (0: DeepSpeed's
                              default, 5e8); bounds mpi_buffers below */
    cllm_precision precision; /* matmul precision (bf16/fp16 add a parameter copy and scratch) */
    size_t overhead;       /* fixed process memory (code, libraries, threads) */
    int pipe;              /* pipeline stages (0 or 1: none); 1F1B, parts by parameters */
    int tensor;            /* tensor-parallel ranks (0 or 1: none) */
    bool sequence_parallel;/* with tensor > 1: Megatron's sequence parallelism (sequence_parallel): the
                              residual stream, norms and their statistics of each block hold
                              seq_len / tensor positions, plus two shared [B*T, C] buffers (the
                              gathered norm output, and the rank-major packing when B > 1) and one
                              [B*T/tensor, C]; pipeline messages shrink to the local positions;
                              refused with seq_len not divisible */
    int threads;           /* OpenMP threads of the run (0: this process's omp_get_max_threads()) */
    size_t trainable;      /* > 0: a frozen base (LoRA) whose trainable buffer has this many floats
                              (cllm_lora_count): gradients, optimizer state and snapshots cover it
                              alone, the base stays whole on every rank; ZeRO 0-2 only */
    int lora_rank;         /* with trainable: the largest adapter rank (its per-layer scratch); 0: no
                              adapters (frozen tensors, cllm_model_config_freeze: trainable counts the
                              copies of the tensors that train) */
    int expert_parallel;   /* mixture of experts: expert-parallel ranks (0 or 1: none); divides dp and
                              the experts. At ZeRO 0-2 a rank's flat buffers keep the non-expert
                              tensors and E / expert_parallel experts of every block, ZeRO slicing them
                              over the dp / expert_parallel ranks holding the same experts (at stage 3
                              every expert, docs/moe.md); each rank adds the rows it receives for its
                              experts, kept for the backward */
    double capacity_factor;/* with expert_parallel: the training capacity factor (0: no limit, the
                              worst case of every rank routing every row to this rank's experts) */
    size_t quant_numel;    /* with trainable, > 0: a quantized base (QLoRA): parameters of the linear
                              layers held in quant_bytes instead of fp32 (cllm_model_config_quantized) */
    size_t quant_bytes;
    size_t quant_widest;   /* parameters of the largest quantized layer: its dequantized copy (work) */
    bool quant_compute16;  /* bnb_4bit_compute_dtype bfloat16 / float16 on a 4-bit base: two fp32 regions of
                              one layer's rounded operands (work) */
} cllm_mem_setup;

/* The estimate for one rank, in bytes. total is the sum of every line
 * except the breakdown in `act`. */
typedef struct {
    size_t n_params;    /* parameters of the model */
    size_t rank_params; /* parameters one rank holds: n_params, less the other ranks' experts under
                           expert parallelism at ZeRO 0-2 */
    size_t params;      /* parameter buffer (shard with ZeRO-3) */
    size_t grads;       /* gradient buffer (shard with ZeRO-2/3) */
    size_t optim;       /* optimizer state (shard with ZeRO-1/2/3); 0 when offloaded */
    size_t optim_disk;  /* offloaded optimizer state (on disk, not in total) */
    size_t params_disk; /* offloaded ZeRO-3 parameter slice (on disk, not in total) */
    size_t offload_buffer; /* the offload stream's buffer */
    size_t work;        /* ZeRO-2/3 working buffers: one group's gradient (first, last, largest block),
                           at stage 3 also gathered parameters (first, last, two blocks) */
    size_t activations; /* activation buffer without the logits chunk */
    size_t logits;      /* logits chunk of the fused head + cross-entropy */
    size_t snapshot;    /* checkpoint snapshot buffers (async_save) */
    size_t precision;   /* bf16/fp16 parameter copy (whole, any stage) and operand scratch */
    size_t pipe_buffers;/* pipeline: stage inputs in flight, send/receive buffers; tensor: the final gather */
    size_t active_params; /* mixture of experts: parameters one token runs through (k of E experts) */
    size_t expert_buffers; /* expert parallelism: received rows and expert activations of every block,
                              plus the exchange scratch (at the capacity bound) */
    size_t gemm_work;   /* oneDNN's packed GEMM operands: the largest cllm_matmul_workspace over the step's GEMMs */
    size_t mpi_buffers; /* with dp > 1: MPI's own temporaries during one gradient reduction of n floats
                           (n: one bucket, at most the reduced buffer; at ZeRO 2-3 the largest group):
                           Open MPI 4.1 raises each rank's peak by about 1.5 n floats for a
                           reduce-scatter (ZeRO 2-3) and 0.5 n for an all-reduce (ZeRO 0-1), measured */
    size_t other;       /* token, label and target arrays of a step */
    size_t overhead;    /* setup.overhead */
    size_t total;
    cllm_act_bytes act; /* the activation buffer, part by part */
} cllm_mem_estimate;

/* Fills `out` for a model of config c trained with setup s. gemm_work
 * depends on the CPU this runs on (the ISA oneDNN picks, see
 * cllm_matmul_workspace) and on s->threads. Fails with
 * CLLM_ERR_ARG on an impossible setup (non-positive sizes, stage > 3,
 * seq_len over the model's positions). */
cllm_status cllm_memory_estimate(const cllm_model_config *c, const cllm_mem_setup *s, cllm_mem_estimate *out);

/* Searches setups derived from `start` (ZeRO stage start..3 with start->dp
 * ranks, checkpointing off/on, micro-batch start, start/2, ... 1 with the
 * accumulation grown to keep the samples per step) for the cheapest one
 * whose total fits `budget` bytes. Cost: checkpointing is one extra forward
 * (x4/3 compute), each halving of the micro-batch x1.05 (smaller GEMMs),
 * ZeRO-3 x1.5 communication (stages 1 and 2 move as many bytes as plain
 * data parallelism and cost nothing); ties go to the smaller total.
 * Returns true and fills *best / *est when one fits, false otherwise. */
bool cllm_memory_suggest(const cllm_model_config *c, const cllm_mem_setup *start, size_t budget, cllm_mem_setup *best,
                         cllm_mem_estimate *est);

#ifdef __cplusplus
}
#endif
#endif
