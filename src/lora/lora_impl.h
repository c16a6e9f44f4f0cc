/*
 * Private parts of the LoRA module shared by the config reader
 * (src/lora/lora_config.c), the files (src/lora/lora_files.c) and the
 * adapters on the model (src/model/lora.c).
 */
#ifndef CLLM_LORA_IMPL_H
#define CLLM_LORA_IMPL_H

#include "cllm/lora.h"

/* A compiled regular expression: a whole-string match, or (suffix) PEFT's
 * pattern rule: the string ends with the pattern at a "." or its start. */
typedef struct {
    void *code, *md;
} lora_regex;
cllm_status lora_regex_compile(lora_regex *re, const char *pattern, bool suffix);
bool lora_regex_match(const lora_regex *re, const char *s);
void lora_regex_free(lora_regex *re);

/* PEFT's list rule: module equals name or ends with "." + name. */
bool lora_name_matches(const char *module, const char *name);
/* The rank, alpha and scale of the adapter on `module` (rank_pattern,
 * alpha_pattern, use_rslora). */
void lora_module_rank(const cllm_lora_config *c, const char *module, int *r, double *alpha, float *scale);
/* The block index in a module path (layers_pattern), or -1. */
int lora_module_layer(const cllm_lora_config *c, const char *module);

/* Appends `name` to c's modules_to_save unless listed already. */
cllm_status lora_config_add_saved(cllm_lora_config *c, const char *name);
/* The module of a reward model's classifier head (PEFT's SEQ_CLS
 * modules_to_save holds it and "classifier", which these models lack). */
#define LORA_SCORE_MODULE "score"

/* The PEFT name prefix of every adapter tensor. */
#define LORA_PREFIX "base_model.model."

#endif
