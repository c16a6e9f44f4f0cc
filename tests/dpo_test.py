#!/usr/bin/python3
"""`cllm train --task dpo` against an independent float64 PyTorch
implementation of trl's DPOTrainer losses (docs/alignment.md).

For tiny random GPT-2, LLaMA and BLOOM models (tests/ref/hf_models.py) and a
pre-tokenized preference JSONL, one SGD step (lr L, no momentum, no decay,
no clipping) of cllm is compared with torch:
  - the step's loss (metrics.jsonl) with the mean over pairs of trl's loss
    (relative 1e-5), and rewards/*, logps/* with trl's metrics;
  - the update (w0 - w1) / L with autograd's gradient of that loss
    (relative L2 1e-4 per tensor, the model tests' tolerance).
Loss types sigmoid (label smoothing 0 and 0.1), ipo (log-probs averaged per
completion token), hinge, robust (smoothing 0.2), reference_free; a separate
reference model (--ref-model) so that policy and reference differ, and the
default reference (the starting weights); gradient accumulation over pairs.
precompute_ref_log_probs gives the same run bit for bit, and with LoRA the
default reference is the base without adapters (case precompute).
A resumed run ends bit-identical to the straight one, and on held-out pairs
eval_loss is the mean DPO loss and eval_rewards/*, eval_logps/* are trl's
metrics (case resume).
Under mpirun (case mpi, label mpi): 2 ranks at ZeRO 1 and 3 match one process.
Also: text records ({"prompt", "chosen", "rejected"}, GPT-2 and TinyLlama
tokenizers) train exactly like their pre-tokenized form (BOS + prompt where
the tokenizer adds BOS, completion + EOS), and bad records fail naming
FILE:LINE.

Run by ctest (label train) as
  /usr/bin/python3 tests/dpo_test.py --cllm build/cllm --build build [--fixtures DIR]
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
FAILED = []


def check(name, ok, detail=""):
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail else ""))
    if not ok:
        FAILED.append(name)
    return ok


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------ torch side


def rows_of(pair, T):
    """The two rows of a pre-tokenized pair: prompt + completion, the last T
    tokens kept (trl's keep_end), labels -100 on the prompt."""
    out = []
    for key in ("chosen_input_ids", "rejected_input_ids"):
        p, c = pair["prompt_input_ids"], pair[key]
        ids = (p + c)[-T:]
        labels = ([-100] * len(p) + c)[-T:]
        out.append((ids, labels))
    return out


def batch_of(pairs, T):
    rows = [r for p in pairs for r in rows_of(p, T)]
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
    return ids, labels


def completion_logps(cfg, params, ids, labels, average):
    """Sum (or mean, trl's ipo) of log p(label) over each row's completion."""
    logits = hm.forward(cfg, params, ids)[:, :-1, :]
    y = labels[:, 1:]
    mask = y != -100
    lp = torch.log_softmax(logits, dim=-1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    s = (lp * mask).sum(-1)
    return s / mask.sum(-1) if average else s


def trl_loss(pc, pr, rc, rr, beta, loss_type, ls, reference_free):
    """trl's DPOTrainer.dpo_loss written from its documented formulas."""
    pi = pc - pr
    ref = torch.zeros_like(pi) if reference_free else rc - rr
    logits = pi - ref
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    elif loss_type == "robust":
        losses = (-F.logsigmoid(beta * logits) * (1 - ls) + F.logsigmoid(-beta * logits) * ls) / (1 - 2 * ls)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(loss_type)
    zc = torch.zeros_like(pc) if reference_free else rc
    zr = torch.zeros_like(pr) if reference_free else rr
    rew_c, rew_r = beta * (pc - zc).detach(), beta * (pr - zr).detach()
    return losses.mean(), {"rewards/chosen": rew_c.mean(), "rewards/rejected": rew_r.mean(),
                           "rewards/accuracies": (rew_c > rew_r).double().mean(),
                           "rewards/margins": (rew_c - rew_r).mean(),
                           "logps/chosen": pc.detach().mean(), "logps/rejected": pr.detach().mean()}


def torch_step(cfg, pol, ref, pairs, T, beta, loss_type, ls, reference_free):
    leaves = {n: t.detach().double().requires_grad_(True) for n, t in pol.items()}
    ids, labels = batch_of(pairs, T)
    avg = loss_type == "ipo"
    lp = completion_logps(cfg, leaves, ids, labels, avg)
    with torch.no_grad():
        lr_ = completion_logps(cfg, {n: t.double() for n, t in ref.items()}, ids, labels, avg)
    loss, metrics = trl_loss(lp[0::2], lp[1::2], lr_[0::2], lr_[1::2], beta, loss_type, ls, reference_free)
    loss.backward()
    return float(loss), {k: float(v) for k, v in metrics.items()}, {n: t.grad for n, t in leaves.items()}


# ------------------------------------------------------------------- data


def make_pairs(V, n, seed, T):
    r = random.Random(seed)
    out = []
    for i in range(n):
        P = r.randint(1, 6) if i != 1 else T + 3  # pair 1: prompt longer than T (keep_end cuts it)
        out.append({"prompt_input_ids": [r.randrange(V) for _ in range(P)],
                    "chosen_input_ids": [r.randrange(V) for _ in range(r.randint(1, 7))],
                    "rejected_input_ids": [r.randrange(V) for _ in range(r.randint(1, 7))]})
    out[0]["chosen_input_ids"][0] = V - 1
    return out


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for x in recs:
            f.write(json.dumps(x) + "\n")


def last_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return [m for m in lines if "loss" in m][-1]


def rel_l2(a, b):
    a, b = a.double(), b.double()
    d = float(torch.linalg.vector_norm(a - b))
    n = float(torch.linalg.vector_norm(b))
    return d / n if n > 0 else d


# --------------------------------------------------------------------- cases


def case_losses(cllm, tmp):
    # lr 100: the update dwarfs the fp32 rounding of weights near 1 (norm weights),
    # so (w0 - w1) / lr recovers the gradient to ~1e-7
    T, LR = 12, 100.0
    variants = [
        ("sigmoid", dict(beta=0.1, loss_type="sigmoid", ls=0.0, rf=False)),
        ("sigmoid-ls", dict(beta=0.5, loss_type="sigmoid", ls=0.1, rf=False)),
        ("ipo", dict(beta=0.1, loss_type="ipo", ls=0.0, rf=False)),
        ("hinge", dict(beta=2.0, loss_type="hinge", ls=0.0, rf=False)),
        ("robust", dict(beta=0.3, loss_type="robust", ls=0.2, rf=False)),
        ("reffree", dict(beta=0.1, loss_type="sigmoid", ls=0.0, rf=True)),
    ]
    for arch in ("gpt2", "llama", "bloom"):
        cfg = hm.make_config(arch)
        V = cfg["vocab_size"]
        pol_dir, ref_dir = os.path.join(tmp, arch + ".pol"), os.path.join(tmp, arch + ".ref")
        hm.save_hf_folder(pol_dir, cfg, hm.init_params(cfg, seed=5))
        hm.save_hf_folder(ref_dir, cfg, hm.init_params(cfg, seed=6))
        pol, ref = hm.load_hf_folder(pol_dir)[1], hm.load_hf_folder(ref_dir)[1]
        pairs = make_pairs(V, 4, seed=len(arch), T=T)
        data = os.path.join(tmp, arch + ".pairs.jsonl")
        write_jsonl(data, pairs)
        runs = [(n, v, ref_dir, ["--batch-size", "3"]) for n, v in variants]
        # the default reference: the starting weights themselves
        runs.append(("default-ref", dict(beta=0.1, loss_type="sigmoid", ls=0.0, rf=False), None,
                     ["--batch-size", "3"]))
        # accumulation: 3 micro-batches of one pair, the mean over the 3 pairs
        runs.append(("accum", dict(beta=0.1, loss_type="sigmoid", ls=0.0, rf=False), ref_dir,
                     ["--batch-size", "3", "--micro-batch-size", "1", "--grad-accum", "3"]))
        for name, v, rdir, extra in runs:
            tag = "%s %s" % (arch, name)
            out = os.path.join(tmp, "%s.%s.out" % (arch, name))
            cmd = [cllm, "train", "--task", "dpo", "--model", pol_dir, "--data", data, "--out", out,
                   "--steps", "1", "--seq-len", str(T), "--optimizer", "sgd", "--lr", str(LR), "--no-shuffle",
                   "--log", "quiet", "--peak-gflops", "1", "--beta", str(v["beta"]), "--loss-type", v["loss_type"],
                   "--label-smoothing", str(v["ls"])] + extra
            if rdir:
                cmd += ["--ref-model", rdir]
            if v["rf"]:
                cmd += ["--reference-free"]
            r = run(cmd)
            if not check("%s: exit 0" % tag, r.returncode == 0, r.stderr[-400:] if r.returncode else ""):
                continue
            loss, metrics, grads = torch_step(cfg, pol, ref if rdir else pol, pairs[:3], T, v["beta"],
                                              v["loss_type"], v["ls"], v["rf"])
            m = last_metrics(out)
            lrel = abs(m["loss"] - loss) / max(abs(loss), 1e-30)
            check("%s: loss" % tag, lrel <= LOSS_RTOL, "cllm %.9g torch %.9g rel %.1e" % (m["loss"], loss, lrel))
            bad = ["%s %.9g vs %.9g" % (k, m.get(k, float("nan")), x) for k, x in metrics.items()
                   if not (abs(m.get(k, float("nan")) - x) <= 1e-5 * max(1.0, abs(x)))]
            check("%s: trl metrics" % tag, not bad, "; ".join(bad))
            new = hm.load_hf_folder(out)[1]
            worst, errs = 0.0, []
            for n, g in grads.items():
                upd = (pol[n].double() - new[n].double()) / LR
                e = rel_l2(upd, g)
                worst = max(worst, e)
                if e > GRAD_RTOL:
                    errs.append("%s rel %.1e" % (n, e))
            check("%s: SGD update = trl gradient (%d tensors)" % (tag, len(grads)), not errs,
                  "; ".join(errs[:6]) if errs else "worst rel-L2 %.1e" % worst)


# The fixtures' special tokens, as HF's tokenizers apply them: GPT-2's
# post-processor adds nothing (<|endoftext|> 50256 is its EOS), LLaMA's
# (TinyLlama) adds BOS <s> = 1; its EOS is </s> = 2.
TEXT_TOKENIZERS = [("gpt2", 50257, None, 50256), ("tinyllama-1.1b-chat-v1.0", 32000, 1, 2)]


def case_text(cllm, tmp, fixtures):
    for name, V, bos, eos in TEXT_TOKENIZERS:
        text_case(cllm, tmp, os.path.join(fixtures, name), name, V, bos, eos)


def text_case(cllm, tmp, tok, tname, V, BOS, EOS):
    if not os.path.exists(os.path.join(tok, "tokenizer.json")):
        check("text records: tokenizer fixture at %s" % tok, False)
        return
    arch = "gpt2" if tname == "gpt2" else "llama"
    cfg = hm.make_config(arch, vocab_size=V)
    mdir = os.path.join(tmp, tname + ".model")
    hm.save_hf_folder(mdir, cfg, hm.init_params(cfg, seed=9))
    texts = [("Question: is 7 even?\nAnswer:", " No, 7 is odd.", " Yes."),
             ("Name a colour.", " Blue", " The number twelve, naturally"),
             ("Say hello", " Hello there!", " Goodbye")]

    def encode(s):
        path = os.path.join(tmp, "t.txt")
        with open(path, "w") as f:
            f.write(s)
        r = run([cllm, "tokenize", "--tokenizer", tok, "--input", path, "--no-special"])
        return json.loads(r.stdout)["ids"]

    text_path, ids_path = os.path.join(tmp, tname + ".text.jsonl"), os.path.join(tmp, tname + ".ids.jsonl")
    write_jsonl(text_path, [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in texts])
    write_jsonl(ids_path, [{"prompt_input_ids": ([BOS] if BOS is not None else []) + encode(p),
                            "chosen_input_ids": encode(c) + [EOS],
                            "rejected_input_ids": encode(r) + [EOS]} for p, c, r in texts])
    outs = []
    for name, data in (("text", text_path), ("ids", ids_path)):
        out = os.path.join(tmp, "%s.%s.out" % (tname, name))
        r = run([cllm, "train", "--task", "dpo", "--model", mdir, "--data", data, "--out", out, "--steps", "1",
                 "--batch-size", "3", "--seq-len", "24", "--optimizer", "sgd", "--lr", "1", "--no-shuffle",
                 "--log", "quiet", "--peak-gflops", "1", "--tokenizer", tok, "--reference-free"])
        check("text records (%s): %s run exit 0" % (tname, name), r.returncode == 0, r.stderr[-400:])
        if r.returncode:
            return
        outs.append(out)
    bad = os.path.join(tmp, "bad-text.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
        f.write(json.dumps({"prompt": "a", "chosen": 3, "rejected": "c"}) + "\n")
    r = run([cllm, "train", "--task", "dpo", "--model", mdir, "--data", bad, "--out", os.path.join(tmp, "bo"),
             "--steps", "1", "--batch-size", "1", "--seq-len", "8", "--log", "quiet", "--tokenizer", tok])
    check("text records (%s): a non-string completion fails naming FILE:LINE" % tname,
          r.returncode == 1 and ('%s:2:1: "chosen": expected a string' % bad) in r.stderr, r.stderr[-300:])
    a, b = last_metrics(outs[0]), last_metrics(outs[1])
    check("text records (%s): same loss as their pre-tokenized form" % tname, a["loss"] == b["loss"],
          "%r vs %r" % (a["loss"], b["loss"]))
    wa, wb = hm.load_hf_folder(outs[0])[1], hm.load_hf_folder(outs[1])[1]
    check("text records (%s): same updated weights" % tname, all(torch.equal(wa[n], wb[n]) for n in wa))


def case_errors(cllm, tmp):
    cfg = hm.make_config("llama")
    mdir = os.path.join(tmp, "err.model")
    hm.save_hf_folder(mdir, cfg, hm.init_params(cfg, seed=1))
    good = {"prompt_input_ids": [1, 2], "chosen_input_ids": [3], "rejected_input_ids": [4]}
    cases = [
        ("missing key", {"prompt_input_ids": [1], "chosen_input_ids": [2]}, 'missing key "rejected_input_ids"'),
        ("wrong type", dict(good, chosen_input_ids="abc"), '"chosen_input_ids": expected an array'),
        ("id outside vocabulary", dict(good, rejected_input_ids=[5, 101]),
         '"rejected_input_ids"[1]: token id 101 is outside the vocabulary [0, 101)'),
        ("empty completion", dict(good, chosen_input_ids=[]), "empty chosen completion"),
        ("nothing scored", dict(good, prompt_input_ids=[], chosen_input_ids=[3, 5], rejected_input_ids=[7]),
         "the rejected row scores no token"),
        ("malformed JSON", '{"prompt_input_ids": [1,', "malformed JSON"),
        ("text without tokenizer", {"prompt": "a", "chosen": "b", "rejected": "c"}, "needs a tokenizer"),
    ]
    for name, rec, needle in cases:
        path = os.path.join(tmp, "bad.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(good) + "\n\n" + (rec if isinstance(rec, str) else json.dumps(rec)) + "\n")
        r = run([cllm, "train", "--task", "dpo", "--model", mdir, "--data", path, "--out", os.path.join(tmp, "eo"),
                 "--steps", "1", "--batch-size", "1", "--seq-len", "8", "--log", "quiet"])
        where = "%s:3:" % path
        check("bad record (%s): exit 1 naming FILE:LINE" % name,
              r.returncode == 1 and where in r.stderr and needle in r.stderr, r.stderr[-300:])
    r = run([cllm, "train", "--task", "dpo", "--model", mdir, "--data", path, "--out", os.path.join(tmp, "eo"),
             "--steps", "1", "--batch-size", "1", "--seq-len", "8", "--loss-type", "kto"])
    check("unknown loss_type: usage error naming it", r.returncode == 2 and "dpo.loss_type" in r.stderr,
          r.stderr[-300:])


def case_resume(cllm, tmp):
    """A run stopped at a checkpoint and resumed ends bit-identical to the
    straight run (shuffled pairs, AdamW, the reference still the starting
    weights), and evaluation reports the mean DPO loss and trl's metrics over
    the eval pairs."""
    cfg = hm.make_config("llama")
    pol_dir = os.path.join(tmp, "res.pol")
    params = hm.init_params(cfg, seed=8)
    hm.save_hf_folder(pol_dir, cfg, params)
    pairs = make_pairs(cfg["vocab_size"], 6, seed=4, T=12)
    data = os.path.join(tmp, "res.jsonl")
    write_jsonl(data, pairs)
    common = ["train", "--task", "dpo", "--model", pol_dir, "--data", data, "--batch-size", "2", "--seq-len", "12",
              "--optimizer", "adamw", "--lr", "0.01", "--log", "quiet", "--peak-gflops", "1", "--beta", "0.2"]
    a, b = os.path.join(tmp, "res.a"), os.path.join(tmp, "res.b")
    runs = [common + ["--out", a, "--steps", "4"], common + ["--out", b, "--steps", "2", "--save-interval", "2"],
            common + ["--out", b, "--steps", "4", "--save-interval", "2", "--resume", "auto"]]
    for i, cmd in enumerate(runs):
        r = run([cllm] + cmd)
        if not check("resume: run %d" % i, r.returncode == 0, r.stderr[-300:]):
            return
    with open(os.path.join(a, "model.safetensors"), "rb") as f1, open(os.path.join(b, "model.safetensors"), "rb") as f2:
        check("resume: resumed weights bit-identical to the straight run", f1.read() == f2.read())
    # evaluation after a step at lr 0 (the starting weights) against another
    # reference, on a held-out set of 5 pairs (the last eval batch a single pair)
    ref_dir = os.path.join(tmp, "res.ref")
    ref_params = hm.init_params(cfg, seed=18)
    hm.save_hf_folder(ref_dir, cfg, ref_params)
    held = make_pairs(cfg["vocab_size"], 5, seed=14, T=12)
    evald = os.path.join(tmp, "res.eval.jsonl")
    write_jsonl(evald, held)
    ev = os.path.join(tmp, "res.ev")
    cmd = [x if x != "0.01" else "0" for x in common]
    r = run([cllm] + cmd + ["--out", ev, "--steps", "1", "--eval-data", evald, "--eval-interval", "1", "--ref-model",
                            ref_dir])
    if check("resume: eval run", r.returncode == 0, r.stderr[-300:]):
        with open(os.path.join(ev, "metrics.jsonl")) as f:
            e = [m for m in map(json.loads, f) if "eval_loss" in m][-1]
        ids, labels = batch_of(held, 12)
        lp = completion_logps(cfg, {n: t.double() for n, t in params.items()}, ids, labels, False)
        rl = completion_logps(cfg, {n: t.double() for n, t in ref_params.items()}, ids, labels, False)
        ref, metrics = trl_loss(lp[0::2], lp[1::2], rl[0::2], rl[1::2], 0.2, "sigmoid", 0.0, False)
        check("resume: eval_loss = mean DPO loss over the eval pairs", abs(e["eval_loss"] - float(ref)) <= 1e-5 *
              float(ref) and e["eval_tokens"] == len(held), "%r vs %r (%r pairs)" % (e["eval_loss"], float(ref),
                                                                                    e["eval_tokens"]))
        # trl's evaluation metrics: its training metrics' names prefixed with eval_
        bad = ["eval_%s %r vs %.9g" % (k, e.get("eval_" + k), float(x)) for k, x in metrics.items()
               if not (abs(e.get("eval_" + k, float("nan")) - float(x)) <= 1e-5 * max(1.0, abs(float(x))))]
        acc = float(metrics["rewards/accuracies"])
        check("resume: eval_rewards/*, eval_logps/* = trl's metrics over the eval pairs (accuracy %g)" % acc,
              not bad and 0 < acc < 1, "; ".join(bad))


def case_precompute(cllm, tmp):
    """precompute_ref_log_probs gives the run without it, bit for bit (3
    AdamW steps, shuffled, with evaluation pairs); with LoRA and no
    --ref-model the reference is the base without adapters: the same run as
    with the base folder as --ref-model."""
    cfg = hm.make_config("llama")
    pol_dir, ref_dir = os.path.join(tmp, "pre.pol"), os.path.join(tmp, "pre.ref")
    hm.save_hf_folder(pol_dir, cfg, hm.init_params(cfg, seed=3))
    hm.save_hf_folder(ref_dir, cfg, hm.init_params(cfg, seed=4))
    data, evald = os.path.join(tmp, "pre.jsonl"), os.path.join(tmp, "pre.eval.jsonl")
    write_jsonl(data, make_pairs(cfg["vocab_size"], 8, seed=2, T=12))
    write_jsonl(evald, make_pairs(cfg["vocab_size"], 3, seed=9, T=12))
    common = ["train", "--task", "dpo", "--model", pol_dir, "--data", data, "--eval-data", evald, "--eval-interval",
              "3", "--steps", "3", "--batch-size", "2", "--seq-len", "12", "--optimizer", "adamw", "--lr", "1e-2",
              "--log", "quiet", "--peak-gflops", "1"]

    def go(name, *extra):
        out = os.path.join(tmp, "pre." + name)
        r = run([cllm] + common + ["--out", out] + list(extra))
        check("precompute: %s exit 0" % name, r.returncode == 0, r.stderr[-300:])
        if "--precompute-ref-log-probs" in extra:
            check("precompute: %s: 22 rows (8 + 3 pairs) precomputed, the reference freed" % name,
                  "log-probabilities of 22 rows computed, the reference model freed" in r.stderr, r.stderr[-300:])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            recs = [json.loads(l) for l in f if l.strip()]
        keys = ("loss", "eval_loss", "rewards/chosen", "rewards/margins", "logps/rejected", "eval_rewards/margins",
                "eval_rewards/accuracies", "eval_logps/chosen")
        st = os.path.join(out, "adapter_model.safetensors" if "--lora-r" in extra else "model.safetensors")
        with open(st, "rb") as f:
            return [{k: m[k] for k in keys if k in m} for m in recs], f.read()

    a = go("plain", "--ref-model", ref_dir)
    b = go("precomputed", "--ref-model", ref_dir, "--precompute-ref-log-probs")
    check("precompute: losses, eval_loss, metrics and weights bit-identical to computing the reference each step",
          a == b, "%s vs %s" % (a[0][-1], b[0][-1]))
    lora = ["--lora-r", "4", "--lora-target", "all-linear"]
    c = go("lora-base", *lora)
    d = go("lora-folder", "--ref-model", pol_dir, *lora)
    e = go("lora-base-pre", "--precompute-ref-log-probs", *lora)
    check("precompute: LoRA's default reference (the base without adapters) = the base folder as --ref-model",
          c == d, "%s vs %s" % (c[0][-1], d[0][-1]))
    check("precompute: LoRA's base reference precomputed = computed each step", c == e)


def case_mpi(cllm, tmp):
    """Data parallelism: 2 ranks at ZeRO 1 (overlap_comm) and 3 give the
    one-process losses (relative 1e-5) and weights (1e-5) after 3 SGD steps
    with accumulation, pairs split whole over ranks and micro-batches; LoRA
    (reference: the base without adapters) at ZeRO 3 gives the one-process
    adapters and losses."""
    cfg = hm.make_config("bloom")
    pol_dir, ref_dir = os.path.join(tmp, "mpi.pol"), os.path.join(tmp, "mpi.ref")
    hm.save_hf_folder(pol_dir, cfg, hm.init_params(cfg, seed=3))
    hm.save_hf_folder(ref_dir, cfg, hm.init_params(cfg, seed=4))
    data = os.path.join(tmp, "mpi.jsonl")
    write_jsonl(data, make_pairs(cfg["vocab_size"], 8, seed=2, T=12))
    common = ["train", "--task", "dpo", "--model", pol_dir, "--ref-model", ref_dir, "--data", data, "--steps", "3",
              "--batch-size", "4", "--grad-accum", "2", "--seq-len", "12", "--optimizer", "sgd", "--lr", "1",
              "--log", "quiet", "--peak-gflops", "1", "--loss-type", "robust", "--label-smoothing", "0.1"]
    one = os.path.join(tmp, "mpi.one")
    r = run([cllm] + common + ["--out", one])
    if not check("mpi: one-process run", r.returncode == 0, r.stderr[-300:]):
        return
    base_losses = [m["loss"] for m in map(json.loads, open(os.path.join(one, "metrics.jsonl"))) if "loss" in m]
    base = hm.load_hf_folder(one)[1]
    for stage, extra in ((1, {"overlap_comm": True}), (3, {})):
        conf = os.path.join(tmp, "z%d.json" % stage)
        with open(conf, "w") as f:
            json.dump({"zero_optimization": dict({"stage": stage}, **extra)}, f)
        out = os.path.join(tmp, "mpi.z%d" % stage)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",
                            "none", "-np", "2", cllm] + common + ["--config", conf, "--out", out],
                           capture_output=True, text=True, env=env)
        if not check("mpi: ZeRO %d on 2 ranks" % stage, r.returncode == 0, r.stderr[-300:]):
            continue
        losses = [m["loss"] for m in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "loss" in m]
        check("mpi: ZeRO %d losses" % stage, len(losses) == len(base_losses) and
              all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, base_losses)), "%s vs %s" % (losses, base_losses))
        a, b = last_metrics(out), last_metrics(one)
        keys = [k for k in b if k.startswith(("rewards/", "logps/"))]
        bad = [k for k in keys if not abs(a.get(k, float("nan")) - b[k]) <= 1e-5 * max(1.0, abs(b[k]))]
        check("mpi: ZeRO %d trl metrics averaged over ranks (%d)" % (stage, len(keys)), len(keys) == 6 and not bad,
              "; ".join("%s %r vs %r" % (k, a.get(k), b[k]) for k in bad))
        w = hm.load_hf_folder(out)[1]
        diff = max(float((w[n] - base[n]).abs().max()) for n in base)
        check("mpi: ZeRO %d weights within 1e-5 of one process after 3 SGD steps" % stage, diff <= 1e-5,
              "max |diff| %.1e" % diff)
    # LoRA at ZeRO 3: the adapters' values, gradients and optimizer state
    # partitioned, the base (and so the reference: the base without
    # adapters) whole on every rank
    lora = ["--lora-r", "4", "--lora-target", "all-linear"]
    lcommon = [x for x in common if x != "--ref-model" and x != ref_dir] + lora
    lone = os.path.join(tmp, "mpi.lora.one")
    r = run([cllm] + lcommon + ["--out", lone])
    if not check("mpi: LoRA one-process run", r.returncode == 0, r.stderr[-300:]):
        return
    out = os.path.join(tmp, "mpi.lora.z3")
    r = subprocess.run(["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",
                        "none", "-np", "2", cllm] + lcommon + ["--config", os.path.join(tmp, "z3.json"), "--out", out],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if check("mpi: LoRA at ZeRO 3 on 2 ranks", r.returncode == 0, r.stderr[-300:]):
        a = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
        b = hm.load_safetensors(os.path.join(lone, "adapter_model.safetensors"))
        diff = max(float((a[n] - b[n]).abs().max()) / max(float(b[n].abs().max()), 1e-30) for n in b)
        la = [m["loss"] for m in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "loss" in m]
        lb = [m["loss"] for m in map(json.loads, open(os.path.join(lone, "metrics.jsonl"))) if "loss" in m]
        check("mpi: LoRA at ZeRO 3 adapters and losses within 1e-5 of one process", a.keys() == b.keys() and
              diff <= 1e-5 and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(la, lb)) and len(la) == len(lb),
              "adapter rel diff %.1e, losses %s vs %s" % (diff, la, lb))
        check("mpi: LoRA adapters trained (B moved from its zero start)",
              any(float(v.abs().max()) > 0 for k, v in b.items() if "lora_B" in k))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "..", "shared", "fixtures", "hf"))
    ap.add_argument("--case", default="all")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cllm-dpo-")
    try:
        if a.case in ("all", "losses"):
            case_losses(a.cllm, tmp)
        if a.case in ("all", "text"):
            case_text(a.cllm, tmp, a.fixtures)
        if a.case in ("all", "errors"):
            case_errors(a.cllm, tmp)
        if a.case in ("all", "resume"):
            case_resume(a.cllm, tmp)
        if a.case in ("all", "precompute"):
            case_precompute(a.cllm, tmp)
        if a.case == "mpi":
            case_mpi(a.cllm, tmp)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
