#!/usr/bin/python3
"""
Training step of a Mixtral-shaped model against a dense LLaMA with the same
active parameters per token.

  /usr/bin/python3 bench/moe_step.py --cllm build/cllm [--batch 2] [--seq 128]
      [--steps 3] [--reps 2] [--threads 2] [--workdir DIR]

Models (cllm init, seed 1):
  moe:   mixtral preset mixtral-8x100M (llama-100M's shape, 8 experts of
         width 2048, top-2)
  dense: llama preset llama-100M with intermediate_size 4096 = 2 x 2048,
         so a token's FFN does the same multiply-adds as the two experts
         it is routed to (the router's C x 8 aside)
Both train with `cllm train --optimizer sgd` on the same random tokens,
interleaved A B A B; the first step of each run is warm-up. Reported: the
median of metrics.jsonl's "time_fwdbwd" (forward + backward) and
"step_time" (including the optimizer over all parameters: the MoE model
has 8 experts' worth of FFN weights to update), and the ratio MoE / dense.
The machine may be shared: the load average is printed with the figures.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def sh(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir")
    a = ap.parse_args()
    wd = a.workdir or tempfile.mkdtemp(prefix="cllm-moe-bench-")
    os.makedirs(wd, exist_ok=True)
    models = {
        "moe": ["--arch", "mixtral", "--preset", "mixtral-8x100M"],
        "dense": ["--arch", "llama", "--preset", "llama-100M", "--set", "intermediate_size=4096"],
    }
    for name, args in models.items():
        d = os.path.join(wd, name)
        if not os.path.exists(os.path.join(d, "config.json")):
            sh([a.cllm, "init", "--seed", "1", "--out", d] + args)
    data = os.path.join(wd, "data.jsonl")
    rng = random.Random(1)
    with open(data, "w") as f:
        for _ in range(a.batch * a.steps):
            f.write(json.dumps({"input_ids": [rng.randrange(32000) for _ in range(a.seq)]}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="PASSIVE")
    times = {n: {"time_fwdbwd": [], "step_time": []} for n in models}
    loads = []
    for rep in range(a.reps):
        for name in models:
            out = os.path.join(wd, "out-%s-%d" % (name, rep))
            sh([a.cllm, "train", "--model", os.path.join(wd, name), "--data", data, "--out", out,
                "--optimizer", "sgd", "--lr", "1e-4", "--steps", str(a.steps), "--batch-size", str(a.batch),
                "--seq-len", str(a.seq), "--no-shuffle"], env=env)
            with open(os.path.join(out, "metrics.jsonl")) as f:
                recs = [json.loads(l) for l in f if '"step_time"' in l]
            for r in recs[1:]:
                for k in times[name]:
                    times[name][k].append(r[k])
            loads.append(os.getloadavg()[0])
    machine = subprocess.run([sys.executable, os.path.join(HERE, "machine.py"), "--cllm", a.cllm],
                             capture_output=True, text=True).stdout.strip()
    print(machine)
    print("B=%d T=%d, %d threads, %d runs x %d timed steps each, load average during the runs %.1f-%.1f"
          % (a.batch, a.seq, a.threads, a.reps, a.steps - 1, min(loads), max(loads)))
    print()
    print("| model | parameters | median forward+backward | median step (SGD) | tokens/s (step) |")
    print("| --- | --- | --- | --- | --- |")
    med = {}
    for name in models:
        first = sh([a.cllm, "estimate", "--model", os.path.join(wd, name)]).stdout.splitlines()[0]
        params = "%.0fM" % (int(first.split(", ")[1].split()[0]) / 1e6)  # "<family>, <n> parameters (...)"
        fb, step = statistics.median(times[name]["time_fwdbwd"]), statistics.median(times[name]["step_time"])
        med[name] = (fb, step)
        label = "Mixtral 8x100M (top-2)" if name == "moe" else "LLaMA-100M, FFN 4096"
        print("| %s | %s | %.3f s | %.3f s | %.0f |" % (label, params, fb, step, a.batch * a.seq / step))
    print()
    print("MoE / dense: forward+backward %.2fx, step %.2fx" % (med["moe"][0] / med["dense"][0],
                                                             med["moe"][1] / med["dense"][1]))


if __name__ == "__main__":
    main()
