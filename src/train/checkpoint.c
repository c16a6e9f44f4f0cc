/*
 * Training checkpoints (see cllm/checkpoint.h): assembling a folder in a
 * temporary name, checksumming it into manifest.json, renaming it into
 * place, moving the `latest` pointer, rotating old folders, and verifying
 * all of that when a run resumes.
 * Not here: deciding when to save, or the background thread (engine_save.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cllm/checkpoint.h"
#include "cllm/lora.h"
#include "cllm/io.h"
#include "cllm/json.h"
#include "train_impl.h"
#include "io/io_impl.h"

/* dir + "/" + name into out[cap]; false (and an empty string) if it does
 * not fit. */
static bool join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        out[0] = '\0';
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- CRC-32 */

static uint32_t crc_table[8][256];
static int crc_ready;

/* Slicing-by-8 tables: table[0] is the classic byte table; table[k][i] is
 * the CRC of byte i followed by k zero bytes. Filled once; the values do not
 * depend on timing, so a race between two first callers is benign. */
static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++) crc_table[k][i] = (crc_table[k - 1][i] >> 8) ^ crc_table[0][crc_table[k - 1][i] & 0xff];
    crc_ready = 1;
}

uint32_t cllm_crc32(uint32_t crc, const void *data, size_t n) {
    if (!crc_ready) crc_init();
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
            crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

cllm_status cllm_crc32_file(const char *path, uint32_t *crc, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    const size_t chunk = cllm_io_chunk(f, (size_t)1 << 20);
    unsigned char *buf = malloc(chunk);
    if (!buf) {
        fclose(f);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    uint32_t c = 0;
    uint64_t total = 0;
    size_t got;
    while ((got = fread(buf, 1, chunk, f)) > 0) {
        c = cllm_crc32(c, buf, got);
        total += got;
    }
    int err = ferror(f);
    free(buf);
    fclose(f);
    if (err) return CLLM_FAIL(CLLM_ERR_IO, "cannot read '%s'", path);
    *crc = c;
    *size = total;
    return CLLM_OK;
}

/* ------------------------------------------------------------ folders */

static cllm_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return CLLM_FAIL(CLLM_ERR_IO, "cannot open folder '%s': %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS)
        return CLLM_FAIL(CLLM_ERR_IO, "cannot sync folder '%s': %s", dir, strerror(err));
    return CLLM_OK;
}

/* Removes a folder of plain files (checkpoints have no subfolders). */
static cllm_status remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? CLLM_OK : CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT) {
            int err = errno;
            closedir(d);
            return CLLM_FAIL(CLLM_ERR_IO, "cannot remove '%s': %s", path, strerror(err));
        }
    }
    closedir(d);
    if (rmdir(dir) != 0 && errno != ENOENT) return CLLM_FAIL(CLLM_ERR_IO, "cannot remove '%s': %s", dir, strerror(errno));
    return CLLM_OK;
}

/* Removes a folder and what it holds, two levels deep at most (a sharded
 * checkpoint's folder holds files only; this is the defensive bound). */
static cllm_status remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? CLLM_OK : CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    cllm_status st = CLLM_OK;
    while (!st && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && depth > 0)
            st = remove_tree(path, depth - 1);
        else if (unlink(path) != 0 && errno != ENOENT)
            st = CLLM_FAIL(CLLM_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
    }
    closedir(d);
    if (!st && rmdir(dir) != 0 && errno != ENOENT)
        st = CLLM_FAIL(CLLM_ERR_IO, "cannot remove '%s': %s", dir, strerror(errno));
    return st;
}

/* Whether name is NAME.tmp.PID (an atomic write's temporary, see
 * cllm_write_file_atomic) and that process is gone. */
static bool stale_atomic_tmp(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t || t == name) return false;
    const char *p = t + 5;
    if (!*p) return false;
    long pid = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || pid > 100000000) return false;
        pid = pid * 10 + (*p - '0');
    }
    return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Whether name is .checkpoint-STEP.tmp, a checkpoint being assembled. */
static bool checkpoint_tmp(const char *name) {
    if (strncmp(name, ".checkpoint-", 12) != 0) return false;
    const char *p = name + 12;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    return strcmp(p, ".tmp") == 0;
}

cllm_status cllm_ckpt_clean_stale(const char *output_dir, int *n_removed) {
    if (n_removed) *n_removed = 0;
    DIR *d = opendir(output_dir);
    if (!d) return errno == ENOENT ? CLLM_OK : CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", output_dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    cllm_status st = CLLM_OK;
    while (!st && (e = readdir(d))) {
        bool ck = checkpoint_tmp(e->d_name);
        if (!ck && !stale_atomic_tmp(e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", output_dir, e->d_name);
        if (ck)
            st = remove_tree(path, 2);
        else if (unlink(path) != 0 && errno != ENOENT)
            st = CLLM_FAIL(CLLM_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
        if (!st && n_removed) (*n_removed)++;
    }
    closedir(d);
    return st;
}

/* ---------------------------------------------------------- manifest */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* manifest.json: {"format": "cllm-checkpoint", "version": 1, "step": N,
 * "files": [{"name", "bytes", "crc32": "8 hex digits"}...]} in name order. */
static cllm_status write_manifest(const char *dir, long step) {
    DIR *d = opendir(dir);
    if (!d) return CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", dir, strerror(errno));
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "manifest.json") == 0) continue;
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    json_t *files = json_array();
    cllm_status st = CLLM_OK;
    char path[4096];
    for (int i = 0; i < n && !st; i++) {
        join(path, sizeof path, dir, names[i]);
        uint32_t crc;
        uint64_t size;
        if ((st = cllm_crc32_file(path, &crc, &size))) break;
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
        json_array_append_new(files, json_pack("{sssIss}", "name", names[i], "bytes", (json_int_t)size, "crc32", hex));
    }
    for (int i = 0; i < n; i++) free(names[i]);
    json_t *m = json_pack("{sssisIso}", "format", "cllm-checkpoint", "version", 1, "step", (json_int_t)step, "files",
                          files);
    if (!st) {
        join(path, sizeof path, dir, "manifest.json");
        st = cllm_json_save_file(m, path);
    }
    json_decref(m);
    return st;
}

cllm_status cllm_ckpt_verify(const char *dir) {
    char path[4096];
    join(path, sizeof path, dir, "manifest.json");
    json_t *m = NULL;
    cllm_status st = cllm_json_load_file(&m, path);
    if (st) return cllm_fail_context(st, "checkpoint '%s' has no readable manifest", dir);
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || json_array_size(files) == 0) {
        json_decref(m);
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no \"files\" list", path);
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        json_t *jn = json_object_get(f, "name"), *jb = json_object_get(f, "bytes"), *jc = json_object_get(f, "crc32");
        if (!json_is_string(jn) || !json_is_integer(jb) || !json_is_string(jc) || strchr(json_string_value(jn), '/')) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: files[%zu] is malformed", path, i);
            break;
        }
        char fp[4096];
        snprintf(fp, sizeof fp, "%s/%s", dir, json_string_value(jn));
        uint32_t crc;
        uint64_t size;
        if ((st = cllm_crc32_file(fp, &crc, &size))) {
            st = cllm_fail_context(st, "checkpoint '%s' is incomplete", dir);
            break;
        }
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
        if (size != (uint64_t)json_integer_value(jb) || strcmp(hex, json_string_value(jc)) != 0) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT,
                           "checkpoint file '%s' is corrupted (%llu bytes, crc32 %s; manifest says %lld bytes, crc32 "
                           "%s); resume from another checkpoint-* folder",
                           fp, (unsigned long long)size, hex, (long long)json_integer_value(jb),
                           json_string_value(jc));
            break;
        }
    }
    json_decref(m);
    return st;
}

/* ------------------------------------------------------- trainer state */

static json_t *u64_hex(uint64_t x) {
    char b[24];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)x);
    return json_string(b);
}

static bool hex_u64(const json_t *v, uint64_t *out) {
    if (!json_is_string(v)) return false;
    char *end;
    const char *s = json_string_value(v);
    errno = 0;
    unsigned long long x = strtoull(s, &end, 16);
    if (errno || end == s || *end) return false;
    *out = (uint64_t)x;
    return true;
}

static json_t *state_to_json(const cllm_ckpt_state *s) {
    json_t *rng = json_array();
    for (int i = 0; i < 4; i++) json_array_append_new(rng, u64_hex(s->rng.s[i]));
    json_t *j = json_pack("{si sI sI sI so so so sI sI sf sf sf so ss sI si}", "version", 1, "global_step",
                     (json_int_t)s->global_step, "optimizer_step", (json_int_t)s->optim_step, "scheduler_iteration",
                     (json_int_t)s->sched_iter, "next_sample", u64_hex(s->next_sample), "data_seed",
                     u64_hex(s->data_seed), "rng", rng, "skipped_steps", (json_int_t)s->skipped_steps,
                     "consecutive_skips", (json_int_t)s->consecutive_skips, "tokens_seen", s->tokens_seen,
                     "train_seconds", s->train_seconds, "loss_scale", s->loss_scale, "config_hash",
                     u64_hex(s->config_hash), "optimizer", s->optimizer, "train_batch_size",
                     (json_int_t)s->train_batch_size, "dp_size", s->dp_size);
    if (j && s->n_objective > 0) {
        json_t *a = json_array();
        for (int i = 0; i < s->n_objective && i < 16; i++) json_array_append_new(a, json_real(s->objective[i]));
        json_object_set_new(j, "objective_state", a);
    }
    if (j && s->has_loss_scaler)
        json_object_set_new(j, "loss_scaler",
                            json_pack("{sI sI si}", "iter", (json_int_t)s->loss_scaler_iter, "last_overflow_iter",
                                      (json_int_t)s->loss_scaler_last_overflow, "cur_hysteresis",
                                      s->loss_scaler_hysteresis));
    return j;
}

cllm_status cllm_ckpt_read_state(const char *dir, cllm_ckpt_state *s) {
    char path[4096];
    join(path, sizeof path, dir, "trainer_state.json");
    json_t *j = NULL;
    cllm_status st = cllm_json_load_file(&j, path);
    if (st) return st;
    memset(s, 0, sizeof *s);
    json_int_t gs = 0, os = 0, si = 0, sk = 0, cs = 0, tb = 0;
    int dp = 1, ver = 0;
    const char *opt = NULL;
    json_t *next = NULL, *seed = NULL, *rng = NULL, *hash = NULL;
    json_error_t err;
    if (json_unpack_ex(j, &err, 0, "{si sI sI sI so so so sI sI sF sF sF so ss sI si}", "version", &ver, "global_step",
                       &gs, "optimizer_step", &os, "scheduler_iteration", &si, "next_sample", &next, "data_seed",
                       &seed, "rng", &rng, "skipped_steps", &sk, "consecutive_skips", &cs, "tokens_seen",
                       &s->tokens_seen, "train_seconds", &s->train_seconds, "loss_scale", &s->loss_scale,
                       "config_hash", &hash, "optimizer", &opt, "train_batch_size", &tb, "dp_size", &dp) != 0) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s", path, err.text);
        goto done;
    }
    if (ver != 1) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: version %d is not supported (expected 1)", path, ver);
        goto done;
    }
    bool ok = hex_u64(next, &s->next_sample) && hex_u64(seed, &s->data_seed) && hex_u64(hash, &s->config_hash) &&
              json_is_array(rng) && json_array_size(rng) == 4;
    for (int i = 0; ok && i < 4; i++) ok = hex_u64(json_array_get(rng, (size_t)i), &s->rng.s[i]);
    if (!ok || gs < 0 || os < 0 || si < 0 || tb < 1 || dp < 1) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: malformed values", path);
        goto done;
    }
    s->global_step = (long)gs;
    s->optim_step = (long)os;
    s->sched_iter = (long)si;
    s->skipped_steps = (long)sk;
    s->consecutive_skips = (long)cs;
    s->train_batch_size = (long)tb;
    s->dp_size = dp;
    snprintf(s->optimizer, sizeof s->optimizer, "%s", opt);
    json_t *os_ = json_object_get(j, "objective_state"); /* optional: written by PPO runs */
    if (os_) {
        size_t i;
        json_t *v;
        if (!json_is_array(os_) || json_array_size(os_) > 16) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: objective_state: expected an array of at most 16 numbers", path);
            goto done;
        }
        json_array_foreach(os_, i, v) {
            if (!json_is_number(v)) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: objective_state[%zu]: expected a number", path, i);
                goto done;
            }
            s->objective[i] = json_number_value(v);
        }
        s->n_objective = (int)json_array_size(os_);
    }
    json_t *ls = json_object_get(j, "loss_scaler"); /* optional: written by fp16 runs */
    if (ls) {
        json_int_t it = 0, last = 0;
        int hy = 0;
        if (json_unpack_ex(ls, &err, 0, "{sI sI si}", "iter", &it, "last_overflow_iter", &last, "cur_hysteresis",
                           &hy) != 0 ||
            it < 0 || last < -1 || hy < 1) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: loss_scaler: malformed (expected iter >= 0, last_overflow_iter >= -1, "
                           "cur_hysteresis >= 1)", path);
            goto done;
        }
        s->has_loss_scaler = true;
        s->loss_scaler_iter = (long)it;
        s->loss_scaler_last_overflow = (long)last;
        s->loss_scaler_hysteresis = hy;
    }
done:
    json_decref(j);
    return st;
}

/* ------------------------------------------------------------ writing */

static cllm_status write_tensors(const char *tmp, const cllm_model *m, const cllm_ckpt_tensors *t,
                                 size_t max_shard_bytes) {
    /* the trainable views: every tensor, or a LoRA run's adapters (under
     * their PEFT names, with adapter_config.json beside them) */
    int nt = cllm_model_n_trainable(m);
    cllm_st_entry *e = calloc(nt > 0 ? (size_t)nt : 1, sizeof *e);
    if (!e) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *ti = cllm_model_trainable(m, i);
        e[i] = (cllm_st_entry){.name = ti->name, .dtype = CLLM_F32, .ndim = ti->ndim, .data = t->params + ti->offset};
        e[i].shape[0] = ti->shape[0];
        e[i].shape[1] = ti->shape[1];
    }
    cllm_status st = cllm_st_save_dir(tmp, e, nt, max_shard_bytes);
    free(e);
    if (st) return st;
    char path[4096];
    join(path, sizeof path, tmp, "config.json");
    if ((st = cllm_json_save_file(cllm_model_config_json(m), path))) return st;
    if (cllm_lora_attached(m)) {
        json_t *a = cllm_lora_config_json(m, NULL);
        join(path, sizeof path, tmp, "adapter_config.json");
        st = a ? cllm_json_save_file(a, path) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        json_decref(a);
        if (st) return st;
    }
    cllm_st_entry o[2];
    int no = 0;
    const float *bufs[2] = {t->state0, t->state1};
    const char *names[2] = {"state0", "state1"};
    for (int k = 0; k < 2; k++) {
        if (!bufs[k]) continue;
        o[no] = (cllm_st_entry){.name = names[k], .dtype = CLLM_F32, .ndim = 1, .data = bufs[k]};
        o[no].shape[0] = (int64_t)t->n;
        no++;
    }
    join(path, sizeof path, tmp, "optimizer.safetensors");
    return cllm_st_save(path, o, no);
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Removes the oldest checkpoint-STEP folders so that `keep` remain; never
 * the one named `keep_step`. */
static cllm_status rotate(const char *out, long keep, long keep_step) {
    DIR *d = opendir(out);
    if (!d) return CLLM_FAIL(CLLM_ERR_IO, "cannot open '%s': %s", out, strerror(errno));
    long steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        const char *s = e->d_name;
        if (strncmp(s, "checkpoint-", 11) != 0) continue;
        int64_t x;
        if (cllm_parse_i64(s + 11, &x) && x >= 0) steps[n++] = (long)x;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof steps[0], cmp_long);
    cllm_status st = CLLM_OK;
    char path[4096];
    for (int i = 0; i + keep < n && !st; i++) {
        if (steps[i] == keep_step) continue;
        snprintf(path, sizeof path, "%s/checkpoint-%ld", out, steps[i]);
        st = remove_flat_dir(path);
    }
    return st;
}

cllm_status cllm_ckpt_write(const char *out, const cllm_model *m, const cllm_ckpt_tensors *t,
                            const cllm_ckpt_state *s, size_t max_shard_bytes, long keep_limit) {
    char tmp[4096], fin[4096], path[4096];
    long step = s->global_step;
    snprintf(tmp, sizeof tmp, "%s/.checkpoint-%ld.tmp", out, step);
    snprintf(fin, sizeof fin, "%s/checkpoint-%ld", out, step);
    cllm_status st = cllm_make_dirs(out);
    if (!st) st = remove_flat_dir(tmp);
    if (!st) st = cllm_make_dirs(tmp);
    if (!st) st = write_tensors(tmp, m, t, max_shard_bytes);
    if (!st) {
        json_t *j = state_to_json(s);
        join(path, sizeof path, tmp, "trainer_state.json");
        st = j ? cllm_json_save_file(j, path) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        json_decref(j);
    }
    if (!st) st = write_manifest(tmp, step);
    if (!st) st = fsync_dir(tmp);
    if (st) {
        remove_flat_dir(tmp);
        return cllm_fail_context(st, "writing checkpoint %s", fin);
    }
    return train_ckpt_publish(out, step, keep_limit);
}

cllm_status train_ckpt_publish(const char *out, long step, long keep_limit) {
    char tmp[4096], fin[4096], old[4096], path[4096];
    cllm_status st;
    snprintf(tmp, sizeof tmp, "%s/.checkpoint-%ld.tmp", out, step);
    snprintf(fin, sizeof fin, "%s/checkpoint-%ld", out, step);
    snprintf(old, sizeof old, "%s/.checkpoint-%ld.old", out, step);
    /* An existing folder of the same step (a rerun) is replaced: moved
     * aside first, since rename() cannot replace a non-empty folder. */
    struct stat sb;
    if (stat(fin, &sb) == 0) {
        remove_flat_dir(old);
        if (rename(fin, old) != 0)
            return CLLM_FAIL(CLLM_ERR_IO, "cannot move '%s' aside: %s", fin, strerror(errno));
    }
    if (rename(tmp, fin) != 0) return CLLM_FAIL(CLLM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, fin, strerror(errno));
    if ((st = fsync_dir(out))) return st;
    remove_flat_dir(old);
    char latest[64];
    int len = snprintf(latest, sizeof latest, "checkpoint-%ld\n", step);
    join(path, sizeof path, out, "latest");
    if ((st = cllm_write_file_atomic(path, latest, (size_t)len))) return st;
    if (keep_limit > 0) st = rotate(out, keep_limit, step);
    return st;
}

/* The pieces the sharded writer (ckpt_shard.c) shares. */
json_t *train_ckpt_state_json(const cllm_ckpt_state *s) { return state_to_json(s); }
cllm_status train_ckpt_remove_dir(const char *dir) { return remove_flat_dir(dir); }
cllm_status train_ckpt_fsync_dir(const char *dir) { return fsync_dir(dir); }

/* ------------------------------------------------------------ reading */

cllm_status cllm_ckpt_find(const char *out, const char *resume, char **dir) {
    *dir = NULL;
    if (!resume) return CLLM_OK;
    if (strcmp(resume, "auto") != 0) {
        if (!(*dir = strdup(resume))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        return CLLM_OK;
    }
    if (!out) return CLLM_FAIL(CLLM_ERR_ARG, "--resume auto needs an output folder (--out or output_dir)");
    char path[4096];
    join(path, sizeof path, out, "latest");
    char *text = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return CLLM_OK;
    cllm_status st = cllm_read_file(path, &text, &len);
    if (st) return st;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = '\0';
    if (len == 0 || strchr(text, '/') || strncmp(text, "checkpoint-", 11) != 0) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected \"checkpoint-STEP\", found '%s'", path, text);
        free(text);
        return st;
    }
    size_t n = strlen(out) + 1 + len + 1;
    *dir = malloc(n);
    if (!*dir) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    else snprintf(*dir, n, "%s/%s", out, text);
    free(text);
    return st;
}

cllm_status cllm_ckpt_read_optim(const char *dir, float *state0, float *state1, size_t n) {
    char path[4096];
    join(path, sizeof path, dir, "optimizer.safetensors");
    cllm_st_file *f = NULL;
    cllm_status st = cllm_st_open(&f, path);
    if (st) return st;
    float *bufs[2] = {state0, state1};
    const char *names[2] = {"state0", "state1"};
    for (int k = 0; k < 2 && !st; k++) {
        const cllm_st_tensor *t = cllm_st_find(f, names[k]);
        if (!bufs[k] && !t) continue;
        if (!bufs[k] || !t) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor %s %s, but the optimizer %s one (different optimizer type?)",
                           path, names[k], t ? "present" : "missing", t ? "has no" : "needs");
            break;
        }
        st = cllm_st_read_f32(t, bufs[k], (int64_t)n);
    }
    cllm_st_close(f);
    return st;
}
