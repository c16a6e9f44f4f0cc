/*
 * Reading Megatron MMIDIDX datasets (PREFIX.idx + PREFIX.bin) and cllm's
 * loss-mask side file (PREFIX.mask). Byte layouts: docs/formats/
 * indexed-dataset.md. Summary:
 *   .idx  "MMIDIDX\0\0" | u64 version=1 | u8 dtype | u64 n_seq | u64 n_doc+1
 *         | i32 lengths[n_seq] | i64 byte pointers[n_seq] | i64 doc index[n_doc+1]
 *   .bin  tokens back to back (dtype of the .idx)
 *   .mask "CLLMMASK" | u32 version=1 | u32 flags | u32 seq_len | i32 pad_id
 *         | u64 n_seq | u64 n_tokens | u64 bin bytes | u64 FNV-1a of lengths
 *         | f64 split[3] | loss bitmap, bit i = token i (LSB first)
 * The .idx is read into aligned arrays (its int32/int64 arrays start at the
 * unaligned offset 34); the .bin and .mask are mapped. Everything is
 * checked against the file sizes before use, and the .idx must describe the
 * .bin exactly (contiguous pointers ending at its size): a stale or foreign
 * .idx is refused rather than read out of bounds.
 * Writing lives in prepare.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_impl.h"

void cllm_put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
void cllm_put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
uint32_t cllm_get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
uint64_t cllm_get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

uint64_t cllm_lengths_hash(const int32_t *lengths, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char b[4];
        cllm_put_u32(b, (uint32_t)lengths[i]);
        for (int k = 0; k < 4; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    }
    return h;
}

static size_t dtype_size(int code) {
    switch (code) {
    case MMI_U8: case MMI_I8: return 1;
    case MMI_I16: case MMI_U16: return 2;
    case MMI_I32: return 4;
    case MMI_I64: return 8;
    default: return 0;
    }
}

void cllm_indexed_close(cllm_indexed *d) {
    if (!d) return;
    for (int i = 0; i < 3; i++)
        if (d->maps[i]) munmap(d->maps[i], d->map_len[i]);
    free(d->own_lengths);
    free(d->own_pointers);
    free(d->own_docs);
    free(d->prefix);
    memset(d, 0, sizeof *d);
}

/* Maps path read-only; *len = 0 and *map = NULL for an empty file. */
static cllm_status map_file(const char *path, void **map, size_t *len, bool *missing) {
    *map = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (missing && errno == ENOENT) {
            *missing = true;
            return CLLM_OK;
        }
        return CLLM_FAIL(CLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat sb;
    cllm_status st = CLLM_OK;
    if (fstat(fd, &sb) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    } else if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            st = CLLM_FAIL(CLLM_ERR_IO, "cannot map %s: %s", path, strerror(errno));
        else {
            *map = p;
            *len = (size_t)sb.st_size;
        }
    }
    close(fd);
    return st;
}

static char *cat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 1);
    if (p) {
        memcpy(p, a, la);
        memcpy(p + la, b, lb + 1);
    }
    return p;
}

static cllm_status read_idx(cllm_indexed *d, const char *path, const unsigned char *p, size_t len) {
    if (len < 34 || memcmp(p, "MMIDIDX\0\0", 9) != 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: not a Megatron MMIDIDX index (bad magic or too short)", path);
    uint64_t version = cllm_get_u64(p + 9);
    if (version != 1)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: MMIDIDX version %llu is not supported (expected 1)", path,
                         (unsigned long long)version);
    d->dtype = p[17];
    d->item = dtype_size(d->dtype);
    if (!d->item)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: token dtype code %d is not an integer type (1-5, 8)", path,
                         d->dtype);
    uint64_t n = cllm_get_u64(p + 18), nd = cllm_get_u64(p + 26);
    /* Sizes before allocating: 12 bytes per sequence, 8 per document entry;
     * Megatron's multimodal variant appends one mode byte per sequence. */
    uint64_t avail = len - 34;
    if (n > avail / 12 || nd > avail / 8 || nd == 0 || 12 * n + 8 * nd > avail ||
        (avail != 12 * n + 8 * nd && avail != 13 * n + 8 * nd))
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: header says %llu sequences and %llu document entries, which does not match the "
                         "file size %zu",
                         path, (unsigned long long)n, (unsigned long long)nd, len);
    d->n_seq = n;
    d->n_doc = nd - 1;
    d->own_lengths = malloc((n ? n : 1) * sizeof(int32_t));
    d->own_pointers = malloc((n ? n : 1) * sizeof(int64_t));
    d->own_docs = malloc(nd * sizeof(int64_t));
    if (!d->own_lengths || !d->own_pointers || !d->own_docs)
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading %s", path);
    const unsigned char *q = p + 34;
    for (uint64_t i = 0; i < n; i++) d->own_lengths[i] = (int32_t)cllm_get_u32(q + 4 * i);
    q += 4 * n;
    for (uint64_t i = 0; i < n; i++) d->own_pointers[i] = (int64_t)cllm_get_u64(q + 8 * i);
    q += 8 * n;
    for (uint64_t i = 0; i < nd; i++) d->own_docs[i] = (int64_t)cllm_get_u64(q + 8 * i);
    d->lengths = d->own_lengths;
    d->pointers = d->own_pointers;
    d->docs = d->own_docs;
    if (d->docs[0] != 0 || (uint64_t)d->docs[nd - 1] != n)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: document index must run from 0 to the sequence count %llu", path,
                         (unsigned long long)n);
    for (uint64_t i = 1; i < nd; i++)
        if (d->docs[i] < d->docs[i - 1])
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: document index entry %llu goes backwards", path,
                             (unsigned long long)i);
    return CLLM_OK;
}

static cllm_status check_bin(cllm_indexed *d, const char *idx, const char *bin) {
    uint64_t pos = 0;
    for (uint64_t i = 0; i < d->n_seq; i++) {
        if (d->lengths[i] < 0)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: sequence %llu has negative length %d", idx, (unsigned long long)i,
                             d->lengths[i]);
        if ((uint64_t)d->pointers[i] != pos)
            return CLLM_FAIL(CLLM_ERR_FORMAT,
                             "%s does not match %s: sequence %llu starts at byte %lld, expected %llu (sequences "
                             "must be back to back; was the .idx written for another .bin?)",
                             idx, bin, (unsigned long long)i, (long long)d->pointers[i], (unsigned long long)pos);
        uint64_t bytes = (uint64_t)d->lengths[i] * d->item;
        if (bytes > d->bin_bytes - pos)
            return CLLM_FAIL(CLLM_ERR_FORMAT,
                             "%s does not match %s: sequence %llu (%d tokens at byte %llu) runs past the end of the "
                             ".bin (%llu bytes)",
                             idx, bin, (unsigned long long)i, d->lengths[i], (unsigned long long)pos,
                             (unsigned long long)d->bin_bytes);
        pos += bytes;
    }
    if (pos != d->bin_bytes)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s does not match %s: the index describes %llu bytes of tokens but the .bin has %llu",
                         idx, bin, (unsigned long long)pos, (unsigned long long)d->bin_bytes);
    d->n_tokens = pos / d->item;
    return CLLM_OK;
}

static double get_f64(const unsigned char *p) {
    uint64_t u = cllm_get_u64(p);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static cllm_status check_mask(cllm_indexed *d, const char *path, const unsigned char *p, size_t len) {
    if (len < CLLM_MASK_HEADER || memcmp(p, CLLM_MASK_MAGIC, 8) != 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: not a cllm loss-mask file (bad magic or too short)", path);
    uint32_t version = cllm_get_u32(p + 8);
    if (version != CLLM_MASK_VERSION)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: mask version %u is not supported (expected %u)", path, version,
                         CLLM_MASK_VERSION);
    d->flags = cllm_get_u32(p + 12);
    d->seq_len = cllm_get_u32(p + 16);
    d->pad_id = (int32_t)cllm_get_u32(p + 20);
    uint64_t n_seq = cllm_get_u64(p + 24), n_tok = cllm_get_u64(p + 32), bin = cllm_get_u64(p + 40),
             hash = cllm_get_u64(p + 48);
    for (int i = 0; i < 3; i++) d->split[i] = get_f64(p + 56 + 8 * i);
    if (n_seq != d->n_seq || n_tok != d->n_tokens || bin != d->bin_bytes ||
        hash != cllm_lengths_hash(d->lengths, d->n_seq))
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s does not belong to %s.idx/.bin (sequence count, token count, size or length checksum "
                         "differ); prepare the dataset again",
                         path, d->prefix);
    const bool pairs = (d->flags & CLLM_MASK_FLAG_PAIRS) != 0;
    uint64_t tail = pairs && (d->flags & CLLM_MASK_FLAG_MARGINS) ? 4 * (n_seq / 2) : 0;
    if (len - CLLM_MASK_HEADER != (n_tok + 7) / 8 + tail)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: bitmap%s holds %zu bytes, expected %llu", path,
                         tail ? " and margins" : "", len - CLLM_MASK_HEADER,
                         (unsigned long long)((n_tok + 7) / 8 + tail));
    if (pairs) { /* documents are pairs of sequences */
        bool ok = d->n_seq % 2 == 0 && d->n_doc == d->n_seq / 2;
        for (uint64_t i = 0; ok && i <= d->n_doc; i++) ok = (uint64_t)d->docs[i] == 2 * i;
        if (!ok)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a preference dataset whose documents are not pairs of sequences",
                             path);
    }
    d->mask = p + CLLM_MASK_HEADER;
    if (tail) d->margins = d->mask + (n_tok + 7) / 8;
    return CLLM_OK;
}

cllm_status cllm_indexed_open(cllm_indexed *d, const char *prefix) {
    memset(d, 0, sizeof *d);
    d->pad_id = -1;
    d->flags = CLLM_MASK_FLAG_PACKED; /* a plain Megatron dataset is pretraining text */
    char *idx = cat(prefix, ".idx"), *bin = cat(prefix, ".bin"), *msk = cat(prefix, ".mask");
    d->prefix = cat(prefix, "");
    cllm_status st = CLLM_OK;
    if (!idx || !bin || !msk || !d->prefix) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = map_file(idx, &d->maps[0], &d->map_len[0], NULL))) goto done;
    if ((st = read_idx(d, idx, d->maps[0], d->map_len[0]))) goto done;
    munmap(d->maps[0], d->map_len[0]);
    d->maps[0] = NULL;
    if ((st = map_file(bin, &d->maps[1], &d->map_len[1], NULL))) goto done;
    d->bin = d->maps[1];
    d->bin_bytes = d->map_len[1];
    if ((st = check_bin(d, idx, bin))) goto done;
    bool missing = false;
    if ((st = map_file(msk, &d->maps[2], &d->map_len[2], &missing))) goto done;
    if (!missing) st = check_mask(d, msk, d->maps[2], d->map_len[2]);
done:
    free(idx);
    free(bin);
    free(msk);
    if (st) cllm_indexed_close(d);
    return st;
}

int32_t cllm_indexed_token(const cllm_indexed *d, uint64_t i) {
    const unsigned char *p = d->bin + i * d->item;
    switch (d->dtype) {
    case MMI_U8: return p[0];
    case MMI_I8: return (int8_t)p[0];
    case MMI_I16: return (int16_t)(uint16_t)(p[0] | p[1] << 8);
    case MMI_U16: return (int32_t)(uint16_t)(p[0] | p[1] << 8);
    case MMI_I32: return (int32_t)cllm_get_u32(p);
    case MMI_I64: {
        int64_t v = (int64_t)cllm_get_u64(p);
        return v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v;
    }
    default: return -1;
    }
}

bool cllm_indexed_loss(const cllm_indexed *d, uint64_t i) { return !d->mask || (d->mask[i >> 3] >> (i & 7) & 1); }

float cllm_indexed_margin(const cllm_indexed *d, uint64_t pair) {
    if (!d->margins) return 0;
    uint32_t u = cllm_get_u32(d->margins + 4 * pair);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}
