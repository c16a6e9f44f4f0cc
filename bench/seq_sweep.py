#!/usr/bin/python3
"""
Training against the sequence length: tokens/s, MFU and peak memory of one
fp32 training step from T = 256 to T = 8192, cllm against PyTorch.

  /usr/bin/python3 bench/seq_sweep.py --cllm build/cllm [--threads 2]
      [--preset small] [--lengths 256,512,1024,2048,4096,8192]
      [--batch 1] [--steps 3] [--reps 2] [--torch-mem-gib G]
      [--svg docs/seq_sweep.svg] [--quick]

For each length T the driver runs, --reps times and interleaved (torch,
cllm, torch, cllm), one training run of --steps steps at batch --batch
(the first step is warm-up and discarded) on a LLaMA model made with

    cllm init --arch llama --preset PRESET --seed 1
              --set max_position_embeddings=<largest T>

and random tokens. Each side is the one bench/train_step.py times (same
worker, same environment): cllm train with AdamW, and the reference PyTorch
model of tests/ref/hf_models.py, whose attention materialises the T x T
scores as HF's eager attention does. cllm's attention is tiled, so its
memory grows linearly in T; the reference's grows with T^2.

PyTorch runs under an address-space limit (--torch-mem-gib, default 60% of
MemAvailable): a length it cannot fit ends with a MemoryError, which the
table reports as "out of memory at G GiB" instead of letting the machine
swap; longer lengths are then skipped for it.

Per length and side the table gives the median step time, tokens/s, the
achieved model GFLOP/s, MFU (against the fp32 GEMM peak cllm measures at
start-up of a first, untimed run), the peak RSS of the process, and for cllm the
peak `cllm estimate` predicts for the same run. --svg writes a plot of
tokens/s and peak memory against T (log-log).

Model FLOPs per step: as train_step.py, 6*P_mm*B*T + 6*L*B*T^2*A.
--quick: the tiny preset, T = 64..256, one rep (a smoke test of the driver).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
sys.path.insert(0, HERE)

import train_step as ts  # noqa: E402

PY = "/usr/bin/python3"


def mem_available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 8.0


def limited(gib):
    """preexec_fn: caps the child's address space at gib GiB."""
    cap = int(gib * (1 << 30))

    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return set_limit


def run_torch(a, d, data, T, coretype):
    cmd = [PY, ts.__file__, "--worker", "torch", "--model", d, "--data", data, "--steps", str(a.steps),
           "--batch-size", str(a.batch), "--seq-len", str(T), "--threads", str(a.threads),
           "--autocast", "none"]
    rc, o, e, rss = ts.run_child(cmd, ts.torch_env(a.threads, coretype), preexec_fn=limited(a.torch_mem_gib))
    if rc != 0:
        if "MemoryError" in e or "alloc" in e.lower() or "memory" in e.lower():
            return {"oom": "out of memory at %.0f GiB" % a.torch_mem_gib}
        sys.exit("torch worker failed at T=%d, %s\n%s" % (T, ts.exit_reason(rc, e), e.strip()[-2000:]))
    r = json.loads(o.strip().splitlines()[-1])
    r["rss_kb"] = rss
    return r


def run_cllm(a, d, data, T, workdir, peak=None):
    """One cllm train run. With peak (GFLOP/s) the start-up GEMM probe is
    skipped (--peak-gflops), so that the peak RSS is the run's own."""
    out = os.path.join(workdir, "cllm-out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.cllm, "train", "--model", d, "--data", data, "--out", out, "--optimizer", "adamw", "--lr", "1e-4",
           "--steps", str(a.steps), "--batch-size", str(a.batch), "--seq-len", str(T), "--no-shuffle"]
    if peak:
        cmd += ["--peak-gflops", "%.3f" % peak]
    rc, _, err, rss = ts.run_child(cmd, env)
    if rc != 0:
        sys.exit("%s failed, %s\n%s" % (" ".join(cmd), ts.exit_reason(rc, err), err.strip()[-2000:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f if l.strip()]
    shutil.rmtree(out, ignore_errors=True)
    peaks = [float(x["gflops"]) / float(x["mfu"]) for x in m if x.get("mfu")]
    return {"step_times": [float(x["step_time"]) for x in m], "losses": [float(x["loss"]) for x in m],
            "rss_kb": rss, "peak": statistics.median(peaks) if peaks else None}


def estimate_mib(a, d, T):
    """The peak `cllm estimate` predicts for the same run, in MiB (its
    "total" line is in MB of 10^6 bytes)."""
    r = subprocess.run([a.cllm, "estimate", "--model", d, "--micro-batch", str(a.batch), "--seq-len", str(T),
                        "--threads", str(a.threads)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "total" and f[2] == "MB":
            return float(f[1]) * 1e6 / (1 << 20)
    return None


def svg_plot(rows, path, title):
    """Two log-log panels (tokens/s, peak RSS) against T; one line per side."""
    W, H, L, R, PH, GAP = 760, 700, 90, 30, 260, 90
    colors = {"cllm": "#1f77b4", "torch": "#d62728", "cllm estimate": "#1f77b4"}
    Ts = sorted({r["T"] for r in rows})
    import math
    lx0, lx1 = math.log2(Ts[0]), math.log2(Ts[-1]) if Ts[-1] > Ts[0] else math.log2(Ts[0]) + 1

    def xpos(T):
        return L + (math.log2(T) - lx0) / (lx1 - lx0) * (W - L - R)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
           'font-family="sans-serif">' % (W, H, W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>' % (W // 2, title)]
    panels = [("tokens/s", "tps"), ("peak RSS (MiB)", "rss")]
    for i, (label, key) in enumerate(panels):
        top = 50 + i * (PH + GAP)
        series = {}
        for r in rows:
            if r.get(key):
                series.setdefault(r["side"], []).append((r["T"], r[key]))
            if key == "rss" and r.get("est"):
                series.setdefault("cllm estimate", []).append((r["T"], r["est"]))
        vals = [v for s in series.values() for _, v in s]
        if not vals:
            continue
        ly0 = math.floor(math.log10(min(vals)))
        ly1 = math.ceil(math.log10(max(vals)))
        if ly1 == ly0:
            ly1 += 1

        def ypos(v):
            return top + PH - (math.log10(v) - ly0) / (ly1 - ly0) * PH
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                   % (L, top, W - L - R, PH))
        out.append('<text x="20" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 20 %d)">%s</text>'
                   % (top + PH // 2, top + PH // 2, label))
        for T in Ts:
            x = xpos(T)
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, top, x, top + PH))
            out.append('<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%d</text>' % (x, top + PH + 15, T))
        for e in range(ly0, ly1 + 1):
            y = ypos(10 ** e)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y, W - R, y))
            out.append('<text x="%d" y="%.1f" font-size="11" text-anchor="end">%g</text>' % (L - 5, y + 4, 10 ** e))
        out.append('<text x="%d" y="%d" font-size="12" text-anchor="middle">sequence length T</text>'
                   % ((L + W - R) // 2, top + PH + 32))
        for j, (side, pts) in enumerate(sorted(series.items())):
            pts.sort()
            dash = ' stroke-dasharray="5,4"' if side == "cllm estimate" else ""
            c = colors.get(side, "#2ca02c")
            out.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>'
                       % (c, dash, " ".join("%.1f,%.1f" % (xpos(t), ypos(v)) for t, v in pts)))
            for t, v in pts:
                out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (xpos(t), ypos(v), c))
            ly = top + 18 + 18 * j
            out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                       '<text x="%d" y="%d" font-size="12">%s</text>'
                       % (L + 12, ly, L + 32, ly, c, dash, L + 38, ly + 4, side))
    out.append("</svg>")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="steps per run; the first is warm-up")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--torch-mem-gib", type=float, default=None)
    ap.add_argument("--openblas-coretype", default="auto")
    ap.add_argument("--svg")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.preset, a.lengths, a.reps, a.steps = "tiny", "64,128,256", 1, 2
    if a.steps < 2:
        ap.error("--steps must be at least 2 (the first step is discarded)")
    lengths = sorted(int(x) for x in a.lengths.split(","))
    if a.torch_mem_gib is None:
        a.torch_mem_gib = round(0.6 * mem_available_gib(), 1)
    a.cllm = os.path.abspath(a.cllm)
    if not os.access(a.cllm, os.X_OK):
        ap.error("no executable at %s" % a.cllm)

    import hf_models as hm
    import machine
    coretype, why = ts.choose_coretype(a.openblas_coretype, a.threads)
    workdir = tempfile.mkdtemp(prefix="cllm-seq-sweep-")
    print("# seq_sweep benchmark")
    print()
    print("- %s" % machine.header(a.cllm))
    print("- llama preset %s, batch %d, threads %d, %d steps per run (first discarded), %d interleaved runs per side"
          % (a.preset, a.batch, a.threads, a.steps, a.reps))
    print("- torch env: OMP_WAIT_POLICY=PASSIVE, OPENBLAS_CORETYPE=%s (%s); address space capped at %.1f GiB"
          % (coretype, why, a.torch_mem_gib))
    sys.stdout.flush()
    rows = []
    try:
        d = os.path.join(workdir, "model")
        r = subprocess.run([a.cllm, "init", "--arch", "llama", "--preset", a.preset, "--seed", "1",
                            "--set", "max_position_embeddings=%d" % max(lengths), "--out", d],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit("cllm init failed: %s" % r.stderr.strip())
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        # the fp32 GEMM peak, measured once by cllm's start-up probe; the timed
        # runs are then given it, so their peak RSS leaves the probe out
        data = os.path.join(workdir, "probe.jsonl")
        ts.make_data(data, cfg["vocab_size"], a.batch * 2, lengths[0], seed=1)
        steps, a.steps = a.steps, 2
        fp32_peak = run_cllm(a, d, data, lengths[0], workdir)["peak"]
        a.steps = steps
        print("- cllm fp32 GEMM peak (start-up probe): %.1f GFLOP/s" % fp32_peak)
        sys.stdout.flush()
        torch_out = None
        for T in lengths:
            data = os.path.join(workdir, "data-%d.jsonl" % T)
            ts.make_data(data, cfg["vocab_size"], a.batch * a.steps, T, seed=1)
            runs = {"torch": [], "cllm": []}
            for rep in range(a.reps):
                for side in ("torch", "cllm"):
                    if side == "torch" and torch_out:
                        continue
                    t0 = time.time()
                    res = run_torch(a, d, data, T, coretype) if side == "torch" else run_cllm(a, d, data, T, workdir, fp32_peak)
                    if "oom" in res:
                        torch_out = (T, res["oom"])
                        print("  T=%d torch: %s" % (T, res["oom"]), file=sys.stderr)
                        continue
                    runs[side].append(res)
                    print("  T=%d rep %d %s: steps %s (%.0fs, load %.2f)"
                          % (T, rep + 1, side, ["%.3f" % x for x in res["step_times"]], time.time() - t0,
                             os.getloadavg()[0]), file=sys.stderr)
            flops = hm.train_step_flops(cfg, a.batch, T)
            est = estimate_mib(a, d, T)
            for side, rs in runs.items():
                if not rs:
                    rows.append({"T": T, "side": side, "skipped": torch_out[1] if torch_out else "not run"})
                    continue
                s = ts.summarize(rs)
                rows.append({"T": T, "side": side, "step": s["median"], "tps": a.batch * T / s["median"],
                             "gflops": flops / s["median"] / 1e9, "peak": s["peak"], "rss": s["rss_mib"],
                             "est": est if side == "cllm" else None, "flops": flops})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print("| T | side | median step (s) | tokens/s | cllm/torch | GFLOP/s | MFU | peak RSS (MiB) | cllm estimate (MiB) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    by = {(r["T"], r["side"]): r for r in rows}
    for r in rows:
        if "skipped" in r:
            print("| %d | %s | %s | | | | | | |" % (r["T"], r["side"], r["skipped"]))
            continue
        t = by.get((r["T"], "torch"), {})
        ratio = "%.2fx" % (t["step"] / r["step"]) if r["side"] == "cllm" and t.get("step") else ""
        mfu = "%.0f%%" % (100 * r["gflops"] / fp32_peak) if fp32_peak else ""
        print("| %d | %s | %.3f | %.0f | %s | %.1f | %s | %.0f | %s |"
              % (r["T"], r["side"], r["step"], r["tps"], ratio, r["gflops"], mfu, r["rss"],
                 "%.0f" % r["est"] if r.get("est") else ""))
    print()
    print("MFU: achieved model GFLOP/s over the fp32 GEMM peak cllm measured at start-up (%.0f GFLOP/s, median)."
          % (fp32_peak or 0))
    print("load average at the end: %.2f" % os.getloadavg()[0])
    if a.svg:
        svg_plot([r for r in rows if "skipped" not in r], a.svg,
                 "llama %s, batch %d, %d threads: one fp32 training step" % (a.preset, a.batch, a.threads))
        print("plot: %s" % a.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
