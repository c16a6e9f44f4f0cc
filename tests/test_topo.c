/*
 * Process topology and pipeline stage splits: rank <-> coordinate mapping
 * against the row-major rule written out by hand, groups, every error of
 * model_topo, `parts` as in seed 003, and the "parameters" split against a
 * brute-force search over all contiguous splits.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/model.h"
#include "cllm/topo.h"

static json_t *js(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j) fprintf(stderr, "bad test json: %s\n", text);
    return j;
}

/* process_topology as a config gives it: read, then placed in a world */
static cllm_status topo(cllm_topo *t, const char *text, int world, int rank) {
    json_t *j = text ? js(text) : NULL;
    cllm_topo_layout l;
    cllm_status st = cllm_topo_layout_parse(&l, j, "cfg.json");
    if (!st) st = cllm_topo_init(t, &l, world, rank, "cfg.json");
    json_decref(j);
    return st;
}

static void test_mapping(void) {
    cllm_topo t;
    /* seed 003: [pipe, data] dims [2, 2]: data varies fastest */
    for (int r = 0; r < 4; r++) {
        CHECK(topo(&t, "{\"axis\": [\"pipe\", \"data\"], \"dims\": [2, 2]}", 4, r) == CLLM_OK, "init");
        CHECK(t.coord[CLLM_AXIS_PIPE] == r / 2 && t.coord[CLLM_AXIS_DATA] == r % 2 && t.coord[CLLM_AXIS_TENSOR] == 0,
              "rank %d -> pipe %d data %d", r, t.coord[CLLM_AXIS_PIPE], t.coord[CLLM_AXIS_DATA]);
        CHECK(cllm_topo_rank_of(&t, t.coord) == r, "round trip %d", r);
    }
    /* three axes in another order: rank = ((d * P) + p) * T + t */
    const int D = 2, P = 3, T = 2;
    for (int r = 0; r < D * P * T; r++) {
        CHECK(topo(&t, "{\"axis\": [\"data\", \"pipe\", \"model\"], \"dims\": [2, 3, 2]}", 12, r) == CLLM_OK, "init3");
        int d = t.coord[CLLM_AXIS_DATA], p = t.coord[CLLM_AXIS_PIPE], tt = t.coord[CLLM_AXIS_TENSOR];
        CHECK((d * P + p) * T + tt == r, "rank %d -> d%d p%d t%d", r, d, p, tt);
        int g[3];
        cllm_topo_group(&t, CLLM_AXIS_PIPE, g);
        for (int i = 0; i < P; i++) CHECK(g[i] == (d * P + i) * T + tt, "pipe group of %d [%d] = %d", r, i, g[i]);
        CHECK(g[p] == r, "own rank in its group");
        cllm_topo_group(&t, CLLM_AXIS_DATA, g);
        for (int i = 0; i < D; i++) CHECK(g[i] == (i * P + p) * T + tt, "data group of %d", r);
    }
    /* no topology: everything is data parallel */
    CHECK(topo(&t, NULL, 3, 2) == CLLM_OK && t.dims[CLLM_AXIS_DATA] == 3 && t.coord[CLLM_AXIS_DATA] == 2, "default");
    /* data left out, or auto: what pipe x tensor leaves */
    CHECK(topo(&t, "{\"axis\": [\"pipe\"], \"dims\": [2]}", 6, 5) == CLLM_OK && t.dims[CLLM_AXIS_DATA] == 3 &&
              t.coord[CLLM_AXIS_PIPE] == 1 && t.coord[CLLM_AXIS_DATA] == 2,
          "missing data axis: dims %d", t.dims[CLLM_AXIS_DATA]);
    CHECK(topo(&t, "{\"axis\": [\"pipe\", \"data\", \"tensor\"], \"dims\": [2, \"auto\", 2]}", 8, 0) == CLLM_OK &&
              t.dims[CLLM_AXIS_DATA] == 2,
          "auto data axis");
}

static void expect_fail(const char *text, int world, const char *needle) {
    cllm_topo t;
    cllm_status st = topo(&t, text, world, 0);
    CHECK(st != CLLM_OK, "accepted %s", text);
    CHECK(strstr(cllm_last_error(), needle) != NULL, "message for %s: %s", text, cllm_last_error());
}

static void test_errors(void) {
    expect_fail("{\"axis\": [\"pipe\", \"data\"], \"dims\": [2, 2]}", 3, "= 4 ranks, but 3 are running");
    expect_fail("{\"axis\": [\"pipe\", \"gpu\"], \"dims\": [2, 2]}", 4, "axis[1]: 'gpu'");
    expect_fail("{\"axis\": [\"pipe\", \"pipe\"], \"dims\": [2, 2]}", 4, "appears twice");
    expect_fail("{\"axis\": [\"pipe\", \"data\"], \"dims\": [2]}", 4, "2 axes but 1 dims");
    expect_fail("{\"axis\": [\"pipe\", \"data\"], \"dims\": [0, 2]}", 4, "dims[0] (pipe)");
    expect_fail("{\"axis\": [\"tensor\"], \"dims\": [4]}", 6, "does not divide the 6 ranks");
    expect_fail("[1, 2]", 2, "expected an object");
}

static cllm_model_config config(cllm_arch arch, int n_layer) {
    json_t *j = NULL;
    cllm_model_config c;
    memset(&c, 0, sizeof c);
    if (cllm_model_preset(&j, arch, "tiny") != CLLM_OK) return c;
    json_object_set_new(j, arch == CLLM_ARCH_GPT2 ? "n_layer" : arch == CLLM_ARCH_BLOOM ? "n_layer" : "num_hidden_layers",
                        json_integer(n_layer));
    CHECK(cllm_model_config_from_json(&c, j, "tiny") == CLLM_OK, "config: %s", cllm_last_error());
    json_decref(j);
    return c;
}

static cllm_status split(const cllm_model_config *c, int n, const char *parts, cllm_stage *st) {
    json_t *j = parts ? js(parts) : NULL;
    cllm_topo_parts *p = malloc(sizeof *p);
    cllm_status s = p ? cllm_topo_parts_parse(p, j, "cfg.json") : CLLM_ERR_NOMEM;
    if (!s) s = cllm_topo_partition(c, n, p, st, "cfg.json");
    free(p);
    json_decref(j);
    return s;
}

/* the best largest-stage sum over every contiguous split, by enumeration */
static size_t brute(const size_t *w, int n, int k, int start) {
    if (k == 1) {
        size_t s = 0;
        for (int i = start; i < n; i++) s += w[i];
        return s;
    }
    size_t best = SIZE_MAX, s = 0;
    for (int end = start + 1; end <= n - (k - 1); end++) {
        s += w[end - 1];
        size_t rest = brute(w, n, k - 1, end);
        size_t v = s > rest ? s : rest;
        if (v < best) best = v;
    }
    return best;
}

static void test_partition(void) {
    cllm_model_config c = config(CLLM_ARCH_BLOOM, 30);
    cllm_stage st[32];
    /* seed 003: bloom-7b's 30 blocks + 2 ends over 8 stages */
    CHECK(split(&c, 8, "[1, 5, 5, 5, 5, 5, 5, 1]", st) == CLLM_OK, "seed parts: %s", cllm_last_error());
    CHECK(st[0].embed && !st[0].head && st[0].n_layers == 0, "stage 0 is the embedding alone");
    for (int s = 1; s < 7; s++)
        CHECK(st[s].n_layers == 5 && st[s].first_layer == 5 * (s - 1) && !st[s].embed && !st[s].head,
              "stage %d: layers %d+%d", s, st[s].first_layer, st[s].n_layers);
    CHECK(st[7].head && !st[7].embed && st[7].n_layers == 0, "stage 7 is the head alone");
    CHECK(split(&c, 8, "[2, 5, 5, 5, 5, 5, 5, 1]", st) != CLLM_OK &&
              strstr(cllm_last_error(), "sums to 33, but the model has 32 blocks"),
          "bad sum: %s", cllm_last_error());
    CHECK(split(&c, 8, "[1, 5, 5]", st) != CLLM_OK && strstr(cllm_last_error(), "has 3 entries"), "wrong length");
    CHECK(split(&c, 2, "[0, 32]", st) != CLLM_OK && strstr(cllm_last_error(), "cfg.json: model_topo.parts[0]"),
          "empty stage: %s", cllm_last_error());
    CHECK(split(&c, 2, "[1, 40]", st) != CLLM_OK && strstr(cllm_last_error(), "cfg.json: model_topo.parts[1]"),
          "a stage larger than the model: %s", cllm_last_error());
    CHECK(split(&c, 2, "{\"a\": 1}", st) != CLLM_OK && strstr(cllm_last_error(), "model_topo.parts: expected an array"),
          "not an array: %s", cllm_last_error());
    CHECK(split(&c, 33, "\"uniform\"", st) != CLLM_OK && strstr(cllm_last_error(), "only 32 units"),
          "too many stages: %s", cllm_last_error());
    CHECK(split(&c, 2, "\"balanced\"", st) != CLLM_OK, "unknown method");

    /* uniform: 6 units over 4 stages -> 2 2 1 1 */
    cllm_model_config c4 = config(CLLM_ARCH_LLAMA, 4);
    CHECK(split(&c4, 4, "\"uniform\"", st) == CLLM_OK, "uniform");
    int want[4] = {2, 2, 1, 1};
    for (int s = 0; s < 4; s++) CHECK(st[s].n_units == want[s], "uniform stage %d: %d", s, st[s].n_units);
    CHECK(st[0].embed && st[0].first_layer == 0 && st[0].n_layers == 1, "stage 0: embedding + block 0");
    CHECK(st[3].head && st[3].first_layer == 4 && st[3].n_layers == 0, "stage 3: head only");

    /* parameters: optimal contiguous split, for each family and stage count */
    for (int a = 0; a < CLLM_ARCH_COUNT; a++) {
        cllm_model_config m = config((cllm_arch)a, 6);
        size_t w[8], n_params = 0, buf = 0, sum = 0;
        CHECK(cllm_model_config_unit_params(&m, w) == CLLM_OK, "unit params");
        CHECK(cllm_model_config_params(&m, &n_params, &buf) == CLLM_OK, "params");
        for (int u = 0; u < 8; u++) sum += w[u];
        size_t tied = m.tie_embeddings ? (size_t)m.vocab_size * (size_t)m.n_embd : 0;
        CHECK(sum == n_params + tied, "%s: units sum %zu, params %zu + tied %zu", cllm_arch_name((cllm_arch)a), sum,
              n_params, tied);
        for (int k = 1; k <= 8; k++) {
            CHECK(split(&m, k, NULL, st) == CLLM_OK, "parameters split k=%d", k);
            size_t worst = 0;
            int units = 0;
            for (int s = 0; s < k; s++) {
                size_t p = 0;
                for (int u = st[s].first_unit; u < st[s].first_unit + st[s].n_units; u++) p += w[u];
                if (p > worst) worst = p;
                CHECK(st[s].n_units >= 1 && st[s].first_unit == units, "stage %d contiguous", s);
                units += st[s].n_units;
            }
            CHECK(units == 8, "all units placed");
            CHECK(worst == brute(w, 8, k, 0), "%s k=%d: largest stage %zu, best possible %zu",
                  cllm_arch_name((cllm_arch)a), k, worst, brute(w, 8, k, 0));
        }
    }
}

static void test_tensor(void) {
    cllm_model_config c = config(CLLM_ARCH_LLAMA, 2);
    CHECK(cllm_topo_check_tensor(&c, 1, "m") == CLLM_OK, "tp 1");
    CHECK(cllm_topo_check_tensor(&c, c.n_kv_head, "m") == CLLM_OK || c.vocab_size % c.n_kv_head != 0, "tp kv heads");
    CHECK(cllm_topo_check_tensor(&c, c.n_head + 1, "m/config.json") != CLLM_OK &&
              strstr(cllm_last_error(), "m/config.json: tensor parallel size"),
          "tp not dividing heads: %s", cllm_last_error());
    c.n_kv_head = 1;
    CHECK(cllm_topo_check_tensor(&c, 2, "m") != CLLM_OK && strstr(cllm_last_error(), "num_key_value_heads"),
          "kv heads: %s", cllm_last_error());
}

int main(void) {
    test_mapping();
    test_errors();
    test_partition();
    test_tensor();
    return check_summary();
}
