/*
 * cllm lora <subcommand>: LoRA adapter folders (docs/lora.md).
 *
 *   cllm lora merge --model BASE --adapter DIR --out MERGED
 *       folds the adapter into the base (W += scale * B A; transposed for
 *       GPT-2's Conv1D; modules_to_save and trained biases replace the
 *       base's): PEFT's merge_and_unload. MERGED is a plain HF folder
 *       (config.json, model.safetensors) plus the base's tokenizer files.
 *       A reward model's adapter (task_type SEQ_CLS) gives a
 *       *ForSequenceClassification folder, from a reward model base or
 *       from the causal LM it was trained from (the score head is the
 *       adapter's).
 * Exit codes: 0 ok, 1 failure, 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cllm/io.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "commands.h"

static int merge(int argc, char **argv) {
    const char *model_dir, *adapter, *out, *shard;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF base model folder"},
        {"adapter", ARG_STR, &adapter, NULL, true, "PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors)"},
        {"out", ARG_STR, &out, NULL, true, "output HF folder for the merged model"},
        {"max-shard-size", ARG_STR, &shard, "0", false, "shard the safetensors (e.g. 2GB); 0 = one file"},
    };
    int rc = args_parse("lora merge", "Folds a LoRA adapter into its base model (PEFT's merge_and_unload).", argc, argv,
                        specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    size_t max_shard = 0;
    if (cllm_parse_size(shard, &max_shard)) {
        fprintf(stderr, "cllm lora merge: --max-shard-size '%s': expected a size such as 2GB or 0\n", shard);
        rc = 2;
    } else if (cllm_model_load(&m, model_dir) || cllm_lora_load_model(&m, adapter, 0)) {
        rc = tool_fail("lora merge");
    } else {
        size_t trained = cllm_model_trainable_numel(m);
        if (cllm_lora_merge(m) || cllm_make_dirs(out) || cllm_model_save(m, out, max_shard)) rc = tool_fail("lora merge");
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                            "generation_config.json"};
        for (size_t i = 0; i < sizeof files / sizeof files[0] && !rc; i++)
            rc = tool_copy_if_present("lora merge", model_dir, out, files[i]);
        if (!rc)
            fprintf(stderr, "cllm lora merge: %s + %s (%zu adapter parameters) -> %s\n", model_dir, adapter, trained, out);
    }
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}

static const tool_subcommand subcommands[] = {
    {"merge", merge, "fold an adapter into its base model and write a plain HF folder"},
};

int cmd_lora(int argc, char **argv) {
    return tool_dispatch("lora", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]), argc, argv);
}
