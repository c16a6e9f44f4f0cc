#!/usr/bin/python3
"""
ZeRO++ against plain ZeRO-3: communication bytes and step time per option,
on 2 and 4 ranks of one host.

  /usr/bin/python3 bench/zeropp_bench.py --cllm build/cllm [--ranks 2,4]
      [--preset small] [--steps 8] [--reps 2] [--seq-len 128] [--quick]

For each rank count N the driver trains the same LLaMA model (cllm init
--arch llama --preset PRESET --seed 1) on the same random tokens at ZeRO
stage 3 under `mpirun -np N` (1 thread per rank, OMP_WAIT_POLICY=PASSIVE),
once per option:

    plain   zero_optimization {"stage": 3, "stage3_param_persistence_threshold": 0}
    qwZ     + zero_quantized_weights      (int8 parameter all-gathers)
    qgZ     + zero_quantized_gradients    (int8 gradient reduction)
    hpZ     + zero_hpz_partition_size 2   (4 ranks: backward gathers in pairs)
    all     every option above that applies to N

Each rank runs --accum micro-batches per step (2 by default, so that the
backward's re-gathers, which hpZ keeps inside its group, happen), and the
persistence threshold is 0 (--persist), so that every tensor of the small
preset is partitioned and gathered as a large model's would be (DeepSpeed's
default of 1e5 elements would replicate most of the small preset).

The options run in rotating order, --reps times (A B C ... then B C ... A),
because the machine's CPU share drifts. From each run's metrics.jsonl the
bench takes comm_bytes_params and comm_bytes_grads (the bytes rank 0
received in the step's parameter gathers and gradient reductions; see
docs/distributed.md), the step times (the first step is discarded) and the
losses. It prints, per N and option: bytes per step (parameters, gradients,
total) and their ratio to plain, the median step time and its ratio, and
the largest relative loss difference to plain over the run.

On one host the ranks exchange through shared memory, where bytes are cheap
and int8 (de)quantisation is not, so the step time here shows the
quantisation's compute cost; on a network the saved bytes are the point.
--quick: the tiny preset, 3 steps, one rep.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

OPTIONS = [
    ("plain", {}),
    ("qwZ", {"zero_quantized_weights": True}),
    ("qgZ", {"zero_quantized_gradients": True}),
    ("hpZ", {"zero_hpz_partition_size": 2}),
    ("all", {"zero_quantized_weights": True, "zero_quantized_gradients": True, "zero_hpz_partition_size": 2}),
]


def options_for(n):
    """hpZ needs a group size that divides the ranks and is below them."""
    out = []
    for name, z in OPTIONS:
        if name == "hpZ" and n <= 2:
            continue
        if name == "all" and n <= 2:
            z = {k: v for k, v in z.items() if k != "zero_hpz_partition_size"}
        out.append((name, z))
    return out


def run(a, n, model, data, workdir, name, z):
    cfg = {"model": model, "data": {"train": data, "seq_len": a.seq_len},
           "train_micro_batch_size_per_gpu": a.micro_batch, "train_batch_size": a.micro_batch * a.accum * n,
           "train_iters": a.steps, "log": "plain", "peak_gflops": 1.0, "seed": 7,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-5}},
           "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": a.persist}, **z)}
    path = os.path.join(workdir, "cfg-%d-%s.json" % (n, name))
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(workdir, "out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n),
           a.cllm, "train", "--config", path, "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f if l.strip()]
    m = [r for r in m if "loss" in r]
    shutil.rmtree(out, ignore_errors=True)
    active = [l.strip() for l in p.stderr.splitlines() if "zero_" in l and ("active" in l or "no effect" in l)]
    return {"params": statistics.median(r["comm_bytes_params"] for r in m),
            "grads": statistics.median(r["comm_bytes_grads"] for r in m),
            "times": [r["step_time"] for r in m][1:], "losses": [r["loss"] for r in m], "log": active}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per rank and step")
    ap.add_argument("--persist", type=float, default=0,
                    help="stage3_param_persistence_threshold (0: every tensor partitioned and gathered)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.preset, a.steps, a.reps, a.seq_len = "tiny", 3, 1, 32
    if a.steps < 2:
        ap.error("--steps must be at least 2 (the first step is discarded)")
    a.cllm = os.path.abspath(a.cllm)
    import machine
    workdir = tempfile.mkdtemp(prefix="cllm-zeropp-")
    print("# zeropp benchmark")
    print()
    print("- %s" % machine.header(a.cllm))
    print("- llama preset %s, seq len %d, micro-batch %d x %d accumulated per rank, "
          "stage3_param_persistence_threshold %g, %d steps per run (first discarded), %d rotating reps, "
          "1 thread per rank" % (a.preset, a.seq_len, a.micro_batch, a.accum, a.persist, a.steps, a.reps))
    sys.stdout.flush()
    table = []
    try:
        model = os.path.join(workdir, "model")
        p = subprocess.run([a.cllm, "init", "--arch", "llama", "--preset", a.preset, "--seed", "1", "--out", model],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("cllm init failed: " + p.stderr)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        r = random.Random(1)
        data = os.path.join(workdir, "data.jsonl")
        with open(data, "w") as f:
            for _ in range(a.steps * a.micro_batch * a.accum * 4 + 8):
                f.write(json.dumps({"input_ids": [r.randrange(vocab) for _ in range(a.seq_len)]}) + "\n")
        for n in [int(x) for x in a.ranks.split(",")]:
            opts = options_for(n)
            res = {name: [] for name, _ in opts}
            for rep in range(a.reps):
                order = opts[rep % len(opts):] + opts[:rep % len(opts)]
                for name, z in order:
                    t0 = time.time()
                    res[name].append(run(a, n, model, data, workdir, name, z))
                    print("  N=%d rep %d %s: %.0fs, load %.2f" % (n, rep + 1, name, time.time() - t0,
                                                                 os.getloadavg()[0]), file=sys.stderr)
            base = res["plain"][0]
            base_t = statistics.median(t for x in res["plain"] for t in x["times"])
            for name, _ in opts:
                x = res[name][0]
                t = statistics.median(v for y in res[name] for v in y["times"])
                dl = max(abs(u - v) / abs(v) for u, v in zip(x["losses"], base["losses"]))
                table.append((n, name, x["params"], x["grads"], (x["params"] + x["grads"]) /
                              (base["params"] + base["grads"]), t, t / base_t, dl, "; ".join(x["log"])))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print("| ranks | option | param bytes/step | grad bytes/step | total vs plain | median step (s) | step vs plain "
          "| max loss diff vs plain | start-up log |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for row in table:
        print("| %d | %s | %d | %d | %.3f | %.3f | %.2fx | %.1e | %s |" % row)
    print()
    print("bytes: received by rank 0 per step (medians over the run's steps); load average at the end %.2f"
          % os.getloadavg()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
