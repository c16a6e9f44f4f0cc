/*
 * A model folder as one set of tensors: either model.safetensors or
 * model.safetensors.index.json plus the shards it names. Each shard is
 * opened (and fully validated) once; lookups go through a name-sorted index
 * with binary search, since models carry thousands of tensors.
 * Deliberately left out: tensors present in a shard but absent from the
 * index are not visible (the index is the table of contents, as in HF), and
 * shard names are plain file names inside the folder, never paths.
 */
#include "io/io_impl.h"

#include "cllm/io.h"
#include "cllm/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"

struct cllm_st_set {
    int n_files;
    cllm_st_file **files;
    int n;
    cllm_st_tensor *t; /* copies; names and data borrowed from files */
    int *by_name;
};

typedef struct {
    const cllm_st_tensor *t;
    int i;
} name_key;

static int cmp_name_key(const void *a, const void *b) {
    const name_key *x = a, *y = b;
    return strcmp(x->t[x->i].name, y->t[y->i].name);
}

/* Sorts the lookup table; refuses a name that occurs twice. */
static cllm_status build_lookup(cllm_st_set *s, const char *what) {
    cllm_status st = CLLM_OK;
    name_key *keys = malloc((s->n ? (size_t)s->n : 1) * sizeof *keys);
    s->by_name = malloc((s->n ? (size_t)s->n : 1) * sizeof *s->by_name);
    if (!keys || !s->by_name) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory for %d tensors", what, s->n);
        goto free_keys;
    }
    for (int i = 0; i < s->n; i++) keys[i] = (name_key){s->t, i};
    qsort(keys, (size_t)s->n, sizeof *keys, cmp_name_key);
    for (int i = 0; i < s->n; i++) {
        s->by_name[i] = keys[i].i;
        if (i > 0 && strcmp(s->t[keys[i].i].name, s->t[keys[i - 1].i].name) == 0) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' listed twice", what, s->t[keys[i].i].name);
            break;
        }
    }
free_keys:
    free(keys);
    return st;
}

static cllm_status open_single(cllm_st_set *s, const char *path) {
    s->files = malloc(sizeof *s->files);
    if (!s->files) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_st_open(&s->files[0], path);
    if (st != CLLM_OK) return st;
    s->n_files = 1;
    s->n = cllm_st_count(s->files[0]);
    s->t = malloc((s->n ? (size_t)s->n : 1) * sizeof *s->t);
    if (!s->t) return CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < s->n; i++) s->t[i] = *cllm_st_at(s->files[0], i);
    return build_lookup(s, path);
}

/* A shard name must stay inside the folder: a plain, non-empty file name. */
static bool safe_file_name(const char *f) {
    return f[0] != '\0' && strchr(f, '/') == NULL && strcmp(f, ".") != 0 && strcmp(f, "..") != 0;
}

/* Returns the index of shard `fname` in s->files, opening it on first use. */
static cllm_status shard_for(cllm_st_set *s, const char **names, const char *dir, const char *ipath,
                             const char *fname, const char *tensor, int *out) {
    for (int i = 0; i < s->n_files; i++) {
        if (strcmp(names[i], fname) == 0) {
            *out = i;
            return CLLM_OK;
        }
    }
    char *p = cllm_io_join(dir, fname);
    if (!p) return CLLM_ERR_NOMEM;
    cllm_status st;
    struct stat sb;
    /* a missing shard is an inconsistent folder, not an I/O failure */
    if (stat(p, &sb) != 0 && errno == ENOENT) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' is mapped to '%s', which does not exist in '%s'",
                       ipath, tensor, fname, dir);
        goto free_path;
    }
    st = cllm_st_open(&s->files[s->n_files], p);
    if (st != CLLM_OK) goto free_path;
    names[s->n_files] = fname;
    *out = s->n_files++;
free_path:
    free(p);
    return st;
}

static cllm_status open_index(cllm_st_set *s, const char *dir, const char *ipath) {
    json_t *root = NULL;
    const char **names = NULL;
    cllm_status st = cllm_json_load_file(&root, ipath);
    if (st != CLLM_OK) return st;
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected an object with a \"weight_map\" object", ipath);
        goto free_root;
    }
    size_t n = json_object_size(map);
    if (n > (size_t)INT32_MAX) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: too many tensors", ipath);
        goto free_root;
    }
    size_t cap = n ? n : 1;
    names = malloc(cap * sizeof *names);
    s->files = calloc(cap, sizeof *s->files);
    s->t = malloc(cap * sizeof *s->t);
    if (!names || !s->files || !s->t) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory for %zu tensors", ipath, n);
        goto free_root;
    }
    const char *tname;
    json_t *v;
    json_object_foreach(map, tname, v) {
        if (!json_is_string(v)) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name string", ipath,
                           tname);
            goto free_root;
        }
        const char *fname = json_string_value(v);
        if (!safe_file_name(fname)) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT,
                           "%s: tensor '%s' is mapped to '%s'; shard names must be plain file names "
                           "inside the folder",
                           ipath, tname, fname);
            goto free_root;
        }
        int fi = -1;
        st = shard_for(s, names, dir, ipath, fname, tname, &fi);
        if (st != CLLM_OK) goto free_root;
        const cllm_st_tensor *t = cllm_st_find(s->files[fi], tname);
        if (!t) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' is mapped to '%s', which does not hold it",
                           ipath, tname, fname);
            goto free_root;
        }
        s->t[s->n++] = *t;
    }
    st = build_lookup(s, ipath);
free_root:
    free(names);
    json_decref(root);
    return st;
}

cllm_status cllm_st_set_open(cllm_st_set **out, const char *dir) {
    if (!out || !dir) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    *out = NULL;
    cllm_status st;
    char *ipath = cllm_io_join(dir, INDEX_NAME), *spath = cllm_io_join(dir, SINGLE_NAME);
    cllm_st_set *s = calloc(1, sizeof *s);
    if (!ipath || !spath || !s) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory opening '%s'", dir);
        goto fail;
    }
    struct stat sb;
    char eb[128];
    if (stat(ipath, &sb) == 0) {
        st = open_index(s, dir, ipath);
    } else if (errno != ENOENT) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot access '%s': %s", ipath, cllm_io_errstr(errno, eb, sizeof eb));
    } else if (stat(spath, &sb) == 0) {
        st = open_single(s, spath);
    } else if (errno != ENOENT) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot access '%s': %s", spath, cllm_io_errstr(errno, eb, sizeof eb));
    } else {
        st = CLLM_FAIL(CLLM_ERR_IO, "'%s' holds neither %s nor %s; is it a model folder?", dir,
                       SINGLE_NAME, INDEX_NAME);
    }
    if (st != CLLM_OK) goto fail;
    free(ipath);
    free(spath);
    *out = s;
    return CLLM_OK;
fail:
    free(ipath);
    free(spath);
    cllm_st_set_close(s);
    return st;
}

void cllm_st_set_close(cllm_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) cllm_st_close(s->files[i]);
    free(s->files);
    free(s->t);
    free(s->by_name);
    free(s);
}

int cllm_st_set_count(const cllm_st_set *s) { return s ? s->n : 0; }

const cllm_st_tensor *cllm_st_set_at(const cllm_st_set *s, int i) {
    return s && i >= 0 && i < s->n ? &s->t[i] : NULL;
}

const cllm_st_tensor *cllm_st_set_find(const cllm_st_set *s, const char *name) {
    if (!s || !name) return NULL;
    return st_find_sorted(s->t, s->by_name, s->n, name);
}
