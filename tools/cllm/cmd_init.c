/*
 * cllm init: writes a randomly initialised HF model folder from a preset,
 * with config keys overridden by --set key=value (values parsed as JSON,
 * else taken as strings).
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "commands.h"

int cmd_init(int argc, char **argv) {
    const char *arch_name, *preset_name, *out, *shard;
    long long seed;
    arg_list sets;
    arg_spec specs[] = {
        {"arch", ARG_STR, &arch_name, NULL, true, "model family: gpt2, llama, bloom or mixtral"},
        {"preset", ARG_STR, &preset_name, "tiny", false,
         "shape preset (gpt2: tiny, gpt2-124M, gpt2-355M; llama: tiny, small, llama-100M; bloom: tiny, bloom-560m; mixtral: tiny, mixtral-8x100M)"},
        {"set", ARG_LIST, &sets, NULL, false, "override config.json keys: key=value (value is JSON or a string)"},
        {"seed", ARG_I64, &seed, "0", false, "random seed for the weights"},
        {"out", ARG_STR, &out, NULL, true, "output folder"},
        {"max-shard-size", ARG_STR, &shard, "0", false, "split safetensors into shards of at most this size (e.g. 2GB); 0 = one file"},
    };
    const char *summary = "Writes a randomly initialised HF model folder (config.json + safetensors).";
    int rc = args_parse("init", summary, argc, argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    json_t *config = NULL;
    cllm_model *m = NULL;
    size_t max_shard = 0;
    if (cllm_arch_from_name(arch_name) == CLLM_ARCH_COUNT && strcmp(arch_name, "mixtral")) {
        fprintf(stderr, "cllm init: --arch: unknown family '%s' (gpt2, llama, bloom, mixtral)\n", arch_name);
        rc = 2;
        goto done;
    }
    if (cllm_parse_size(shard, &max_shard)) {
        fprintf(stderr, "cllm init: --max-shard-size: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    if (cllm_model_family_preset(&config, arch_name, preset_name)) {
        fprintf(stderr, "cllm init: --preset: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    for (int i = 0; i < sets.n; i++) {
        const char *kv = sets.items[i], *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            fprintf(stderr, "cllm init: --set '%s': expected key=value\n", kv);
            rc = 2;
            goto done;
        }
        char key[128];
        size_t klen = (size_t)(eq - kv);
        if (klen >= sizeof key) klen = sizeof key - 1;
        memcpy(key, kv, klen);
        key[klen] = '\0';
        if (!cllm_model_family_key_known(arch_name, key)) {
            fprintf(stderr, "cllm init: --set '%s': '%s' is not a %s config key that cllm reads (the config.json "
                    "that `cllm init --arch %s` writes lists them)\n", kv, key, arch_name, arch_name);
            rc = 2;
            goto done;
        }
        json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
        if (!v) v = json_string(eq + 1);
        json_object_set_new(config, key, v);
    }
    if (cllm_model_init_random(&m, config, (uint64_t)seed)) {
        rc = tool_fail("init");
        goto done;
    }
    if (cllm_model_save(m, out, max_shard)) {
        rc = tool_fail("init");
        goto done;
    }
    fprintf(stderr, "cllm init: wrote %s model (%zu parameters) to %s\n", arch_name, cllm_model_n_params(m), out);
done:
    cllm_model_free(m);
    json_decref(config);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
