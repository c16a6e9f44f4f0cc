/*
 * cllm json: thin helpers over jansson for reading config files with
 * messages that name the file, line, column and key.
 *
 * Getters look up `key` in object `obj` read from file `path` (used only in
 * messages). They return CLLM_OK and set *out when the key is present with
 * the right type, CLLM_ERR_FORMAT naming path and key when the type is wrong,
 * and for a missing key: the *_opt variants leave *out unchanged and return
 * CLLM_OK, the plain variants fail with "missing key".
 * Integers given as floats with no fractional part (e.g. 1e5) are accepted
 * for int getters; booleans are never numbers.
 */
#ifndef CLLM_JSON_H
#define CLLM_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads a JSON file; on a syntax error the message is "path:line:col: text".
 * *out is a new reference the caller json_decref()s. */
cllm_status cllm_json_load_file(json_t **out, const char *path);
/* Same for a string already in memory; `what` names it in messages. */
cllm_status cllm_json_parse(json_t **out, const char *text, size_t len, const char *what);

cllm_status cllm_json_get_int(const json_t *obj, const char *key, int64_t *out, const char *path);
cllm_status cllm_json_get_int_opt(const json_t *obj, const char *key, int64_t *out, const char *path);
cllm_status cllm_json_get_num(const json_t *obj, const char *key, double *out, const char *path);
cllm_status cllm_json_get_num_opt(const json_t *obj, const char *key, double *out, const char *path);
cllm_status cllm_json_get_bool_opt(const json_t *obj, const char *key, bool *out, const char *path);
/* *out is borrowed from obj. */
cllm_status cllm_json_get_str(const json_t *obj, const char *key, const char **out, const char *path);
cllm_status cllm_json_get_str_opt(const json_t *obj, const char *key, const char **out, const char *path);

/* Writes `j` as pretty JSON (2-space indent, keys in insertion order,
 * trailing newline) atomically to path. */
cllm_status cllm_json_save_file(const json_t *j, const char *path);

#ifdef __cplusplus
}
#endif
#endif
