#!/usr/bin/python3
"""
Expert parallelism: the step time of 2 ranks with expert_parallel_size 2
against the same 2 ranks with every expert on every rank (data parallelism
alone), the all-to-all bytes per step against the count the routing
implies, their time, and the expert load over a longer run (plotted by
`cllm plot`).

  /usr/bin/python3 bench/moe_ep.py --cllm build/cllm [--batch 4] [--seq 128]
      [--steps 6] [--reps 2] [--load-steps 60] [--svg docs/moe_expert_load.svg]
      [--workdir DIR]

Model (cllm init --arch mixtral, seed 1): hidden 256, 4 layers, 8 experts of
width 1024, top-2, vocabulary 4096. Data: Zipf-distributed random tokens
(a skewed unigram distribution, so that routing has structure to learn).
Both layouts run under `mpirun -np 2` with OMP_NUM_THREADS=1 and
drop_tokens false, interleaved A B A B; the first step of each run is
warm-up. Reported: medians of metrics.jsonl's step_time, time_fwdbwd,
time_a2a (rank 0's seconds inside the all-to-alls, waiting for the other
rank included) and a2a_bytes (bytes sent to the other rank, both ranks
together). The expected bytes: per block, the rows routed to the other
rank's experts travel four times (dispatch and combine, forward and
backward), C floats each (plus 16 bytes of counts per block): with routing
balanced over the ranks, half of all choices are remote.
The load run trains one process for --load-steps steps with the
load-balancing loss (router_aux_loss_coef 0.02) and writes the plot.
The machine may be shared: the load average is printed with the figures.
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

HERE = os.path.dirname(os.path.abspath(__file__))


def sh(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return r


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if '"step_time"' in l]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--batch", type=int, default=4, help="rows per rank per step")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--load-steps", type=int, default=60)
    ap.add_argument("--svg", help="copy the load run's plot here")
    ap.add_argument("--load-only", action="store_true", help="only the load run")
    ap.add_argument("--workdir")
    a = ap.parse_args()
    wd = a.workdir or tempfile.mkdtemp(prefix="cllm-moe-ep-bench-")
    os.makedirs(wd, exist_ok=True)
    C, L, E, k = 256, 4, 8, 2
    model = os.path.join(wd, "model")
    if not os.path.exists(os.path.join(model, "config.json")):
        sets = ["hidden_size=%d" % C, "intermediate_size=1024", "num_hidden_layers=%d" % L,
                "num_attention_heads=8", "num_key_value_heads=4", "num_local_experts=%d" % E,
                "num_experts_per_tok=%d" % k, "vocab_size=4096", "max_position_embeddings=1024",
                "output_router_logits=true", "router_aux_loss_coef=0.02"]
        sh([a.cllm, "init", "--arch", "mixtral", "--seed", "1", "--out", model, "--set"] + sets)
    data = os.path.join(wd, "data.jsonl")
    rng = random.Random(1)
    weights = [1.0 / (i + 1) for i in range(4096)]
    n_rows = max(2 * a.batch * a.steps, a.batch * a.load_steps)
    with open(data, "w") as f:
        for _ in range(n_rows):
            f.write(json.dumps({"input_ids": rng.choices(range(4096), weights, k=a.seq)}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    mpirun = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]
    common = ["--model", model, "--data", data, "--optimizer", "adamw", "--lr", "1e-3", "--steps", str(a.steps),
              "--batch-size", str(2 * a.batch), "--micro-batch-size", str(a.batch), "--seq-len", str(a.seq),
              "--no-shuffle"]
    keys = ("step_time", "time_fwdbwd", "time_a2a", "a2a_bytes")
    res = {n: {key: [] for key in keys} for n in ("dp", "ep")}
    expect = []
    loads = []
    for rep in range(0 if a.load_only else a.reps):
        for name, P in (("dp", 1), ("ep", 2)):
            cfg = os.path.join(wd, "%s.json" % name)
            with open(cfg, "w") as f:
                json.dump({"moe": {"expert_parallel_size": P, "drop_tokens": False},
                           "zero_optimization": {"stage": 1}}, f)
            out = os.path.join(wd, "out-%s-%d" % (name, rep))
            sh(mpirun + [a.cllm, "train", "--config", cfg, "--out", out] + common, env=env)
            for r in records(out)[1:]:
                for key in keys:
                    res[name][key].append(r.get(key, 0.0))
                if P == 2:
                    expect.append(r["moe_choices"])
            loads.append(os.getloadavg()[0])
    if a.load_only:
        return load_run(a, wd, model, data, E)
    machine = subprocess.run([sys.executable, os.path.join(HERE, "machine.py"), "--cllm", a.cllm],
                             capture_output=True, text=True).stdout.strip()
    print(machine)
    print("2 ranks x 1 thread, %d rows x %d tokens per rank per step, %d runs x %d timed steps, load average %.1f-%.1f"
          % (a.batch, a.seq, a.reps, a.steps - 1, min(loads), max(loads)))
    print()
    print("| layout | step | forward+backward | all-to-all time (rank 0) | all-to-all bytes / step |")
    print("| --- | --- | --- | --- | --- |")
    med = {}
    for name, label in (("dp", "every expert on both ranks (EP 1)"), ("ep", "expert_parallel_size 2")):
        m = {key: statistics.median(res[name][key]) for key in keys}
        med[name] = m
        print("| %s | %.3f s | %.3f s | %.3f s | %.2f MB |" % (label, m["step_time"], m["time_fwdbwd"], m["time_a2a"],
                                                               m["a2a_bytes"] / 1e6))
    print()
    choices = statistics.median(expect)  # all ranks' routed choices, every block
    half = choices / 2 * C * 4 * 4  # balanced: half of the choices are remote, 4 trips of C floats
    print("EP / DP step time %.2fx; all-to-all %.1f%% of the EP step; bytes %.2f MB against %.2f MB if exactly half "
          "of the %d choices went to the other rank (4 trips x %d floats)"
          % (med["ep"]["step_time"] / med["dp"]["step_time"], 100 * med["ep"]["time_a2a"] / med["ep"]["step_time"],
             med["ep"]["a2a_bytes"] / 1e6, half / 1e6, int(choices), C))
    load_run(a, wd, model, data, E)


def load_run(a, wd, model, data, E):
    out = os.path.join(wd, "load")
    shutil.rmtree(out, ignore_errors=True)
    sh([a.cllm, "train", "--model", model, "--data", data, "--out", out, "--optimizer", "adamw", "--lr", "3e-3",
        "--steps", str(a.load_steps), "--batch-size", str(a.batch), "--seq-len", str(a.seq), "--no-shuffle",
        "--log", "quiet"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    sh([a.cllm, "plot", out])
    recs = records(out)

    def imbalance(rs):
        return statistics.mean(max(r["expert_load"]) / (sum(r["expert_load"]) / E) for r in rs)
    n = max(1, len(recs) // 6)
    print("load run: %d steps, max/mean expert load %.2f over the first %d steps, %.2f over the last %d; aux_loss "
          "%.3f -> %.3f (2.0 when balanced)" % (len(recs), imbalance(recs[:n]), n, imbalance(recs[-n:]), n,
                                                recs[0]["aux_loss"], recs[-1]["aux_loss"]))
    if a.svg:
        shutil.copyfile(os.path.join(out, "plot.svg"), a.svg)
        print("plot:", a.svg)


if __name__ == "__main__":
    main()
