#!/usr/bin/python3
"""
Training-step benchmark: cllm vs PyTorch (fp32, CPU) on the same model
folder and the same token data.

  /usr/bin/python3 bench/train_step.py --cllm build/cllm [--threads 2]
      [--configs gpt2-124M:4:64,gpt2-124M:4:256,llama-100M:4:256,gpt2-124M:1:1024,llama-100M:1:1024]
      [--steps N] [--reps R] [--torch-only] [--openblas-coretype auto|NAME]
      [--precision fp32|bf16]

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
     With --precision bf16 each repetition runs four processes in turn:
     torch fp32, torch under torch.autocast("cpu", dtype=torch.bfloat16)
     (forward and backward; fp32 weights and AdamW), cllm fp32, and cllm
     with a config file {"bf16": {"enabled": true}}. cllm inherits
     OMP_WAIT_POLICY from the environment (torch always gets PASSIVE): on a
     loaded machine run the driver under OMP_WAIT_POLICY=PASSIVE so both
     wait alike, or cllm's spinning barriers dominate its step time.
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
times an sgemm under HASWELL, SKYLAKEX and ZEN, each in a child process, and
keeps the fastest when OpenBLAS is loaded (otherwise the first that ran,
and it reports that the setting is inert). A core type whose kernels the
CPU lacks (SKYLAKEX's AVX-512 on an AVX2-only CPU) kills its probe with
SIGILL: any probe that dies by a signal or fails counts as that core type
being unavailable, and the next one is tried; the bench stops only when all
fail, listing each core type with the reason. The report names the BLAS
library torch actually loaded.

Machine: the report starts with bench/machine.py's line (CPU model, cores,
the avx2/fma/avx512f/avx512_bf16/amx flags, oneDNN's effective ISA and the
GEMM kernels cllm uses), so that every figure carries the CPU it came from.

bf16 peak: a cllm bf16 run measures its bf16 GEMM rate (1024^3) at
start-up, and the bf16 rows report their model FLOP rate as a fraction of
it (MFU). The driver also times torch's bf16 matmul (oneDNN) on the MLP
shapes of the model, [B*T, C] x [C, 4C] and [B*T, 4C] x [4C, C], printed on
stderr and used only if cllm reported no peak.

bf16 on a CPU without a bf16 GEMM: when a cllm bf16 run (or torch's
autocast run) fails, e.g. because cllm has no bf16 GEMM for this CPU, its
rows are printed as "skipped" with the failing process's reason (its signal
or exit status and last stderr line), the rest of the table is measured,
and the driver exits 0.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
sys.path.insert(0, HERE)

DEFAULT_CONFIGS = "gpt2-124M:4:64,gpt2-124M:4:256,llama-100M:4:256,gpt2-124M:1:1024,llama-100M:1:1024"
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
    import contextlib
    import torch
    import hf_models as hm
    torch.set_num_threads(args.threads)
    cfg, params = hm.load_hf_folder(args.model)
    samples = hm.read_jsonl(args.data)
    times, losses = [], []

    def hook(step, loss, dt):
        times.append(dt)
        losses.append(loss)
    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast == "bf16"
           else contextlib.nullcontext())
    with ctx:
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


def worker_bf16gemm(args):
    """GFLOP/s of torch's bf16 matmul on the two MLP shapes of a model
    (M = B*T rows, C = args.batch_size holds the width): the best of both."""
    import torch
    torch.set_num_threads(args.threads)
    M, C = args.seq_len, args.batch_size
    best = 0.0
    for K, N in ((C, 4 * C), (4 * C, C)):
        a = torch.randn(M, K).bfloat16()
        b = torch.randn(K, N).bfloat16()
        for _ in range(3):
            a @ b
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 1.0:
            a @ b
            n += 1
        best = max(best, 2 * M * K * N / ((time.perf_counter() - t) / n) / 1e9)
    print(json.dumps({"gflops": best}))
    return 0


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


# A child's ru_maxrss counts the resident set its parent had when it forked
# (Linux keeps the pre-exec high-water mark), so a parent that has imported
# torch would lend every child its few hundred MiB. run_child therefore starts
# each command from this small trampoline, whose own child is measured.
TRAMPOLINE = (
    "import os,sys\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    "    try: os.execvp(sys.argv[2],sys.argv[2:])\n"
    "    finally: os._exit(127)\n"
    "_,st,ru=os.wait4(pid,0)\n"
    "open(sys.argv[1],'w').write(str(ru.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(st)%256 if os.WIFEXITED(st) else 128+os.WTERMSIG(st))\n")


def run_child(cmd, env, preexec_fn=None):
    """Runs cmd; returns (returncode, stdout, stderr, peak RSS in KiB of
    cmd's own process). A child killed by a signal returns minus the signal,
    as subprocess does."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(prefix="cllm-rss-") as rssf:
        p = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, rssf.name] + list(cmd), stdout=out, stderr=err, env=env,
                             preexec_fn=preexec_fn)
        rc = p.wait()
        if rc > 128:
            rc = -(rc - 128)
        out.seek(0)
        err.seek(0)
        txt = open(rssf.name).read().strip()
        return rc, out.read().decode(), err.read().decode(), int(txt) if txt else 0


def torch_env(threads, coretype):
    env = dict(os.environ)
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads),
               OPENBLAS_CORETYPE=coretype, PYTHONDONTWRITEBYTECODE="1")
    return env


# OpenBLAS core types the auto setting tries, in order; one whose kernels the
# CPU lacks (SKYLAKEX without AVX-512) dies with SIGILL and is skipped
CORETYPES = ("HASWELL", "SKYLAKEX", "ZEN")


def exit_reason(rc, err):
    """Why a child failed, in words: the signal that killed it, or its exit
    status and the last line it wrote on stderr."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "signal %d" % -rc
        why = "killed by %s" % name
        if -rc == signal.SIGILL:
            why += " (an instruction this CPU lacks)"
    else:
        why = "exit status %d" % rc
    last = [l for l in err.strip().splitlines() if l.strip()]
    return why + (": " + last[-1].strip()[-300:] if last else "")


def choose_coretype(requested, threads):
    """The OPENBLAS_CORETYPE torch runs with and why. auto times an sgemm
    under each of CORETYPES in a child process; a child that fails (a signal
    such as SIGILL, or an error) counts as that core type being unavailable
    and the next one is tried. Stops the bench only when every one failed."""
    if requested != "auto":
        return requested, "given"
    results, failed = {}, {}
    blas = []
    for ct in CORETYPES:
        rc, out, err, _ = run_child([PY, __file__, "--worker", "sgemm", "--threads", str(threads)],
                                    torch_env(threads, ct))
        try:
            r = json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
        except (ValueError, IndexError):
            r, err = None, "no result line in its output: %r" % out[-200:]
        if r is None:
            failed[ct] = exit_reason(rc, err)
            print("  sgemm probe OPENBLAS_CORETYPE=%s unavailable: %s" % (ct, failed[ct]), file=sys.stderr)
            continue
        results[ct] = r["gflops"]
        blas = r["blas"]
    if not results:
        sys.exit("sgemm probe failed under every OPENBLAS_CORETYPE tried:\n%s\n"
                 "hint: check that %s can import torch, or pass --openblas-coretype NAME with a core type "
                 "this CPU supports (HASWELL needs AVX2, SKYLAKEX AVX-512)"
                 % ("\n".join("  %s: %s" % kv for kv in failed.items()), PY))
    probe = ", ".join("%s %.1f GFLOP/s" % kv for kv in results.items())
    probe += "".join("; %s unavailable (%s)" % (ct, why.split(":")[0].split(" (")[0]) for ct, why in failed.items())
    if any("openblas" in b for b in blas):
        best = max(results, key=results.get)
        return best, "fastest sgemm (%s)" % probe
    first = next(iter(results))
    return first, ("inert: torch uses %s, not OpenBLAS (sgemm probe: %s)"
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


def run_torch(args, d, data, B, T, coretype, autocast="none"):
    cmd = [PY, __file__, "--worker", "torch", "--model", d, "--data", data, "--steps", str(args.steps),
           "--batch-size", str(B), "--seq-len", str(T), "--threads", str(args.threads),
           "--autocast", autocast]
    rc, out, err, rss = run_child(cmd, torch_env(args.threads, coretype))
    if rc != 0:
        if autocast != "none":
            return {"skipped": "torch %s autocast %s" % (autocast, exit_reason(rc, err))}
        sys.exit("torch worker (OPENBLAS_CORETYPE=%s) failed, %s\n%s"
                 % (coretype, exit_reason(rc, err), err.strip()[-2000:]))
    r = json.loads(out.strip().splitlines()[-1])
    r["rss_kb"] = rss
    return r


def run_cllm(args, d, data, B, T, workdir, precision="fp32"):
    out = os.path.join(workdir, "cllm-out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [args.cllm, "train", "--model", d, "--data", data, "--out", out, "--optimizer", "adamw",
           "--lr", "1e-4", "--steps", str(args.steps), "--batch-size", str(B), "--seq-len", str(T),
           "--no-shuffle"]
    if precision == "bf16":
        conf = os.path.join(workdir, "bf16.json")
        with open(conf, "w") as f:
            json.dump({"bf16": {"enabled": True}}, f)
        cmd += ["--config", conf]
    rc, _, err, rss = run_child(cmd, env)
    if rc != 0:
        if precision != "fp32":
            # e.g. no bf16 GEMM on this CPU: the row is skipped, with cllm's reason
            return {"skipped": "cllm %s %s" % (precision, exit_reason(rc, err))}
        sys.exit("%s failed, %s\n%s" % (" ".join(cmd), exit_reason(rc, err), err.strip()[-2000:]))
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


def cfg_width(cfg):
    return cfg.get("n_embd") or cfg.get("hidden_size")


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
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: also time torch bf16 autocast and cllm with bf16.enabled")
    # Internal: the measured processes.
    ap.add_argument("--worker", choices=["torch", "sgemm", "bf16gemm"], help=argparse.SUPPRESS)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "torch":
        return worker_torch(args)
    if args.worker == "sgemm":
        return worker_sgemm(args)
    if args.worker == "bf16gemm":
        return worker_bf16gemm(args)
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
    import machine
    print("- %s" % machine.header(None if args.torch_only else args.cllm))
    print("- threads: %d" % args.threads)
    print("- torch env: OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS=%d, OPENBLAS_CORETYPE=%s (%s)"
          % (args.threads, coretype, why))
    print("- cllm env: OMP_NUM_THREADS=%d" % args.threads)
    print("- steps per run: %d (first discarded), runs per impl: %d, interleaved; precision: %s"
          % (args.steps, args.reps, args.precision))
    sys.stdout.flush()

    rows = []
    skipped = {}  # impl -> why it cannot run on this machine
    try:
        for preset, B, T in configs:
            d = os.path.join(workdir, preset)
            make_model(args, preset, d)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            hm.validate_config(cfg)
            data = os.path.join(workdir, "%s-%d-%d.jsonl" % (preset, B, T))
            make_data(data, cfg["vocab_size"], B * args.steps, T, seed=1)
            impls = [("torch", "none"), ("cllm", "fp32")]
            if args.precision == "bf16":
                impls = [("torch", "none"), ("torch-bf16", "bf16"), ("cllm", "fp32"), ("cllm-bf16", "bf16")]
            if args.torch_only:
                impls = [x for x in impls if x[0].startswith("torch")]
            runs = {name: [] for name, _ in impls}
            for rep in range(args.reps):
                for name, mode in impls:
                    if name in skipped:
                        continue
                    t0 = time.time()
                    if name.startswith("torch"):
                        r = run_torch(args, d, data, B, T, coretype, mode)
                    else:
                        r = run_cllm(args, d, data, B, T, workdir, mode)
                    if "skipped" in r:
                        # a bf16 side that cannot run here (no bf16 GEMM for this CPU): its rows
                        # are skipped in every config, with the reason, and the rest goes on
                        skipped[name] = r["skipped"]
                        print("  %s: skipped, %s" % (name, r["skipped"]), file=sys.stderr)
                        continue
                    runs[name].append(r)
                    print("  %s B=%d T=%d rep %d %s: steps %s (%.0fs)"
                          % (preset, B, T, rep + 1, name, ["%.3f" % x for x in r["step_times"]],
                             time.time() - t0), file=sys.stderr)
            bf16_peak = None
            if args.precision == "bf16" and "torch-bf16" not in skipped:
                rc, out, err, _ = run_child([PY, __file__, "--worker", "bf16gemm", "--threads", str(args.threads),
                                             "--seq-len", str(B * T), "--batch-size", str(cfg_width(cfg))],
                                            torch_env(args.threads, coretype))
                if rc == 0:
                    bf16_peak = json.loads(out.strip().splitlines()[-1])["gflops"]
                    print("  torch bf16 GEMM probe: %.0f GFLOP/s" % bf16_peak, file=sys.stderr)
                else:
                    print("  torch bf16 GEMM probe failed, %s" % exit_reason(rc, err), file=sys.stderr)
            flops = hm.train_step_flops(cfg, B, T)
            res = {k: summarize(v) if v else {"skipped": skipped[k]} for k, v in runs.items()}
            rows.append((preset, B, T, flops, res, runs["torch"][0]["blas"], bf16_peak))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print("| config | impl | median step (s) | min..max (s) | tokens/s | cllm/torch | GFLOP/step | GFLOP/s | of matmul peak | peak RSS (MiB) | loss first..last |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for preset, B, T, flops, res, blas, bf16_peak in rows:
        name = "%s B=%d T=%d" % (preset, B, T)
        ts = res["torch"]
        fp32_peak = res["cllm"]["peak"] if "cllm" in res else None
        # bf16 runs of cllm measure their own bf16 GEMM peak at start-up;
        # torch's bf16 GEMM probe is the fallback (and is printed below)
        if res.get("cllm-bf16", {}).get("peak"):
            bf16_peak = res["cllm-bf16"]["peak"]
        for impl, s in res.items():
            if "skipped" in s:
                print("| %s | %s | skipped: %s | | | | | | | | |" % (name, impl, s["skipped"].replace("|", "/")))
                continue
            tps = B * T / s["median"]
            ratio = "%.2fx" % (ts["median"] / s["median"]) if impl.startswith("cllm") else ""
            peak = bf16_peak if impl.endswith("bf16") else fp32_peak
            frac = "%.0f%% of %.0f" % (100 * flops / s["median"] / 1e9 / peak, peak) if peak else ""
            print("| %s | %s | %.3f | %.3f..%.3f | %.0f | %s | %.1f | %.1f | %s | %.0f | %.4f..%.4f |"
                  % (name, impl, s["median"], s["min"], s["max"], tps, ratio, flops / 1e9,
                     flops / s["median"] / 1e9, frac, s["rss_mib"], s["loss"][0], s["loss"][1]))
        if all(k in res and "skipped" not in res[k] for k in ("cllm-bf16", "torch-bf16")):
            b = res["cllm-bf16"]["median"]
            print("| %s | cllm-bf16 speed-up | | | | %.2fx vs cllm fp32, %.2fx vs torch fp32, %.2fx vs torch bf16 autocast | | | | | |"
                  % (name, res["cllm"]["median"] / b, ts["median"] / b, res["torch-bf16"]["median"] / b))
    print()
    print("cllm/torch = torch median step time / cllm median step time (throughput ratio, >1 means cllm is faster).")
    print("FLOPs per step = 6*P_mm*B*T + 6*L*B*T^2*A (see the script's docstring).")
    print("of matmul peak: achieved GFLOP/s over the fp32 GEMM peak cllm measures at start-up (same threads, same run);")
    print("for the bf16 rows, over the bf16 GEMM peak cllm measures at start-up of its bf16 runs (1024^3, on the")
    print("bf16 gemm path the machine line names: onednn (AVX-512, AVX512-BF16, AMX) or fp32-widened).")
    for impl, why in skipped.items():
        print("skipped: %s rows, %s" % (impl, why))
    print("torch BLAS: %s" % ", ".join(rows[0][5]) if rows else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
