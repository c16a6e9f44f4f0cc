/*
 * Process topology (pipe x data x tensor) and the split of a model's layer
 * sequence into pipeline stages; see include/cllm/topo.h.
 */
#include "cllm/topo.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const axis_names[CLLM_AXIS_COUNT] = {"pipe", "data", "tensor"};

const char *cllm_axis_name(cllm_axis a) { return (unsigned)a < CLLM_AXIS_COUNT ? axis_names[a] : "?"; }

static int axis_from_name(const char *s) {
    if (!s) return -1;
    for (int a = 0; a < CLLM_AXIS_COUNT; a++)
        if (strcmp(s, axis_names[a]) == 0) return a;
    if (strcmp(s, "model") == 0) return CLLM_AXIS_TENSOR; /* DeepSpeed's name for it */
    return -1;
}

#define PT "model_topo.process_topology"

cllm_status cllm_topo_layout_parse(cllm_topo_layout *l, const json_t *pt, const char *where) {
    memset(l, 0, sizeof *l);
    if (!pt || json_is_null(pt)) return CLLM_OK;
    if (!json_is_object(pt)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected an object", where, PT);
    json_t *axis = json_object_get(pt, "axis"), *dims = json_object_get(pt, "dims");
    if (!json_is_array(axis) || !json_is_array(dims))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected arrays \"axis\" and \"dims\"", where, PT);
    if (json_array_size(axis) != json_array_size(dims))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: %zu axes but %zu dims", where, PT, json_array_size(axis),
                         json_array_size(dims));
    if (json_array_size(axis) > CLLM_AXIS_COUNT)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.axis: at most pipe, data and tensor", where, PT);
    bool seen[CLLM_AXIS_COUNT] = {false, false, false};
    for (size_t i = 0; i < json_array_size(axis); i++) {
        const char *name = json_string_value(json_array_get(axis, i));
        int a = axis_from_name(name);
        if (a < 0)
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.axis[%zu]: '%s' (expected pipe, data or tensor)", where, PT, i,
                             name ? name : "(not a string)");
        if (seen[a]) return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.axis: '%s' appears twice", where, PT, axis_names[a]);
        seen[a] = true;
        json_t *d = json_array_get(dims, i);
        bool is_auto = (json_is_string(d) && strcmp(json_string_value(d), "auto") == 0) ||
                       (json_is_integer(d) && json_integer_value(d) == -1);
        int size = 0;
        if (!is_auto || a != CLLM_AXIS_DATA) {
            if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > 1 << 20)
                return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.dims[%zu] (%s): expected a positive integer%s", where, PT, i,
                                 axis_names[a], a == CLLM_AXIS_DATA ? " or \"auto\"" : "");
            size = (int)json_integer_value(d);
        }
        l->axis[l->n_axes] = (cllm_axis)a;
        l->dims[l->n_axes++] = size;
    }
    return CLLM_OK;
}

cllm_status cllm_topo_init(cllm_topo *t, const cllm_topo_layout *l, int world, int rank, const char *where) {
    memset(t, 0, sizeof *t);
    if (world < 1 || rank < 0 || rank >= world)
        return CLLM_FAIL(CLLM_ERR_ARG, "rank %d of a world of %d", rank, world);
    t->world = world;
    t->rank = rank;
    for (int a = 0; a < CLLM_AXIS_COUNT; a++) t->dims[a] = 1;
    /* default order: pipe, data, tensor (tensor ranks are neighbours) */
    int listed[CLLM_AXIS_COUNT], n_listed = 0;
    bool seen[CLLM_AXIS_COUNT] = {false, false, false};
    int data_auto = 1;
    if (l && (l->n_axes < 0 || l->n_axes > CLLM_AXIS_COUNT))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: %d axes (at most %d)", where, PT, l->n_axes, CLLM_AXIS_COUNT);
    for (int i = 0; l && i < l->n_axes; i++) {
        int a = (int)l->axis[i];
        if (a < 0 || a >= CLLM_AXIS_COUNT || seen[a] || l->dims[i] < 0 || (l->dims[i] == 0 && a != CLLM_AXIS_DATA))
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: a malformed layout (axis %d, size %d)", where, PT, a, l->dims[i]);
        seen[a] = true;
        listed[n_listed++] = a;
        if (l->dims[i] == 0) continue; /* the auto data axis */
        t->dims[a] = l->dims[i];
        if (a == CLLM_AXIS_DATA) data_auto = 0;
    }
    /* the order: listed axes as given, then the missing ones (size 1 or the
     * auto data axis) in the default order around them */
    int k = 0;
    for (int i = 0; i < n_listed; i++) t->order[k++] = listed[i];
    for (int a = 0; a < CLLM_AXIS_COUNT; a++)
        if (!seen[a]) t->order[k++] = a;
    long model = (long)t->dims[CLLM_AXIS_PIPE] * t->dims[CLLM_AXIS_TENSOR];
    if (data_auto) {
        if (world % model != 0)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "%s: %s: pipe %d x tensor %d = %ld does not divide the %d ranks running (the data axis "
                             "takes what is left)",
                             where, PT, t->dims[CLLM_AXIS_PIPE], t->dims[CLLM_AXIS_TENSOR], model, world);
        t->dims[CLLM_AXIS_DATA] = (int)(world / model);
    }
    long prod = model * t->dims[CLLM_AXIS_DATA];
    if (prod != world)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "%s: %s: pipe %d x data %d x tensor %d = %ld ranks, but %d %s running (mpirun -np %ld, or "
                         "change dims)",
                         where, PT, t->dims[CLLM_AXIS_PIPE], t->dims[CLLM_AXIS_DATA], t->dims[CLLM_AXIS_TENSOR], prod,
                         world, world == 1 ? "is" : "are", prod);
    int r = rank;
    for (int i = CLLM_AXIS_COUNT - 1; i >= 0; i--) {
        int a = t->order[i];
        t->coord[a] = r % t->dims[a];
        r /= t->dims[a];
    }
    return CLLM_OK;
}

int cllm_topo_rank_of(const cllm_topo *t, const int *coord) {
    int r = 0;
    for (int i = 0; i < CLLM_AXIS_COUNT; i++) {
        int a = t->order[i];
        r = r * t->dims[a] + coord[a];
    }
    return r;
}

void cllm_topo_group(const cllm_topo *t, cllm_axis axis, int *ranks) {
    int c[CLLM_AXIS_COUNT];
    memcpy(c, t->coord, sizeof c);
    for (int i = 0; i < t->dims[axis]; i++) {
        c[axis] = i;
        ranks[i] = cllm_topo_rank_of(t, c);
    }
}

/* ------------------------------------------------------------ stages */

#define PARTS "model_topo.parts"

static void fill_stages(cllm_stage *st, const int *counts, int n_stages, int n_layer) {
    int u = 0;
    for (int s = 0; s < n_stages; s++) {
        cllm_stage *x = &st[s];
        x->first_unit = u;
        x->n_units = counts[s];
        x->embed = u == 0;
        x->head = u + counts[s] == n_layer + 2;
        int lo = u < 1 ? 1 : u, hi = u + counts[s] < n_layer + 1 ? u + counts[s] : n_layer + 1;
        x->first_layer = lo - 1;
        x->n_layers = hi > lo ? hi - lo : 0;
        u += counts[s];
    }
}

/* Contiguous split of w[n] into k non-empty parts minimising the largest
 * part sum (dynamic programming over n units and k parts; n is a layer
 * count, small). Among equally good splits the one whose last stage starts
 * latest is taken, so the split is a pure function of the weights. */
static cllm_status balance(const size_t *w, int n, int k, int *counts) {
    size_t *pre = calloc((size_t)n + 1, sizeof *pre);
    size_t *best = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *cut);
    if (!pre || !best || !cut) {
        free(pre), free(best), free(cut);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + w[i];
    for (int p = 0; p <= k; p++)
        for (int j = 0; j <= n; j++) best[(size_t)p * (n + 1) + j] = SIZE_MAX, cut[(size_t)p * (n + 1) + j] = -1;
    best[0] = 0;
    for (int p = 1; p <= k; p++)
        for (int j = p; j <= n; j++)
            for (int i = p - 1; i < j; i++) {
                size_t prev = best[(size_t)(p - 1) * (n + 1) + i];
                if (prev == SIZE_MAX) continue;
                size_t part = pre[j] - pre[i];
                size_t v = prev > part ? prev : part;
                size_t *b = &best[(size_t)p * (n + 1) + j];
                if (v <= *b) {
                    *b = v;
                    cut[(size_t)p * (n + 1) + j] = i;
                }
            }
    int j = n;
    for (int p = k; p >= 1; p--) {
        int i = cut[(size_t)p * (n + 1) + j];
        counts[p - 1] = j - i;
        j = i;
    }
    free(pre), free(best), free(cut);
    return CLLM_OK;
}

cllm_status cllm_topo_parts_parse(cllm_topo_parts *p, const json_t *parts, const char *where) {
    p->mode = CLLM_PARTS_PARAMETERS;
    p->n_counts = 0;
    if (!parts || json_is_null(parts)) return CLLM_OK;
    if (json_is_string(parts)) {
        const char *m = json_string_value(parts);
        if (strcmp(m, "parameters") == 0) return CLLM_OK;
        if (strcmp(m, "uniform") == 0) {
            p->mode = CLLM_PARTS_UNIFORM;
            return CLLM_OK;
        }
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: '%s' (expected an array of block counts, \"uniform\" or \"parameters\")",
                         where, PARTS, m);
    }
    if (!json_is_array(parts))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected an array of block counts, \"uniform\" or \"parameters\"", where,
                         PARTS);
    if (json_array_size(parts) > CLLM_TOPO_MAX_STAGES)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: %zu stages (at most %d)", where, PARTS, json_array_size(parts),
                         CLLM_TOPO_MAX_STAGES);
    size_t i;
    json_t *v;
    json_array_foreach(parts, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20)
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s[%zu]: expected a positive number of blocks", where, PARTS, i);
        p->counts[i] = (int)json_integer_value(v);
    }
    p->mode = CLLM_PARTS_COUNTS;
    p->n_counts = (int)json_array_size(parts);
    return CLLM_OK;
}

cllm_status cllm_topo_partition(const cllm_model_config *c, int n_stages, const cllm_topo_parts *parts,
                                cllm_stage *stages, const char *where) {
    int units = c->n_layer + 2;
    if (n_stages < 1) return CLLM_FAIL(CLLM_ERR_ARG, "%s: %d pipeline stages", where, n_stages);
    if (n_stages > units)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "%s: %d pipeline stages but the model has only %d units to split (embedding, %d blocks, "
                         "head): use at most %d stages",
                         where, n_stages, units, c->n_layer, units);
    int *counts = calloc((size_t)n_stages, sizeof *counts);
    if (!counts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = CLLM_OK;
    cllm_parts_mode mode = parts ? parts->mode : CLLM_PARTS_PARAMETERS;
    if (mode == CLLM_PARTS_COUNTS) {
        if (parts->n_counts != n_stages) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "%s: %s has %d entries but the pipe axis has %d stages", where, PARTS,
                           parts->n_counts, n_stages);
            goto done;
        }
        long sum = 0;
        for (int s = 0; s < n_stages; s++) {
            if (parts->counts[s] < 1 || parts->counts[s] > units) {
                st = CLLM_FAIL(CLLM_ERR_ARG, "%s: %s[%d]: expected a positive number of blocks", where, PARTS, s);
                goto done;
            }
            counts[s] = parts->counts[s];
            sum += counts[s];
        }
        if (sum != units) {
            st = CLLM_FAIL(CLLM_ERR_ARG,
                           "%s: %s sums to %ld, but the model has %d blocks to place: the embedding, %d transformer "
                           "blocks and the head",
                           where, PARTS, sum, units, c->n_layer);
            goto done;
        }
    } else if (mode == CLLM_PARTS_PARAMETERS) {
        size_t *w = malloc((size_t)units * sizeof *w);
        if (!w) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        st = cllm_model_config_unit_params(c, w);
        if (!st) st = balance(w, units, n_stages, counts);
        free(w);
        if (st) goto done;
    } else {
        for (int s = 0; s < n_stages; s++) counts[s] = units / n_stages + (s < units % n_stages ? 1 : 0);
    }
    fill_stages(stages, counts, n_stages, c->n_layer);
done:
    free(counts);
    return st;
}

cllm_status cllm_topo_check_tensor(const cllm_model_config *c, int tp, const char *where) {
    if (tp <= 1) return CLLM_OK;
    struct {
        const char *what;
        long n;
    } need[] = {{"num_attention_heads (query heads)", c->n_head},
                {"num_key_value_heads", c->n_kv_head},
                {"intermediate_size (FFN width)", c->n_inner}}; /* the vocabulary is padded */
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (need[i].n % tp != 0)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "%s: tensor parallel size %d does not divide the model's %s = %ld; choose a tensor size "
                             "that divides it",
                             where, tp, need[i].what, need[i].n);
    return CLLM_OK;
}
