#!/usr/bin/python3
"""
End-to-end model tests: `cllm grad` and `cllm train` on tiny GPT-2, LLaMA
and BLOOM models against the torch references in tests/ref/hf_models.py,
plus error paths of model and data loading.

Run by ctest (label model) as
  /usr/bin/python3 tests/test_model_vs_torch.py --cllm build/cllm --build build
Optional: --only SUBSTRING runs the cases whose name contains it; --keep
leaves the temporary directory in place and prints its path.

Contracts exercised:
  cllm grad --model DIR --data FILE --seq-len T --batch-size B --out G.safetensors
    Uses the first B samples of FILE in file order. Prints one JSON line
    {"loss": x, "tokens": n} on stdout (n = targets counted by the loss) and
    writes every parameter's gradient, F32, under its HF name. A tied LM head
    has no entry of its own: the embedding's gradient includes it.
  cllm train --model DIR --data FILE --out OUT --optimizer sgd|adamw --lr X
             --steps N --batch-size B --seq-len T --no-shuffle
             --weight-decay W --grad-clip G --seed 1
    With --no-shuffle sample i goes to micro-batch i // B, row i % B; one
    optimiser step per micro-batch, cycling through the file. Writes
    OUT/config.json, OUT/model.safetensors and OUT/metrics.jsonl (one line
    per step with "step" (1-based) and "loss").
  Batches: samples longer than T are truncated to T, shorter ones are
  right-padded with token 0 and label -100; labels default to input_ids;
  loss = mean cross entropy of logits[:, :-1] vs labels[:, 1:] over the
  targets that are not -100 in the whole batch (HF causal LM).
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
WEIGHT_RTOL = 1e-5
TIMEOUT = 600

PASSED = 0
FAILED = 0


def check(name, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print("ok    %s%s" % (name, ("  " + detail) if detail else ""))
    else:
        FAILED += 1
        print("FAIL  %s%s" % (name, ("  " + detail) if detail else ""))
    sys.stdout.flush()
    return ok


def rel_l2(got, ref):
    got, ref = got.double(), ref.double()
    d = float((got - ref).norm())
    r = float(ref.norm())
    if r == 0.0:
        return 0.0 if d == 0.0 else float("inf")
    return d / r


def run(cmd, **kw):
    """Runs cllm; returns CompletedProcess (text). A timeout counts as a
    failure with returncode None."""
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=TIMEOUT, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, None, e.stdout or "", "timeout after %ds" % TIMEOUT)
    except OSError as e:
        return subprocess.CompletedProcess(cmd, None, "", "cannot run: %s" % e)


def describe(r):
    err = (r.stderr or "").strip().splitlines()
    return "rc=%s stderr=%r" % (r.returncode, err[-1] if err else "")


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

# name -> (config, T, storage dtype, shards). B is 3 throughout.
B = 3
CASES = OrderedDict([
    ("gpt2", (hm.make_config("gpt2", vocab_size=101, n_positions=32, n_embd=48, n_layer=2,
                             n_head=4), 16, "F32", 1)),
    ("gpt2-ninner-v253", (hm.make_config("gpt2", vocab_size=253, n_positions=24, n_embd=64,
                                         n_layer=2, n_head=8, n_inner=160,
                                         layer_norm_epsilon=1e-4), 24, "F32", 1)),
    ("llama-gqa", (hm.make_config("llama", vocab_size=253, hidden_size=48, intermediate_size=112,
                                  num_hidden_layers=2, num_attention_heads=6,
                                  num_key_value_heads=2, rms_norm_eps=1e-5,
                                  tie_word_embeddings=False), 20, "F32", 1)),
    ("llama-mha-tied", (hm.make_config("llama", vocab_size=101, hidden_size=64,
                                       intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=4,
                                       rope_theta=500000.0, tie_word_embeddings=True), 16, "F32", 1)),
    ("llama-bias-headdim", (hm.make_config("llama", vocab_size=253, hidden_size=48,
                                           intermediate_size=80, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=16, attention_bias=True, mlp_bias=True,
                                           tie_word_embeddings=False), 24, "F32", 1)),
    ("bloom-4", (hm.make_config("bloom", vocab_size=101, hidden_size=64, n_layer=2, n_head=4),
                 16, "F32", 1)),
    ("bloom-6", (hm.make_config("bloom", vocab_size=253, hidden_size=48, n_layer=2, n_head=6),
                 24, "F32", 1)),
    # Storage variants: HF folders are often bf16 and sharded. The reference
    # uses the stored (bf16-rounded) values widened to fp32.
    ("gpt2-bf16", (hm.make_config("gpt2", vocab_size=101, n_positions=32, n_embd=48, n_layer=2,
                                  n_head=4), 16, "BF16", 1)),
    ("llama-gqa-sharded", (hm.make_config("llama", vocab_size=253, hidden_size=48,
                                          intermediate_size=112, num_hidden_layers=2,
                                          num_attention_heads=6, num_key_value_heads=2,
                                          tie_word_embeddings=False), 20, "F32", 2)),
])

# name -> (case, optimizer, lr, weight decay, grad clip). Clips of 0.1/0.5 are
# below the gradient norm of these random models, so clipping is active.
TRAIN_CASES = [
    ("train-gpt2-sgd", "gpt2", "sgd", 0.05, 0.0, 100.0),
    ("train-llama-gqa-adamw-clip", "llama-gqa", "adamw", 1e-3, 0.1, 0.5),
    ("train-llama-tied-sgd-clip", "llama-mha-tied", "sgd", 0.05, 0.0, 0.1),
    ("train-bloom6-adamw", "bloom-6", "adamw", 1e-3, 0.01, 1.0),
]


def make_samples(cfg, T, n, seed):
    """A mix that exercises padding, truncation and explicit labels: in each
    group of three, one sample shorter than T, one longer, one of length T
    with labels holding -100 runs. Token ids span 0..V-1 inclusive."""
    g = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    out = []
    for i in range(n):
        kind = i % 3
        L = {0: T - 5 - (i // 3) % 3, 1: T + 7, 2: T}[kind]
        ids = torch.randint(0, V, (L,), generator=g).tolist()
        ids[i % L] = V - 1
        s = {"input_ids": ids}
        if kind == 2:
            labels = list(ids)
            for j in list(range(0, 3)) + list(range(L // 2, L // 2 + 4)):
                labels[j] = -100
            s["labels"] = labels
        out.append(s)
    return out


def write_model(d, cfg, storage, shards, seed):
    params = hm.init_params(cfg, seed=seed)
    hm.save_hf_folder(d, cfg, params, dtype=storage, shards=shards)
    # The reference starts from exactly what the file holds.
    return hm.load_hf_folder(d)[1]


# --------------------------------------------------------------------------
# cllm grad vs float64 autograd
# --------------------------------------------------------------------------


def test_grad(cllm, tmp, name, cfg, T, storage, shards):
    d = os.path.join(tmp, name)
    params = write_model(d, cfg, storage, shards, seed=zlib.crc32(name.encode()) % 1000)
    data = os.path.join(tmp, name + ".jsonl")
    # Two extra samples after the first B: they must not be used.
    samples = make_samples(cfg, T, B + 2, seed=7)
    hm.write_jsonl(data, samples)
    gpath = os.path.join(tmp, name + ".grads.safetensors")
    r = run([cllm, "grad", "--model", d, "--data", data, "--seq-len", str(T),
             "--batch-size", str(B), "--out", gpath])
    if not check("grad %s: exit 0" % name, r.returncode == 0, "" if r.returncode == 0 else describe(r)):
        return
    # The reference is computed in float64 from the same fp32 weights, so it
    # is the exact value (to ~1e-15); the tolerances absorb only cllm's fp32
    # rounding.
    ids, labels = hm.make_batch(samples[:B], T)
    ref_loss, ref_tokens, ref_grads = hm.reference_grads(cfg, params, ids, labels, torch.float64)
    try:
        line = json.loads([l for l in r.stdout.splitlines() if l.strip()][-1])
        loss, tokens = float(line["loss"]), int(line["tokens"])
    except (ValueError, IndexError, KeyError, TypeError) as e:
        check("grad %s: stdout JSON line" % name, False, "%s: %r" % (e, r.stdout[-200:]))
        return
    check("grad %s: tokens" % name, tokens == ref_tokens, "%d vs %d" % (tokens, ref_tokens))
    lrel = abs(loss - ref_loss) / abs(ref_loss)
    check("grad %s: loss" % name, lrel <= LOSS_RTOL,
          "cllm %.9g torch %.9g rel %.1e" % (loss, ref_loss, lrel))
    try:
        got, dtypes = hm.load_safetensors(gpath, with_dtypes=True)
    except (OSError, ValueError) as e:
        check("grad %s: read %s" % (name, gpath), False, str(e))
        return
    missing = [n for n in ref_grads if n not in got]
    extra = [n for n in got if n not in ref_grads]
    check("grad %s: tensor names" % name, not missing and not extra,
          "missing %s extra %s" % (missing, extra))
    not_f32 = [n for n, dt in dtypes.items() if dt != "F32"]
    check("grad %s: all F32" % name, not not_f32, str(not_f32))
    worst, worst_name, bad = 0.0, "", []
    for n, ref in ref_grads.items():
        if n not in got:
            continue
        if tuple(got[n].shape) != tuple(ref.shape):
            bad.append("%s shape %s vs %s" % (n, list(got[n].shape), list(ref.shape)))
            continue
        e = rel_l2(got[n], ref)
        if e > GRAD_RTOL:
            bad.append("%s rel %.1e" % (n, e))
        if e > worst:
            worst, worst_name = e, n
    check("grad %s: %d gradients within rel-L2 %.0e" % (name, len(ref_grads), GRAD_RTOL), not bad,
          ("worst %.1e (%s)" % (worst, worst_name)) if not bad else "; ".join(bad[:8]))


# --------------------------------------------------------------------------
# cllm train vs a torch fp32 loop
# --------------------------------------------------------------------------


def test_train(cllm, tmp, tname, case, opt, lr, wd, clip):
    cfg, T, storage, shards = CASES[case]
    d = os.path.join(tmp, tname + ".model")
    params = write_model(d, cfg, storage, shards, seed=11)
    data = os.path.join(tmp, tname + ".jsonl")
    samples = make_samples(cfg, T, 2 * B, seed=13)  # 2 micro-batches, 3 steps: cycles
    hm.write_jsonl(data, samples)
    out = os.path.join(tmp, tname + ".out")
    steps = 3
    r = run([cllm, "train", "--model", d, "--data", data, "--out", out, "--optimizer", opt,
             "--lr", repr(lr), "--steps", str(steps), "--batch-size", str(B), "--seq-len", str(T),
             "--no-shuffle", "--weight-decay", repr(wd), "--grad-clip", repr(clip), "--seed", "1"])
    if not check("%s: exit 0" % tname, r.returncode == 0, "" if r.returncode == 0 else describe(r)):
        return
    # Reference: torch fp32, torch.optim.SGD / AdamW(betas (0.9, 0.999),
    # eps 1e-8), clip_grad_norm_; AdamW weight decay on matrices and
    # embeddings only (biases and norm weights are not decayed).
    ref, ref_losses = hm.reference_train(cfg, params, samples, opt, lr, steps, B, T,
                                         weight_decay=wd, grad_clip=clip, dtype=torch.float32)
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            metrics = [json.loads(l) for l in f if l.strip()]
        got_losses = [float(m["loss"]) for m in metrics]
        got_steps = [int(m["step"]) for m in metrics]
    except (OSError, ValueError, KeyError, TypeError) as e:
        check("%s: metrics.jsonl" % tname, False, str(e))
        got_losses, got_steps = [], []
    if got_steps:
        check("%s: metrics steps 1..%d" % (tname, steps), got_steps == list(range(1, steps + 1)),
              str(got_steps))
        lrels = [abs(a - b) / abs(b) for a, b in zip(got_losses, ref_losses)]
        check("%s: per-step losses" % tname,
              len(got_losses) == steps and max(lrels) <= LOSS_RTOL,
              "cllm %s torch %s" % (["%.7g" % x for x in got_losses], ["%.7g" % x for x in ref_losses]))
    try:
        ocfg, got = hm.load_hf_folder(out)
    except (OSError, ValueError, KeyError) as e:
        check("%s: output folder loads" % tname, False, str(e))
        return
    check("%s: output config model_type" % tname, ocfg.get("model_type") == cfg["model_type"])
    worst, worst_name, bad = 0.0, "", []
    for n, t in ref.items():
        g = got[n]
        if opt == "adamw" and cfg["model_type"] == "bloom" and n.endswith("query_key_value.bias"):
            # The key bias adds q.b_k to every score of a query row, which
            # softmax ignores: its true gradient is zero and the computed one
            # is rounding noise, which Adam normalises into steps of up to
            # lr per element in either implementation. Those entries are
            # bounded by lr * steps; the query and value biases are compared
            # like every other tensor.
            hd = cfg["hidden_size"] // cfg["n_head"]
            kmask = torch.zeros(t.shape[0], dtype=torch.bool)
            for h in range(cfg["n_head"]):
                kmask[h * 3 * hd + hd: h * 3 * hd + 2 * hd] = True
            kdiff = float((g[kmask] - t[kmask]).abs().max())
            check("%s: key bias (zero true gradient) within lr * steps" % tname,
                  kdiff <= lr * steps, "max |diff| %.3g" % kdiff)
            g, t = g[~kmask], t[~kmask]
        e = rel_l2(g, t)
        if e > WEIGHT_RTOL:
            # Max elementwise change in units of lr: ~2 means an Adam update
            # with the opposite sign on some element (a near-zero gradient).
            jump = float((g - t).abs().max()) / lr
            bad.append("%s rel %.1e (max |diff| = %.2f lr)" % (n, e, jump))
        if e > worst:
            worst, worst_name = e, n
    moved = max(rel_l2(ref[n], params[n]) for n in ref)
    check("%s: final weights within rel-L2 %.0e" % (tname, WEIGHT_RTOL), not bad,
          ("worst %.1e (%s); weights moved by up to %.1e" % (worst, worst_name, moved))
          if not bad else "; ".join(bad[:8]))


# --------------------------------------------------------------------------
# Error paths
# --------------------------------------------------------------------------


def no_model_written(out):
    if not os.path.isdir(out):
        return True
    return not [f for f in os.listdir(out) if f.endswith(".safetensors") or "safetensors" in f]


def expect_failure(cllm, tmp, label, model, data, needle, T=16):
    """Runs grad and train on a bad input; both must fail cleanly (exit code
    1..127, not a signal), name `needle` on stderr, and train must not leave
    a model in --out."""
    gout = os.path.join(tmp, "err-%s.grads.safetensors" % label)
    r = run([cllm, "grad", "--model", model, "--data", data, "--seq-len", str(T),
             "--batch-size", str(B), "--out", gout])
    ok = r.returncode is not None and 0 < r.returncode < 128
    check("error %s: grad fails cleanly" % label, ok, describe(r))
    if needle is not None:
        check("error %s: grad message names %r" % (label, needle), needle in r.stderr, describe(r))
    out = os.path.join(tmp, "err-%s.out" % label)
    r = run([cllm, "train", "--model", model, "--data", data, "--out", out, "--optimizer", "sgd",
             "--lr", "0.1", "--steps", "2", "--batch-size", str(B), "--seq-len", str(T),
             "--no-shuffle", "--seed", "1"])
    ok = r.returncode is not None and 0 < r.returncode < 128
    check("error %s: train fails cleanly" % label, ok, describe(r))
    if needle is not None:
        check("error %s: train message names %r" % (label, needle), needle in r.stderr, describe(r))
    check("error %s: no model in --out" % label, no_model_written(out),
          str(os.listdir(out)) if os.path.isdir(out) else "")


def test_errors(cllm, tmp):
    cfg, T, _, _ = CASES["gpt2"]
    params = hm.init_params(cfg, seed=5)
    samples = make_samples(cfg, T, B, seed=3)
    data = os.path.join(tmp, "err-good.jsonl")
    hm.write_jsonl(data, samples)
    good = os.path.join(tmp, "err-good-model")
    hm.save_hf_folder(good, cfg, params)

    def variant(label, cfg_edit=None, params_edit=None):
        d = os.path.join(tmp, "err-model-" + label)
        c = OrderedDict(cfg)
        p = OrderedDict(params)
        if params_edit:
            params_edit(p)
        hm.save_hf_folder(d, c, p)
        if cfg_edit:
            cfg_edit(c)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(c, f, indent=2)
        return d

    # Sanity: the good inputs work, so the failures below are about the edit.
    r = run([cllm, "grad", "--model", good, "--data", data, "--seq-len", str(T),
             "--batch-size", str(B), "--out", os.path.join(tmp, "err-good.grads.safetensors")])
    check("error baseline: good model and data succeed", r.returncode == 0, describe(r))

    d = variant("model-type", cfg_edit=lambda c: c.update(model_type="gpt3"))
    expect_failure(cllm, tmp, "unknown-model-type", d, data, "gpt3")
    d = variant("missing-key", cfg_edit=lambda c: c.pop("n_head"))
    expect_failure(cllm, tmp, "missing-config-key", d, data, "n_head")
    bad_name = "transformer.h.1.attn.c_attn.weight"
    d = variant("shape", params_edit=lambda p: p.__setitem__(bad_name, p[bad_name].t().contiguous()))
    expect_failure(cllm, tmp, "wrong-shape", d, data, bad_name)
    gone = "transformer.h.0.mlp.c_fc.bias"
    d = variant("missing-tensor", params_edit=lambda p: p.pop(gone))
    expect_failure(cllm, tmp, "missing-tensor", d, data, gone)

    # Truncated model.safetensors: inside the length prefix, inside the
    # header, inside the data.
    with open(os.path.join(good, "model.safetensors"), "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    for label, cut in (("prefix", 5), ("header", 8 + hlen // 2), ("data", 8 + hlen + (len(raw) - 8 - hlen) // 2),
                       ("last-byte", len(raw) - 1)):
        d = os.path.join(tmp, "err-trunc-" + label)
        shutil.copytree(good, d)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(raw[:cut])
        expect_failure(cllm, tmp, "truncated-" + label, d, data, None)

    # Bad data on line 3: malformed JSON; a token id >= vocab_size; a negative id.
    lines = [json.dumps(s) for s in samples]
    V = cfg["vocab_size"]
    bad_lines = {
        "malformed-json": '{"input_ids": [1, 2, 3,, 4]}',
        "id-ge-vocab": json.dumps({"input_ids": [1, 2, V, 3, 4, 5]}),
        "negative-id": json.dumps({"input_ids": [1, 2, -1, 3, 4, 5]}),
    }
    for label, bad in bad_lines.items():
        path = os.path.join(tmp, "err-data-%s.jsonl" % label)
        with open(path, "w") as f:
            f.write("\n".join(lines[:2] + [bad] + lines[2:]) + "\n")
        expect_failure(cllm, tmp, "data-" + label, good, path, "%s:3" % path)

    # Unknown flags are usage errors: exit 2.
    for cmd in ("grad", "train", "init"):
        r = run([cllm, cmd, "--no-such-flag", "1"])
        check("unknown flag: cllm %s exits 2" % cmd, r.returncode == 2, describe(r))
    # A misspelt CLLM_MAX_ISA is a usage error naming it, not silently ignored
    r = subprocess.run([cllm, "init", "--arch", "gpt2", "--out", os.path.join(tmp, "init-isa")], capture_output=True,
                       text=True, env=dict(os.environ, CLLM_MAX_ISA="avx3"))
    check("CLLM_MAX_ISA=avx3 exits 2 naming the variable",
          r.returncode == 2 and "CLLM_MAX_ISA='avx3'" in r.stderr and "portable, avx2" in r.stderr, describe(r))
    # A --set key the family does not have (gpt2's n_layer on llama) is a
    # usage error naming it, not a silently ignored key; a valid one works.
    r = run([cllm, "init", "--arch", "llama", "--set", "n_layer=4", "--out", os.path.join(tmp, "init-bad-set")])
    check("init --set unknown key exits 2 naming it",
          r.returncode == 2 and "'n_layer' is not a llama config key" in r.stderr
          and not os.path.exists(os.path.join(tmp, "init-bad-set")), describe(r))
    r = run([cllm, "init", "--arch", "llama", "--set", "num_hidden_layers=3", "--out", os.path.join(tmp, "init-set")])
    with open(os.path.join(tmp, "init-set", "config.json")) as f:
        layers = json.load(f).get("num_hidden_layers")
    check("init --set num_hidden_layers=3 applies", r.returncode == 0 and layers == 3, describe(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    cllm = os.path.abspath(args.cllm)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="cllm-model-test-")
    try:
        for name, (cfg, T, storage, shards) in CASES.items():
            if args.only in name:
                test_grad(cllm, tmp, name, cfg, T, storage, shards)
        for tname, case, opt, lr, wd, clip in TRAIN_CASES:
            if args.only in tname:
                test_train(cllm, tmp, tname, case, opt, lr, wd, clip)
        if args.only in "errors":
            test_errors(cllm, tmp)
    finally:
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
