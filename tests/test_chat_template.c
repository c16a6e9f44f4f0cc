/*
 * test_chat_template: the chat-template API's contract (cllm/chat_template.h)
 * beyond what the oracle test compares: syntax errors with line:column,
 * raise_exception's message, runtime errors naming the line, the render
 * bounds, undefined values, load_dir on the fixture folders and on written
 * ones (string and list forms, AddedToken objects, chat_template.jinja, no
 * template, bad types), NULL and empty inputs, and renders from several
 * threads at once.
 *
 *   test_chat_template FIXTURES/hf TEMPLATES_DIR
 * Expected texts are written from the published formats (Zephyr's
 * "<|user|>\n...</s>\n"), not from cllm's output.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cllm/chat_template.h"
#include "cllm/io.h"
#include "cllm/sample.h"
#include "cllm/tokenizer.h"

static const char *fixtures, *templates;

/* Renders src with one user message "hi"; returns the text or NULL (message in err). */
static char *render_src(const char *src, cllm_status *st_out, char *err, size_t errn) {
    cllm_chat_template *t = NULL;
    char *out = NULL;
    cllm_status st = cllm_chat_template_init(&t, src, "T");
    if (!st) {
        json_t *m = json_pack("[{ssss}]", "role", "user", "content", "hi");
        st = cllm_chat_template_render(t, m, true, "<s>", "</s>", NULL, &out);
        json_decref(m);
    }
    if (st_out) *st_out = st;
    if (err) snprintf(err, errn, "%s", st ? cllm_last_error() : "");
    cllm_chat_template_free(t);
    return out;
}

static void expect_text(const char *src, const char *want) {
    cllm_status st;
    char err[512];
    char *got = render_src(src, &st, err, sizeof err);
    CHECK(got && !strcmp(got, want), "%s -> got %s (%s), want %s", src, got ? got : "NULL", err, want);
    free(got);
}

static void expect_error(const char *src, cllm_status want_st, const char *want_msg) {
    cllm_status st;
    char err[512];
    char *got = render_src(src, &st, err, sizeof err);
    CHECK(!got && st == want_st, "%s: status %d, want %d", src, (int)st, (int)want_st);
    CHECK(strstr(err, want_msg) != NULL, "%s: message '%s' lacks '%s'", src, err, want_msg);
    free(got);
}

static void test_syntax_errors(void) {
    /* messages name the source, line and column of the offending token */
    expect_error("{{ 1 + }}", CLLM_ERR_FORMAT, "T:1:8: unexpected '}}', expected an expression");
    expect_error("a\nb {% foo %}", CLLM_ERR_FORMAT, "T:2:6: unknown or unsupported tag 'foo'");
    expect_error("x\n  {{ 'abc }}", CLLM_ERR_FORMAT, "T:2:6: unterminated string");
    expect_error("{% endfor %}", CLLM_ERR_FORMAT, "T:1:4: unexpected 'endfor' with no open block");
    expect_error("{% for x in y %}\nbody", CLLM_ERR_FORMAT, "expected 'else' or 'endfor'");
    expect_error("{% if x %}{% endfor %}", CLLM_ERR_FORMAT, "T:1:14: unexpected 'endfor', expected 'endif'");
    expect_error("1\n2\n{# open comment", CLLM_ERR_FORMAT, "T:3:1: missing end of comment tag");
    expect_error("{{ x", CLLM_ERR_FORMAT, "T:1:3: unexpected end of template, expected '}}'");
    expect_error("{{ a is b is c }}", CLLM_ERR_FORMAT, "cannot chain multiple tests");
    expect_error("{{ 'x' | }}", CLLM_ERR_FORMAT, "T:1:10: unexpected '}}', expected a name");
    expect_error("{{ [1, 2 }}", CLLM_ERR_FORMAT, "T:1:");
    expect_error("{{ \"\\x4\" }}", CLLM_ERR_FORMAT, "truncated \\x escape");
    expect_error("{{ 99999999999999999999 }}", CLLM_ERR_FORMAT, "out of range");
    /* nesting is bounded at parse time, not by the C stack */
    char deep[4096];
    size_t o = 0;
    o += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[o++] = '(';
    deep[o] = 0;
    expect_error(deep, CLLM_ERR_FORMAT, "nested too deeply");
}

static void test_runtime_errors(void) {
    /* raise_exception: exactly the template's message */
    expect_error("{% if messages[0].role == 'user' %}{{ raise_exception('Roles must alternate') }}{% endif %}",
                 CLLM_ERR_ARG, "cllm_chat_template_render: Roles must alternate");
    cllm_status st;
    char err[512];
    free(render_src("{{ raise_exception('only this') }}", &st, err, sizeof err));
    CHECK(!strcmp(err, "cllm_chat_template_render: only this"), "raise message: %s", err);
    /* other errors name the line */
    expect_error("line 1\n{{ 1 + 'a' }}", CLLM_ERR_ARG, "T:2: unsupported operand types for +: 'int' and 'str'");
    expect_error("\n\n{{ messages.strip() }}", CLLM_ERR_ARG, "T:3: 'list' object has no method 'strip'");
    expect_error("{{ nothing.attr }}", CLLM_ERR_ARG, "T:1: 'nothing' is undefined");
    /* an undefined value from attr() or an attribute path does not keep a
     * name that dies with the filter call (found by fuzz_chat_template) */
    expect_error("{{ (messages | attr('nope')).role }}", CLLM_ERR_ARG, "T:1: attribute 'role' of an undefined value");
    expect_error("{{ messages | map(attribute='nope.more') | list }}", CLLM_ERR_ARG,
                 "T:1: attribute 'more' of an undefined value");
    /* a failed attribute path inside join() left its value unset, and join freed it */
    expect_error("{{ messages | join(attribute='nope.x') }}", CLLM_ERR_ARG, "T:1: attribute 'x' of an undefined value");
    expect_error("{{ 'x' | nosuchfilter }}", CLLM_ERR_ARG, "no filter named 'nosuchfilter'");
    expect_error("{{ 1 is nosuchtest }}", CLLM_ERR_ARG, "no test named 'nosuchtest'");
    expect_error("{{ 1 // 0 }}", CLLM_ERR_ARG, "division or modulo by zero");
    expect_error("{{ 9223372036854775807 + 1 }}", CLLM_ERR_ARG, "integer overflow");
    expect_error("{% set x = [1] %}{{ x.append(2) }}", CLLM_ERR_ARG, "cannot be modified");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", CLLM_ERR_ARG, "non-namespace object 'x'");
    expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", CLLM_ERR_ARG, "too many values to unpack");
    /* Jinja2's Undefined: empty, false, iterable as empty, has a default */
    expect_text("[{{ nothing }}][{{ 'y' if nothing else 'n' }}][{% for x in nothing %}x{% else %}e{% endfor %}]"
                "[{{ nothing | default('d') }}][{{ nothing is defined }}][{{ messages[5] is defined }}]",
                "[][n][e][d][False][False]");
}

static void test_bounds(void) {
    /* 16 MiB of output, 10^7 steps, 10^6 range items, 256 nested macro calls */
    expect_error("{% for i in range(1000000) %}{{ 'x' * 100 }}{% endfor %}", CLLM_ERR_ARG, "output grew past");
    expect_error("{{ 'x' * 100000000 }}", CLLM_ERR_ARG, "too long");
    expect_error("{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", CLLM_ERR_ARG,
                 "more than 10000000 steps");
    expect_error("{% for i in range(10000000) %}{% endfor %}", CLLM_ERR_ARG, "range() of more than");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", CLLM_ERR_ARG, "nested deeper than 256");
    /* a render stopped by a bound leaves the template usable */
    expect_text("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(3) }}", "0123");
}

static void test_inputs(void) {
    cllm_chat_template *t = NULL;
    char *out = (char *)1;
    CHECK(cllm_chat_template_init(&t, NULL, "T") == CLLM_ERR_ARG && t == NULL, "NULL source");
    CHECK(cllm_chat_template_init(NULL, "x", "T") == CLLM_ERR_ARG, "NULL out");
    CHECK(cllm_chat_template_render(NULL, NULL, false, NULL, NULL, NULL, &out) == CLLM_ERR_ARG && out == NULL,
          "NULL template");
    cllm_chat_template_free(NULL);
    /* the empty template renders the empty string; NULL messages are [] */
    CHECK(cllm_chat_template_init(&t, "", NULL) == CLLM_OK, "empty template: %s", cllm_last_error());
    CHECK(cllm_chat_template_render(t, NULL, false, NULL, NULL, NULL, &out) == CLLM_OK && out && !strcmp(out, ""),
          "empty render");
    free(out);
    cllm_chat_template_free(t);
    CHECK(cllm_chat_template_init(&t, "{{ messages | length }}|{{ bos_token is defined }}|{{ tools }}|{{ k }}",
                                  NULL) == CLLM_OK,
          "init");
    json_t *extra = json_pack("{ss}", "k", "from extra");
    CHECK(cllm_chat_template_render(t, NULL, false, NULL, NULL, extra, &out) == CLLM_OK &&
              !strcmp(out, "0|False|None|from extra"),
          "defaults: %s", out);
    free(out);
    json_t *bad = json_pack("{}");
    CHECK(cllm_chat_template_render(t, bad, false, NULL, NULL, NULL, &out) == CLLM_ERR_ARG && !out,
          "messages must be an array");
    CHECK(cllm_chat_template_render(t, NULL, false, NULL, NULL, bad, &out) == CLLM_OK, "an empty extra object");
    free(out);
    json_decref(bad);
    json_decref(extra);
    cllm_chat_template_free(t);
    /* Jinja2's own whitespace handling: one trailing newline dropped, CRLF as LF */
    expect_text("a\r\nb\n", "a\nb");
    expect_text("  {% if true %}\r\n  x\n  {% endif %}\n", "  x\n");
    /* a key that is not UTF-8 (template strings need not be) in dict.items():
     * its pair used to fail to build and leak the value (a fuzz finding) */
    expect_text("{% set d = {'\xc9': [1, 'x'], 'b': 2} %}{% for k, v in d.items() %}{{ v }};{% endfor %}",
                "[1, 'x'];2;");
}

typedef struct {
    const cllm_chat_template *t;
    const json_t *msgs;
    int ok;
} thread_arg;

static void *render_many(void *p) {
    thread_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        if (cllm_chat_template_render(a->t, a->msgs, true, "<s>", "</s>", NULL, &out) ||
            strcmp(out, "<|user|>\nhi</s>\n<|assistant|>\nyes</s>\n<|assistant|>\n"))
            a->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_load_dir(void) {
    char dir[1024];
    cllm_chat_template *t = NULL;
    char *bos = NULL, *eos = NULL, *out = NULL;
    /* TinyLlama's folder: a string template (Zephyr's format) and string tokens */
    snprintf(dir, sizeof dir, "%s/tinyllama-1.1b-chat-v1.0", fixtures);
    CHECK(cllm_chat_template_load_dir(&t, &bos, &eos, dir) == CLLM_OK && t, "tinyllama: %s", cllm_last_error());
    CHECK(bos && eos && !strcmp(bos, "<s>") && !strcmp(eos, "</s>"), "tinyllama tokens %s %s", bos, eos);
    json_t *msgs = json_pack("[{ssss}{ssss}]", "role", "user", "content", "hi", "role", "assistant", "content", "yes");
    if (t) {
        CHECK(cllm_chat_template_render(t, msgs, true, bos, eos, NULL, &out) == CLLM_OK &&
                  !strcmp(out, "<|user|>\nhi</s>\n<|assistant|>\nyes</s>\n<|assistant|>\n"),
              "tinyllama render: %s", out ? out : cllm_last_error());
        free(out);
        pthread_t th[4];
        thread_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (thread_arg){t, msgs, 0};
            pthread_create(&th[i], NULL, render_many, &args[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK(args[i].ok, "thread %d rendered a different text", i);
        }
    }
    cllm_chat_template_free(t);
    free(bos);
    free(eos);
    /* gpt2: no template, no tokens; mistral: tokens but no template */
    snprintf(dir, sizeof dir, "%s/gpt2", fixtures);
    t = (cllm_chat_template *)1;
    CHECK(cllm_chat_template_load_dir(&t, &bos, &eos, dir) == CLLM_OK && !t && !bos && !eos, "gpt2: no template");
    snprintf(dir, sizeof dir, "%s/mistral-7b-v0.1", fixtures);
    CHECK(cllm_chat_template_load_dir(&t, &bos, &eos, dir) == CLLM_OK && !t && bos && !strcmp(bos, "<s>"),
          "mistral: tokens without a template");
    free(bos);
    free(eos);
    CHECK(cllm_chat_template_load_dir(&t, NULL, NULL, "/nonexistent/folder") == CLLM_OK && !t, "no folder");

    /* written folders: list form with AddedToken objects, chat_template.jinja, bad types */
    char tmp[] = "/tmp/cllm_tmpl_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tmp);
    const char *list_cfg = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T{{ 1 }}\"},"
                           " {\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}\"}],"
                           " \"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\"}";
    cllm_write_file_atomic(path, list_cfg, strlen(list_cfg));
    CHECK(cllm_chat_template_load_dir(&t, &bos, &eos, tmp) == CLLM_OK && t, "list form: %s", cllm_last_error());
    if (t && bos && eos) {
        CHECK(cllm_chat_template_render(t, NULL, false, bos, eos, NULL, &out) == CLLM_OK && !strcmp(out, "D<B><E>"),
              "list form picks default: %s", out);
        free(out);
    }
    cllm_chat_template_free(t);
    free(bos);
    free(eos);
    struct {
        const char *cfg, *msg;
    } bad[] = {
        {"{\"chat_template\": 5}", "key 'chat_template' must be a string or a list"},
        {"{\"chat_template\": [{\"name\": \"x\", \"template\": \"a\"}]}", "no template named \"default\""},
        {"{\"chat_template\": [{\"name\": 1}]}", "chat_template[0] must be an object"},
        {"{\"chat_template\": \"ok\", \"eos_token\": 3}", "key 'eos_token' must be a string"},
        {"{\"chat_template\": \"line\\n{% if %}\"}", "tokenizer_config.json chat_template:2:7: unexpected '%}'"},
        {"{\"chat_template\": ", "tokenizer_config.json:1:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cllm_write_file_atomic(path, bad[i].cfg, strlen(bad[i].cfg));
        bos = eos = (char *)1;
        cllm_status st = cllm_chat_template_load_dir(&t, &bos, &eos, tmp);
        CHECK(st == CLLM_ERR_FORMAT && !t && !bos && !eos, "bad config %zu: status %d", i, (int)st);
        CHECK(strstr(cllm_last_error(), bad[i].msg) && strstr(cllm_last_error(), tmp), "bad config %zu: %s", i,
              cllm_last_error());
    }
    /* no chat_template key: chat_template.jinja is used */
    const char *plain = "{\"eos_token\": \"<E>\"}";
    cllm_write_file_atomic(path, plain, strlen(plain));
    char jpath[1200];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", tmp);
    const char *jt = "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}\n";
    cllm_write_file_atomic(jpath, jt, strlen(jt));
    CHECK(cllm_chat_template_load_dir(&t, &bos, &eos, tmp) == CLLM_OK && t && !bos && eos, "jinja file: %s",
          cllm_last_error());
    if (t) {
        CHECK(cllm_chat_template_render(t, msgs, false, bos, eos, NULL, &out) == CLLM_OK &&
                  !strcmp(out, "user: hi<E>\nassistant: yes<E>\n"),
              "jinja file render: %s", out);
        free(out);
    }
    cllm_chat_template_free(t);
    free(eos);
    const char *broken = "{{ oops";
    cllm_write_file_atomic(jpath, broken, strlen(broken));
    CHECK(cllm_chat_template_load_dir(&t, NULL, NULL, tmp) == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "chat_template.jinja:1:3"),
          "broken jinja file: %s", cllm_last_error());
    unlink(jpath);
    unlink(path);
    rmdir(tmp);
    json_decref(msgs);
}

/* Every checked-in template compiles; the Zephyr-style one renders the format. */
static void test_template_files(void) {
    const char *names[] = {"llama2_chat", "llama3_instruct", "mistral_instruct", "zephyr", "chatml_qwen2",
                           "gemma", "phi3", "tools_namespace", "features", "features_jinja2"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[1024], *src = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/%s.jinja", templates, names[i]);
        cllm_chat_template *t = NULL;
        CHECK(cllm_read_file(path, &src, &len) == CLLM_OK && cllm_chat_template_init(&t, src, path) == CLLM_OK,
              "%s: %s", path, cllm_last_error());
        cllm_chat_template_free(t);
        free(src);
    }
}


/* The text the training path renders for a record: TEXT segments, BOS/EOS as
 * the tokenizer's token strings; up_to_last_answer cuts before the last
 * trained TEXT segment (what a prompt for that answer is). */
static char *training_text(const char *record, const cllm_template *t, const cllm_tokenizer *tok,
                           bool up_to_last_answer) {
    cllm_sample smp = {0};
    cllm_loc where = {"record", 1, 1};
    if (cllm_sample_parse(&smp, record, strlen(record), &where, t, 0)) {
        fprintf(stderr, "record refused: %s\n", cllm_last_error());
        return NULL;
    }
    size_t end = smp.n_seg;
    if (up_to_last_answer)
        while (end > 0 && !(smp.seg[end - 1].kind == CLLM_SEG_TEXT && smp.seg[end - 1].loss)) end--;
    if (up_to_last_answer && end > 0) end--;
    size_t cap = smp.text_len + 64 * smp.n_seg + 1, n = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i < end; i++) {
        const cllm_segment *g = &smp.seg[i];
        const char *p = NULL;
        size_t len = 0;
        if (g->kind == CLLM_SEG_TEXT) {
            p = smp.text + g->off;
            len = g->len;
        } else if (g->kind == CLLM_SEG_BOS) {
            if (cllm_template_wants_bos(t, tok)) p = cllm_tokenizer_id_to_token(tok, cllm_tokenizer_bos_id(tok), &len);
        } else {
            p = cllm_tokenizer_id_to_token(tok, cllm_tokenizer_eos_id(tok), &len);
        }
        if (p) {
            memcpy(out + n, p, len);
            n += len;
        }
    }
    out[n] = 0;
    cllm_sample_free(&smp);
    return out;
}

/* The record's rounds as OpenAI messages (ask -> user, ans -> assistant);
 * drop_last leaves out the final round. */
static json_t *record_messages(const char *record, bool drop_last) {
    json_t *r = json_loads(record, 0, NULL), *msgs = json_array();
    json_t *rounds = json_object_get(r, "rounds");
    size_t n = json_array_size(rounds) - (drop_last ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(rounds, i);
        const char *role = json_string_value(json_array_get(p, 0));
        bool ask = !strcmp(role, "ask") || !strcmp(role, "user") || !strcmp(role, "human");
        json_array_append_new(msgs, json_pack("{ssso}", "role", ask ? "user" : "assistant", "content",
                                              json_incref(json_array_get(p, 1))));
    }
    json_decref(r);
    return msgs;
}

static void check_train_format(const cllm_template *t, const cllm_tokenizer *tok, const char *label) {
    static const char *const records[] = {
        "{\"type\": \"conversation\", \"rounds\": [[\"ask\", \"Is 14 even?\"], [\"ans\", \"Yes.\"]]}",
        "{\"type\": \"conversation\", \"rounds\": [[\"ask\", \"ünïcödé \\\"quotes\\\" {{ x }} {% y %}\"], "
        "[\"ans\", \"line\\none\\n\"], [\"ask\", \"and\\tthen?\"], [\"ans\", \"  spaced  \"]]}",
        "{\"type\": \"conversation\", \"rounds\": [[\"user\", \"two\"], [\"human\", \"asks\"], [\"gpt\", \"ok\"], "
        "[\"ask\", \"more\"], [\"ans\", \"done\"], [\"ans\", \"again\"]]}",
        "{\"rounds\": [[\"ans\", \"an answer first\"], [\"ask\", \"\\\\ back\\\\slash\"], [\"ans\", \"x\"]]}",
    };
    char *src = NULL;
    cllm_chat_template *ct = NULL;
    CHECK(cllm_chat_template_for_sample(t, &src) == CLLM_OK && cllm_chat_template_init(&ct, src, label) == CLLM_OK,
          "%s: %s", label, cllm_last_error());
    size_t bl = 0, el = 0;
    const char *bp = cllm_tokenizer_id_to_token(tok, cllm_tokenizer_bos_id(tok), &bl);
    const char *ep = cllm_tokenizer_id_to_token(tok, cllm_tokenizer_eos_id(tok), &el);
    char *bos = strndup(bp, bl), *eos = strndup(ep, el);
    for (size_t i = 0; ct && i < sizeof records / sizeof *records; i++) {
        for (int gen = 0; gen < 2; gen++) {
            char *want = training_text(records[i], t, tok, gen == 1), *got = NULL;
            json_t *msgs = record_messages(records[i], gen == 1);
            cllm_status st = cllm_chat_template_render(ct, msgs, gen == 1, bos, eos, NULL, &got);
            CHECK(st == CLLM_OK && want && !strcmp(got, want), "%s record %zu gen %d:\n got  [%s] (%s)\n want [%s]",
                  label, i, gen, got ? got : "", st ? cllm_last_error() : "", want ? want : "");
            free(want);
            free(got);
            json_decref(msgs);
        }
    }
    /* a system message replaces the template's system text; other roles are refused */
    json_t *m = json_pack("[{ssss}{ssss}]", "role", "system", "content", "S", "role", "tool", "content", "x");
    char *out = NULL;
    CHECK(ct && cllm_chat_template_render(ct, m, false, bos, eos, NULL, &out) == CLLM_ERR_ARG &&
              strstr(cllm_last_error(), "got role tool"),
          "%s: tool role refused: %s", label, cllm_last_error());
    json_decref(m);
    free(bos);
    free(eos);
    free(src);
    cllm_chat_template_free(ct);
}

static void test_train_format(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tinyllama-1.1b-chat-v1.0", fixtures);
    cllm_tokenizer *tok = NULL;
    if (cllm_tokenizer_load(&tok, dir)) {
        CHECK(0, "tokenizer: %s", cllm_last_error());
        return;
    }
    cllm_template t;
    CHECK(cllm_template_load(&t, NULL) == CLLM_OK, "defaults");
    check_train_format(&t, tok, "defaults");
    cllm_template_free(&t);
    /* a --template file: other markers, BOS forced on, no EOS, a system text with quotes */
    char tmp[] = "/tmp/cllm_tmpl_train_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char path[1200];
    snprintf(path, sizeof path, "%s/template.json", tmp);
    const char *tj = "{\"system\": \"You are \\\"terse\\\".\\n\", \"ask_prefix\": \"<|user|>\\n\", \"ask_suffix\": "
                     "\"\\n\", \"ans_prefix\": \"<|bot|> \", \"ans_suffix\": \"\\n---\\n\", \"bos\": true, \"eos\": false}";
    cllm_write_file_atomic(path, tj, strlen(tj));
    CHECK(cllm_template_load(&t, path) == CLLM_OK, "template file: %s", cllm_last_error());
    check_train_format(&t, tok, "template file");
    /* write_dir: the tokenizer files travel, load_dir finds the template */
    CHECK(cllm_chat_template_write_dir(tmp, dir, &t) == CLLM_OK, "write_dir: %s", cllm_last_error());
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    struct stat sb;
    CHECK(stat(path, &sb) == 0, "tokenizer.json copied");
    cllm_chat_template *ct = NULL;
    char *bos = NULL, *eos = NULL, *out = NULL;
    CHECK(cllm_chat_template_load_dir(&ct, &bos, &eos, tmp) == CLLM_OK && ct && bos && !strcmp(bos, "<s>"),
          "load_dir of the written folder: %s", cllm_last_error());
    json_t *m = json_pack("[{ssss}]", "role", "user", "content", "hi");
    CHECK(ct && cllm_chat_template_render(ct, m, true, bos, eos, NULL, &out) == CLLM_OK &&
              !strcmp(out, "<s>You are \"terse\".\n<|user|>\nhi\n<|bot|> "),
          "written template: %s", out);
    free(out);
    json_decref(m);
    cllm_chat_template_free(ct);
    free(bos);
    free(eos);
    cllm_template_free(&t);
    cllm_tokenizer *tok2 = NULL;
    CHECK(cllm_tokenizer_load(&tok2, tmp) == CLLM_OK, "the written folder's tokenizer loads: %s", cllm_last_error());
    cllm_tokenizer_free(tok2);
    static const char *const files[] = {"template.json", "tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
        unlink(path);
    }
    rmdir(tmp);
    cllm_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_chat_template FIXTURES/hf TEMPLATES_DIR\n");
        return 2;
    }
    fixtures = argv[1];
    templates = argv[2];
    test_syntax_errors();
    test_runtime_errors();
    test_bounds();
    test_inputs();
    test_load_dir();
    test_template_files();
    test_train_format();
    return check_summary();
}
