/*
 * Streaming record readers for .jsonl, .json and .txt files. Memory is one
 * record (plus a 1 MiB read buffer), never the file, so a 1 GB .json array
 * streams like a .jsonl (a file smaller than the buffer gets a buffer its
 * size). Records are handed out as text with the location
 * of their first character; parsing them is sample.c's job.
 *
 * The .json scanner follows strings, escapes and nesting only to find where
 * a record ends. It accepts // and block comments and trailing commas
 * (blanked out with spaces, so jansson sees plain JSON and columns still
 * match the file) because the format description users copy from has them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "io/io_impl.h"

typedef enum { F_JSONL, F_JSON, F_TXT } file_kind;

struct cllm_record_reader {
    FILE *f;
    char *path;
    file_kind kind;
    unsigned char *blk; /* read buffer for the .json scanner */
    size_t blk_cap, blk_len, blk_pos;
    char *buf; /* current record */
    size_t len, cap;
    char *line; /* getline buffer */
    size_t line_cap;
    uint64_t line_no, col, bytes;
    int state; /* .json: 0 before '[', 1 in the array, 2 after ']' */
    bool eof;
};

#define BLK (1u << 20)

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

void cllm_records_close(cllm_record_reader *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->path);
    free(r->blk);
    free(r->buf);
    free(r->line);
    free(r);
}

uint64_t cllm_records_bytes(const cllm_record_reader *r) { return r->bytes; }

static int peek(cllm_record_reader *r) {
    if (r->blk_pos == r->blk_len) {
        if (r->eof) return -1;
        r->blk_len = fread(r->blk, 1, r->blk_cap, r->f);
        r->blk_pos = 0;
        if (r->blk_len == 0) {
            r->eof = true;
            return -1;
        }
    }
    return r->blk[r->blk_pos];
}

/* Consumes the byte peek() returned, keeping line and column. */
static void adv(cllm_record_reader *r) {
    unsigned char c = r->blk[r->blk_pos++];
    r->bytes++;
    if (c == '\n') {
        r->line_no++;
        r->col = 1;
    } else if ((c & 0xC0) != 0x80) {
        r->col++;
    }
}

static cllm_status put(cllm_record_reader *r, char c) {
    if (r->len + 2 > r->cap) {
        if (r->cap >= CLLM_RECORD_MAX)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%llu: a record is longer than %zu MiB", r->path,
                             (unsigned long long)r->line_no, CLLM_RECORD_MAX >> 20);
        size_t cap = r->cap ? r->cap * 2 : 4096;
        char *p = realloc(r->buf, cap);
        if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading %s", r->path);
        r->buf = p;
        r->cap = cap;
    }
    r->buf[r->len++] = c;
    return CLLM_OK;
}

static cllm_status here_fail(cllm_record_reader *r, const char *what) {
    return cllm_fail_at(CLLM_ERR_FORMAT, r->path, r->line_no, r->col, "%s", what);
}

/* Skips a comment whose '/' is next; with `keep`, writes it to the record
 * as spaces (newlines kept). */
static cllm_status skip_comment(cllm_record_reader *r, bool keep) {
    adv(r);
    int c = peek(r);
    if (c != '/' && c != '*') return here_fail(r, "unexpected '/' (comments are // ... or /* ... */)");
    adv(r);
    cllm_status st = CLLM_OK;
    if (keep) st = put(r, ' '), st = st ? st : put(r, ' ');
    if (c == '/') {
        while (!st && (c = peek(r)) >= 0 && c != '\n') {
            adv(r);
            if (keep && (c & 0xC0) != 0x80) st = put(r, ' ');
        }
        return st;
    }
    int prev = 0;
    while (!st) {
        c = peek(r);
        if (c < 0) return here_fail(r, "unterminated /* comment");
        adv(r);
        if (keep && (c & 0xC0) != 0x80) st = put(r, c == '\n' ? '\n' : ' ');
        if (prev == '*' && c == '/') break;
        prev = c;
    }
    return st;
}

static cllm_status skip_space(cllm_record_reader *r) {
    for (;;) {
        int c = peek(r);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            adv(r);
        } else if (c == '/') {
            cllm_status st = skip_comment(r, false);
            if (st) return st;
        } else {
            return CLLM_OK;
        }
    }
}

/* Scans one JSON value of the top-level array into r->buf. */
static cllm_status scan_value(cllm_record_reader *r) {
    int depth = 0;
    bool in_str = false;
    size_t last_sig = (size_t)-1; /* index of the last significant byte outside strings */
    r->len = 0;
    cllm_status st = CLLM_OK;
    for (;;) {
        int c = peek(r);
        if (c < 0) return here_fail(r, "unexpected end of file inside a record");
        if (in_str) {
            adv(r);
            if ((st = put(r, (char)c))) return st;
            if (c == '\\') {
                int d = peek(r);
                if (d < 0) continue;
                adv(r);
                if ((st = put(r, (char)d))) return st;
            } else if (c == '"') {
                in_str = false;
                last_sig = r->len - 1;
            }
            continue;
        }
        if (depth == 0 && r->len > 0 && (c == ',' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'))
            break; /* end of a scalar */
        if (c == '/') {
            if ((st = skip_comment(r, true))) return st;
            continue;
        }
        adv(r);
        if (c == '}' || c == ']') {
            if (last_sig != (size_t)-1 && r->buf[last_sig] == ',') r->buf[last_sig] = ' '; /* trailing comma */
            depth--;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '"') {
            in_str = true;
        }
        if ((st = put(r, (char)c))) return st;
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') last_sig = r->len - 1;
        if (depth < 0) return here_fail(r, "unbalanced closing bracket");
        if (depth == 0 && (c == '}' || c == ']')) break;
    }
    r->buf[r->len] = '\0';
    return CLLM_OK;
}

static cllm_status next_json(cllm_record_reader *r, cllm_record *rec, bool *got) {
    cllm_status st;
    if (r->state == 0) {
        if (peek(r) == 0xEF) { /* UTF-8 byte order mark */
            for (int i = 0; i < 3 && peek(r) >= 0; i++) r->blk_pos++, r->bytes++;
        }
        if ((st = skip_space(r))) return st;
        if (peek(r) != '[') return here_fail(r, "a .json data file must hold one JSON array of records");
        adv(r);
        r->state = 1;
    }
    while (r->state == 1) {
        if ((st = skip_space(r))) return st;
        int c = peek(r);
        if (c < 0) return here_fail(r, "unexpected end of file: the array is not closed with ']'");
        if (c == ']') {
            adv(r);
            r->state = 2;
            if ((st = skip_space(r))) return st;
            if (peek(r) >= 0) return here_fail(r, "unexpected text after the closing ']'");
            break;
        }
        if (c == ',') { /* separators (and stray extra commas) between records */
            adv(r);
            continue;
        }
        rec->loc = (cllm_loc){r->path, r->line_no, r->col};
        if ((st = scan_value(r))) return st;
        rec->kind = CLLM_REC_JSON;
        rec->text = r->buf;
        rec->len = r->len;
        *got = true;
        return CLLM_OK;
    }
    *got = false;
    return CLLM_OK;
}

/* Reads the next line without its line ending; false at EOF. */
static bool read_line(cllm_record_reader *r, size_t *len, cllm_status *st) {
    errno = 0;
    ssize_t n = getline(&r->line, &r->line_cap, r->f);
    if (n < 0) {
        if (ferror(r->f)) *st = CLLM_FAIL(CLLM_ERR_IO, "error reading %s: %s", r->path, strerror(errno));
        return false;
    }
    r->bytes += (uint64_t)n;
    r->line_no++;
    size_t k = (size_t)n;
    while (k && (r->line[k - 1] == '\n' || r->line[k - 1] == '\r')) k--;
    r->line[k] = '\0';
    *len = k;
    return true;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return false;
    return true;
}

static cllm_status next_jsonl(cllm_record_reader *r, cllm_record *rec, bool *got) {
    size_t n;
    cllm_status st = CLLM_OK;
    while (read_line(r, &n, &st)) {
        if (blank(r->line, n)) continue;
        size_t s = 0;
        while (r->line[s] == ' ' || r->line[s] == '\t') s++;
        if (r->line_no == 1 && n - s >= 3 && !memcmp(r->line + s, "\xEF\xBB\xBF", 3)) s += 3;
        rec->kind = CLLM_REC_JSON;
        rec->text = r->line + s;
        rec->len = n - s;
        rec->loc = (cllm_loc){r->path, r->line_no, 1 + s};
        *got = true;
        return CLLM_OK;
    }
    *got = false;
    return st;
}

static cllm_status next_txt(cllm_record_reader *r, cllm_record *rec, bool *got) {
    size_t n;
    cllm_status st = CLLM_OK;
    r->len = 0;
    uint64_t start = 0;
    while (read_line(r, &n, &st)) {
        if (blank(r->line, n)) {
            if (r->len) break;
            continue;
        }
        if (r->len == 0) start = r->line_no;
        else if ((st = put(r, '\n'))) return st;
        for (size_t i = 0; i < n && !st; i++) st = put(r, r->line[i]);
        if (st) return st;
    }
    if (st) return st;
    *got = r->len > 0;
    if (*got) {
        r->buf[r->len] = '\0';
        rec->kind = CLLM_REC_TEXT;
        rec->text = r->buf;
        rec->len = r->len;
        rec->loc = (cllm_loc){r->path, start, 1};
    }
    return CLLM_OK;
}

cllm_status cllm_records_open(cllm_record_reader **out, const char *path) {
    *out = NULL;
    file_kind kind;
    if (ends_with(path, ".jsonl")) kind = F_JSONL;
    else if (ends_with(path, ".json")) kind = F_JSON;
    else if (ends_with(path, ".txt")) kind = F_TXT;
    else
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: unknown data file type (expected .json, .jsonl or .txt)", path);
    cllm_record_reader *r = calloc(1, sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    r->kind = kind;
    r->line_no = 1;
    r->col = 1;
    r->path = malloc(strlen(path) + 1);
    if (!r->path) {
        cllm_records_close(r);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    strcpy(r->path, path);
    r->f = fopen(path, "rb");
    if (!r->f) {
        cllm_status st = CLLM_FAIL(CLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        cllm_records_close(r);
        return st;
    }
    if (kind == F_JSON) {
        r->blk_cap = cllm_io_chunk(r->f, BLK);
        if (!(r->blk = malloc(r->blk_cap))) {
            cllm_records_close(r);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
    }
    if (kind == F_JSON) {
        /* A .json file that starts with an object is JSON lines in disguise. */
        int c;
        while ((c = peek(r)) == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xEF || c == 0xBB || c == 0xBF)
            r->blk_pos++;
        if (c == '{') {
            rewind(r->f);
            r->kind = F_JSONL;
        }
        r->blk_pos = 0;
        if (r->kind == F_JSON) {
            r->blk_len = 0;
            r->eof = false;
            rewind(r->f);
        }
    }
    if (r->kind != F_JSON) r->line_no = 0;
    *out = r;
    return CLLM_OK;
}

cllm_status cllm_records_next(cllm_record_reader *r, cllm_record *rec, bool *got) {
    *got = false;
    switch (r->kind) {
    case F_JSONL: return next_jsonl(r, rec, got);
    case F_JSON: return next_json(r, rec, got);
    case F_TXT: return next_txt(r, rec, got);
    }
    return CLLM_FAIL(CLLM_ERR_INTERNAL, "bad reader kind");
}
