/*
 * cllm lora: low-rank adapters (LoRA) on the linear layers of a frozen
 * model, compatible with HF PEFT's LoraConfig, adapter files and math.
 *
 * An adapter on a linear layer y = W x + b adds (B A drop(x)) * scale:
 * A [r, in], B [out, r], scale = lora_alpha / r (lora_alpha / sqrt(r) with
 * use_rslora), dropout (lora_dropout) on the adapter's input only and only
 * in training passes. The layer's module path is its weight's HF name
 * without ".weight" ("model.layers.0.self_attn.q_proj"); GPT-2's Conv1D
 * layers (weights [in, out]) and BLOOM's fused query_key_value are single
 * modules, as in PEFT: one adapter on the whole fused projection.
 *
 * Attaching adapters (cllm_lora_attach) declares the model's trainable set
 * (cllm/model.h): A and B of every adapter, the trained copies of
 * modules_to_save and, with bias "all" / "lora_only", the biases; every
 * other tensor is frozen (no gradient, no optimizer state). The forward
 * and backward passes find an adapter through the linear layer they run,
 * so training, evaluation and generation all see it. Adapters compute in
 * fp32 whatever the model's matmul precision.
 *
 * On a reward model (num_labels 1, cllm_model_to_reward) the adapters are
 * PEFT's task_type "SEQ_CLS": the classifier head `score` trains in full
 * beside them (PEFT adds it to modules_to_save for that task; the name
 * "classifier" of PEFT's list, which these architectures lack, is
 * ignored), and the files say so.
 *
 * Files (a PEFT adapter folder, what save_pretrained writes):
 *   adapter_config.json        peft_type "LORA", task_type "CAUSAL_LM" or
 *                              "SEQ_CLS", base_model_name_or_path, r, ...
 *   adapter_model.safetensors  base_model.model.<module>.lora_A.weight [r, in]
 *                              base_model.model.<module>.lora_B.weight [out, r]
 *                              base_model.model.<module>.bias (bias all/lora_only)
 *                              base_model.model.<module>.weight (modules_to_save,
 *                              e.g. base_model.model.score.weight; PEFT drops
 *                              "modules_to_save.default" from the name)
 * docs/lora.md has the keys, flags and limits.
 */
#ifndef CLLM_LORA_H
#define CLLM_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_LORA_BIAS_NONE = 0, CLLM_LORA_BIAS_ALL, CLLM_LORA_BIAS_LORA_ONLY } cllm_lora_bias;
/* init_lora_weights: true (A kaiming-uniform(a = sqrt(5)), B zero),
 * "gaussian" (A normal(0, 1/r), B zero), false (A and B both as nn.Linear
 * initialises them: kaiming-uniform(a = sqrt(5)); the adapter starts
 * non-zero, for tests) */
typedef enum { CLLM_LORA_INIT_DEFAULT = 0, CLLM_LORA_INIT_GAUSSIAN, CLLM_LORA_INIT_RANDOM } cllm_lora_init;
/* target_modules: absent (PEFT's default for the architecture), a list of
 * names (a module matches when its path equals one or ends with "." + it),
 * a regular expression (the whole path must match), or "all-linear"
 * (every linear layer but the LM head) */
typedef enum {
    CLLM_LORA_TARGET_DEFAULT = 0,
    CLLM_LORA_TARGET_LIST,
    CLLM_LORA_TARGET_REGEX,
    CLLM_LORA_TARGET_ALL_LINEAR
} cllm_lora_target_kind;

/* rank_pattern / alpha_pattern entry: a module matching `pattern` (as a
 * regular expression against the end of its path, PEFT's rule) takes
 * `value` as its r or lora_alpha. */
typedef struct {
    char *pattern;
    double value;
} cllm_lora_pattern;

/* The "lora" section of a training config, or an adapter_config.json.
 * Strings and arrays are owned (cllm_lora_config_free). */
typedef struct {
    bool enabled;              /* the section (or a --lora-* flag) is present */
    int r;                     /* 8 */
    double lora_alpha;         /* 8 */
    double lora_dropout;       /* 0, in [0, 1) */
    cllm_lora_target_kind target_kind;
    char **targets;            /* LIST: n_targets names */
    int n_targets;
    char *target_regex;        /* REGEX */
    cllm_lora_bias bias;       /* "none" */
    char **modules_to_save;    /* names matched like a target list */
    int n_modules_to_save;
    bool use_rslora;
    bool fan_in_fan_out;       /* must agree with the layer type; GPT-2's Conv1D sets it (as PEFT warns and does) */
    int *layers_to_transform;  /* NULL: every layer */
    int n_layers_to_transform;
    char **layers_pattern;     /* the path component before the layer index; NULL: "layers", "h" */
    int n_layers_pattern;
    cllm_lora_pattern *rank_pattern, *alpha_pattern;
    int n_rank_pattern, n_alpha_pattern;
    cllm_lora_init init;
    char *base_model_name_or_path; /* adapter files: written as given, read as found */
    bool seq_cls;              /* task_type "SEQ_CLS" (else "CAUSAL_LM"): adapters on a reward model
                                * (*ForSequenceClassification, num_labels 1); set by attaching to one */
} cllm_lora_config;

/* PEFT's defaults (r 8, lora_alpha 8, no dropout, default targets...). */
void cllm_lora_config_default(cllm_lora_config *c);
void cllm_lora_config_free(cllm_lora_config *c); /* NULL and defaults are no-ops */
cllm_status cllm_lora_config_copy(cllm_lora_config *dst, const cllm_lora_config *src);

/* Parses LoraConfig keys from obj (a json_t object) into c (which must hold
 * defaults or earlier values). `where` is the object's key path in
 * messages ("lora"), `path` the file. Unknown keys are errors naming them.
 * With `peft_file` the other keys PEFT writes into adapter_config.json are
 * accepted too (peft_type must be "LORA"; options cllm cannot honour, such
 * as use_dora true, are refused naming the key). */
struct json_t;
cllm_status cllm_lora_config_parse(cllm_lora_config *c, const struct json_t *obj, const char *where, const char *path,
                                   bool peft_file);
/* Sets target_modules from a flag value: "all-linear", a comma-separated
 * list ("q_proj,v_proj"), or a regular expression when it holds any of
 * the characters .*+?[]()|^$\ . */
cllm_status cllm_lora_config_set_targets(cllm_lora_config *c, const char *flag);
/* PEFT's default target modules of an architecture ("c_attn" for GPT-2,
 * "q_proj", "v_proj" for LLaMA, "query_key_value" for BLOOM). */
const char *const *cllm_lora_default_targets(cllm_arch arch);

/* Attaches adapters by config c to model m: resolves the targets (a target
 * or modules_to_save name that matches no module is an error naming it),
 * declares the trainable set and initialises A and B from `seed`
 * (init_lora_weights). m must have no adapters yet. */
cllm_status cllm_lora_attach(cllm_model *m, const cllm_lora_config *c, uint64_t seed);
/* Whether m carries adapters, and their config (NULL without). */
bool cllm_lora_attached(const cllm_model *m);
const cllm_lora_config *cllm_lora_config_of(const cllm_model *m);
/* Adapters, trainable parameters (sum of numel) and the trainable
 * buffer's floats (alignment gaps included; may be NULL) the config would
 * give a model of config mc, without allocating it (cllm estimate). */
cllm_status cllm_lora_count(const cllm_model_config *mc, const cllm_lora_config *c, int *n_adapters,
                            size_t *n_trainable, size_t *buffer_len);

/* Loads a PEFT adapter folder (adapter_config.json and
 * adapter_model.safetensors, or a checkpoint's model.safetensors) onto m:
 * attach by its config, then every tensor of the file into the trainable
 * buffer. A missing, unexpected or mis-shaped tensor is an error naming
 * it; a file written for another architecture is refused by name, as are
 * a task_type "CAUSAL_LM" adapter on a reward model and a "SEQ_CLS" one on
 * a causal LM (cllm_lora_load_model converts the model first). */
cllm_status cllm_lora_load(cllm_model *m, const char *dir);
/* cllm_lora_load on *pm, first turning a causal LM into its reward model
 * (cllm_model_to_reward, the new score head from `seed`, then replaced by
 * the adapter's) when the adapter's task_type is "SEQ_CLS": what PEFT does
 * loading such an adapter onto AutoModelForSequenceClassification of the
 * base. *pm may be replaced. */
cllm_status cllm_lora_load_model(cllm_model **pm, const char *dir, uint64_t seed);
/* Writes adapter_config.json and adapter_model.safetensors (F32) into dir
 * (created if needed), atomically; base_model_name_or_path is `base` when
 * not NULL, else the config's. */
cllm_status cllm_lora_save(const cllm_model *m, const char *dir, const char *base);
/* A config as adapter_config.json keys (a new reference): target_modules
 * as given (null for the architecture's default). */
struct json_t *cllm_lora_config_to_json(const cllm_lora_config *c);
/* The adapter_config.json object of m's adapters (a new reference), with
 * "all-linear" and the default targets resolved to module names. */
struct json_t *cllm_lora_config_json(const cllm_model *m, const char *base);

/* Folds every adapter into its base weight (W += scale * B A, transposed
 * for Conv1D), the trained copies into the model's tensors, and drops the
 * adapters and the trainable set: PEFT's merge_and_unload. */
cllm_status cllm_lora_merge(cllm_model *m);

/* Reads and checks dir/adapter_config.json into c (which must hold
 * defaults): the config cllm_lora_load attaches by. */
cllm_status cllm_lora_config_load(cllm_lora_config *c, const char *dir);

/* ---- several adapters on one frozen base (serving) ----
 * A set holds adapters loaded from PEFT folders (cllm_lora_load's files and
 * checks) for one base model, each in a buffer of its own outside the
 * model: the base stays as loaded, whatever its weight format, and the
 * rows of one forward pass may each use a different adapter or none. A KV
 * cache given the set (cllm_kv_cache_set_adapters, cllm/generate.h) adds
 * to each row of a sequence, after the base product shared by all rows,
 * the delta of the adapter chosen for that sequence:
 *     y_row += scale_a * B_a (A_a x_row)
 * (rows of one adapter gathered into one pair of small GEMMs), so a batch
 * mixing adapters costs one base pass. Adapters may differ in rank, alpha,
 * rank/alpha patterns and targets. Refused when added, naming the folder
 * and key: bias other than "none" and modules_to_save (they replace base
 * tensors, which every row shares), a tensor-parallel part; a tensor whose
 * shape does not fit the base is named with its file. */
typedef struct cllm_lora_set cllm_lora_set;

/* An empty set over m (borrowed: it must outlive the set and carry no
 * adapters or trainable set). */
cllm_status cllm_lora_set_init(cllm_lora_set **out, cllm_model *m);
/* Loads the PEFT folder dir as adapter `name` (unique in the set). The
 * model is used to resolve targets and shapes and is left as it was. */
cllm_status cllm_lora_set_add(cllm_lora_set *s, const char *name, const char *dir);
void cllm_lora_set_free(cllm_lora_set *s); /* NULL: no-op */
int cllm_lora_set_count(const cllm_lora_set *s); /* 0 for NULL */
/* Adapter i's name, folder, config, adapted layers and parameters. */
const char *cllm_lora_set_name(const cllm_lora_set *s, int i);
const char *cllm_lora_set_dir(const cllm_lora_set *s, int i);
const cllm_lora_config *cllm_lora_set_config(const cllm_lora_set *s, int i);
int cllm_lora_set_layers(const cllm_lora_set *s, int i);
size_t cllm_lora_set_numel(const cllm_lora_set *s, int i);
/* The index of adapter `name`, or -1. */
int cllm_lora_set_find(const cllm_lora_set *s, const char *name);
/* The model's own passes (cllm_model_forward_backward_ex and the other
 * whole-batch forwards) add adapter i to every row until called with -1
 * (the base alone). For one thread: the caller's forwards on m. */
cllm_status cllm_lora_set_apply(cllm_lora_set *s, int i);

/* Dropout masks of training passes are a pure function of this key, the
 * layer and the element; the trainer sets it per micro-batch so that a
 * resumed run draws the same masks. */
void cllm_lora_set_dropout_key(cllm_model *m, uint64_t key);

/* Turns the adapters' low-rank products off (and on again): the passes then
 * run the frozen base, as PEFT's disable_adapter() does for lora_A/lora_B
 * (a PPO or DPO reference without a second model). Trained biases and
 * modules_to_save keep their trained values. A no-op without adapters. */
void cllm_lora_set_enabled(cllm_model *m, bool on);

#ifdef __cplusplus
}
#endif
#endif
