"""`cllm generate` with the TGI/OpenAI sampling flags (label: generate, cli).

On a tiny random GPT-2 written with `cllm init`, against a float64 PyTorch
forward of the same weights (tests/ref/hf_models.py), teacher-forced on the
tokens the command produced:
  - --top-n N: one JSON line per token on stderr whose N alternatives are
    the N largest of PyTorch's log_softmax (ids in order, values within
    1e-4), the greedy token being the first of them;
  - --frequency-penalty / --presence-penalty with --greedy: every token is
    the argmax of PyTorch's logits minus count * f + (count > 0) * p over
    the tokens generated before it (the prompt does not count);
  - --logit-bias ID=100 forces ID, ID=-100 bans the greedy choice;
  - --typical-p: sampled tokens whose sampling log-probability is at least
    their raw one (a truncated, renormalised distribution);
  - usage errors exit 2, a bias id outside the vocabulary or listed twice
    exits 1 naming it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg)


def run(cmd):
    return subprocess.run(cmd, capture_output=True)


def json_lines(stderr):
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    cllm = args.cllm
    with tempfile.TemporaryDirectory() as tmp:
        m = os.path.join(tmp, "gpt2")
        r = run([cllm, "init", "--arch", "gpt2", "--out", m, "--seed", "4", "--set", "n_positions=64",
                 "initializer_range=0.3"])
        check(r.returncode == 0, f"init: {r.stderr!r}")
        cfg, params = hm.load_hf_folder(m)
        params = {n: t.double() for n, t in params.items()}
        V = cfg["vocab_size"]
        prompt = [3, 1, 4, 1, 5]

        def ref_logits(ids):
            with torch.no_grad():
                return hm.forward(cfg, params, torch.tensor([ids]))[0, -1].double()

        def gen(*flags, n=8):
            r = run([cllm, "generate", "--model", m, "--prompt-ids", ",".join(map(str, prompt)), "--ignore-eos",
                     "--output", "ids", "--max-new-tokens", str(n)] + list(flags))
            check(r.returncode == 0, f"generate {flags}: {r.stderr!r}")
            return [int(t) for t in r.stdout.split()], r

        # ---- --top-n against PyTorch's log_softmax
        toks, r = gen("--greedy", "--top-n", "5")
        lines = json_lines(r.stderr)
        check(len(lines) == len(toks) == 8, f"top-n: {len(lines)} JSON lines for {len(toks)} tokens")
        worst = 0.0
        for t, (tok, line) in enumerate(zip(toks, lines)):
            lp = torch.log_softmax(ref_logits(prompt + toks[:t]), dim=-1)
            vals, ids = torch.topk(lp, 5)
            got_ids = [a for a, _ in line["top"]]
            check(line["token"] == tok and got_ids[0] == tok, f"step {t}: token {tok}, line {line}")
            check(got_ids == ids.tolist(), f"step {t}: alternatives {got_ids}, PyTorch {ids.tolist()}")
            worst = max(worst, max(abs(b - float(v)) for (_, b), v in zip(line["top"], vals)))
            check(abs(line["raw_logprob"] - line["top"][0][1]) < 1e-6, f"step {t}: raw_logprob {line}")
        check(worst < 1e-4, f"top-n log-probs differ from PyTorch by {worst}")
        print(f"top-n: {len(lines)} steps, max |dlogp| {worst:.2e}")

        # ---- OpenAI penalties with greedy: teacher-forced argmax in PyTorch
        F, P = 1.5, 0.7
        toks, r = gen("--greedy", "--frequency-penalty", str(F), "--presence-penalty", str(P), n=12)
        plain, _ = gen("--greedy", n=12)
        check(toks != plain, f"penalties changed nothing: {toks}")
        for t, tok in enumerate(toks):
            lg = ref_logits(prompt + toks[:t])
            for u in set(toks[:t]):
                c = toks[:t].count(u)
                lg[u] -= c * F + P
            best = int(torch.argmax(lg))
            check(tok == best or abs(float(lg[tok] - lg[best])) < 1e-4,
                  f"penalised greedy step {t}: {tok}, PyTorch {best} ({toks})")
        print(f"penalties: {toks} (plain greedy {plain})")

        # ---- logit bias
        forced = (plain[0] + 17) % V
        toks, _ = gen("--greedy", "--logit-bias", f"{forced}=100", n=5)
        check(toks == [forced] * 5, f"bias +100 on {forced}: {toks}")
        toks, _ = gen("--greedy", "--logit-bias", f"{plain[0]}=-100", f"{forced}=0.5", n=3)
        check(toks and toks[0] != plain[0], f"bias -100 on {plain[0]}: {toks}")

        # ---- typical-p: sampled, truncated and renormalised
        toks, r = gen("--typical-p", "0.6", "--seed", "3", "--top-n", "2", n=10)
        lines = json_lines(r.stderr)
        check(len(toks) == 10 and len(lines) == 10, f"typical-p: {toks}")
        for line in lines:
            check(line["logprob"] >= line["raw_logprob"] - 1e-6, f"typical-p log-probs: {line}")
        again, _ = gen("--typical-p", "0.6", "--seed", "3", n=10)
        check(again == toks, "typical-p: same seed, other tokens")

        # ---- errors
        base = ["--model", m, "--prompt-ids", "1,2"]
        for bad in (["--typical-p", "1.5"], ["--typical-p", "-0.1"], ["--frequency-penalty", "2.5"],
                    ["--presence-penalty", "-3"], ["--top-n", "21"], ["--top-n", "-1"], ["--logit-bias", "5"],
                    ["--logit-bias", "x=1"], ["--logit-bias", "5=101"], ["--logit-bias", "5=abc"],
                    ["--logit-bias", "=3"]):
            r = run([cllm, "generate"] + base + bad)
            check(r.returncode == 2 and r.stderr.strip(), f"usage error {bad}: rc {r.returncode} {r.stderr!r}")
        r = run([cllm, "generate"] + base + ["--logit-bias", f"{V + 5}=1"])
        check(r.returncode == 1 and str(V + 5).encode() in r.stderr, f"bias id outside: {r.returncode} {r.stderr!r}")
        r = run([cllm, "generate"] + base + ["--logit-bias", "7=1", "7=2"])
        check(r.returncode == 1 and b"twice" in r.stderr, f"bias id twice: {r.returncode} {r.stderr!r}")
        r = run([cllm, "generate", "--help"])
        check(all(f in r.stdout for f in (b"--typical-p", b"--logit-bias", b"--top-n", b"--presence-penalty")),
              "help lists the flags")

    print("FAILED" if failures else "OK", f"({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
