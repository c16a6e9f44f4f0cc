/*
 * Request bodies of the TGI and OpenAI routes, read into one srv_gen and
 * validated with the rules (and, for TGI, the messages) of the API they
 * come from. Unknown fields are errors naming the field: a misspelt
 * parameter never silently falls back to its default.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve_impl.h"

int srv_errf(srv_err *e, int status, const char *fmt, ...) {
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return status;
}

/* A seed for requests that sample without one. */
static uint64_t random_seed(void) {
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ ((uint64_t)getpid() << 16) ^
                 __atomic_add_fetch(&counter, 0x9e3779b97f4a7c15ULL, __ATOMIC_RELAXED);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return x & ((1ULL << 53) - 1); /* exact in JSON numbers */
}

/* ---- typed field access: 0 = ok or absent, else an error status ---- */

static bool is_null_or_absent(const json_t *v) { return !v || json_is_null(v); }

static int get_num(const json_t *o, const char *k, double *out, bool *given, srv_err *e, int bad) {
    const json_t *v = json_object_get(o, k);
    if (given) *given = false;
    if (is_null_or_absent(v)) return 0;
    if (!json_is_number(v)) return srv_errf(e, bad, "`%s` must be a number", k);
    *out = json_number_value(v);
    if (given) *given = true;
    return 0;
}

static int get_int(const json_t *o, const char *k, long long *out, bool *given, srv_err *e, int bad) {
    const json_t *v = json_object_get(o, k);
    if (given) *given = false;
    if (is_null_or_absent(v)) return 0;
    if (json_is_integer(v)) *out = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        *out = (long long)json_real_value(v);
    else return srv_errf(e, bad, "`%s` must be an integer", k);
    if (given) *given = true;
    return 0;
}

static int get_bool(const json_t *o, const char *k, bool *out, srv_err *e, int bad) {
    const json_t *v = json_object_get(o, k);
    if (is_null_or_absent(v)) return 0;
    if (!json_is_boolean(v)) return srv_errf(e, bad, "`%s` must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

static int check_keys(const json_t *o, const char *const *known, srv_err *e, int bad, bool openai) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(k, known[i]) == 0;
        if (!ok)
            return openai ? srv_errf(e, bad, "Unrecognized request argument supplied: %s", k)
                          : srv_errf(e, bad, "unknown parameter `%s`", k);
    }
    return 0;
}

/* stop: a string or a list of strings. */
static int get_stops(const json_t *o, srv_gen *g, int max, srv_err *e, int bad) {
    const json_t *v = json_object_get(o, "stop");
    if (is_null_or_absent(v)) return 0;
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
    if (n == (size_t)-1) return srv_errf(e, bad, "`stop` must be a string or a list of strings");
    if (n > (size_t)max)
        return srv_errf(e, bad, "`stop` supports up to %d stop sequences. Given: %zu", max, n);
    g->stops = calloc(n ? n : 1, sizeof *g->stops);
    if (!g->stops) return srv_errf(e, 500, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s)) return srv_errf(e, bad, "`stop` must be a string or a list of strings");
        if (json_string_length(s) == 0) return srv_errf(e, bad, "`stop` sequences must not be empty");
        g->stops[g->n_stop] = strndup(json_string_value(s), json_string_length(s));
        if (!g->stops[g->n_stop]) return srv_errf(e, 500, "out of memory");
        g->n_stop++;
    }
    g->gp.stop = (const char *const *)g->stops;
    g->gp.n_stop = g->n_stop;
    return 0;
}

int srv_tokenize_prompt(cllm_server *s, srv_gen *g, const char *text, size_t len, bool add_special, int truncate,
                        srv_err *e, bool openai) {
    int bad = openai ? 400 : 422;
    cllm_token_buf b = {0};
    if (cllm_tokenizer_encode(s->tok, text, len, add_special, &b)) {
        cllm_token_buf_free(&b);
        return srv_errf(e, 500, "tokenization failed: %s", cllm_last_error());
    }
    if (truncate > 0 && b.n > (size_t)truncate) {
        memmove(b.ids, b.ids + (b.n - (size_t)truncate), (size_t)truncate * sizeof *b.ids);
        b.n = (size_t)truncate;
    }
    g->ids = b.ids;
    g->n_ids = b.n;
    g->prompt_text = strndup(text, len);
    if (!g->prompt_text) return srv_errf(e, 500, "out of memory");
    if (b.n == 0) return srv_errf(e, bad, "`inputs` cannot be empty");
    if (b.n > (size_t)s->p.max_input_tokens)
        return srv_errf(e, bad, "`inputs` tokens must be at most %d. Given: %zu", s->p.max_input_tokens, b.n);
    return 0;
}

/* max_new_tokens against the total limit; default = min(dflt, room). */
static int settle_max_new(cllm_server *s, srv_gen *g, long long max_new, bool given, long long dflt, srv_err *e,
                          int bad, const char *name) {
    long long room = (long long)s->p.max_total_tokens - (long long)g->n_ids;
    if (!given) {
        max_new = dflt > 0 && dflt < room ? dflt : room;
        if (max_new < 1) max_new = 1;
    }
    if (max_new + (long long)g->n_ids > s->p.max_total_tokens)
        return srv_errf(e, bad,
                        "`inputs` tokens + `%s` must be <= %d. Given: %zu `inputs` tokens and %lld `%s`", name,
                        s->p.max_total_tokens, g->n_ids, max_new, name);
    g->gp.max_new_tokens = (int)max_new;
    return 0;
}

/* The adapter a request names (TGI parameters.adapter_id, OpenAI model):
 * none or the base's id is the base; another name must be an adapter
 * (TGI: 422; OpenAI: 404 model_not_found, when the server has adapters;
 * without, OpenAI's model is only a label, as in TGI's OpenAI routes). */
static int pick_adapter(cllm_server *s, const json_t *v, srv_gen *g, srv_err *e, bool openai) {
    const char *key = openai ? "model" : "adapter_id";
    g->adapter = 0;
    if (is_null_or_absent(v)) return 0;
    if (!json_is_string(v)) return srv_errf(e, openai ? 400 : 422, "`%s` must be a string", key);
    const char *name = json_string_value(v);
    int n = cllm_lora_set_count(s->p.adapters);
    if (openai && !n) return 0;
    int i = srv_adapter_find(s, name);
    if (i >= 0) {
        g->adapter = i;
        return 0;
    }
    char list[256] = "";
    size_t k = 0;
    for (int a = 0; a < n && k + 1 < sizeof list; a++) {
        int w = snprintf(list + k, sizeof list - k, "%s'%s'", a ? ", " : "", cllm_lora_set_name(s->p.adapters, a));
        k += w > 0 ? (size_t)w : 0;
    }
    if (openai) {
        e->code = "model_not_found";
        return srv_errf(e, 404, "The model `%.200s` does not exist. This server has the base model '%s' and the "
                        "adapters %s.", name, s->model_id, n ? list : "(none)");
    }
    return srv_errf(e, 422, "`adapter_id`: no adapter '%.200s' on this server (%s%s; '%s' or none for the base "
                    "model)", name, n ? "adapters: " : "it has no adapters", n ? list : "", s->model_id);
}

/* ------------------------------------------------------------------ TGI */

int srv_parse_tgi(cllm_server *s, const json_t *body, srv_gen *g, srv_err *e) {
    static const char *const top_keys[] = {"inputs", "parameters", "stream", "model", NULL}; /* model: ignored */
    static const char *const par_keys[] = {
        "best_of", "decoder_input_details", "details", "do_sample", "frequency_penalty", "grammar",
        "max_new_tokens", "repetition_penalty", "return_full_text", "seed", "stop", "temperature", "top_k",
        "top_n_tokens", "top_p", "truncate", "typical_p", "watermark", "adapter_id", NULL};
    memset(g, 0, sizeof *g);
    g->n = 1;
    g->gp = cllm_generate_params_default();
    if (!json_is_object(body)) return srv_errf(e, 422, "the request body must be a JSON object");
    int rc = check_keys(body, top_keys, e, 422, false);
    if (rc) return rc;
    const json_t *in = json_object_get(body, "inputs");
    if (!json_is_string(in)) return srv_errf(e, 422, "`inputs` must be a string");
    const json_t *par = json_object_get(body, "parameters");
    json_t *empty = NULL;
    if (is_null_or_absent(par)) par = empty = json_object();
    else if (!json_is_object(par)) return srv_errf(e, 422, "`parameters` must be an object");
    if ((rc = get_bool(body, "stream", &g->stream, e, 422))) goto out;
    if ((rc = check_keys(par, par_keys, e, 422, false))) goto out;

    double temp = 1, top_p = 1, typ = 1, rep = 1, freq = 0;
    long long top_k = 0, max_new = 0, truncate = 0, seed = 0, best_of = 1, top_n = 0;
    bool t_given, p_given, ty_given, k_given, mn_given, tr_given, seed_given, do_sample = false, watermark = false;
    if ((rc = get_num(par, "temperature", &temp, &t_given, e, 422)) || (rc = get_num(par, "top_p", &top_p, &p_given, e, 422)) ||
        (rc = get_num(par, "typical_p", &typ, &ty_given, e, 422)) ||
        (rc = get_num(par, "repetition_penalty", &rep, NULL, e, 422)) ||
        (rc = get_num(par, "frequency_penalty", &freq, NULL, e, 422)) ||
        (rc = get_int(par, "top_k", &top_k, &k_given, e, 422)) ||
        (rc = get_int(par, "max_new_tokens", &max_new, &mn_given, e, 422)) ||
        (rc = get_int(par, "truncate", &truncate, &tr_given, e, 422)) ||
        (rc = get_int(par, "seed", &seed, &seed_given, e, 422)) || (rc = get_int(par, "best_of", &best_of, NULL, e, 422)) ||
        (rc = get_int(par, "top_n_tokens", &top_n, NULL, e, 422)) || (rc = get_bool(par, "do_sample", &do_sample, e, 422)) ||
        (rc = get_bool(par, "watermark", &watermark, e, 422)) || (rc = get_bool(par, "details", &g->details, e, 422)) ||
        (rc = get_bool(par, "decoder_input_details", &g->prompt_logprobs, e, 422)) ||
        (rc = get_bool(par, "return_full_text", &g->full_text, e, 422)))
        goto out;
    if (t_given && !(temp > 0)) rc = srv_errf(e, 422, "`temperature` must be strictly positive");
    else if (!(rep > 0)) rc = srv_errf(e, 422, "`repetition_penalty` must be strictly positive");
    else if (!(freq >= -2 && freq <= 2)) rc = srv_errf(e, 422, "`frequency_penalty` must be >= -2.0 and <= 2.0");
    else if (p_given && !(top_p > 0 && top_p < 1)) rc = srv_errf(e, 422, "`top_p` must be > 0.0 and < 1.0");
    else if (ty_given && !(typ > 0 && typ < 1)) rc = srv_errf(e, 422, "`typical_p` must be > 0.0 and < 1.0");
    else if (k_given && top_k <= 0) rc = srv_errf(e, 422, "`top_k` must be strictly positive");
    else if (k_given && top_k > s->vocab) rc = srv_errf(e, 422, "`top_k` must be at most the vocabulary size %d", s->vocab);
    else if (mn_given && max_new <= 0) rc = srv_errf(e, 422, "`max_new_tokens` must be strictly positive");
    else if (tr_given && (truncate <= 0 || truncate > s->p.max_input_tokens))
        rc = srv_errf(e, 422, "`truncate` must be strictly positive and less than %d. Given: %lld",
                      s->p.max_input_tokens + 1, truncate);
    else if (seed_given && seed < 0) rc = srv_errf(e, 422, "`seed` must be a non-negative integer");
    else if (best_of != 1) rc = srv_errf(e, 422, "`best_of` other than 1 is not supported");
    else if (top_n < 0 || top_n > s->p.max_top_n_tokens)
        rc = srv_errf(e, 422, "`top_n_tokens` must be >= 0 and <= %d. Given: %lld", s->p.max_top_n_tokens, top_n);
    else if (watermark) rc = srv_errf(e, 422, "`watermark` is not supported");
    else if (!is_null_or_absent(json_object_get(par, "grammar"))) rc = srv_errf(e, 422, "`grammar` is not supported");
    if (!rc) rc = pick_adapter(s, json_object_get(par, "adapter_id"), g, e, false);
    if (rc) goto out;
    if ((rc = get_stops(par, g, s->p.max_stop_sequences, e, 422))) goto out;
    if (json_string_length(in) == 0) {
        rc = srv_errf(e, 422, "`inputs` cannot be empty");
        goto out;
    }
    if ((rc = srv_tokenize_prompt(s, g, json_string_value(in), json_string_length(in), true, (int)truncate, e, false)))
        goto out;
    if ((rc = settle_max_new(s, g, max_new, mn_given, 100, e, 422, "max_new_tokens"))) goto out;

    g->sampling = do_sample || (t_given && temp != 1) || k_given || p_given || ty_given;
    cllm_sample_params *sp = &g->gp.sample;
    sp->greedy = !g->sampling;
    sp->temperature = t_given ? (float)temp : 1.0f;
    sp->top_k = (int)top_k;
    sp->top_p = (float)top_p;
    sp->typical_p = (float)typ;
    sp->repetition_penalty = (float)rep;
    sp->frequency_penalty = (float)freq;
    g->seed_given = seed_given;
    g->gp.seed = seed_given ? (uint64_t)seed : random_seed();
    g->top_n = (int)top_n;
    g->gp.top_n = g->top_n;
out:
    json_decref(empty);
    return rc;
}

/* --------------------------------------------------------------- OpenAI */

static int get_logit_bias(cllm_server *s, const json_t *o, srv_gen *g, srv_err *e) {
    const json_t *v = json_object_get(o, "logit_bias");
    if (is_null_or_absent(v)) return 0;
    if (!json_is_object(v)) return srv_errf(e, 400, "`logit_bias` must be an object of token id -> bias");
    size_t n = json_object_size(v);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    float *vals = malloc((n ? n : 1) * sizeof *vals);
    g->gp.sample.bias_ids = ids;
    g->gp.sample.bias_values = vals;
    if (!ids || !vals) return srv_errf(e, 500, "out of memory");
    const char *k;
    json_t *x;
    size_t i = 0;
    json_object_foreach((json_t *)v, k, x) {
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!*k || *end || errno || id < 0 || id >= s->vocab)
            return srv_errf(e, 400, "`logit_bias`: '%s' is not a token id in [0, %d)", k, s->vocab);
        if (!json_is_number(x) || !(json_number_value(x) >= -100 && json_number_value(x) <= 100))
            return srv_errf(e, 400, "`logit_bias`: the bias of token %ld must be a number in [-100, 100]", id);
        ids[i] = (int32_t)id;
        vals[i] = (float)json_number_value(x);
        i++;
    }
    g->gp.sample.n_bias = i;
    return 0;
}

/* The prompt of a completion: a string, a list of one string, a list of
 * token ids, or a list of one such list. */
static int completion_prompt(cllm_server *s, const json_t *p, srv_gen *g, srv_err *e) {
    if (json_is_array(p) && json_array_size(p) == 1 && (json_is_string(json_array_get(p, 0)) ||
                                                         json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return srv_errf(e, 400, "`prompt` must not be empty");
        return srv_tokenize_prompt(s, g, json_string_value(p), json_string_length(p), true, 0, e, true);
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return srv_errf(e, 400, "`prompt` must be a non-empty string, a list of token ids, or a list of one of these");
    size_t n = json_array_size(p);
    if (n > (size_t)s->p.max_input_tokens)
        return srv_errf(e, 400, "`prompt` has %zu tokens; the limit is %d", n, s->p.max_input_tokens);
    g->ids = malloc(n * sizeof *g->ids);
    if (!g->ids) return srv_errf(e, 500, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(p, i);
        if (!json_is_integer(x))
            return srv_errf(e, 400, "`prompt` holds more than one prompt or a non-integer token; one prompt per "
                                    "request (use `n` for several completions)");
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= s->vocab)
            return srv_errf(e, 400, "`prompt`[%zu]: token id %lld is outside the vocabulary [0, %d)", i, (long long)id,
                            s->vocab);
        g->ids[i] = (int32_t)id;
    }
    g->n_ids = n;
    char *text = NULL;
    size_t len = 0;
    if (cllm_tokenizer_decode(s->tok, g->ids, n, false, &text, &len)) return srv_errf(e, 400, "`prompt`: %s", cllm_last_error());
    g->prompt_text = text;
    return 0;
}

static int chat_prompt(cllm_server *s, const json_t *body, srv_gen *g, srv_err *e) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_errf(e, 400, "`messages` must be a non-empty list of messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return srv_errf(e, 400, "`messages`[%zu] must be an object with a string `role`", i);
        if (!is_null_or_absent(content) && !json_is_string(content) && !json_is_array(content))
            return srv_errf(e, 400, "`messages`[%zu].content must be a string or a list of content parts", i);
        for (size_t k = 0; json_is_array(content) && k < json_array_size(content); k++) {
            const json_t *part = json_array_get(content, k);
            const json_t *type = json_object_get(part, "type");
            if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
                !json_is_string(json_object_get(part, "text")))
                return srv_errf(e, 400, "`messages`[%zu].content[%zu]: only text parts ({\"type\": \"text\", "
                                        "\"text\": ...}) are supported", i, k);
        }
    }
    if (!s->tmpl)
        return srv_errf(e, 400, "this model has no chat template (tokenizer_config.json `chat_template`): use "
                                "/v1/completions");
    char *text = NULL;
    cllm_status st = cllm_chat_template_render(s->tmpl, msgs, true, s->bos, s->eos, NULL, &text);
    if (st) {
        free(text);
        return srv_errf(e, 400, "chat template: %s", cllm_last_error());
    }
    int rc = srv_tokenize_prompt(s, g, text, strlen(text), false, 0, e, true);
    free(text);
    return rc;
}

int srv_parse_openai(cllm_server *s, const json_t *body, bool chat, srv_gen *g, srv_err *e) {
    static const char *const comp_keys[] = {
        "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
        "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "seed",
        "top_k", "repetition_penalty", "typical_p", NULL};
    static const char *const chat_keys[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
        "stream_options", "logprobs", "top_logprobs", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
        "user", "seed", "response_format", "top_k", "repetition_penalty", "typical_p", "tool_choice", "tools",
        "parallel_tool_calls", NULL};
    memset(g, 0, sizeof *g);
    g->n = 1;
    g->gp = cllm_generate_params_default();
    if (!json_is_object(body)) return srv_errf(e, 400, "the request body must be a JSON object");
    int rc = check_keys(body, chat ? chat_keys : comp_keys, e, 400, true);
    if (rc) return rc;
    if ((rc = pick_adapter(s, json_object_get(body, "model"), g, e, true))) return rc;

    double temp = 1, top_p = 1, typ = 1, rep = 1, freq = 0, pres = 0;
    long long max_new = 0, max_new2 = 0, n = 1, seed = 0, top_k = 0, logprobs_n = 0, best_of = 1;
    bool mn_given = false, mn2_given = false, seed_given, lp_given = false, k_given, t_given;
    if ((rc = get_num(body, "temperature", &temp, &t_given, e, 400)) || (rc = get_num(body, "top_p", &top_p, NULL, e, 400)) ||
        (rc = get_num(body, "typical_p", &typ, NULL, e, 400)) ||
        (rc = get_num(body, "repetition_penalty", &rep, NULL, e, 400)) ||
        (rc = get_num(body, "frequency_penalty", &freq, NULL, e, 400)) ||
        (rc = get_num(body, "presence_penalty", &pres, NULL, e, 400)) ||
        (rc = get_int(body, "max_tokens", &max_new, &mn_given, e, 400)) ||
        (rc = get_int(body, "n", &n, NULL, e, 400)) || (rc = get_int(body, "seed", &seed, &seed_given, e, 400)) ||
        (rc = get_int(body, "top_k", &top_k, &k_given, e, 400)) || (rc = get_int(body, "best_of", &best_of, NULL, e, 400)) ||
        (rc = get_bool(body, "stream", &g->stream, e, 400)))
        return rc;
    if (chat && (rc = get_int(body, "max_completion_tokens", &max_new2, &mn2_given, e, 400))) return rc;
    if (mn2_given) {
        max_new = max_new2;
        mn_given = true;
    }
    if (chat) {
        bool lp = false;
        if ((rc = get_bool(body, "logprobs", &lp, e, 400)) ||
            (rc = get_int(body, "top_logprobs", &logprobs_n, &lp_given, e, 400)))
            return rc;
        if (lp_given && !lp) return srv_errf(e, 400, "`top_logprobs` needs `logprobs` set to true");
        if (lp_given && (logprobs_n < 0 || logprobs_n > 20)) return srv_errf(e, 400, "`top_logprobs` must be in [0, 20]");
        g->logprobs = lp;
    } else {
        if ((rc = get_int(body, "logprobs", &logprobs_n, &lp_given, e, 400))) return rc;
        if (lp_given && (logprobs_n < 0 || logprobs_n > 5)) return srv_errf(e, 400, "`logprobs` must be in [0, 5]");
        g->logprobs = lp_given;
        if ((rc = get_bool(body, "echo", &g->echo, e, 400))) return rc;
        const json_t *suffix = json_object_get(body, "suffix");
        if (!is_null_or_absent(suffix)) return srv_errf(e, 400, "`suffix` is not supported");
    }
    const json_t *so = json_object_get(body, "stream_options");
    if (!is_null_or_absent(so)) {
        static const char *const so_keys[] = {"include_usage", NULL};
        if (!json_is_object(so)) return srv_errf(e, 400, "`stream_options` must be an object");
        if ((rc = check_keys(so, so_keys, e, 400, true)) || (rc = get_bool(so, "include_usage", &g->include_usage, e, 400)))
            return rc;
        if (!g->stream) return srv_errf(e, 400, "`stream_options` is only allowed when `stream` is true");
    }
    const json_t *rf = json_object_get(body, "response_format");
    if (!is_null_or_absent(rf)) {
        const json_t *type = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(type) || strcmp(json_string_value(type), "text"))
            return srv_errf(e, 400, "`response_format`: only {\"type\": \"text\"} is supported");
    }
    const json_t *tools = json_object_get(body, "tools");
    if (!is_null_or_absent(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return srv_errf(e, 400, "`tools` are not supported by this server");
    if (!(temp >= 0 && temp <= 2)) return srv_errf(e, 400, "`temperature` must be in [0, 2]");
    if (!(top_p > 0 && top_p <= 1)) return srv_errf(e, 400, "`top_p` must be in (0, 1]");
    if (!(typ > 0 && typ <= 1)) return srv_errf(e, 400, "`typical_p` must be in (0, 1]");
    if (!(rep > 0 && rep <= 100)) return srv_errf(e, 400, "`repetition_penalty` must be in (0, 100]");
    if (!(freq >= -2 && freq <= 2)) return srv_errf(e, 400, "`frequency_penalty` must be in [-2, 2]");
    if (!(pres >= -2 && pres <= 2)) return srv_errf(e, 400, "`presence_penalty` must be in [-2, 2]");
    if (mn_given && max_new < 1) return srv_errf(e, 400, "`%s` must be at least 1", mn2_given ? "max_completion_tokens" : "max_tokens");
    if (n < 1 || n > s->p.max_n) return srv_errf(e, 400, "`n` must be in [1, %d]", s->p.max_n);
    if (best_of != 1 && best_of != n) return srv_errf(e, 400, "`best_of` other than `n` is not supported");
    if (seed_given && seed < 0) return srv_errf(e, 400, "`seed` must be a non-negative integer");
    if (k_given && (top_k < 0 || top_k > s->vocab)) return srv_errf(e, 400, "`top_k` must be in [0, %d]", s->vocab);
    if ((rc = get_stops(body, g, s->p.max_stop_sequences, e, 400))) return rc;
    if ((rc = get_logit_bias(s, body, g, e))) return rc;
    if (chat) rc = chat_prompt(s, body, g, e);
    else if (!json_object_get(body, "prompt")) rc = srv_errf(e, 400, "`prompt` is required");
    else rc = completion_prompt(s, json_object_get(body, "prompt"), g, e);
    if (rc) return rc;
    if ((rc = settle_max_new(s, g, max_new, mn_given, chat ? 0 : 16, e, 400, "max_tokens")))
        return rc;

    g->n = (int)n;
    g->sampling = temp > 0;
    cllm_sample_params *sp = &g->gp.sample;
    sp->greedy = !g->sampling;
    sp->temperature = g->sampling ? (float)temp : 1.0f;
    sp->top_k = (int)top_k;
    sp->top_p = (float)top_p;
    sp->typical_p = (float)typ;
    sp->repetition_penalty = (float)rep;
    sp->frequency_penalty = (float)freq;
    sp->presence_penalty = (float)pres;
    g->seed_given = seed_given;
    g->gp.seed = seed_given ? (uint64_t)seed : random_seed();
    g->top_n = g->logprobs ? (int)logprobs_n : 0;
    g->gp.top_n = g->top_n;
    g->prompt_logprobs = !chat && g->echo && g->logprobs;
    return 0;
}
