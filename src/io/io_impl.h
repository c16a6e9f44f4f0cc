/*
 * Private helpers shared by the io sources: a buffered atomic file writer
 * (temp file in the target's folder, fsync, rename, fsync of the folder),
 * errno text, the safetensors dtype spellings, and the read-buffer size for
 * streaming a file. Not part of the public API (the library's other readers
 * and writers use it too).
 */
#ifndef CLLM_IO_IMPL_H
#define CLLM_IO_IMPL_H

#include <string.h>

#include "cllm/io.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cllm/core.h"

/* An open temporary file that becomes `path` on commit. Small writes are
 * gathered in `buf`; writes of at least the buffer size go straight to the
 * file so large tensors are never copied. */
typedef struct {
    int fd;
    char *path; /* final name (owned copy) */
    char *tmp;  /* "<path>.tmp.<pid>" */
    unsigned char *buf;
    size_t len, cap;
} cllm_io_atomic;

/* Creates the temp file. On failure nothing is left behind. */
cllm_status cllm_io_atomic_begin(cllm_io_atomic *a, const char *path);
cllm_status cllm_io_atomic_write(cllm_io_atomic *a, const void *data, size_t n);
/* Flushes, fsyncs, renames over the final name and fsyncs the folder. The
 * writer is released whether or not this succeeds (on failure the temp file
 * is removed). */
cllm_status cllm_io_atomic_commit(cllm_io_atomic *a);
/* Drops the temp file and releases the writer; safe after a failed write. */
void cllm_io_atomic_abort(cllm_io_atomic *a);

/* fsync()s the folder holding `path` so a rename or unlink in it is durable. */
cllm_status cllm_io_fsync_parent(const char *path);

/* Thread-safe strerror into buf. Returns buf. */
const char *cllm_io_errstr(int err, char *buf, size_t cap);

/* "F32" -> CLLM_F32 etc. (exact, case-sensitive spelling). */
bool cllm_io_dtype_parse(const char *s, cllm_dtype *out);

/* The size of a buffer to stream the open file f through: `max`, or the
 * file's size + 1 when it is a regular file smaller than that (so a small
 * file costs a small buffer, and the read that finds its end still fits). */
size_t cllm_io_chunk(FILE *f, size_t max);

/* Joins dir + "/" + name into a malloc'd string (NULL on overflow/ENOMEM,
 * with an error recorded). */
char *cllm_io_join(const char *dir, const char *name);

/* Binary search of `name` among t[by_name[0..n)] (by_name sorted by name). */
static inline const cllm_st_tensor *st_find_sorted(const cllm_st_tensor *t, const int *by_name, int n,
                                                   const char *name) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, t[by_name[mid]].name);
        if (c == 0) return &t[by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

#endif
