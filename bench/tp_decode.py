#!/usr/bin/env python3
"""Tensor-parallel decode on one host: `mpirun -np 2 cllm generate --tensor 2`
(2 ranks x 1 OpenMP thread, each rank holding half the weights) against one
process with 2 threads and one process with 1 thread, same model, same
prompt, greedy, --ignore-eos; the 2 ranks run twice: as `--tensor` runs
them by default (a rank waiting in a collective yields its core, OpenMPI's
mpi_yield_when_idle), and with `--mca mpi_yield_when_idle 0` (it polls,
OpenMPI's own default), which matters when other processes share the
cores.

    /usr/bin/python3 bench/tp_decode.py [--cllm build/cllm] [--models gpt2-124M,llama-100M]
                                        [--rounds 3] [--new 64] [--prompt 16]

Runs are interleaved (A B C A B C ...) because this machine's CPU share
drifts; each run's decode tokens/s is the one `cllm generate` reports
(single-token forwards over their time); the table gives medians and the
ratio of the 2-rank median to each one-process median. The first line is
bench/machine.py's; the load average is printed before and after. The
greedy tokens of every run are checked to be the same.
"""
import argparse, os, re, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run(cmd, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    m = re.search(r"decode [0-9.]+ s \(([0-9.]+) tok/s\)", p.stderr)
    if not m:
        raise SystemExit("no decode speed in:\n" + p.stderr[-2000:])
    return float(m.group(1)), p.stdout.split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--models", default="gpt2-124M,llama-100M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=16)
    a = ap.parse_args()
    cllm = os.path.realpath(a.cllm)
    print(machine.header(cllm), flush=True)
    print("load before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.models.split(","):
            arch = preset.split("-")[0]
            d = os.path.join(tmp, preset)
            subprocess.run([cllm, "init", "--arch", arch, "--preset", preset, "--seed", "1", "--out", d],
                           check=True, capture_output=True)
            ids = ",".join(str(5 + 7 * i) for i in range(a.prompt))
            gen = ["generate", "--model", d, "--prompt-ids", ids, "--max-new-tokens", str(a.new), "--greedy",
                   "--ignore-eos", "--output", "ids"]
            tp = ["-np", "2", cllm] + gen + ["--tensor", "2"]
            kinds = [("1 process x 2 threads", [cllm] + gen, 2), ("1 process x 1 thread", [cllm] + gen, 1),
                     ("2 ranks x 1 thread (--tensor 2)", MPIRUN + tp, 1),
                     ("2 ranks, polling", MPIRUN + ["--mca", "mpi_yield_when_idle", "0"] + tp, 1)]
            speeds = {k: [] for k, _, _ in kinds}
            tokens = set()
            for r in range(a.rounds):
                for k, cmd, th in kinds:
                    s, toks = run(cmd, th)
                    speeds[k].append(s)
                    tokens.add(tuple(toks))
                    print(f"{preset} round {r + 1}: {k}: {s:.1f} tok/s", flush=True)
            if len(tokens) != 1:
                raise SystemExit(f"{preset}: the runs generated different tokens")
            med = {k: statistics.median(v) for k, v in speeds.items()}
            rows.append((preset, med))
    print("load after: %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("| model | 1 process x 2 threads | 1 process x 1 thread | 2 ranks x 1 thread | 2 ranks, polling | "
          "2 ranks / 1x2 | 2 ranks / 1x1 |")
    print("|---|---|---|---|---|---|---|")
    for preset, med in rows:
        one2, one1 = med["1 process x 2 threads"], med["1 process x 1 thread"]
        two, tpoll = med["2 ranks x 1 thread (--tensor 2)"], med["2 ranks, polling"]
        print(f"| {preset} | {one2:.1f} tok/s | {one1:.1f} tok/s | {two:.1f} tok/s | {tpoll:.1f} tok/s | "
              f"{two / one2:.2f}x | {two / one1:.2f}x |")


if __name__ == "__main__":
    main()
