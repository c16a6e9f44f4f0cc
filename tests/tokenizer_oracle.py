#!/usr/bin/env python3
"""Compare cllm's tokenizer with the transformers.js oracle on a generated corpus.

Two modes (both run by ctest, label `tokenizer`):

  --mode oracle  Installs the oracle (shared/tools: package.json + lock) into
                 <build>/oracle with `npm ci --ignore-scripts` (skipped, with a
                 "skipped" line and exit 0, only when npm is not installed),
                 generates a multilingual corpus, encodes every sample with and
                 without special tokens for gpt2, gpt2-xenova, tinyllama and
                 mistral with both the oracle and cllm, and requires identical
                 ids and identical decodings (special tokens kept and skipped).
                 The library is driven through tokenizer_batch (one process per
                 model); the `cllm tokenize` / `cllm detokenize` commands are run
                 on a subset of samples and must agree too.
  --mode cli     Command-line behaviour without node: output format, raw
                 bytes in and out, exit codes and error messages.

Exit status: 0 all good, 1 any mismatch or failure.
"""
import argparse
import filecmp
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

MODELS = ["gpt2", "gpt2-xenova", "tinyllama-1.1b-chat-v1.0", "mistral-7b-v0.1"]
# Fixture copies with Unicode normalizers added (as Qwen2-style files carry
# NFC, and BERT-era files NFKC + Lowercase): same vocabularies, so the ids
# show whether normal forms and case mapping match HF's.
VARIANTS = {
    "gpt2-nfkc-lower": ("gpt2", [{"type": "NFKC"}, {"type": "Lowercase"}]),
    "gpt2-nfd": ("gpt2", [{"type": "NFD"}]),
    "tinyllama-nfc": ("tinyllama-1.1b-chat-v1.0", [{"type": "NFC"}]),
}
NORM_SAMPLES = ["Caf\u00e9 vs Cafe\u0301, \ufb01ne \uff26\uff55\uff4c\uff4c width \u2460 \u00b2",
                "\u03a3\u0391\u03a3 OD\u03a3 \u00c5ngstr\u00f6m \u1e0a\u0323 \uac00 \u212b Stra\u00dfe \u0130stanbul",
                "\u1100\u1161\u11a8 \u30ab\u3099 \u0041\u030a\u0301 \u33a1 \u2163 \u00bd"]


def model_root(fixtures, tmp):
    """A folder holding the fixture models (symlinks) and the variants."""
    root = os.path.join(tmp, "models")
    os.makedirs(root, exist_ok=True)
    for m in MODELS:
        os.symlink(os.path.join(fixtures, m), os.path.join(root, m))
    for name, (base, norms) in VARIANTS.items():
        d = os.path.join(root, name)
        os.makedirs(d)
        src = os.path.join(fixtures, base)
        with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        old = tok.get("normalizer")
        rest = [] if old is None else (old["normalizers"] if old.get("type") == "Sequence" else [old])
        tok["normalizer"] = {"type": "Sequence", "normalizers": norms + rest}
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
        for extra in ("tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(src, extra)):
                shutil.copy(os.path.join(src, extra), d)
    return root


def corpus(seed=1234):
    """Deterministic multilingual samples. U+0085 and U+FEFF are left out:
    JavaScript's \\s disagrees with the Rust/PCRE2 one on them (see the
    oracle's header); so is U+180E for the same reason."""
    fixed = [
        "", " ", "  ", "\n", "\t", "\r\n", "Hello world", " Hello world", "Hello  world ",
        "The quick brown fox jumps over the lazy dog.",
        "It's I'll we've DON'T they're she'd you'LL",
        "你好，世界！今天天气很好。我们去公园散步吧。",
        "日本語のテキストです。カタカナとひらがな、漢字を含みます。",
        "한국어 문장도 포함합니다.",
        "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
        "def f(x):\n    return x**2  # square\n\n\tif x: pass\r\n",
        "for (int i = 0; i < n; i++) { a[i] += b[i] * 3.14159; }",
        "digits 0 1 12 123 1234 12345 3.14159 2024-01-01 1,000,000 ١٢٣ ５６",
        "Cửa Việt Äpfel naïve café résumé Ωμέγα нещо на Български",
        "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก",
        "\u2028 line separator \u2029 para", "non\u00a0breaking\u3000ideographic",
        "<s>", "</s>", "<unk>", "<|endoftext|>", "<s>Hello</s>", "Hello <s> world </s> end",
        "text<|endoftext|>more<|endoftext|><|endoftext|>", " <s> ", "<s><s></s>", "<s", "</s ", "<|endoftext|",
        "\u2581already\u2581metaspace\u2581", "▁▁ ▁", "a" * 300, " " * 50 + "x", "x" + " " * 17,
        "\t\t\ttabs\t\tand  spaces \t mixed", "line1\nline2\n\n\nline5\r\nend\n", "\r\r\n\n\r",
        "ALLCAPS lowercase MiXeD", "email@example.com https://example.org/path?q=1&r=2#frag",
        "zero\u200bwidth\u200djoiner", "combining e\u0301 a\u0308 n\u0303",
        "\x00nul\x01ctrl\x7f", "¡¿«»—–…‘’“”", "₿ € £ ¥ ₹", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "\U0001F600" * 5,
    ]
    words = ["the", "of", "and", "tokenizer", "model", "training", "data", "Hello", "世界", "数据", "モデル",
             "学習", "😀", "🎉", "👍", "x", "foo_bar", "CamelCase", "snake_case", "123", "4567", "3.5",
             "don't", "it's", "we'll", "<s>", "</s>", "<|endoftext|>", "▁", "über", "naïve", "Привет",
             "(", ")", "{", "}", ";", ",", ".", "!", "?", "'", '"', "#", "//", "->", "==", "\\n"]
    seps = [" ", " ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "", " \t ", "      "]
    rng = random.Random(seed)
    samples = list(fixed)
    for _ in range(220):
        k = rng.randint(1, 25)
        s = ""
        for _ in range(k):
            s += rng.choice(words) + rng.choice(seps)
        if rng.random() < 0.3:
            s = rng.choice(seps) + s
        if rng.random() < 0.3:
            s = s.rstrip()
        samples.append(s)
    # random characters from common blocks (assigned, stable Unicode)
    blocks = [(0x20, 0x7E), (0xA1, 0x17F), (0x391, 0x3C9), (0x410, 0x44F), (0x4E00, 0x4FFF), (0x3041, 0x3096),
              (0x30A1, 0x30FA), (0xAC00, 0xAD00), (0x1F600, 0x1F64F), (0x2000, 0x200A), (0x0660, 0x0669)]
    for _ in range(60):
        n = rng.randint(1, 40)
        s = "".join(chr(rng.randint(*rng.choice(blocks))) for _ in range(n))
        samples.append(s)
    for s in samples:
        assert "\u0085" not in s and "\ufeff" not in s and "\u180e" not in s
    return samples


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, **kw)


def install_oracle(build, src):
    dst = os.path.join(build, "oracle")
    os.makedirs(dst, exist_ok=True)
    stamp_ok = (os.path.exists(os.path.join(dst, "node_modules", "@huggingface", "transformers", "package.json"))
                and os.path.exists(os.path.join(dst, "package-lock.json"))
                and filecmp.cmp(os.path.join(src, "package-lock.json"), os.path.join(dst, "package-lock.json"),
                                shallow=False))
    for f in os.listdir(src):
        p = os.path.join(src, f)
        if os.path.isfile(p):
            shutil.copyfile(p, os.path.join(dst, f))
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copyfile(os.path.join(here, "tokenizer_oracle_batch.mjs"), os.path.join(dst, "tokenizer_oracle_batch.mjs"))
    if not stamp_ok:
        print("installing the oracle: npm ci --ignore-scripts in", dst, flush=True)
        r = run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=dst,
                env=dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip"))
        if r.returncode != 0:
            sys.stderr.write(r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace"))
            raise SystemExit("npm ci failed")
    return dst


def show(s, n=80):
    r = repr(s)
    return r if len(r) <= n else r[:n] + "..."


def mode_oracle(a):
    if shutil.which("npm") is None or shutil.which("node") is None:
        print("skipped: npm/node is not installed, the oracle cannot run")
        return 0
    odir = install_oracle(a.build, a.oracle_tools)
    samples = corpus() + NORM_SAMPLES
    failures = 0
    models = MODELS + list(VARIANTS)
    with tempfile.TemporaryDirectory() as tmp:
        a.fixtures = model_root(a.fixtures, tmp)
        sfile = os.path.join(tmp, "samples.json")
        with open(sfile, "w", encoding="utf-8") as f:
            json.dump(samples, f, ensure_ascii=False)
        ofile = os.path.join(tmp, "oracle.json")
        r = run(["node", "tokenizer_oracle_batch.mjs", a.fixtures, sfile, ofile] + models, cwd=odir)
        if r.returncode != 0:
            sys.stderr.write(r.stderr.decode(errors="replace"))
            print("FAIL: the oracle did not run")
            return 1
        with open(ofile, encoding="utf-8") as f:
            oracle = json.load(f)

        def ours(m):
            out = os.path.join(tmp, m + ".json")
            rr = run([a.batch, os.path.join(a.fixtures, m), sfile, out])
            return m, rr, out

        with ThreadPoolExecutor(max_workers=2) as ex:
            results = list(ex.map(ours, models))
        for m, rr, out in results:
            if rr.returncode != 0:
                sys.stderr.write(rr.stderr.decode(errors="replace"))
                print(f"FAIL: tokenizer_batch {m} exited {rr.returncode}")
                failures += 1
                continue
            with open(out, encoding="utf-8") as f:
                mine = json.load(f)
            bad = 0
            for i, (o, c) in enumerate(zip(oracle[m], mine)):
                for key in ("ids", "ids_plain", "text", "text_skip", "text_plain"):
                    if o[key] != c[key]:
                        bad += 1
                        if bad <= 8:
                            print(f"MISMATCH {m} sample {i} {show(samples[i])} {key}:\n"
                                  f"  oracle {show(o[key], 300)}\n  cllm   {show(c[key], 300)}")
            n = len(samples)
            print(f"{m}: {n} samples x 5 checks, {5 * n - bad} agree, {bad} differ")
            failures += bad
        failures += cli_subset(a, samples, oracle, tmp)
    print("oracle comparison:", "OK" if failures == 0 else f"{failures} FAILURES")
    return 1 if failures else 0


def cli_subset(a, samples, oracle, tmp):
    """The commands themselves on some samples: ids and decoded bytes."""
    picks = [i for i, s in enumerate(samples) if s and ("<" in s or "\t" in s or "\n" in s)][:4] + [6, 12, 14]
    jobs = []
    for m in MODELS:
        for i in picks:
            jobs.append((m, i))

    def one(job):
        m, i = job
        errs = []
        inp = os.path.join(tmp, f"cli_{m}_{i}.txt")
        with open(inp, "wb") as f:
            f.write(samples[i].encode("utf-8"))
        tdir = os.path.join(a.fixtures, m)
        for flag, key in (([], "ids"), (["--no-special"], "ids_plain")):
            r = run([a.cllm, "tokenize", "--tokenizer", tdir, "--input", inp] + flag)
            got = json.loads(r.stdout) if r.returncode == 0 else None
            if r.returncode != 0 or got != {"ids": oracle[m][i][key]} or r.stdout.count(b"\n") != 1:
                errs.append(f"cllm tokenize {m} {flag} sample {i}: rc={r.returncode} {r.stdout[:200]!r} "
                            f"{r.stderr[:200]!r}")
        ids = os.path.join(tmp, f"cli_{m}_{i}.json")
        with open(ids, "w") as f:
            json.dump({"ids": oracle[m][i]["ids"]}, f)
        for flag, key in (([], "text"), (["--skip-special"], "text_skip")):
            r = run([a.cllm, "detokenize", "--tokenizer", tdir, "--input", ids] + flag)
            if r.returncode != 0 or r.stdout != oracle[m][i][key].encode("utf-8"):
                errs.append(f"cllm detokenize {m} {flag} sample {i}: rc={r.returncode} {r.stdout[:200]!r}")
        # stdin and a bare array
        r = run([a.cllm, "detokenize", "--tokenizer", tdir], input=json.dumps(oracle[m][i]["ids"]).encode())
        if r.returncode != 0 or r.stdout != oracle[m][i]["text"].encode("utf-8"):
            errs.append(f"cllm detokenize {m} (stdin) sample {i}: rc={r.returncode} {r.stdout[:200]!r}")
        return errs

    with ThreadPoolExecutor(max_workers=2) as ex:
        errs = [e for es in ex.map(one, jobs) for e in es]
    for e in errs[:10]:
        print("MISMATCH", e)
    print(f"cllm tokenize/detokenize commands: {len(jobs) * 5} runs, {len(errs)} differ")
    return len(errs)


def mode_cli(a):
    fails = []
    gpt2 = os.path.join(a.fixtures, "gpt2")
    tl = os.path.join(a.fixtures, "tinyllama-1.1b-chat-v1.0")

    def expect(cond, what):
        if not cond:
            fails.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "in.txt")
        with open(p, "wb") as f:
            f.write(b"Hello world\n")
        r = run([a.cllm, "tokenize", "--tokenizer", gpt2, "--input", p])
        expect(r.returncode == 0 and r.stdout == b'{"ids": [15496, 995, 198]}\n',
               f"tokenize keeps the trailing newline: {r.stdout!r}")
        r = run([a.cllm, "tokenize", "--tokenizer", tl, "--input", p, "--no-special"])
        expect(r.returncode == 0 and json.loads(r.stdout) == {"ids": [15043, 3186, 13]}, f"--no-special: {r.stdout!r}")
        with open(p, "wb") as f:
            f.write(b"bad \xff\xfe utf8 \xe4\xb8")
        r1 = run([a.cllm, "tokenize", "--tokenizer", gpt2, "--input", p])
        r2 = run([a.cllm, "tokenize", "--tokenizer", gpt2, "--input", p])
        expect(r1.returncode == 0 and r1.stdout == r2.stdout, "invalid UTF-8 input encodes deterministically")
        ids = json.loads(r1.stdout)["ids"]
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2], input=json.dumps(ids).encode())
        expect(r.returncode == 0 and r.stdout == "bad \ufffd\ufffd utf8 \ufffd".encode(),
               f"invalid bytes become U+FFFD: {r.stdout!r}")
        # errors
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2], input=b"[15496, 50257]")
        expect(r.returncode == 1 and b"50257" in r.stderr, f"out-of-range id: rc={r.returncode} {r.stderr!r}")
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2], input=b"[1, -4]")
        expect(r.returncode == 1 and b"-4" in r.stderr, f"negative id: rc={r.returncode} {r.stderr!r}")
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2], input=b"[1, 2.5]")
        expect(r.returncode == 1 and b"not an integer" in r.stderr, f"fractional id: {r.stderr!r}")
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            f.write("[1, 2,\n 3")
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2, "--input", bad])
        expect(r.returncode == 1 and bad.encode() in r.stderr, f"malformed ids JSON names the file: {r.stderr!r}")
        r = run([a.cllm, "tokenize", "--tokenizer", gpt2, "--input", os.path.join(tmp, "missing.txt")])
        expect(r.returncode == 1 and b"missing.txt" in r.stderr, f"missing input names the file: {r.stderr!r}")
        r = run([a.cllm, "tokenize", "--tokenizer", os.path.join(tmp, "nodir"), "--input", p])
        expect(r.returncode == 1 and b"nodir" in r.stderr, f"missing tokenizer names it: {r.stderr!r}")
        r = run([a.cllm, "tokenize", "--tokenizer", gpt2])
        expect(r.returncode == 2, f"missing --input is a usage error: rc={r.returncode}")
        r = run([a.cllm, "tokenize", "--tokenizer", gpt2, "--input", p, "--bogus"])
        expect(r.returncode == 2, f"unknown flag is a usage error: rc={r.returncode}")
        r = run([a.cllm, "detokenize", "--help"])
        expect(r.returncode == 0 and b"--skip-special" in r.stdout, "detokenize --help")
        r = run([a.cllm, "detokenize", "--tokenizer", gpt2], input=b"[]")
        expect(r.returncode == 0 and r.stdout == b"", "empty id list decodes to nothing")
    for f in fails:
        print("FAIL:", f)
    print(f"cli checks: {len(fails)} failed")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--batch", help="tokenizer_batch binary (oracle mode)")
    ap.add_argument("--oracle-tools", help="folder with tokenizer_oracle.mjs and its package-lock.json")
    ap.add_argument("--mode", choices=["oracle", "cli"], required=True)
    a = ap.parse_args()
    return mode_oracle(a) if a.mode == "oracle" else mode_cli(a)


if __name__ == "__main__":
    sys.exit(main())
