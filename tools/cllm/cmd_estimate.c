/*
 * cllm estimate: per-rank memory of a training run (parameters, gradients,
 * optimizer state, activations, logits chunk, other buffers) from a model
 * folder or a preset, and with --memory the cheapest setup that fits. The
 * numbers come from cllm/memory.h, which sizes activations with the same
 * code cllm_model_prepare allocates with; docs/memory.md has the formulas
 * and a validation against measured peak RSS.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/lora.h"
#include "cllm/memory.h"
#include "cllm/model.h"
#include "commands.h"
#include "quant_flags.h"

/* Measured peak RSS of `cllm train` on a 2-layer 64-wide model (libraries,
 * OpenMP and oneDNN state, stacks); see docs/memory.md. */
#define DEFAULT_OVERHEAD "17MB"

/* The HF config of --model DIR, or of --arch/--preset with --set applied. */
static int load_config(json_t **out, const char *model, const char *arch_name, const char *preset, const arg_list *sets) {
    *out = NULL;
    if (model) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model);
        if (cllm_json_load_file(out, path)) return tool_fail("estimate");
    } else {
        if (!arch_name) {
            fprintf(stderr, "cllm estimate: give --model DIR or --arch A [--preset P]\n");
            return 2;
        }
        if (cllm_arch_from_name(arch_name) == CLLM_ARCH_COUNT && strcmp(arch_name, "mixtral")) {
            fprintf(stderr, "cllm estimate: --arch: unknown family '%s' (gpt2, llama, bloom, mixtral)\n", arch_name);
            return 2;
        }
        if (cllm_model_family_preset(out, arch_name, preset)) {
            fprintf(stderr, "cllm estimate: --preset: %s\n", cllm_last_error());
            return 2;
        }
    }
    for (int i = 0; i < sets->n; i++) {
        const char *kv = sets->items[i], *eq = strchr(kv, '=');
        if (!eq || eq == kv || (size_t)(eq - kv) >= 128) {
            fprintf(stderr, "cllm estimate: --set '%s': expected key=value\n", kv);
            return 2;
        }
        char key[128];
        memcpy(key, kv, (size_t)(eq - kv));
        key[eq - kv] = '\0';
        json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
        if (!v) v = json_string(eq + 1);
        json_object_set_new(*out, key, v);
    }
    return 0;
}

static void row(const char *name, size_t bytes, size_t total, const char *note) {
    printf("  %-22s %12.1f MB %6.1f%%  %s\n", name, (double)bytes / 1e6, total ? 100.0 * (double)bytes / (double)total : 0.0,
           note);
}

static void print_setup(const cllm_mem_setup *s) {
    printf("micro-batch %d x seq-len %d (accumulation %d), %s, grad-ckpt %s, ZeRO stage %d over %d rank%s%s%s",
           s->micro_batch, s->seq_len, s->grad_accum, cllm_opt_name(s->optimizer), s->grad_ckpt ? "on" : "off",
           s->zero_stage, s->dp, s->dp == 1 ? "" : "s", s->async_save ? ", async checkpoint snapshots" : "",
           s->offload_optimizer ? ", optimizer state offloaded" : "");
    if (s->pipe > 1) printf(", %d pipeline stages", s->pipe);
    if (s->tensor > 1) printf(", %d tensor ranks%s", s->tensor, s->sequence_parallel ? " with sequence parallelism" : "");
    if (s->expert_parallel > 1)
        printf(", %d expert-parallel ranks (each holding 1/%d of the experts at ZeRO 0-2)", s->expert_parallel,
               s->expert_parallel);
    printf("\n");
}

static void print_table(const cllm_mem_estimate *e) {
    char act[160];
    snprintf(act, sizeof act, "block inputs %.1f MB + saved %.1f MB + head %.1f MB + backward %.1f MB",
             (double)e->act.block_inputs / 1e6, (double)e->act.block_saved / 1e6, (double)e->act.head / 1e6,
             (double)e->act.backward / 1e6);
    printf("  %-22s %15s %7s\n", "per rank", "bytes", "share");
    row("parameters", e->params, e->total, e->params_disk ? "slice in a file (offload_param)" : "");
    row("gradients", e->grads, e->total, "");
    row("optimizer state", e->optim, e->total, e->optim_disk ? "offloaded: see below" : "");
    if (e->optim_disk) row("offload buffer", e->offload_buffer, e->total, "stream of the offloaded state");
    row("ZeRO working buffers", e->work, e->total, "stages 2-3: one group's gradient; stage 3 gathered groups");
    row("activations", e->activations, e->total, act);
    row("logits chunk", e->logits, e->total, "");
    row("checkpoint snapshot", e->snapshot, e->total, "");
    row("other buffers", e->other, e->total, "token, label and target arrays");
    if (e->pipe_buffers)
        row("parallel buffers", e->pipe_buffers, e->total, "pipeline messages and inputs in flight; tensor gather");
    if (e->expert_buffers)
        row("expert-parallel rows", e->expert_buffers, e->total, "rows received for this rank's experts, all blocks");
    row("GEMM workspace", e->gemm_work, e->total, "oneDNN's packed operands, largest GEMM (this CPU's ISA)");
    if (e->mpi_buffers)
        row("MPI reduction buffers", e->mpi_buffers, e->total, "MPI's temporaries, one gradient bucket (--dp > 1)");
    if (e->precision) row("low-precision copy", e->precision, e->total, "bf16/fp16 weights and matmul operand scratch");
    row("process overhead", e->overhead, e->total, "libraries, threads (--overhead)");
    row("total", e->total, e->total, "");
    if (e->optim_disk) printf("  %-22s %12.1f MB on disk under nvme_path (not in the total)\n", "offloaded state",
                              (double)e->optim_disk / 1e6);
}

/* The alignment task's models beside the one trained (docs/alignment.md),
 * all fp32 and forward only: a reference (dpo, ppo; none with LoRA, whose
 * reference is the base without adapters, or reference-free DPO), PPO's
 * reward model (a forward over a whole rollout batch) and its rollout
 * buffers (the batch's per-token arrays, one sequence's key/value cache
 * and logits); at ZeRO 3, the whole fp32 copy of the policy's parameters
 * that sampling gathers (train_shard_lend_params), value head included. */
typedef struct {
    size_t ref, reward, rollouts, sampling;
} side_bytes;

static size_t forward_model(const cllm_model_config *c, int rows, int T) {
    size_t n = 0, len = 0;
    cllm_act_bytes a;
    if (cllm_model_config_params(c, &n, &len)) return 0;
    cllm_model_activation_bytes(c, rows, T, false, false, &a);
    return len * sizeof(float) + a.total;
}

static int side_models(const char *task, const cllm_model_config *cfg, const char *ref_dir, const char *rm_dir,
                       bool lora, int stage, int B, int T, int R, side_bytes *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(task, "lm") || !strcmp(task, "reward")) return 0;
    if (strcmp(task, "dpo") && strcmp(task, "ppo")) {
        fprintf(stderr, "cllm estimate: --task: expected lm, dpo, reward or ppo, got '%s'\n", task);
        return 2;
    }
    const bool ppo = !strcmp(task, "ppo");
    const char *dirs[2] = {ref_dir, rm_dir};
    cllm_model_config c[2] = {*cfg, *cfg};
    c[0].value_head = c[1].value_head = false;
    for (int i = 0; i < 2; i++) {
        json_t *j = NULL;
        if (!dirs[i]) continue;
        int rc = load_config(&j, dirs[i], NULL, NULL, &(arg_list){0});
        if (!rc && cllm_model_config_from_json(&c[i], j, dirs[i])) rc = tool_fail("estimate");
        json_decref(j);
        if (rc) return rc;
    }
    c[1].num_labels = 1; /* a reward model: the score head instead of the LM head */
    if (ref_dir || !lora) out->ref = forward_model(&c[0], ppo ? B : 2 * B, T);
    if (!ppo) return 0;
    out->reward = forward_model(&c[1], R, T);
    size_t kv = (size_t)c[0].n_kv_head * (size_t)c[0].head_dim;
    out->rollouts = (size_t)R * T * (2 * sizeof(int32_t) + 5 * sizeof(float)) +
                    (2 * (size_t)cfg->n_layer * (size_t)T * kv + (size_t)cfg->vocab_size) * sizeof(float);
    size_t n = 0, len = 0;
    if (stage == 3 && !cllm_model_config_params(cfg, &n, &len)) out->sampling = len * sizeof(float);
    return 0;
}

static json_t *to_json(const cllm_mem_estimate *e) {
    return json_pack("{sIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsIsI}", "precision", (json_int_t)e->precision, "n_params",
                     (json_int_t)e->n_params, "params", (json_int_t)e->params,
                     "grads", (json_int_t)e->grads, "optim", (json_int_t)e->optim, "work", (json_int_t)e->work,
                     "activations",
                     (json_int_t)e->activations, "logits", (json_int_t)e->logits, "snapshot", (json_int_t)e->snapshot,
                     "other", (json_int_t)e->other, "overhead", (json_int_t)e->overhead, "total",
                     (json_int_t)e->total, "block_inputs", (json_int_t)e->act.block_inputs, "block_saved",
                     (json_int_t)e->act.block_saved, "block_set", (json_int_t)e->act.block_set, "optim_disk",
                     (json_int_t)e->optim_disk, "offload_buffer", (json_int_t)e->offload_buffer, "pipe_buffers",
                     (json_int_t)e->pipe_buffers, "params_disk", (json_int_t)e->params_disk, "gemm_work",
                     (json_int_t)e->gemm_work, "mpi_buffers", (json_int_t)e->mpi_buffers);
}

/* Mixture of experts: the active parameters and the expert-parallel rows. */
static void add_moe_json(json_t *j, const cllm_mem_estimate *e) {
    json_object_set_new(j, "active_params", json_integer((json_int_t)e->active_params));
    json_object_set_new(j, "expert_buffers", json_integer((json_int_t)e->expert_buffers));
    json_object_set_new(j, "rank_params", json_integer((json_int_t)e->rank_params));
}

int cmd_estimate(int argc, char **argv) {
    const char *model, *arch_name, *preset, *opt_name, *precision, *overhead_s, *memory_s, *lora_target, *task,
        *ref_dir, *rm_dir;
    int B, T, accum, stage, dp, off_count, off_size, pipe, tensor, threads, lora_r, ppo_batch, ep;
    double capacity, persistence, bucket;
    bool grad_ckpt = false, momentum = false, async_save = false, as_json = false, offload = false, offload_p = false;
    bool seq_par = false;
    arg_list sets, freeze = {0}, unfrozen = {0};
    quant_flags qf = {0};
    arg_spec specs[] = {
        {"model", ARG_STR, &model, NULL, false, "HF model folder (its config.json is read)"},
        {"arch", ARG_STR, &arch_name, NULL, false, "model family without --model: gpt2, llama, bloom or mixtral"},
        {"preset", ARG_STR, &preset, "tiny", false, "shape preset of --arch (as cllm init)"},
        {"set", ARG_LIST, &sets, NULL, false, "override config keys: key=value (as cllm init)"},
        {"freeze", ARG_LIST, &freeze, NULL, false,
         "regular expressions of tensor names to freeze (as the training config's \"freeze\"): no gradient or "
         "optimizer state for them"},
        {"unfrozen-parameters", ARG_LIST, &unfrozen, NULL, false,
         "the inverse of --freeze (as the training config's \"unfrozen_parameters\"): the tensors that train"},
        {"micro-batch", ARG_INT, &B, "8", false, "samples per forward/backward"},
        {"seq-len", ARG_INT, &T, "128", false, "tokens per sample"},
        {"grad-accum", ARG_INT, &accum, "1", false, "micro-batches per step"},
        {"optimizer", ARG_STR, &opt_name, "adamw", false, "adamw, adam, sgd or lion"},
        {"sgd-momentum", ARG_FLAG, &momentum, NULL, false, "SGD with momentum (one state buffer)"},
        {"grad-ckpt", ARG_FLAG, &grad_ckpt, NULL, false, "activation checkpointing"},
        {"zero-stage", ARG_INT, &stage, "0", false, "ZeRO stage 0..3 (shards optimizer state / gradients / parameters)"},
        {"dp", ARG_INT, &dp, "1", false, "data-parallel ranks"},
        {"pipe", ARG_INT, &pipe, "1", false, "pipeline stages (model_topo pipe axis)"},
        {"tensor", ARG_INT, &tensor, "1", false, "tensor-parallel ranks (model_topo tensor axis)"},
        {"sequence-parallel", ARG_FLAG, &seq_par, NULL, false,
         "with --tensor: sequence parallelism (sequence_parallel), norms and residuals split along the sequence"},
        {"expert-parallel", ARG_INT, &ep, "1", false, "expert-parallel ranks (moe.expert_parallel_size; divides --dp)"},
        {"capacity-factor", ARG_F64, &capacity, "0", false,
         "with --expert-parallel: moe.capacity_factor (0: no token dropped, the worst-case rows)"},
        {"precision", ARG_STR, &precision, "fp32", false, "matmul precision: fp32, bf16 or fp16 (bf16.enabled / fp16.enabled)"},
        {"offload-optimizer", ARG_FLAG, &offload, NULL, false,
         "optimizer state offloaded to a file (offload_optimizer device nvme)"},
        {"persistence-threshold", ARG_F64, &persistence, "100000", false,
         "ZeRO stage 3 with --pipe: tensors with fewer elements stay whole on every rank of their stage "
         "(zero_optimization.stage3_param_persistence_threshold)"},
        {"reduce-bucket-size", ARG_F64, &bucket, "5e8", false,
         "with --dp > 1: floats per gradient reduction (zero_optimization.reduce_bucket_size), which bounds MPI's "
         "temporaries"},
        {"offload-param", ARG_FLAG, &offload_p, NULL, false,
         "ZeRO-3 parameter slice in a file (offload_param device nvme)"},
        {"offload-buffer-count", ARG_INT, &off_count, "4", false, "offload stream buffers (buffer_count, >= 3)"},
        {"offload-buffer-size", ARG_INT, &off_size, "1048576", false, "floats per state per buffer (buffer_size)"},
        {"async-save", ARG_FLAG, &async_save, NULL, false, "count the snapshot buffers of asynchronous checkpoints"},
        {"threads", ARG_INT, &threads, "0", false,
         "OpenMP threads of the run, for the GEMM workspace (0: OMP_NUM_THREADS / all cores, as cllm train)"},
        {"overhead", ARG_STR, &overhead_s, DEFAULT_OVERHEAD, false, "fixed process memory to add"},
        {"memory", ARG_STR, &memory_s, NULL, false, "budget per rank (e.g. 16GB): suggest the cheapest setup that fits"},
        {"lora-r", ARG_INT, &lora_r, "0", false, "LoRA rank: a frozen base with rank-r adapters (0 = full training)"},
        {"lora-target", ARG_STR, &lora_target, NULL, false,
         "LoRA target modules (q_proj,v_proj, a regular expression or all-linear; default: PEFT's per architecture)"},
        QUANT_FLAG_SPECS(qf),
        {"json", ARG_FLAG, &as_json, NULL, false, "print the estimate as JSON (bytes)"},
        {"task", ARG_STR, &task, "lm", false,
         "lm, reward, dpo or ppo: dpo and ppo add the reference model, ppo the reward model, value head, rollouts and "
         "(--zero-stage 3) the whole parameters gathered for sampling"},
        {"ref-model", ARG_STR, &ref_dir, NULL, false, "dpo, ppo: the reference's folder (default: the model's shape; "
         "none with --lora-r, whose reference is the base without adapters)"},
        {"reward-model", ARG_STR, &rm_dir, NULL, false, "ppo: the reward model's folder (default: the model's shape)"},
        {"ppo-batch", ARG_INT, &ppo_batch, "0", false, "ppo: rollouts per PPO batch per rank (ppo.batch_size; 0: --micro-batch)"},
    };
    int rc = args_parse("estimate", "Estimates the per-rank memory of a training run.", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    json_t *config = NULL;
    cllm_model_config cfg;
    cllm_mem_setup s = {.micro_batch = B, .grad_accum = accum, .seq_len = T, .grad_ckpt = grad_ckpt,
                        .sgd_momentum = momentum, .zero_stage = stage, .dp = dp, .async_save = async_save,
                        .offload_optimizer = offload, .offload_buffer_count = off_count,
                        .offload_buffer_size = off_size, .pipe = pipe, .tensor = tensor, .sequence_parallel = seq_par,
                        .offload_param = offload_p, .persistence = persistence, .threads = threads, .expert_parallel = ep,
                        .capacity_factor = capacity};
    size_t budget = 0;
    if (!(bucket >= 1 && bucket <= 1e15)) {
        fprintf(stderr, "cllm estimate: --reduce-bucket-size must be a count of at least 1, got %g\n", bucket);
        rc = 2;
        goto done;
    }
    s.reduce_bucket = (size_t)bucket;
    if (!cllm_precision_from_name(precision, &s.precision)) {
        fprintf(stderr, "cllm estimate: --precision must be fp32, bf16 or fp16, got '%s'\n", precision);
        rc = 2;
        goto done;
    }
    s.optimizer = cllm_opt_from_name(opt_name);
    if (s.optimizer == CLLM_OPT_COUNT) {
        fprintf(stderr, "cllm estimate: --optimizer: unknown optimizer '%s' (adamw, adam, sgd, lion)\n", opt_name);
        rc = 2;
        goto done;
    }
    if (cllm_parse_size(overhead_s, &s.overhead) || (memory_s && cllm_parse_size(memory_s, &budget))) {
        fprintf(stderr, "cllm estimate: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    if ((rc = load_config(&config, model, arch_name, preset, &sets))) goto done;
    if (cllm_model_config_from_json(&cfg, config, model ? model : "preset")) {
        rc = tool_fail("estimate");
        goto done;
    }
    /* task "reward" trains the reward model: a causal LM's LM head becomes the score head (and with LoRA,
     * trains in full beside the adapters) */
    if (!strcmp(task, "reward")) cfg.num_labels = 1;
    if (lora_r < 0 || (lora_target && lora_r == 0)) {
        fprintf(stderr, "cllm estimate: --lora-r must be positive (--lora-target needs it)\n");
        rc = 2;
        goto done;
    }
    size_t lora_numel = 0;
    int lora_n = 0;
    if (lora_r > 0) {
        cllm_lora_config lc;
        cllm_lora_config_default(&lc);
        lc.r = lora_r;
        cllm_status lst = lora_target ? cllm_lora_config_set_targets(&lc, lora_target) : CLLM_OK;
        if (!lst) lst = cllm_lora_count(&cfg, &lc, &lora_n, &lora_numel, &s.trainable);
        cllm_lora_config_free(&lc);
        if (lst) {
            fprintf(stderr, "cllm estimate: %s\n", cllm_last_error());
            rc = 2;
            goto done;
        }
        s.lora_rank = lora_r;
    }
    size_t freeze_numel = 0;
    const bool except = unfrozen.n > 0;
    const arg_list *fl = except ? &unfrozen : &freeze;
    if (fl->n > 0) {
        cllm_status fst = lora_r > 0 || (except && freeze.n > 0)
                              ? CLLM_FAIL(CLLM_ERR_ARG, "--freeze / --unfrozen-parameters: one of them, and not with "
                                          "--lora-r (the adapters' base is frozen whole)")
                              : cllm_model_config_freeze(config, fl->items, fl->n, except, &s.trainable, &freeze_numel);
        if (fst) {
            fprintf(stderr, "cllm estimate: %s\n", cllm_last_error());
            rc = 2;
            goto done;
        }
    }
    side_bytes side;
    if (!strcmp(task, "ppo")) cfg.value_head = true; /* v_head.summary: C + 1 trained parameters */
    if ((rc = side_models(task, &cfg, ref_dir, rm_dir, lora_r > 0, stage, B * accum, T,
                          ppo_batch > 0 ? ppo_batch : B * accum, &side)))
        goto done;
    const size_t side_total = side.ref + side.reward + side.rollouts + side.sampling;
    s.overhead += side_total;
    cllm_bnb_config qc;
    cllm_bnb_config_default(&qc);
    if (quant_flags_any(&qf)) { /* QLoRA: the base's linear layers quantized */
        json_t *qo = json_object();
        quant_flags_to_json(&qf, qo);
        cllm_status qst = lora_r > 0 ? cllm_bnb_config_parse(&qc, qo, "quantization", "flags")
                                     : CLLM_FAIL(CLLM_ERR_ARG, "a quantized base (--load-in-4bit / --load-in-8bit) "
                                                 "trains only with LoRA adapters: give --lora-r");
        json_decref(qo);
        if (!qst) qst = cllm_model_config_quantized(&cfg, &qc, &s.quant_numel, &s.quant_bytes, &s.quant_widest);
        s.quant_compute16 = !qc.load_in_8bit && qc.compute != CLLM_BNB_COMPUTE_FP32;
        cllm_bnb_config_free(&qc);
        if (qst) {
            fprintf(stderr, "cllm estimate: %s\n", cllm_last_error());
            rc = 2;
            goto done;
        }
    }
    cllm_mem_estimate e;
    if (cllm_memory_estimate(&cfg, &s, &e)) {
        fprintf(stderr, "cllm estimate: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    e.overhead -= side_total;
    cllm_mem_setup best;
    cllm_mem_estimate be;
    bool fits = memory_s && cllm_memory_suggest(&cfg, &s, budget, &best, &be);
    if (as_json) {
        json_t *j = to_json(&e);
        json_object_set_new(j, "reference_model", json_integer((json_int_t)side.ref));
        json_object_set_new(j, "reward_model", json_integer((json_int_t)side.reward));
        json_object_set_new(j, "rollouts", json_integer((json_int_t)side.rollouts));
        json_object_set_new(j, "sampling_params", json_integer((json_int_t)side.sampling));
        if (cfg.n_experts) add_moe_json(j, &e);
        if (s.quant_numel) { /* a quantized base: its layers' parameters and stored bytes */
            json_object_set_new(j, "quantized_params", json_integer((json_int_t)s.quant_numel));
            json_object_set_new(j, "quantized_bytes", json_integer((json_int_t)s.quant_bytes));
        }
        if (fl->n > 0) json_object_set_new(j, "trainable_params", json_integer((json_int_t)freeze_numel));
        if (memory_s) json_object_set_new(j, "fits", json_boolean(e.total <= budget));
        if (fits)
            json_object_set_new(j, "suggest",
                                json_pack("{sisisisbsisI}", "micro_batch", best.micro_batch, "grad_accum", best.grad_accum,
                                          "seq_len", best.seq_len, "grad_ckpt", best.grad_ckpt, "zero_stage",
                                          best.zero_stage, "total", (json_int_t)be.total));
        char *out = json_dumps(j, JSON_COMPACT);
        if (out) printf("%s\n", out);
        free(out);
        json_decref(j);
        goto done;
    }
    printf("%s, %zu parameters (%d layers, hidden %d, vocab %d), %s matmuls, fp32 master weights\n",
           cfg.n_experts ? "mixtral" : cllm_arch_name(cfg.arch), e.n_params, cfg.n_layer, cfg.n_embd, cfg.vocab_size, cllm_precision_name(s.precision));
    if (cfg.n_experts)
        printf("%d experts per block, %d per token: %zu active parameters per token (%.1f%%)\n", cfg.n_experts,
               cfg.n_experts_per_tok, e.active_params, 100.0 * (double)e.active_params / (double)e.n_params);
    if (cfg.n_experts && e.rank_params != e.n_params)
        printf("expert parallelism %d: %zu parameters on each rank (%d of %d experts per block), their gradients and "
               "optimizer state likewise\n", s.expert_parallel, e.rank_params, cfg.n_experts / s.expert_parallel,
               cfg.n_experts);
    if (fl->n > 0)
        printf("freeze: %zu trainable parameters (%.3f%%), copied beside the frozen model; the frozen tensors have no "
               "gradient or optimizer state\n", freeze_numel, 100.0 * (double)freeze_numel / (double)e.n_params);
    if (lora_r > 0)
        printf("LoRA r=%d: %d adapted layers, %zu trainable parameters (%.3f%%); the base is frozen (no gradient or "
               "optimizer state)\n", lora_r, lora_n, lora_numel, 100.0 * (double)lora_numel / (double)e.n_params);
    if (s.quant_numel)
        printf("QLoRA base: %zu parameters of its linear layers in %s%s: %.1f MB instead of %.1f MB fp32\n",
               s.quant_numel, cllm_bnb_type_name(cllm_bnb_config_type(&qc)),
               qc.double_quant && !qc.load_in_8bit ? " with double quantization" : "", (double)s.quant_bytes / 1e6,
               (double)s.quant_numel * 4.0 / 1e6);
    print_setup(&s);
    print_table(&e);
    if (side.ref || side.reward)
        printf("  of which %s: reference model %.1f MB, reward model %.1f MB, rollout buffers %.1f MB (fp32, forward "
               "only)\n", task, (double)side.ref / 1e6, (double)side.reward / 1e6, (double)side.rollouts / 1e6);
    if (side.sampling)
        printf("  and the whole parameters gathered at ZeRO 3 while sampling: %.1f MB (fp32)\n",
               (double)side.sampling / 1e6);
    if (memory_s) {
        if (e.total <= budget) {
            printf("fits in %.1f MB as given\n", (double)budget / 1e6);
        } else if (fits) {
            printf("\ndoes not fit in %.1f MB; cheapest setup that fits:\n", (double)budget / 1e6);
            print_setup(&best);
            print_table(&be);
        } else {
            printf("\nno setup fits in %.1f MB (tried ZeRO stages up to 3 over %d ranks, grad-ckpt, micro-batch down "
                   "to 1); add ranks with --dp or shorten --seq-len\n",
                   (double)budget / 1e6, s.dp);
            rc = 1;
        }
    }
done:
    json_decref(config);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
