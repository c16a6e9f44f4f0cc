#!/usr/bin/python3
"""
The serving benchmark of `cllm serve`: single-stream decode against a
PyTorch KV-cache loop on the same weights, the memory-bandwidth bound, and
aggregate throughput under concurrent streaming clients.

  /usr/bin/python3 bench/serve_bench.py [--cllm build/cllm] [--threads 2] [--quick]

Model: `cllm init --arch gpt2 --preset gpt2-124M --seed 1` (with --quick the
`tiny` preset) with the 50257-token GPT-2 tokenizer of the shared fixtures
(tokenizer.json and tokenizer_config.json copied in). fp32 weights.

1. Single stream, for --threads N and for 1 thread: one greedy request of
   --new-tokens tokens after a prompt of about --prompt-tokens tokens through
   POST /generate_stream (time to first token = send to the first SSE event;
   decode tokens/s = (tokens - 1) / (last event - first event)), interleaved
   A B A B with a plain-PyTorch GPT-2 greedy loop over the same safetensors in
   this process (torch.no_grad, a preallocated key/value cache, one token per
   step, torch.set_num_threads(N); the server gets --threads N and
   OMP_NUM_THREADS=N, see --no-server-omp-env; the prompt ids are the server's own
   /tokenize answer, and the generated ids are compared). Medians, cllm/torch.
2. Bandwidth: in the same rounds, bench/membw.c (compiled here with cc -O3
   -march=native -fopenmp) and torch (x.sum(), y.copy_(x)) each sum a
   --bw-mib MiB fp32 array (read bytes) and copy it (read + write bytes)
   with N threads; the best read rate of either over all rounds (the least
   contended) is the peak. The
   decode bound is read bandwidth / weight bytes per token (every fp32
   parameter read once per token; the tied embedding counts once).
3. Concurrency (server with --threads N, --max-batch-size 32): C streaming
   clients (threads with http.client), each issuing the same request shape
   back to back, --requests-per-client requests each (C = 1 is the requests
   one by one); aggregate output tokens/s = generated tokens / wall time,
   speedup over C = 1, p50/p99 of request latency and time to first token,
   and the server's peak RSS (VmHWM, cumulative over the levels).

--no-server-omp-env starts the server with --threads N alone (without
OMP_NUM_THREADS), which must give the same speed: the server applies the
thread count on the scheduler thread that runs the model.

--perf runs `perf record -g` on the server during one extra single-stream
request and prints the top symbols, so that a shortfall can be attributed.

--kv-dtypes fp32,bf16 measures the key/value pool's dtype instead (no
torch): for each round and each dtype in turn (A B A B ...) a fresh server
with --kv-cache-dtype D serves one client (the requests one by one), then
--kv-clients streaming clients (prompts of about --prompt-tokens tokens,
--new-tokens new ones, --requests-per-client each); medians of the
aggregate tokens/s, each dtype's ratio to the first, and the many-client
rate over the one-client rate of the same dtype.

--lora N measures LoRA serving instead (no torch): N PEFT adapters of rank
--lora-r on every linear layer (random A and B written here) served with
`--lora-adapters`, then --lora-clients streaming clients in three modes,
interleaved A B C A B C over --rounds rounds: every request on the base,
every request on adapter 0, and mixed (client i on the base when i % (N + 1)
is 0, else on adapter i % (N + 1) - 1: one batch holding the base and every
adapter). Medians of the aggregate tokens/s and their ratio to the base-only
batch, with the load average before and after.
"""

import argparse
import http.client
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "ref"))
sys.path.insert(0, os.path.join(REPO, "tests"))
import serve_util  # noqa: E402

# PyTorch's best setting on a shared machine (as in train_step.py): its OpenMP
# threads sleep when idle instead of spinning against OpenBLAS's own threads
# (on 2 loaded cores a spinning pool made torch's decode several times
# slower). Set before torch loads libgomp; the server keeps the caller's value.
CALLER_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import machine  # noqa: E402
from hf_models import gelu_tanh, load_hf_folder, save_safetensors  # noqa: E402

BASE_PROMPT = ("The history of the city begins with a small village on the river, where farmers and "
               "traders met every week to sell grain, wool and salt to travellers from the")


# --------------------------------------------------------------------------
# model folder and server
# --------------------------------------------------------------------------


def find_tokenizer_dir(fixtures):
    for d in (os.path.join(fixtures, "hf", "gpt2"), os.path.join(fixtures, "gpt2"), fixtures):
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            return d
    raise SystemExit("no GPT-2 tokenizer.json under %s (hf/gpt2/, gpt2/ or the folder itself); "
                     "pass --fixtures" % fixtures)


def make_model(cllm, tokdir, out, quick):
    preset = ["--preset", "tiny", "--set", "vocab_size=50257", "bos_token_id=50256", "eos_token_id=50256"] if quick else ["--preset", "gpt2-124M"]
    r = subprocess.run([cllm, "init", "--arch", "gpt2", *preset, "--out", out, "--seed", "1"],
                       capture_output=True)
    if r.returncode:
        raise SystemExit("cllm init failed: " + r.stderr.decode(errors="replace"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, f), out)
    return out


def Server(cllm, model, threads, extra, omp_env=True, jit_profile=False):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if CALLER_WAIT_POLICY is not None:
        env["OMP_WAIT_POLICY"] = CALLER_WAIT_POLICY
    if omp_env:
        env["OMP_NUM_THREADS"] = str(threads)
    if jit_profile:
        env["ONEDNN_JIT_PROFILE"] = "2"  # 2: /tmp/perf-PID.map, so perf names oneDNN's JIT kernels
    return serve_util.Server([cllm, "serve", "--model", model, "--port", "0", "--threads", str(threads), *extra],
                             env=env, start_timeout=300)


def post_json(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    if r.status != 200:
        raise SystemExit("%s: %d %s" % (path, r.status, out[:300]))
    return json.loads(out)


def stream(port, prompt, new_tokens, adapter=None):
    """One greedy /generate_stream request (on a LoRA adapter when given).
    Returns (t_send, [event times], final event dict)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "details": True}}
    if adapter is not None:
        body["parameters"]["adapter_id"] = adapter
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/generate_stream", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit("/generate_stream: %d %s" % (r.status, r.read()[:300]))
    times, last, buf = [], None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    times.append(now)
                    last = json.loads(line[5:])
    c.close()
    return t0, times, last


# --------------------------------------------------------------------------
# plain-PyTorch GPT-2 with a key/value cache
# --------------------------------------------------------------------------


class TorchGPT2:
    """GPT-2 inference on the HF tensors of a folder: Conv1D weights [in, out]
    used as stored, a preallocated cache [L, 2, H, Tmax, hd]."""

    def __init__(self, folder):
        self.cfg, self.p = load_hf_folder(folder)
        c = self.cfg
        self.C, self.H, self.L = c["n_embd"], c["n_head"], c["n_layer"]
        self.hd = self.C // self.H
        self.eps = c["layer_norm_epsilon"]
        self.tmax = c["n_positions"]
        self.wte = self.p["transformer.wte.weight"]
        self.head = self.p.get("lm_head.weight", self.wte)
        self.layers = []
        for i in range(self.L):
            g = lambda n: self.p["transformer.h.%d.%s" % (i, n)]  # noqa: E731
            self.layers.append([g(n) for n in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias")])
        self.cache = torch.zeros(self.L, 2, self.H, self.tmax, self.hd)

    @staticmethod
    def lin(x, W, b):
        """x [T, in] @ W [in, out] + b. One row goes through addmv on the
        transposed view (a BLAS gemv): through Debian's torch + OpenBLAS 0.3.21
        a 1-row addmm runs as a GEMM, and addmv (gemv) decoded
        about 1.6x faster on 2 AVX2 cores (F.linear on pre-transposed weights
        was no faster than addmm)."""
        if x.shape[0] == 1:
            return torch.addmv(b, W.t(), x[0]).unsqueeze(0)
        return torch.addmm(b, x, W)

    def forward(self, ids, pos):
        """ids: list of new token ids at positions pos.. ; returns the logits of the last one."""
        T, C, H, hd = len(ids), self.C, self.H, self.hd
        x = self.wte[ids] + self.p["transformer.wpe.weight"][pos:pos + T]  # [T, C]
        end = pos + T
        causal = None
        if T > 1:
            causal = torch.ones(T, end, dtype=torch.bool).tril(diagonal=pos)
        for i, (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb) in enumerate(self.layers):
            a = F.layer_norm(x, (C,), l1w, l1b, self.eps)
            q, k, v = self.lin(a, aw, ab).split(C, dim=-1)  # [T, C] each
            kc, vc = self.cache[i, 0], self.cache[i, 1]  # [H, Tmax, hd]
            kc[:, pos:end] = k.view(T, H, hd).transpose(0, 1)
            vc[:, pos:end] = v.view(T, H, hd).transpose(0, 1)
            q = q.view(T, H, hd).transpose(0, 1)  # [H, T, hd]
            s = torch.matmul(q, kc[:, :end].transpose(1, 2)) * (1.0 / math.sqrt(hd))  # [H, T, end]
            if causal is not None:
                s = s.masked_fill(~causal, float("-inf"))
            att = torch.matmul(torch.softmax(s, dim=-1), vc[:, :end])  # [H, T, hd]
            x = x + self.lin(att.transpose(0, 1).reshape(T, C), pw, pb)
            m = F.layer_norm(x, (C,), l2w, l2b, self.eps)
            x = x + self.lin(gelu_tanh(self.lin(m, fw, fb)), mw, mb)
        h = F.layer_norm(x[-1:], (C,), self.p["transformer.ln_f.weight"], self.p["transformer.ln_f.bias"],
                         self.eps)
        # mv over the [V, C] matrix: the fastest of F.linear, x @ head.T (contiguous) and mv
        # for one row through Debian's torch + OpenBLAS (about 2x F.linear on 2 AVX2 cores)
        return torch.mv(self.head, h[0])

    def greedy(self, prompt_ids, new_tokens):
        """Returns (ttft, [time of each token], ids)."""
        out, times = [], []
        with torch.no_grad():
            t0 = time.perf_counter()
            logits = self.forward(prompt_ids, 0)
            pos = len(prompt_ids)
            for _ in range(new_tokens):
                tok = int(torch.argmax(logits))
                out.append(tok)
                times.append(time.perf_counter())
                if len(out) == new_tokens:
                    break
                logits = self.forward([tok], pos)
                pos += 1
        return times[0] - t0, times, out


def weight_bytes(tm):
    """fp32 bytes read per decoded token: every parameter once (a tied
    embedding is one tensor)."""
    return sum(t.numel() * 4 for t in tm.p.values())


def build_membw(outdir):
    """Compiles bench/membw.c; returns its path, or None (no C compiler)."""
    exe = os.path.join(outdir, "membw")
    r = subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", os.path.join(HERE, "membw.c"), "-o", exe],
                       capture_output=True)
    return exe if r.returncode == 0 else None


def bandwidth(mib, threads, exe, reps=3):
    """{"c": (read GB/s, copy GB/s), "torch": (...)} over a `mib` MiB fp32
    array, best of `reps` each, with `threads` threads: bench/membw.c (when
    it compiled) and torch's x.sum() / y.copy_(x); copy counts read + write."""
    out = {}
    if exe:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.pop("OMP_WAIT_POLICY", None)
        r = subprocess.run([exe, str(mib), str(reps)], capture_output=True, text=True, env=env)
        if r.returncode == 0:
            out["c"] = tuple(float(v) for v in r.stdout.split())
    n = mib * (1 << 20) // 4
    x = torch.ones(n)
    y = torch.empty(n)
    y.copy_(x)
    best_c = best_r = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        y.copy_(x)
        best_c = min(best_c, time.perf_counter() - t)
        t = time.perf_counter()
        float(x.sum())
        best_r = min(best_r, time.perf_counter() - t)
    del x, y
    out["torch"] = (n * 4 / best_r / 1e9, 2 * n * 4 / best_c / 1e9)
    return out


# --------------------------------------------------------------------------
# the three measurements
# --------------------------------------------------------------------------


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100.0 * len(xs)) - 1))]


def single_stream(a, srv, tm, prompt, prompt_ids, threads, wbytes):
    torch.set_num_threads(threads)
    rows = {"cllm": {"ttft": [], "tps": []}, "torch": {"ttft": [], "tps": []}, "bw_read": [], "bw_copy": [],
            "bw_c_read": [], "bw_c_copy": [], "bw_t_read": [], "bw_t_copy": []}
    # warm-up of both (first-touch of weights, oneDNN primitive creation)
    stream(srv.port, prompt, 8)
    tm.greedy(prompt_ids, 8)
    mismatch = None
    gen_counts = []
    for r in range(a.rounds):
        t0, times, last = stream(srv.port, prompt, a.new_tokens)
        n = last["details"]["generated_tokens"] if last and last.get("details") else len(times)
        gen_counts.append(n)
        rows["cllm"]["ttft"].append(times[0] - t0)
        rows["cllm"]["tps"].append((len(times) - 1) / (times[-1] - times[0]))
        ttft, ttimes, ids = tm.greedy(prompt_ids, a.new_tokens)
        rows["torch"]["ttft"].append(ttft)
        rows["torch"]["tps"].append((len(ttimes) - 1) / (ttimes[-1] - ttimes[0]))
        bw = bandwidth(a.bw_mib, threads, a.membw)
        for k, (rd, cp) in bw.items():
            rows["bw_%s_read" % k[0]].append(rd)
            rows["bw_%s_copy" % k[0]].append(cp)
        rd = max(v[0] for v in bw.values())
        rows["bw_read"].append(rd)
        rows["bw_copy"].append(max(v[1] for v in bw.values()))
        if r == 0:
            st = post_json(srv.port, "/generate", {"inputs": prompt, "parameters": {
                "max_new_tokens": a.new_tokens, "details": True}})
            cl_ids = [t["id"] for t in st["details"]["tokens"]]
            k = next((i for i, (u, v) in enumerate(zip(cl_ids, ids)) if u != v), None)
            if k is not None:
                mismatch = k
        print("  threads %d round %d: cllm %.2f tok/s ttft %.3f s | torch %.2f tok/s ttft %.3f s | "
              "bw read %.1f GB/s" % (threads, r + 1, rows["cllm"]["tps"][-1], rows["cllm"]["ttft"][-1],
                                      rows["torch"]["tps"][-1], rows["torch"]["ttft"][-1], rd), flush=True)
    res = {k: ({m: med(v) for m, v in rows[k].items()} if isinstance(rows[k], dict) else max(rows[k] or [0.0]))
           for k in rows}
    res["generated"] = min(gen_counts)
    res["mismatch"] = mismatch
    res["bound_tps"] = res["bw_read"] * 1e9 / wbytes
    return res


def concurrency(a, srv, prompt_for, adapter_for=None, levels=None, quiet=False):
    out = []
    for c in levels or a.clients:
        lat, ttft, toks = [], [], []
        lock = threading.Lock()
        errors = []

        def client(ci):
            try:
                for r in range(a.requests_per_client):
                    t0, times, last = stream(srv.port, prompt_for(ci, r), a.new_tokens,
                                             adapter_for(ci) if adapter_for else None)
                    n = last["details"]["generated_tokens"] if last and last.get("details") else len(times)
                    with lock:
                        lat.append(times[-1] - t0)
                        ttft.append(times[0] - t0)
                        toks.append(n)
            except Exception as e:  # reported below, the level is marked failed
                errors.append(repr(e))

        ths = [threading.Thread(target=client, args=(i,)) for i in range(c)]
        t = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        wall = time.perf_counter() - t
        row = {"clients": c, "requests": len(lat), "tokens": sum(toks), "wall": wall,
               "tps": sum(toks) / wall, "lat50": pct(lat, 50), "lat99": pct(lat, 99),
               "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99), "hwm_mib": srv.status_kib("VmHWM") / 1024,
               "errors": errors}
        out.append(row)
        if quiet and not errors:
            continue
        print("  %2d clients: %d requests, %d tokens in %.1f s = %.1f tok/s%s" % (
            c, row["requests"], row["tokens"], wall, row["tps"], "  ERRORS: %s" % errors[:2] if errors else ""),
            flush=True)
    return out


def make_adapters(model, n, r, out):
    """n PEFT folders with random A and B (small: the text stays close to the base's) on every Conv1D."""
    params = load_hf_folder(model)[1]
    dirs = []
    g = torch.Generator().manual_seed(5)
    for k in range(n):
        t = {}
        for name, w in params.items():
            if not name.endswith(".weight") or w.dim() != 2 or ".h." not in name:
                continue
            mod = "base_model.model." + name[:-len(".weight")]
            t[mod + ".lora_A.weight"] = (torch.rand(r, w.shape[0], generator=g) - 0.5) * 0.02
            t[mod + ".lora_B.weight"] = (torch.rand(w.shape[1], r, generator=g) - 0.5) * 0.02
        d = os.path.join(out, "adapter%d" % k)
        os.makedirs(d, exist_ok=True)
        save_safetensors(os.path.join(d, "adapter_model.safetensors"), t, dtype="F32")
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r,
                       "target_modules": ["c_attn", "c_proj", "c_fc"], "fan_in_fan_out": True}, f)
        dirs.append(d)
    return dirs


def lora_bench(a, model, tmp, extra, fit):
    dirs = make_adapters(model, a.lora, a.lora_r, tmp)
    names = ["a%d" % k for k in range(a.lora)]
    spec = ",".join("%s=%s" % (n, d) for n, d in zip(names, dirs))
    load0 = os.getloadavg()
    srv = Server(a.cllm, model, a.threads, extra + ["--lora-adapters", spec], a.server_omp_env)
    modes = {"base only": lambda ci: None, "one adapter": lambda ci: names[0],
             "mixed": lambda ci: None if ci % (a.lora + 1) == 0 else names[ci % (a.lora + 1) - 1]}
    tps = {m: [] for m in modes}
    try:
        prompt, _ = fit(BASE_PROMPT * 4, srv)
        for r in range(a.rounds):
            for m, f in modes.items():
                row = concurrency(a, srv, lambda ci, rq: "%d. %s" % (ci * 10 + rq, prompt), f, [a.lora_clients],
                                  quiet=True)[0]
                tps[m].append(row["tps"])
                print("  round %d %-11s: %d requests, %d tokens in %.1f s = %.1f tok/s" % (
                    r + 1, m, row["requests"], row["tokens"], row["wall"], row["tps"]), flush=True)
    finally:
        srv.stop()
    load1 = os.getloadavg()
    print("\n" + machine.header(a.cllm))
    print("\nLoRA serving: %d adapters of rank %d on every linear layer, %d streaming clients, %d new tokens, "
          "%d thread(s); medians of %d interleaved rounds; load average %.1f -> %.1f" % (
              a.lora, a.lora_r, a.lora_clients, a.new_tokens, a.threads, a.rounds, load0[0], load1[0]))
    print("| batch | aggregate tok/s | vs base only | min | max |")
    print("|---|---:|---:|---:|---:|")
    base = med(tps["base only"])
    for m, v in tps.items():
        print("| %s | %.1f | %.2fx | %.1f | %.1f |" % (m, med(v), med(v) / base, min(v), max(v)))


def kv_dtype_bench(a, model, extra, fit):
    dtypes = a.kv_dtypes.split(",")
    tps = {d: [] for d in dtypes}
    one = {d: [] for d in dtypes}
    load0 = os.getloadavg()
    for r in range(a.rounds):
        for d in (dtypes if r % 2 == 0 else dtypes[::-1]):
            srv = Server(a.cllm, model, a.threads, extra + ["--kv-cache-dtype", d], a.server_omp_env)
            try:
                prompt, ids = fit((BASE_PROMPT + " ") * (1 + a.prompt_tokens // 20), srv)
                concurrency(a, srv, lambda ci, rq: prompt, levels=[1], quiet=True)  # warm-up
                solo, row = concurrency(a, srv, lambda ci, rq: "%d. %s" % (ci * 10 + rq, prompt),
                                        levels=[1, a.kv_clients], quiet=True)
            finally:
                srv.stop()
            tps[d].append(row["tps"])
            one[d].append(solo["tps"])
            errors = solo["errors"] + row["errors"]
            print("  round %d %-5s: 1 client %.1f tok/s; %d clients: %d requests, %d tokens in %.1f s = %.1f tok/s "
                  "(prompt %d tokens)%s" % (r + 1, d, solo["tps"], a.kv_clients, row["requests"], row["tokens"],
                                            row["wall"], row["tps"], len(ids),
                                            "  ERRORS: %s" % errors[:2] if errors else ""), flush=True)
    load1 = os.getloadavg()
    print("\n" + machine.header(a.cllm))
    print("\nkey/value pool dtype: %d streaming clients, prompts of about %d tokens, %d new tokens, %d request(s) "
          "per client, %d thread(s); medians of %d interleaved rounds; load average %.1f -> %.1f" % (
              a.kv_clients, a.prompt_tokens, a.new_tokens, a.requests_per_client, a.threads, a.rounds, load0[0],
              load1[0]))
    print("| --kv-cache-dtype | 1 client tok/s | %d clients tok/s | vs %s | min | max | %d clients / 1 |" % (
        a.kv_clients, dtypes[0], a.kv_clients))
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = med(tps[dtypes[0]])
    for d, v in tps.items():
        print("| %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx |" % (d, med(one[d]), med(v), med(v) / base, min(v),
                                                                     max(v), med(v) / med(one[d])))


def perf_profile(a, srv, prompt, outdir):
    data = os.path.join(outdir, "perf.data")
    p = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-o", data, "-p", str(srv.p.pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    stream(srv.port, prompt, a.new_tokens)
    p.send_signal(2)
    p.wait(60)
    r = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol", "--stdio",
                        "--percent-limit", "1", "-g", "none"], capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    print("\nperf (server, one single-stream request, self time by symbol, >= 1%):")
    for ln in lines[:40]:
        print("  " + ln.rstrip())
    if r.returncode:
        print("  perf report failed: " + r.stderr.strip()[:300])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--fixtures", default=os.path.normpath(os.path.join(REPO, "..", "shared", "fixtures")),
                    help="folder with hf/gpt2/tokenizer.json (default: ../shared/fixtures from the repository)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--also-threads", type=int, nargs="*", default=[1],
                    help="thread counts for extra single-stream runs (default: 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--max-total-tokens", type=int, default=512)
    ap.add_argument("--bw-mib", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="tiny model, fewer tokens: a smoke run")
    ap.add_argument("--perf", action="store_true", help="perf record the server during one request")
    ap.add_argument("--server-omp-env", action=argparse.BooleanOptionalAction, default=True,
                    help="also set OMP_NUM_THREADS=N for the server (default); without it only --threads N")
    ap.add_argument("--workdir", help="keep the model here (default: a temporary folder)")
    ap.add_argument("--kv-dtypes", help="compare these --kv-cache-dtype values, e.g. fp32,bf16 (see above)")
    ap.add_argument("--kv-clients", type=int, default=16)
    ap.add_argument("--lora", type=int, default=0, help="measure N LoRA adapters served at once instead (see above)")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-clients", type=int, default=16)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {a.rounds})")
    if a.quick:
        a.new_tokens = min(a.new_tokens, 32)
        a.bw_mib = min(a.bw_mib, 64)
        a.max_total_tokens = min(a.max_total_tokens, 256)
    print(machine.header(a.cllm), flush=True)
    tokdir = find_tokenizer_dir(a.fixtures)
    tmp = a.workdir or tempfile.mkdtemp(prefix="serve_bench.")
    model = os.path.join(tmp, "model")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        make_model(a.cllm, tokdir, model, a.quick)
    extra = ["--max-batch-size", str(a.max_batch_size), "--max-total-tokens", str(a.max_total_tokens)]

    def fit(text, srv):
        """Cuts BASE_PROMPT-like text to about prompt_tokens tokens with the server's tokenizer."""
        pieces = post_json(srv.port, "/tokenize", {"inputs": text})
        cut = text[:pieces[:a.prompt_tokens][-1]["stop"]]
        return cut, [p["id"] for p in post_json(srv.port, "/tokenize", {"inputs": cut})]

    if a.kv_dtypes:
        kv_dtype_bench(a, model, extra, fit)
        if not a.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if a.lora:
        lora_bench(a, model, tmp, extra, fit)
        if not a.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    a.membw = build_membw(tmp)
    tm = TorchGPT2(model)
    wbytes = weight_bytes(tm)
    print("model: gpt2 %s, %.1fM parameters, %.1f MiB fp32 read per token; prompt ~%d tokens, %d new tokens, "
          "greedy" % ("tiny" if a.quick else "gpt2-124M", wbytes / 4e6, wbytes / 2**20, a.prompt_tokens,
                      a.new_tokens), flush=True)
    results = {}
    conc = None
    for threads in [a.threads] + [t for t in a.also_threads if t != a.threads]:
        srv = Server(a.cllm, model, threads, extra, a.server_omp_env, a.perf)
        try:
            prompt, prompt_ids = fit(BASE_PROMPT * 4, srv)
            print("\nsingle stream, %d thread(s), server pid %d:" % (threads, srv.p.pid), flush=True)
            results[threads] = single_stream(a, srv, tm, prompt, prompt_ids, threads, wbytes)
            if threads == a.threads:
                print("\nconcurrency, %d thread(s), --max-batch-size %d, %d request(s) per client:" % (
                    threads, a.max_batch_size, a.requests_per_client), flush=True)
                base_rss = srv.status_kib("VmRSS") / 1024
                base_hwm = srv.status_kib("VmHWM") / 1024
                conc = concurrency(a, srv, lambda ci, r: "%d. %s" % (ci * 10 + r, prompt))
                if a.perf:
                    perf_profile(a, srv, prompt, tmp)
        finally:
            srv.stop()

    print("\n" + machine.header(a.cllm))
    print("\nsingle stream (medians of %d interleaved rounds; decode = tokens after the first):" % a.rounds)
    print("| threads | impl | decode tok/s | TTFT | cllm/torch decode | bandwidth bound | of bound |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for th, r in results.items():
        bound = r["bound_tps"]
        print("| %d | torch | %.2f | %.0f ms | | | %.0f%% |" % (th, r["torch"]["tps"], r["torch"]["ttft"] * 1e3,
                                                                100 * r["torch"]["tps"] / bound))
        print("| %d | cllm | %.2f | %.0f ms | **%.2fx** | %.1f tok/s | %.0f%% |" % (
            th, r["cllm"]["tps"], r["cllm"]["ttft"] * 1e3, r["cllm"]["tps"] / r["torch"]["tps"], bound,
            100 * r["cllm"]["tps"] / bound))
    print("\nbandwidth, best of 3 passes per round x %d rounds (the least contended), %d MiB fp32, read (sum) / "
          "copy (read + write):" % (a.rounds, a.bw_mib))
    for th, r in results.items():
        print("  %d thread(s): bench/membw.c %s; torch %.1f / %.1f GB/s; peak read %.1f GB/s" % (
            th, "%.1f / %.1f GB/s" % (r["bw_c_read"], r["bw_c_copy"]) if a.membw else "not built (no cc)",
            r["bw_t_read"], r["bw_t_copy"], r["bw_read"]))
    print("bound = peak read GB/s of either loop / %.1f MB of fp32 weights per token (the server idle while they run)" % (wbytes / 1e6))
    for th, r in results.items():
        if r["generated"] < a.new_tokens:
            print("WARNING: %d threads: a cllm request stopped after %d tokens" % (th, r["generated"]))
        if r["mismatch"] is not None:
            print("note: %d threads: cllm and torch greedy ids first differ at token %d (fp32 rounding on "
                  "near-ties of a random model)" % (th, r["mismatch"]))
        else:
            print("%d threads: cllm and torch generate the same %d greedy ids" % (th, a.new_tokens))
    if conc:
        one = conc[0]["tps"] if conc[0]["clients"] == 1 else float("nan")
        print("\nconcurrency (%d threads, %d new tokens per request, %d requests per client; 1 client = "
              "the requests one by one):" % (a.threads, a.new_tokens, a.requests_per_client))
        print("| clients | requests | tokens | aggregate tok/s | speedup | latency p50 / p99 | "
              "TTFT p50 / p99 | server peak RSS |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in conc:
            print("| %d | %d | %d | %.1f | %.2fx | %.2f / %.2f s | %.3f / %.3f s | %.0f MiB |" % (
                r["clients"], r["requests"], r["tokens"], r["tps"], r["tps"] / one, r["lat50"], r["lat99"],
                r["ttft50"], r["ttft99"], r["hwm_mib"]))
        print("server before the concurrency levels: RSS %.0f MiB, peak (VmHWM, start-up and single stream "
              "included) %.0f MiB; peak RSS is VmHWM after each level (cumulative)" % (base_rss, base_hwm))
        if any(r["errors"] for r in conc):
            print("ERRORS in the concurrency runs: see above")
    if not a.workdir:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
