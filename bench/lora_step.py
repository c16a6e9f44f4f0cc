#!/usr/bin/python3
"""
LoRA vs full fine-tuning: step time and peak memory of `cllm train` on the
same model folder and token data.

  /usr/bin/python3 bench/lora_step.py --cllm build/cllm [--preset llama-100M]
      [--batch 4] [--seq-len 256] [--steps 6] [--reps 2] [--threads 2]
      [--lora-r 16] [--lora-target q_proj,v_proj] [--qlora nf4,int8]
      [--set hidden_size=2048 --set ...] [--only full,lora,qlora-nf4]

The model is `cllm init --preset PRESET --seed 1`, the data random tokens.
Each repetition runs, interleaved (full, lora, full, lora, ...) because the
CPU share of this machine fluctuates:
  full:  cllm train --optimizer adamw --lr 1e-4 --steps N --batch-size B
         --seq-len T --no-shuffle
  lora:  the same with --lora-r R [--lora-target ...]
  qlora: the LoRA run on a quantized base, one per --qlora format (nf4:
         --load-in-4bit --bnb-4bit-quant-type nf4 --bnb-4bit-use-double-quant,
         as the QLoRA paper; fp4 likewise; int8: --load-in-8bit)
  torch full / torch LoRA (the peer, with --torch; llama presets): the
         same model through tests/ref/hf_models.py, torch.optim.AdamW(lr
         1e-4), fp32; LoRA written out as PEFT computes it (the frozen
         layer's output plus (x A^T) B^T * alpha / r on the target
         modules, A kaiming-uniform, B zero; only A and B train)
Step times come from metrics.jsonl (cllm) or the worker's clock (torch; the
first step of each run is warm-up and dropped; the figure is the median
over the rest), peak RSS from getrusage of the child; `cllm estimate`
gives the predicted total of each cllm run. Prints a markdown table and the
load average before and after.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from train_step import make_data, run_child  # noqa: E402

PY = "/usr/bin/python3"


def worker(args):
    """One torch run (full or LoRA): prints {"step_times": [...]}."""
    import math
    import time
    import torch
    import hf_models as hm
    torch.set_num_threads(args.threads)
    cfg, params = hm.load_hf_folder(args.model)
    samples = hm.read_jsonl(args.data)
    targets = args.lora_target.split(",") if args.lora_target else ["q_proj", "v_proj"]
    if args.worker == "torch-full":
        leaves = {k: v.requires_grad_(True) for k, v in params.items()}
        trained = list(leaves.values())
    else:
        leaves = dict(params)
        adapters = {}
        for name, w in params.items():
            mod = name[:-len(".weight")]
            if name.endswith(".weight") and mod.split(".")[-1] in targets:
                out_f, in_f = w.shape
                bound = 1.0 / math.sqrt(in_f)
                A = (torch.rand(args.lora_r, in_f) * 2 - 1) * bound
                adapters[mod] = (A.requires_grad_(True), torch.zeros(out_f, args.lora_r, requires_grad=True))
        scale = args.lora_alpha / args.lora_r
        plain = hm._linear

        def lora_linear(x, p, name):
            y = plain(x, p, name)
            ad = adapters.get(name)
            return y if ad is None else y + (x @ ad[0].t()) @ ad[1].t() * scale
        hm._linear = lora_linear
        trained = [t for ab in adapters.values() for t in ab]
    opt = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.0)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ids, labels = hm.micro_batch(samples, step, args.batch, args.seq_len)
        loss, _ = hm.model_loss(cfg, leaves, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_times": times}))
    return 0


def run_torch(args, d, data, mode):
    cmd = [PY, os.path.abspath(__file__), "--worker", mode, "--model", d, "--data", data, "--cllm", args.cllm,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
           "--threads", str(args.threads), "--lora-r", str(args.lora_r), "--lora-alpha", str(args.lora_alpha)]
    if args.lora_target:
        cmd += ["--lora-target", args.lora_target]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE", PYTHONDONTWRITEBYTECODE="1")
    rc, out, err, rss = run_child(cmd, env)
    if rc != 0:
        sys.exit("torch worker %s failed (%d):\n%s" % (mode, rc, err[-2000:]))
    return json.loads(out.strip().splitlines()[-1])["step_times"][1:], rss / 1024.0


def estimate(cllm, d, B, T, extra):
    r = subprocess.run([cllm, "estimate", "--model", d, "--micro-batch", str(B), "--seq-len", str(T), "--json"] + extra,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return json.loads(r.stdout)["total"] if r.returncode == 0 else None


def run(args, d, data, work, extra):
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [args.cllm, "train", "--model", d, "--data", data, "--out", out, "--optimizer", "adamw", "--lr", "1e-4",
           "--steps", str(args.steps), "--batch-size", str(args.batch), "--seq-len", str(args.seq_len),
           "--no-shuffle", "--log", "quiet"] + extra
    rc, _, err, rss = run_child(cmd, env)
    if rc != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), rc, err[-2000:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f if l.strip() and "step_time" in l]
    return [float(x["step_time"]) for x in m][1:], rss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--preset", default="llama-100M")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-target", default=None)
    ap.add_argument("--lora-alpha", type=float, default=32)
    ap.add_argument("--torch", action="store_true", help="also run the PyTorch peer (full and LoRA)")
    ap.add_argument("--only", default=None,
                    help="a subset of the runs: full,lora,qlora-FMT,torch-full,torch-lora")
    ap.add_argument("--qlora", default="nf4", help="quantized bases to run LoRA on: nf4,fp4,int8 (empty: none)")
    ap.add_argument("--set", action="append", default=[], help="cllm init --set key=value (model shape)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    work = tempfile.mkdtemp(prefix="cllm-lora-bench-")
    try:
        d = os.path.join(work, "model")
        sets = [x for kv in args.set for x in ("--set", kv)]
        r = subprocess.run([args.cllm, "init", "--arch", args.arch, "--preset", args.preset, "--seed", "1", "--out", d]
                           + sets,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        data = os.path.join(work, "data.jsonl")
        make_data(data, vocab, args.batch * args.steps, args.seq_len + 1, 1)
        lora = ["--lora-r", str(args.lora_r), "--lora-alpha", str(args.lora_alpha)] + \
            (["--lora-target", args.lora_target] if args.lora_target else [])
        qflags = {"nf4": ["--load-in-4bit", "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant"],
                  "fp4": ["--load-in-4bit", "--bnb-4bit-quant-type", "fp4", "--bnb-4bit-use-double-quant"],
                  "int8": ["--load-in-8bit"]}
        # (label, key for --only, extra train flags or a torch worker name, extra estimate flags)
        est_lora = ["--lora-r", str(args.lora_r)] + (["--lora-target", args.lora_target] if args.lora_target else [])
        modes = [("full", "full", [], []),
                 ("LoRA r=%d%s" % (args.lora_r, " " + args.lora_target if args.lora_target else ""), "lora", lora,
                  est_lora)]
        for q in [x for x in args.qlora.split(",") if x]:
            modes.append(("QLoRA-%s r=%d" % (q, args.lora_r), "qlora-" + q, lora + qflags[q], est_lora + qflags[q]))
        if args.torch:
            modes += [("torch full", "torch-full", "torch-full", None),
                      ("torch LoRA r=%d" % args.lora_r, "torch-lora", "torch-lora", None)]
        if args.only:
            modes = [m for m in modes if m[1] in args.only.split(",")]
        load0 = os.getloadavg()
        times = {m[0]: [] for m in modes}
        rss = {m[0]: 0.0 for m in modes}
        for _ in range(args.reps):
            for m, _, extra, _ in modes:
                t, r_ = run_torch(args, d, data, extra) if isinstance(extra, str) else run(args, d, data, work, extra)
                times[m] += t
                rss[m] = max(rss[m], r_)
        load1 = os.getloadavg()
        est = {m: estimate(args.cllm, d, args.batch, args.seq_len, e) for m, _, extra, e in modes
               if not isinstance(extra, str)}
        tbase = statistics.median(times["torch full"]) if "torch full" in times else float("nan")
        base = statistics.median(times["full"]) if "full" in times else float("nan")
        print("%s%s B=%d T=%d, %d threads, %d steps x %d runs each (first step dropped), load average %.1f -> %.1f" %
              (args.preset, " with " + " ".join(args.set) if args.set else "", args.batch, args.seq_len, args.threads, args.steps, args.reps, load0[0], load1[0]))
        print()
        print("| run | median step | min | max | speed vs its full run | peak RSS | cllm estimate |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for m, _, extra, _ in modes:
            med = statistics.median(times[m])
            ref = tbase if isinstance(extra, str) else base
            print("| %s | %.3f s | %.3f s | %.3f s | %.2fx | %.0f MiB | %s |" %
                  (m, med, min(times[m]), max(times[m]), ref / med, rss[m],
                   "%.0f MiB" % (est[m] / 1048576.0) if est.get(m) else ""))
        lc = [m for m, k, e, _ in modes if k == "lora"]
        lt = [m for m, k, e, _ in modes if k == "torch-lora"]
        if lc and lt:
            print()
            print("cllm LoRA vs torch LoRA: %.2fx the throughput" %
                  (statistics.median(times[lt[0]]) / statistics.median(times[lc[0]])))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
