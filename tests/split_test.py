#!/usr/bin/env python3
"""HF folder <-> stage layout conversion (`cllm convert --model/--layout`,
seed 003's hg_to_pp / pp_to_hg), checked against an independent slicing.

For GPT-2, LLaMA (GQA, attention and MLP biases, untied head) and BLOOM:
the unit files of a tensor=2 layout hold exactly the Megatron parts computed
here with torch from the HF tensors by the published rules (column-parallel
QKV/fc/gate/up by heads or features, GPT-2's c_attn per Q|K|V third, BLOOM's
query_key_value by heads through its [heads, 3, head_dim] view, row-parallel
output/down projections by input features with whole biases,
vocabulary-parallel embeddings and head, replicated norms and positions),
each tensor in the right unit file; merging the layout back gives the
original tensors bit for bit and carries the tokenizer; impossible layouts
fail with a message naming the config key.

Usage: split_test.py --cllm BIN --build DIR
"""
import argparse, json, os, re, shutil, struct, subprocess, sys, tempfile

import torch

FAILS = []
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "fixtures")


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out


def megatron_part(arch, name, t, cfg, tp, r):
    """Rank r's part of HF tensor `name` under Megatron's 1-D scheme."""
    def ch(x, dim):
        return torch.chunk(x, tp, dim=dim)[r]
    if re.search(r"(ln_|layernorm|norm\.|wpe)", name):
        return t
    if arch == "gpt2":
        if name.endswith("attn.c_attn.weight"):  # Conv1D [C, 3C] = [Q|K|V] columns
            return torch.cat([ch(p, 1) for p in t.split(t.shape[1] // 3, dim=1)], dim=1)
        if name.endswith("attn.c_attn.bias"):
            return torch.cat([ch(p, 0) for p in t.split(t.shape[0] // 3, dim=0)], dim=0)
        if name.endswith("mlp.c_fc.weight"):
            return ch(t, 1)
        if name.endswith("mlp.c_fc.bias"):
            return ch(t, 0)
        if name.endswith("c_proj.weight"):  # row-parallel: Conv1D input rows
            return ch(t, 0)
        if name.endswith("c_proj.bias"):
            return t
        if name.endswith("wte.weight"):
            return ch(t, 0)
    if arch == "llama":
        if re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$", name):
            return ch(t, 0)
        if re.search(r"(o_proj|down_proj)\.weight$", name):
            return ch(t, 1)
        if re.search(r"(o_proj|down_proj)\.bias$", name):
            return t
        if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
            return ch(t, 0)
    if arch == "bloom":
        nh = cfg["n_head"]
        if name.endswith("query_key_value.weight"):
            v = t.view(nh, 3, -1, t.shape[1])
            return ch(v, 0).reshape(-1, t.shape[1])
        if name.endswith("query_key_value.bias"):
            return ch(t.view(nh, 3, -1), 0).reshape(-1)
        if name.endswith("dense_h_to_4h.weight") or name.endswith("dense_h_to_4h.bias"):
            return ch(t, 0)
        if name.endswith("self_attention.dense.weight") or name.endswith("dense_4h_to_h.weight"):
            return ch(t, 1)
        if name.endswith("dense.bias") or name.endswith("dense_4h_to_h.bias"):
            return t
        if name.endswith("word_embeddings.weight"):
            return ch(t, 0)
    raise AssertionError(f"no rule for {name}")


def unit_of(name, n_layer):
    m = re.search(r"\.(?:h|layers)\.(\d+)\.", name)
    if m:
        return 1 + int(m.group(1))
    if re.search(r"(ln_f|model\.norm|lm_head|transformer\.ln_f)", name):
        return n_layer + 1
    return 0


def run(args, ok=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="split_", dir=a.build)
    sets = {"gpt2": ["n_layer=3"],
            "llama": ["num_hidden_layers=3", "attention_bias=true", "mlp_bias=true", "tie_word_embeddings=false"],
            "bloom": ["n_layer=3"]}
    tp = 2
    for arch, kv in sets.items():
        model = os.path.join(tmp, arch)
        cmd = [a.cllm, "init", "--arch", arch, "--preset", "tiny", "--seed", "5", "--out", model]
        for x in kv:
            cmd += ["--set", x]
        run(cmd)
        tok = os.path.join(FIXTURES, "gpt2", "tokenizer.json")
        if os.path.exists(tok):
            shutil.copy(tok, os.path.join(model, "tokenizer.json"))
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        n_layer = cfg.get("n_layer", cfg.get("num_hidden_layers"))
        full = read_st(os.path.join(model, "model.safetensors"))
        lay = os.path.join(tmp, arch + "_pp")
        run([a.cllm, "convert", "--model", model, "--out", lay, "--tensor", str(tp)])
        with open(os.path.join(lay, "layout.json")) as f:
            layout = json.load(f)
        check(layout["tensor"] == tp and layout["units"] == n_layer + 2, f"{arch}: layout.json {layout}")
        seen = {}
        for fname in layout["files"]:
            u, r = map(int, re.match(r"unit_(\d+)-tp_(\d+)\.safetensors", fname).groups())
            for name, part in read_st(os.path.join(lay, fname)).items():
                check(unit_of(name, n_layer) == u, f"{arch}: {name} in unit {u}")
                want = megatron_part(arch, name, full[name], cfg, tp, r)
                check(part.shape == want.shape and torch.equal(part, want),
                      f"{arch}: {name} rank {r}: shape {tuple(part.shape)} vs {tuple(want.shape)} or values differ")
                seen[(name, r)] = True
        check(len(seen) == tp * len(full), f"{arch}: {len(seen)} parts for {len(full)} tensors x {tp} ranks")
        back = os.path.join(tmp, arch + "_hf")
        run([a.cllm, "convert", "pp_to_hg", "--input-path", lay, "--save-path", back])
        merged = read_st(os.path.join(back, "model.safetensors"))
        check(merged.keys() == full.keys() and all(torch.equal(merged[k], full[k]) for k in full),
              f"{arch}: merged model differs from the original")
        if os.path.exists(tok):
            check(os.path.exists(os.path.join(back, "tokenizer.json")), f"{arch}: tokenizer not carried over")
        # seed 003's spelling for the split, tensor 1: one file per unit, whole tensors
        lay1 = os.path.join(tmp, arch + "_pp1")
        run([a.cllm, "convert", "hg_to_pp", "--input-path", model, "--save-path", lay1])
        files = sorted(os.listdir(lay1))
        check(sum(f.endswith(".safetensors") for f in files) == n_layer + 2, f"{arch}: tensor-1 layout files {files}")
        print(f"{arch}: ok ({len(full)} tensors, {len(layout['files'])} unit files)")
    # impossible layouts name the key
    p = run([a.cllm, "convert", "--model", os.path.join(tmp, "llama"), "--out", os.path.join(tmp, "bad"),
             "--tensor", "3"], ok=False)
    check(p.returncode != 0 and "num_attention_heads" in p.stderr, f"tensor 3: {p.stderr}")
    p = run([a.cllm, "convert", "--layout", os.path.join(tmp, "llama"), "--out", os.path.join(tmp, "bad2")], ok=False)
    check(p.returncode != 0 and "layout.json" in p.stderr, f"not a layout: {p.stderr}")
    p = run([a.cllm, "convert", "--model", os.path.join(tmp, "llama"), "--out", os.path.join(tmp, "llama")], ok=False)
    check(p.returncode != 0 and "not a stage layout" in p.stderr, f"overwriting an HF folder: {p.stderr}")
    if not FAILS:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"split: {len(FAILS)} failure(s)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
