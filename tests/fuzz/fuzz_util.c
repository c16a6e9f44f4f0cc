/* Helpers shared by the fuzz targets: see fuzz_util.h. */
#include "fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cllm/core.h"

static char g_dir[512];

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            rm_tree(p);
            rmdir(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
}

/* What each slot's file holds now: its path and a copy of its bytes, so an
 * input that leaves a part as the previous input had it costs no write. */
static struct {
    char path[1024];
    unsigned char *data;
    size_t len, size;
    int present;
} g_slot[FUZZ_SLOTS];

static void remove_dir(void) {
    for (int i = 0; i < FUZZ_SLOTS; i++) free(g_slot[i].data);
    if (!g_dir[0]) return;
    rm_tree(g_dir);
    rmdir(g_dir);
}

const char *fuzz_dir(void) {
    if (g_dir[0]) return g_dir;
    /* Memory (tmpfs) rather than disk: creating and removing files on a
     * disk file system costs more than parsing them. */
    const char *tmp = getenv("CLLM_FUZZ_TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/cllm-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("fuzz_dir: mkdtemp");
        abort();
    }
    atexit(remove_dir);
    cllm_log_set_level((cllm_log_level)(CLLM_LOG_ERROR + 1));
    return g_dir;
}

void fuzz_absent(int slot) {
    if (slot < 0 || slot >= FUZZ_SLOTS) abort();
    if (!g_slot[slot].present) return;
    if (unlink(g_slot[slot].path) != 0 && errno != ENOENT) {
        perror("fuzz_absent");
        abort();
    }
    g_slot[slot].present = 0;
}

const char *fuzz_write(int slot, const char *name, const void *data, size_t len) {
    return fuzz_write_padded(slot, name, data, len, len);
}

const char *fuzz_write_padded(int slot, const char *name, const void *data, size_t len, size_t size) {
    if (slot < 0 || slot >= FUZZ_SLOTS || size < len) abort();
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", fuzz_dir(), name);
    if (strcmp(p, g_slot[slot].path) != 0) {
        fuzz_absent(slot);
        memcpy(g_slot[slot].path, p, sizeof p);
    } else if (g_slot[slot].present && g_slot[slot].len == len && g_slot[slot].size == size &&
               (!len || !memcmp(g_slot[slot].data, data, len))) {
        return g_slot[slot].path; /* already holds these bytes */
    }
    unsigned char *copy = realloc(g_slot[slot].data, len ? len : 1);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const unsigned char *b = data;
    size_t done = 0;
    while (fd >= 0 && done < len) {
        ssize_t w = write(fd, b + done, len - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    /* the zeros after the data are a hole: no pages to write or map */
    if (!copy || fd < 0 || done != len || (size > len && ftruncate(fd, (off_t)size) != 0) || close(fd) != 0) {
        perror("fuzz_write");
        abort();
    }
    if (len) memcpy(copy, data, len);
    g_slot[slot].data = copy;
    g_slot[slot].len = len;
    g_slot[slot].size = size;
    g_slot[slot].present = 1;
    return g_slot[slot].path;
}

int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max) {
    const size_t sl = sizeof FUZZ_SEP - 1;
    int n = 0;
    size_t start = 0;
    /* memchr to the next line, memcmp there only: this file's own loops
     * and libc calls are instrumented too, a byte-by-byte scan costs. */
    size_t i = 0;
    while (n < max - 1 && i + sl <= size) {
        const uint8_t *nl = memchr(data + i, '\n', size - i);
        if (!nl) break;
        i = (size_t)(nl - data);
        if (i + sl > size) break;
        if (memcmp(nl, FUZZ_SEP, sl) == 0) {
            part[n] = data + start;
            len[n++] = i - start;
            start = i += sl;
        } else {
            i++;
        }
    }
    part[n] = data + start;
    len[n++] = size - start;
    return n;
}

int fuzz_note(int st) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("CLLM_FUZZ_VERBOSE") != NULL;
    if (st != CLLM_OK && verbose) fprintf(stderr, "refused: %s\n", cllm_last_error());
    return st;
}
