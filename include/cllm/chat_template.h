/*
 * cllm chat_template: the `chat_template` of a Hugging Face model folder
 * (a Jinja template in tokenizer_config.json or chat_template.jinja),
 * compiled once and rendered into the prompt text as HF transformers'
 * apply_chat_template does: Jinja2 with trim_blocks and lstrip_blocks on,
 * no autoescaping, the globals raise_exception(msg) and strftime_now(fmt),
 * a tojson filter that keeps non-ASCII text and key order, and the
 * variables messages, add_generation_prompt, bos_token, eos_token, tools
 * and documents (none unless given).
 *
 * Supported subset (what published chat templates use; docs/chat_templates.md
 * has the full list and the known differences from Jinja2):
 *   text, {{ }}, {% %}, {# #}, whitespace control `-` and `+` on both sides;
 *   if / elif / else, for (loop.index, index0, revindex, revindex0, first,
 *   last, length, previtem, nextitem; tuple targets; `for x in y if c`;
 *   else), break / continue, set (also `set x %}...{% endset`, and
 *   namespace attributes `set ns.x = ...`), macro and macro calls,
 *   generation blocks (their body is rendered), filter blocks;
 *   expressions: literals (strings with Python escapes, integers, floats,
 *   true/false/none in both spellings, lists, tuples, dicts), attribute and
 *   subscript access, slices, calls, filters, tests, the operators
 *   + - * / // % ** ~ == != < <= > >= and or not in, not in, is, is not, and
 *   `a if c else b`; the filters, tests, string / dict methods and globals
 *   listed in docs/chat_templates.md.
 * Values follow Python: str() of a list prints ['a', 1], of none None;
 * 1 == 1.0; `/` is true division; undefined variables are Jinja2's default
 * Undefined (empty when printed, false, iterable as empty; an attribute or
 * arithmetic on them is an error as in Jinja2).
 *
 * Limits of one render: 16 MiB of output (and of any string built), 10^7
 * evaluation steps (each expression node, statement and loop iteration
 * counts), lists of at most 10^6 items from range(), 256 nested macro calls.
 * Exceeding one is a CLLM_ERR_ARG naming the template line.
 */
#ifndef CLLM_CHAT_TEMPLATE_H
#define CLLM_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>

#include "cllm/core.h"
#include "cllm/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_chat_template cllm_chat_template;

/* Compiles `source` (NUL-terminated UTF-8). `what` names the source in
 * messages (e.g. "DIR/tokenizer_config.json chat_template"; NULL: "template").
 * Syntax errors: CLLM_ERR_FORMAT "WHAT:LINE:COL: message" (1-based, columns
 * in bytes). *out is freed with cllm_chat_template_free; NULL on failure. */
cllm_status cllm_chat_template_init(cllm_chat_template **out, const char *source, const char *what);

/* Frees a compiled template; NULL is a no-op. */
void cllm_chat_template_free(cllm_chat_template *t);

/* Renders the template with the variables
 *   messages               the JSON array `messages` (message objects with
 *                          role, content as a string or a list of
 *                          {"type": "text", "text": ...} parts, and any
 *                          other keys such as tool_calls); NULL: []
 *   add_generation_prompt
 *   bos_token, eos_token   strings; NULL leaves the variable undefined
 *   tools, documents       none, as transformers passes them
 * plus every key of `extra` (a JSON object or NULL), which may override
 * tools / documents or add others (date_string, ...).
 * *out: malloc'ed NUL-terminated text the caller free()s (NULL on failure).
 * Errors (CLLM_ERR_ARG): raise_exception("msg") leaves exactly
 * "cllm_chat_template_render: msg"; other runtime errors (undefined method,
 * wrong types, a limit above) leave "cllm_chat_template_render: WHAT:LINE:
 * message". The arguments are only read. Thread-safe: any number of threads
 * may render one compiled template at once. */
cllm_status cllm_chat_template_render(const cllm_chat_template *t, const json_t *messages, bool add_generation_prompt,
                                      const char *bos_token, const char *eos_token, const json_t *extra, char **out);

/* Reads DIR/tokenizer_config.json: "chat_template" (a string, or a list of
 * {"name", "template"} objects of which the one named "default" is used),
 * and "bos_token" / "eos_token" (strings, or AddedToken objects whose
 * "content" is used). When the config has no chat_template, a
 * DIR/chat_template.jinja file is used if present. A folder without a
 * template (or without tokenizer_config.json) gives *out = NULL and CLLM_OK.
 * *bos_token / *eos_token are malloc'ed (caller free()s) or NULL when the
 * config does not set them; either pointer may be NULL if not wanted.
 * Errors name the file and key (CLLM_ERR_FORMAT for a wrong type or a
 * syntax error, CLLM_ERR_IO for an unreadable file). */
cllm_status cllm_chat_template_load_dir(cllm_chat_template **out, char **bos_token, char **eos_token, const char *dir);

/* ---- the format cllm trains on ---- */

/* Writes into *source (malloc'ed, caller free()s) a chat template that
 * renders a message list into exactly the text cllm_sample_parse renders
 * for the same conversation record with prompt template t (the defaults of
 * cllm_template_load(&t, NULL): "### Human:\n...\n\n### Assistant:\n..."):
 * the BOS token as t->bos says (automatic: when bos_token is set and differs
 * from eos_token), t->system (or the content of a leading system message
 * instead), each user message as ask_prefix + content + ask_suffix, each
 * assistant message as ans_prefix + content + eos_token (when t->eos), and
 * ans_suffix between an answer and the next turn. add_generation_prompt
 * appends what comes before an answer (ans_suffix after an answer, then
 * ans_prefix). Roles: user / human / ask and assistant / gpt / ans; any
 * other role raises an exception. Content may be a string or a list of text
 * parts (joined). */
cllm_status cllm_chat_template_for_sample(const cllm_template *t, char **source);

/* Gives folder `dir` (a model folder being written) the tokenizer of
 * `tokenizer_dir` with the chat template of t: tokenizer.json,
 * tokenizer.model and special_tokens_map.json are copied when present (and
 * tokenizer_dir is another folder), and dir/tokenizer_config.json is
 * tokenizer_dir's config (or {} when there is none, or tokenizer_dir is
 * NULL) with "chat_template" set to cllm_chat_template_for_sample(t). Every
 * file is written atomically. Errors name the file. */
cllm_status cllm_chat_template_write_dir(const char *dir, const char *tokenizer_dir, const cllm_template *t);

#ifdef __cplusplus
}
#endif
#endif
