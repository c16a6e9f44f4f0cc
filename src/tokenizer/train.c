/*
 * Training and extending BPE tokenizers (cllm_tokenizer_train,
 * cllm_tokenizer_extend): builds the tokenizer.json skeleton of the chosen
 * style, counts the corpus words through that tokenizer's own pipeline
 * (train_words.c), chooses the base symbols (bytes, or characters by
 * coverage), learns merges (train_bpe.c) and writes tokenizer.json in the
 * layout Hugging Face uses: one vocabulary entry and one merge per line.
 * Not here: Unigram or WordPiece training, normalizers such as NFKC.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "tokenizer/train_impl.h"

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory")
#define SP "\xE2\x96\x81" /* U+2581, SentencePiece's space */
#define MAX_VOCAB (1 << 24)

static const char BYTE_SKELETON[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [], \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true,"
    " \"use_regex\": true},"
    " \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false,"
    " \"use_regex\": true},"
    " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null,"
    " \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,"
    " \"vocab\": {}, \"merges\": []}}";

static const char SP_SKELETON[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [], \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" SP "\", \"prepend_scheme\": \"first\","
    " \"split\": false},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\","
    " \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    " \"pair\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
    " {\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \"" SP "\"}, \"content\": \" \"},"
    " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"continuing_subword_prefix\": null,"
    " \"end_of_word_suffix\": null, \"fuse_unk\": true, \"byte_fallback\": true, \"ignore_merges\": false,"
    " \"vocab\": {}, \"merges\": []}}";

/* ---------------------------------------------------------------- output */

static bool put_json(tk_str *s, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return false;
    bool ok = tk_str_put(s, t, strlen(t));
    free(t);
    return ok;
}

static bool put_key(tk_str *s, const char *indent, const char *key) {
    json_t *k = json_string(key);
    bool ok = k && tk_str_put(s, indent, strlen(indent)) && put_json(s, k) && tk_str_put(s, ": ", 2);
    json_decref(k);
    return ok;
}

/* Serialises an object with one member per line, `indent` deep; "model"
 * gets the same treatment one level down, and its "vocab" and "merges" one
 * entry per line. Everything else is compact JSON. */
static bool put_object(tk_str *s, const json_t *o, int depth) {
    static const char *const pad[] = {"", "  ", "    ", "      "};
    const char *key;
    json_t *v;
    size_t i = 0, n = json_object_size(o);
    if (!tk_str_put(s, "{\n", 2)) return false;
    json_object_foreach((json_t *)o, key, v) {
        if (!put_key(s, pad[depth + 1], key)) return false;
        bool nested = (depth == 0 && strcmp(key, "model") == 0 && json_is_object(v)) ||
                      (depth == 1 && strcmp(key, "vocab") == 0 && json_is_object(v) && json_object_size(v) > 0);
        if (nested && depth == 0) {
            if (!put_object(s, v, 1)) return false;
        } else if (nested) {
            const char *k2;
            json_t *v2;
            size_t j = 0, m = json_object_size(v);
            if (!tk_str_put(s, "{\n", 2)) return false;
            json_object_foreach(v, k2, v2) {
                j++;
                if (!put_key(s, pad[3], k2) || !put_json(s, v2) || !tk_str_put(s, j < m ? ",\n" : "\n", j < m ? 2 : 1))
                    return false;
            }
            if (!tk_str_put(s, pad[2], 4) || !tk_str_put(s, "}", 1)) return false;
        } else if (depth == 1 && strcmp(key, "merges") == 0 && json_is_array(v) && json_array_size(v) > 0) {
            size_t m = json_array_size(v);
            if (!tk_str_put(s, "[\n", 2)) return false;
            for (size_t j = 0; j < m; j++)
                if (!tk_str_put(s, pad[3], 6) || !put_json(s, json_array_get(v, j)) ||
                    !tk_str_put(s, j + 1 < m ? ",\n" : "\n", j + 1 < m ? 2 : 1))
                    return false;
            if (!tk_str_put(s, pad[2], 4) || !tk_str_put(s, "]", 1)) return false;
        } else if (!put_json(s, v)) {
            return false;
        }
        i++;
        if (!tk_str_put(s, i < n ? ",\n" : "\n", i < n ? 2 : 1)) return false;
    }
    return tk_str_put(s, pad[depth], strlen(pad[depth])) && tk_str_put(s, "}", 1);
}

static cllm_status write_tokenizer_json(const json_t *root, const char *dir) {
    tk_str s = {0};
    if (!put_object(&s, root, 0) || !tk_str_put(&s, "\n", 1)) {
        tk_str_free(&s);
        return NOMEM();
    }
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    cllm_status st = path ? CLLM_OK : NOMEM();
    if (path) {
        snprintf(path, n, "%s/tokenizer.json", dir);
        st = cllm_write_file_atomic(path, s.p, s.n);
    }
    free(path);
    tk_str_free(&s);
    return st;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* --------------------------------------------------------------- helpers */

static int cmp_i64_desc(const void *x, const void *y) {
    const int64_t *a = x, *b = y; /* pairs (count, code point) */
    if (a[0] != b[0]) return a[0] > b[0] ? -1 : 1;
    return (a[1] > b[1]) - (a[1] < b[1]);
}

/* Characters (code points) of the words that together cover `coverage` of
 * all character occurrences, most frequent first, skipping those already in
 * the vocabulary and U+0000 (JSON keys cannot hold it); at most `limit` are
 * added to v. Rarer characters are left to byte fallback. */
static cllm_status add_characters(tt_vocab *v, const tt_wordmap *words, double coverage, int32_t limit,
                                  int32_t *n_added) {
    *n_added = 0;
    int64_t *cnt = calloc(0x110000, sizeof *cnt);
    if (!cnt) return NOMEM();
    int64_t total = 0;
    for (size_t i = 0; i < words->n; i++) {
        const char *s = words->keys.p + words->v[i].off;
        size_t n = words->v[i].len;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            k += tk_utf8_next(s + k, n - k, &cp);
            if (cp < 0x110000) cnt[cp] += words->v[i].count;
            total += words->v[i].count;
        }
    }
    size_t nz = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) nz += cnt[cp] > 0;
    int64_t *order = malloc((nz + 1) * 2 * sizeof *order);
    if (!order) {
        free(cnt);
        return NOMEM();
    }
    size_t k = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (cnt[cp] > 0) {
            order[2 * k] = cnt[cp];
            order[2 * k + 1] = cp;
            k++;
        }
    free(cnt);
    qsort(order, nz, 2 * sizeof *order, cmp_i64_desc);
    int64_t acc = 0;
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i < nz && *n_added < limit; i++) {
        if ((double)acc >= coverage * (double)total) break;
        acc += order[2 * i];
        uint32_t cp = (uint32_t)order[2 * i + 1];
        char b[4];
        size_t bl = tk_utf8_put(b, cp);
        if (cp == 0 || tk_strmap_get(&v->map, b, bl) >= 0) continue;
        if (!tt_vocab_set(v, v->n, b, bl)) {
            st = NOMEM();
            break;
        }
        ++*n_added;
    }
    free(order);
    return st;
}

/* Turns the counted words into symbol sequences: bytes through the GPT-2
 * alphabet (byte_level) or characters, each looked up in v; a symbol with no
 * token, or a reserved one, becomes -1 (a barrier: byte fallback). */
static cllm_status build_corpus(tt_corpus *c, const tt_wordmap *words, const tt_vocab *v, bool byte_level) {
    memset(c, 0, sizeof *c);
    int32_t byte_sym[256];
    for (int b = 0; b < 256; b++) {
        char t[4];
        size_t tl = tk_utf8_put(t, tk_byte_to_cp((uint8_t)b));
        int32_t id = tk_strmap_get(&v->map, t, tl);
        byte_sym[b] = id >= 0 && !v->reserved[id] ? id : -1;
    }
    size_t total = words->keys.n;
    c->sym = malloc((total + 1) * sizeof *c->sym);
    c->off = malloc((words->n + 1) * sizeof *c->off);
    c->len = malloc((words->n + 1) * sizeof *c->len);
    c->count = malloc((words->n + 1) * sizeof *c->count);
    if (!c->sym || !c->off || !c->len || !c->count) {
        tt_corpus_free(c);
        return NOMEM();
    }
    size_t at = 0;
    for (size_t i = 0; i < words->n; i++) {
        const char *s = words->keys.p + words->v[i].off;
        size_t n = words->v[i].len;
        c->off[i] = at;
        c->count[i] = words->v[i].count;
        for (size_t k = 0; k < n;) {
            if (byte_level) {
                c->sym[at++] = byte_sym[(unsigned char)s[k++]];
                continue;
            }
            uint32_t cp;
            size_t l = tk_utf8_next(s + k, n - k, &cp);
            int32_t id = tk_strmap_get(&v->map, s + k, l);
            c->sym[at++] = id >= 0 && !v->reserved[id] ? id : -1;
            k += l;
        }
        c->len[i] = (uint32_t)(at - c->off[i]);
    }
    c->n_words = words->n;
    return CLLM_OK;
}

static bool vocab_from_json(tt_vocab *v, const json_t *vocab) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= MAX_VOCAB || !tt_vocab_set(v, (int32_t)id, key, strlen(key)))
            return false;
    }
    return true;
}

/* Adds tokens [from, v->n) to model.vocab and the merges to model.merges,
 * as "a b" strings if `as_strings`, else ["a", "b"]. */
static cllm_status append_model(json_t *model, const tt_vocab *v, int32_t from, const tt_merge *mg, size_t nm,
                                bool as_strings) {
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    tk_str tmp = {0};
    bool ok = true;
    for (int32_t id = from; id < v->n && ok; id++) {
        if (v->off[id] == UINT64_MAX) continue;
        tmp.n = 0;
        ok = tk_str_put(&tmp, tt_vocab_str(v, id), v->len[id]) && json_object_set_new(vocab, tmp.p, json_integer(id)) == 0;
    }
    for (size_t i = 0; i < nm && ok; i++) {
        const char *a = tt_vocab_str(v, mg[i].a), *b = tt_vocab_str(v, mg[i].b);
        size_t al = v->len[mg[i].a], bl = v->len[mg[i].b];
        json_t *e;
        if (as_strings) {
            tmp.n = 0;
            ok = tk_str_put(&tmp, a, al) && tk_str_put(&tmp, " ", 1) && tk_str_put(&tmp, b, bl);
            e = ok ? json_stringn(tmp.p, tmp.n) : NULL;
        } else {
            e = json_pack("[s#s#]", a, (int)al, b, (int)bl);
        }
        ok = ok && e && json_array_append_new(merges, e) == 0;
    }
    tk_str_free(&tmp);
    return ok ? CLLM_OK : NOMEM();
}

/* Words of the corpus -> symbols -> merges: the part shared by train and
 * extend. `base` holds the merges to apply first (extend) or NULL. */
static cllm_status learn(const cllm_tokenizer *tok, const char *const *files, int n_files,
                         const cllm_tokenizer_train_params *p, tt_vocab *v, int32_t budget, bool add_chars,
                         tt_merge **mg, size_t *nm, cllm_tokenizer_train_stats *stats) {
    tt_wordmap words = {0};
    tt_corpus corpus = {0};
    double t0 = cllm_time_sec();
    size_t n_bytes = 0;
    cllm_status st = tt_count_words(tok, files, n_files, p->n_workers, &words, &n_bytes);
    if (st) goto done;
    stats->n_words = words.n;
    stats->n_bytes = n_bytes;
    stats->seconds_count = cllm_time_sec() - t0;
    t0 = cllm_time_sec();
    int32_t n_chars = 0;
    double cov = p->character_coverage > 0 ? p->character_coverage : 0.9995;
    if (add_chars && (st = add_characters(v, &words, cov, budget, &n_chars))) goto done;
    if ((st = build_corpus(&corpus, &words, v, tok->byte_level))) goto done;
    tt_wordmap_free(&words);
    if ((st = tt_apply_merges(&corpus, &tok->merges))) goto done;
    int32_t made = 0;
    if ((st = tt_learn(&corpus, v, budget - n_chars, p->min_frequency, mg, nm, &made))) goto done;
    stats->n_merges = *nm;
    stats->seconds_merge = cllm_time_sec() - t0;
    if (n_chars + made < budget)
        cllm_log(CLLM_LOG_WARN,
                 "tokenizer training: only %d of %d new tokens could be learned (no pair occurs %lld times or "
                 "more in the remaining text); use more text or a lower --min-frequency",
                 n_chars + made, budget, (long long)(p->min_frequency < 1 ? 1 : p->min_frequency));
done:
    tt_wordmap_free(&words);
    tt_corpus_free(&corpus);
    return st;
}

static cllm_status check_common(const char *const *files, int n_files, const cllm_tokenizer_train_params *p,
                                const char *out_dir) {
    if (!files || n_files <= 0) return CLLM_FAIL(CLLM_ERR_ARG, "no input files");
    if (!p || !out_dir || !*out_dir) return CLLM_FAIL(CLLM_ERR_ARG, "params and out_dir must be given");
    if (p->character_coverage < 0 || p->character_coverage > 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "character_coverage %g must be in (0, 1]", p->character_coverage);
    for (int i = 0; i < n_files; i++) {
        struct stat sb;
        if (!files[i] || stat(files[i], &sb) != 0)
            return CLLM_FAIL(CLLM_ERR_IO, "cannot read input '%s': %s", files[i] ? files[i] : "(null)",
                             strerror(errno));
        if (S_ISDIR(sb.st_mode)) return CLLM_FAIL(CLLM_ERR_IO, "input '%s' is a folder, not a text file", files[i]);
    }
    return CLLM_OK;
}

/* ------------------------------------------------------------------ train */

static json_t *added_token(int32_t id, const char *s) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)id, "content", s, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *make_config(bool sp, const char *const *specials, int n_special) {
    json_t *cfg = json_object(), *extra = json_array();
    if (!cfg || !extra) {
        json_decref(cfg);
        json_decref(extra);
        return NULL;
    }
    json_object_set_new(cfg, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    if (sp) {
        json_object_set_new(cfg, "bos_token", json_string("<s>"));
        json_object_set_new(cfg, "eos_token", json_string("</s>"));
        json_object_set_new(cfg, "unk_token", json_string("<unk>"));
        json_object_set_new(cfg, "pad_token", json_null());
    } else if (n_special > 0) {
        json_object_set_new(cfg, "bos_token", json_string(specials[0]));
        json_object_set_new(cfg, "eos_token", json_string(specials[0]));
        json_object_set_new(cfg, "unk_token", json_string(specials[0]));
    }
    for (int i = sp ? 3 : 1; i < n_special; i++) json_array_append_new(extra, json_string(specials[i]));
    json_object_set_new(cfg, "additional_special_tokens", extra);
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    return cfg;
}

cllm_status cllm_tokenizer_train(const char *const *files, int n_files, const cllm_tokenizer_train_params *p,
                                 const char *out_dir, cllm_tokenizer_train_stats *stats) {
    cllm_tokenizer_train_stats dummy;
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof *stats);
    cllm_status st = check_common(files, n_files, p, out_dir);
    if (st) return st;
    bool sp = p->type == CLLM_TOKENIZER_SP_BPE;
    if (p->type != CLLM_TOKENIZER_BYTE_BPE && !sp) return CLLM_FAIL(CLLM_ERR_ARG, "unknown tokenizer type %d", (int)p->type);
    /* the special tokens, deduplicated, in order */
    static const char *const byte_default[] = {"<|endoftext|>"};
    static const char *const sp_first[] = {"<unk>", "<s>", "</s>"};
    const char *const *user = p->special_tokens ? p->special_tokens : sp ? NULL : byte_default;
    int n_user = p->special_tokens ? p->n_special : sp ? 0 : 1;
    if (n_user < 0 || n_user > 100000) return CLLM_FAIL(CLLM_ERR_ARG, "bad number of special tokens %d", n_user);
    const char **specials = malloc(((size_t)n_user + 3) * sizeof *specials);
    if (!specials) return NOMEM();
    int ns = 0;
    for (int i = 0; i < (sp ? 3 : 0); i++) specials[ns++] = sp_first[i];
    for (int i = 0; i < n_user; i++) {
        if (!user[i] || !*user[i]) {
            free(specials);
            return CLLM_FAIL(CLLM_ERR_ARG, "special token %d is empty", i + 1);
        }
        bool dup = false;
        for (int k = 0; k < ns && !dup; k++) dup = strcmp(specials[k], user[i]) == 0;
        if (!dup) specials[ns++] = user[i];
    }
    int32_t min_vocab = ns + 256 + (sp ? 1 : 0);
    if (p->vocab_size < min_vocab || p->vocab_size > MAX_VOCAB) {
        st = CLLM_FAIL(CLLM_ERR_ARG,
                       "vocab size %d is %s: the %d special tokens and 256 byte tokens%s need at least %d (at most %d)",
                       p->vocab_size, p->vocab_size < min_vocab ? "too small" : "too large", ns,
                       sp ? " plus U+2581" : "", min_vocab, MAX_VOCAB);
        free(specials);
        return st;
    }

    json_t *root = NULL, *cfg = NULL;
    cllm_tokenizer *tok = NULL;
    tt_vocab v;
    tt_merge *mg = NULL;
    size_t nm = 0;
    bool vinit = tt_vocab_init(&v, (size_t)p->vocab_size * 2);
    json_error_t jerr;
    root = json_loads(sp ? SP_SKELETON : BYTE_SKELETON, 0, &jerr);
    if (!vinit || !root) {
        st = root ? NOMEM() : CLLM_FAIL(CLLM_ERR_INTERNAL, "tokenizer skeleton: %s", jerr.text);
        goto done;
    }
    json_t *added = json_object_get(root, "added_tokens"), *model = json_object_get(root, "model");
    bool ok = true;
    for (int i = 0; i < ns && ok; i++) {
        ok = tt_vocab_set(&v, i, specials[i], strlen(specials[i])) && json_array_append_new(added, added_token(i, specials[i])) == 0;
        if (ok) v.reserved[i] = 1;
    }
    for (int b = 0; b < 256 && ok; b++) {
        char t[8];
        size_t tl = sp ? (size_t)snprintf(t, sizeof t, "<0x%02X>", b) : tk_utf8_put(t, tk_byte_to_cp((uint8_t)b));
        if (tk_strmap_get(&v.map, t, tl) >= 0) continue; /* a special token spelled like a byte symbol */
        ok = tt_vocab_set(&v, v.n, t, tl);
        if (ok && sp) v.reserved[v.n - 1] = 1;
    }
    if (ok && sp && tk_strmap_get(&v.map, SP, 3) < 0) ok = tt_vocab_set(&v, v.n, SP, 3);
    if (!ok || (st = append_model(model, &v, 0, NULL, 0, false))) {
        st = st ? st : NOMEM();
        goto done;
    }
    if ((st = tk_load_from_json(&tok, root, NULL, "trained tokenizer"))) goto done;
    int32_t base_n = v.n;
    if ((st = learn(tok, files, n_files, p, &v, p->vocab_size - v.n, sp, &mg, &nm, stats))) goto done;
    if ((st = append_model(model, &v, base_n, mg, nm, false))) goto done;
    stats->vocab_size = v.n;
    if (!(cfg = make_config(sp, specials, ns))) {
        st = NOMEM();
        goto done;
    }
    if ((st = cllm_make_dirs(out_dir)) || (st = write_tokenizer_json(root, out_dir))) goto done;
    char *cpath = join_path(out_dir, "tokenizer_config.json");
    st = cpath ? cllm_json_save_file(cfg, cpath) : NOMEM();
    free(cpath);
done:
    if (vinit) tt_vocab_free(&v);
    free(mg);
    cllm_tokenizer_free(tok);
    json_decref(root);
    json_decref(cfg);
    free(specials);
    return st;
}

/* ----------------------------------------------------------------- extend */

/* Copies base/name to out/name if it exists. */
static cllm_status copy_optional(const char *base, const char *out, const char *name) {
    char *src = join_path(base, name), *dst = join_path(out, name), *data = NULL;
    size_t len = 0;
    cllm_status st = (src && dst) ? CLLM_OK : NOMEM();
    struct stat sb;
    if (!st && stat(src, &sb) == 0) {
        st = cllm_read_file(src, &data, &len);
        if (!st) st = cllm_write_file_atomic(dst, data, len);
    }
    free(data);
    free(src);
    free(dst);
    return st;
}

cllm_status cllm_tokenizer_extend(const char *base, const char *const *files, int n_files,
                                  const cllm_tokenizer_train_params *p, const char *out_dir,
                                  cllm_tokenizer_train_stats *stats) {
    cllm_tokenizer_train_stats dummy;
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof *stats);
    cllm_status st = check_common(files, n_files, p, out_dir);
    if (st) return st;
    if (!base) return CLLM_FAIL(CLLM_ERR_ARG, "no base tokenizer");
    if (p->n_add < 1 || p->n_add > MAX_VOCAB)
        return CLLM_FAIL(CLLM_ERR_ARG, "the number of tokens to add (%d) must be in [1, %d]", p->n_add, MAX_VOCAB);
    char *jpath = join_path(base, "tokenizer.json"), *cpath = join_path(base, "tokenizer_config.json");
    json_t *root = NULL, *cfg = NULL;
    cllm_tokenizer *tok = NULL;
    tt_vocab v;
    bool vinit = false;
    tt_merge *mg = NULL;
    size_t nm = 0;
    if (!jpath || !cpath) {
        st = NOMEM();
        goto done;
    }
    if ((st = tk_json_load(&root, jpath, 0, false)) || (st = tk_json_load(&cfg, cpath, JSON_DECODE_INT_AS_REAL, true)) ||
        (st = tk_load_from_json(&tok, root, cfg, jpath)))
        goto done;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!(vinit = tt_vocab_init(&v, json_object_size(vocab) + (size_t)p->n_add * 2)) || !vocab_from_json(&v, vocab)) {
        st = NOMEM();
        goto done;
    }
    if (tok->n_ids > MAX_VOCAB - p->n_add) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "%s: %d + %d tokens is too many", jpath, tok->n_ids, p->n_add);
        goto done;
    }
    /* ids after the largest in use (added tokens past the model vocabulary
     * included); added tokens and byte-fallback tokens are never produced
     * by a merge */
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id < v.n) v.reserved[tok->added[i].id] = 1;
    for (int b = 0; b < 256; b++)
        if (tok->byte_fallback && tok->byte_fb[b] >= 0 && tok->byte_fb[b] < v.n) v.reserved[tok->byte_fb[b]] = 1;
    while (v.n < tok->n_ids) {
        int32_t id = v.n;
        if (!tt_vocab_set(&v, id, "", 0)) {
            st = NOMEM();
            goto done;
        }
        v.off[id] = UINT64_MAX;
        v.reserved[id] = 1;
    }
    int32_t base_n = v.n;
    bool as_strings = json_array_size(merges) > 0 && json_is_string(json_array_get(merges, 0));
    if ((st = learn(tok, files, n_files, p, &v, p->n_add, !tok->byte_level, &mg, &nm, stats))) goto done;
    if ((st = append_model(model, &v, base_n, mg, nm, as_strings))) goto done;
    stats->vocab_size = v.n;
    if ((st = cllm_make_dirs(out_dir)) || (st = write_tokenizer_json(root, out_dir)) ||
        (st = copy_optional(base, out_dir, "tokenizer_config.json")) ||
        (st = copy_optional(base, out_dir, "special_tokens_map.json")))
        goto done;
done:
    if (vinit) tt_vocab_free(&v);
    free(mg);
    cllm_tokenizer_free(tok);
    json_decref(root);
    json_decref(cfg);
    free(jpath);
    free(cpath);
    return st;
}
