#!/usr/bin/python3
"""
Decode speed per weight format: `cllm generate --weights fp32|bf16|int8|q4` against a
PyTorch KV-cache greedy loop in fp32 and bf16 on the same weights, and each format's
fraction of the memory-bandwidth bound.

  /usr/bin/python3 bench/decode_bench.py [--cllm build/cllm] [--threads 2] [--rounds 3] [--quick]

Model: gpt2-124M from `cllm init --preset gpt2-124M --seed 1` with the GPT-2 tokenizer
(--quick: the tiny preset). Batch 1: one greedy sequence of --new-tokens tokens after a
--prompt-tokens prompt (ids), --ignore-eos; cllm's decode tokens/s is the one `cllm
generate` reports (decode time after the prompt), torch's is (tokens - 1) / (last - first
token time) of bench/serve_bench.py's TorchGPT2 loop (fp32, and bf16 with every weight
and the cache in bfloat16). Both sides get --threads threads (OMP_NUM_THREADS, and
torch.set_num_threads in this process) and OMP_WAIT_POLICY=PASSIVE (set by serve_bench
before torch loads; with spinning OpenMP threads every figure collapses on a loaded machine). Rounds are interleaved (each format and each torch
dtype once per round); medians.

The bound: the best read bandwidth of bench/membw.c and a torch read loop over the
rounds divided by the bytes of the matrices a decode step reads in that format (linear
weights, the tied embedding once as the head; `cllm serve` logs the same figure at
start-up) plus the fp32 rest (norms, biases, the position embedding row is not counted).
The load average is printed with the figures: on a shared machine they are noisy.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_bench as sb  # noqa: E402
import torch  # noqa: E402

FORMATS = ("fp32", "bf16", "int8", "q4")


def matrix_bytes(tm, fmt):
    """Bytes of the matrices one decode step reads in `fmt` (cllm_model_weight_bytes)."""
    per = {"fp32": 4.0, "bf16": 2.0, "int8": 34 / 32, "q4": 18 / 32}[fmt]
    n = 0
    for name, t in tm.p.items():
        if t.dim() == 2 and "wpe" not in name:
            rows, cols = (t.shape[1], t.shape[0]) if "wte" not in name and "lm_head" not in name else t.shape
            n += rows * ((cols + 31) // 32 * 32 if fmt in ("int8", "q4") else cols) * per
    return n


def to_bf16(tm):
    tm.p = {k: v.to(torch.bfloat16) for k, v in tm.p.items()}
    tm.wte = tm.p["transformer.wte.weight"]
    tm.head = tm.p.get("lm_head.weight", tm.wte)
    tm.layers = [[t.to(torch.bfloat16) for t in layer] for layer in tm.layers]
    tm.cache = tm.cache.to(torch.bfloat16)
    return tm


def cllm_decode(a, model, fmt, prompt_ids):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run([a.cllm, "generate", "--model", model, "--weights", fmt, "--prompt-ids",
                        ",".join(map(str, prompt_ids)), "--greedy", "--ignore-eos", "--max-new-tokens",
                        str(a.new_tokens), "--output", "ids"], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit("cllm generate --weights %s failed: %s" % (fmt, r.stderr[-500:]))
    m = re.search(r"decode ([0-9.]+) s \(([0-9.]+) tok/s\)", r.stderr)
    return float(m.group(2)), [int(t) for t in r.stdout.split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default=os.path.join(sb.REPO, "build", "cllm"))
    ap.add_argument("--fixtures", default=os.path.join(sb.REPO, "..", "shared", "fixtures"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--bw-mib", type=int, default=512)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(sb.machine.header(a.cllm) if hasattr(sb, "machine") else "", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = sb.make_model(a.cllm, sb.find_tokenizer_dir(a.fixtures), os.path.join(tmp, "m"), a.quick)
        t32 = sb.TorchGPT2(model)
        t16 = to_bf16(sb.TorchGPT2(model))
        prompt = [(i * 7919 + 11) % 50000 for i in range(a.prompt_tokens)]
        membw = sb.build_membw(tmp)
        rest = sum(t.numel() * 4 for n, t in t32.p.items() if t.dim() == 1)
        wbytes = {f: matrix_bytes(t32, f) + rest for f in FORMATS}
        speed = {k: [] for k in list(FORMATS) + ["torch-fp32", "torch-bf16"]}
        bw_best = 0.0
        loads = []
        ids = {}
        for rnd in range(a.rounds):
            loads.append(os.getloadavg()[0])
            bw = sb.bandwidth(a.bw_mib, a.threads, membw)
            bw_best = max([bw_best] + [v[0] for v in bw.values()])
            for f in FORMATS:
                tps, got = cllm_decode(a, model, f, prompt)
                speed[f].append(tps)
                ids[f] = got
            for name, tm in (("torch-fp32", t32), ("torch-bf16", t16)):
                _, times, got = tm.greedy(prompt, a.new_tokens)
                speed[name].append((len(times) - 1) / (times[-1] - times[0]))
                ids[name] = got
            print("round %d: %s (load %.2f)" % (rnd + 1, ", ".join("%s %.1f" % (k, v[-1]) for k, v in speed.items()),
                                                loads[-1]), flush=True)
        print("\ngpt2%s, batch 1, %d threads, %d new tokens after %d, %d rounds; read bandwidth %.1f GB/s; "
              "load average %.2f..%.2f" % ("-tiny" if a.quick else "-124M", a.threads, a.new_tokens,
                                           a.prompt_tokens, a.rounds, bw_best / 1.0, min(loads), max(loads)))
        print("| weights | decode tok/s | vs torch fp32 | vs torch bf16 | MB per token | bound tok/s | of bound |")
        print("|---|---|---|---|---|---|---|")
        tf, tb = statistics.median(speed["torch-fp32"]), statistics.median(speed["torch-bf16"])
        for f in FORMATS:
            s = statistics.median(speed[f])
            bound = bw_best * 1e9 / wbytes[f]
            print("| cllm %s | %.1f | %.2fx | %.2fx | %.1f | %.1f | %.0f%% |" % (f, s, s / tf, s / tb, wbytes[f] / 1e6,
                                                                              bound, 100 * s / bound))
        for name, s in (("torch fp32", tf), ("torch bf16", tb)):
            f = "fp32" if "32" in name else "bf16"
            bound = bw_best * 1e9 / wbytes[f]
            print("| %s | %.1f | %.2fx | %.2fx | %.1f | %.1f | %.0f%% |" % (name, s, s / tf, s / tb, wbytes[f] / 1e6,
                                                                          bound, 100 * s / bound))
        same = ids["fp32"] == ids["torch-fp32"]
        print("\ngreedy ids: cllm fp32 %s torch fp32; bf16 %s fp32" % ("==" if same else "!=",
                                                                       "==" if ids["bf16"] == ids["fp32"] else "!="))


if __name__ == "__main__":
    main()
