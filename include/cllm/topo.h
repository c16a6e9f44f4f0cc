/*
 * cllm topo: how the ranks of a job are arranged in pipe x data x tensor,
 * and how a model's layer sequence is split into pipeline stages.
 *
 * The arrangement comes from the DeepSpeed-style config block
 *   "model_topo": {"process_topology": {"axis": ["pipe", "data"], "dims": [8, 1]},
 *                  "parts": [1, 5, 5, 5, 5, 5, 5, 1]}
 * Axes are named "pipe", "data" and "tensor" ("model" is accepted for
 * "tensor", as DeepSpeed names it), in any order; a missing axis has size 1.
 * Ranks are numbered in row-major order over the axes as listed: the last
 * axis varies fastest (DeepSpeed's ProcessTopology does the same), so with
 * axis [pipe, data] and dims [2, 2] ranks 0 and 1 are the two data replicas
 * of stage 0 and ranks 2 and 3 those of stage 1.
 *
 * The layer sequence of a model is its units in order: the embedding, each
 * transformer block, and the head (final norm + LM head); n_layer + 2 units.
 * `parts` lists how many units each stage runs (seed 003: the embedding and
 * the head each count as one block), or names a method: "uniform" (as equal
 * unit counts as possible) or "parameters" (contiguous stages whose largest
 * parameter count is as small as possible). Without `parts` the method is
 * "parameters", DeepSpeed's default.
 */
#ifndef CLLM_TOPO_H
#define CLLM_TOPO_H

#include <stdbool.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CLLM_AXIS_PIPE = 0, CLLM_AXIS_DATA, CLLM_AXIS_TENSOR, CLLM_AXIS_COUNT } cllm_axis;

/* "pipe", "data", "tensor". */
const char *cllm_axis_name(cllm_axis a);

typedef struct {
    int world;                  /* pipe x data x tensor */
    int dims[CLLM_AXIS_COUNT];  /* size of each axis, indexed by cllm_axis */
    int order[CLLM_AXIS_COUNT]; /* axes from slowest to fastest varying rank digit */
    int rank;
    int coord[CLLM_AXIS_COUNT]; /* this rank's position on each axis */
} cllm_topo;

struct json_t;

/* model_topo.process_topology as read from a config: the axes in the order
 * given (slowest varying rank digit first) with their sizes. */
typedef struct {
    int n_axes;                      /* 0: not given (every rank on the data axis) */
    cllm_axis axis[CLLM_AXIS_COUNT]; /* "axis": "pipe", "data", "tensor" ("model" is DeepSpeed's name
                                        for tensor), each at most once */
    int dims[CLLM_AXIS_COUNT];       /* "dims": sizes 1..2^20, one per axis; 0 for a data axis given as
                                        -1 or "auto" (world / (pipe x tensor) ranks) */
} cllm_topo_layout;

/* Reads a process_topology object {"axis": [...], "dims": [...]} (NULL or
 * JSON null: n_axes 0) into *l. Errors (not an object, an unknown or repeated
 * axis name, dims that are not positive integers or do not match axis in
 * length) name the key "model_topo.process_topology..."; `where` names the
 * config file in messages. The sizes are checked against a world by
 * cllm_topo_init. */
cllm_status cllm_topo_layout_parse(cllm_topo_layout *l, const struct json_t *process_topology, const char *where);

/* Places `rank` of a job of `world` ranks in the layout `l` (NULL or
 * n_axes 0: everything on the data axis). An axis left out has size 1, but
 * a data axis left out or given as "auto" takes world / (pipe x tensor).
 * Fails, naming model_topo.process_topology and the sizes, when that does
 * not divide or the product is not the world size. */
cllm_status cllm_topo_init(cllm_topo *t, const cllm_topo_layout *l, int world, int rank, const char *where);

/* The rank at coordinates coord[CLLM_AXIS_COUNT]. */
int cllm_topo_rank_of(const cllm_topo *t, const int *coord);

/* The ranks that differ from t->rank only along `axis`, in coordinate order
 * (dims[axis] entries): the data-parallel group, the pipeline, the tensor
 * group. ranks[t->coord[axis]] == t->rank. */
void cllm_topo_group(const cllm_topo *t, cllm_axis axis, int *ranks);

/* One pipeline stage: a contiguous run of units. */
typedef struct {
    int first_unit, n_units; /* units: 0 = embedding, 1..n_layer = blocks, n_layer + 1 = head */
    int first_layer, n_layers; /* the transformer blocks among them (none: first_layer is the
                                  index the next block would have) */
    bool embed, head;        /* holds the embedding / the head */
} cllm_stage;

#define CLLM_TOPO_MAX_STAGES 1024

/* How model_topo.parts splits the units into stages. */
typedef enum {
    CLLM_PARTS_PARAMETERS = 0, /* "parameters" (default): contiguous stages balancing parameter counts */
    CLLM_PARTS_UNIFORM,        /* "uniform": equal unit counts, the first stages one more */
    CLLM_PARTS_COUNTS          /* an array: the units of each stage, in order */
} cllm_parts_mode;

/* model_topo.parts as read from a config. */
typedef struct {
    cllm_parts_mode mode;
    int n_counts;                       /* entries of the array (CLLM_PARTS_COUNTS), at most
                                           CLLM_TOPO_MAX_STAGES */
    int counts[CLLM_TOPO_MAX_STAGES];   /* each >= 1; their sum must be n_layer + 2 */
} cllm_topo_parts;

/* Reads model_topo.parts (an array of positive counts, "uniform",
 * "parameters"; NULL or JSON null: "parameters") into *p. Errors name the
 * key ("model_topo.parts[2]: ..."); `where` names the config file. The
 * counts are checked against the model by cllm_topo_partition. */
cllm_status cllm_topo_parts_parse(cllm_topo_parts *p, const struct json_t *parts, const char *where);

/* Splits the n_layer + 2 units of a model of config c into n_stages stages
 * following `parts` (NULL: "parameters"). Fails naming model_topo.parts
 * when the counts do not sum to n_layer + 2, have the wrong length, or hold
 * a count larger than the model, and when there are more stages than
 * units. */
cllm_status cllm_topo_partition(const cllm_model_config *c, int n_stages, const cllm_topo_parts *parts,
                                cllm_stage *stages, const char *where);

/* Checks that a model can be split over `tensor` ranks in the Megatron way:
 * query heads, key/value heads and the FFN width divisible by it (the
 * vocabulary need not be: it is padded, see cllm_tp_slice). The message
 * names the config.json key and the sizes. */
cllm_status cllm_topo_check_tensor(const cllm_model_config *c, int tensor, const char *where);

#ifdef __cplusplus
}
#endif
#endif
