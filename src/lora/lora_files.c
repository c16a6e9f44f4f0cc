/*
 * PEFT adapter folders: adapter_config.json and adapter_model.safetensors
 * (cllm/lora.h). The tensors are the model's trainable views under their
 * PEFT names, so writing is one safetensors file of the trainable buffer
 * and reading fills it back.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/lora.h"
#include "lora_impl.h"

static const char *const bias_names[] = {"none", "all", "lora_only"};

static json_t *str_list(char *const *s, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_string(s[i]));
    return a;
}

static json_t *patterns(const cllm_lora_pattern *p, int n, bool integer) {
    json_t *o = json_object();
    for (int i = 0; o && i < n; i++)
        json_object_set_new(o, p[i].pattern, integer ? json_integer((json_int_t)p[i].value) : json_real(p[i].value));
    return o;
}

/* The resolved target names of "all-linear": the last path component of
 * every adapted module, once each, in model order (what PEFT writes). */
static json_t *adapted_names(const cllm_model *m) {
    json_t *a = json_array();
    const char *suffix = ".lora_A.weight";
    for (int i = 0; a && i < cllm_model_n_trainable(m); i++) {
        const char *n = cllm_model_trainable(m, i)->name;
        size_t ln = strlen(n), ls = strlen(suffix);
        if (ln <= ls || strcmp(n + ln - ls, suffix)) continue;
        const char *e = n + ln - ls, *b = e;
        while (b > n && b[-1] != '.') b--;
        char last[96];
        snprintf(last, sizeof last, "%.*s", (int)(e - b), b);
        bool seen = false;
        for (size_t k = 0; k < json_array_size(a); k++) seen |= !strcmp(json_string_value(json_array_get(a, k)), last);
        if (!seen) json_array_append_new(a, json_string(last));
    }
    return a;
}

json_t *cllm_lora_config_to_json(const cllm_lora_config *c) {
    json_t *j = json_object();
    if (!j) return NULL;
    const char *b = c->base_model_name_or_path;
    json_object_set_new(j, "alpha_pattern", patterns(c->alpha_pattern, c->n_alpha_pattern, false));
    json_object_set_new(j, "auto_mapping", json_null());
    json_object_set_new(j, "base_model_name_or_path", b ? json_string(b) : json_null());
    json_object_set_new(j, "bias", json_string(bias_names[c->bias]));
    json_object_set_new(j, "fan_in_fan_out", json_boolean(c->fan_in_fan_out));
    json_object_set_new(j, "inference_mode", json_true());
    json_object_set_new(j, "init_lora_weights", c->init == CLLM_LORA_INIT_GAUSSIAN ? json_string("gaussian")
                                                : json_boolean(c->init == CLLM_LORA_INIT_DEFAULT));
    json_object_set_new(j, "layers_pattern",
                        c->n_layers_pattern ? str_list(c->layers_pattern, c->n_layers_pattern) : json_null());
    json_t *lt = json_null();
    if (c->n_layers_to_transform) {
        lt = json_array();
        for (int i = 0; lt && i < c->n_layers_to_transform; i++)
            json_array_append_new(lt, json_integer(c->layers_to_transform[i]));
    }
    json_object_set_new(j, "layers_to_transform", lt);
    json_object_set_new(j, "lora_alpha", c->lora_alpha == floor(c->lora_alpha) ? json_integer((json_int_t)c->lora_alpha)
                                                                             : json_real(c->lora_alpha));
    json_object_set_new(j, "lora_dropout", json_real(c->lora_dropout));
    json_object_set_new(j, "modules_to_save",
                        c->n_modules_to_save ? str_list(c->modules_to_save, c->n_modules_to_save) : json_null());
    json_object_set_new(j, "peft_type", json_string("LORA"));
    json_object_set_new(j, "r", json_integer(c->r));
    json_object_set_new(j, "rank_pattern", patterns(c->rank_pattern, c->n_rank_pattern, true));
    json_object_set_new(j, "revision", json_null());
    json_t *tm = json_null();
    if (c->target_kind == CLLM_LORA_TARGET_LIST) tm = str_list(c->targets, c->n_targets);
    else if (c->target_kind == CLLM_LORA_TARGET_REGEX) tm = json_string(c->target_regex);
    else if (c->target_kind == CLLM_LORA_TARGET_ALL_LINEAR) tm = json_string("all-linear");
    json_object_set_new(j, "target_modules", tm);
    json_object_set_new(j, "task_type", json_string(c->seq_cls ? "SEQ_CLS" : "CAUSAL_LM"));
    json_object_set_new(j, "use_dora", json_false());
    json_object_set_new(j, "use_rslora", json_boolean(c->use_rslora));
    return j;
}

json_t *cllm_lora_config_json(const cllm_model *m, const char *base) {
    const cllm_lora_config *c = cllm_lora_config_of(m);
    if (!c) return NULL;
    const cllm_model_config *mc = cllm_model_get_config(m);
    json_t *j = cllm_lora_config_to_json(c);
    if (!j) return NULL;
    if (base) json_object_set_new(j, "base_model_name_or_path", json_string(base));
    /* PEFT sets it for Conv1D layers (and clears it for nn.Linear) whatever was asked */
    json_object_set_new(j, "fan_in_fan_out", json_boolean(mc->arch == CLLM_ARCH_GPT2));
    /* the targets as PEFT writes them: "all-linear" and the default resolved to names */
    if (c->target_kind == CLLM_LORA_TARGET_ALL_LINEAR) {
        json_object_set_new(j, "target_modules", adapted_names(m));
    } else if (c->target_kind == CLLM_LORA_TARGET_DEFAULT) {
        const char *const *d = cllm_lora_default_targets(mc->arch);
        json_t *tm = json_array();
        for (int i = 0; tm && d && d[i]; i++) json_array_append_new(tm, json_string(d[i]));
        json_object_set_new(j, "target_modules", tm);
    }
    return j;
}

cllm_status cllm_lora_save(const cllm_model *m, const char *dir, const char *base) {
    if (!cllm_lora_attached(m)) return CLLM_FAIL(CLLM_ERR_ARG, "no LoRA adapters to save");
    cllm_status st = cllm_make_dirs(dir);
    if (st) return st;
    int n = cllm_model_n_trainable(m);
    cllm_st_entry *e = calloc(n > 0 ? (size_t)n : 1, sizeof *e);
    if (!e) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    const float *tp = cllm_model_trainable_params((cllm_model *)m);
    for (int i = 0; i < n; i++) {
        const cllm_tensor_info *t = cllm_model_trainable(m, i);
        e[i] = (cllm_st_entry){.name = t->name, .dtype = CLLM_F32, .ndim = t->ndim, .data = tp + t->offset};
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st = cllm_st_save(path, e, n);
    free(e);
    if (st) return st;
    json_t *j = cllm_lora_config_json(m, base);
    if (!j) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    st = cllm_json_save_file(j, path);
    json_decref(j);
    return st;
}

/* A saved name may also carry PEFT's ".modules_to_save" (older files) or
 * the adapter name ".default" before the last component. */
static const cllm_st_tensor *find_saved(const cllm_st_file *f, const char *name) {
    const cllm_st_tensor *t = cllm_st_find(f, name);
    if (t) return t;
    const char *dot = strrchr(name, '.');
    if (!dot) return NULL;
    char alt[256];
    const char *extra[] = {".modules_to_save", ".default", ".modules_to_save.default"};
    for (int i = 0; i < 3 && !t; i++) {
        snprintf(alt, sizeof alt, "%.*s%s%s", (int)(dot - name), name, extra[i], dot);
        t = cllm_st_find(f, alt);
    }
    return t;
}

cllm_status cllm_lora_config_load(cllm_lora_config *c, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *j = NULL;
    cllm_status st = cllm_json_load_file(&j, path);
    if (st) return st;
    st = cllm_lora_config_parse(c, j, "adapter_config", path, true);
    json_decref(j);
    return st;
}

cllm_status cllm_lora_load(cllm_model *m, const char *dir) {
    char path[4096];
    cllm_lora_config c;
    cllm_lora_config_default(&c);
    cllm_status st = cllm_lora_config_load(&c, dir);
    if (!st && !c.seq_cls && cllm_model_get_config(m)->num_labels == 1)
        st = CLLM_FAIL(CLLM_ERR_ARG, "%s/adapter_config.json: task_type \"CAUSAL_LM\" on a reward model (a causal "
                       "LM's adapters have no score head; a reward model's say \"SEQ_CLS\")", dir);
    if (!st) st = cllm_lora_attach(m, &c, 0);
    cllm_lora_config_free(&c);
    if (st) return cllm_fail_context(st, "adapter %s", dir);
    cllm_st_file *f = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/model.safetensors", dir); /* a checkpoint */
    if ((st = cllm_st_open(&f, path))) return st;
    float *tp = cllm_model_trainable_params(m);
    int n = cllm_model_n_trainable(m), used = 0;
    for (int i = 0; i < n && !st; i++) {
        const cllm_tensor_info *ti = cllm_model_trainable(m, i);
        const cllm_st_tensor *t = find_saved(f, ti->name);
        if (!t) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no tensor %s (the adapter's config asks for it)", path, ti->name);
            break;
        }
        used++;
        bool shape_ok = t->ndim == ti->ndim && t->shape[0] == ti->shape[0] && (ti->ndim < 2 || t->shape[1] == ti->shape[1]);
        if (!shape_ok)
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s has shape [%lld, %lld], expected [%lld, %lld]", path, ti->name,
                           (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)ti->shape[0],
                           (long long)ti->shape[1]);
        else
            st = cllm_st_read_f32(t, tp + ti->offset, (int64_t)ti->numel);
    }
    if (!st && used != cllm_st_count(f))
        for (int k = 0; k < cllm_st_count(f) && !st; k++) {
            const char *name = cllm_st_at(f, k)->name;
            bool known = false;
            for (int i = 0; i < n && !known; i++) known = find_saved(f, cllm_model_trainable(m, i)->name) == cllm_st_at(f, k);
            /* a PPO run's value head beside its adapters: not needed without one */
            if (!known && !cllm_model_get_config(m)->value_head && strstr(name, "v_head.summary.")) continue;
            if (!known)
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: unexpected tensor %s (not an adapter of this model by its config)",
                               path, name);
        }
    cllm_st_close(f);
    if (!st) cllm_model_params_updated(m); /* trained copies into the model */
    return st;
}

cllm_status cllm_lora_load_model(cllm_model **pm, const char *dir, uint64_t seed) {
    cllm_lora_config c;
    cllm_lora_config_default(&c);
    cllm_status st = cllm_lora_config_load(&c, dir);
    const bool seq_cls = c.seq_cls;
    cllm_lora_config_free(&c);
    if (st) return cllm_fail_context(st, "adapter %s", dir);
    if (seq_cls && cllm_model_get_config(*pm)->num_labels != 1 && (st = cllm_model_to_reward(pm, seed)))
        return cllm_fail_context(st, "adapter %s (task_type \"SEQ_CLS\"): the base as a reward model", dir);
    return cllm_lora_load(*pm, dir);
}
