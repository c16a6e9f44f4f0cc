"""PyTorch reference for cllm's causal attention kernels and ALiBi slopes.

Builds random q, k, v in the three layouts cllm reads in place:
  gpt2   one fused [B,T,3C] buffer, columns Q | K | V   (rs=3C, hs=HS)
  bloom  one fused [B,T,NH,3,HS] buffer, per head q,k,v (rs=3C, hs=3HS)
  llama  separate q [B,T,NH*HS], k and v [B,T,NKV*HS]   (grouped-query)
computes out, lse and the gradient of every input buffer with plain float64
torch math (full score matrix, causal mask, softmax, autograd), adding ALiBi
the way HF BLOOM does (slope * key position), and writes them as raw
little-endian float32 files plus a manifest to a temporary directory. Then
runs `<build>/tests/test_attention --ref <dir>`, which compares the C kernels
with these files, and exits with its status. The directory is removed
afterwards. ALiBi slopes for several head counts go along too: HF's fp32
tensors and the same formula with float64 powers.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import torch


def hf_alibi_slopes(nh):
    """Slopes as HF BLOOM's build_alibi_tensor computes them: fp32 tensors."""
    p = 2 ** math.floor(math.log2(nh))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.int32))
    if p != nh:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32)
        n_rem = min(p, nh - p)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n_rem, 2, dtype=torch.int32))])
    return slopes


def exact_alibi_slopes(nh):
    """The same formula with HF's fp32-rounded bases but float64 powers: the
    value a correctly rounded fp32 pow would return. torch's own fp32 pow
    is off by one ulp for a few heads (e.g. NH=48, head 14)."""
    p = 2 ** math.floor(math.log2(nh))
    base = float(torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32))
    slopes = [base ** e for e in range(1, 1 + p)]
    if p != nh:
        extra = float(torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32))
        slopes += [extra ** e for e in range(1, 1 + 2 * min(p, nh - p), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


def write_f32(path, t):
    t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(path)


# (family, B, T, NH, NKV, HS, alibi, input std)
CASES = [
    ("gpt2", 2, 1, 12, 12, 64, False, 1.0),
    ("gpt2", 2, 67, 12, 12, 64, False, 1.0),
    ("gpt2", 1, 130, 3, 3, 64, True, 1.0),
    ("gpt2", 2, 7, 1, 1, 64, False, 2.0),
    ("gpt2", 1, 96, 3, 3, 16, True, 1.0),
    ("gpt2", 1, 130, 12, 12, 64, True, 1.0),
    ("bloom", 2, 67, 5, 5, 16, True, 3.0),
    ("bloom", 1, 130, 3, 3, 80, True, 1.0),
    ("bloom", 2, 7, 6, 6, 64, True, 1.0),
    ("bloom", 1, 130, 5, 5, 64, False, 2.0),
    ("bloom", 1, 1, 1, 1, 16, True, 1.0),
    ("llama", 2, 67, 6, 2, 80, False, 1.0),
    ("llama", 1, 130, 4, 1, 16, False, 3.0),
    ("llama", 2, 130, 6, 2, 64, True, 1.0),
    ("llama", 1, 7, 4, 1, 80, False, 1.0),
    ("llama", 1, 1, 6, 2, 16, False, 1.0),
]

SLOPE_HEADS = list(range(1, 21)) + [48, 112]


def make_case(d, idx, family, B, T, NH, NKV, HS, alibi, std, gen):
    name = f"c{idx}_{family}_B{B}_T{T}_NH{NH}_NKV{NKV}_HS{HS}_{'alibi' if alibi else 'plain'}"
    C = NH * HS
    if family == "llama":
        lens = [B * T * NH * HS, B * T * NKV * HS, B * T * NKV * HS]
        views = [(0, 0, NH * HS, HS), (1, 0, NKV * HS, HS), (2, 0, NKV * HS, HS)]
    elif family == "gpt2":
        lens = [B * T * 3 * C]
        views = [(0, 0, 3 * C, HS), (0, C, 3 * C, HS), (0, 2 * C, 3 * C, HS)]
    else:
        lens = [B * T * 3 * C]
        views = [(0, 0, 3 * C, 3 * HS), (0, HS, 3 * C, 3 * HS), (0, 2 * HS, 3 * C, 3 * HS)]
    bufs32 = [torch.randn(n, generator=gen) * std for n in lens]
    bufs = [b.to(torch.float64).requires_grad_(True) for b in bufs32]

    def gather(view, nh):
        # [B,nh,T,HS] from a strided view, the same addressing as the C side
        bi, off, rs, hs = view
        rows = bufs[bi].view(B * T, rs)
        cols = [rows[:, off + h * hs: off + h * hs + HS] for h in range(nh)]
        return torch.stack(cols, dim=1).view(B, T, nh, HS).permute(0, 2, 1, 3)

    q = gather(views[0], NH)
    k = gather(views[1], NKV).repeat_interleave(NH // NKV, dim=1)
    v = gather(views[2], NKV).repeat_interleave(NH // NKV, dim=1)
    scale = float(torch.tensor(1.0 / math.sqrt(HS), dtype=torch.float32))

    pos = torch.arange(T, dtype=torch.float64)
    slopes32 = hf_alibi_slopes(NH)
    slopes = slopes32.to(torch.float64).view(1, NH, 1, 1) if alibi else torch.zeros(1, NH, 1, 1, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    raw = scale * (q @ k.transpose(-1, -2))
    hf_scores = (raw + slopes * pos.view(1, 1, 1, T)).masked_fill(~causal, float("-inf"))
    p = torch.softmax(hf_scores, dim=-1)
    out = (p @ v).permute(0, 2, 1, 3).reshape(B, T, C)
    # lse in the contract's convention, bias slope * (s - t)
    rel = (pos.view(1, T) - pos.view(T, 1)).view(1, 1, T, T)
    lse = torch.logsumexp((raw + slopes * rel).masked_fill(~causal, float("-inf")), dim=-1)
    dout = torch.randn(B, T, C, generator=gen)
    out.backward(dout.to(torch.float64))

    for i, b in enumerate(bufs32):
        write_f32(os.path.join(d, f"{name}.in{i}"), b)
        write_f32(os.path.join(d, f"{name}.din{i}"), bufs[i].grad)
    write_f32(os.path.join(d, f"{name}.dout"), dout)
    write_f32(os.path.join(d, f"{name}.out"), out)
    write_f32(os.path.join(d, f"{name}.lse"), lse)
    write_f32(os.path.join(d, f"{name}.slopes"), slopes32)
    fields = [name, B, T, NH, NKV, HS, int(alibi), repr(scale), len(lens)] + lens + [0] * (3 - len(lens))
    for view in views:
        fields += list(view)
    return "case " + " ".join(str(f) for f in fields)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20240607)
    test_bin = os.path.join(args.build, "tests", "test_attention")
    with tempfile.TemporaryDirectory(prefix="cllm_attn_") as d:
        lines = [make_case(d, i, *c, gen) for i, c in enumerate(CASES)]
        for nh in SLOPE_HEADS:
            write_f32(os.path.join(d, f"slopes_{nh}"), hf_alibi_slopes(nh))
            exact_alibi_slopes(nh).numpy().astype("<f8").tofile(os.path.join(d, f"slopes_{nh}.f64"))
            lines.append(f"slopes {nh}")
        with open(os.path.join(d, "manifest.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([test_bin, "--ref", d])
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
