#!/usr/bin/python3
"""PyTorch reference for the bitsandbytes formats of a QLoRA base (cllm/quant.h).

Written here from bitsandbytes' definitions, independently of cllm's C:
  - nf4 / fp4: the flattened matrix in blocks of 64, absmax a per block, the
    values times the fp32 reciprocal 1/a, nf4 coded by the midpoints of its
    code book (strictly above: the upper code), fp4 by bitsandbytes'
    thresholds on |x| with the sign in bit 3; two codes a byte, first value in
    the high nibble; value = code * a;
  - double quantization: offset = mean of the absmax values (float64 mean,
    rounded to fp32), a - offset in blocks of 256 coded in the signed dynamic
    map (create_dynamic_map's formula in float64, rounded to fp32) with
    bitsandbytes' halving search; a' = map[q] * absmax2 + offset;
  - int8 (LLM.int8() weights): per row s = max|x|, q = round-half-even(x *
    (127 / s)), value = (q * s) * fp32(1/127).
Writes each case (input, expected codes, absmax values and dequantized
matrix) with manifest.txt into a temporary directory and runs
<build>/test_bnb on it: the C side must reproduce every byte and every
dequantized value bit for bit, and its code tables must equal these.

Manifest lines: "bnb <name> <type> <dq> <rows> <cols>"; files <name>.W,
.codes, .absmax (fp32; int8 and 4-bit without dq), .qabsmax, .absmax2,
.offset (dq), .deq; tables nf4.code, fp4.code, dynamic.map.

Run as: bnb_ref.py --cllm <bin> --build <builddir> [--keep]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

torch.manual_seed(2024)
F32 = torch.float32

NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0], dtype=F32)
FP4 = torch.tensor([0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0],
                   dtype=F32) / 12.0


def dynamic_map():
    vals = []
    for i in range(7):
        b = torch.linspace(0.1, 1.0, 2 ** i + 1, dtype=torch.float64)
        means = (b[:-1] + b[1:]) / 2.0
        vals += (10.0 ** (i - 6) * means).tolist() + (-(10.0 ** (i - 6)) * means).tolist()
    vals += [0.0, 1.0]
    return torch.tensor(sorted(vals), dtype=torch.float64).to(F32)


DYN = dynamic_map()


def f32(v):
    return torch.tensor(v, dtype=F32)


def code_nf4(y):
    mids = ((NF4[:-1].double() + NF4[1:].double()) / 2.0).to(F32)
    return (y.unsqueeze(-1) > mids).sum(-1).to(torch.uint8)


def code_fp4(y):
    a = y.abs()
    w = torch.where
    c = w(a > f32(0.29166667),
          w(a > f32(0.583333), w(a > f32(0.8333333), 3, 2), w(a > f32(0.4166667), 5, 4)),
          w(a > f32(0.0859375), w(a > f32(0.20833333), 7, 6), w(a > f32(0.00260417), 1, 0)))
    return (c + (y < 0).to(c.dtype) * 8).to(torch.uint8)


def code_dyn(y):
    """bitsandbytes' search of the dynamic map (7 halving steps from 127)."""
    pivot = torch.full(y.shape, 127, dtype=torch.long)
    hi = torch.full(y.shape, 255, dtype=torch.long)
    lo = torch.zeros(y.shape, dtype=torch.long)
    above = torch.ones(y.shape, dtype=F32)
    below = -torch.ones(y.shape, dtype=F32)
    val = DYN[pivot]
    step = 64
    while step > 0:
        gt = y > val
        lo = torch.where(gt, pivot, lo)
        below = torch.where(gt, val, below)
        hi = torch.where(gt, hi, pivot)
        above = torch.where(gt, above, val)
        pivot = torch.where(gt, pivot + step, pivot - step)
        val = DYN[pivot]
        step //= 2
    above = torch.where(hi == 255, DYN[255], above)
    below = torch.where(lo == 0, DYN[0], below)
    gt = y > val
    up = torch.where(y > (above + val) * f32(0.5), hi, pivot)
    down = torch.where(y < (below + val) * f32(0.5), lo, pivot)
    return torch.where(gt, up, down).to(torch.uint8)


def blocks(x, bs):
    n = x.numel()
    nb = (n + bs - 1) // bs
    p = torch.zeros(nb * bs, dtype=F32)
    p[:n] = x
    return p.view(nb, bs)


def quant4(W, kind, dq):
    x = W.flatten()
    n = x.numel()
    B = blocks(x, 64)
    absmax = B.abs().amax(1)
    y = B * (f32(1.0) / absmax).unsqueeze(1)
    codes = (code_nf4(y) if kind == "nf4" else code_fp4(y)).flatten()
    packed = ((codes[0::2] << 4) | codes[1::2])[: (n + 1) // 2]
    out = {"codes": packed}
    book = NF4 if kind == "nf4" else FP4
    if dq:
        offset = absmax.double().mean().to(F32)
        centred = absmax - offset
        B2 = blocks(centred, 256)
        absmax2 = B2.abs().amax(1)
        q = code_dyn(B2 * (f32(1.0) / absmax2).unsqueeze(1)).flatten()[: absmax.numel()]
        a = DYN[q.long()] * absmax2.repeat_interleave(256)[: absmax.numel()]
        a = a + offset
        out.update(qabsmax=q, absmax2=absmax2, offset=offset.reshape(1))
    else:
        a = absmax
        out["absmax"] = absmax
    deq = (book[codes.long()].view(-1, 64) * a.unsqueeze(1)).flatten()[:n]
    out["deq"] = deq.view(W.shape)
    return out


def quant8(W):
    s = W.abs().amax(1)
    scale = f32(127.0) / s
    q = torch.round(W * scale.unsqueeze(1))
    q = torch.nan_to_num(q, nan=0.0).to(torch.int8)
    deq = (q.to(F32) * s.unsqueeze(1)) * f32(7.874015718698502e-3)
    return {"codes": q.flatten(), "absmax": s, "deq": deq}


def dequant(kind, dq, W):
    """The matrix the C side computes with (for other tests)."""
    return quant8(W)["deq"] if kind == "int8" else quant4(W, kind, dq)["deq"]


def save(out, name, key, t):
    arr = t.detach().contiguous().numpy()
    arr.tofile(os.path.join(out, "%s.%s" % (name, key)))


def matrix(rows, cols, zero_block=False, outliers=False):
    W = torch.randn(rows, cols, dtype=F32) * 0.05
    if outliers:
        W.view(-1)[torch.randint(0, rows * cols, (5,))] *= 40.0
    if zero_block:
        W.view(-1)[64:128] = 0.0  # a whole 64-block of zeros
        if rows > 2:
            W[2] = 0.0  # a zero row (int8)
    return W


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="bnb_ref_")
    manifest = []
    shapes = [(16, 64, False, False), (33, 40, True, True), (7, 13, False, True), (96, 200, True, True),
              (300, 288, False, False)]
    for si, (rows, cols, zb, ol) in enumerate(shapes):
        W = matrix(rows, cols, zb, ol)
        for kind, dq in (("nf4", False), ("nf4", True), ("fp4", False), ("fp4", True), ("int8", False)):
            name = "m%d_%s%s" % (si, kind, "_dq" if dq else "")
            res = quant8(W) if kind == "int8" else quant4(W, kind, dq)
            save(out, name, "W", W)
            for k, v in res.items():
                save(out, name, k, v)
            manifest.append("bnb %s %s %d %d %d" % (name, kind, int(dq), rows, cols))
    save(out, "nf4", "code", NF4)
    save(out, "fp4", "code", FP4)
    save(out, "dynamic", "map", DYN)
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    exe = os.path.join(a.build, "tests", "test_bnb")
    r = subprocess.run([exe, out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(r.stdout)
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    else:
        print("kept", out)
    print("bnb_ref: %d cases, test_bnb exit %d" % (len(manifest), r.returncode))
    return 1 if r.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
