#!/usr/bin/python3
"""
Training-step benchmark: cllm vs PyTorch (fp32, CPU) on the same model
folder and the same token data.

  /usr/bin/python3 bench/train_step.py --cllm build/cllm [--threads 2]
      [--configs gpt2-124M:4:64,gpt2-124M:4:256,llama-100M:4:256]
      [--steps N] [--reps R] [--torch-only] [--openblas-coretype auto|NAME]

Each config is PRESET:BATCH:SEQ_LEN. For each one the driver
  1. creates the model folder with
       cllm init --arch gpt2|llama --preset PRESET --seed 1 --out DIR
     (with --torch-only: the same preset written by tests/ref/hf_models.py),
  2. writes BATCH*STEPS random-token samples of length SEQ_LEN (JSONL),
  3. runs, R times and interleaved (torch, cllm, torch, cllm, ...) because
     the CPU share of this machine fluctuates:
       - torch: the hf_models.py model loaded from DIR, forward + backward +
         torch.optim.AdamW(lr 1e-4) per step, fp32, torch.set_num_threads(T),
         in a fresh subprocess with OMP_WAIT_POLICY=PASSIVE and
         OPENBLAS_CORETYPE set (see below);
       - cllm: cllm train --model DIR --data FILE --out TMP --optimizer adamw
         --lr 1e-4 --steps N --batch-size B --seq-len T --no-shuffle with
         OMP_NUM_THREADS=T; per-step times come from TMP/metrics.jsonl
         ("step_time", seconds).
     The first step of every run is warm-up and is discarded; the figure
     reported is the median over the remaining steps of all runs.
  4. prints a markdown table: median step time, tokens/s, cllm/torch
     throughput ratio, model FLOPs per step and achieved GFLOP/s, and the
     peak RSS of each process (getrusage of the child).

Model FLOPs per step (forward + backward, no recomputation):
    6 * P_mm * B * T  +  6 * L * B * T^2 * A
where P_mm is the number of weights used in matrix products (all attention
and MLP matrices plus the LM head V x C, counted even when tied; embeddings
lookups, norms and biases excluded), L the number of layers and A the
attention width (heads * head_dim). The second term is QK^T and PV
(2 products x 2 flops per multiply-add x T^2 x A per sequence and layer,
x3 for forward + backward) over the causal half of the T x T scores.

BLAS: Debian's torch does its fp32 matmuls through the system BLAS
(libblas.so.3, chosen with update-alternatives). OPENBLAS_CORETYPE only
matters when that is OpenBLAS; with --openblas-coretype auto the driver
times an sgemm under HASWELL and SKYLAKEX and keeps the faster one when
OpenBLAS is loaded, and otherwise sets SKYLAKEX (the AVX-512 kernels, the
expected best on AVX-512 CPUs) and reports that the setting is inert. The
header of the report names the BLAS library torch actually loaded.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))

DEFAULT_CONFIGS = "gpt2-124M:4:64,gpt2-124M:4:256,llama-100M:4:256"
PY = "/usr/bin/python3"


# --------------------------------------------------------------------------
# Worker (runs in its own process so that its RSS is its own)
# --------------------------------------------------------------------------


def loaded_blas():
    """Paths of the BLAS-like libraries mapped into this process."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            if any(k in base for k in ("blas", "mkl_", "libmkl", "lapack", "blis")):
                libs.add(os.path.realpath(path))
    return sorted(libs)


def worker_torch(args):
    import torch
    import hf_models as hm
    torch.set_num_threads(args.threads)
    cfg, params = hm.load_hf_folder(args.model)
    samples = hm.read_jsonl(args.data)
    times, losses = [], []

    def hook(step, loss, dt):
        times.append(dt)
        losses.append(loss)
    hm.reference_train(cfg, params, samples, "adamw", 1e-4, args.steps, args.batch_size,
                       args.seq_len, weight_decay=0.0, grad_clip=0.0, dtype=torch.float32,
                       step_hook=hook)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"step_times": times, "losses": losses, "maxrss_kb": ru.ru_maxrss,
                      "threads": torch.get_num_threads(), "blas": loaded_blas()}))
    return 0


def worker_sgemm(args):
    """GFLOP/s of an fp32 matmul, and the BLAS in use (for the core-type probe)."""
    import torch
    torch.set_num_threads(args.threads)
    a, b = torch.randn(512, 768), torch.randn(768, 3072)
    for _ in range(2):
        a @ b
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 1.0:
        a @ b
        n += 1
    dt = (time.perf_counter() - t) / n
    print(json.dumps({"gflops": 2 * 512 * 768 * 3072 / dt / 1e9, "blas": loaded_blas()}))
    return 0


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def run_child(cmd, env):
    """Runs cmd; returns (returncode, stdout, stderr, peak RSS in KiB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), ru.ru_maxrss


def torch_env(threads, coretype):
    env = dict(os.environ)
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads),
               OPENBLAS_CORETYPE=coretype, PYTHONDONTWRITEBYTECODE="1")
    return env


def choose_coretype(requested, threads):
    if requested != "auto":
        return requested, "given"
    results = {}
    blas = []
    for ct in ("HASWELL", "SKYLAKEX"):
        rc, out, err, _ = run_child([PY, __file__, "--worker", "sgemm", "--threads", str(threads)],
                                    torch_env(threads, ct))
        if rc != 0:
            sys.exit("sgemm probe failed: %s" % err)
        r = json.loads(out.strip().splitlines()[-1])
        results[ct] = r["gflops"]
        blas = r["blas"]
    probe = ", ".join("%s %.1f GFLOP/s" % kv for kv in results.items())
    if any("openblas" in b for b in blas):
        best = max(results, key=results.get)
        return best, "fastest sgemm (%s)" % probe
    return "SKYLAKEX", ("inert: torch uses %s, not OpenBLAS (sgemm probe: %s)"
                        % (", ".join(blas) or "no shared BLAS", probe))


def preset_arch(preset):
    import hf_models as hm
    return hm.PRESETS[preset][0]


def make_model(args, preset, d):
    if os.path.exists(os.path.join(d, "config.json")):
        return
    if args.torch_only:
        import hf_models as hm
        arch, over = hm.PRESETS[preset]
        cfg = hm.make_config(arch, **over)
        hm.save_hf_folder(d, cfg, hm.init_params(cfg, seed=1, std=0.02))
        return
    cmd = [args.cllm, "init", "--arch", preset_arch(preset), "--preset", preset, "--seed", "1",
           "--out", d]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))


def make_data(path, vocab, n, T, seed):
    import random
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(T)]}) + "\n")


def run_torch(args, d, data, B, T, coretype):
    cmd = [PY, __file__, "--worker", "torch", "--model", d, "--data", data, "--steps", str(args.steps),
           "--batch-size", str(B), "--seq-len", str(T), "--threads", str(args.threads)]
    rc, out, err, rss = run_child(cmd, torch_env(args.threads, coretype))
    if rc != 0:
        sys.exit("torch worker failed (%d): %s" % (rc, err.strip()[-2000:]))
    r = json.loads(out.strip().splitlines()[-1])
    r["rss_kb"] = rss
    return r


def run_cllm(args, d, data, B, T, workdir):
    out = os.path.join(workdir, "cllm-out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [args.cllm, "train", "--model", d, "--data", data, "--out", out, "--optimizer", "adamw",
           "--lr", "1e-4", "--steps", str(args.steps), "--batch-size", str(B), "--seq-len", str(T),
           "--no-shuffle"]
    rc, _, err, rss = run_child(cmd, env)
    if rc != 0:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), rc, err.strip()[-2000:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f if l.strip()]
    shutil.rmtree(out, ignore_errors=True)
    # cllm measures a large fp32 GEMM at start-up and reports each step's
    # model FLOP rate as a fraction of it (mfu): peak = gflops / mfu
    peaks = [float(x["gflops"]) / float(x["mfu"]) for x in m if x.get("mfu")]
    return {"step_times": [float(x["step_time"]) for x in m],
            "losses": [float(x["loss"]) for x in m], "rss_kb": rss,
            "peak": statistics.median(peaks) if peaks else None}


def summarize(runs):
    times = [t for r in runs for t in r["step_times"][1:]]
    peaks = [r["peak"] for r in runs if r.get("peak")]
    return {"median": statistics.median(times), "n": len(times),
            "min": min(times), "max": max(times),
            "peak": statistics.median(peaks) if peaks else None,
            "rss_mib": max(r["rss_kb"] for r in runs) / 1024.0,
            "loss": (runs[0]["losses"][0], runs[0]["losses"][-1])}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is warm-up")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch-only", action="store_true")
    ap.add_argument("--openblas-coretype", default="auto")
    ap.add_argument("--workdir", help="keep models and data here (default: a temporary dir)")
    # Internal: the measured processes.
    ap.add_argument("--worker", choices=["torch", "sgemm"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "torch":
        return worker_torch(args)
    if args.worker == "sgemm":
        return worker_sgemm(args)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is discarded)")

    import hf_models as hm
    if not args.torch_only:
        args.cllm = os.path.abspath(args.cllm)
        if not os.access(args.cllm, os.X_OK):
            ap.error("no executable at %s (use --torch-only to time torch alone)" % args.cllm)
    configs = []
    for spec in args.configs.split(","):
        preset, B, T = spec.strip().split(":")
        if preset not in hm.PRESETS:
            ap.error("unknown preset %r (known: %s)" % (preset, ", ".join(sorted(hm.PRESETS))))
        configs.append((preset, int(B), int(T)))

    coretype, why = choose_coretype(args.openblas_coretype, args.threads)
    workdir = args.workdir or tempfile.mkdtemp(prefix="cllm-bench-")
    os.makedirs(workdir, exist_ok=True)
    print("# train_step benchmark")
    print()
    print("- CPU: %s, %d logical CPUs visible; threads: %d" % (cpu_model(), os.cpu_count(), args.threads))
    print("- torch env: OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS=%d, OPENBLAS_CORETYPE=%s (%s)"
          % (args.threads, coretype, why))
    print("- cllm env: OMP_NUM_THREADS=%d" % args.threads)
    print("- steps per run: %d (first discarded), runs per impl: %d, interleaved" % (args.steps, args.reps))
    sys.stdout.flush()

    rows = []
    try:
        for preset, B, T in configs:
            d = os.path.join(workdir, preset)
            make_model(args, preset, d)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            hm.validate_config(cfg)
            data = os.path.join(workdir, "%s-%d-%d.jsonl" % (preset, B, T))
            make_data(data, cfg["vocab_size"], B * args.steps, T, seed=1)
            torch_runs, cllm_runs = [], []
            for rep in range(args.reps):
                t0 = time.time()
                torch_runs.append(run_torch(args, d, data, B, T, coretype))
                print("  %s B=%d T=%d rep %d torch: steps %s (%.0fs)"
                      % (preset, B, T, rep + 1, ["%.2f" % x for x in torch_runs[-1]["step_times"]],
                         time.time() - t0), file=sys.stderr)
                if not args.torch_only:
                    t0 = time.time()
                    cllm_runs.append(run_cllm(args, d, data, B, T, workdir))
                    print("  %s B=%d T=%d rep %d cllm:  steps %s (%.0fs)"
                          % (preset, B, T, rep + 1, ["%.3f" % x for x in cllm_runs[-1]["step_times"]],
                             time.time() - t0), file=sys.stderr)
            flops = hm.train_step_flops(cfg, B, T)
            rows.append((preset, B, T, flops, summarize(torch_runs),
                         summarize(cllm_runs) if cllm_runs else None, torch_runs[0]["blas"]))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print("| config | impl | median step (s) | min..max (s) | tokens/s | cllm/torch | GFLOP/step | GFLOP/s | of matmul peak | peak RSS (MiB) | loss first..last |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for preset, B, T, flops, ts, cs, blas in rows:
        name = "%s B=%d T=%d" % (preset, B, T)
        for impl, s in (("torch", ts), ("cllm", cs)):
            if s is None:
                continue
            tps = B * T / s["median"]
            ratio = "%.2fx" % (ts["median"] / s["median"]) if impl == "cllm" else ""
            peak = cs["peak"] if cs else None
            frac = "%.0f%% of %.0f" % (100 * flops / s["median"] / 1e9 / peak, peak) if peak else ""
            print("| %s | %s | %.3f | %.3f..%.3f | %.0f | %s | %.1f | %.1f | %s | %.0f | %.4f..%.4f |"
                  % (name, impl, s["median"], s["min"], s["max"], tps, ratio, flops / 1e9,
                     flops / s["median"] / 1e9, frac, s["rss_mib"], s["loss"][0], s["loss"][1]))
    print()
    print("cllm/torch = torch median step time / cllm median step time (throughput ratio, >1 means cllm is faster).")
    print("FLOPs per step = 6*P_mm*B*T + 6*L*B*T^2*A (see the script's docstring).")
    print("of matmul peak: achieved GFLOP/s over the fp32 GEMM peak cllm measures at start-up (same threads, same run).")
    print("torch BLAS: %s" % ", ".join(rows[0][6]) if rows else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
