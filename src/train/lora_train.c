/*
 * LoRA in the training run: which runs have adapters, the layouts they
 * (and frozen tensors, "freeze") work with, and where the adapters of a
 * run come from (a checkpoint, an adapter folder to continue, or new ones
 * from the "lora" section).
 */
#include <jansson.h>
#include <stdio.h>

#include "cllm/checkpoint.h"
#include "cllm/json.h"
#include "cllm/lora.h"
#include "engine_impl.h"

bool train_lora_run(const cllm_train_config *c) { return c->lora.enabled || c->adapter_dir; }

/* A trainable set (a frozen LoRA base, frozen tensors) works with data
 * parallelism at every ZeRO stage (slices of the trainable buffer; the
 * frozen tensors stay whole on every rank) and with the optimizer state
 * offloaded; the other layouts shard or move the model's own flat buffer.
 * NULL: c's is fine. */
static const char *set_layout_conflict(const cllm_train_config *c, bool piped, bool tensor) {
    return piped ? "pipeline parallelism (model_topo pipe > 1)"
           : tensor ? "tensor parallelism (model_topo tensor > 1)"
           : c->zero.offload_param.device == CLLM_OFFLOAD_NVME ? "zero_optimization.offload_param (nvme)"
                                                               : NULL;
}

cllm_status train_lora_check_layout(const cllm_train_config *c, bool piped, bool tensor) {
    const char *what = set_layout_conflict(c, piped, tensor);
    if (!what) return CLLM_OK;
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "LoRA (a frozen base) with %s: not supported; use data parallelism with "
                     "zero_optimization.stage 0-3 (the adapters are sliced across ranks from stage 1; "
                     "offload_optimizer moves their optimizer state to a file)", what);
}

cllm_status train_freeze_check_layout(const cllm_train_config *c, bool piped, bool tensor) {
    const char *what = set_layout_conflict(c, piped, tensor);
    if (!what) return CLLM_OK;
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "freeze (frozen tensors) with %s: not supported; use data parallelism "
                     "with zero_optimization.stage 0-3", what);
}

/* A checkpoint's adapters: its adapter_config.json gives their structure,
 * its parameter files (either format) the values. */
static cllm_status from_checkpoint(cllm_model *m, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *j = NULL;
    cllm_lora_config lc;
    cllm_lora_config_default(&lc);
    cllm_status st = cllm_json_load_file(&j, path);
    if (!st) st = cllm_lora_config_parse(&lc, j, "adapter_config", path, true);
    json_decref(j);
    if (!st) st = cllm_lora_attach(m, &lc, 0);
    cllm_lora_config_free(&lc);
    if (!st)
        st = cllm_ckpt_read_range(dir, m, CLLM_CKPT_PARAMS, 0, cllm_model_trainable_len(m),
                                  cllm_model_trainable_params(m));
    if (!st) cllm_model_params_updated(m);
    return st ? cllm_fail_context(st, "resuming the adapters of %s", dir) : CLLM_OK;
}

cllm_status train_lora_attach(cllm_model *m, const cllm_train_config *c, const char *resume_dir) {
    if (resume_dir) return from_checkpoint(m, resume_dir);
    if (c->adapter_dir) return cllm_lora_load(m, c->adapter_dir);
    return cllm_lora_attach(m, &c->lora, c->seed);
}
