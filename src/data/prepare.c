/*
 * cllm_prepare: the ordered, bounded tokenizing pipeline and the writer of
 * PREFIX.bin / .idx / .mask.
 *
 * The calling thread reads records into chunks (at most CHUNK_BYTES of
 * record text each) and writes finished chunks in input order; `workers`
 * threads parse and tokenize whole chunks. There are 2 x workers chunk
 * slots, so at most that many chunks exist at once whatever the input size,
 * and since chunks are written strictly in order the output is the same
 * with 1 or N workers. Bad records are counted by the writer, in order, so
 * --skip-bad decisions are deterministic too.
 * Not here: record syntax (records.c, sample.c), reading datasets back
 * (indexed.c, loader.c).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/prepare.h"
#include "cllm/tokenizer.h"
#include "data/data_impl.h"
#include "io/io_impl.h"

#define CHUNK_BYTES ((size_t)4 << 20)
#define CHUNK_RECORDS 16384

enum { SLOT_FREE = 0, SLOT_FILLED, SLOT_BUSY, SLOT_DONE };

typedef struct {
    size_t off, len;
    cllm_loc loc;
    cllm_rec_kind kind;
    /* results */
    size_t tok_off, n_tok;
    cllm_sample_type type;
    cllm_status st;
    char *err;
} rec_slot;

typedef struct {
    int state;
    char *text;
    size_t len, cap;
    rec_slot *recs;
    size_t n, cap_recs;
    cllm_token_buf ids, labels;
} chunk;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    chunk *slots;
    int n_slots;
    bool stop;
    cllm_encoder enc;
} pipeline;

/* ------------------------------------------------------------- workers */

static void chunk_reset(chunk *c) {
    for (size_t i = 0; i < c->n; i++) free(c->recs[i].err);
    c->len = 0;
    c->n = 0;
    c->ids.n = c->labels.n = 0;
}

static void chunk_free(chunk *c) {
    chunk_reset(c);
    free(c->text);
    free(c->recs);
    cllm_token_buf_free(&c->ids);
    cllm_token_buf_free(&c->labels);
}

static char *dup_msg(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Tokenizes every record of a chunk; per-record failures are kept for the
 * writer. */
static void process(const cllm_encoder *e, chunk *c) {
    cllm_sample smp = {0};
    for (size_t i = 0; i < c->n; i++) {
        rec_slot *r = &c->recs[i];
        cllm_record rec = {r->kind, c->text + r->off, r->len, r->loc};
        r->tok_off = c->ids.n;
        r->st = cllm_record_encode(e, &rec, &smp, &c->ids, &c->labels, &r->type);
        if (!r->st && r->type == CLLM_SAMPLE_TOKENS) {
            /* A prepared dataset keeps a loss mask, not free-form labels. */
            for (size_t k = r->tok_off; k < c->ids.n; k++)
                if (c->labels.ids[k] != -100 && c->labels.ids[k] != c->ids.ids[k]) {
                    r->st = cllm_fail_at(CLLM_ERR_FORMAT, r->loc.file, r->loc.line, r->loc.col,
                                         "labels[%zu] is neither -100 nor input_ids[%zu]; a prepared dataset stores "
                                         "a loss mask, not other labels",
                                         k - r->tok_off, k - r->tok_off);
                    c->ids.n = c->labels.n = r->tok_off;
                    break;
                }
        }
        if (r->st) {
            r->err = dup_msg(cllm_last_error());
            c->ids.n = c->labels.n = r->tok_off;
        }
        r->n_tok = c->ids.n - r->tok_off;
    }
    cllm_sample_free(&smp);
}

static void *worker(void *arg) {
    pipeline *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int pick = -1;
        for (int i = 0; i < p->n_slots && pick < 0; i++)
            if (p->slots[i].state == SLOT_FILLED) pick = i;
        if (pick < 0) {
            if (p->stop) break;
            pthread_cond_wait(&p->work, &p->mu);
            continue;
        }
        p->slots[pick].state = SLOT_BUSY;
        pthread_mutex_unlock(&p->mu);
        process(&p->enc, &p->slots[pick]);
        pthread_mutex_lock(&p->mu);
        p->slots[pick].state = SLOT_DONE;
        pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* -------------------------------------------------------------- reading */

typedef struct {
    const cllm_prepare_opts *o;
    int file;
    cllm_record_reader *rd;
    uint64_t bytes_done;
    bool eof;
} input;

static cllm_status chunk_add(chunk *c, const cllm_record *rec) {
    if (c->len + rec->len + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : CHUNK_BYTES + 4096;
        while (cap < c->len + rec->len + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        c->text = t;
        c->cap = cap;
    }
    if (c->n == c->cap_recs) {
        size_t cap = c->cap_recs ? c->cap_recs * 2 : 1024;
        rec_slot *r = realloc(c->recs, cap * sizeof *r);
        if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        c->recs = r;
        c->cap_recs = cap;
    }
    memcpy(c->text + c->len, rec->text, rec->len);
    c->text[c->len + rec->len] = '\0';
    c->recs[c->n++] = (rec_slot){.off = c->len, .len = rec->len, .loc = rec->loc, .kind = rec->kind};
    c->len += rec->len + 1;
    return CLLM_OK;
}

/* Fills a chunk with the next records of the inputs. */
static cllm_status fill(input *in, chunk *c) {
    chunk_reset(c);
    while (!in->eof && c->len < CHUNK_BYTES && c->n < CHUNK_RECORDS) {
        if (!in->rd) {
            if (in->file == in->o->n_inputs) {
                in->eof = true;
                break;
            }
            cllm_status st = cllm_records_open(&in->rd, in->o->inputs[in->file]);
            if (st) return st;
        }
        cllm_record rec;
        bool got;
        cllm_status st = cllm_records_next(in->rd, &rec, &got);
        if (st) return st;
        if (!got) {
            in->bytes_done += cllm_records_bytes(in->rd);
            cllm_records_close(in->rd);
            in->rd = NULL;
            in->file++;
            continue;
        }
        rec.loc.file = in->o->inputs[in->file]; /* outlives the reader */
        if ((st = chunk_add(c, &rec))) return st;
    }
    return CLLM_OK;
}

/* -------------------------------------------------------------- writing */

typedef struct {
    const cllm_prepare_opts *o;
    cllm_prepare_report *r;
    cllm_io_atomic bin;
    bool bin_open;
    int dtype;
    int32_t *lengths;
    uint64_t n_seq, cap_seq;
    unsigned char *mask;
    uint64_t n_tok, cap_mask;
    unsigned char *buf;
    size_t buf_cap;
    float *margins; /* pairs: per pair, when a record has one (NULL: none) */
} writer;

/* Appends one sequence: its tokens to the .bin, its loss bits (labels not
 * -100) to the mask, its length to the index. *any: a token is trained. */
static cllm_status write_row(writer *w, const int32_t *ids, const int32_t *lab, size_t n, bool *any) {
    size_t item = w->dtype == MMI_U16 ? 2 : 4;
    if (n * item > w->buf_cap) {
        size_t cap = n * item * 2;
        unsigned char *b = realloc(w->buf, cap);
        if (!b) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        w->buf = b;
        w->buf_cap = cap;
    }
    if (w->n_tok + n > w->cap_mask * 8) {
        uint64_t cap = w->cap_mask ? w->cap_mask * 2 : 1 << 16;
        while (cap * 8 < w->n_tok + n) cap *= 2;
        unsigned char *m = realloc(w->mask, cap);
        if (!m) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the loss mask");
        memset(m + w->cap_mask, 0, cap - w->cap_mask);
        w->mask = m;
        w->cap_mask = cap;
    }
    *any = false;
    for (size_t k = 0; k < n; k++) {
        uint32_t v = (uint32_t)ids[k];
        if (item == 2) {
            w->buf[2 * k] = (unsigned char)v;
            w->buf[2 * k + 1] = (unsigned char)(v >> 8);
        } else {
            cllm_put_u32(w->buf + 4 * k, v);
        }
        if (lab[k] != -100) {
            uint64_t t = w->n_tok + k;
            w->mask[t >> 3] |= (unsigned char)(1u << (t & 7));
            *any = true;
        }
    }
    cllm_status st = cllm_io_atomic_write(&w->bin, w->buf, n * item);
    if (st) return st;
    if (w->n_seq == w->cap_seq) {
        uint64_t cap = w->cap_seq ? w->cap_seq * 2 : 4096;
        int32_t *l = realloc(w->lengths, cap * sizeof *l);
        if (!l) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        w->lengths = l;
        w->cap_seq = cap;
    }
    w->lengths[w->n_seq++] = (int32_t)n;
    w->n_tok += n;
    return CLLM_OK;
}

static cllm_status write_chunk(writer *w, const chunk *c) {
    const cllm_prepare_opts *o = w->o;
    for (size_t i = 0; i < c->n; i++) {
        const rec_slot *rs = &c->recs[i];
        if (rs->st) {
            if ((long)w->r->bad >= o->skip_bad)
                return cllm_fail_again(rs->st, rs->err ? rs->err : "bad record", rs->loc.file,
                                       o->skip_bad > 0 ? " (more bad records than --skip-bad allows)" : "");
            if (w->r->bad < CLLM_PREPARE_MAX_REPORTED)
                snprintf(w->r->bad_where[w->r->bad], sizeof w->r->bad_where[0], "%s",
                         rs->err ? rs->err : "bad record");
            w->r->bad++;
            continue;
        }
        size_t n = rs->n_tok;
        if (!o->pack && o->seq_len > 0 && n > (size_t)o->seq_len) {
            uint64_t cut = n - (size_t)o->seq_len;
            w->r->truncated++;
            w->r->tokens_cut += cut;
            if (cut > w->r->max_cut) w->r->max_cut = cut;
            n = (size_t)o->seq_len;
        }
        if (n > INT32_MAX) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a record has more than 2^31 tokens");
        const int32_t *ids = c->ids.ids + rs->tok_off, *lab = c->labels.ids + rs->tok_off;
        bool any = false;
        cllm_status st = write_row(w, ids, lab, n, &any);
        if (st) return st;
        w->r->records++;
        w->r->by_type[rs->type]++;
        w->r->no_loss += !any;
    }
    return CLLM_OK;
}

/* Preference pairs (o->pairs): each input read as the trainer reads a
 * preference file (src/data/pairs.c: the same rows, keep_end at seq_len),
 * each pair written as two sequences, chosen then rejected; margins kept. */
static cllm_status write_pairs(writer *w, int vocab) {
    const cllm_prepare_opts *o = w->o;
    cllm_status st = CLLM_OK;
    uint64_t cap = 0;
    for (int f = 0; f < o->n_inputs && !st; f++) {
        cllm_store mem = {0};
        cllm_pair_extra ex = {NULL, NULL};
        int32_t pad;
        if (o->cancel && *o->cancel) st = CLLM_FAIL(CLLM_ERR_IO, "interrupted; %s was left as it was", o->out_prefix);
        if (!st) st = cllm_pairs_load(&mem, &pad, &ex, false, o->inputs[f], o->tokenizer, vocab,
                                      o->seq_len > 0 ? o->seq_len : INT32_MAX);
        for (size_t i = 0; i < mem.n && !st; i++) {
            uint64_t a = mem.offsets[i], n = mem.offsets[i + 1] - a;
            bool any;
            st = write_row(w, mem.tokens + a, mem.labels + a, (size_t)n, &any);
            if (st || i % 2) continue;
            uint64_t pair = (w->n_seq - 1) / 2;
            if (pair >= cap) {
                uint64_t c = cap ? 2 * cap : 1024;
                float *m = realloc(w->margins, c * sizeof *m);
                if (!m) {
                    st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                    break;
                }
                memset(m + cap, 0, (c - cap) * sizeof *m);
                w->margins = m;
                cap = c;
            }
            w->margins[pair] = ex.margin ? ex.margin[i] : 0.0f;
            w->r->records++;
        }
        free(ex.margin);
        free(ex.single);
        cllm_store_free(&mem);
    }
    return st;
}

static cllm_status put_u32(cllm_io_atomic *a, uint32_t v) {
    unsigned char b[4];
    cllm_put_u32(b, v);
    return cllm_io_atomic_write(a, b, 4);
}

static cllm_status put_u64(cllm_io_atomic *a, uint64_t v) {
    unsigned char b[8];
    cllm_put_u64(b, v);
    return cllm_io_atomic_write(a, b, 8);
}

/* PREFIX.idx: Megatron's layout, fields written one by one through the
 * buffered writer (no second copy of the index in memory). On failure the
 * temporary file is gone. */
static cllm_status write_idx(const writer *w, const char *path, cllm_io_atomic *a) {
    uint64_t n = w->n_seq, pos = 0, item = w->dtype == MMI_U16 ? 2 : 4;
    cllm_status st = cllm_io_atomic_begin(a, path);
    if (st) return st;
    unsigned char code = (unsigned char)w->dtype;
    st = cllm_io_atomic_write(a, "MMIDIDX\0\0", 9);
    if (!st) st = put_u64(a, 1);
    if (!st) st = cllm_io_atomic_write(a, &code, 1);
    const uint64_t per_doc = w->o->pairs ? 2 : 1; /* pairs: a document is (chosen, rejected) */
    if (!st) st = put_u64(a, n);
    if (!st) st = put_u64(a, n / per_doc + 1);
    for (uint64_t i = 0; i < n && !st; i++) st = put_u32(a, (uint32_t)w->lengths[i]);
    for (uint64_t i = 0; i < n && !st; i++) {
        st = put_u64(a, pos);
        pos += (uint64_t)w->lengths[i] * item;
    }
    for (uint64_t i = 0; i <= n / per_doc && !st; i++) st = put_u64(a, i * per_doc);
    if (st) cllm_io_atomic_abort(a);
    return st;
}

/* PREFIX.mask: header fields one by one, then the bitmap as it is. */
static cllm_status write_mask(const writer *w, const char *path, int32_t pad, const double split[3],
                              cllm_io_atomic *a) {
    cllm_status st = cllm_io_atomic_begin(a, path);
    if (st) return st;
    st = cllm_io_atomic_write(a, CLLM_MASK_MAGIC, 8);
    if (!st) st = put_u32(a, CLLM_MASK_VERSION);
    uint32_t flags = w->o->pack ? CLLM_MASK_FLAG_PACKED : 0;
    if (w->o->pairs) flags |= CLLM_MASK_FLAG_PAIRS;
    bool margins = false;
    for (uint64_t i = 0; w->o->pairs && i < w->n_seq / 2 && !margins; i++) margins = w->margins[i] != 0.0f;
    if (margins) flags |= CLLM_MASK_FLAG_MARGINS;
    if (!st) st = put_u32(a, flags);
    if (!st) st = put_u32(a, (uint32_t)(w->o->seq_len > 0 ? w->o->seq_len : 0));
    if (!st) st = put_u32(a, (uint32_t)pad);
    if (!st) st = put_u64(a, w->n_seq);
    if (!st) st = put_u64(a, w->n_tok);
    if (!st) st = put_u64(a, w->n_tok * (w->dtype == MMI_U16 ? 2 : 4));
    if (!st) st = put_u64(a, cllm_lengths_hash(w->lengths, w->n_seq));
    for (int i = 0; i < 3 && !st; i++) {
        uint64_t u;
        memcpy(&u, &split[i], sizeof u);
        st = put_u64(a, u);
    }
    if (!st) st = cllm_io_atomic_write(a, w->mask, (size_t)((w->n_tok + 7) / 8));
    for (uint64_t i = 0; margins && i < w->n_seq / 2 && !st; i++) {
        uint32_t u;
        memcpy(&u, &w->margins[i], sizeof u);
        st = put_u32(a, u);
    }
    if (st) cllm_io_atomic_abort(a);
    return st;
}

/* ----------------------------------------------------------- the driver */

static char *cat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 1);
    if (p) {
        memcpy(p, a, la);
        memcpy(p + la, b, lb + 1);
    }
    return p;
}

cllm_status cllm_prepare(const cllm_prepare_opts *o, cllm_prepare_report *rep) {
    cllm_prepare_report local;
    cllm_prepare_report *r = rep ? rep : &local;
    memset(r, 0, sizeof *r);
    if (!o || !o->inputs || o->n_inputs <= 0 || !o->out_prefix || !o->tokenizer)
        return CLLM_FAIL(CLLM_ERR_ARG, "inputs, a tokenizer and an output prefix are required");
    if (o->workers < 1 || o->workers > 256) return CLLM_FAIL(CLLM_ERR_ARG, "workers must be in [1, 256]");
    if (o->seq_len < 0) return CLLM_FAIL(CLLM_ERR_ARG, "seq_len must not be negative");
    double t0 = cllm_time_sec();
    double split[3] = {0, 0, 0};
    cllm_status st = o->split ? cllm_split_parse(o->split, split) : CLLM_OK;
    if (st) return st;
    cllm_tokenizer *tok = NULL;
    cllm_template tmpl = {0};
    pipeline p = {0};
    writer w = {.o = o, .r = r};
    input in = {.o = o};
    pthread_t *th = NULL;
    int n_th = 0;
    bool sync_ok = false;
    char *bin = cat(o->out_prefix, ".bin"), *idx = cat(o->out_prefix, ".idx"), *msk = cat(o->out_prefix, ".mask");
    if (!bin || !idx || !msk) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = cllm_tokenizer_load(&tok, o->tokenizer))) goto done;
    if ((st = cllm_template_load(&tmpl, o->template_path))) goto done;
    /* The prefix's folder is created as every other output folder is. */
    const char *slash = strrchr(o->out_prefix, '/');
    if (slash && slash != o->out_prefix) {
        char *dir = strndup(o->out_prefix, (size_t)(slash - o->out_prefix));
        st = dir ? cllm_make_dirs(dir) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        free(dir);
        if (st) goto done;
    }
    int vocab = cllm_tokenizer_vocab_size(tok);
    w.dtype = vocab <= 65536 ? MMI_U16 : MMI_I32;
    r->dtype = w.dtype;
    if ((st = cllm_io_atomic_begin(&w.bin, bin))) goto done;
    w.bin_open = true;

    if (o->pairs) {
        if (o->pack) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "preference pairs cannot be packed");
            goto done;
        }
        if ((st = write_pairs(&w, vocab))) goto done;
        goto written;
    }
    p.enc = (cllm_encoder){tok, &tmpl, vocab};
    p.n_slots = 2 * o->workers;
    p.slots = calloc((size_t)p.n_slots, sizeof *p.slots);
    th = calloc((size_t)o->workers, sizeof *th);
    if (!p.slots || !th || pthread_mutex_init(&p.mu, NULL) || pthread_cond_init(&p.work, NULL) ||
        pthread_cond_init(&p.done, NULL)) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot set up the worker pipeline");
        goto done;
    }
    sync_ok = true;
    for (; n_th < o->workers; n_th++)
        if (pthread_create(&th[n_th], NULL, worker, &p)) {
            st = CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot start worker thread %d", n_th + 1);
            goto stop;
        }
    uint64_t next_fill = 0, next_write = 0;
    pthread_mutex_lock(&p.mu);
    while (!st) {
        chunk *wc = &p.slots[next_write % (uint64_t)p.n_slots];
        if (next_write < next_fill && wc->state == SLOT_DONE) {
            pthread_mutex_unlock(&p.mu);
            st = write_chunk(&w, wc);
            pthread_mutex_lock(&p.mu);
            wc->state = SLOT_FREE;
            next_write++;
            continue;
        }
        if (in.eof && next_write == next_fill) break;
        chunk *fc = &p.slots[next_fill % (uint64_t)p.n_slots];
        if (!in.eof && fc->state == SLOT_FREE) {
            pthread_mutex_unlock(&p.mu);
            if (o->cancel && *o->cancel)
                st = CLLM_FAIL(CLLM_ERR_IO, "interrupted; %s was left as it was", o->out_prefix);
            if (!st) st = fill(&in, fc);
            pthread_mutex_lock(&p.mu);
            if (!st && fc->n > 0) {
                fc->state = SLOT_FILLED;
                next_fill++;
                pthread_cond_signal(&p.work);
            }
            continue;
        }
        pthread_cond_wait(&p.done, &p.mu);
    }
    pthread_mutex_unlock(&p.mu);
stop:
    pthread_mutex_lock(&p.mu);
    p.stop = true;
    pthread_cond_broadcast(&p.work);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    if (st) goto done;
    r->bytes_in = in.bytes_done;
written:
    if (w.n_seq == 0) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "no records to write (%llu bad)", (unsigned long long)r->bad);
        goto done;
    }
    if (o->cancel && *o->cancel) {
        st = CLLM_FAIL(CLLM_ERR_IO, "interrupted; %s was left as it was", o->out_prefix);
        goto done;
    }
    /* All three temporary files are complete before the first rename; then
     * .bin, .idx and .mask are renamed in that order. Only a crash between
     * two renames leaves a mixed set, which the loader detects (sizes and
     * the lengths checksum) and refuses. */
    int32_t pad = cllm_tokenizer_pad_id(tok);
    if (pad < 0) pad = cllm_tokenizer_eos_id(tok);
    cllm_io_atomic ai, am;
    if ((st = write_idx(&w, idx, &ai))) goto done;
    if ((st = write_mask(&w, msk, pad, split, &am))) {
        cllm_io_atomic_abort(&ai);
        goto done;
    }
    w.bin_open = false;
    if ((st = cllm_io_atomic_commit(&w.bin))) {
        cllm_io_atomic_abort(&ai);
        cllm_io_atomic_abort(&am);
        goto done;
    }
    if ((st = cllm_io_atomic_commit(&ai))) {
        cllm_io_atomic_abort(&am);
        goto done;
    }
    if ((st = cllm_io_atomic_commit(&am))) goto done;
    r->tokens = w.n_tok;
    if (o->split) {
        uint64_t b[4];
        cllm_split_bounds(split, o->pairs ? w.n_seq / 2 : w.n_seq, b);
        for (int i = 0; i < 3; i++) r->split_docs[i] = b[i + 1] - b[i];
    }
    r->seconds = cllm_time_sec() - t0;
done:
    if (w.bin_open) cllm_io_atomic_abort(&w.bin);
    if (sync_ok) {
        pthread_mutex_destroy(&p.mu);
        pthread_cond_destroy(&p.work);
        pthread_cond_destroy(&p.done);
    }
    for (int i = 0; p.slots && i < p.n_slots; i++) chunk_free(&p.slots[i]);
    free(p.slots);
    free(th);
    cllm_records_close(in.rd);
    free(w.lengths);
    free(w.mask);
    free(w.buf);
    free(w.margins);
    cllm_template_free(&tmpl);
    cllm_tokenizer_free(tok);
    free(bin);
    free(idx);
    free(msk);
    return st;
}
