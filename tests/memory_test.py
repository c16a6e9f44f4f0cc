"""`cllm estimate` against the measured peak RSS of `cllm train` (label: model).

The fixed process overhead (code, libraries, OpenMP and oneDNN state) is
measured first as the peak RSS of a run on a 2-layer 64-wide model minus
that model's estimate; it is passed to every estimate with --overhead. Then,
for gpt2/llama/bloom models of ~5-7M parameters with B, T, optimizer and
checkpointing (and one bf16 run) varied, each run's peak RSS (wait4 ru_maxrss of the child)
must be within 10% of the estimate, and the activation bytes the run
reports must equal the estimate's activations + logits chunk exactly (both
come from the carving code of cllm_model_prepare). Prints the table that
docs/memory.md shows. --no-rss (sanitizer builds) keeps only the exact
activation-bytes check.
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile

OFFLOAD = {"buffer_count": 4, "buffer_size": 65536}
CONFIGS = [  # (arch, micro-batch, seq-len, optimizer, grad-ckpt, precision[, offload])
    ("gpt2", 4, 256, "adamw", False, "fp32"),
    ("gpt2", 4, 256, "adamw", True, "fp32"),
    ("llama", 2, 512, "sgd", False, "fp32"),
    ("llama", 2, 512, "adam", True, "fp32"),
    ("bloom", 8, 128, "lion", True, "fp32"),
    ("bloom", 8, 128, "adamw", False, "fp32"),
    ("llama", 8, 128, "lion", False, "fp32"),
    ("llama", 4, 256, "adamw", False, "bf16"),
    # optimizer state offloaded to a file: only its stream buffer is resident
    ("llama", 2, 512, "adamw", False, "fp32", OFFLOAD),
]
SETS = {
    "gpt2": ["n_embd=256", "n_layer=4", "n_head=4", "vocab_size=8192", "n_positions=512"],
    "llama": ["hidden_size=256", "num_hidden_layers=4", "num_attention_heads=8", "num_key_value_heads=2",
              "intermediate_size=688", "vocab_size=8192", "max_position_embeddings=512"],
    "bloom": ["hidden_size=256", "n_layer=4", "n_head=4", "vocab_size=8192"],
}
ENV = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")


def run(cllm, *args):
    p = subprocess.run([cllm, *args], capture_output=True, text=True, env=ENV, timeout=120)
    if p.returncode != 0:
        print(p.stdout, p.stderr, file=sys.stderr)
        raise SystemExit(f"cllm {' '.join(args)} failed ({p.returncode})")
    return p.stdout


def peak_rss(cllm, *args):
    p = subprocess.Popen([cllm, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        print(err, file=sys.stderr)
        raise SystemExit(f"cllm {' '.join(args)} failed")
    return ru.ru_maxrss * 1024  # kilobytes on Linux


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--no-rss", action="store_true", help="sanitizer builds: skip the peak RSS comparison")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="memory_", dir=a.build)
    data = os.path.join(d, "d.jsonl")
    r = random.Random(1)
    with open(data, "w") as f:
        for _ in range(40):
            ids = [r.randrange(3, 500) for _ in range(r.randint(6, 30))]
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")

    def train(model, out, B, T, opt, ckpt, prec="fp32", offload=None):
        conf = {}
        if offload:
            nvme = os.path.join(d, out + "_nvme")
            os.makedirs(nvme)
            conf["zero_optimization"] = {"offload_optimizer": dict(offload, device="nvme", nvme_path=nvme)}
        args = ["train", "--model", model, "--data", data, "--out", os.path.join(d, out), "--steps", "2",
                "--batch-size", str(B), "--seq-len", str(T), "--optimizer", opt, "--log", "quiet",
                "--peak-gflops", "1"] + (["--grad-ckpt"] if ckpt else [])
        if prec != "fp32":
            conf[prec] = {"enabled": True}
        if conf:
            path = os.path.join(d, out + ".json")
            with open(path, "w") as f:
                json.dump(conf, f)
            args += ["--config", path]
        rss = peak_rss(a.cllm, *args)
        with open(os.path.join(d, out, "metrics.jsonl")) as f:
            act = json.loads(f.readline())["activation_bytes"]
        return rss, act

    def estimate(model, B, T, opt, ckpt, overhead, prec="fp32", offload=None):
        args = ["estimate", "--json", "--model", model, "--micro-batch", str(B), "--seq-len", str(T),
                "--optimizer", opt, "--overhead", str(overhead), "--precision", prec] + (["--grad-ckpt"] if ckpt else [])
        if offload:
            args += ["--offload-optimizer", "--offload-buffer-count", str(offload["buffer_count"]),
                     "--offload-buffer-size", str(offload["buffer_size"])]
        return json.loads(run(a.cllm, *args))

    tiny = os.path.join(d, "tiny")
    run(a.cllm, "init", "--arch", "gpt2", "--out", tiny)
    base_rss, _ = train(tiny, "o_tiny", 1, 8, "adamw", False)
    overhead = max(0, base_rss - estimate(tiny, 1, 8, "adamw", False, 0)["total"])
    print(f"process overhead: {base_rss / 1e6:.1f} MB peak RSS on the tiny model, {overhead / 1e6:.1f} MB beyond "
          "its estimate")
    fails = []
    print("| model | B x T | optimizer | grad-ckpt | precision | estimate MB | measured MB | error |")
    print("|---|---|---|---|---|---|---|---|")
    for arch in SETS:
        run(a.cllm, "init", "--arch", arch, "--out", os.path.join(d, arch), "--seed", "1", "--set", *SETS[arch])
    for i, (arch, B, T, opt, ckpt, prec, *rest) in enumerate(CONFIGS):
        model = os.path.join(d, arch)
        off = rest[0] if rest else None
        if off and a.no_rss:
            continue  # only RSS tells the offload apart; tests/offload_test.py covers it under sanitizers
        e = estimate(model, B, T, opt, ckpt, overhead, prec, off)
        rss, act = train(model, f"o{i}", B, T, opt, ckpt, prec, off)
        err = (e["total"] - rss) / rss
        if off:
            opt += " offload"
        print(f"| {arch} {e['n_params'] / 1e6:.1f}M | {B} x {T} | {opt} | {'on' if ckpt else 'off'} | {prec} | "
              f"{e['total'] / 1e6:.1f} | {rss / 1e6:.1f} | {100 * err:+.1f}% |")
        if abs(err) > 0.10 and not a.no_rss:
            fails.append(f"{arch} B={B} T={T} {opt} ckpt={ckpt} {prec}: estimate {e['total']} vs peak RSS {rss}")
        if act != e["activations"] + e["logits"]:
            fails.append(f"{arch} B={B} T={T}: run reports {act} activation bytes, estimate {e['activations'] + e['logits']}")
    for f in fails:
        print("FAIL:", f, file=sys.stderr)
    if fails:
        sys.exit(1)
    shutil.rmtree(d, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
