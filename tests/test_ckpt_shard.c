/*
 * Sharded checkpoint files without MPI (one process is rank 0 of 1, so the
 * sharded writer writes one shard): ranges of the params and optimizer
 * buffers read back from the sharded format and from the single-process
 * format equal the buffers that were written, including ranges that start
 * and end inside tensors; the model loads from both; a missing optimizer
 * buffer, an invalid slice and a corrupted shard are refused, the last
 * naming the file. The multi-rank cases are in shard_test.py (label mpi).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cllm/checkpoint.h"
#include "cllm/model.h"

/* Removes root and the folders of plain files under it. */
static void remove_tree(const char *root) {
    DIR *d = opendir(root);
    if (!d) {
        unlink(root);
        return;
    }
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", root, e->d_name) >= (int)sizeof path) continue;
        if (unlink(path) != 0) remove_tree(path);
    }
    closedir(d);
    rmdir(root);
}

/* Reads [b, e) of `which` from dir and compares it with want + b. */
static void check_range(const char *dir, const cllm_model *m, cllm_ckpt_buffer which, const float *want, size_t b,
                        size_t e, const char *tag) {
    float *got = malloc((e - b + 1) * sizeof *got);
    CHECK(got != NULL, "out of memory");
    if (!got) return;
    cllm_status st = cllm_ckpt_read_range(dir, m, which, b, e, got);
    CHECK(st == CLLM_OK, "%s: read [%zu, %zu) of buffer %d: %s", tag, b, e, (int)which, cllm_last_error());
    if (st == CLLM_OK)
        CHECK(memcmp(got, want + b, (e - b) * sizeof *got) == 0, "%s: [%zu, %zu) of buffer %d differs", tag, b, e,
              (int)which);
    free(got);
}

static void flip_byte(const char *path, long from_end) {
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "open %s", path);
    if (!f) return;
    fseek(f, -from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -from_end, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

int main(void) {
    json_t *cfg = NULL;
    cllm_model *m = NULL, *back = NULL;
    CHECK(cllm_model_preset(&cfg, CLLM_ARCH_LLAMA, "tiny") == CLLM_OK, "preset");
    CHECK(cllm_model_init_random(&m, cfg, 5) == CLLM_OK, "init: %s", cllm_last_error());
    json_decref(cfg);
    if (!m) return check_summary();
    const size_t n = cllm_model_buffer_len(m);
    float *s0 = malloc(n * sizeof *s0), *s1 = malloc(n * sizeof *s1);
    if (!s0 || !s1) return 1;
    for (size_t i = 0; i < n; i++) {
        s0[i] = (float)i * 0.25f - 3.0f;
        s1[i] = 1.0f / (float)(i + 1);
    }
    const float *params = cllm_model_params(m);
    char root[] = "ckpt_shard_XXXXXX";
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    char out[1024], dir[4096], path[8192];
    snprintf(out, sizeof out, "%s/run", root);

    cllm_ckpt_state state;
    memset(&state, 0, sizeof state);
    state.global_step = 3;
    state.train_batch_size = 1;
    state.dp_size = 1;
    state.loss_scale = 1.0;
    snprintf(state.optimizer, sizeof state.optimizer, "adamw");
    cllm_ckpt_slice bad = {params, s0, s1, 10, 5, n};
    CHECK(cllm_ckpt_write_sharded(out, m, &bad, &state, 0) == CLLM_ERR_ARG, "an inverted slice is refused");
    cllm_ckpt_slice all = {params, s0, s1, 0, n, n};
    CHECK(cllm_ckpt_write_sharded(out, m, &all, &state, 0) == CLLM_OK, "write sharded: %s", cllm_last_error());
    snprintf(dir, sizeof dir, "%s/checkpoint-3", out);
    CHECK(cllm_ckpt_is_sharded(dir), "layout.json missing");
    char *found = NULL;
    CHECK(cllm_ckpt_find(out, "auto", &found) == CLLM_OK && found && strcmp(found, dir) == 0, "latest: %s",
          found ? found : "(none)");
    free(found);
    CHECK(cllm_ckpt_verify_range(dir, true, 0, n) == CLLM_OK, "verify: %s", cllm_last_error());
    CHECK(cllm_ckpt_verify(dir) == CLLM_OK, "verify all: %s", cllm_last_error());

    /* a single-process checkpoint of the same buffers, step 4 */
    state.global_step = 4;
    cllm_ckpt_tensors t = {params, s0, s1, n};
    CHECK(cllm_ckpt_write(out, m, &t, &state, 0, 0) == CLLM_OK, "write single: %s", cllm_last_error());
    char single[4096];
    snprintf(single, sizeof single, "%s/checkpoint-4", out);
    CHECK(!cllm_ckpt_is_sharded(single), "the single-process folder looks sharded");

    const cllm_tensor_info *t1 = cllm_model_tensor(m, 1);
    size_t mid = t1->offset + t1->numel / 2; /* inside the second tensor */
    size_t ranges[][2] = {{0, n}, {mid, n}, {3, mid}, {n - 7, n}, {mid, mid + 1}};
    const char *dirs[2] = {dir, single};
    const float *bufs[3] = {params, s0, s1};
    for (int d = 0; d < 2; d++)
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++)
            for (int b = 0; b < 3; b++)
                check_range(dirs[d], m, (cllm_ckpt_buffer)b, bufs[b], ranges[r][0], ranges[r][1],
                            d ? "single" : "sharded");

    for (int d = 0; d < 2; d++) {
        CHECK(cllm_ckpt_load_model(&back, dirs[d]) == CLLM_OK, "load %s: %s", dirs[d], cllm_last_error());
        if (back)
            CHECK(cllm_model_buffer_len(back) == n && memcmp(cllm_model_params(back), params, n * sizeof(float)) == 0,
                  "%s: loaded params differ", dirs[d]);
        cllm_model_free(back);
        back = NULL;
        float a[32];
        CHECK(cllm_ckpt_read_optim_range(dirs[d], m, a, NULL, mid, mid + 32) == CLLM_ERR_FORMAT &&
                  strstr(cllm_last_error(), "different optimizer") != NULL,
              "%s: a missing state1 buffer is not refused: %s", dirs[d], cllm_last_error());
        float b0[32], b1[32];
        CHECK(cllm_ckpt_read_optim_range(dirs[d], m, b0, b1, mid, mid + 32) == CLLM_OK &&
                  memcmp(b0, s0 + mid, sizeof b0) == 0 && memcmp(b1, s1 + mid, sizeof b1) == 0,
              "%s: optimizer slice: %s", dirs[d], cllm_last_error());
    }

    /* a corrupted shard is named; the optim shard only when it is read */
    snprintf(path, sizeof path, "%s/optim-00001-of-00001.safetensors", dir);
    flip_byte(path, 40);
    CHECK(cllm_ckpt_verify_range(dir, true, 0, 0) == CLLM_OK, "verifying the params alone reads the optim shard");
    float x[4];
    CHECK(cllm_ckpt_read_optim_range(dir, m, x, x, 0, 1) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), path),
          "corrupted optim shard not named: %s", cllm_last_error());
    CHECK(cllm_ckpt_verify(dir) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), path), "verify: %s",
          cllm_last_error());

    remove_tree(out);
    remove_tree(root);
    free(s0);
    free(s1);
    cllm_model_free(m);
    return check_summary();
}
