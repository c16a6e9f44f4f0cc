#!/usr/bin/python3
"""
Decode and prefill speed per weight format: cllm against llama.cpp and PyTorch on the same
weights, interleaved in one run, with each format's fraction of the memory-bandwidth bound.

  /usr/bin/python3 bench/decode_bench.py [--cllm build/cllm] [--models gpt2-124M,llama-100M]
      [--formats fp32,bf16,int8,q4] [--threads 2] [--rounds 2] [--new-tokens 32]
      [--prefill 512] [--no-llama] [--no-torch] [--quick]

Models: `cllm init --preset P --seed 1` (gpt2-124M with the GPT-2 tokenizer, llama-100M and
`llama-1B` (a ~1.1B LLaMA shape: hidden 2048, FFN 5632, 22 layers, 32 heads, 4 key/value
heads, vocabulary 32000, set with --set) with TinyLlama's tokenizer; --quick: gpt2 tiny).
Per model and round, for each format:

- cllm: `cllm generate --weights F --greedy --ignore-eos` on a --prompt-tokens prompt (ids)
  with --new-tokens new tokens (decode tokens/s as cllm reports it: forwards after the
  prompt / their time), and on a --prefill-token prompt with one new token (its prompt
  tokens/s: the prompt's forward, logits of the last row included);
- llama.cpp: the GGUF file `cllm convert --to gguf` writes from the same folder (fp32: f32,
  bf16: f16, the other 2-byte type llama.cpp reads; int8: q8_0; q4: q4_0; the same bytes per
  weight), run by node-llama-cpp's prebuilt CPU binaries (tests/npm-llama pins the version;
  bench/llama_bench.mjs): the same prompt ids, greedy decode tokens/s over the steps after
  the first token, and the seconds to evaluate the --prefill-token prompt;
- PyTorch (Debian's python3-torch, OpenBLAS): a KV-cache loop over the same tensors in fp32
  and in bf16 (every weight and the cache bfloat16), decode tokens/s as for llama.cpp and
  the prefill prompt's forward.

Every implementation gets --threads threads (cllm: OMP_NUM_THREADS; llama.cpp: its context's
threads; torch: set_num_threads with OMP_WAIT_POLICY=PASSIVE, its best setting on a shared
machine). The order of the implementations rotates from round to round (A B, B A); medians.

The bound: the best read bandwidth of bench/membw.c and a torch read loop, measured at the
start of every round, divided by the bytes a decode step reads in that format (every linear
layer's matrix and the head once, as cllm_model_weight_bytes counts them, plus the fp32
norms and biases; the KV cache of the short decode prompt is left out). The load average
is printed with the figures: on a shared machine they are noisy.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_bench as sb  # noqa: E402  (sets OMP_WAIT_POLICY=PASSIVE before torch loads)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hf_models import load_hf_folder, rms_norm, rotate_half  # noqa: E402

FORMATS = ("fp32", "bf16", "int8", "q4")
GGUF_TYPE = {"fp32": "f32", "bf16": "f16", "int8": "q8_0", "q4": "q4_0"}
PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "int8": 34 / 32, "q4": 18 / 32}
LLAMA_1B = ["hidden_size=2048", "intermediate_size=5632", "num_hidden_layers=22", "num_attention_heads=32",
            "num_key_value_heads=4", "vocab_size=32000", "max_position_embeddings=2048"]


# --------------------------------------------------------------------------
# models and their bytes per token
# --------------------------------------------------------------------------


def safetensors_shapes(folder):
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with open(os.path.join(folder, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            out.update({k: v["shape"] for k, v in hdr.items() if k != "__metadata__"})
    return out


def step_bytes(folder, fmt):
    """Bytes one decode step reads in `fmt`: the matrices (a tied embedding once, as the head;
    an untied embedding not at all, one row of it is read) plus the fp32 vectors."""
    shapes = safetensors_shapes(folder)
    untied = any(k.endswith("lm_head.weight") for k in shapes)
    n = 0.0
    for name, s in shapes.items():
        if len(s) == 1:
            n += s[0] * 4
        elif "wpe" in name or (untied and ("embed_tokens" in name or "wte" in name)):
            continue
        else:
            conv = any(c in name for c in ("c_attn", "c_proj", "c_fc"))  # GPT-2 Conv1D: [in, out]
            rows, cols = (s[1], s[0]) if conv else (s[0], s[1])
            cols_p = (cols + 31) // 32 * 32 if fmt in ("int8", "q4") else cols
            n += rows * cols_p * PER_VALUE[fmt]
    return n


def make_model(a, preset, out):
    arch = "gpt2" if preset.startswith("gpt2") else "llama"
    if a.quick:
        args = ["--arch", "gpt2", "--preset", "tiny", "--set", "vocab_size=50257", "bos_token_id=50256",
                "eos_token_id=50256"]
    elif preset == "llama-1B":
        args = ["--arch", "llama", "--preset", "llama-100M"] + sum((["--set", s] for s in LLAMA_1B), [])
    else:
        args = ["--arch", arch, "--preset", preset]
    r = subprocess.run([a.cllm, "init", *args, "--out", out, "--seed", "1"], capture_output=True)
    if r.returncode:
        raise SystemExit("cllm init failed: " + r.stderr.decode(errors="replace"))
    tok = os.path.join(a.fixtures, "hf", "gpt2" if arch == "gpt2" or a.quick else "tinyllama-1.1b-chat-v1.0")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), out)
    return out


# --------------------------------------------------------------------------
# the three implementations
# --------------------------------------------------------------------------


def cllm_run(a, model, fmt, prompt, n_new):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    env.pop("OMP_WAIT_POLICY", None)
    r = subprocess.run([a.cllm, "generate", "--model", model, "--weights", fmt, "--prompt-ids",
                        ",".join(map(str, prompt)), "--greedy", "--ignore-eos", "--max-new-tokens", str(n_new),
                        "--output", "ids"], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit("cllm generate --weights %s failed: %s" % (fmt, r.stderr[-500:]))
    m = re.search(r"prompt \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\).*decode [0-9.]+ s \(([0-9.]+) tok/s\)",
                  r.stderr)
    return float(m.group(1)), float(m.group(2)), [int(t) for t in r.stdout.split()]


def cllm_side(a, model, fmt, decode_prompt, prefill_prompt):
    _, dec, ids = cllm_run(a, model, fmt, decode_prompt, a.new_tokens)
    pre = cllm_run(a, model, fmt, prefill_prompt, 1)[0] if prefill_prompt else float("nan")
    return dec, pre, ids


def llama_side(a, npm_dir, gguf, decode_prompt, prefill_prompt):
    req = {"model": gguf, "threads": a.threads, "decode_prompt": decode_prompt, "n_new": a.new_tokens}
    if prefill_prompt:
        req["prefill_prompt"] = prefill_prompt
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    r = subprocess.run(["node", "llama_bench.mjs"], cwd=npm_dir, input=json.dumps(req), capture_output=True,
                       text=True, env=env, timeout=1800)
    if r.returncode:
        raise SystemExit("llama.cpp on %s failed: %s" % (gguf, r.stderr[-1500:]))
    res = json.loads(r.stdout)
    return res["decode_tps"], res.get("prefill_tps", float("nan")), res["ids"]


class TorchLlama:
    """LLaMA inference on the HF tensors of a folder with a preallocated cache [L, 2, KV, Tmax, hd]."""

    def __init__(self, folder, dtype=torch.float32):
        self.cfg, p = load_hf_folder(folder)
        c = self.cfg
        self.p = {k: v.to(dtype) for k, v in p.items()}
        self.H, self.KV, self.L = c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
        self.hd = c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        self.tmax = c["max_position_embeddings"]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        f = torch.outer(torch.arange(self.tmax, dtype=torch.float64), inv)
        emb = torch.cat([f, f], dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        self.head = self.p.get("lm_head.weight", self.p["model.embed_tokens.weight"])
        self.cache = torch.zeros(self.L, 2, self.KV, self.tmax, self.hd, dtype=dtype)

    @staticmethod
    def lin(x, W):
        return torch.mv(W, x[0]).unsqueeze(0) if x.shape[0] == 1 else x @ W.t()

    def forward(self, ids, pos):
        T, H, KV, hd, p = len(ids), self.H, self.KV, self.hd, self.p
        end = pos + T
        x = p["model.embed_tokens.weight"][ids]
        cos, sin = self.cos[pos:end], self.sin[pos:end]
        causal = torch.ones(T, end, dtype=torch.bool).tril(diagonal=pos) if T > 1 else None
        for i in range(self.L):
            n = "model.layers.%d." % i
            a = rms_norm(x, p[n + "input_layernorm.weight"], self.eps)
            q = self.lin(a, p[n + "self_attn.q_proj.weight"]).view(T, H, hd).transpose(0, 1)
            k = self.lin(a, p[n + "self_attn.k_proj.weight"]).view(T, KV, hd).transpose(0, 1)
            v = self.lin(a, p[n + "self_attn.v_proj.weight"]).view(T, KV, hd).transpose(0, 1)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.cache[i, 0, :, pos:end] = k
            self.cache[i, 1, :, pos:end] = v
            kc = self.cache[i, 0, :, :end].repeat_interleave(H // KV, dim=0)
            vc = self.cache[i, 1, :, :end].repeat_interleave(H // KV, dim=0)
            s = torch.matmul(q, kc.transpose(1, 2)) * (1.0 / hd ** 0.5)
            if causal is not None:
                s = s.masked_fill(~causal, float("-inf"))
            att = torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), vc)
            x = x + self.lin(att.transpose(0, 1).reshape(T, H * hd), p[n + "self_attn.o_proj.weight"])
            m = rms_norm(x, p[n + "post_attention_layernorm.weight"], self.eps)
            g = F.silu(self.lin(m, p[n + "mlp.gate_proj.weight"])) * self.lin(m, p[n + "mlp.up_proj.weight"])
            x = x + self.lin(g, p[n + "mlp.down_proj.weight"])
        h = rms_norm(x[-1:], p["model.norm.weight"], self.eps)
        return torch.mv(self.head, h[0])

    greedy = sb.TorchGPT2.greedy


def to_bf16_gpt2(tm):
    tm.p = {k: v.to(torch.bfloat16) for k, v in tm.p.items()}
    tm.wte = tm.p["transformer.wte.weight"]
    tm.head = tm.p.get("lm_head.weight", tm.wte)
    tm.layers = [[t.to(torch.bfloat16) for t in layer] for layer in tm.layers]
    tm.cache = tm.cache.to(torch.bfloat16)
    return tm


def torch_side(tm, a, decode_prompt, prefill_prompt):
    _, times, ids = tm.greedy(decode_prompt, a.new_tokens)
    dec = (len(times) - 1) / (times[-1] - times[0])
    pre = float("nan")
    if prefill_prompt:
        with torch.no_grad():
            t = time.perf_counter()
            tm.forward(prefill_prompt, 0)
            pre = len(prefill_prompt) / (time.perf_counter() - t)
    return dec, pre, ids


# --------------------------------------------------------------------------


def fmt_row(name, dec, pre, ref_dec, ref_pre, mb, bound):
    r = lambda x, y: "%.2fx" % (x / y) if ref_dec == ref_dec and y == y and y > 0 else "-"  # noqa: E731
    return "| %s | %.1f | %s | %.1f | %s | %.1f | %.1f | %.0f%% |" % (
        name, dec, r(dec, ref_dec), pre, r(pre, ref_pre), mb / 1e6, bound, 100 * dec / bound)


def bench_model(a, preset, tmp, npm_dir):
    model = make_model(a, preset, os.path.join(tmp, preset))
    cfg = json.load(open(os.path.join(model, "config.json")))
    V = cfg["vocab_size"]
    decode_prompt = [(i * 7919 + 11) % V for i in range(a.prompt_tokens)]
    prefill_prompt = [(i * 7919 + 13) % V for i in range(a.prefill)] if a.prefill else []
    ggufs = {}
    if npm_dir:
        for f in a.formats:
            ggufs[f] = os.path.join(tmp, "%s-%s.gguf" % (preset, GGUF_TYPE[f]))
            r = subprocess.run([a.cllm, "convert", "--to", "gguf", "--model", model, "--out", ggufs[f], "--type",
                                GGUF_TYPE[f]], capture_output=True)
            if r.returncode:
                raise SystemExit("GGUF export failed: " + r.stderr.decode(errors="replace"))
    torchs = {}
    if a.torch:
        if preset.startswith("gpt2") or a.quick:
            torchs["torch fp32"] = sb.TorchGPT2(model)
            torchs["torch bf16"] = to_bf16_gpt2(sb.TorchGPT2(model))
        else:
            torchs["torch fp32"] = TorchLlama(model)
            torchs["torch bf16"] = TorchLlama(model, torch.bfloat16)
    wbytes = {f: step_bytes(model, f) for f in FORMATS}
    runs = []
    for f in a.formats:
        runs.append(("cllm " + f, f, lambda f=f: cllm_side(a, model, f, decode_prompt, prefill_prompt)))
        if npm_dir:
            runs.append(("llama.cpp " + GGUF_TYPE[f], f,
                         lambda f=f: llama_side(a, npm_dir, ggufs[f], decode_prompt, prefill_prompt)))
    for name, tm in torchs.items():
        runs.append((name, name.split()[1], lambda tm=tm: torch_side(tm, a, decode_prompt, prefill_prompt)))
    dec = {n: [] for n, _, _ in runs}
    pre = {n: [] for n, _, _ in runs}
    ids = {}
    loads, bw_best = [], 0.0
    membw = sb.build_membw(tmp)
    for rnd in range(a.rounds):
        loads.append(os.getloadavg()[0])
        bw = sb.bandwidth(a.bw_mib, a.threads, membw)
        bw_best = max([bw_best] + [v[0] for v in bw.values()])
        order = runs if rnd % 2 == 0 else runs[::-1]
        for name, _, fn in order:
            d, p, got = fn()
            dec[name].append(d)
            pre[name].append(p)
            ids[name] = got
        loads.append(os.getloadavg()[0])
        print("%s round %d: %s (load %.2f)" % (preset, rnd + 1, ", ".join(
            "%s %.1f/%.0f" % (n, dec[n][-1], pre[n][-1]) for n, _, _ in runs), loads[-1]), flush=True)
    med = {n: (statistics.median(dec[n]), statistics.median(pre[n])) for n in dec}
    print("\n%s, batch 1, %d threads, decode: %d new tokens after %d; prefill: %d tokens; %d rounds; "
          "read bandwidth %.1f GB/s; load average %.2f..%.2f" % (
              preset if not a.quick else "gpt2-tiny", a.threads, a.new_tokens, a.prompt_tokens, a.prefill,
              a.rounds, bw_best, min(loads), max(loads)))
    print("| weights | decode tok/s | vs llama.cpp | prefill tok/s | vs llama.cpp | MB per token | bound tok/s "
          "| of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, f, _ in runs:
        ref = med.get("llama.cpp " + GGUF_TYPE[f], (float("nan"), float("nan")))
        if not name.startswith("cllm"):
            ref = (float("nan"), float("nan"))
        bound = bw_best * 1e9 / wbytes[f]
        print(fmt_row(name, med[name][0], med[name][1], ref[0], ref[1], wbytes[f], bound))
    if "torch fp32" in med:
        tf = med["torch fp32"]
        print("\ncllm fp32 / torch fp32: decode %.2fx, prefill %.2fx" % (
            med["cllm fp32"][0] / tf[0], med["cllm fp32"][1] / tf[1]) if "cllm fp32" in med else "")
    same = [n for n in ids if n != "cllm fp32" and ids[n] == ids.get("cllm fp32")]
    print("greedy ids equal to cllm fp32's: %s" % (", ".join(same) or "none"))
    print(flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", default=os.path.join(sb.REPO, "build", "cllm"))
    ap.add_argument("--fixtures", default=os.path.join(sb.REPO, "..", "shared", "fixtures"))
    ap.add_argument("--models", default="gpt2-124M,llama-100M", help="gpt2-124M, llama-100M, llama-1B")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=512, help="prefill prompt tokens (0: no prefill runs)")
    ap.add_argument("--bw-mib", type=int, default=512)
    ap.add_argument("--no-llama", dest="llama", action="store_false")
    ap.add_argument("--no-torch", dest="torch", action="store_false")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.formats = [f for f in a.formats.split(",") if f]
    for f in a.formats:
        if f not in FORMATS:
            raise SystemExit("--formats: unknown format %r (fp32, bf16, int8, q4)" % f)
    torch.set_num_threads(a.threads)
    print(sb.machine.header(a.cllm), flush=True)
    npm_dir = None
    if a.llama:
        sys.path.insert(0, os.path.join(sb.REPO, "tests"))
        import npm_clients
        npm_dir = npm_clients.install(os.path.dirname(os.path.abspath(a.cllm)), folder="npm-llama", dest="npm-llama",
                                      soft=True, locked_install=True)
        if npm_dir is None:
            print("llama.cpp left out: node-llama-cpp could not be installed: " + npm_clients.last_error[-300:])
        else:
            shutil.copyfile(os.path.join(HERE, "llama_bench.mjs"), os.path.join(npm_dir, "llama_bench.mjs"))
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.models.split(","):
            bench_model(a, preset, tmp, npm_dir)


if __name__ == "__main__":
    main()
