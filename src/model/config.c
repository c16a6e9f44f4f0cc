/*
 * HF config.json -> cllm_model_config for gpt2, llama and bloom, and the
 * presets `cllm init` starts from.
 *
 * The dimension keys each family cannot do without are required; keys that
 * HF's config classes give defaults keep those defaults. Settings that change
 * the math in ways cllm does not implement (rope_scaling, post-LayerNorm
 * residuals in BLOOM, non-tanh GELU in GPT-2...) are refused by name rather
 * than silently ignored.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "cllm/json.h"
#include "cllm/model.h"

static const char *arch_names[CLLM_ARCH_COUNT] = {"gpt2", "llama", "bloom"};

const char *cllm_arch_name(cllm_arch a) { return (a >= 0 && a < CLLM_ARCH_COUNT) ? arch_names[a] : NULL; }

cllm_arch cllm_arch_from_name(const char *name) {
    for (int i = 0; i < CLLM_ARCH_COUNT; i++)
        if (name && strcmp(name, arch_names[i]) == 0) return (cllm_arch)i;
    return CLLM_ARCH_COUNT;
}

/* Reads a required positive int key into *out (int range). */
static cllm_status req_pos(const json_t *j, const char *key, int *out, const char *path) {
    int64_t v;
    cllm_status st = cllm_json_get_int(j, key, &v, path);
    if (st) return st;
    if (v <= 0 || v > (1 << 28)) /* 4 * v (a default FFN width) must fit an int */
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key '%s' must be a positive integer of at most 2^28, got %lld", path, key,
                         (long long)v);
    *out = (int)v;
    return CLLM_OK;
}

/* Optional positive int key; a JSON null keeps the default. */
static cllm_status opt_pos(const json_t *j, const char *key, int *out, const char *path) {
    const json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return CLLM_OK;
    return req_pos(j, key, out, path);
}

static cllm_status opt_token_id(const json_t *j, const char *key, int *out, const char *path) {
    const json_t *v = json_object_get(j, key);
    *out = -1;
    if (!v || json_is_null(v)) return CLLM_OK;
    if (json_is_array(v)) v = json_array_get(v, 0); /* eos_token_id may be a list */
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key '%s' must be a token id", path, key);
    *out = (int)json_integer_value(v);
    return CLLM_OK;
}

/* eos_token_id as a list (opt_token_id has read the first into
 * cfg->eos_token_id): an int is a list of one, null or absent is none. */
static cllm_status eos_list(const json_t *j, cllm_model_config *cfg, const char *path) {
    const json_t *v = json_object_get(j, "eos_token_id");
    cfg->n_eos_token_ids = 0;
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_array(v)) {
        cfg->eos_token_ids[cfg->n_eos_token_ids++] = cfg->eos_token_id;
        return CLLM_OK;
    }
    if (json_array_size(v) > CLLM_MAX_EOS_IDS)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'eos_token_id' lists %zu ids; at most %d are supported", path,
                         json_array_size(v), CLLM_MAX_EOS_IDS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'eos_token_id' element %zu must be a token id", path, i);
        cfg->eos_token_ids[cfg->n_eos_token_ids++] = (int)json_integer_value(e);
    }
    return CLLM_OK;
}

static cllm_status opt_float(const json_t *j, const char *key, float *out, const char *path) {
    double d = *out;
    cllm_status st = cllm_json_get_num_opt(j, key, &d, path);
    if (st) return st;
    if (!(d > 0) || !isfinite(d))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key '%s' must be a positive number", path, key);
    *out = (float)d;
    return CLLM_OK;
}

/* Fails if `key` is present and is not one of the accepted values. */
static cllm_status expect_str(const json_t *j, const char *key, const char *const *ok, const char *path) {
    const char *s = NULL;
    cllm_status st = cllm_json_get_str_opt(j, key, &s, path);
    if (st || !s) return st;
    for (; *ok; ok++)
        if (strcmp(s, *ok) == 0) return CLLM_OK;
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: %s = \"%s\" is not supported", path, key, s);
}

/* transformers 5 writes RoPE's settings as "rope_parameters":
 * {"rope_theta": X, "rope_type": "default"} in place of the top-level
 * rope_theta of earlier versions; the object wins where both are present.
 * Any rope_type but "default" changes the frequencies (llama3, linear,
 * dynamic, yarn, ...), which cllm does not implement: refused by name. */
static const json_t *rope_parameters(const json_t *j) {
    const json_t *rp = json_object_get(j, "rope_parameters");
    return rp && !json_is_null(rp) ? rp : NULL;
}

static bool has_rope_theta(const json_t *j) {
    const json_t *rp = rope_parameters(j);
    return json_object_get(j, "rope_theta") || (rp && json_is_object(rp) && json_object_get(rp, "rope_theta"));
}

static cllm_status parse_rope_parameters(cllm_model_config *c, const json_t *j, const char *path) {
    const json_t *rp = rope_parameters(j);
    if (!rp) return CLLM_OK;
    if (!json_is_object(rp))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'rope_parameters' must be an object", path);
    const json_t *type = json_object_get(rp, "rope_type");
    if (!type) type = json_object_get(rp, "type");
    if (type && !json_is_null(type) && !(json_is_string(type) && strcmp(json_string_value(type), "default") == 0))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                         "%s: rope_parameters.rope_type = %s is not supported (only \"default\" RoPE is)", path,
                         json_is_string(type) ? json_string_value(type) : "(not a string)");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)rp, k, v) {
        if (strcmp(k, "rope_theta") && strcmp(k, "rope_type") && strcmp(k, "type"))
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: rope_parameters.%s is not supported", path, k);
    }
    const json_t *theta = json_object_get(rp, "rope_theta");
    if (!theta) return CLLM_OK;
    if (!json_is_number(theta) || !(json_number_value(theta) > 0) || !isfinite(json_number_value(theta)))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'rope_parameters.rope_theta' must be a positive number", path);
    c->rope_theta = (float)json_number_value(theta);
    return CLLM_OK;
}

static cllm_status expect_false(const json_t *j, const char *key, const char *path) {
    bool b = false;
    cllm_status st = cllm_json_get_bool_opt(j, key, &b, path);
    if (st) return st;
    if (b) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: %s = true is not supported", path, key);
    return CLLM_OK;
}

static cllm_status parse_gpt2(cllm_model_config *c, const json_t *j, const char *path) {
    static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    cllm_status st;
    if ((st = req_pos(j, "vocab_size", &c->vocab_size, path)) || (st = req_pos(j, "n_positions", &c->n_ctx, path)) ||
        (st = req_pos(j, "n_embd", &c->n_embd, path)) || (st = req_pos(j, "n_layer", &c->n_layer, path)) ||
        (st = req_pos(j, "n_head", &c->n_head, path)))
        return st;
    c->n_inner = 4 * c->n_embd;
    c->norm_eps = 1e-5f;
    c->tie_embeddings = true;
    if ((st = opt_pos(j, "n_inner", &c->n_inner, path)) || (st = opt_float(j, "layer_norm_epsilon", &c->norm_eps, path)) ||
        (st = expect_str(j, "activation_function", acts, path)) ||
        (st = expect_false(j, "scale_attn_by_inverse_layer_idx", path)) ||
        (st = expect_false(j, "reorder_and_upcast_attn", path)))
        return st;
    bool scale = true;
    if ((st = cllm_json_get_bool_opt(j, "scale_attn_weights", &scale, path))) return st;
    if (!scale) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: scale_attn_weights = false is not supported", path);
    if ((st = cllm_json_get_bool_opt(j, "tie_word_embeddings", &c->tie_embeddings, path))) return st;
    if (!c->tie_embeddings)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: gpt2 with tie_word_embeddings = false is not supported", path);
    c->attn_bias = c->mlp_bias = true;
    c->n_kv_head = c->n_head;
    if (c->n_embd % c->n_head)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: n_embd (%d) is not divisible by n_head (%d)", path, c->n_embd,
                         c->n_head);
    c->head_dim = c->n_embd / c->n_head;
    return CLLM_OK;
}

static cllm_status parse_llama(cllm_model_config *c, const json_t *j, const char *path) {
    static const char *const acts[] = {"silu", "swish", NULL};
    cllm_status st;
    if ((st = req_pos(j, "vocab_size", &c->vocab_size, path)) || (st = req_pos(j, "hidden_size", &c->n_embd, path)) ||
        (st = req_pos(j, "intermediate_size", &c->n_inner, path)) ||
        (st = req_pos(j, "num_hidden_layers", &c->n_layer, path)) ||
        (st = req_pos(j, "num_attention_heads", &c->n_head, path)))
        return st;
    c->n_kv_head = c->n_head;
    c->n_ctx = 2048;
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    if (c->n_embd % c->n_head)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: hidden_size (%d) is not divisible by num_attention_heads (%d)",
                         path, c->n_embd, c->n_head);
    c->head_dim = c->n_embd / c->n_head;
    if ((st = opt_pos(j, "num_key_value_heads", &c->n_kv_head, path)) ||
        (st = opt_pos(j, "max_position_embeddings", &c->n_ctx, path)) || (st = opt_pos(j, "head_dim", &c->head_dim, path)) ||
        (st = opt_float(j, "rms_norm_eps", &c->norm_eps, path)) || (st = opt_float(j, "rope_theta", &c->rope_theta, path)) ||
        (st = cllm_json_get_bool_opt(j, "attention_bias", &c->attn_bias, path)) ||
        (st = cllm_json_get_bool_opt(j, "mlp_bias", &c->mlp_bias, path)) ||
        (st = cllm_json_get_bool_opt(j, "tie_word_embeddings", &c->tie_embeddings, path)) ||
        (st = expect_str(j, "hidden_act", acts, path)))
        return st;
    const json_t *rs = json_object_get(j, "rope_scaling");
    if (rs && !json_is_null(rs))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: rope_scaling is not supported (remove it or set it to null)", path);
    if ((st = parse_rope_parameters(c, j, path))) return st;
    if (c->n_head % c->n_kv_head)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: num_attention_heads (%d) is not divisible by num_key_value_heads (%d)",
                         path, c->n_head, c->n_kv_head);
    if (c->head_dim % 2)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: head_dim (%d) must be even for rotary embeddings", path, c->head_dim);
    return CLLM_OK;
}

static cllm_status parse_bloom(cllm_model_config *c, const json_t *j, const char *path) {
    cllm_status st;
    const char *hidden_key = json_object_get(j, "hidden_size") ? "hidden_size" : "n_embed";
    const char *layer_key = json_object_get(j, "n_layer") ? "n_layer" : "num_hidden_layers";
    const char *head_key = json_object_get(j, "n_head") ? "n_head" : "num_attention_heads";
    if ((st = req_pos(j, "vocab_size", &c->vocab_size, path)) || (st = req_pos(j, hidden_key, &c->n_embd, path)) ||
        (st = req_pos(j, layer_key, &c->n_layer, path)) || (st = req_pos(j, head_key, &c->n_head, path)))
        return st;
    c->norm_eps = 1e-5f;
    c->tie_embeddings = true;
    if ((st = opt_float(j, "layer_norm_epsilon", &c->norm_eps, path)) ||
        (st = expect_false(j, "apply_residual_connection_post_layernorm", path)) ||
        (st = cllm_json_get_bool_opt(j, "tie_word_embeddings", &c->tie_embeddings, path)))
        return st;
    if (!c->tie_embeddings)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: bloom with tie_word_embeddings = false is not supported", path);
    if (c->n_embd % c->n_head)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: hidden_size (%d) is not divisible by n_head (%d)", path, c->n_embd,
                         c->n_head);
    c->n_kv_head = c->n_head;
    c->head_dim = c->n_embd / c->n_head;
    c->n_inner = 4 * c->n_embd;
    c->n_ctx = 0; /* ALiBi: no learned positions */
    c->attn_bias = c->mlp_bias = true;
    return CLLM_OK;
}

/* HF's *ForSequenceClassification (architectures[0]): num_labels is the
 * size of id2label, else the num_labels key, else HF's default of 2; a
 * reward model has exactly one. */
static cllm_status parse_labels(cllm_model_config *c, const json_t *j, const char *path) {
    const json_t *a = json_object_get(j, "architectures");
    const char *name = json_is_array(a) ? json_string_value(json_array_get(a, 0)) : NULL;
    const char *suffix = "ForSequenceClassification";
    size_t n = name ? strlen(name) : 0, k = strlen(suffix);
    if (!name || n < k || strcmp(name + n - k, suffix) != 0) return CLLM_OK;
    const json_t *ids = json_object_get(j, "id2label"), *nl = json_object_get(j, "num_labels");
    long labels = 2;
    const char *from = "HF's default when config.json has neither id2label nor num_labels";
    if (json_is_object(ids)) {
        labels = (long)json_object_size(ids);
        from = "the entries of id2label";
    } else if (nl) {
        if (!json_is_integer(nl))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: num_labels: expected an integer", path);
        labels = (long)json_integer_value(nl);
        from = "num_labels";
    }
    if (labels != 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: %s with %ld labels (%s): cllm's sequence-classification models "
                         "are reward models with one label (num_labels 1, a score head [1, hidden])", path, name,
                         labels, from);
    c->num_labels = 1;
    return CLLM_OK;
}

/* Mixtral: LLaMA's attention, norms and RoPE with MixtralConfig's
 * defaults, a sparse FFN of num_local_experts experts, and an optional
 * sliding attention window. HF's Mixtral layers have no biases. */
static cllm_status parse_mixtral(cllm_model_config *c, const json_t *j, const char *path) {
    cllm_status st = parse_llama(c, j, path);
    if (st) return st;
    if (!json_object_get(j, "max_position_embeddings")) c->n_ctx = 4096 * 32;
    if (!json_object_get(j, "rms_norm_eps")) c->norm_eps = 1e-5f;
    if (!has_rope_theta(j)) c->rope_theta = 1e6f;
    c->attn_bias = c->mlp_bias = false;
    c->n_experts = 8;
    c->n_experts_per_tok = 2;
    c->router_aux_coef = 0.001f;
    double coef = c->router_aux_coef, jitter = 0;
    if ((st = opt_pos(j, "num_local_experts", &c->n_experts, path)) ||
        (st = opt_pos(j, "num_experts_per_tok", &c->n_experts_per_tok, path)) ||
        (st = opt_pos(j, "sliding_window", &c->sliding_window, path)) ||
        (st = cllm_json_get_bool_opt(j, "output_router_logits", &c->router_aux, path)) ||
        (st = cllm_json_get_num_opt(j, "router_aux_loss_coef", &coef, path)) ||
        (st = cllm_json_get_num_opt(j, "router_jitter_noise", &jitter, path)))
        return st;
    if (!isfinite(coef) || coef < 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'router_aux_loss_coef' must be a number >= 0", path);
    c->router_aux_coef = (float)coef;
    if (jitter != 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: router_jitter_noise = %g is not supported (set it to 0)", path,
                         jitter);
    if (c->n_experts > 1024)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: num_local_experts %d exceeds the supported maximum of 1024", path,
                         c->n_experts);
    if (c->n_experts_per_tok > c->n_experts)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: num_experts_per_tok (%d) exceeds num_local_experts (%d)", path,
                         c->n_experts_per_tok, c->n_experts);
    return CLLM_OK;
}

cllm_status cllm_model_config_from_json(cllm_model_config *cfg, const json_t *j, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(j)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: config is not a JSON object", path);
    const char *mt = NULL;
    cllm_status st = cllm_json_get_str(j, "model_type", &mt, path);
    if (st) return st;
    cfg->arch = cllm_arch_from_name(mt);
    if (mt && !strcmp(mt, "mixtral")) {
        cfg->arch = CLLM_ARCH_LLAMA;
        st = parse_mixtral(cfg, j, path);
    } else switch (cfg->arch) {
    case CLLM_ARCH_GPT2: st = parse_gpt2(cfg, j, path); break;
    case CLLM_ARCH_LLAMA: st = parse_llama(cfg, j, path); break;
    case CLLM_ARCH_BLOOM: st = parse_bloom(cfg, j, path); break;
    default:
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: unknown model_type \"%s\" (supported: gpt2, llama, bloom, mixtral)", path,
                         mt);
    }
    if (st) return st;
    /* Sizes a model of this program can hold, far above any real model:
     * they keep every product of the layout (tensor counts, fused widths)
     * inside an int before any allocation is tried. */
    const struct {
        int v, max;
        const char *what, *keys;
    } lim[] = {{cfg->n_layer, 1 << 12, "layer count", "n_layer / num_hidden_layers"},
               {cfg->n_embd, 1 << 18, "hidden size", "n_embd / hidden_size"},
               {cfg->n_inner, 1 << 20, "FFN width", "n_inner / intermediate_size"},
               {cfg->n_head, 1 << 14, "attention head count", "n_head / num_attention_heads"},
               {cfg->n_kv_head, 1 << 14, "key/value head count", "num_key_value_heads"},
               {cfg->vocab_size, 1 << 26, "vocabulary size", "vocab_size"},
               {cfg->n_ctx, 1 << 24, "position limit", "n_positions / max_position_embeddings"}};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v > lim[i].max)
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: %s %d exceeds the supported maximum of %d (%s)", path,
                             lim[i].what, lim[i].v, lim[i].max, lim[i].keys);
    if (cfg->head_dim > 256)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: head size %d exceeds the supported maximum of 256", path,
                         cfg->head_dim);
    if ((st = opt_token_id(j, "bos_token_id", &cfg->bos_token_id, path)) ||
        (st = opt_token_id(j, "eos_token_id", &cfg->eos_token_id, path)) ||
        (st = opt_token_id(j, "pad_token_id", &cfg->pad_token_id, path)) || (st = eos_list(j, cfg, path)))
        return st;
    return parse_labels(cfg, j, path);
}

/* ------------------------------------------------------------ presets */

typedef struct {
    cllm_arch arch;
    const char *name;
    const char *json;
    const char *family; /* a family sharing arch's code ("mixtral"); NULL: the arch's own */
} preset;

/* Shapes of public models where the name says so; "tiny" ones are for tests
 * and the built-in demo. */
static const preset presets[] = {
    {CLLM_ARCH_GPT2, "tiny",
     "{\"vocab_size\":512,\"n_positions\":256,\"n_embd\":64,\"n_layer\":2,\"n_head\":4}", NULL},
    {CLLM_ARCH_GPT2, "gpt2-124M",
     "{\"vocab_size\":50257,\"n_positions\":1024,\"n_embd\":768,\"n_layer\":12,\"n_head\":12,"
     "\"bos_token_id\":50256,\"eos_token_id\":50256}", NULL},
    {CLLM_ARCH_GPT2, "gpt2-355M",
     "{\"vocab_size\":50257,\"n_positions\":1024,\"n_embd\":1024,\"n_layer\":24,\"n_head\":16,"
     "\"bos_token_id\":50256,\"eos_token_id\":50256}", NULL},
    {CLLM_ARCH_LLAMA, "tiny",
     "{\"vocab_size\":512,\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":2,"
     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"max_position_embeddings\":256}", NULL},
    {CLLM_ARCH_LLAMA, "small",
     "{\"vocab_size\":2048,\"hidden_size\":256,\"intermediate_size\":688,\"num_hidden_layers\":4,"
     "\"num_attention_heads\":8,\"num_key_value_heads\":4,\"max_position_embeddings\":1024}", NULL},
    {CLLM_ARCH_LLAMA, "llama-100M",
     "{\"vocab_size\":32000,\"hidden_size\":768,\"intermediate_size\":2048,\"num_hidden_layers\":12,"
     "\"num_attention_heads\":12,\"num_key_value_heads\":4,\"max_position_embeddings\":2048}", NULL},
    {CLLM_ARCH_BLOOM, "tiny", "{\"vocab_size\":512,\"hidden_size\":64,\"n_layer\":2,\"n_head\":4}", NULL},
    {CLLM_ARCH_BLOOM, "bloom-560m", "{\"vocab_size\":250880,\"hidden_size\":1024,\"n_layer\":24,\"n_head\":16}", NULL},
    {CLLM_ARCH_LLAMA, "tiny",
     "{\"vocab_size\":512,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"max_position_embeddings\":256,"
     "\"num_local_experts\":4,\"num_experts_per_tok\":2}", "mixtral"},
    /* llama-100M's shape with eight experts in place of its FFN */
    {CLLM_ARCH_LLAMA, "mixtral-8x100M",
     "{\"vocab_size\":32000,\"hidden_size\":768,\"intermediate_size\":2048,\"num_hidden_layers\":12,"
     "\"num_attention_heads\":12,\"num_key_value_heads\":4,\"max_position_embeddings\":2048,"
     "\"num_local_experts\":8,\"num_experts_per_tok\":2}", "mixtral"},
};

static const char *preset_family(const preset *p) { return p->family ? p->family : cllm_arch_name(p->arch); }

static const char *mixtral_defaults =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"hidden_act\":\"silu\","
    "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,\"sliding_window\":null,\"tie_word_embeddings\":false,"
    "\"initializer_range\":0.02,\"attention_dropout\":0.0,\"output_router_logits\":false,"
    "\"router_aux_loss_coef\":0.001,\"router_jitter_noise\":0.0,\"bos_token_id\":1,\"eos_token_id\":2,"
    "\"torch_dtype\":\"float32\"}";

/* Keys every preset of a family gets, so written configs are complete HF
 * configs that transformers loads as is. */
static const char *family_defaults(cllm_arch a) {
    switch (a) {
    case CLLM_ARCH_GPT2:
        return "{\"architectures\":[\"GPT2LMHeadModel\"],\"model_type\":\"gpt2\",\"n_inner\":null,"
               "\"activation_function\":\"gelu_new\",\"layer_norm_epsilon\":1e-05,\"initializer_range\":0.02,"
               "\"resid_pdrop\":0.0,\"embd_pdrop\":0.0,\"attn_pdrop\":0.0,\"scale_attn_weights\":true,"
               "\"tie_word_embeddings\":true,\"bos_token_id\":0,\"eos_token_id\":0,\"torch_dtype\":\"float32\"}";
    case CLLM_ARCH_LLAMA:
        return "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_act\":\"silu\","
               "\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,\"rope_scaling\":null,\"attention_bias\":false,"
               "\"mlp_bias\":false,\"tie_word_embeddings\":false,\"initializer_range\":0.02,"
               "\"attention_dropout\":0.0,\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"float32\"}";
    case CLLM_ARCH_BLOOM:
        return "{\"architectures\":[\"BloomForCausalLM\"],\"model_type\":\"bloom\",\"layer_norm_epsilon\":1e-05,"
               "\"initializer_range\":0.02,\"apply_residual_connection_post_layernorm\":false,"
               "\"hidden_dropout\":0.0,\"attention_dropout\":0.0,\"tie_word_embeddings\":true,"
               "\"bos_token_id\":1,\"eos_token_id\":2,\"pad_token_id\":3,\"torch_dtype\":\"float32\"}";
    default: return "{}";
    }
}

static const char *defaults_of(const char *family) {
    if (family && !strcmp(family, "mixtral")) return mixtral_defaults;
    return family_defaults(cllm_arch_from_name(family));
}

bool cllm_model_config_key_known(cllm_arch arch, const char *key) {
    return cllm_model_family_key_known(cllm_arch_name(arch), key);
}

bool cllm_model_family_key_known(const char *family, const char *key) {
    /* read by the parsers above but absent from the presets */
    static const char *const extra[CLLM_ARCH_COUNT][6] = {
        [CLLM_ARCH_GPT2] = {"n_embed", "pad_token_id", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx"},
        [CLLM_ARCH_LLAMA] = {"head_dim", "pad_token_id"},
        [CLLM_ARCH_BLOOM] = {"n_embed", "num_hidden_layers", "num_attention_heads"},
    };
    bool mixtral = family && !strcmp(family, "mixtral");
    cllm_arch arch = mixtral ? CLLM_ARCH_LLAMA : cllm_arch_from_name(family);
    if ((unsigned)arch >= CLLM_ARCH_COUNT || !key) return false;
    for (int i = 0; i < 6 && extra[arch][i]; i++)
        if (!strcmp(key, extra[arch][i])) return true;
    bool found = false;
    json_t *d = json_loads(defaults_of(family), 0, NULL);
    found = d && json_object_get(d, key);
    json_decref(d);
    for (size_t i = 0; !found && i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(preset_family(&presets[i]), family)) continue;
        json_t *j = json_loads(presets[i].json, 0, NULL);
        found = j && json_object_get(j, key);
        json_decref(j);
    }
    return found;
}

cllm_status cllm_model_preset(json_t **config, cllm_arch arch, const char *name) {
    return cllm_model_family_preset(config, cllm_arch_name(arch) ? cllm_arch_name(arch) : "?", name);
}

cllm_status cllm_model_family_preset(json_t **config, const char *family, const char *name) {
    *config = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(preset_family(&presets[i]), family) || strcmp(presets[i].name, name) != 0) continue;
        json_t *base = json_loads(defaults_of(family), 0, NULL);
        json_t *shape = json_loads(presets[i].json, 0, NULL);
        if (!base || !shape || json_object_update(base, shape)) {
            json_decref(base);
            json_decref(shape);
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot build preset %s", name);
        }
        json_decref(shape);
        *config = base;
        return CLLM_OK;
    }
    char known[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(preset_family(&presets[i]), family) && len + strlen(presets[i].name) + 3 < sizeof known)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "", presets[i].name);
    return CLLM_FAIL(CLLM_ERR_ARG, "unknown preset '%s' for %s (known: %s)", name, family, known);
}
