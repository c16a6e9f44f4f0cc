"""`cllm generate --stop` end to end (label: generate, cli).

A tiny GPT-2 with the real 50257-token GPT-2 tokenizer generates 40 sampled
tokens without stop strings; stop strings taken from that text must then cut
the same run's output right before their first occurrence (stdout is exactly
the prefix, the summary says "stop: stop sequence"), a stop string that never
occurs changes nothing, and the earliest of two stop strings wins. Usage
errors: an empty --stop (exit 2); --stop without a tokenizer (exit 1).
"""
import argparse
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
        tm = os.path.join(tmp, "tok-model")
        r = run([cllm, "init", "--arch", "gpt2", "--out", tm, "--seed", "1", "--set", "vocab_size=50257",
                 "n_positions=128", "bos_token_id=50256", "eos_token_id=50256"])
        check(r.returncode == 0, f"init: {r.stderr}")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.fixtures, "gpt2", f), tm)
        base = [cllm, "generate", "--model", tm, "--prompt", "Hello", "--max-new-tokens", "40", "--seed", "3",
                "--ignore-eos"]
        r = run(base)
        check(r.returncode == 0 and b"stop: max-new-tokens" in r.stderr, f"plain run: {r.stderr!r}")
        full = r.stdout.decode("utf-8")
        # a stop string from the middle of the text (whole characters)
        mid = len(full) // 2
        stop = full[mid:mid + 3]
        check(len(stop) == 3, f"text too short: {full!r}")
        want = full[:full.find(stop)]
        r = run(base + ["--stop", stop])
        check(r.returncode == 0, f"--stop: {r.stderr!r}")
        check(r.stdout.decode("utf-8") == want, f"--stop {stop!r}: {r.stdout!r}, expected {want!r}")
        check(b"stop: stop sequence" in r.stderr, f"--stop summary: {r.stderr!r}")
        # a stop string that never occurs
        r = run(base + ["--stop", full + "#never#"])
        check(r.returncode == 0 and r.stdout.decode("utf-8") == full, f"absent stop: {r.stdout!r}")
        check(b"stop: max-new-tokens" in r.stderr, f"absent stop summary: {r.stderr!r}")
        # two stop strings (one flag, two values; and the flag repeated): the earliest wins
        early = full[2:4]
        want2 = full[:min(full.find(early), full.find(stop))]
        for extra in (["--stop", stop, early], ["--stop", stop, "--stop", early]):
            r = run(base + extra)
            check(r.returncode == 0 and r.stdout.decode("utf-8") == want2, f"{extra}: {r.stdout!r} vs {want2!r}")
        # errors
        r = run(base + ["--stop", ""])
        check(r.returncode == 2 and b"--stop" in r.stderr, f"empty --stop: {r.returncode} {r.stderr!r}")
        m = os.path.join(tmp, "bare")
        run([cllm, "init", "--arch", "gpt2", "--out", m])
        r = run([cllm, "generate", "--model", m, "--prompt-ids", "1,2", "--stop", "x"])
        check(r.returncode == 1 and b"tokenizer" in r.stderr, f"--stop without a tokenizer: {r.returncode} {r.stderr!r}")
        r = run([cllm, "generate", "--help"])
        check(b"--stop" in r.stdout, "help lists --stop")

    print("FAILED" if failures else "OK", f"({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
