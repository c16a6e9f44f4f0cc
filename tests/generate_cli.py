"""The `cllm generate` command end to end (label: generate, cli).

  - streamed text with a real tokenizer (a tiny GPT-2 with the 50257-token
    fixture tokenizer): stdout is valid UTF-8 and equals the decode of the
    same run's ids (--output ids, decoded with cllm detokenize)
  - seeds: same seed, same text; another seed, another text
  - EOS: with eos_token_id set to a token greedy decoding produces, output
    stops right before it and the summary says so
  - the model's position limit: generation stops there; a longer prompt is
    an error naming the limit
  - usage errors exit 2, runtime errors exit 1, each with a clear message
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    cllm = args.cllm

    with tempfile.TemporaryDirectory() as tmp:
        # ---- tiny model with the real GPT-2 tokenizer
        tm = os.path.join(tmp, "tok-model")
        r = run([cllm, "init", "--arch", "gpt2", "--out", tm, "--seed", "1", "--set", "vocab_size=50257",
                 "n_positions=128", "bos_token_id=50256", "eos_token_id=50256"])
        check(r.returncode == 0, f"init: {r.stderr}")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.fixtures, "gpt2", f), tm)
        texts = {}
        for seed in (1, 2, 3):
            base = [cllm, "generate", "--model", tm, "--prompt", "Hello, wörld", "--max-new-tokens", "40",
                    "--seed", str(seed), "--ignore-eos"]
            r = run(base)
            check(r.returncode == 0, f"generate seed {seed}: {r.stderr}")
            try:
                text = r.stdout.decode("utf-8", errors="strict")
            except UnicodeDecodeError as e:
                check(False, f"seed {seed}: stdout is not valid UTF-8: {e}")
                continue
            check(b"tok/s" in r.stderr and b"generated 40 tokens" in r.stderr, f"summary: {r.stderr!r}")
            texts[seed] = text
            ids = run(base + ["--output", "ids"])
            check(ids.returncode == 0, f"--output ids: {ids.stderr}")
            id_list = [int(t) for t in ids.stdout.split()]
            check(len(id_list) == 40, f"seed {seed}: {len(id_list)} ids")
            dec = run([cllm, "detokenize", "--tokenizer", tm, "--skip-special"], input=json.dumps(id_list).encode())
            check(dec.returncode == 0, f"detokenize: {dec.stderr}")
            check(dec.stdout == r.stdout, f"seed {seed}: streamed text {r.stdout!r} != decode of its ids {dec.stdout!r}")
        check(len(set(texts.values())) == len(texts), "different seeds gave the same text")
        again = run([cllm, "generate", "--model", tm, "--prompt", "Hello, wörld", "--max-new-tokens", "40",
                     "--seed", "1", "--ignore-eos"])
        check(again.stdout.decode("utf-8", "replace") == texts.get(1), "same seed, different text")
        # the tokenizer folder can be given separately
        bare = os.path.join(tmp, "bare")
        shutil.copytree(tm, bare)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(bare, f))
        r = run([cllm, "generate", "--model", bare, "--tokenizer", tm, "--prompt", "Hi", "--max-new-tokens", "3",
                 "--greedy"])
        check(r.returncode == 0 and r.stdout, f"--tokenizer DIR: {r.returncode} {r.stderr}")
        r = run([cllm, "generate", "--model", bare, "--prompt", "Hi"])
        check(r.returncode == 1 and b"tokenizer.json" in r.stderr, f"no tokenizer: {r.returncode} {r.stderr}")

        # ---- EOS from config.json on a model without tokenizer
        m = os.path.join(tmp, "gpt2")
        run([cllm, "init", "--arch", "gpt2", "--out", m, "--seed", "2", "--set", "n_positions=16",
             "initializer_range=0.15"])
        prompt = "1,2,3,4,5"
        r = run([cllm, "generate", "--model", m, "--prompt-ids", prompt, "--greedy", "--ignore-eos",
                 "--max-new-tokens", "8"])
        check(r.returncode == 0, f"ids generate: {r.stderr}")
        gen = [int(t) for t in r.stdout.split()]
        check(len(gen) == 8, f"expected 8 ids: {gen}")
        k = next((i for i in range(1, len(gen)) if gen[i] not in gen[:i]), None)
        check(k is not None, f"no new token to use as EOS in {gen}")
        if k is not None:
            cfg_path = os.path.join(m, "config.json")
            with open(cfg_path) as f:
                cfg = json.load(f)
            cfg["eos_token_id"] = gen[k]
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            r = run([cllm, "generate", "--model", m, "--prompt-ids", prompt, "--greedy", "--max-new-tokens", "8"])
            got = [int(t) for t in r.stdout.split()]
            check(r.returncode == 0 and got == gen[:k], f"EOS stop: {got} vs {gen[:k]}")
            check(b"stop: eos" in r.stderr, f"EOS summary: {r.stderr!r}")

        # ---- position limit (n_positions = 16)
        ten = ",".join(str(i) for i in range(1, 11))
        r = run([cllm, "generate", "--model", m, "--prompt-ids", ten, "--greedy", "--ignore-eos",
                 "--max-new-tokens", "20"])
        got = r.stdout.split()
        check(r.returncode == 0 and len(got) == 7, f"limit: {len(got)} tokens, rc {r.returncode} {r.stderr!r}")
        check(b"limit of 16" in r.stderr, f"limit message: {r.stderr!r}")
        long = ",".join(str(i) for i in range(1, 18))
        r = run([cllm, "generate", "--model", m, "--prompt-ids", long])
        check(r.returncode == 1 and b"16" in r.stderr, f"prompt over the limit: {r.returncode} {r.stderr!r}")

        # ---- errors
        usage = [
            [],
            ["--prompt-ids", "1"],
            ["--model", m],
            ["--model", m, "--prompt", "a", "--prompt-ids", "1"],
            ["--model", m, "--prompt-ids", "1,x"],
            ["--model", m, "--prompt-ids", "1,"],
            ["--model", m, "--prompt-ids", ""],
            ["--model", m, "--prompt-ids", "1", "--top-p", "1.5"],
            ["--model", m, "--prompt-ids", "1", "--top-p", "0"],
            ["--model", m, "--prompt-ids", "1", "--temperature", "-1"],
            ["--model", m, "--prompt-ids", "1", "--top-k", "-3"],
            ["--model", m, "--prompt-ids", "1", "--repetition-penalty", "0"],
            ["--model", m, "--prompt-ids", "1", "--max-new-tokens", "-1"],
            ["--model", m, "--prompt-ids", "1", "--max-new-tokens", "12x"],
            ["--model", m, "--prompt-ids", "1", "--output", "json"],
            ["--model", m, "--prompt-ids", "1", "--kv-cache-dtype", "fp8"],
            ["--model", m, "--prompt-ids", "1", "--bogus"],
        ]
        for a in usage:
            r = run([cllm, "generate"] + a)
            check(r.returncode == 2 and r.stderr.strip(), f"usage error {a}: rc {r.returncode} {r.stderr!r}")
        runtime = [
            (["--model", m, "--prompt", "hello"], b"tokenizer"),
            (["--model", m, "--prompt-ids", "1,600"], b"600"),
            (["--model", m, "--prompt-ids", "-1"], b"-1"),
            (["--model", os.path.join(tmp, "missing"), "--prompt-ids", "1"], b"missing"),
            (["--model", m, "--prompt-ids", "1", "--output", "text"], b"tokenizer"),
            (["--model", m, "--prompt-ids", "1", "--tokenizer", os.path.join(tmp, "nowhere")], b"nowhere"),
        ]
        for a, needle in runtime:
            r = run([cllm, "generate"] + a)
            check(r.returncode == 1 and needle in r.stderr, f"runtime error {a}: rc {r.returncode} {r.stderr!r}")
        r = run([cllm, "generate", "--help"])
        check(r.returncode == 0 and b"--top-p" in r.stdout, "help")
        # max-new-tokens 0 runs the prompt and prints nothing
        r = run([cllm, "generate", "--model", m, "--prompt-ids", "1,2", "--max-new-tokens", "0"])
        check(r.returncode == 0 and r.stdout == b"", f"zero new tokens: {r.returncode} {r.stdout!r}")
        # sampling flags together, llama and bloom
        for arch in ("llama", "bloom"):
            d = os.path.join(tmp, arch)
            run([cllm, "init", "--arch", arch, "--out", d])
            r = run([cllm, "generate", "--model", d, "--prompt-ids", "1,2,3", "--temperature", "0.8", "--top-k", "20",
                     "--top-p", "0.9", "--repetition-penalty", "1.3", "--seed", "7", "--max-new-tokens", "10",
                     "--ignore-eos"])
            check(r.returncode == 0 and len(r.stdout.split()) == 10, f"{arch} sampling: {r.stderr!r}")

    print("FAILED" if failures else "OK", f"({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
