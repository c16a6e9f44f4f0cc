#!/usr/bin/python3
"""
cllm against Hugging Face transformers itself: the folders and expected
values under tests/data/transformers/ were written by transformers 5.17
(and PEFT 0.21) in float64 with tests/transformers/make_fixtures.py; this
test needs only cllm and Debian's torch. The other model tests compare with
tests/ref/hf_models.py, our own torch reading of HF's semantics; this one
checks that reading against the library the folders come from, including
its current config.json spelling (transformers 5 writes RoPE's theta inside
"rope_parameters").

For each causal LM (GPT-2, LLaMA with GQA, LLaMA with head_dim != hidden /
heads, one KV head, biases and tied embeddings at theta 5e5, BLOOM with 6
ALiBi heads, Mixtral, Mixtral with a sliding window of 5):
  - `cllm grad`: the loss (rel 1e-5), the last position's logits (abs 1e-4)
    and every gradient (rel-L2 1e-4; transformers 5 keeps a Mixtral layer's
    experts fused as gate_up_proj [E, 2I, H] and down_proj [E, H, I], split
    here into the saved per-expert w1 / w3 / w2),
  - `cllm generate --greedy`: the 12 tokens transformers' greedy loop chose
    (the fixtures' smallest top-1 / top-2 logit gap and top-k router gap
    are recorded and exceed 1e-3, far above fp32 rounding).
A LlamaForSequenceClassification reward model: `cllm score` on token-id
records gives transformers' rewards (abs 1e-4). A PEFT LoRA adapter
(r 4, alpha 8, all seven LLaMA projections, random A and B): `cllm grad
--adapter` gives PEFT's loss and logits.

  /usr/bin/python3 tests/transformers_test.py --cllm build/cllm
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import hf_models as hm  # noqa: E402

DATA = os.path.join(HERE, "data", "transformers")
CAUSAL = ["gpt2", "llama", "llama_tied_bias", "bloom", "mixtral", "mixtral_window"]
FAILED = 0


def check(name, ok, detail=""):
    global FAILED
    FAILED += not ok
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail else ""), flush=True)
    return ok


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def rel_l2(got, ref):
    got, ref = got.double(), ref.double()
    r = float(ref.norm())
    d = float((got - ref).norm())
    return d / r if r else (0.0 if d == 0 else float("inf"))


def expected(name):
    return hm.load_safetensors(os.path.join(DATA, name + ".expect.safetensors")), \
        json.load(open(os.path.join(DATA, name + ".expect.json")))


def reference_grads(exp, moe):
    """transformers' gradients under the names the folder stores."""
    out = {}
    for key, g in exp.items():
        if not key.startswith("grad."):
            continue
        n = key[len("grad."):]
        if n.endswith("mlp.experts.gate_up_proj"):
            pre = n[:-len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts."
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[pre + "%d.w1.weight" % e] = g[e, :inter]
                out[pre + "%d.w3.weight" % e] = g[e, inter:]
        elif n.endswith("mlp.experts.down_proj"):
            pre = n[:-len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
            for e in range(g.shape[0]):
                out[pre + "%d.w2.weight" % e] = g[e]
        elif moe and n.endswith("mlp.gate.weight"):  # the router
            out[n.replace("mlp.gate.weight", "block_sparse_moe.gate.weight")] = g
        else:
            out[n] = g
    return out


def test_causal(cllm, tmp, name):
    exp, meta = expected(name)
    d = os.path.join(DATA, name)
    ids = exp["ids"]
    B, T = ids.shape
    data = os.path.join(tmp, name + ".jsonl")
    hm.write_jsonl(data, [{"input_ids": r.tolist()} for r in ids])
    gpath, lpath = os.path.join(tmp, name + ".grads.st"), os.path.join(tmp, name + ".logits.st")
    r = run([cllm, "grad", "--model", d, "--data", data, "--seq-len", str(T), "--batch-size", str(B),
             "--out", gpath, "--logits-out", lpath])
    if check("%s: cllm grad exit 0" % name, r.returncode == 0, r.stderr[-400:]):
        loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
        rel = abs(loss - meta["loss"]) / abs(meta["loss"])
        check("%s: loss equals transformers' (rel 1e-5)" % name, rel <= 1e-5,
              "cllm %.9g transformers %.9g rel %.1e" % (loss, meta["loss"], rel))
        got = hm.load_safetensors(lpath)["logits"].double()
        err = float((got - exp["logits"][:, -1, :]).abs().max())
        check("%s: last-position logits (abs 1e-4)" % name, err <= 1e-4, "max abs diff %.2e" % err)
        grads, ref = hm.load_safetensors(gpath), reference_grads(exp, meta["kind"] == "mixtral")
        check("%s: gradient names" % name, sorted(grads) == sorted(ref),
              "missing %s extra %s" % (sorted(set(ref) - set(grads))[:4], sorted(set(grads) - set(ref))[:4]))
        worst, wname = 0.0, ""
        for n, g in ref.items():
            if n in grads:
                e = rel_l2(grads[n], g)
                if e > worst:
                    worst, wname = e, n
        check("%s: %d gradients within rel-L2 1e-4" % (name, len(ref)), worst <= 1e-4,
              "worst %.1e (%s)" % (worst, wname))
    gaps = [meta["min_logit_gap"]] + ([meta["min_router_gap"]] if meta.get("min_router_gap") is not None else [])
    check("%s: the fixture's greedy choices are clear of fp32 rounding (gaps > 1e-3)" % name, min(gaps) > 1e-3,
          "gaps %s" % gaps)
    prompt = meta["prompt"]
    r = run([cllm, "generate", "--model", d, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
             str(len(meta["greedy"])), "--greedy", "--ignore-eos", "--output", "ids"])
    if check("%s: cllm generate exit 0" % name, r.returncode == 0, r.stderr[-400:]):
        got = [int(t) for t in r.stdout.split()]
        got = got[len(prompt):] if len(got) == len(prompt) + len(meta["greedy"]) else got
        check("%s: greedy tokens equal transformers' (smallest logit gap %.1e)" % (name, meta["min_logit_gap"]),
              got == meta["greedy"], "cllm %s transformers %s" % (got, meta["greedy"]))


def test_reward(cllm, tmp):
    _, meta = expected("llama_reward")
    data = os.path.join(tmp, "reward.jsonl")
    hm.write_jsonl(data, [{"input_ids": row} for row in meta["rows"]])
    r = run([cllm, "score", "--model", os.path.join(DATA, "llama_reward"), "--data", data, "--seq-len", "16"])
    if not check("reward: cllm score exit 0", r.returncode == 0, r.stderr[-400:]):
        return
    got = [json.loads(line)["reward"] for line in r.stdout.strip().splitlines()]
    err = max(abs(a - b) for a, b in zip(got, meta["rewards"])) if len(got) == len(meta["rewards"]) else float("inf")
    check("reward: rewards equal transformers' (abs 1e-4)", err <= 1e-4,
          "cllm %s transformers %s" % (got, meta["rewards"]))


def test_lora(cllm, tmp):
    exp, meta = expected("llama_lora")
    ids = exp["ids"]
    B, T = ids.shape
    data = os.path.join(tmp, "lora.jsonl")
    hm.write_jsonl(data, [{"input_ids": r.tolist()} for r in ids])
    lpath = os.path.join(tmp, "lora.logits.st")
    r = run([cllm, "grad", "--model", os.path.join(DATA, meta["base"]), "--adapter", os.path.join(DATA, "llama_lora"),
             "--data", data, "--seq-len", str(T), "--batch-size", str(B), "--out", os.path.join(tmp, "lora.g.st"),
             "--logits-out", lpath])
    if not check("lora: cllm grad --adapter exit 0", r.returncode == 0, r.stderr[-400:]):
        return
    loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    rel = abs(loss - meta["loss"]) / abs(meta["loss"])
    check("lora: loss equals PEFT's (rel 1e-5)", rel <= 1e-5, "cllm %.9g peft %.9g rel %.1e" % (loss, meta["loss"], rel))
    err = float((hm.load_safetensors(lpath)["logits"].double() - exp["logits"][:, -1, :]).abs().max())
    check("lora: last-position logits (abs 1e-4)", err <= 1e-4, "max abs diff %.2e" % err)


def test_rope_refusals(cllm, tmp):
    """transformers 5's rope_parameters: a rope_type cllm does not implement
    is refused by name, never run as default RoPE."""
    src = os.path.join(DATA, "llama")
    for label, rp, want in (("llama3 rope_type", {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0},
                             "rope_parameters.rope_type = llama3"),
                            ("unknown key", {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0},
                             "rope_parameters.factor"),
                            ("theta not a number", {"rope_theta": "big"}, "rope_parameters.rope_theta"),
                            ("not an object", 10000.0, "'rope_parameters' must be an object")):
        d = os.path.join(tmp, "rope_" + label.replace(" ", "_"))
        os.makedirs(d, exist_ok=True)
        cfg = json.load(open(os.path.join(src, "config.json")))
        cfg["rope_parameters"] = rp
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        os.symlink(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
        r = run([cllm, "generate", "--model", d, "--prompt-ids", "1,2", "--max-new-tokens", "1", "--greedy"])
        check("rope_parameters %s refused" % label, r.returncode != 0 and want in r.stderr and "config.json" in r.stderr,
              "rc %d: %s" % (r.returncode, r.stderr.strip()[-200:]))


def test_rope_precedence(cllm, tmp):
    """A config with both spellings: rope_parameters' theta wins, as in
    transformers 5 (the top-level value here is the wrong one)."""
    exp, meta = expected("llama_tied_bias")
    src, d = os.path.join(DATA, "llama_tied_bias"), os.path.join(tmp, "rope_both")
    os.makedirs(d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["rope_theta"] = 10000.0
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    os.symlink(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
    ids = exp["ids"]
    data = os.path.join(tmp, "rope_both.jsonl")
    hm.write_jsonl(data, [{"input_ids": r.tolist()} for r in ids])
    r = run([cllm, "grad", "--model", d, "--data", data, "--seq-len", str(ids.shape[1]), "--batch-size",
             str(ids.shape[0]), "--out", os.path.join(tmp, "rope_both.st")])
    if check("rope_parameters and rope_theta both set: exit 0", r.returncode == 0, r.stderr[-400:]):
        loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
        rel = abs(loss - meta["loss"]) / abs(meta["loss"])
        check("rope_parameters and rope_theta both set: rope_parameters' theta wins", rel <= 1e-5,
              "cllm %.9g transformers %.9g rel %.1e" % (loss, meta["loss"], rel))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build")  # passed by ctest, unused
    a = ap.parse_args()
    cllm = os.path.abspath(a.cllm)
    with tempfile.TemporaryDirectory() as tmp:
        for name in CAUSAL:
            test_causal(cllm, tmp, name)
        test_reward(cllm, tmp)
        test_lora(cllm, tmp)
        test_rope_refusals(cllm, tmp)
        test_rope_precedence(cllm, tmp)
    print("%d failed" % FAILED)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
