#!/usr/bin/python3
"""`cllm serve --lora-adapters` (labels: serve, lora): several PEFT adapters on
one base, chosen per request.

A tiny GPT-2 (the real GPT-2 tokenizer) and two adapter folders written here
with random non-zero A and B (x: r 4 on c_attn; y: r 8, rsLoRA, every linear
layer with rank_pattern c_fc -> 2 and alpha_pattern), served with
`--lora-adapters x=DIR,y=DIR`:

  - alone: greedy /generate with adapter_id x / y / the base id / none equals
    `cllm generate --greedy [--adapter DIR]` on the same prompt, and the
    adapters do change the output
  - mixed: the base, x and y requests sent concurrently (one batch, decode and
    prefill rows of different adapters in the same forward) each return the
    tokens they return alone
  - OpenAI: `model` names the adapter (responses carry it), the base id is the
    base; the prompt log-probabilities of an adapter request (echo + logprobs,
    the full forward) equal the KV-cache log-probabilities of its tokens
  - errors: unknown adapter_id -> 422 (TGI), unknown model -> 404 with
    OpenAI's {"error": {"code": "model_not_found", "type":
    "invalid_request_error"}}; /v1/models and /info list the base and the
    adapters; /metrics counts requests per adapter
  - a LLaMA base (GQA, nn.Linear layouts) with adapters on q/v and on
    o/gate/down, alone and mixed, against `cllm generate --adapter`
  - weight formats: a bf16, int8 and q4 base with adapter x equals
    `cllm generate --weights F --adapter DIR`
  - start-up refusals: an adapter for another base shape (message naming the
    file and the tensor), modules_to_save, bias "all", a name used twice or
    equal to the base id, a malformed spec, --tensor
  - the official `openai` npm client (tests/npm) with model "x" and an
    unknown model (APIError 404 model_not_found)

Run by ctest as /usr/bin/python3 tests/serve_lora_test.py --cllm build/cllm
--build build --fixtures /work/shared/fixtures/hf
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
import hf_models as hm  # noqa: E402
import npm_clients  # noqa: E402
from serve_util import Server, req  # noqa: E402

PREFIX = "base_model.model."
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg, flush=True)
    return cond


def make_model(cllm, fixtures, d, n_embd=64, arch="gpt2"):
    limit = "n_positions=128" if arch == "gpt2" else "max_position_embeddings=128"
    r = subprocess.run([cllm, "init", "--arch", arch, "--preset", "tiny", "--out", d, "--seed", "3", "--set",
                        "vocab_size=50257", limit, f"{'n_embd' if arch == 'gpt2' else 'hidden_size'}={n_embd}",
                        "bos_token_id=50256", "eos_token_id=50256"], capture_output=True)
    if r.returncode:
        raise SystemExit("init failed: " + r.stderr.decode())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fixtures, "gpt2", f), d)
    return d


def make_adapter(d, model, targets, r, alpha, seed, extra_cfg=None, r_of=None):
    """A PEFT folder with A, B uniform in +-0.4 on every block module whose last name is in targets."""
    params = hm.load_safetensors(os.path.join(model, "model.safetensors"))
    conv = json.load(open(os.path.join(model, "config.json")))["model_type"] == "gpt2"  # Conv1D: [in, out]
    g = torch.Generator().manual_seed(seed)
    t = {}
    for name, w in params.items():
        mod = name[:-len(".weight")]
        if not name.endswith(".weight") or w.dim() != 2 or mod.split(".")[-1] not in targets:
            continue
        rr = r_of(mod) if r_of else r
        n_in, n_out = (w.shape[0], w.shape[1]) if conv else (w.shape[1], w.shape[0])
        t[PREFIX + mod + ".lora_A.weight"] = (torch.rand(rr, n_in, generator=g) - 0.5) * 0.8
        t[PREFIX + mod + ".lora_B.weight"] = (torch.rand(n_out, rr, generator=g) - 0.5) * 0.8
    os.makedirs(d, exist_ok=True)
    hm.save_safetensors(os.path.join(d, "adapter_model.safetensors"), t, dtype="F32")
    conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny", "r": r,
            "lora_alpha": alpha, "target_modules": targets, "fan_in_fan_out": conv, "bias": "none",
            "inference_mode": True}
    conf.update(extra_cfg or {})
    json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    return d


def cli_greedy(cllm, model, prompt, n, adapter=None, weights=None):
    cmd = [cllm, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", str(n), "--greedy",
           "--output", "ids"]
    if adapter:
        cmd += ["--adapter", adapter]
    if weights:
        cmd += ["--weights", weights]
    r = subprocess.run(cmd, capture_output=True)
    check(r.returncode == 0, f"cllm generate: {r.stderr}")
    return [int(t) for t in r.stdout.split()]


def tgi(port, prompt, n, adapter=None, details=True):
    par = {"max_new_tokens": n, "details": details}
    if adapter is not None:
        par["adapter_id"] = adapter
    st, js, raw, _ = req(port, "POST", "/generate", {"inputs": prompt, "parameters": par})
    check(st == 200, f"/generate adapter {adapter}: {st} {raw[:300]}")
    return js


PROMPTS = ["Hello, world", "The quick brown fox", "Once upon a time", "In 1905, Einstein", "def main():",
           "Paris is the capital of a country that"]
N = 12


def same(got, want):
    """cllm generate stops before an EOS it prints nothing for: compare the common length."""
    return got[:len(want)] == want and len(want) >= 1


def alone_and_mixed(cllm, model, dirs, port):
    names = [None, "tiny", "x", "y"]
    alone = {}
    for p in PROMPTS[:3]:
        for a in names:
            js = tgi(port, p, N, a)
            got = [t["id"] for t in js["details"]["tokens"]]
            alone[(p, a)] = got
            want = cli_greedy(cllm, model, p, N, dirs.get(a))
            check(same(got, want), f"adapter {a} on {p!r}: served {got} != cllm generate {want}")
    for a in ("x", "y"):
        check(any(alone[(p, a)] != alone[(p, None)] for p in PROMPTS[:3]), f"adapter {a} changes no output")
    check(alone[(PROMPTS[0], "x")] != alone[(PROMPTS[0], "y")] or alone[(PROMPTS[1], "x")] != alone[(PROMPTS[1], "y")],
          "x and y give the same tokens")
    # the rest alone, then everything at once (several rounds: decode rows of one adapter beside prefill of another)
    for p in PROMPTS[3:]:
        for a in names:
            alone[(p, a)] = [t["id"] for t in tgi(port, p, N, a)["details"]["tokens"]]
    mixed(port, [(p, a) for p in PROMPTS for a in names] * 2, alone, "gpt2")
    return alone


def mixed(port, jobs, alone, what):
    """Sends every (prompt, adapter) job at once; each must return its tokens of `alone`."""
    got = {}

    def run(i, p, a):
        got[i] = [t["id"] for t in tgi(port, p, N, a)["details"]["tokens"]]

    th = [threading.Thread(target=run, args=(i, p, a)) for i, (p, a) in enumerate(jobs)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    bad = [(p, a) for i, (p, a) in enumerate(jobs) if got.get(i) != alone[(p, a)]]
    check(not bad, f"{what}: mixed batch differs from alone for {bad[:4]}")


def openai_checks(port):
    p = PROMPTS[0]
    st, js, raw, _ = req(port, "POST", "/v1/completions", {"model": "x", "prompt": p, "max_tokens": N,
                                                            "temperature": 0, "logprobs": 0})
    check(st == 200 and js["model"] == "x", f"completions model x: {st} {raw[:300]}")
    want = tgi(port, p, N, "x")
    check(js["choices"][0]["text"] == want["generated_text"], "OpenAI model x != TGI adapter_id x")
    st, js, raw, _ = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": N, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == tgi(port, p, N)["generated_text"] and js["model"] == "tiny",
          f"model = the base id: {raw[:300]}")
    st, js, raw, _ = req(port, "POST", "/v1/chat/completions", {"model": "y", "max_tokens": 4, "temperature": 0,
                                                                 "messages": [{"role": "user", "content": "Hi"}]})
    check(st in (200, 400) and (st == 400 or js["model"] == "y"), f"chat model y: {st} {raw[:300]}")
    # prompt log-probabilities under the adapter (full forward) = the KV cache's log-probabilities
    ids = req(port, "POST", "/tokenize", {"inputs": p})[1]
    pids = [t["id"] for t in ids]
    toks = want["details"]["tokens"]
    body = {"model": "x", "prompt": pids + [t["id"] for t in toks], "max_tokens": 1, "temperature": 0, "echo": True,
            "logprobs": 0}
    st, js, raw, _ = req(port, "POST", "/v1/completions", body)
    if check(st == 200, f"echo logprobs {st} {raw[:300]}"):
        lp = js["choices"][0]["logprobs"]["token_logprobs"][len(pids):len(pids) + len(toks)]
        err = max(abs(a - b["logprob"]) for a, b in zip(lp, toks))
        check(err < 2e-3, f"prompt log-probs under adapter x differ from the cache's by {err}")
        base = req(port, "POST", "/v1/completions", dict(body, model="tiny"))[1]
        blp = base["choices"][0]["logprobs"]["token_logprobs"][len(pids):len(pids) + len(toks)]
        check(max(abs(a - b) for a, b in zip(lp, blp)) > 1e-3, "prompt log-probs with x equal the base's")
    # errors
    st, js, raw, _ = req(port, "POST", "/generate", {"inputs": p, "parameters": {"adapter_id": "nope"}})
    check(st == 422 and js.get("error_type") == "validation" and "nope" in js.get("error", ""), f"unknown adapter_id: {st} {raw}")
    st, js, raw, _ = req(port, "POST", "/generate", {"inputs": p, "parameters": {"adapter_id": 3}})
    check(st == 422 and "adapter_id" in js.get("error", ""), f"adapter_id not a string: {st} {raw}")
    st, js, raw, _ = req(port, "POST", "/v1/completions", {"model": "nope", "prompt": p})
    e = (js or {}).get("error", {})
    check(st == 404 and e.get("code") == "model_not_found" and e.get("type") == "invalid_request_error" and
          "nope" in e.get("message", "") and "param" in e, f"unknown model: {st} {raw}")
    st, js, raw, _ = req(port, "POST", "/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "a"}]})
    check(st == 404 and js["error"]["code"] == "model_not_found", f"unknown chat model: {st} {raw}")
    # listings and metrics
    st, js, _, _ = req(port, "GET", "/v1/models")
    check([m["id"] for m in js["data"]] == ["tiny", "x", "y"], f"/v1/models {js}")
    check(all(m.get("parent") == "tiny" for m in js["data"][1:]), "adapters' parent")
    st, js, _, _ = req(port, "GET", "/info")
    la = js.get("lora_adapters", [])
    check([a["id"] for a in la] == ["x", "y"] and la[0]["r"] == 4 and la[1]["r"] == 8 and la[0]["layers"] == 2 and
          la[1]["layers"] == 8, f"/info lora_adapters {la}")
    st, _, raw, _ = req(port, "GET", "/metrics")
    text = raw.decode()
    for a in ("tiny", "x", "y"):
        line = [ln for ln in text.splitlines() if ln.startswith('cllm_adapter_requests_total{adapter="%s"}' % a)]
        check(line and int(line[0].split()[-1]) >= 10, f"metrics for {a}: {line}")


def llama(cllm, tmp):
    """A LLaMA base (GQA, nn.Linear layouts): two adapters on different targets, alone and mixed."""
    model = make_model(cllm, FIXTURES, os.path.join(tmp, "llama"), 64, "llama")
    dirs = {"q": make_adapter(os.path.join(tmp, "lq"), model, ["q_proj", "v_proj"], 4, 8, 7),
            "m": make_adapter(os.path.join(tmp, "lm"), model, ["gate_proj", "down_proj", "o_proj"], 2, 4, 8)}
    srv = Server([cllm, "serve", "--model", model, "--port", "0", "--model-id", "tiny", "--max-batch-size", "6",
                  "--lora-adapters", f"q={dirs['q']}", f"m={dirs['m']}"])
    try:
        alone = {}
        prompts = PROMPTS[:2] + [" ".join(PROMPTS)]  # the last: one prefill of more than 16 rows (GEMM form)
        for p in prompts:
            for a in (None, "q", "m"):
                alone[(p, a)] = [t["id"] for t in tgi(srv.port, p, N, a)["details"]["tokens"]]
                want = cli_greedy(cllm, model, p, N, dirs.get(a))
                check(same(alone[(p, a)], want), f"llama adapter {a} on {p!r}: {alone[(p, a)]} != {want}")
            check(alone[(p, "q")] != alone[(p, None)] and alone[(p, "m")] != alone[(p, None)],
                  f"llama: an adapter changes nothing on {p!r}")
        mixed(srv.port, [(p, a) for p in prompts for a in (None, "q", "m")] * 2, alone, "llama")
    finally:
        check(srv.stop() == 0, "llama server exit code")


def formats(cllm, model, dirs):
    for w in ("bf16", "int8", "q4"):
        srv = Server([cllm, "serve", "--model", model, "--port", "0", "--model-id", "tiny", "--weights", w,
                      "--lora-adapters", f"x={dirs['x']}"])
        try:
            for p in PROMPTS[:2]:
                got = [t["id"] for t in tgi(srv.port, p, N, "x")["details"]["tokens"]]
                want = cli_greedy(cllm, model, p, N, dirs["x"], w)
                check(same(got, want), f"--weights {w} adapter x on {p!r}: {got} != {want}")
        finally:
            check(srv.stop() == 0, f"--weights {w}: exit code")


def refusals(cllm, model, tmp, dirs):
    other = make_model(cllm, FIXTURES, os.path.join(tmp, "wide"), 96)
    wrong = make_adapter(os.path.join(tmp, "wrong"), other, ["c_attn"], 4, 8, 5)
    saved = make_adapter(os.path.join(tmp, "saved"), model, ["c_attn"], 4, 8, 6, {"modules_to_save": ["ln_f"]})
    biased = make_adapter(os.path.join(tmp, "biased"), model, ["c_attn"], 4, 8, 6, {"bias": "all"})
    cases = [
        ([f"x={dirs['x']},z={wrong}"], 1, ["adapter_model.safetensors", "transformer.h.0.attn.c_attn.lora_A.weight",
                                           "[4, 96]", "'z'"]),
        ([f"s={saved}"], 1, ["modules_to_save", "adapter_config.json", "ln_f"]),
        ([f"b={biased}"], 1, ['bias "all"']),
        ([f"x={dirs['x']},x={dirs['y']}"], 1, ["'x' given twice"]),
        ([f"tiny={dirs['x']}"], 1, ["'tiny' is the base model's id"]),
        ([f"={dirs['x']}"], 2, ["expected NAME=DIR"]),
        ([f"x={tmp}/missing"], 1, ["missing/adapter_config.json"]),
    ]
    for flags, rc, words in cases:
        r = subprocess.run([cllm, "serve", "--model", model, "--port", "0", "--model-id", "tiny", "--lora-adapters",
                            *flags], capture_output=True, timeout=120)
        err = r.stderr.decode(errors="replace")
        check(r.returncode == rc and all(w in err for w in words), f"{flags}: rc {r.returncode} (want {rc}), {err!r}")
    r = subprocess.run([cllm, "serve", "--model", model, "--tensor", "2", "--lora-adapters", f"x={dirs['x']}"],
                       capture_output=True, timeout=60)
    check(r.returncode == 2 and "--tensor" in r.stderr.decode(), f"--tensor with adapters: {r.returncode} {r.stderr}")


def npm_checks(build, port, want_x):
    d = npm_clients.install(build)
    if d is None:
        print("skipped: node/npm not installed; the npm client checks did not run")
        return
    shutil.copyfile(os.path.join(HERE, "serve_lora_clients.mjs"), os.path.join(d, "serve_lora_clients.mjs"))
    r = subprocess.run(["node", "serve_lora_clients.mjs", f"http://127.0.0.1:{port}", PROMPTS[0], want_x], cwd=d,
                       capture_output=True, timeout=300)
    sys.stdout.write(r.stdout.decode(errors="replace"))
    check(r.returncode == 0, "npm openai client: " + r.stderr.decode(errors="replace")[-2000:])


FIXTURES = None


def main():
    global FIXTURES
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    FIXTURES = a.fixtures
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(a.cllm, a.fixtures, os.path.join(tmp, "model"))
        dirs = {
            "x": make_adapter(os.path.join(tmp, "x"), model, ["c_attn"], 4, 8, 1),
            "y": make_adapter(os.path.join(tmp, "y"), model, ["c_attn", "c_proj", "c_fc"], 8, 4, 2,
                              {"use_rslora": True, "rank_pattern": {"c_fc": 2}, "alpha_pattern": {"c_fc": 6}},
                              r_of=lambda m: 2 if m.endswith("c_fc") else 8),
        }
        srv = Server([a.cllm, "serve", "--model", model, "--port", "0", "--model-id", "tiny", "--max-batch-size", "8",
                      "--max-batch-prefill-tokens", "16", "--lora-adapters", f"x={dirs['x']},y={dirs['y']}"])
        try:
            alone_and_mixed(a.cllm, model, dirs, srv.port)
            openai_checks(srv.port)
            want_x = tgi(srv.port, PROMPTS[0], N, "x")["generated_text"]
            npm_checks(a.build, srv.port, want_x)
        finally:
            check(srv.stop() == 0, "exit code after SIGTERM")
        check(any("adapter x (" in ln and "r=4" in ln for ln in srv.log), "start-up line names adapter x")
        formats(a.cllm, model, dirs)
        llama(a.cllm, tmp)
        refusals(a.cllm, model, tmp, dirs)
    print("serve_lora_test:", "FAILED %d checks" % failures if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
