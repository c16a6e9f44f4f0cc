#!/usr/bin/python3
"""
Pipeline bubble and stage memory: GPipe vs 1F1B at several micro-batch
counts, measured against the (K-1)/(M+K-1) theory.

  /usr/bin/python3 bench/pipe_bubble.py [--cllm build/cllm] [--stages 2]
      [--micro 2,4,8] [--steps 4] [--reps 2] [--preset small] [--seq 128]

For each schedule and micro-batch count M the driver runs
    mpirun -np K cllm train  (model_topo.process_topology pipe = K,
                              train_batch_size = M, micro-batch 1)
with one thread per rank, interleaving the schedules (gpipe, 1f1b, gpipe,
...) because this machine's CPU share fluctuates, and reads from cllm's
end-of-run report each stage's compute time and the time it waited for its
neighbours. The bubble of a run is the waiting time over the total, averaged
over the stages; the table shows the median over repetitions next to the
theory for equal stage times, and the stage inputs each schedule keeps for
micro-batches in flight (GPipe M, 1F1B K - s on stage s).

Stage times are not equal here: the first stages recompute their forward
before each backward, the last stage runs forward and backward fused, so
the theory is a guide, not an exact prediction.

The report starts with bench/machine.py's line (CPU model, cores, ISA
flags, oneDNN's effective ISA, cllm's GEMM kernels).
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", default="2,4,8")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    a.cllm = os.path.abspath(a.cllm)
    if not os.access(a.cllm, os.X_OK):
        ap.error(f"no executable at {a.cllm} (build it, or pass --cllm)")
    print(machine.header(a.cllm), flush=True)
    K = a.stages
    tmp = tempfile.mkdtemp(prefix="pipe_bubble_")
    model = os.path.join(tmp, "model")
    run([a.cllm, "init", "--arch", "llama", "--preset", a.preset, "--set", f"num_hidden_layers={2 * K}",
         "--seed", "1", "--out", model])
    data = os.path.join(tmp, "data.jsonl")
    with open(data, "w") as f:
        for i in range(512):
            f.write(json.dumps({"input_ids": [(i * 7 + j * 13) % 2000 + 3 for j in range(a.seq)]}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    results = {}
    micros = [int(x) for x in a.micro.split(",")]
    for rep in range(a.reps):
        for M in micros:
            for sched in ("gpipe", "1f1b"):
                cfg = {"model": model, "data": {"train": data, "seq_len": a.seq}, "train_batch_size": M,
                       "train_micro_batch_size_per_gpu": 1, "train_iters": a.steps, "log": "plain",
                       "peak_gflops": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                       "model_topo": {"process_topology": {"axis": ["pipe"], "dims": [K]}, "schedule": sched,
                                      "parts": "uniform"}}
                path = os.path.join(tmp, f"{sched}_{M}.json")
                with open(path, "w") as f:
                    json.dump(cfg, f)
                p = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(K),
                         a.cllm, "train", "--config", path, "--out", os.path.join(tmp, f"out_{sched}_{M}")], env)
                busy = [float(x) for x in re.findall(r"stage computed ([0-9.]+) s", p.stderr)]
                wait = [float(x) for x in re.findall(r"waited ([0-9.]+) s", p.stderr)]
                held = [float(x) for x in re.findall(r"holding ([0-9.]+) MB", p.stderr)]
                frac = statistics.mean(w / (b + w) for b, w in zip(busy, wait))
                r = results.setdefault((sched, M), {"bubble": [], "held": held})
                r["bubble"].append(frac)
                print(f"rep {rep} {sched} M={M}: bubble {100 * frac:.1f}%", file=sys.stderr)
    print(f"\n{K} stages, llama preset '{a.preset}' with {2 * K} blocks, seq {a.seq}, micro-batch 1, 1 thread per rank\n")
    print("| schedule | M | measured bubble (median) | theory (K-1)/(M+K-1) | stage inputs held per stage (MB) |")
    print("| --- | --- | --- | --- | --- |")
    for M in micros:
        for sched in ("gpipe", "1f1b"):
            r = results[(sched, M)]
            theory = (K - 1) / (M + K - 1)
            held = ", ".join(f"{h:.2f}" for h in r["held"])
            print(f"| {sched} | {M} | {100 * statistics.median(r['bubble']):.1f}% | {100 * theory:.1f}% | {held} |")


if __name__ == "__main__":
    main()
