/*
 * tokenizer_bench: single-thread encode throughput of one tokenizer on one
 * text file, encoded in chunks (documents) of a given size. Not a test:
 * prints MB/s and tokens for the report.
 * Usage: tokenizer_bench <model dir> <text file> [chunk bytes (default: whole file)] [repeats]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <model dir> <text file> [chunk bytes] [repeats]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t len = fread(buf, 1, (size_t)n, f);
    fclose(f);
    size_t chunk = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 0;
    int reps = argc > 4 ? atoi(argv[4]) : 1;
    if (chunk == 0) chunk = len;
    cllm_tokenizer *tok;
    double t0 = cllm_time_sec();
    if (cllm_tokenizer_load(&tok, argv[1]) != CLLM_OK) {
        fprintf(stderr, "%s\n", cllm_last_error());
        return 1;
    }
    double tl = cllm_time_sec() - t0;
    cllm_token_buf ids = {0};
    double best = 1e30;
    size_t ntok = 0;
    for (int r = 0; r < reps; r++) {
        ids.n = 0;
        t0 = cllm_time_sec();
        for (size_t off = 0; off < len;) {
            size_t m = len - off < chunk ? len - off : chunk;
            /* cut on a UTF-8 boundary so chunks are valid text */
            while (off + m < len && ((unsigned char)buf[off + m] & 0xC0) == 0x80) m++;
            if (cllm_tokenizer_encode(tok, buf + off, m, false, &ids) != CLLM_OK) {
                fprintf(stderr, "%s\n", cllm_last_error());
                return 1;
            }
            off += m;
        }
        double dt = cllm_time_sec() - t0;
        if (dt < best) best = dt;
        ntok = ids.n;
    }
    printf("%s: %.1f MB in %.3f s = %.2f MB/s, %zu tokens (%.2f bytes/token), load %.3f s\n", argv[1], len / 1e6, best,
           len / 1e6 / best, ntok, (double)len / (double)ntok, tl);
    cllm_token_buf_free(&ids);
    cllm_tokenizer_free(tok);
    free(buf);
    return 0;
}
