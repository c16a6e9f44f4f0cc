/*
 * cllm convert: a training checkpoint (sharded over ranks or single-process)
 * to one HF model folder: config.json plus F32 safetensors, split into
 * shards with model.safetensors.index.json above --max-shard-size, and the
 * tokenizer files when the checkpoint or its run folder has them.
 *
 * The checkpoint is verified against its manifest first. The parameters are
 * gathered from the shard files into one flat buffer (the model's own, so
 * the model is in memory once) and written as cllm_model_save writes it: a
 * converted folder is byte-identical to the model a run saves at that step.
 *
 * Stage layouts (cllm/split.h, seed 003's hg_to_pp / pp_to_hg): --model
 * splits an HF folder into per-unit, per-tensor-rank files, --layout merges
 * such a folder back into an HF folder, bit for bit. `cllm convert hg_to_pp
 * --input-path A --save-path B` and `pp_to_hg` are accepted as those two.
 *
 * --to gguf writes the model (from --model or --checkpoint) and its
 * tokenizer as one GGUF file that llama.cpp runs (cllm/gguf.h).
 *
 * --quantize int8|q4|bf16 writes an HF or checkpoint folder (--model) with
 * its matrices in that weight format (cllm_model_save_weights,
 * docs/formats/quantized.md), loaded by generate/eval/serve as it is.
 *
 * --expert-layout per-expert|fused: the layout of a Mixtral's expert tensors
 * in the HF folder written (docs/moe.md); per-expert by default, since
 * transformers 4.x reads only that one and 5.x converts it when loading.
 * With --model (and no --tensor) it writes an HF folder in that layout
 * instead of a stage layout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cllm/checkpoint.h"
#include "cllm/gguf.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/split.h"
#include "cllm/tokenizer.h"
#include "cllm/topo.h"
#include "commands.h"

static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                              "vocab.json", "merges.txt", "tokenizer.model", NULL};

/* Copies the tokenizer files found in the first of dirs that has
 * tokenizer.json or tokenizer.model; returns how many were copied. */
static cllm_status copy_tokenizer(const char *const *dirs, int n_dirs, const char *out, int *copied) {
    *copied = 0;
    char src[4096], dst[4096];
    for (int d = 0; d < n_dirs; d++) {
        if (!dirs[d]) continue;
        int found = 0;
        for (int i = 0; tokenizer_files[i]; i++) {
            if (snprintf(src, sizeof src, "%s/%s", dirs[d], tokenizer_files[i]) >= (int)sizeof src) continue;
            if (access(src, R_OK) != 0) continue;
            char *data = NULL;
            size_t len = 0;
            cllm_status st = cllm_read_file(src, &data, &len);
            if (!st) {
                if (snprintf(dst, sizeof dst, "%s/%s", out, tokenizer_files[i]) >= (int)sizeof dst)
                    st = CLLM_FAIL(CLLM_ERR_ARG, "output path too long: %s", out);
                else
                    st = cllm_write_file_atomic(dst, data, len);
            }
            free(data);
            if (st) return st;
            found++;
        }
        if (found) {
            *copied = found;
            return CLLM_OK;
        }
    }
    return CLLM_OK;
}

/* seed 003's spelling: convert hg_to_pp|pp_to_hg --input-path A --save-path B */
static int seed_form(int argc, char **argv) {
    bool to_pp = strcmp(argv[0], "hg_to_pp") == 0;
    const char *in = NULL, *outp = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--input-path") == 0) in = argv[i + 1];
        else if (strcmp(argv[i], "--save-path") == 0) outp = argv[i + 1];
        else {
            fprintf(stderr, "cllm convert %s: unknown flag %s (expected --input-path DIR --save-path DIR)\n", argv[0],
                    argv[i]);
            return 2;
        }
    }
    if (!in || !outp || argc % 2 == 0) {
        fprintf(stderr, "cllm convert %s: expected --input-path DIR --save-path DIR\n", argv[0]);
        return 2;
    }
    char *args[] = {to_pp ? (char *)"--model" : (char *)"--layout", (char *)in, (char *)"--out", (char *)outp, NULL};
    return cmd_convert(4, args);
}

/* --to gguf: model m (loaded from src) and the tokenizer of tok_dir (or
 * the first of fallbacks that has one) -> the GGUF file out. */
static int to_gguf(cllm_model *m, const char *src, const char *tok_dir, const char *const *fallbacks, int n_fb,
                   const char *type, const char *out) {
    cllm_gguf_params p = cllm_gguf_params_default();
    if (!cllm_gguf_type_from_name(type, &p.type)) {
        fprintf(stderr, "cllm convert: --type %s: expected f32, f16, q8_0 or q4_0\n", type);
        return 2;
    }
    const char *dir = tok_dir;
    char probe[4096];
    for (int i = 0; !dir && i < n_fb; i++) {
        if (!fallbacks[i]) continue;
        if (snprintf(probe, sizeof probe, "%s/tokenizer.json", fallbacks[i]) < (int)sizeof probe &&
            access(probe, R_OK) == 0)
            dir = fallbacks[i];
    }
    if (!dir) {
        fprintf(stderr, "cllm convert: %s has no tokenizer.json; give --tokenizer DIR\n", src);
        return 1;
    }
    cllm_tokenizer *tok = NULL;
    int rc = 0;
    if (cllm_tokenizer_load(&tok, dir) || cllm_gguf_export(m, tok, &p, out)) rc = tool_fail("convert");
    else
        fprintf(stderr, "cllm convert: %s (%s, %zu parameters) with the tokenizer of %s -> %s (GGUF, %s)\n", src,
                cllm_arch_name(cllm_model_get_config(m)->arch), cllm_model_n_params(m), dir, out, type);
    cllm_tokenizer_free(tok);
    return rc;
}

int cmd_convert(int argc, char **argv) {
    if (argc > 0 && (strcmp(argv[0], "hg_to_pp") == 0 || strcmp(argv[0], "pp_to_hg") == 0))
        return seed_form(argc, argv);
    const char *ckpt_arg, *model_arg, *layout_arg, *out, *shard, *to, *type, *tok_arg, *quantize, *experts;
    int tensor = 1;
    arg_spec specs[] = {
        {"checkpoint", ARG_STR, &ckpt_arg, NULL, false,
         "checkpoint-STEP folder (sharded or not), or a training output folder (its `latest` checkpoint) -> HF folder"},
        {"model", ARG_STR, &model_arg, NULL, false, "HF folder -> stage layout in --out (hg_to_pp)"},
        {"layout", ARG_STR, &layout_arg, NULL, false, "stage layout -> HF folder in --out (pp_to_hg)"},
        {"tensor", ARG_INT, &tensor, "1", false, "with --model: tensor-parallel ranks the layout is cut for"},
        {"out", ARG_STR, &out, NULL, true, "folder to write (created if needed); with --to gguf the file"},
        {"to", ARG_STR, &to, NULL, false,
         "gguf: write --model or --checkpoint and its tokenizer as one GGUF file (llama, gpt2, bloom) for llama.cpp"},
        {"type", ARG_STR, &type, "f32", false, "with --to gguf: f32, f16, q8_0 or q4_0 matrices (norms and biases stay f32)"},
        {"tokenizer", ARG_STR, &tok_arg, NULL, false,
         "with --to gguf: tokenizer folder (default: the model or checkpoint folder)"},
        {"quantize", ARG_STR, &quantize, NULL, false,
         "with --model: write the model with int8, q4 or bf16 matrices to --out, loaded later without conversion"},
        {"expert-layout", ARG_STR, &experts, NULL, false,
         "per-expert (transformers 4.x, the default) or fused (5.x: mlp.experts.gate_up_proj): a Mixtral's expert "
         "tensors in the HF folder written; with --model it writes an HF folder, not a stage layout"},
        {"max-shard-size", ARG_STR, &shard, "2GB", false,
         "split safetensors into shards of at most this size with model.safetensors.index.json; 0 = one file"},
    };
    int rc = args_parse("convert",
                        "Converts a training checkpoint or a stage layout into an HF model folder (fp32 safetensors), "
                        "or an HF folder into a stage layout, or a model into a GGUF file for llama.cpp (--to gguf).",
                        argc, argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    size_t max_shard = 0;
    char *dir = NULL;
    cllm_model *m = NULL;
    if ((ckpt_arg != NULL) + (model_arg != NULL) + (layout_arg != NULL) != 1) {
        fprintf(stderr, "cllm convert: give exactly one of --checkpoint, --model and --layout\n");
        rc = 2;
        goto done;
    }
    cllm_expert_layout el = CLLM_EXPERTS_PER_EXPERT;
    if (experts && !cllm_expert_layout_from_name(experts, &el)) {
        fprintf(stderr, "cllm convert: --expert-layout %s: expected per-expert or fused\n", experts);
        rc = 2;
        goto done;
    }
    if (experts && (to || quantize || tensor != 1)) {
        fprintf(stderr, "cllm convert: --expert-layout is the layout of an fp32 HF folder written from --model, "
                "--checkpoint or --layout: not with --%s\n", to ? "to" : quantize ? "quantize" : "tensor");
        rc = 2;
        goto done;
    }
    if (to && strcmp(to, "gguf") != 0) {
        fprintf(stderr, "cllm convert: --to %s: the only target is gguf\n", to);
        rc = 2;
        goto done;
    }
    if (to && layout_arg) {
        fprintf(stderr, "cllm convert: --to gguf reads --model or --checkpoint, not --layout\n");
        rc = 2;
        goto done;
    }
    if (!to && (strcmp(type, "f32") != 0 || tok_arg)) {
        fprintf(stderr, "cllm convert: --type and --tokenizer go with --to gguf\n");
        rc = 2;
        goto done;
    }
    if (to && model_arg) {
        const char *fb[1] = {model_arg};
        if (cllm_model_load(&m, model_arg)) rc = tool_fail("convert");
        else rc = to_gguf(m, model_arg, tok_arg, fb, 1, type, out);
        goto done;
    }
    if (cllm_parse_size(shard, &max_shard)) {
        fprintf(stderr, "cllm convert: --max-shard-size: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    if (quantize) {
        cllm_wfmt f;
        const char *srcs[1] = {model_arg};
        int copied = 0;
        if (!model_arg || to || tensor != 1 || !cllm_wfmt_from_name(quantize, &f) || f == CLLM_WFMT_FP32) {
            fprintf(stderr, "cllm convert: --quantize takes int8, q4 or bf16, with --model DIR --out DIR (got %s%s)\n",
                    quantize, model_arg ? "" : ", no --model");
            rc = 2;
            goto done;
        }
        if (cllm_ckpt_load_model_weights(&m, model_arg, quantize) || cllm_model_save_weights(m, out, max_shard) ||
            copy_tokenizer(srcs, 1, out, &copied)) {
            rc = tool_fail("convert");
            goto done;
        }
        fprintf(stderr, "cllm convert: %s -> %s: %s matrices (%.1f MiB per decode step)%s\n", model_arg, out, quantize,
                (double)cllm_model_weight_bytes(m) / (1 << 20), copied ? " with its tokenizer" : "");
        goto done;
    }
    if (tensor < 1 || (tensor > 1 && !model_arg)) {
        fprintf(stderr, "cllm convert: --tensor %d: a positive size, with --model only\n", tensor);
        rc = 2;
        goto done;
    }
    if (model_arg && experts) { /* HF -> HF in the layout asked */
        const char *srcs[1] = {model_arg};
        int copied = 0;
        if (cllm_model_load(&m, model_arg) || cllm_model_set_expert_layout(m, el) || cllm_make_dirs(out) ||
            cllm_model_save(m, out, max_shard) || copy_tokenizer(srcs, 1, out, &copied)) {
            rc = tool_fail("convert");
            goto done;
        }
        fprintf(stderr, "cllm convert: %s -> %s: %s expert tensors%s\n", model_arg, out, experts,
                copied ? " with its tokenizer" : "");
        goto done;
    }
    if (model_arg) {
        if (cllm_model_load(&m, model_arg) ||
            cllm_topo_check_tensor(cllm_model_get_config(m), tensor, model_arg) ||
            cllm_split_save(m, tensor, model_arg, tokenizer_files, out)) {
            rc = tool_fail("convert");
            goto done;
        }
        fprintf(stderr, "cllm convert: %s (%zu parameters) -> stage layout %s: %d units x %d tensor rank%s\n",
                model_arg, cllm_model_n_params(m), out, cllm_model_get_config(m)->n_layer + 2, tensor,
                tensor == 1 ? "" : "s");
        goto done;
    }
    if (layout_arg) {
        const char *tok_dirs[1] = {layout_arg};
        int copied = 0;
        if (cllm_split_load(&m, layout_arg) || cllm_model_set_expert_layout(m, el) || cllm_make_dirs(out) ||
            cllm_model_save(m, out, max_shard) ||
            copy_tokenizer(tok_dirs, 1, out, &copied)) {
            rc = tool_fail("convert");
            goto done;
        }
        fprintf(stderr, "cllm convert: stage layout %s (%zu parameters) -> %s%s\n", layout_arg, cllm_model_n_params(m),
                out, copied ? " with its tokenizer" : "");
        goto done;
    }
    /* an output folder with `latest` means its newest checkpoint */
    char latest[4096];
    bool run_dir = snprintf(latest, sizeof latest, "%s/latest", ckpt_arg) < (int)sizeof latest &&
                   access(latest, F_OK) == 0;
    if (cllm_ckpt_find(ckpt_arg, run_dir ? "auto" : ckpt_arg, &dir) || !dir) {
        rc = tool_fail("convert");
        goto done;
    }
    char manifest[4096];
    if (snprintf(manifest, sizeof manifest, "%s/manifest.json", dir) >= (int)sizeof manifest ||
        access(manifest, F_OK) != 0) {
        fprintf(stderr, "cllm convert: %s is not a training checkpoint (no manifest.json); expected a checkpoint-STEP "
                "folder or an output folder with `latest`\n", dir);
        rc = 1;
        goto done;
    }
    if (to) {
        const char *fb[2] = {dir, run_dir ? ckpt_arg : NULL};
        if (cllm_ckpt_verify_range(dir, true, 0, 0) || cllm_ckpt_load_model(&m, dir)) rc = tool_fail("convert");
        else rc = to_gguf(m, dir, tok_arg, fb, 2, type, out);
        goto done;
    }
    if (cllm_ckpt_verify_range(dir, true, 0, 0) || cllm_ckpt_load_model(&m, dir) ||
        cllm_model_set_expert_layout(m, el) || cllm_make_dirs(out) || cllm_model_save(m, out, max_shard)) {
        rc = tool_fail("convert");
        goto done;
    }
    const char *tok_dirs[2] = {dir, run_dir ? ckpt_arg : NULL};
    int copied = 0;
    if (copy_tokenizer(tok_dirs, 2, out, &copied)) {
        rc = tool_fail("convert");
        goto done;
    }
    fprintf(stderr, "cllm convert: %s (%s, %zu parameters) -> %s%s\n", dir,
            cllm_ckpt_is_sharded(dir) ? "sharded" : "single-process", cllm_model_n_params(m), out,
            copied ? " with its tokenizer" : "");
done:
    free(dir);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
