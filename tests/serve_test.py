"""`cllm serve` end to end (label: serve).

A tiny GPT-2 with the real 50257-token GPT-2 tokenizer and a ChatML chat
template is served on a free port; the test then speaks raw HTTP to it:

  - lifecycle: "listening on http://HOST:PORT" on stderr; SIGTERM with a
    request in flight lets it finish (200) and exits 0; a second SIGTERM
    during that drain ends the process at once (the default action)
  - TGI: /generate greedy tokens equal `cllm generate --greedy` on the same
    prompt; /generate_stream events (index from 1, pieces that add up to
    generated_text, details last); the compat route / (a list, or a stream);
    seeds reproduce sampled text; stop strings cut the text; return_full_text;
    top_n_tokens; decoder_input_details log-probs (a full forward) equal the
    KV-cache log-probs of the same tokens; /tokenize pieces add up to the input;
    /info, /health, /metrics, /v1/models
  - OpenAI: completions (n, echo, logprobs), chat completions rendered with
    the template, streaming with include_usage and [DONE]
  - continuous batching: 16 concurrent greedy requests return exactly what each
    returns alone; the same over a bf16 key/value pool (--kv-cache-dtype bf16,
    half the pool's bytes), whose answers equal `cllm generate --greedy
    --kv-cache-dtype bf16`
  - bad input: every validation rule -> 422 (TGI) / 400 (OpenAI) naming the
    field, malformed JSON, invalid UTF-8, 404, 405, 413 (declared and chunked
    bodies), 401 with --api-key, 429 past --max-concurrent-requests
  - hostile clients: a client that disconnects mid-stream is cancelled within a
    step (metrics: in flight back to 0); a stalled client is timed out while
    others are served
  - a bounded load test (--load N requests, 32 at a time, mixed streaming,
    cancellations and bad requests): every good request complete and correct,
    and the server's resident memory back near its baseline
  - start-up: bad flags and a --kv-cache-tokens pool larger than the free
    memory exit non-zero naming the flag; the pool is resident from start-up;
    SIGTERM right after the ready line still drains and exits 0
  - the real clients (npm, pinned in tests/npm): `openai` and
    `@huggingface/inference` against the same server (tests/serve_clients.mjs)
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npm_clients  # noqa: E402
import serve_util  # noqa: E402
import signal_util  # noqa: E402
from serve_util import req  # noqa: E402

failures = 0
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg, flush=True)
    return cond


def Server(cllm, model, *extra, env=None):
    return serve_util.Server([cllm, "serve", "--model", model, "--port", "0", *extra], env=env)


def sse(port, path, body, headers=None, timeout=120):
    """Returns (status, [event payload strings]) of a server-sent event stream."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=json.dumps(body).encode(), headers=h)
    r = c.getresponse()
    if r.status != 200:
        out = r.read()
        c.close()
        return r.status, [out.decode(errors="replace")], r
    events = []
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    events.append(line[5:].strip().decode())
    c.close()
    return 200, events, r


def raw_exchange(port, head, body):
    """Sends a request (ignoring a server that stops reading) and returns the raw response."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(head)
        s.sendall(body)
    except OSError:
        pass
    resp = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            resp += d
    except OSError:
        pass
    s.close()
    return resp


def metrics(port):
    st, _, out, _ = req(port, "GET", "/metrics")
    vals = {}
    for line in out.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


def wait_idle(port, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if metrics(port).get("cllm_requests_in_flight", 1) == 0:
            return True
        time.sleep(0.05)
    return False


def make_model(cllm, fixtures, tmp, positions=256, name="model"):
    d = os.path.join(tmp, name)
    r = subprocess.run([cllm, "init", "--arch", "gpt2", "--out", d, "--seed", "3", "--set", "vocab_size=50257",
                        f"n_positions={positions}", "bos_token_id=50256", "eos_token_id=50256"], capture_output=True)
    if r.returncode:
        raise SystemExit("init failed: " + r.stderr.decode())
    shutil.copy(os.path.join(fixtures, "gpt2", "tokenizer.json"), d)
    cfg = json.load(open(os.path.join(fixtures, "gpt2", "tokenizer_config.json")))
    cfg.update({"chat_template": CHATML, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return d


def cli_greedy(cllm, model, prompt, n, *extra):
    r = subprocess.run([cllm, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", str(n),
                        "--greedy", "--output", "ids", *extra], capture_output=True)
    check(r.returncode == 0, f"cllm generate: {r.stderr}")
    return [int(t) for t in r.stdout.split()]


PROMPTS = ["Hello, world", "The quick brown fox", "Once upon a time", "In 1905, Einstein", "Ein kleiner Test",
           "def main():", "A B C D E F", "Paris is the capital of", "ümlaut and 日本語", "1 2 3 4 5 6 7"]


def tgi_tests(cllm, model, port):
    # ---- greedy = cllm generate --greedy
    for p in PROMPTS[:3]:
        want = cli_greedy(cllm, model, p, 12)
        st, js, _, _ = req(port, "POST", "/generate",
                           {"inputs": p, "parameters": {"max_new_tokens": 12, "details": True}})
        check(st == 200, f"/generate {st} {js}")
        got = [t["id"] for t in js["details"]["tokens"]]
        # cllm generate stops before an EOS it prints nothing for; compare the common length
        check(got[:len(want)] == want, f"/generate greedy {got} != cllm generate {want}")
        check(js["details"]["finish_reason"] in ("length", "eos_token"), f"finish {js['details']}")
        check(js["details"]["generated_tokens"] == len(got), "generated_tokens")
        check(js["details"]["seed"] is None, "greedy requests have no seed")
        check(all(t["logprob"] <= 0 for t in js["details"]["tokens"]), "logprobs <= 0")
    # ---- stream: index from 1, pieces add up, details at the end
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 10, "details": True}}
    st, js, _, _ = req(port, "POST", "/generate", body)
    st2, evs, r = sse(port, "/generate_stream", body)
    check(st2 == 200 and r.getheader("Content-Type", "").startswith("text/event-stream"), "stream content type")
    evs = [json.loads(e) for e in evs]
    check(len(evs) == 10, f"{len(evs)} stream events")
    check([e["index"] for e in evs] == list(range(1, len(evs) + 1)), "indexes from 1")
    check("".join(e["token"]["text"] for e in evs) == js["generated_text"], "stream pieces != generated_text")
    check(evs[-1]["generated_text"] == js["generated_text"], "last event's generated_text")
    check(all(e["generated_text"] is None for e in evs[:-1]), "generated_text only at the end")
    check(evs[-1]["details"]["finish_reason"] == "length" and evs[-1]["details"]["generated_tokens"] == 10,
          f"stream details {evs[-1]['details']}")
    check([e["token"]["id"] for e in evs] == [t["id"] for t in js["details"]["tokens"]], "stream ids == generate ids")
    # ---- compat route
    st, js2, _, _ = req(port, "POST", "/", body)
    check(st == 200 and isinstance(js2, list) and js2[0]["generated_text"] == js["generated_text"], f"POST / {js2}")
    st, evs2, _ = sse(port, "/", dict(body, stream=True))
    check(st == 200 and json.loads(evs2[-1])["generated_text"] == js["generated_text"], "POST / stream")
    # ---- seeds
    samp = {"inputs": "Tell me", "parameters": {"max_new_tokens": 16, "do_sample": True, "seed": 7, "details": True}}
    a = req(port, "POST", "/generate", samp)[1]
    b = req(port, "POST", "/generate", samp)[1]
    samp["parameters"]["seed"] = 8
    c = req(port, "POST", "/generate", samp)[1]
    check(a["generated_text"] == b["generated_text"], "same seed, different text")
    check(a["details"]["tokens"] != c["details"]["tokens"], "different seeds, same tokens")
    check(a["details"]["seed"] == 7, "details.seed")
    t = req(port, "POST", "/generate", {"inputs": "x", "parameters": {"temperature": 0.7, "max_new_tokens": 2,
                                                                      "details": True}})[1]
    check(isinstance(t["details"]["seed"], int), "a sampled request without a seed reports the one drawn")
    # ---- stop strings
    full = req(port, "POST", "/generate", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 24}})[1]["generated_text"]
    if len(full) > 8:
        stop = full[4:7]
        r2 = req(port, "POST", "/generate", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 24, "stop": [stop],
                                                                                  "details": True}})[1]
        check(r2["generated_text"] == full[:full.index(stop)], f"stop {stop!r}: {r2['generated_text']!r} vs {full!r}")
        check(r2["details"]["finish_reason"] == "stop_sequence", "finish stop_sequence")
    # ---- return_full_text
    r3 = req(port, "POST", "/generate", {"inputs": "Abc", "parameters": {"max_new_tokens": 4, "return_full_text": True}})[1]
    r4 = req(port, "POST", "/generate", {"inputs": "Abc", "parameters": {"max_new_tokens": 4}})[1]
    check(r3["generated_text"] == "Abc" + r4["generated_text"], "return_full_text")
    # ---- top_n_tokens and decoder_input_details: the full forward's log-prob of a token equals the KV cache's
    g = req(port, "POST", "/generate", {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 3, "details": True,
                                                                            "top_n_tokens": 3}})[1]
    toks = g["details"]["tokens"]
    tops = g["details"]["top_tokens"]
    check(len(tops) == 3 and all(len(x) == 3 for x in tops), "top_tokens shape")
    check(tops[0][0]["id"] == toks[0]["id"] and abs(tops[0][0]["logprob"] - toks[0]["logprob"]) < 1e-5,
          "greedy token is the top-1 alternative")
    check(all(x[0]["logprob"] >= x[1]["logprob"] >= x[2]["logprob"] for x in tops), "top tokens sorted")
    p = req(port, "POST", "/generate", {"inputs": PROMPTS[2] + g["generated_text"],
                                        "parameters": {"max_new_tokens": 1, "details": True,
                                                       "decoder_input_details": True}})[1]
    pre = p["details"]["prefill"]
    check(pre[0]["logprob"] is None, "the first prompt token has no logprob")
    n_prompt = len(pre) - 3
    for k in range(3):
        if pre[n_prompt + k]["id"] == toks[k]["id"]:
            check(abs(pre[n_prompt + k]["logprob"] - toks[k]["logprob"]) < 2e-4,
                  f"prefill logprob {pre[n_prompt + k]} vs decode {toks[k]}")
    # ---- tokenize
    st, tk, _, _ = req(port, "POST", "/tokenize", {"inputs": "Hello wörld, 日本"})
    check(st == 200 and "".join(t["text"] for t in tk) == "Hello wörld, 日本", f"/tokenize {tk}")
    check(all(t["stop"] >= t["start"] for t in tk) and tk[-1]["stop"] == len("Hello wörld, 日本".encode()), "offsets")
    # ---- info, health, models, metrics
    st, info, _, _ = req(port, "GET", "/info")
    check(st == 200 and info["model_id"] == "tiny" and info["max_total_tokens"] == 256 and
          info["max_input_tokens"] == 255 and info["max_concurrent_requests"] == 6 and
          info.get("kv_cache_dtype") == "fp32", f"/info {info}")
    check(req(port, "GET", "/health")[0] == 200, "/health")
    st, ms, _, _ = req(port, "GET", "/v1/models")
    check(st == 200 and ms["data"][0]["id"] == "tiny", f"/v1/models {ms}")
    m = metrics(port)
    for k in ("cllm_requests_total{outcome=\"success\"}", "cllm_queue_size", "cllm_batch_current_size",
              "cllm_prompt_tokens_total", "cllm_generated_tokens_total", "cllm_time_to_first_token_seconds_count",
              "cllm_time_per_output_token_seconds_count"):
        check(k in m, f"/metrics lacks {k}")
    check(m.get("cllm_requests_total{outcome=\"success\"}", 0) >= 10, "success count")


def openai_tests(cllm, model, port):
    want = req(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 8}})[1]["generated_text"]
    st, js, _, _ = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8,
                                                         "temperature": 0})
    check(st == 200 and js["object"] == "text_completion" and js["choices"][0]["text"] == want, f"completions {js}")
    check(js["choices"][0]["finish_reason"] in ("length", "stop"), "finish_reason")
    u = js["usage"]
    check(u["completion_tokens"] <= 8 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage {u}")
    # default max_tokens is 16
    js = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "a", "temperature": 0, "stop": None})[1]
    check(js["usage"]["completion_tokens"] <= 16 and js["choices"][0]["finish_reason"] in ("length", "stop"), "default 16")
    # n, seed, echo, logprobs
    js = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 6, "n": 3, "seed": 5,
                                               "logprobs": 2, "echo": True})[1]
    check(len(js["choices"]) == 3 and [c["index"] for c in js["choices"]] == [0, 1, 2], "n=3")
    check(all(c["text"].startswith("Hi") for c in js["choices"]), "echo")
    lp = js["choices"][0]["logprobs"]
    check(lp["token_logprobs"][0] is None and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]),
          f"logprobs {lp}")
    check(all(len(t) <= 2 for t in lp["top_logprobs"][1:]), "top_logprobs size")
    js2 = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 6, "n": 3, "seed": 5})[1]
    check([c["text"] for c in js2["choices"]] == [c["text"][2:] for c in js["choices"]], "seeded n=3 reproducible")
    # token-id prompt
    ids = [15496, 11, 995]
    js3 = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 5, "temperature": 0})[1]
    js4 = req(port, "POST", "/generate", {"inputs": "Hello, world", "parameters": {"max_new_tokens": 5}})[1]
    check(js3["choices"][0]["text"] == js4["generated_text"], "token-id prompt")
    # chat: ChatML rendering, then the same greedy continuation as the rendered prompt
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + "<|im_start|>assistant\n"
    js = req(port, "POST", "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 6, "temperature": 0})[1]
    ref = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": rendered, "max_tokens": 6, "temperature": 0})[1]
    check(js["object"] == "chat.completion" and js["choices"][0]["message"]["role"] == "assistant", f"chat {js}")
    check(js["choices"][0]["message"]["content"] == ref["choices"][0]["text"], "chat == completion of the rendered prompt")
    check(js["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"], "chat prompt tokens")
    # chat logprobs
    js = req(port, "POST", "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_completion_tokens": 4,
                                                    "temperature": 0, "logprobs": True, "top_logprobs": 2})[1]
    content = js["choices"][0]["logprobs"]["content"]
    check(len(content) == js["usage"]["completion_tokens"] and all(len(c["top_logprobs"]) == 2 for c in content),
          f"chat logprobs {content}")
    check(all(abs(c["top_logprobs"][0]["logprob"] - c["logprob"]) < 1e-5 for c in content), "greedy = top-1")
    # streaming with usage
    st, evs, _ = sse(port, "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 6,
                                                    "temperature": 0, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    check(evs and evs[-1] == "[DONE]", "stream ends with [DONE]")
    chunks = [json.loads(e) for e in evs[:-1]]
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first delta has the role")
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check(text == ref["choices"][0]["text"], f"streamed chat {text!r}")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1, "usage chunk last")
    fins = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    check(len(fins) == 1 and fins[0] in ("stop", "length"), f"one finish_reason {fins}")
    st, evs, _ = sse(port, "/v1/completions", {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8,
                                               "temperature": 0, "stream": True})
    text = "".join(json.loads(e)["choices"][0]["text"] for e in evs[:-1])
    check(text == want and evs[-1] == "[DONE]", f"streamed completion {text!r} != {want!r}")


def bad_input_tests(port):
    tgi_bad = [
        ({"inputs": "x", "parameters": {"temperature": 0}}, "temperature"),
        ({"inputs": "x", "parameters": {"temperature": -1}}, "temperature"),
        ({"inputs": "x", "parameters": {"top_p": 1.0}}, "top_p"),
        ({"inputs": "x", "parameters": {"top_p": 0}}, "top_p"),
        ({"inputs": "x", "parameters": {"top_k": 0}}, "top_k"),
        ({"inputs": "x", "parameters": {"typical_p": 1.5}}, "typical_p"),
        ({"inputs": "x", "parameters": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"inputs": "x", "parameters": {"frequency_penalty": 3}}, "frequency_penalty"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 300}}, "max_new_tokens"),
        ({"inputs": "x", "parameters": {"max_new_tokens": "5"}}, "max_new_tokens"),
        ({"inputs": "x", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, "stop"),
        ({"inputs": "x", "parameters": {"stop": "a"}}, None),
        ({"inputs": "x", "parameters": {"top_n_tokens": 6}}, "top_n_tokens"),
        ({"inputs": "x", "parameters": {"truncate": 0}}, "truncate"),
        ({"inputs": "x", "parameters": {"seed": -1}}, "seed"),
        ({"inputs": "x", "parameters": {"best_of": 2}}, "best_of"),
        ({"inputs": "x", "parameters": {"max_tokens": 5}}, "max_tokens"),
        ({"inputs": "", "parameters": {}}, "inputs"),
        ({"inputs": 5}, "inputs"),
        ({"inputs": "x", "parameters": []}, "parameters"),
        ({"inputs": "word " * 300}, "inputs"),
        ([1, 2], None),
    ]
    for body, field in tgi_bad:
        st, js, out, _ = req(port, "POST", "/generate", body)
        if field is None and isinstance(body, dict):  # "stop": "a" is allowed (a single string)
            check(st == 200, f"{body}: {st} {out[:200]}")
            continue
        check(st == 422 and js and js.get("error_type") == "validation", f"{body}: {st} {out[:200]}")
        if field:
            check(field in js.get("error", ""), f"{body}: message {js.get('error')!r} does not name {field}")
    # truncate keeps the last tokens: a long input with truncate fits
    st, js, out, _ = req(port, "POST", "/generate", {"inputs": "word " * 300, "parameters": {"truncate": 20,
                                                                                          "max_new_tokens": 2}})
    check(st == 200, f"truncate: {st} {out[:200]}")
    st, js, _, _ = req(port, "POST", "/generate", raw=b'{"inputs": "x", ')
    check(st == 422 and "malformed JSON" in js["error"], f"malformed JSON: {st} {js}")
    st, js, _, _ = req(port, "POST", "/generate", raw=b'{"inputs": "\xff\xfe"}')
    check(st == 422, f"invalid UTF-8: {st}")
    oa_bad = [
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"5": 200}}, "logit_bias"),
        ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
        ({"prompt": [99999999]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ]
    for body, field in oa_bad:
        st, js, out, _ = req(port, "POST", "/v1/completions", dict(body, model="tiny"))
        check(st == 400 and js and js["error"]["type"] == "invalid_request_error" and field in js["error"]["message"],
              f"/v1/completions {body}: {st} {out[:200]}")
    for body, field in [({"messages": []}, "messages"), ({"messages": [{"content": "x"}]}, "role"),
                        ({"messages": [{"role": "user", "content": 5}]}, "content"),
                        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "logprobs")]:
        st, js, out, _ = req(port, "POST", "/v1/chat/completions", dict(body, model="tiny"))
        check(st == 400 and field in js["error"]["message"], f"chat {body}: {st} {out[:200]}")
    st, js, _, _ = req(port, "POST", "/v1/chat/completions", raw=b"not json")
    check(st == 400 and js["error"]["type"] == "invalid_request_error", "OpenAI malformed JSON")
    # routes and methods
    check(req(port, "GET", "/nope")[0] == 404, "404")
    check(req(port, "GET", "/generate")[0] == 405, "405 GET /generate")
    check(req(port, "POST", "/health")[0] == 405, "405 POST /health")
    check(req(port, "DELETE", "/v1/completions")[0] == 405, "405 DELETE")
    # 413: declared length, then a chunked body without one
    resp = raw_exchange(port, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % (2 << 20), b"x" * (2 << 20))
    check(resp.startswith(b"HTTP/1.1 413") and b"payload_too_large" in resp, f"413 declared: {resp[:80]!r}")
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        chunk = b"y" * 65536
        for _ in range(40):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    resp = b""
    try:
        while b"\r\n\r\n" not in resp:
            d = s.recv(4096)
            if not d:
                break
            resp += d
    except OSError:
        pass
    s.close()
    check(resp.startswith(b"HTTP/1.1 413"), f"413 chunked: {resp[:60]!r}")


def hostile_tests(port):
    # a client that leaves mid-stream is cancelled and its blocks freed
    before = metrics(port)
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = json.dumps({"inputs": "Long story", "parameters": {"max_new_tokens": 200}}).encode()
    s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    got = b""
    while got.count(b"data:") < 3:
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    check(wait_idle(port, 10), "a disconnected stream is still in flight")
    after = metrics(port)
    check(after["cllm_requests_total{outcome=\"cancelled\"}"] == before["cllm_requests_total{outcome=\"cancelled\"}"] + 1,
          "the disconnect counts as cancelled")
    check(after["cllm_generated_tokens_total"] - before["cllm_generated_tokens_total"] < 150,
          "generation went on after the client left")
    # a non-streaming client that leaves is cancelled too
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    time.sleep(0.2)
    s.close()
    check(wait_idle(port, 10), "a disconnected /generate is still in flight")
    # a stalled client (half a request line) does not block others and is closed after --timeout
    stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
    stalled.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inp")
    t0 = time.time()
    st, js, _, _ = req(port, "POST", "/generate", {"inputs": "still serving", "parameters": {"max_new_tokens": 2}})
    check(st == 200, "served beside a stalled client")
    stalled.settimeout(15)
    try:
        d = stalled.recv(100)
    except OSError:
        d = b""
    check(time.time() - t0 < 14 and not d.startswith(b"HTTP/1.1 200"), "stalled client timed out")
    stalled.close()
    # many connections at once (past the connection limit): refused or served, never a crash
    socks = []
    for _ in range(120):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    for k in socks[:20]:
        try:
            k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            pass
    for k in socks:
        k.close()
    time.sleep(0.5)
    st, js, _, _ = req(port, "POST", "/generate", {"inputs": "after the flood", "parameters": {"max_new_tokens": 2}})
    check(st == 200, f"served after 120 connections at once: {st}")


def batching_test(port):
    """16 concurrent greedy requests return what each returns alone."""
    alone = {}
    for p in PROMPTS:
        alone[p] = req(port, "POST", "/generate", {"inputs": p, "parameters": {"max_new_tokens": 20, "details": True}})[1]
    out = {}

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        out[i] = (p, req(port, "POST", "/generate", {"inputs": p, "parameters": {"max_new_tokens": 20,
                                                                                 "details": True}})[1])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i, (p, js) in out.items():
        check([t["id"] for t in js["details"]["tokens"]] == [t["id"] for t in alone[p]["details"]["tokens"]],
              f"request {i} ({p!r}) differs among 16 concurrent ones")


def kv_dtype_test(cllm, model):
    """--kv-cache-dtype bf16 over fp32 weights: the pool line names bf16 at half the bytes of an fp32 pool;
    greedy requests equal `cllm generate --greedy --kv-cache-dtype bf16`, alone and among 16 concurrent ones."""
    cfg = json.load(open(os.path.join(model, "config.json")))
    want_mib = 4096 * 2 * cfg["n_layer"] * cfg["n_embd"] * 2 / 2**20
    s = Server(cllm, model, "--kv-cache-dtype", "bf16", "--kv-cache-tokens", "4096", "--max-batch-size", "16")
    try:
        line = "".join(s.log)
        m = re.search(r"KV cache pool (\d+) tokens \(([0-9.]+) MiB, (\w+)\)", line)
        check(m is not None and m.group(3) == "bf16" and abs(float(m.group(2)) - want_mib) < 0.06,
              f"bf16 pool line (expected {want_mib:.1f} MiB, bf16): {line[-300:]}")
        for p in PROMPTS[:3]:
            want = cli_greedy(cllm, model, p, 12, "--kv-cache-dtype", "bf16")
            st, js, _, _ = req(s.port, "POST", "/generate",
                               {"inputs": p, "parameters": {"max_new_tokens": 12, "details": True}})
            got = [t["id"] for t in js["details"]["tokens"]] if st == 200 else js
            check(st == 200 and got[:len(want)] == want, f"bf16 cache: /generate {got} != cllm generate {want}")
        st, info, _, _ = req(s.port, "GET", "/info")
        check(st == 200 and info.get("kv_cache_dtype") == "bf16" and
              info.get("rank_kv_cache_bytes") == 4096 * 2 * cfg["n_layer"] * cfg["n_embd"] * 2,
              f"bf16 pool in /info: {info}")
        batching_test(s.port)
    finally:
        rc = s.stop()
        check(rc == 0, f"bf16-cache server: exit {rc}, log: {''.join(s.log)[-600:]}")


def load_test(port, server, n_total):
    """n_total mixed requests, 32 at a time."""
    expect = {p: req(port, "POST", "/generate", {"inputs": p, "parameters": {"max_new_tokens": 12}})[1]["generated_text"]
              for p in PROMPTS}
    base_rss = server.rss_kib()
    rng = random.Random(1)
    kinds = []
    for i in range(n_total):
        kinds.append(rng.choice(["gen", "gen", "stream", "oa", "oa_stream", "cancel", "bad"]))
    results = [None] * n_total
    lock = threading.Lock()
    idx = [0]

    def worker():
        while True:
            with lock:
                if idx[0] >= n_total:
                    return
                i = idx[0]
                idx[0] += 1
            p = PROMPTS[i % len(PROMPTS)]
            k = kinds[i]
            try:
                if k == "gen":
                    st, js, _, _ = req(port, "POST", "/generate", {"inputs": p, "parameters": {"max_new_tokens": 12}})
                    results[i] = st == 200 and js["generated_text"] == expect[p]
                elif k == "stream":
                    st, evs, _ = sse(port, "/generate_stream", {"inputs": p, "parameters": {"max_new_tokens": 12}})
                    results[i] = st == 200 and json.loads(evs[-1])["generated_text"] == expect[p]
                elif k == "oa":
                    st, js, _, _ = req(port, "POST", "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 12,
                                                                         "temperature": 0})
                    results[i] = st == 200 and js["choices"][0]["text"] == expect[p]
                elif k == "oa_stream":
                    st, evs, _ = sse(port, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 12,
                                                               "temperature": 0, "stream": True})
                    results[i] = st == 200 and "".join(json.loads(e)["choices"][0]["text"] for e in evs[:-1]) == expect[p]
                elif k == "cancel":
                    s = socket.create_connection(("127.0.0.1", port), timeout=30)
                    body = json.dumps({"inputs": p, "parameters": {"max_new_tokens": 100}}).encode()
                    s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                              + body)
                    s.recv(256)
                    s.close()
                    results[i] = True
                else:
                    st, js, _, _ = req(port, "POST", "/generate", raw=b'{"inputs": 1}')
                    results[i] = st == 422
            except Exception as e:  # noqa: BLE001
                print("load:", k, e)
                results[i] = False

    ts = [threading.Thread(target=worker) for _ in range(32)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad = [(i, kinds[i]) for i, r in enumerate(results) if not r]
    check(not bad, f"load: {len(bad)} of {n_total} requests failed: {bad[:10]}")
    check(wait_idle(port, 30), "load: requests still in flight at the end")
    end_rss = server.rss_kib()
    print(f"load: {n_total} requests in {time.time() - t0:.1f} s; RSS {base_rss} KiB -> {end_rss} KiB", flush=True)
    return base_rss, end_rss


def sigterm_test(cllm, model):
    s = Server(cllm, model, "--model-id", "tiny")
    res = {}

    def long_req():
        res["r"] = req(s.port, "POST", "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 60}})

    t = threading.Thread(target=long_req)
    t.start()
    time.sleep(0.3)
    rc = s.stop(signal.SIGTERM)
    t.join()
    check(rc == 0, f"SIGTERM exit code {rc}: {''.join(s.log)[-500:]}")
    check(res.get("r") and res["r"][0] == 200 and res["r"][1]["generated_text"] is not None,
          f"in-flight request at SIGTERM: {res.get('r', [None])[0]}")


def second_signal_test(cllm, long_model):
    """A second SIGTERM during the drain takes the default action: the process ends at once, killed by the
    signal, while a long streamed request is still being generated."""
    s = Server(cllm, long_model, "--model-id", "tiny", "--max-total-tokens", "4096")
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", "/generate_stream", body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 4000}}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = r.readline()  # the first token's event: generation is under way
    s.p.send_signal(signal.SIGTERM)
    deadline = time.time() + 30
    while time.time() < deadline and not any("finishing the requests in flight" in line for line in s.log):
        time.sleep(0.005)
    draining = s.p.poll() is None and any("finishing the requests in flight" in line for line in s.log)
    check(first.startswith(b"data:") and draining,
          f"first SIGTERM: a drain under way ({first[:80]!r}, exit {s.p.poll()}, log {''.join(s.log)[-300:]})")
    rc = s.stop(signal.SIGTERM, timeout=30)
    check(rc == -signal.SIGTERM, f"second SIGTERM during the drain: exit {rc} (expected {-signal.SIGTERM})")
    c.close()


def trained_folders(cllm, tmp):
    """A model trained here on conversation records is served from its output folder, its checkpoint folder
    and its run folder (the `latest` checkpoint), and answers chat requests in the format it was trained on."""
    data = os.path.join(tmp, "conv.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(8):
            f.write(json.dumps({"type": "conversation", "rounds": [["ask", f"Is {i} even?"],
                                                                   ["ans", "Yes." if i % 2 == 0 else "No."]]}) + "\n")
    run_dir = os.path.join(tmp, "run")
    r = subprocess.run([cllm, "train", "--model", os.path.join(tmp, "model"), "--data", data, "--out", run_dir,
                        "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--save-interval", "1",
                        "--sync-save", "--log", "quiet"], capture_output=True)
    if not check(r.returncode == 0, f"cllm train: {r.stderr[-500:]}"):
        return
    msgs = [{"role": "user", "content": "Is 7 even?"}]
    rendered = "### Human:\nIs 7 even?\n\n### Assistant:\n"  # the conversation format of docs/data.md (GPT-2: no BOS)
    answers = []
    for folder in (run_dir, os.path.join(run_dir, "checkpoint-2")):
        s = Server(cllm, folder)
        try:
            chat = req(s.port, "POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 6,
                                                                 "temperature": 0})[1]
            comp = req(s.port, "POST", "/v1/completions", {"model": "m", "prompt": rendered, "max_tokens": 6,
                                                           "temperature": 0})[1]
            check(chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"] and
                  chat["usage"]["prompt_tokens"] == comp["usage"]["prompt_tokens"],
                  f"{folder}: the chat prompt is not the trained format: {chat} vs {comp}")
            answers.append(comp["choices"][0]["text"])
        finally:
            rc = s.stop()
            check(rc == 0, f"trained folder (checkpoint): exit {rc}, log: {''.join(s.log)[-600:]}")
    # the run folder's final model is the step-2 checkpoint's
    check(len(answers) == 2 and answers[0] == answers[1], f"run folder vs checkpoint-2: {answers}")
    # a folder without a config but with a `latest` pointer: the newest checkpoint
    os.rename(os.path.join(run_dir, "config.json"), os.path.join(run_dir, "config.json.off"))
    s = Server(cllm, run_dir)
    try:
        comp = req(s.port, "POST", "/v1/completions", {"model": "m", "prompt": rendered, "max_tokens": 6,
                                                       "temperature": 0})[1]
        check(comp["choices"][0]["text"] == answers[0], "run folder through `latest`")
    finally:
        rc = s.stop()
        check(rc == 0, f"trained folder (latest): exit {rc}, log: {''.join(s.log)[-600:]}")


def auth_and_overload(cllm, model):
    s = Server(cllm, model, "--api-key", "s3cret", "--max-concurrent-requests", "2", "--max-batch-size", "2")
    p = s.port
    check(req(p, "GET", "/health")[0] == 200, "/health without a key")
    for path, method in (("/info", "GET"), ("/metrics", "GET"), ("/v1/models", "GET"), ("/generate", "POST"),
                         ("/v1/chat/completions", "POST")):
        st = req(p, method, path, {"inputs": "x"})[0]
        check(st == 401, f"{method} {path} without a key: {st}")
    st = req(p, "GET", "/info", headers={"Authorization": "Bearer wrong"})[0]
    check(st == 401, "wrong key")
    h = {"Authorization": "Bearer s3cret"}
    check(req(p, "GET", "/info", headers=h)[0] == 200, "right key")
    codes = []
    lk = threading.Lock()

    def one():
        st = req(p, "POST", "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 40}}, headers=h)[0]
        with lk:
            codes.append(st)
    ts = [threading.Thread(target=one) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(codes.count(429) >= 1 and codes.count(200) >= 2 and set(codes) <= {200, 429}, f"overload codes {codes}")
    st, js, _, _ = req(p, "POST", "/generate", {"inputs": "x"}, headers=h)
    check(st == 200, f"served again after the burst: {st} {js}")
    rc = s.stop()
    check(rc == 0, f"auth and overload: exit {rc}, log: {''.join(s.log)[-600:]}")


def startup_errors(cllm, model):
    """Bad flags and pools that cannot fit: a message naming the flag, a non-zero exit, never a listening server."""
    cases = [(["--port", "70000"], "--port must be in [0, 65535]"),
             (["--max-total-tokens", "100000"], "exceeds the model's 256 positions"),
             (["--kv-cache-tokens", "64", "--max-total-tokens", "128"], "exceeds --kv-cache-tokens 64"),
             (["--max-input-tokens", "200", "--max-total-tokens", "100"], "--max-input-tokens 200 must be below"),
             (["--kv-cache-tokens", "1000000000"], "lower --kv-cache-tokens"),  # terabytes of pool
             (["--kv-cache-tokens", "2000000000"], "--kv-cache-tokens 2000000000 is above the limit"),
             (["--kv-cache-tokens", "-5"], "must be >= 0"),
             (["--host", "not-an-ip"], "--host 'not-an-ip'"),
             (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype must be auto, fp32 or bf16"),
             (["--no-such-flag"], "--no-such-flag")]
    for extra, want in cases:
        port = [] if "--port" in extra else ["--port", "0"]
        r = subprocess.run([cllm, "serve", "--model", model, *port, *extra], capture_output=True, timeout=120)
        err = r.stderr.decode(errors="replace")
        check(r.returncode != 0 and want in err and "listening on" not in err,
              f"serve {extra}: rc {r.returncode}, expected '{want}' in: {err[-400:]}")
    r = subprocess.run([cllm, "serve", "--model", model + "-missing", "--port", "0"], capture_output=True, timeout=60)
    err = r.stderr.decode(errors="replace")
    check(r.returncode != 0 and model + "-missing" in err, f"missing model folder: {r.returncode} {err[-400:]}")
    # the pool is resident from start-up: no step later waits for its pages
    s = Server(cllm, model, "--kv-cache-tokens", "65536")
    try:
        line = "".join(s.log)
        m = re.search(r"KV cache pool (\d+) tokens \(([0-9.]+) MiB, (\w+)\)", line)
        check(m is not None and int(m.group(1)) == 65536 and m.group(3) == "fp32", f"pool line: {line[-300:]}")
        if m:
            rss = s.status_kib("VmRSS") / 1024.0
            check(rss >= float(m.group(2)), f"resident {rss:.1f} MiB < the {m.group(2)} MiB pool at start-up")
    finally:
        rc = s.stop()
        check(rc == 0, f"pool-resident server: exit {rc}, log: {''.join(s.log)[-600:]}")
    # SIGTERM the moment the server says it is ready: a drain and exit 0, whichever thread takes the signal
    for i in range(4):
        s = Server(cllm, model)
        if i == 0:
            takers = signal_util.stop_signal_takers(s.p.pid)
            check([t[1] for t in takers] == ["cllm-signals"],
                  f"only the signal thread takes SIGINT/SIGTERM (pid {s.p.pid}): {takers}")
        rc = s.stop()
        check(rc == 0, f"SIGTERM right after ready (try {i}): exit {rc}, log: {''.join(s.log)[-600:]}")


def client_tests(build, port):
    d = npm_clients.install(build)
    if d is None:
        print("skipped: node/npm not installed; the npm client tests did not run")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copyfile(os.path.join(here, "serve_clients.mjs"), os.path.join(d, "serve_clients.mjs"))
    r = subprocess.run(["node", "serve_clients.mjs", f"http://127.0.0.1:{port}"], cwd=d, capture_output=True,
                       timeout=300)
    sys.stdout.write(r.stdout.decode(errors="replace"))
    check(r.returncode == 0, "npm clients: " + r.stderr.decode(errors="replace")[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--load", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(a.cllm, a.fixtures, tmp)
        srv = Server(a.cllm, model, "--model-id", "tiny", "--max-concurrent-requests", "6", "--max-batch-size", "4",
                     "--timeout", "3")
        try:
            tgi_tests(a.cllm, model, srv.port)
            openai_tests(a.cllm, model, srv.port)
            bad_input_tests(srv.port)
            hostile_tests(srv.port)
        finally:
            check(srv.stop() == 0, "exit code after SIGTERM")
        # a roomier server for batching, clients and load
        srv = Server(a.cllm, model, "--model-id", "tiny", "--max-batch-size", "16", "--max-concurrent-requests", "64")
        try:
            batching_test(srv.port)
            client_tests(a.build, srv.port)
            load_test(srv.port, srv, a.load // 2)  # warm-up: allocator and thread pools reach their steady state
            base, end = load_test(srv.port, srv, a.load)
            check(end <= base * 1.10 + 8192, f"resident memory grew from {base} KiB to {end} KiB over the load test")
        finally:
            check(srv.stop() == 0, "exit code after SIGTERM")
        kv_dtype_test(a.cllm, model)
        sigterm_test(a.cllm, model)
        second_signal_test(a.cllm, make_model(a.cllm, a.fixtures, tmp, positions=4096, name="model4k"))
        trained_folders(a.cllm, tmp)
        auth_and_overload(a.cllm, model)
        startup_errors(a.cllm, model)
    print("serve test:", "FAILED" if failures else "ok", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
