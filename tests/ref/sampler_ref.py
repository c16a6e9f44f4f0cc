#!/usr/bin/python3
"""PyTorch reference for the sampler's processors (include/cllm/generate.h).

For random logits, histories and parameter sets, computes from the
definitions the distribution a token is drawn from and the top-n
alternatives of the raw distribution, writes them with the inputs into a
fresh temporary directory, and runs <build>/test_sampler on it (the C side
compares; see tests/test_sampler.c for the file layout).

The definitions, in the order HF generate() and TGI apply them:
  logit bias (OpenAI):    l[id] += b, before anything else
  repetition penalty:     HF RepetitionPenaltyLogitsProcessor over the whole
                          history (prompt and generated)
  frequency / presence:   OpenAI: l[t] -= c[t] * f + (c[t] > 0) * p, c[t] the
                          count of t among the generated tokens only
  (greedy stops here: argmax, lowest id on ties)
  temperature, top-k:     HF warpers (top-k keeps ties with the k-th)
  top-p:                  the smallest most-probable prefix (lower id first on
                          ties) whose mass reaches top_p
  typical-p:              HF TypicalLogitsWarper: entropy H, scores
                          |-log p - H|, sorted ascending, cumulative mass,
                          keep up to the first position where it reaches
                          typical_p (and ties of its score), at least one token
The logits processors run on float32 scores as in HF; from the softmax on,
everything is float64.

Run as: sampler_ref.py --cllm <bin> --build <builddir> [--keep]
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

torch.manual_seed(20240607)


def f32(x):
    """The float32 value nearest x, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def reference(logits, hist, n_prompt, P):
    """Sampling distribution (float64 [V]) from the definitions."""
    V = logits.numel()
    l = logits.clone()  # float32
    for i, b in zip(P["bias_ids"], P["bias_vals"]):
        l[i] = l[i] + b
    r = P["rep"]
    if r != 1.0 and hist:
        idx = torch.tensor(sorted(set(hist)), dtype=torch.long)
        s = l[idx]
        l[idx] = torch.where(s < 0, s * r, s / r)
    f, p = P["freq"], P["pres"]
    if f != 0.0 or p != 0.0:
        counts = {}
        for t in hist[n_prompt:]:
            counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            l[t] = f32(float(l[t]) - c * f - p)
    if P["greedy"]:
        out = torch.zeros(V, dtype=torch.float64)
        out[int(torch.argmax(l))] = 1.0
        return out
    if P["temperature"] != 1.0:
        l = l / P["temperature"]
    k = P["top_k"]
    if 0 < k < V:
        kth = torch.topk(l, k).values[-1]
        l = l.masked_fill(l < kth, float("-inf"))
    prob = torch.softmax(l.double(), dim=-1)
    if P["top_p"] < 1.0:
        order = sorted(range(V), key=lambda i: (-float(prob[i]), i))
        cum, keep = 0.0, []
        for i in order:
            if prob[i] == 0:
                break
            keep.append(i)
            cum += float(prob[i])
            if cum >= P["top_p"]:
                break
        mask = torch.zeros(V, dtype=torch.bool)
        mask[torch.tensor(keep)] = True
        prob = torch.where(mask, prob, torch.zeros_like(prob))
        prob = prob / prob.sum()
    typ = P["typical"]
    if 0.0 < typ < 1.0:
        logp = torch.log(prob)  # -inf for removed tokens
        ent = -(logp * prob).nansum()
        score = torch.abs(-logp - ent)  # inf for removed tokens
        sorted_score, sorted_idx = torch.sort(score, stable=True)
        cum = prob[sorted_idx].cumsum(dim=-1)
        last = min(int((cum < typ).sum()), V - 1)
        remove_sorted = sorted_score > sorted_score[last]
        remove_sorted[0] = False
        remove = torch.zeros(V, dtype=torch.bool)
        remove[sorted_idx] = remove_sorted
        prob = prob.masked_fill(remove, 0.0)
        prob = prob / prob.sum()
    return prob


def top_n(logits, n):
    """torch.topk of log_softmax, ties by lower id (a stable sort)."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    lp32 = lp.float()
    _, order = torch.sort(lp32, descending=True, stable=True)
    ids = order[:n]
    vals = torch.topk(lp32, n).values if n else lp32[:0]
    assert torch.equal(lp32[ids], vals), "stable sort and topk disagree on the values"
    return ids, lp[ids]


def save(out, name, key, t, dtype):
    t.detach().contiguous().to(dtype).numpy().astype("<" + t.to(dtype).numpy().dtype.str[1:]).tofile(
        os.path.join(out, f"{name}.{key}"))


def pick(g, choices):
    return choices[int(torch.randint(len(choices), (1,), generator=g))]


def make_cases():
    g = torch.Generator().manual_seed(7)
    cases = []
    # Each processor alone, then random combinations.
    solo = [
        dict(typical=0.2), dict(typical=0.5), dict(typical=0.9), dict(typical=0.99),
        dict(freq=0.8), dict(freq=-1.5), dict(pres=1.2), dict(pres=-2.0), dict(freq=2.0, pres=2.0),
        dict(bias=True), dict(bias=True, greedy=True), dict(freq=1.0, pres=0.5, greedy=True),
    ]
    for i in range(44):
        P = dict(greedy=False, temperature=1.0, top_k=0, top_p=1.0, rep=1.0, typical=0.0, freq=0.0, pres=0.0,
                 bias=False)
        if i < len(solo):
            P.update(solo[i])
        else:
            P["greedy"] = pick(g, [False] * 7 + [True])
            P["temperature"] = pick(g, [1.0, 0.7, 1.3, 0.5])
            P["top_k"] = pick(g, [0, 0, 3, 10, 40])
            P["top_p"] = pick(g, [1.0, 1.0, 0.9, 0.6])
            P["rep"] = pick(g, [1.0, 1.0, 1.3, 0.8])
            P["typical"] = pick(g, [0.0, 1.0, 0.3, 0.7, 0.95])
            P["freq"] = pick(g, [0.0, 0.4, -0.7, 1.9])
            P["pres"] = pick(g, [0.0, 0.6, -1.1, 2.0])
            P["bias"] = pick(g, [False, True])
        V = pick(g, [8, 12, 50, 257, 1000, 5000]) if i >= 4 else [8, 50, 1000, 5000][i]
        scale = pick(g, [0.5, 1.0, 2.0, 3.0])
        logits = (torch.randn(V, generator=g) * scale).float()
        if i % 3 == 0:  # exact ties: some logits copied onto others
            src = torch.randint(V, (max(2, V // 4),), generator=g)
            dst = torch.randint(V, (max(2, V // 4),), generator=g)
            logits[dst] = logits[src]
        n_hist = int(torch.randint(0, 41, (1,), generator=g))
        pool = torch.randint(V, (max(1, min(V, 6)),), generator=g)  # few ids, so they repeat
        hist = [int(pool[int(torch.randint(len(pool), (1,), generator=g))]) if torch.rand(1, generator=g) < 0.8
                else int(torch.randint(V, (1,), generator=g)) for _ in range(n_hist)]
        n_prompt = int(torch.randint(0, n_hist + 1, (1,), generator=g))
        bias_ids, bias_vals = [], []
        if P.pop("bias"):
            nb = min(V, int(torch.randint(1, 6, (1,), generator=g)))
            bias_ids = torch.randperm(V, generator=g)[:nb].tolist()
            bias_vals = [f32(float(torch.empty(1).uniform_(-5, 5, generator=g))) for _ in range(nb)]
            if nb >= 3:
                bias_vals[0] = -100.0  # a ban
            if nb >= 4 and i % 2:
                bias_vals[1] = 100.0  # all but forced
        P = {k: (f32(v) if isinstance(v, float) else v) for k, v in P.items()}
        P["bias_ids"], P["bias_vals"] = bias_ids, bias_vals
        tn = min(V, pick(g, [0, 1, 5, 20]))
        draws = 100000 if V <= 12 and i % 2 == 0 else 0
        cases.append((f"case{i:02d}", logits, hist, n_prompt, P, tn, draws))
    # top-n with many exact ties: every logit one of three values
    V = 30
    logits = torch.tensor([float(i % 3) for i in range(V)], dtype=torch.float32)
    P = dict(greedy=False, temperature=1.0, top_k=0, top_p=1.0, rep=1.0, typical=f32(0.5), freq=0.0, pres=0.0,
             bias_ids=[], bias_vals=[])
    cases.append(("ties_top_n", logits, [], 0, P, 20, 0))
    # the prompt does not count for the OpenAI penalties: the same history
    # with n_prompt 0 and n_prompt = len gives different distributions
    logits = torch.randn(10, generator=g).float()
    hist = [1, 1, 2, 3, 3, 3]
    for n_prompt in (0, 3, 6):
        P = dict(greedy=False, temperature=1.0, top_k=0, top_p=1.0, rep=1.0, typical=0.0, freq=f32(0.9),
                 pres=f32(0.4), bias_ids=[], bias_vals=[])
        cases.append((f"prompt_len_{n_prompt}", logits, hist, n_prompt, P, 3, 0))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="cllm-sampler-")
    lines = []
    probs_by_name = {}
    for name, logits, hist, n_prompt, P, tn, draws in make_cases():
        probs = reference(logits, hist, n_prompt, P)
        assert abs(float(probs.sum()) - 1.0) < 1e-9 and probs.max() > 0
        probs_by_name[name] = probs
        ids, lps = top_n(logits, tn)
        save(out, name, "logits", logits, torch.float32)
        save(out, name, "hist", torch.tensor(hist, dtype=torch.int32), torch.int32)
        save(out, name, "bias_ids", torch.tensor(P["bias_ids"], dtype=torch.int32), torch.int32)
        save(out, name, "bias_vals", torch.tensor(P["bias_vals"], dtype=torch.float32), torch.float32)
        save(out, name, "probs", probs, torch.float64)
        save(out, name, "top_ids", ids.to(torch.int32), torch.int32)
        save(out, name, "top_lp", lps, torch.float64)
        lines.append(" ".join([name, str(logits.numel()), str(len(hist)), str(n_prompt), str(int(P["greedy"])),
                               repr(P["temperature"]), str(P["top_k"]), repr(P["top_p"]), repr(P["rep"]),
                               repr(P["typical"]), repr(P["freq"]), repr(P["pres"]), str(len(P["bias_ids"])),
                               str(tn), str(draws)]))
    # the reference itself must tell the prompt from the generated tokens
    a, b, c = (probs_by_name[f"prompt_len_{n}"] for n in (0, 3, 6))
    assert (a - b).abs().max() > 1e-3 and (b - c).abs().max() > 1e-3, "prompt-length cases do not differ"
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    exe = os.path.join(args.build, "tests", "test_sampler")
    rc = subprocess.run([exe, out]).returncode
    if args.keep:
        print("cases kept in", out)
    else:
        shutil.rmtree(out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
