/* Helpers shared by the fuzz targets: see fuzz_util.h. */
#include "fuzz_util.h"

#include <dirent.h>
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

static void remove_dir(void) {
    if (!g_dir[0]) return;
    rm_tree(g_dir);
    rmdir(g_dir);
}

const char *fuzz_dir(void) {
    if (g_dir[0]) return g_dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/cllm-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("fuzz_dir: mkdtemp");
        abort();
    }
    atexit(remove_dir);
    cllm_log_set_level((cllm_log_level)(CLLM_LOG_ERROR + 1));
    return g_dir;
}

void fuzz_clear(void) { rm_tree(fuzz_dir()); }

const char *fuzz_write(int slot, const char *name, const void *data, size_t len) {
    static char paths[8][1024];
    char *p = paths[slot & 7];
    snprintf(p, sizeof paths[0], "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror("fuzz_write");
        abort();
    }
    return p;
}

int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max) {
    const size_t sl = sizeof FUZZ_SEP - 1;
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; n < max - 1 && i + sl <= size;) {
        if (memcmp(data + i, FUZZ_SEP, sl) == 0) {
            part[n] = data + start;
            len[n++] = i - start;
            i += sl;
            start = i;
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
