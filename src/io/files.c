/*
 * Whole-file reads, atomic writes (temp file + fsync + rename + fsync of the
 * folder), size strings such as "5GB", and small helpers shared by the io
 * sources. Deliberately POSIX only: no Windows rename semantics, no O_TMPFILE
 * (it needs _GNU_SOURCE and is not on every filesystem).
 */
#include "io/io_impl.h"

#include "cllm/io.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Small writes are gathered up to this size; a header plus many tiny tensors
 * then costs a handful of write() calls. */
#define WRITE_BUF (1u << 20)
/* Some kernels cap a single write() near 2 GiB; stay below. */
#define WRITE_CHUNK ((size_t)1 << 30)

const char *cllm_io_errstr(int err, char *buf, size_t cap) {
    if (strerror_r(err, buf, cap) != 0) snprintf(buf, cap, "error %d", err);
    return buf;
}

bool cllm_io_dtype_parse(const char *s, cllm_dtype *out) {
    for (int d = 0; d < CLLM_DTYPE_COUNT; d++) {
        if (strcmp(s, cllm_dtype_name((cllm_dtype)d)) == 0) {
            *out = (cllm_dtype)d;
            return true;
        }
    }
    return false;
}

size_t cllm_io_chunk(FILE *f, size_t max) {
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 || (uint64_t)sb.st_size >= max)
        return max;
    return (size_t)sb.st_size + 1;
}

char *cllm_io_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name), n;
    if (!cllm_size_add(a, b, &n) || !cllm_size_add(n, 2, &n)) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "path too long");
        return NULL;
    }
    char *p = malloc(n);
    if (!p) {
        CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory joining '%s' and '%s'", dir, name);
        return NULL;
    }
    /* "dir/" already ending in a slash gets no second one */
    if (a > 0 && dir[a - 1] == '/')
        snprintf(p, n, "%s%s", dir, name);
    else
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static cllm_status write_all(int fd, const void *data, size_t n, const char *path) {
    const unsigned char *p = data;
    while (n > 0) {
        size_t chunk = n < WRITE_CHUNK ? n : WRITE_CHUNK;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            char eb[128];
            return CLLM_FAIL(CLLM_ERR_IO, "cannot write '%s': %s", path,
                             cllm_io_errstr(errno, eb, sizeof eb));
        }
        p += w;
        n -= (size_t)w;
    }
    return CLLM_OK;
}

cllm_status cllm_io_fsync_parent(const char *path) {
    /* The folder is everything before the last '/', "/" for "/x", "." for "x". */
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = malloc(2);
        if (dir) memcpy(dir, ".", 2);
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = malloc(n + 1);
        if (dir) {
            memcpy(dir, path, n);
            dir[n] = '\0';
        }
    }
    if (!dir) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = CLLM_OK;
    char eb[128];
    int fd = open(dir, O_RDONLY);
    if (fd < 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot open folder '%s': %s", dir,
                       cllm_io_errstr(errno, eb, sizeof eb));
        goto free_dir;
    }
    /* Some filesystems cannot sync a directory (EINVAL); the rename itself
     * has still happened, so that is not a failure. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot sync folder '%s': %s", dir,
                       cllm_io_errstr(errno, eb, sizeof eb));
    close(fd);
free_dir:
    free(dir);
    return st;
}

cllm_status cllm_io_atomic_begin(cllm_io_atomic *a, const char *path) {
    memset(a, 0, sizeof *a);
    a->fd = -1;
    cllm_status st = CLLM_ERR_NOMEM;
    size_t plen = strlen(path), tlen;
    if (plen == 0) return CLLM_FAIL(CLLM_ERR_ARG, "empty path");
    if (!cllm_size_add(plen, 32, &tlen)) return CLLM_FAIL(CLLM_ERR_NOMEM, "path too long");
    a->path = malloc(plen + 1);
    a->tmp = malloc(tlen);
    a->cap = WRITE_BUF;
    a->buf = malloc(a->cap);
    if (!a->path || !a->tmp || !a->buf) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory writing '%s'", path);
        goto fail;
    }
    memcpy(a->path, path, plen + 1);
    /* The temp file lives next to the target so rename() never crosses a
     * filesystem; the pid keeps two processes writing the same file apart. */
    snprintf(a->tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (a->fd < 0) {
        char eb[128];
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot create '%s': %s", a->tmp,
                       cllm_io_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    return CLLM_OK;
fail:
    free(a->path);
    free(a->tmp);
    free(a->buf);
    memset(a, 0, sizeof *a);
    a->fd = -1;
    return st;
}

static cllm_status flush_buf(cllm_io_atomic *a) {
    cllm_status st = write_all(a->fd, a->buf, a->len, a->tmp);
    a->len = 0;
    return st;
}

cllm_status cllm_io_atomic_write(cllm_io_atomic *a, const void *data, size_t n) {
    if (n == 0) return CLLM_OK;
    if (a->len + n <= a->cap) {
        memcpy(a->buf + a->len, data, n);
        a->len += n;
        return CLLM_OK;
    }
    cllm_status st = flush_buf(a);
    if (st != CLLM_OK) return st;
    if (n >= a->cap) return write_all(a->fd, data, n, a->tmp);
    memcpy(a->buf, data, n);
    a->len = n;
    return CLLM_OK;
}

void cllm_io_atomic_abort(cllm_io_atomic *a) {
    if (a->fd >= 0) close(a->fd);
    if (a->tmp) unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    free(a->buf);
    memset(a, 0, sizeof *a);
    a->fd = -1;
}

cllm_status cllm_io_atomic_commit(cllm_io_atomic *a) {
    char eb[128];
    cllm_status st = flush_buf(a);
    if (st != CLLM_OK) goto abort;
    /* fsync before rename: otherwise a crash can leave the new name pointing
     * at a file whose data never reached the disk. */
    if (fsync(a->fd) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot sync '%s': %s", a->tmp,
                       cllm_io_errstr(errno, eb, sizeof eb));
        goto abort;
    }
    int rc = close(a->fd);
    a->fd = -1;
    if (rc != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot close '%s': %s", a->tmp,
                       cllm_io_errstr(errno, eb, sizeof eb));
        goto abort;
    }
    if (rename(a->tmp, a->path) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot rename '%s' to '%s': %s", a->tmp, a->path,
                       cllm_io_errstr(errno, eb, sizeof eb));
        goto abort;
    }
    free(a->tmp);
    a->tmp = NULL; /* renamed: nothing to unlink any more */
    st = cllm_io_fsync_parent(a->path);
abort:
    cllm_io_atomic_abort(a);
    return st;
}

cllm_status cllm_write_file_atomic(const char *path, const void *data, size_t len) {
    if (!path || (!data && len > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "NULL path or data");
    cllm_io_atomic a;
    cllm_status st = cllm_io_atomic_begin(&a, path);
    if (st != CLLM_OK) return st;
    st = cllm_io_atomic_write(&a, data, len);
    if (st != CLLM_OK) {
        cllm_io_atomic_abort(&a);
        return st;
    }
    return cllm_io_atomic_commit(&a);
}

cllm_status cllm_read_file(const char *path, char **data, size_t *len) {
    if (!path || !data || !len) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    *data = NULL;
    *len = 0;
    char eb[128];
    cllm_status st = CLLM_OK;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", path,
                         cllm_io_errstr(errno, eb, sizeof eb));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot stat '%s': %s", path, cllm_io_errstr(errno, eb, sizeof eb));
        goto close_fd;
    }
    if (S_ISDIR(sb.st_mode)) {
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot read '%s': %s", path, cllm_io_errstr(EISDIR, eb, sizeof eb));
        goto close_fd;
    }
    /* The stat size is only a first guess (pipes and /proc files report 0),
     * so the buffer grows until read() reports the end. */
    size_t cap = sb.st_size > 0 && (uintmax_t)sb.st_size < SIZE_MAX - 1 ? (size_t)sb.st_size + 1 : 4096;
    size_t n = 0;
    buf = malloc(cap);
    if (!buf) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu bytes to read '%s'", cap, path);
        goto close_fd;
    }
    for (;;) {
        if (n == cap) {
            size_t ncap;
            char *nb = NULL;
            if (cllm_size_mul(cap, 2, &ncap)) nb = realloc(buf, ncap);
            if (!nb) {
                st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading '%s'", path);
                goto free_buf;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            st = CLLM_FAIL(CLLM_ERR_IO, "cannot read '%s': %s", path, cllm_io_errstr(errno, eb, sizeof eb));
            goto free_buf;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n == cap) {
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading '%s'", path);
            goto free_buf;
        }
        buf = nb;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    buf = NULL;
free_buf:
    free(buf);
close_fd:
    close(fd);
    return st;
}

/* ------------------------------------------------------------ sizes */

static bool unit_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return false;
    return *a == *b;
}

cllm_status cllm_parse_size(const char *s, size_t *out) {
    /* Decimal units as HF uses them for max_shard_size ("5GB" = 5e9 bytes),
     * binary ones spelled with "i". Units are case-insensitive. */
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {
        {"", 1},           {"B", 1},
        {"KB", 1000},      {"MB", 1000000},         {"GB", 1000000000},        {"TB", 1000000000000},
        {"KiB", 1u << 10}, {"MiB", (uint64_t)1 << 20}, {"GiB", (uint64_t)1 << 30}, {"TiB", (uint64_t)1 << 40},
    };
    if (!s || !out) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    const char *p = s;
    uint64_t ip = 0, frac = 0, fscale = 1, mult = 0;
    bool has_frac = false;
    if (!isdigit((unsigned char)*p)) goto bad;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (ip > (UINT64_MAX - d) / 10) goto overflow;
        ip = ip * 10 + d;
    }
    if (*p == '.') {
        p++;
        has_frac = true;
        if (!isdigit((unsigned char)*p)) goto bad;
        /* digits past the 18th cannot change a result below 2^64 by a byte */
        for (; isdigit((unsigned char)*p); p++) {
            if (fscale < 1000000000000000000u) {
                frac = frac * 10 + (unsigned)(*p - '0');
                fscale *= 10;
            }
        }
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (unit_eq(p, units[i].name)) mult = units[i].mult;
    if (mult == 0 || (has_frac && mult == 1)) goto bad;
    uint64_t v;
    if (ip > UINT64_MAX / mult) goto overflow;
    v = ip * mult;
    if (has_frac) {
        uint64_t extra = (uint64_t)((double)frac / (double)fscale * (double)mult);
        if (v > UINT64_MAX - extra) goto overflow;
        v += extra;
    }
    if (v > SIZE_MAX) goto overflow;
    *out = (size_t)v;
    return CLLM_OK;
bad:
    return CLLM_FAIL(CLLM_ERR_ARG,
                     "'%s' is not a size; use a byte count or a number with a unit, e.g. 1000, "
                     "500MB, 5GB, 2GiB",
                     s);
overflow:
    return CLLM_FAIL(CLLM_ERR_ARG, "size '%s' is too large", s);
}

cllm_status cllm_make_dirs(const char *dir) {
    size_t n = dir ? strlen(dir) : 0;
    if (n == 0) return CLLM_FAIL(CLLM_ERR_ARG, "empty folder name");
    char *buf = malloc(n + 1);
    if (!buf) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(buf, dir, n + 1);
    cllm_status st = CLLM_OK;
    for (size_t i = 1; i <= n && !st; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            st = CLLM_FAIL(CLLM_ERR_IO, "cannot create folder '%s': %s", buf, strerror(errno));
        buf[i] = c;
    }
    free(buf);
    return st;
}
