#!/usr/bin/python3
"""
Mixed-precision compute (cllm_model_set_precision) against PyTorch.

For each family (gpt2, llama, bloom), on a small random model:
  1. `cllm grad --precision bf16 --logits-out` vs the plain-torch reference
     of tests/ref/hf_models.py: the logits are compared with the fp32
     forward and with the same forward under torch.autocast("cpu",
     bfloat16), which is what PyTorch users run. Documented tolerances
     (docs/training.md, "Mixed precision"): bf16 logits within rel-L2 3e-2 of
     fp32 and no worse than 1.5x autocast's own error; loss within 1% of the
     fp32 loss; gradients within rel-L2 5e-2 of the float64 gradients.
  2. fp16 (emulated): logits within rel-L2 5e-3 of fp32 (fp16 keeps 3 more
     mantissa bits than bf16) and closer than bf16; with weights scaled so a
     matmul output exceeds the fp16 range, the loss is not finite in fp16
     while it is in fp32 (what a loss scaler has to detect).
  3. 200 training steps (AdamW, the same data, seed and config) with
     bf16.enabled and without: the final losses (mean of the last 10 steps)
     are within 2% of each other.

Run by ctest (label precision) as
  /usr/bin/python3 tests/precision_test.py --cllm build/cllm --build build --part compute|train
"""

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

FAILED = 0
B, T = 4, 32

CONFIGS = {
    "gpt2": hm.make_config("gpt2", vocab_size=211, n_positions=64, n_embd=64, n_layer=2, n_head=4),
    "llama": hm.make_config("llama", vocab_size=211, hidden_size=64, intermediate_size=160,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            tie_word_embeddings=False),
    "bloom": hm.make_config("bloom", vocab_size=211, hidden_size=64, n_layer=2, n_head=4),
}


def check(name, ok, detail=""):
    global FAILED
    if not ok:
        FAILED += 1
    print("%s %s%s" % ("ok   " if ok else "FAIL ", name, ("  " + detail) if detail else ""))
    sys.stdout.flush()
    return ok


def rel_l2(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm())


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)


def parse_loss(stdout):
    m = re.search(r'"loss": ([^,]+),', stdout)
    return float(m.group(1)) if m else None


def samples_for(cfg, n, seed):
    """Learnable sequences: each row counts up by a row-specific stride
    modulo V from a random start, with 10% of the tokens replaced by noise."""
    g = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    out = []
    for _ in range(n):
        start = int(torch.randint(0, V, (1,), generator=g))
        stride = int(torch.randint(1, 6, (1,), generator=g))
        ids = [(start + stride * t) % V for t in range(T)]
        for t in range(T):
            if float(torch.rand(1, generator=g)) < 0.1:
                ids[t] = int(torch.randint(0, V, (1,), generator=g))
        out.append({"input_ids": ids})
    return out


def last_logits(cfg, params, ids, autocast=None):
    with torch.no_grad():
        if autocast is None:
            lg = hm.forward(cfg, params, ids)
        else:
            with torch.autocast("cpu", dtype=autocast):
                lg = hm.forward(cfg, params, ids)
    return lg[:, -1, :].float()


def grad_run(cllm, tmp, tag, model, data, prec):
    gpath = os.path.join(tmp, tag + ".grads.safetensors")
    lpath = os.path.join(tmp, tag + ".logits.safetensors")
    r = run([cllm, "grad", "--model", model, "--data", data, "--seq-len", str(T), "--batch-size", str(B),
             "--out", gpath, "--logits-out", lpath, "--precision", prec])
    if not check("%s: cllm grad exit 0" % tag, r.returncode == 0, r.stderr.strip()[-300:]):
        return None
    return parse_loss(r.stdout), hm.load_safetensors(gpath), hm.load_safetensors(lpath)["logits"]


def test_compute(cllm, tmp, arch):
    cfg = CONFIGS[arch]
    model = os.path.join(tmp, arch)
    params = hm.init_params(cfg, seed=3)
    hm.save_hf_folder(model, cfg, params)
    params = hm.load_hf_folder(model)[1]
    data = os.path.join(tmp, arch + ".jsonl")
    samples = samples_for(cfg, B, seed=5)
    hm.write_jsonl(data, samples)
    ids, labels = hm.make_batch(samples, T)

    ref32 = last_logits(cfg, params, ids)
    ac16 = last_logits(cfg, params, ids, torch.bfloat16)
    ref_loss, _, ref_grads = hm.reference_grads(cfg, params, ids, labels, torch.float64)
    bf = grad_run(cllm, tmp, arch + "-bf16", model, data, "bf16")
    fp = grad_run(cllm, tmp, arch + "-fp16", model, data, "fp16")
    if bf is None or fp is None:
        return
    loss, grads, logits = bf
    e_ours, e_torch = rel_l2(logits, ref32), rel_l2(ac16, ref32)
    check("%s bf16: logits vs fp32 rel-L2 <= 3e-2" % arch, e_ours <= 3e-2, "%.2e" % e_ours)
    check("%s bf16: logits error <= 1.5x torch autocast's" % arch, e_ours <= 1.5 * e_torch,
          "cllm %.2e torch autocast %.2e" % (e_ours, e_torch))
    e_ac = rel_l2(logits, ac16)
    check("%s bf16: logits vs torch bf16 autocast rel-L2 <= 3e-2" % arch, e_ac <= 3e-2, "%.2e" % e_ac)
    check("%s bf16: loss within 1%% of fp32" % arch, loss is not None and abs(loss - ref_loss) <= 0.01 * ref_loss,
          "%s vs %.6f" % (loss, ref_loss))
    worst = max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads)
    check("%s bf16: gradients rel-L2 <= 5e-2" % arch, worst <= 5e-2, "worst %.2e" % worst)

    floss, _, flogits = fp
    e16 = rel_l2(flogits, ref32)
    check("%s fp16: logits vs fp32 rel-L2 <= 5e-3 and below bf16's" % arch, e16 <= 5e-3 and e16 < e_ours,
          "fp16 %.2e bf16 %.2e" % (e16, e_ours))
    check("%s fp16: loss within 0.2%% of fp32" % arch,
          floss is not None and abs(floss - ref_loss) <= 2e-3 * ref_loss, "%s vs %.6f" % (floss, ref_loss))


def test_fp16_overflow(cllm, tmp):
    """Scales the first MLP input weights so fc outputs reach ~1e5."""
    cfg = CONFIGS["gpt2"]
    params = hm.init_params(cfg, seed=3)
    params["transformer.h.0.mlp.c_fc.weight"] = params["transformer.h.0.mlp.c_fc.weight"] * 1e5
    model = os.path.join(tmp, "gpt2-big")
    hm.save_hf_folder(model, cfg, params)
    data = os.path.join(tmp, "gpt2.jsonl")
    ids, _ = hm.make_batch(hm.read_jsonl(data), T)
    with torch.no_grad():
        ln = hm.layer_norm(params["transformer.wte.weight"][ids] + params["transformer.wpe.weight"][:T],
                           params["transformer.h.0.ln_1.weight"], params["transformer.h.0.ln_1.bias"], 1e-5)
        peak = float((ln @ params["transformer.h.0.mlp.c_fc.weight"]).abs().max())
    check("fp16 overflow: the scaled layer exceeds the fp16 range (roughly)", peak > 65504, "%.3g" % peak)
    losses = {}
    for prec in ("fp32", "fp16"):
        r = run([cllm, "grad", "--model", model, "--data", data, "--seq-len", str(T), "--batch-size", str(B),
                 "--out", os.path.join(tmp, "big.safetensors"), "--precision", prec])
        check("fp16 overflow: %s exit 0" % prec, r.returncode == 0, r.stderr.strip()[-300:])
        losses[prec] = parse_loss(r.stdout)
    check("fp16 overflow: fp32 loss finite, fp16 loss not",
          losses["fp32"] is not None and math.isfinite(losses["fp32"]) and losses["fp16"] is not None
          and not math.isfinite(losses["fp16"]), str(losses))


def train(cllm, tmp, arch, prec, model, data):
    out = os.path.join(tmp, "%s-%s.out" % (arch, prec))
    conf = os.path.join(tmp, "%s-%s.json" % (arch, prec))
    with open(conf, "w") as f:
        json.dump({"bf16": {"enabled": prec == "bf16"}}, f)
    r = run([cllm, "train", "--config", conf, "--model", model, "--data", data, "--out", out, "--optimizer",
             "adamw", "--lr", "3e-3", "--steps", "200", "--batch-size", "8", "--seq-len", str(T), "--seed", "1",
             "--log", "quiet"])
    if not check("train %s %s: exit 0" % (arch, prec), r.returncode == 0, r.stderr.strip()[-300:]):
        return None
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [float(json.loads(l)["loss"]) for l in f if l.strip() and "loss" in json.loads(l)]


def test_train(cllm, tmp, arch):
    cfg = CONFIGS[arch]
    model = os.path.join(tmp, arch)
    data = os.path.join(tmp, arch + "-train.jsonl")
    hm.write_jsonl(data, samples_for(cfg, 256, seed=9))
    l32 = train(cllm, tmp, arch, "fp32", model, data)
    l16 = train(cllm, tmp, arch, "bf16", model, data)
    if not l32 or not l16:
        return
    f32, f16 = sum(l32[-10:]) / 10, sum(l16[-10:]) / 10
    check("train %s: 200 steps" % arch, len(l32) == 200 and len(l16) == 200, "%d %d" % (len(l32), len(l16)))
    check("train %s: loss went down" % arch, f32 < 0.7 * l32[0], "%.4f -> %.4f" % (l32[0], f32))
    check("train %s: bf16 final loss within 2%% of fp32" % arch, abs(f16 - f32) <= 0.02 * f32,
          "fp32 %.4f bf16 %.4f (last step %.4f / %.4f)" % (f32, f16, l32[-1], l16[-1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--part", choices=["compute", "train", "all"], default="all")
    args = ap.parse_args()
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="cllm-prec-")
    try:
        if args.part != "train":
            for arch in CONFIGS:
                test_compute(args.cllm, tmp, arch)
            test_fp16_overflow(args.cllm, tmp)
        if args.part != "compute":
            for arch in CONFIGS:
                params = hm.init_params(CONFIGS[arch], seed=3)
                hm.save_hf_folder(os.path.join(tmp, arch), CONFIGS[arch], params)
                test_train(args.cllm, tmp, arch)
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%s" % ("FAILED %d" % FAILED if FAILED else "all passed"))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
