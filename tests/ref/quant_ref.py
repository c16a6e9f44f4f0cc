#!/usr/bin/python3
"""PyTorch reference for the weight formats and small-batch kernels (cllm/quant.h).

For each case draws an fp32 weight matrix W [rows, cols] (a few outliers, an
all-zero block, odd sizes), inputs x [M, cols] and a bias; computes with torch
  - the stored bytes of W in bf16 (round to nearest even), int8 (ggml Q8_0:
    d = max|x|/127, q = round half away from zero) and q4 (ggml Q4_0: d = m/-8
    with m the value of largest magnitude, q = min(15, trunc(x/d + 8.5))),
    zero-padded to a multiple of 32 values per row;
  - the output x . dequant(W)^T + bias in float64, where for int8 / q4 x is first
    quantized per block of 32 as the kernels do (fp32 scale max|x|/127, codes
    rounded half away from zero).
Writes them with manifest.txt into a temporary directory and runs
<build>/tests/test_quant on it: the C side must reproduce the bytes exactly and
the outputs to a tight tolerance through every kernel variant the CPU has and
through the prompt path (cllm_qgemm: panels of widened rows on oneDNN).

Manifest lines: "qmm <name> <fmt> <rows> <cols> <M> <in_out> <has_bias>".
Files: <name>.W (fp32 [rows, cols]), .x, .bias, .q (expected stored bytes, for
bf16 / int8 / q4), .y (expected output, fp32 of the float64 result).

Run as: quant_ref.py --cllm <bin> --build <builddir> [--keep]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

torch.manual_seed(4321)
OUT = None
MANIFEST = []


def save(name, key, t):
    arr = t.detach().contiguous().numpy()
    arr.astype(arr.dtype.newbyteorder("<")).tofile(os.path.join(OUT, f"{name}.{key}"))


def padded(W):
    rows, cols = W.shape
    nb = (cols + 31) // 32
    P = torch.zeros(rows, nb * 32, dtype=torch.float32)
    P[:, :cols] = W
    return P.view(rows, nb, 32)


def round_away(v):
    """roundf (half away from zero) of float32 values, exactly: trunc plus the
    exact fractional part compared with 0.5 (|v| + 0.5 can round up in fp32)."""
    t = torch.trunc(v)
    return t + torch.sign(v) * ((v - t).abs() >= 0.5).to(v.dtype)


def q8_act(x):
    """Activations [M, cols] quantized as the int8 / q4 kernels do: per block of 32,
    an fp32 scale max|x|/127 and codes round(x / d); returns the float64 values d * q."""
    M, cols = x.shape
    B = padded(x)
    d = B.abs().amax(dim=2, keepdim=True) / torch.tensor(127.0, dtype=torch.float32)
    inv = torch.where(d != 0, torch.tensor(1.0, dtype=torch.float32) / d, torch.zeros_like(d))
    q = round_away(B * inv)
    return (d.double() * q.double()).reshape(M, -1)[:, :cols]


def half_bytes(d):
    return d.to(torch.float16).view(torch.int16).to(torch.int32)


def q8_0(W):
    """(stored bytes [rows, nb*34] uint8, dequantized [rows, cols] float64)"""
    rows, cols = W.shape
    B = padded(W)
    amax = B.abs().amax(dim=2, keepdim=True)
    d = amax / torch.tensor(127.0, dtype=torch.float32)
    inv = torch.where(d != 0, torch.tensor(1.0, dtype=torch.float32) / d, torch.zeros_like(d))
    v = B * inv  # float32, as the C quantizer rounds
    q = round_away(v).to(torch.int32)
    h = half_bytes(d)
    stored = torch.cat([(h & 255).to(torch.uint8), ((h >> 8) & 255).to(torch.uint8), q.to(torch.int8).view(torch.uint8)],
                       dim=2)
    dq = d.to(torch.float16).double() * q.double()
    return stored.reshape(rows, -1), dq.reshape(rows, -1)[:, :cols]


def q4_0(W):
    rows, cols = W.shape
    B = padded(W)
    idx = B.abs().argmax(dim=2, keepdim=True)  # first index of the largest magnitude
    m = torch.gather(B, 2, idx)
    d = m / torch.tensor(-8.0, dtype=torch.float32)
    inv = torch.where(d != 0, torch.tensor(1.0, dtype=torch.float32) / d, torch.zeros_like(d))
    v = B * inv + torch.tensor(8.5, dtype=torch.float32)
    q = torch.clamp(torch.trunc(v), max=15).to(torch.int32)
    packed = (q[:, :, :16] | (q[:, :, 16:] << 4)).to(torch.uint8)
    h = half_bytes(d)
    stored = torch.cat([(h & 255).to(torch.uint8), ((h >> 8) & 255).to(torch.uint8), packed], dim=2)
    dq = d.to(torch.float16).double() * (q - 8).double()
    return stored.reshape(rows, -1), dq.reshape(rows, -1)[:, :cols]


def bf16(W):
    b = W.to(torch.bfloat16)
    return b.view(torch.int16).contiguous().view(torch.uint8).reshape(W.shape[0], -1), b.double()


def weights(rows, cols):
    W = torch.randn(rows, cols) * 0.05
    if rows * cols > 64:
        flat = W.view(-1)
        flat[torch.randint(0, flat.numel(), (max(1, flat.numel() // 500),))] *= 20  # outliers
        if cols >= 32:
            W[0, :32] = 0  # an all-zero block: scale 0
    return W.float()


def gen():
    # (2100, 40): more rows than one panel of cllm_qgemm's holds (two of 1056 and 1044)
    shapes = [(1, 1), (37, 101), (64, 96), (130, 768), (7, 8200), (200, 33), (2100, 40)]
    i = 0
    for (rows, cols) in shapes:
        W = weights(rows, cols)
        # 70 rows: a prompt (cllm_qgemm: one panel for 130 x 768, two for 2100 x 40)
        for M in (1, 3, 16, 17) + ((70,) if rows in (130, 2100) else ()):
            if rows * cols > 200000 and M > 3:
                continue
            x = torch.randn(M, cols).float()
            bias = (torch.randn(rows) * 0.1).float()
            forms = [("fp32", 0), ("fp32", 1), ("bf16", 0), ("int8", 0), ("q4", 0)]
            for fmt, in_out in forms:
                has_bias = (i % 2 == 0)
                name = f"q{i}"
                i += 1
                if fmt == "fp32":
                    stored, dq = None, W.double()
                else:
                    stored, dq = {"bf16": bf16, "int8": q8_0, "q4": q4_0}[fmt](W)
                xin = q8_act(x) if fmt in ("int8", "q4") else x.double()
                y = xin @ dq.t()
                if has_bias:
                    y = y + bias.double()
                MANIFEST.append(f"qmm {name} {fmt} {rows} {cols} {M} {in_out} {int(has_bias)}")
                save(name, "W", W)
                save(name, "x", x)
                save(name, "bias", bias)
                save(name, "y", y.float())
                if stored is not None:
                    save(name, "q", stored)


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    binary = os.path.join(args.build, "tests", "test_quant")
    if not os.access(binary, os.X_OK):
        print(f"quant_ref.py: {binary} not found; build the project first", file=sys.stderr)
        return 1
    OUT = tempfile.mkdtemp(prefix="cllm_quant_")
    try:
        gen()
        with open(os.path.join(OUT, "manifest.txt"), "w") as f:
            f.write("\n".join(MANIFEST) + "\n")
        print(f"quant_ref.py: {len(MANIFEST)} cases in {OUT}", flush=True)
        rc = subprocess.run([binary, OUT]).returncode
        if rc != 0:
            print(f"quant_ref.py: test_quant exited with {rc}", file=sys.stderr)
        return 1 if rc != 0 else 0
    finally:
        if args.keep:
            print(f"quant_ref.py: kept {OUT}")
        else:
            shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
