/*
 * Preference-pair loading (label data): the loader's `pairs` mode keeps the
 * two rows of a pair together through shuffling and splits, builds the
 * rows (prompt labels -100, keep_end truncation), and refuses blends.
 * Usage: test_pairs <scratch dir>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "cllm/loader.h"

#define NP 37 /* pairs */
#define T 8

/* pair i: prompt [i % 5 + 1 tokens of value 100 + i], chosen [i, 200], rejected [i, 201, 202] */
static void write_pairs(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int i = 0; i < NP; i++) {
        fprintf(f, "{\"prompt_input_ids\": [");
        int np = i == 3 ? 12 : i % 5 + 1; /* pair 3: a prompt longer than T */
        for (int k = 0; k < np; k++) fprintf(f, "%s%d", k ? ", " : "", 100 + i);
        fprintf(f, "], \"chosen_input_ids\": [%d, 200], \"rejected_input_ids\": [%d, 201, 202]}\n", i, i);
    }
    fclose(f);
}

/* The pair a row belongs to and whether it is the chosen one, read back
 * from its completion; -1 if the row is malformed. */
static int row_pair(const int32_t *tok, const int32_t *lab, int *chosen) {
    int first = -1;
    for (int t = 0; t < T; t++)
        if (lab[t] != -100) {
            first = t;
            break;
        }
    if (first < 0 || first + 1 >= T) return -1;
    if (lab[first] != tok[first]) return -1;
    *chosen = tok[first + 1] == 200;
    return tok[first];
}

static void test_stream(const char *path, bool shuffle) {
    cllm_loader_opts o = {.spec = path, .seq_len = T, .vocab_size = 300, .shuffle = shuffle, .seed = 7,
                          .pairs = true};
    cllm_loader *l = NULL;
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK, "%s", cllm_last_error());
    if (!l) return;
    CHECK(cllm_loader_size(l) == 2 * NP, "size %llu", (unsigned long long)cllm_loader_size(l));
    int32_t tok[2][T], lab[2][T];
    for (int e = 0; e < 3; e++) {
        int seen[NP] = {0};
        for (int i = 0; i < NP; i++) {
            uint64_t g = (uint64_t)e * 2 * NP + 2 * (uint64_t)i;
            long n0 = 0, n1 = 0;
            CHECK(cllm_loader_get(l, g, tok[0], lab[0], &n0) == CLLM_OK, "%s", cllm_last_error());
            CHECK(cllm_loader_get(l, g + 1, tok[1], lab[1], &n1) == CLLM_OK, "%s", cllm_last_error());
            int c0 = 0, c1 = 0, p0 = row_pair(tok[0], lab[0], &c0), p1 = row_pair(tok[1], lab[1], &c1);
            CHECK(p0 >= 0 && p0 == p1 && c0 && !c1, "g %llu: rows of pairs %d/%d (chosen %d/%d)",
                  (unsigned long long)g, p0, p1, c0, c1);
            CHECK(n0 == 2 && n1 == 3, "counted labels %ld %ld", n0, n1);
            if (p0 >= 0 && p0 < NP) seen[p0]++;
            if (!shuffle) CHECK(p0 == i, "no shuffle: pair %d at position %d", p0, i);
            /* the prompt: labels -100, its tokens; pair 3 keeps the end of its prompt */
            int np = p0 == 3 ? T - 2 : p0 % 5 + 1;
            for (int t = 0; t < np && p0 >= 0; t++)
                CHECK(tok[0][t] == 100 + p0 && lab[0][t] == -100, "pair %d prompt token %d", p0, t);
        }
        int all = 1;
        for (int i = 0; i < NP; i++) all &= seen[i] == 1;
        CHECK(all, "epoch %d does not hold every pair once", e);
    }
    cllm_loader_free(l);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_pairs <scratch dir>\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/pairs.jsonl", argv[1]);
    write_pairs(path);
    test_stream(path, false);
    test_stream(path, true);

    /* splits divide pairs, never a pair */
    cllm_loader_opts o = {.spec = path, .seq_len = T, .vocab_size = 300, .shuffle = true, .seed = 1, .pairs = true,
                          .split = "valid", .splits = "80,20"};
    cllm_loader *l = NULL;
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK, "%s", cllm_last_error());
    if (l) CHECK(cllm_loader_size(l) % 2 == 0 && cllm_loader_size(l) > 0, "valid rows %llu",
                 (unsigned long long)cllm_loader_size(l));
    cllm_loader_free(l);

    /* blends are refused */
    char blend[2200];
    snprintf(blend, sizeof blend, "0.5 %s 0.5 %s", path, path);
    o.spec = blend;
    o.split = NULL;
    l = NULL;
    CHECK(cllm_loader_open(&l, &o) != CLLM_OK && strstr(cllm_last_error(), "cannot be a blend"), "%s",
          cllm_last_error());
    cllm_loader_free(l);
    /* ids outside the vocabulary name FILE:LINE */
    o.spec = path;
    o.vocab_size = 150;
    l = NULL;
    char want[1100];
    snprintf(want, sizeof want, "%s:1:1: \"chosen_input_ids\"[1]: token id 200", path);
    CHECK(cllm_loader_open(&l, &o) != CLLM_OK && strstr(cllm_last_error(), want), "%s", cllm_last_error());
    cllm_loader_free(l);
    return check_summary();
}
