/*
 * cllm io: safetensors files (read by mmap, written atomically), sharded HF
 * folders (model.safetensors.index.json), JSON files with line/column
 * errors, and atomic file writes.
 *
 * Reading never trusts the file: the header length is capped, every offset,
 * dtype and shape is checked against the file size, overlapping data ranges
 * are rejected (ranges may come in any order and leave gaps), and a truncated
 * or hostile file is a CLLM_ERR_FORMAT naming the file and the tensor, never
 * a crash.
 * The on-disk layout is documented in docs/formats/safetensors.md.
 */
#ifndef CLLM_IO_H
#define CLLM_IO_H

#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CLLM_ST_MAX_DIMS 8
#define CLLM_ST_MAX_HEADER (100u * 1024u * 1024u) /* header bytes accepted */

/* One tensor of an open file. `data` points into the mapping (borrowed, valid
 * until the file or set is closed). */
typedef struct {
    const char *name;
    cllm_dtype dtype;
    int ndim;
    int64_t shape[CLLM_ST_MAX_DIMS];
    int64_t numel;
    const void *data;
    size_t nbytes;
    const char *file; /* path of the file holding it */
} cllm_st_tensor;

/* ------------------------------------------------------- one file */
typedef struct cllm_st_file cllm_st_file;

/* Maps and validates `path`. On success *out owns the mapping. */
cllm_status cllm_st_open(cllm_st_file **out, const char *path);
void cllm_st_close(cllm_st_file *f); /* NULL is a no-op */
int cllm_st_count(const cllm_st_file *f);
const cllm_st_tensor *cllm_st_at(const cllm_st_file *f, int i); /* in header order */
const cllm_st_tensor *cllm_st_find(const cllm_st_file *f, const char *name); /* NULL if absent */
/* Value of a "__metadata__" string key, or NULL. */
const char *cllm_st_metadata(const cllm_st_file *f, const char *key);

/* ---------------------------------------- a model folder (1..n files) */
/* A folder holding either model.safetensors or model.safetensors.index.json
 * with its shards (every shard named by the index must exist and hold the
 * tensors the index says; a tensor listed twice is an error). The index wins
 * when both exist. Shard names must be plain file names inside the folder.
 * cllm_st_set_at() order: weight_map order for an index, else header order.
 * A folder holding neither file is CLLM_ERR_IO; an inconsistent index
 * (missing shard or tensor) is CLLM_ERR_FORMAT. */
typedef struct cllm_st_set cllm_st_set;
cllm_status cllm_st_set_open(cllm_st_set **out, const char *dir);
void cllm_st_set_close(cllm_st_set *s);
int cllm_st_set_count(const cllm_st_set *s);
const cllm_st_tensor *cllm_st_set_at(const cllm_st_set *s, int i);
const cllm_st_tensor *cllm_st_set_find(const cllm_st_set *s, const char *name);

/* Converts a tensor (F32, F16 or BF16) to fp32 into dst[numel]. Fails with a
 * message naming the tensor: CLLM_ERR_UNSUPPORTED if the dtype is not a float
 * type, CLLM_ERR_ARG if n differs from numel. Large tensors convert with
 * OpenMP threads. */
cllm_status cllm_st_read_f32(const cllm_st_tensor *t, float *dst, int64_t n);

/* ------------------------------------------------------------ writing */
typedef struct {
    const char *name;
    cllm_dtype dtype;
    int ndim;
    int64_t shape[CLLM_ST_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} cllm_st_entry;

/* Writes one safetensors file atomically (temp file in the same folder,
 * fsync, rename). Tensors are written in the order given; the header holds
 * {"__metadata__":{"format":"pt"}} first. Output is a pure function of the
 * entries, so saving the same tensors twice gives identical bytes. */
cllm_status cllm_st_save(const char *path, const cllm_st_entry *entries, int n);

/* Writes the tensors of a model into folder `dir` (which must exist):
 * one model.safetensors if the total fits max_shard_bytes (0 = no limit),
 * else model-00001-of-0000N.safetensors shards plus
 * model.safetensors.index.json ({"metadata":{"total_size":...},
 * "weight_map":{name: file}}). Stale files of the other layout in `dir` are
 * removed after the new ones are in place. Every file is written atomically. */
cllm_status cllm_st_save_dir(const char *dir, const cllm_st_entry *entries, int n,
                             size_t max_shard_bytes);

/* Parses a size such as "5GB", "500MB", "2GiB", "1000" (bytes) into bytes. */
cllm_status cllm_parse_size(const char *s, size_t *out);

/* ------------------------------------------------------- atomic files */
/* Creates folder `dir` and any missing parents (like mkdir -p); an existing
 * folder is fine. Fails naming the component that could not be created. */
cllm_status cllm_make_dirs(const char *dir);

/* Writes `len` bytes to path through a temporary file + fsync + rename. */
cllm_status cllm_write_file_atomic(const char *path, const void *data, size_t len);
/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len excludes
 * the NUL). Fails with the path and errno text. Caller frees with free(). */
cllm_status cllm_read_file(const char *path, char **data, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
