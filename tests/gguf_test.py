"""`cllm convert --to gguf` against llama.cpp and an independent GGUF reader.

Tiny random models (LLaMA with GQA and TinyLlama's SentencePiece-BPE
tokenizer, 32000 ids; a LLaMA variant with a tied head and attention/MLP
biases; GPT-2 with the GPT-2 byte-level tokenizer, 50257 ids; BLOOM with
ALiBi, its embedding LayerNorm and biases, on the GPT-2 tokenizer) are
exported as f32, f16, q8_0 and q4_0 GGUF files (the tied LLaMA as f32, f16
and q8_0, BLOOM as f32 and q4_0). Then:
  - a small GGUF reader written here from the spec (not cllm's code) checks
    the header, version 3, the key/value count, the hyperparameters, every
    tensor's name, dims, type, 32-byte aligned offset and the file size, and
    compares each tensor's data with the model's safetensors read here,
    transformed as llama.cpp's HF converter does (LLaMA q/k rows permuted
    per head, GPT-2 Conv1D weights transposed, BLOOM's fused QKV rows
    regrouped as q|k|v, F16 rounding; Q8_0 blocks within the format's error
    bound; Q4_0 blocks equal bit for bit to ggml's reference quantizer,
    written again here in torch);
  - the tokens, token types and ids of TinyLlama's vocabulary equal those of
    the vocabulary file llama.cpp's converter wrote (fixture);
  - llama.cpp (node-llama-cpp 3.x's prebuilt CPU build, pinned in
    tests/npm-llama, run by tests/gguf_llama.mjs) loads each file, tokenizes
    a few texts exactly as `cllm tokenize` does, and continues prompts with
    the same 16 greedy tokens as `cllm generate --greedy` (f16 and q8_0
    files: the same tokens up to a near-tie, where llama.cpp's token is in
    cllm's top 5 within TIE nats of cllm's). A q4_0 file is compared with
    cllm running the model whose weights are the file's (Q4_0 blocks
    dequantized, F16 tensors rounded), so 4-bit rounding is not mistaken
    for an export error; llama.cpp still rounds its activations to 8 bits
    in Q4_0 products, hence the same near-tie rule;
  - bad input: an unknown --type or --to, a tokenizer with more ids than
    the model: clear errors and no file left behind.
Prints "skipped:" and exits 0 when npm cannot install node-llama-cpp (the
reader checks still run first).
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_clients  # noqa: E402

failures = 0
N_NEW = 16
# the largest log-probability gap (nats, by cllm's f32 model) that rounded weights may flip
TIE = {"f16": 0.05, "q8_0": 0.25, "q4_0": 0.25}
TYPES = ("f32", "f16", "q8_0", "q4_0")
# BLOOM adds an architecture, not a storage type: f32 and q4_0 only (the run time)
MODEL_TYPES = {"llama_tied_bias": ("f32", "f16", "q8_0"), "bloom": ("f32", "q4_0")}
TEXTS = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog",
         "  two leading spaces, numbers 12345 and 3.14", "Ünïcödé ✓ 日本語 text", "line one\nline two\ttab",
         "don't stop believin'"]
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3,"]


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg, flush=True)
    return cond


def run(cmd, ok=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok and r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r


# ---- an independent GGUF reader (spec: ggml docs/gguf.md) ----
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    b = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, b, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = b[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t in SCALAR:
            return take(SCALAR[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: value type {t}")

    assert b[:4] == b"GGUF", f"{path}: magic {b[:4]!r}"
    pos = 4
    g = {"version": take("<I")}
    n_t, n_kv = take("<Q"), take("<Q")
    kv, types = {}, {}
    for _ in range(n_kv):
        k = string()
        t = take("<I")
        kv[k], types[k] = value(t), t
    tensors = {}
    order = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        tensors[name] = {"dims": dims, "type": take("<I"), "offset": take("<Q")}
        order.append(name)
    align = kv.get("general.alignment", 32)
    data = (pos + align - 1) // align * align
    g.update(kv=kv, types=types, tensors=tensors, order=order, data=data, align=align, size=len(b), n_kv=n_kv,
             raw=b)
    return g


def tensor_values(g, name):
    """The values of a tensor (Q8_0: dequantized) and, for Q8_0, each value's
    block scale and int8."""
    t = g["tensors"][name]
    n = 1
    for d in t["dims"]:
        n *= d
    start = g["data"] + t["offset"]
    shape = list(reversed(t["dims"]))
    if t["type"] == 2:
        # Q4_0 blocks of 32 values along dims[0]: f16 scale d, 16 bytes of nibbles
        # (value j low, value j + 16 high); value = d * (q - 8)
        raw = torch.frombuffer(bytearray(g["raw"][start:start + n // 32 * 18]), dtype=torch.uint8).reshape(-1, 18)
        d = raw[:, :2].contiguous().view(torch.float16).float()
        nib = raw[:, 2:].long()
        q = torch.cat([nib & 15, nib >> 4], dim=1).float() - 8
        return (d * q).reshape(shape), d.expand(-1, 32).reshape(shape), q.reshape(shape)
    if t["type"] == 8:
        # Q8_0 blocks of 32 values along dims[0]: f16 scale d, 32 int8 q; value = d * q
        raw = torch.frombuffer(bytearray(g["raw"][start:start + n // 32 * 34]), dtype=torch.uint8).reshape(-1, 34)
        d = raw[:, :2].contiguous().view(torch.float16).float()
        q = raw[:, 2:].contiguous().view(torch.int8).float()
        return (d * q).reshape(shape), d.expand(-1, 32).reshape(shape), q.reshape(shape)
    dt = {0: torch.float32, 1: torch.float16}[t["type"]]
    raw = g["raw"][start:start + n * (4 if t["type"] == 0 else 2)]
    return torch.frombuffer(bytearray(raw), dtype=dt).float().reshape(shape), None, None


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=torch.float32).reshape(v["shape"])
    return out


def write_safetensors(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k, v in tensors.items():
        b = v.contiguous().numpy().tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def q4_0_reference(w):
    """ggml's reference Q4_0 quantizer, in torch float32, then dequantized:
    per block of 32, m = the value of largest magnitude, d = m / -8,
    q = min(15, trunc(x * (1/d) + 8.5)), value = f16(d) * (q - 8)."""
    blk = w.reshape(-1, 32).float()
    idx = blk.abs().argmax(dim=1, keepdim=True)  # the first of equal magnitudes, as the reference's strict >
    m = blk.gather(1, idx)
    d = m / -8.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(blk * inv + 8.5), max=15)
    return (d.half().float() * (q - 8)).reshape(w.shape)


def permute(w, n_head):
    # llama.cpp's converter: rows [heads, 2, HS/2] -> [heads, HS/2, 2]
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(arch, cfg, st):
    e = {}
    if arch == "llama":
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        e["token_embd.weight"] = st["model.embed_tokens.weight"]
        e["output_norm.weight"] = st["model.norm.weight"]
        if "lm_head.weight" in st:
            e["output.weight"] = st["lm_head.weight"]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            m = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
                 "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k"}
            for hf, gg in m.items():
                for suf in ([""] if hf.endswith(".weight") else [".weight", ".bias"]):
                    if p + hf + suf not in st:
                        continue
                    w = st[p + hf + suf]
                    if hf.endswith("q_proj"):
                        w = permute(w, nh)
                    elif hf.endswith("k_proj"):
                        w = permute(w, nkv)
                    e[f"blk.{i}.{gg}{suf}"] = w
    elif arch == "bloom":
        nh, hs = cfg["n_head"], cfg["hidden_size"] // cfg["n_head"]
        e["token_embd.weight"] = st["transformer.word_embeddings.weight"]
        e["output.weight"] = st["transformer.word_embeddings.weight"]
        e["token_embd_norm.weight"] = st["transformer.word_embeddings_layernorm.weight"]
        e["token_embd_norm.bias"] = st["transformer.word_embeddings_layernorm.bias"]
        e["output_norm.weight"] = st["transformer.ln_f.weight"]
        e["output_norm.bias"] = st["transformer.ln_f.bias"]
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}."
            m = {"input_layernorm": "attn_norm", "self_attention.query_key_value": "attn_qkv",
                 "self_attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
            for hf, gg in m.items():
                for suf in (".weight", ".bias"):
                    w = st[p + hf + suf]
                    if gg == "attn_qkv":  # rows [head, 3, HS] -> [3, head, HS], as llama.cpp's converter
                        w = w.reshape(nh, 3, hs, *w.shape[1:]).transpose(0, 1).reshape(w.shape)
                    e[f"blk.{i}.{gg}{suf}"] = w
    else:
        e["token_embd.weight"] = st["transformer.wte.weight"]
        e["output.weight"] = st["transformer.wte.weight"]
        e["position_embd.weight"] = st["transformer.wpe.weight"]
        e["output_norm.weight"] = st["transformer.ln_f.weight"]
        e["output_norm.bias"] = st["transformer.ln_f.bias"]
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}."
            m = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
                 "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
            for hf, gg in m.items():
                w = st[p + hf + ".weight"]
                e[f"blk.{i}.{gg}.weight"] = w.t() if w.dim() == 2 else w
                e[f"blk.{i}.{gg}.bias"] = st[p + hf + ".bias"]
    return e


def check_file(path, arch, model_dir, ty):
    g = read_gguf(path)
    kv = g["kv"]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tag = os.path.basename(path)
    check(g["version"] == 3, f"{tag}: version {g['version']}")
    check(g["n_kv"] == len(kv), f"{tag}: key count")
    check(kv["general.architecture"] == arch, f"{tag}: architecture {kv['general.architecture']}")
    check(kv["general.alignment"] == 32 and g["types"]["general.alignment"] == 4, f"{tag}: alignment key")
    check(kv["general.file_type"] == {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2}[ty], f"{tag}: file_type")
    check(kv.get("general.quantization_version") == (2 if ty in ("q8_0", "q4_0") else None),
          f"{tag}: quantization_version")
    if arch == "llama":
        want = {"context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
                "block_count": cfg["num_hidden_layers"], "feed_forward_length": cfg["intermediate_size"],
                "attention.head_count": cfg["num_attention_heads"],
                "attention.head_count_kv": cfg["num_key_value_heads"],
                "rope.dimension_count": cfg["hidden_size"] // cfg["num_attention_heads"],
                "vocab_size": cfg["vocab_size"]}
        check(abs(kv["llama.attention.layer_norm_rms_epsilon"] - cfg["rms_norm_eps"]) < 1e-12, f"{tag}: rms eps")
        check(kv["llama.rope.freq_base"] == cfg["rope_theta"], f"{tag}: rope freq base")
        check(kv["tokenizer.ggml.model"] == "llama", f"{tag}: tokenizer model")
        check(len(kv["tokenizer.ggml.scores"]) == cfg["vocab_size"], f"{tag}: scores")
    elif arch == "bloom":
        want = {"context_length": 2048, "embedding_length": cfg["hidden_size"], "block_count": cfg["n_layer"],
                "feed_forward_length": 4 * cfg["hidden_size"], "attention.head_count": cfg["n_head"],
                "attention.head_count_kv": cfg["n_head"], "vocab_size": cfg["vocab_size"]}
        check(abs(kv["bloom.attention.layer_norm_epsilon"] - cfg["layer_norm_epsilon"]) < 1e-9, f"{tag}: ln eps")
    else:
        want = {"context_length": cfg["n_positions"], "embedding_length": cfg["n_embd"],
                "block_count": cfg["n_layer"], "feed_forward_length": cfg.get("n_inner") or 4 * cfg["n_embd"],
                "attention.head_count": cfg["n_head"], "vocab_size": cfg["vocab_size"]}
        check(abs(kv["gpt2.attention.layer_norm_epsilon"] - cfg["layer_norm_epsilon"]) < 1e-9, f"{tag}: ln eps")
        check(kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "gpt-2", f"{tag}: tokenizer")
        tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))["model"]
        merges = [m if isinstance(m, str) else " ".join(m) for m in tj["merges"]]
        # merges whose result is not in the vocabulary are not merges of the loaded tokenizer
        merges = [m for m in merges if m.replace(" ", "") in tj["vocab"]]
        check(kv["tokenizer.ggml.merges"] == merges, f"{tag}: merges differ from tokenizer.json")
    for k, v in want.items():
        check(kv.get(f"{arch}.{k}") == v, f"{tag}: {arch}.{k} = {kv.get(f'{arch}.{k}')}, want {v}")
    check(len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"], f"{tag}: token count")
    check(len(kv["tokenizer.ggml.token_type"]) == cfg["vocab_size"], f"{tag}: token type count")

    # tensor infos, alignment, size, data
    st = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    exp = expected_tensors(arch, cfg, st)
    check(sorted(g["tensors"]) == sorted(exp), f"{tag}: tensors {sorted(set(g['tensors']) ^ set(exp))}")
    check(g["data"] % 32 == 0, f"{tag}: data section at {g['data']}")
    end = g["data"]
    for name in g["order"]:
        t = g["tensors"][name]
        w = exp.get(name)
        if w is None:
            continue
        check(t["offset"] % 32 == 0, f"{tag}: {name} offset {t['offset']}")
        check(t["dims"] == list(reversed(w.shape)), f"{tag}: {name} dims {t['dims']} for shape {list(w.shape)}")
        want_type = 0
        if w.dim() == 2 and ty == "f16":
            want_type = 1
        elif w.dim() == 2 and ty in ("q8_0", "q4_0") and name != "position_embd.weight":
            want_type = {"q8_0": 8, "q4_0": 2}[ty] if w.shape[-1] % 32 == 0 else 1  # rows not a multiple of 32: F16
        check(t["type"] == want_type, f"{tag}: {name} type {t['type']}, want {want_type}")
        got, d, q = tensor_values(g, name)
        if want_type == 8:
            # the spec's bound: |x - d*q| <= d/2, plus the f16 rounding of d (|q| <= 127)
            blk = w.reshape(-1, 32)
            dref = (blk.abs().amax(dim=1, keepdim=True) / 127).expand(-1, 32).reshape(w.shape)
            err = (got - w).abs()
            check(bool((err <= 0.5 * dref + 127 * (dref - d).abs() + 1e-12).all()), f"{tag}: {name} Q8_0 error")
            check(bool((d - dref).abs().le(dref * 2 ** -10).all()), f"{tag}: {name} Q8_0 scales")
            check(bool(q.abs().max() <= 127), f"{tag}: {name} Q8_0 values beyond 127")
            nbytes = w.numel() // 32 * 34
        elif want_type == 2:
            ref = q4_0_reference(w)
            check(torch.equal(got, ref), f"{tag}: {name} Q4_0 differs from the reference quantizer "
                                         f"(max {(got - ref).abs().max().item()})")
            check(bool(q.min() >= -8 and q.max() <= 7), f"{tag}: {name} Q4_0 codes out of range")
            nbytes = w.numel() // 32 * 18
        else:
            ref = w.half().float() if want_type == 1 else w
            check(torch.equal(got, ref), f"{tag}: {name} data differs (max {(got - ref).abs().max().item()})")
            nbytes = w.numel() * (2 if want_type else 4)
        end = max(end, g["data"] + t["offset"] + nbytes)
    check(g["size"] >= end and g["size"] - end < 32, f"{tag}: size {g['size']}, data ends at {end}")
    return g


def make_models(cllm, fx, tmp):
    models = {}
    tl = os.path.join(fx, "tinyllama-1.1b-chat-v1.0")
    gp = os.path.join(fx, "gpt2")
    specs = [("llama", "llama", ["--set", "vocab_size=32000"], tl),
             ("llama_tied_bias", "llama", ["--set", "vocab_size=32000", "--set", "tie_word_embeddings=true",
                                           "--set", "attention_bias=true", "--set", "mlp_bias=true",
                                           "--set", "num_key_value_heads=4", "--set", "initializer_range=0.1"], tl),
             ("gpt2", "gpt2", ["--set", "vocab_size=50257", "--set", "initializer_range=0.3"], gp),
             ("bloom", "bloom", ["--set", "vocab_size=50257", "--set", "initializer_range=0.3"], gp)]
    for name, arch, sets, tokdir in specs:
        d = os.path.join(tmp, name)
        run([cllm, "init", "--arch", arch, "--preset", "tiny", "--seed", "7", *sets, "--out", d])
        for f in os.listdir(tokdir):
            if f.startswith("tokenizer") or f in ("vocab.json", "merges.txt", "special_tokens_map.json"):
                shutil.copyfile(os.path.join(tokdir, f), os.path.join(d, f))
        models[name] = (arch, d)
    # init leaves biases at zero (and norm weights at one): give them values, so
    # that a bias or norm llama.cpp ignored or misplaced would change its output
    for name in ("llama_tied_bias", "bloom"):
        d = models[name][1]
        st = read_safetensors(os.path.join(d, "model.safetensors"))
        g = torch.Generator().manual_seed(5)
        for k in st:
            if k.endswith(".bias"):
                st[k] = torch.randn(st[k].shape, generator=g) * 0.05
            elif name == "bloom" and "layernorm.weight" in k:
                st[k] = 1 + torch.randn(st[k].shape, generator=g) * 0.1
        write_safetensors(os.path.join(d, "model.safetensors"), st)
    return models


def file_weights_model(g, arch, model_dir, out):
    """An HF folder whose weights are those the GGUF file holds (Q4_0
    dequantized, F16 rounded), mapped back to HF names and layouts, with the
    model's config and tokenizer: what llama.cpp computes with."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    st = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    # every element tagged with its position in one flat index, then laid out as
    # for the file: each file tensor says where its values go back to
    offs, tagged, total = {}, {}, 0
    for k, w in st.items():
        offs[k] = total
        tagged[k] = (torch.arange(w.numel(), dtype=torch.float64) + total).reshape(w.shape)
        total += w.numel()
    flat = torch.full((total,), float("nan"))
    for gg, where in expected_tensors(arch, cfg, tagged).items():
        flat[where.reshape(-1).long()] = tensor_values(g, gg)[0].reshape(-1)
    new = {k: flat[offs[k]:offs[k] + w.numel()].reshape(w.shape) for k, w in st.items()}
    check(not any(bool(v.isnan().any()) for v in new.values()), f"{out}: a tensor not in the file")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(model_dir):
        if f != "model.safetensors":
            shutil.copyfile(os.path.join(model_dir, f), os.path.join(out, f))
    write_safetensors(os.path.join(out, "model.safetensors"), new)
    return out


def checkpoint_export(cllm, tmp, models):
    """--checkpoint: a run's latest checkpoint exports to the same bytes as
    the run's final HF folder (same step, same tokenizer)."""
    data = os.path.join(tmp, "train.jsonl")
    with open(data, "w") as f:
        for i in range(32):
            f.write(json.dumps({"text": f"The number {i} is {'even' if i % 2 == 0 else 'odd'}."}) + "\n")
    r = os.path.join(tmp, "run")
    run([cllm, "train", "--model", models["gpt2"][1], "--data", data, "--out", r, "--steps", "2", "--batch-size",
         "2", "--seq-len", "16", "--lr", "1e-3", "--save-interval", "2"])
    a, b = os.path.join(tmp, "ckpt.gguf"), os.path.join(tmp, "final.gguf")
    run([cllm, "convert", "--to", "gguf", "--checkpoint", r, "--out", a])
    run([cllm, "convert", "--to", "gguf", "--model", r, "--out", b])
    check(open(a, "rb").read() == open(b, "rb").read(), "--checkpoint export differs from the run's HF folder")
    check_file(a, "gpt2", r, "f32")


def bad_input(cllm, tmp, models):
    out = os.path.join(tmp, "bad.gguf")
    r = run([cllm, "convert", "--to", "gguf", "--model", models["llama"][1], "--out", out, "--type", "q4_k"], ok=False)
    check(r.returncode == 2 and "--type q4_k" in r.stderr, f"--type q4_k: {r.returncode} {r.stderr}")
    r = run([cllm, "convert", "--to", "onnx", "--model", models["llama"][1], "--out", out], ok=False)
    check(r.returncode == 2 and "--to onnx" in r.stderr, f"--to onnx: {r.returncode} {r.stderr}")
    # the GPT-2 tokenizer (50257 ids) on a 32000-id model
    r = run([cllm, "convert", "--to", "gguf", "--model", models["llama"][1], "--tokenizer", models["gpt2"][1],
             "--out", out], ok=False)
    check(r.returncode == 1 and "vocab_size is 32000" in r.stderr and not os.path.exists(out),
          f"tokenizer larger than the model: {r.returncode} {r.stderr}")
    check(not [f for f in os.listdir(tmp) if ".tmp." in f], "temp files left behind")


def cllm_ids(cllm, model_dir, text, tmp, special):
    p = os.path.join(tmp, "text.txt")
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    cmd = [cllm, "tokenize", "--tokenizer", model_dir, "--input", p] + ([] if special else ["--no-special"])
    return json.loads(run(cmd).stdout)["ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(a.cllm, a.fixtures, tmp)
        files = []
        for name, (arch, d) in models.items():
            for ty in MODEL_TYPES.get(name, TYPES):
                out = os.path.join(tmp, f"{name}-{ty}.gguf")
                run([a.cllm, "convert", "--to", "gguf", "--model", d, "--out", out, "--type", ty])
                g = check_file(out, arch, d, ty)
                # q4_0: cllm runs what the file holds (see the top)
                md = file_weights_model(g, arch, d, os.path.join(tmp, f"{name}-{ty}-weights")) if ty == "q4_0" else d
                files.append((name, ty, out, md))
        # TinyLlama's vocabulary as llama.cpp's converter wrote it
        ref = read_gguf(os.path.join(a.fixtures, "llama.cpp-vocab-tests", "ggml-vocab-llama-spm.gguf"))["kv"]
        ours = read_gguf(os.path.join(tmp, "llama-f32.gguf"))["kv"]
        for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_eos_token", "tokenizer.ggml.model"):
            check(ours.get(k) == ref.get(k), f"{k} differs from llama.cpp's converter")
        bad_input(a.cllm, tmp, models)
        checkpoint_export(a.cllm, tmp, models)

        d = npm_clients.install(a.build, folder="npm-llama", dest="npm-llama", soft=True,
                                 locked_install=True)
        if d is None:
            print("skipped: npm could not install node-llama-cpp; the llama.cpp runs did not run:",
                  npm_clients.last_error[-500:])
            print(f"{failures} failures")
            return 1 if failures else 0
        runs, expect = [], []
        for name, ty, path, md in files:
            prompts = [cllm_ids(a.cllm, md, p, tmp, True) for p in PROMPTS]
            runs.append({"model": path, "texts": TEXTS, "prompts": prompts, "n_new": N_NEW})
            gens = []
            for p in prompts:
                r = run([a.cllm, "generate", "--model", md, "--prompt-ids", ",".join(map(str, p)), "--greedy",
                         "--output", "ids", "--max-new-tokens", str(N_NEW), "--top-n", "5"])
                tops = [json.loads(ln)["top"] for ln in r.stderr.splitlines() if ln.startswith("{")]
                gens.append(([int(x) for x in r.stdout.split()], tops))
            expect.append((name, ty, [cllm_ids(a.cllm, md, t, tmp, False) for t in TEXTS], gens))
        here = os.path.dirname(os.path.abspath(__file__))
        shutil.copyfile(os.path.join(here, "gguf_llama.mjs"), os.path.join(d, "gguf_llama.mjs"))
        r = subprocess.run(["node", "gguf_llama.mjs"], cwd=d, input=json.dumps({"runs": runs}).encode(),
                           capture_output=True, timeout=600)
        if not check(r.returncode == 0, "llama.cpp: " + r.stderr.decode(errors="replace")[-3000:]):
            return 1
        got = json.loads(r.stdout)
        for (name, ty, toks, gens), res in zip(expect, got):
            tag = f"{name} {ty}"
            for t, want, have in zip(TEXTS, toks, res["tokens"]):
                check(want == have, f"{tag}: tokenization of {t!r}: cllm {want}, llama.cpp {have}")
            for p, (want, tops), have in zip(PROMPTS, gens, res["continuations"]):
                same = 0
                while same < min(len(want), len(have)) and want[same] == have[same]:
                    same += 1
                print(f"{tag}: {p!r}: {same}/{len(want)} greedy tokens equal; cllm {want}, llama.cpp {have}")
                if ty == "f32":
                    check(want == have, f"{tag}: greedy continuation of {p!r} differs")
                elif same < min(len(want), len(have)):
                    # rounded weights may only flip a near-tie: where the two first part,
                    # llama.cpp's token is one of cllm's top 5, within TIE nats of the top
                    top = dict((int(t), lp) for t, lp in tops[same])
                    gap = top[want[same]] - top[have[same]] if have[same] in top else None
                    check(gap is not None and gap <= TIE[ty],
                          f"{tag}: {p!r} parts at token {same} by {gap} nats (cllm's top 5 {tops[same]})")
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
