#!/usr/bin/python3
"""
Mixtral's two expert-tensor layouts (docs/moe.md, "Tensors"): transformers
4.x's per-expert tensors (block_sparse_moe.experts.N.w1/w2/w3.weight) and
5.x's fused ones (mlp.gate.weight, mlp.experts.gate_up_proj [E, 2F, C] with
w1 in rows 0..F-1 and w3 in rows F..2F-1, mlp.experts.down_proj [E, C, F]).

  - A fused folder written here with numpy from a per-expert folder (F32 in
    two shards, and BF16) gives `cllm grad` the same loss, auxiliary loss
    and gradient file, byte for byte, and `cllm generate` the same tokens.
  - `cllm convert --model A --expert-layout fused` writes exactly the
    tensors numpy wrote; converting that back with `--expert-layout
    per-expert` gives every tensor of A, bit for bit.
  - Training from the fused folder saves the same model as training from
    the per-expert one; `cllm convert --checkpoint RUN --expert-layout
    fused` and `cllm train --save-expert-layout fused` write that model fused.
  - Errors name the tensor: a folder mixing the layouts, a fused tensor of
    the wrong shape, a missing fused tensor; bad --expert-layout values.

Run by ctest (label model) as
  /usr/bin/python3 tests/moe_layout_test.py --cllm build/cllm
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import OrderedDict

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models as hm  # noqa: E402  (safetensors and JSONL I/O)
import test_mixtral_vs_torch as mx  # noqa: E402  (its check/run helpers and tiny Mixtral config)

check, run = mx.check, mx.run
CFG = mx.config(vocab_size=61, num_local_experts=4, output_router_logits=True)
E, C, F, L = CFG["num_local_experts"], CFG["hidden_size"], CFG["intermediate_size"], CFG["num_hidden_layers"]


def per_expert_params(seed):
    """name -> float32 array in transformers 4.x's layout."""
    rng = np.random.default_rng(seed)
    V, H, kv = CFG["vocab_size"], CFG["num_attention_heads"], CFG["num_key_value_heads"]
    hd = C // H
    p = OrderedDict()
    p["model.embed_tokens.weight"] = rng.normal(0, 0.3, (V, C))
    for l in range(L):
        b = "model.layers.%d." % l
        p[b + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        for n, rows in (("q", H * hd), ("k", kv * hd), ("v", kv * hd)):
            p[b + "self_attn.%s_proj.weight" % n] = rng.normal(0, 0.2, (rows, C))
        p[b + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (C, H * hd))
        p[b + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        p[b + "block_sparse_moe.gate.weight"] = rng.normal(0, 0.5, (E, C))
        for e in range(E):
            x = b + "block_sparse_moe.experts.%d." % e
            p[x + "w1.weight"] = rng.normal(0, 0.2, (F, C))
            p[x + "w2.weight"] = rng.normal(0, 0.2, (C, F))
            p[x + "w3.weight"] = rng.normal(0, 0.2, (F, C))
    p["model.norm.weight"] = 1 + rng.normal(0, 0.1, C)
    p["lm_head.weight"] = rng.normal(0, 0.3, (V, C))
    return OrderedDict((n, a.astype(np.float32)) for n, a in p.items())


def fuse(p):
    """transformers 5.x's layout of per-expert tensors p (numpy only)."""
    out = OrderedDict()
    for n, a in p.items():
        if ".block_sparse_moe.experts." in n:
            continue
        if n.endswith(".block_sparse_moe.gate.weight"):
            l = n.split(".")[2]
            b = "model.layers.%s." % l
            x = b + "block_sparse_moe.experts.%d."
            out[b + "mlp.gate.weight"] = a
            out[b + "mlp.experts.gate_up_proj"] = np.stack(
                [np.concatenate([p[x % e + "w1.weight"], p[x % e + "w3.weight"]], axis=0) for e in range(E)])
            out[b + "mlp.experts.down_proj"] = np.stack([p[x % e + "w2.weight"] for e in range(E)])
            continue
        out[n] = a
    return out


def save(d, params, dtype="F32", shards=1):
    hm.save_hf_folder(d, CFG, OrderedDict((n, torch.from_numpy(np.ascontiguousarray(a))) for n, a in params.items()),
                      dtype=dtype, shards=shards)


def load(d):
    """name -> numpy array of a folder's safetensors files (one or sharded)."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update((n, t.numpy()) for n, t in hm.load_safetensors(os.path.join(d, f)).items())
    return out


def same_tensors(got, want):
    if sorted(got) != sorted(want):
        return False, "names differ: missing %s extra %s" % (sorted(set(want) - set(got))[:3],
                                                            sorted(set(got) - set(want))[:3])
    for n in want:
        if got[n].shape != want[n].shape or got[n].tobytes() != want[n].tobytes():
            return False, "%s differs (shape %s vs %s)" % (n, list(got[n].shape), list(want[n].shape))
    return True, "%d tensors" % len(want)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_same_model(cllm, tmp, data, tag, a, b):
    """Folders a and b give byte-identical `cllm grad` results and tokens."""
    res = []
    for d in (a, b):
        g = d + ".grads.safetensors"
        r = run([cllm, "grad", "--model", d, "--data", data, "--seq-len", "10", "--batch-size", "3", "--out", g])
        if not check("%s: cllm grad on %s exits 0" % (tag, os.path.basename(d)), r.returncode == 0, r.stderr[-400:]):
            return
        line = json.loads(r.stdout.strip().splitlines()[-1])
        gen = run([cllm, "generate", "--model", d, "--prompt-ids", "5,9,11,3", "--max-new-tokens", "6", "--greedy",
                   "--ignore-eos", "--output", "ids"])
        res.append((line, read(g), gen.stdout, gen.returncode))
    (la, ga, ta, ra), (lb, gb, tb, rb) = res
    check("%s: loss and aux loss identical" % tag, la["loss"] == lb["loss"] and la["aux_loss"] == lb["aux_loss"],
          "loss %r vs %r, aux %r vs %r" % (la["loss"], lb["loss"], la["aux_loss"], lb["aux_loss"]))
    check("%s: gradient files byte-identical" % tag, ga == gb, "%d vs %d bytes" % (len(ga), len(gb)))
    check("%s: greedy tokens identical" % tag, ra == rb == 0 and ta == tb and ta.strip(), "%r vs %r" % (ta, tb))


def test_errors(cllm, tmp, p):
    fused = fuse(p)
    cases = []
    # layer 0 fused, layer 1 per-expert
    mixed = OrderedDict((n, a) for n, a in fused.items() if not n.startswith("model.layers.1.mlp."))
    mixed.update((n, a) for n, a in p.items() if n.startswith("model.layers.1.block_sparse_moe."))
    cases.append(("mixed layouts", mixed, "a folder holds one of the two"))
    bad = OrderedDict(fused)
    bad["model.layers.0.mlp.experts.gate_up_proj"] = bad["model.layers.0.mlp.experts.gate_up_proj"][:, :F, :]
    cases.append(("gate_up_proj of the wrong shape", bad, "tensor 'model.layers.0.mlp.experts.gate_up_proj' has "
                  "shape [%d, %d, %d], the config needs [%d, %d, %d]" % (E, F, C, E, 2 * F, C)))
    gone = OrderedDict((n, a) for n, a in fused.items() if n != "model.layers.1.mlp.experts.down_proj")
    cases.append(("missing down_proj", gone, "missing tensor 'model.layers.1.mlp.experts.down_proj'"))
    for label, params, needle in cases:
        d = os.path.join(tmp, "bad-" + label.replace(" ", "-"))
        save(d, params)
        r = run([cllm, "generate", "--model", d, "--prompt-ids", "1,2", "--max-new-tokens", "1"])
        check("error: %s" % label, r.returncode != 0 and needle in r.stderr, r.stderr.strip()[-300:])
    a = os.path.join(tmp, "per-expert")
    r = run([cllm, "convert", "--model", a, "--expert-layout", "stacked", "--out", os.path.join(tmp, "x")])
    check("error: --expert-layout stacked", r.returncode == 2 and "expected per-expert or fused" in r.stderr,
          r.stderr.strip()[-200:])
    r = run([cllm, "convert", "--model", a, "--expert-layout", "fused", "--quantize", "int8", "--out",
             os.path.join(tmp, "x")])
    check("error: --expert-layout with --quantize", r.returncode == 2 and "not with --quantize" in r.stderr,
          r.stderr.strip()[-200:])
    ll = os.path.join(tmp, "llama")
    r = run([cllm, "init", "--arch", "llama", "--preset", "tiny", "--out", ll])
    if r.returncode == 0:
        r = run([cllm, "convert", "--model", ll, "--expert-layout", "fused", "--out", os.path.join(tmp, "x")])
    check("error: --expert-layout fused on a llama", r.returncode != 0 and "has no experts" in r.stderr,
          r.stderr.strip()[-200:])
    data = os.path.join(tmp, "d.jsonl")
    r = run([cllm, "train", "--model", ll, "--data", data, "--seq-len", "8", "--steps", "1", "--out",
             os.path.join(tmp, "llama-run"), "--save-expert-layout", "fused"])
    check("error: train --save-expert-layout fused on a llama, before training",
          r.returncode != 0 and "save_expert_layout fused: the model has no experts" in r.stderr
          and not os.path.exists(os.path.join(tmp, "llama-run", "model.safetensors")), r.stderr.strip()[-200:])
    r = run([cllm, "train", "--model", a, "--data", data, "--seq-len", "8", "--steps", "1", "--out",
             os.path.join(tmp, "x-run"), "--save-expert-layout", "stacked"])
    check("error: save_expert_layout stacked", r.returncode != 0 and "save_expert_layout: 'stacked'" in r.stderr,
          r.stderr.strip()[-200:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", help="unused (the ctest wrapper passes it)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    cllm = args.cllm
    tmp = tempfile.mkdtemp(prefix="cllm-moe-layout-")
    try:
        p = per_expert_params(seed=7)
        a, b = os.path.join(tmp, "per-expert"), os.path.join(tmp, "fused")
        save(a, p)
        save(b, fuse(p), shards=2)
        data = os.path.join(tmp, "d.jsonl")
        rng = np.random.default_rng(3)
        hm.write_jsonl(data, [{"input_ids": rng.integers(0, CFG["vocab_size"], 10 - (i % 2) * 3).tolist()}
                              for i in range(6)])
        test_same_model(cllm, tmp, data, "fp32 fused (2 shards)", a, b)
        a16, b16 = os.path.join(tmp, "per-expert-bf16"), os.path.join(tmp, "fused-bf16")
        save(a16, p, dtype="BF16")
        save(b16, fuse(p), dtype="BF16")
        test_same_model(cllm, tmp, data, "bf16 fused", a16, b16)

        c, back = os.path.join(tmp, "conv-fused"), os.path.join(tmp, "conv-back")
        r = run([cllm, "convert", "--model", a, "--expert-layout", "fused", "--out", c])
        if check("convert per-expert -> fused exits 0", r.returncode == 0, r.stderr[-400:]):
            ok, why = same_tensors(load(c), fuse(p))
            check("convert -> fused: the tensors numpy fused, bit for bit", ok, why)
            r = run([cllm, "convert", "--model", c, "--expert-layout", "per-expert", "--out", back])
            if check("convert fused -> per-expert exits 0", r.returncode == 0, r.stderr[-400:]):
                ok, why = same_tensors(load(back), p)
                check("round trip: every tensor of the per-expert folder, bit for bit", ok, why)

        common = ["--data", data, "--optimizer", "adamw", "--lr", "1e-2", "--batch-size", "2", "--seq-len", "10",
                  "--steps", "2"]
        ra, rb = os.path.join(tmp, "run-a"), os.path.join(tmp, "run-b")
        r1 = run([cllm, "train", "--model", a, "--out", ra] + common)
        r2 = run([cllm, "train", "--model", b, "--out", rb, "--save-interval", "2"] + common)
        if check("train from each layout exits 0", r1.returncode == r2.returncode == 0, (r1.stderr + r2.stderr)[-400:]):
            check("train: the fused folder trains to the same model, byte for byte",
                  read(os.path.join(ra, "model.safetensors")) == read(os.path.join(rb, "model.safetensors")))
            e = os.path.join(tmp, "ckpt-fused")
            r = run([cllm, "convert", "--checkpoint", rb, "--expert-layout", "fused", "--out", e])
            if check("convert --checkpoint --expert-layout fused exits 0", r.returncode == 0, r.stderr[-400:]):
                ok, why = same_tensors(load(e), fuse(load(ra)))
                check("convert --checkpoint: the trained model in the fused layout", ok, why)
            rc_ = os.path.join(tmp, "run-c")
            r = run([cllm, "train", "--model", a, "--out", rc_, "--save-expert-layout", "fused"] + common)
            if check("train --save-expert-layout fused exits 0", r.returncode == 0, r.stderr[-400:]):
                ok, why = same_tensors(load(rc_), fuse(load(ra)))
                check("train --save-expert-layout fused: the saved model in the fused layout", ok, why)
        test_errors(cllm, tmp, p)
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        print("FAILED %d" % mx.FAILED if mx.FAILED else "all passed")
    return 1 if mx.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
