#!/usr/bin/python3
"""
LoRA vs full fine-tuning: step time and peak memory of `cllm train` on the
same model folder and token data.

  /usr/bin/python3 bench/lora_step.py --cllm build/cllm [--preset llama-100M]
      [--batch 4] [--seq-len 256] [--steps 6] [--reps 2] [--threads 2]
      [--lora-r 16] [--lora-target q_proj,v_proj]

The model is `cllm init --preset PRESET --seed 1`, the data random tokens.
Each repetition runs, interleaved (full, lora, full, lora, ...) because the
CPU share of this machine fluctuates:
  full:  cllm train --optimizer adamw --lr 1e-4 --steps N --batch-size B
         --seq-len T --no-shuffle
  lora:  the same with --lora-r R [--lora-target ...]
Step times come from metrics.jsonl (the first step of each run is warm-up
and dropped; the figure is the median over the rest), peak RSS from
getrusage of the child; `cllm estimate` gives the predicted total of each.
Prints a markdown table and the load average before and after.
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
from train_step import make_data, run_child  # noqa: E402


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
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cllm-lora-bench-")
    try:
        d = os.path.join(work, "model")
        r = subprocess.run([args.cllm, "init", "--arch", args.arch, "--preset", args.preset, "--seed", "1", "--out", d],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        data = os.path.join(work, "data.jsonl")
        make_data(data, vocab, args.batch * args.steps, args.seq_len + 1, 1)
        lora = ["--lora-r", str(args.lora_r)] + (["--lora-target", args.lora_target] if args.lora_target else [])
        modes = [("full", []), ("LoRA r=%d%s" % (args.lora_r, " " + args.lora_target if args.lora_target else ""), lora)]
        load0 = os.getloadavg()
        times = {m: [] for m, _ in modes}
        rss = {m: 0.0 for m, _ in modes}
        for _ in range(args.reps):
            for m, extra in modes:
                t, r_ = run(args, d, data, work, extra)
                times[m] += t
                rss[m] = max(rss[m], r_)
        load1 = os.getloadavg()
        est_lora = ["--lora-r", str(args.lora_r)] + (["--lora-target", args.lora_target] if args.lora_target else [])
        est = {modes[0][0]: estimate(args.cllm, d, args.batch, args.seq_len, []),
               modes[1][0]: estimate(args.cllm, d, args.batch, args.seq_len, est_lora)}
        base = statistics.median(times["full"])
        print("%s B=%d T=%d, %d threads, %d steps x %d runs each (first step dropped), load average %.1f -> %.1f" %
              (args.preset, args.batch, args.seq_len, args.threads, args.steps, args.reps, load0[0], load1[0]))
        print()
        print("| run | median step | min | max | speed vs full | peak RSS | cllm estimate |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for m, _ in modes:
            med = statistics.median(times[m])
            print("| %s | %.3f s | %.3f s | %.3f s | %.2fx | %.0f MiB | %.0f MiB |" %
                  (m, med, min(times[m]), max(times[m]), base / med, rss[m], (est[m] or 0) / 1048576.0))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
