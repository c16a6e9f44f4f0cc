#!/usr/bin/python3
"""PyTorch reference for the fp32 kernels (include/cllm/kernels.h).

For each op and a few shapes (odd sizes included), draws random fp32 inputs
with torch, computes the forward outputs and, for a random upstream gradient,
every input gradient via autograd in float64. Everything is written as raw
little-endian float32/int32 files plus manifest.txt into a fresh temporary
directory; then <build>/tests/test_kernels is run on that directory and its
exit code is returned. The directory is removed afterwards.

Manifest: one case per line, "<op> <name> <params...>"; tensor t of case
<name> is the file "<name>.<t>" holding the raw values (the C side knows
which tensors are int32 and how many elements each has).

Run as: kernels_ref.py --cllm <bin> --build <builddir> [--keep]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_num_threads(2)

OUT = None  # output directory
MANIFEST = []


def save(name, key, t):
    t = t.detach().contiguous()
    if t.dtype in (torch.int32, torch.int64):
        arr = t.to(torch.int32).numpy()
    else:
        arr = t.to(torch.float32).numpy()
    arr.astype(arr.dtype.newbyteorder("<")).tofile(os.path.join(OUT, f"{name}.{key}"))


def case(op, name, *params):
    MANIFEST.append(" ".join([op, name] + [repr(p) if isinstance(p, float) else str(int(p))
                                           for p in params]))


def f32(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).float()


def leaf(t):
    """float64 autograd leaf holding exactly the float32 values of t."""
    return t.double().clone().requires_grad_(True)


def gen_matmul():
    i = 0
    for (M, N, K) in [(7, 37, 101), (64, 48, 96), (1, 5, 3)]:
        for ta in (0, 1):
            for tb in (0, 1):
                for beta in (0.0, 1.0):
                    alpha = 0.5 if (i % 3 == 2) else 1.0
                    name = f"mm{i}"
                    i += 1
                    A = f32(K, M) if ta else f32(M, K)
                    B = f32(N, K) if tb else f32(K, N)
                    C0 = f32(M, N)
                    opA = A.double().t() if ta else A.double()
                    opB = B.double().t() if tb else B.double()
                    C = alpha * (opA @ opB) + beta * C0.double()
                    case("matmul", name, M, N, K, ta, tb, alpha, beta)
                    save(name, "A", A)
                    save(name, "B", B)
                    save(name, "C0", C0)
                    save(name, "C", C)


def gen_linear():
    i = 0
    for (N, IN, OUT_) in [(7, 37, 29), (33, 64, 96)]:
        for w_in_out in (0, 1):
            for has_bias in (0, 1):
                name = f"lin{i}"
                i += 1
                inp = f32(N, IN)
                w = f32(IN, OUT_, scale=0.2) if w_in_out else f32(OUT_, IN, scale=0.2)
                b = f32(OUT_)
                x, W, bb = leaf(inp), leaf(w), leaf(b)
                out = x @ (W if w_in_out else W.t())
                if has_bias:
                    out = out + bb
                dout = f32(N, OUT_)
                out.backward(dout.double())
                db = bb.grad if has_bias else torch.zeros(OUT_)
                case("linear", name, N, IN, OUT_, w_in_out, has_bias)
                for k, v in [("inp", inp), ("w", w), ("b", b), ("out", out), ("dout", dout),
                             ("dinp", x.grad), ("dw", W.grad), ("db", db)]:
                    save(name, k, v)


def gen_embedding():
    for i, (B, T, C, V, has_wpe) in enumerate([(3, 7, 37, 101, 1), (4, 9, 100, 13, 0),
                                               (2, 16, 64, 50, 1)]):
        name = f"emb{i}"
        tok = torch.randint(0, V, (B * T,), dtype=torch.int32)
        wte, wpe = f32(V, C), f32(T, C)
        Wte, Wpe = leaf(wte), leaf(wpe)
        out = Wte[tok.long()]
        if has_wpe:
            out = out + Wpe[torch.arange(B * T) % T]
        dout = f32(B * T, C)
        out.backward(dout.double())
        dwpe = Wpe.grad if has_wpe else torch.zeros(T, C)
        case("embedding", name, B, T, C, V, has_wpe)
        for k, v in [("tok", tok), ("wte", wte), ("wpe", wpe), ("out", out), ("dout", dout),
                     ("dwte", Wte.grad), ("dwpe", dwpe)]:
            save(name, k, v)


def gen_layernorm():
    for i, (N, C, eps) in enumerate([(7, 37, 1e-5), (65, 768, 1e-5), (5, 3, 1e-3)]):
        name = f"ln{i}"
        inp = f32(N, C, scale=2.0) + 0.5
        w, b = f32(C) * 0.5 + 1.0, f32(C) * 0.1
        x, W, bb = leaf(inp), leaf(w), leaf(b)
        out = F.layer_norm(x, (C,), W, bb, eps)
        mean = x.detach().mean(-1)
        rstd = 1.0 / torch.sqrt(x.detach().var(-1, unbiased=False) + eps)
        dout = f32(N, C)
        out.backward(dout.double())
        case("layernorm", name, N, C, float(eps))
        for k, v in [("inp", inp), ("w", w), ("b", b), ("out", out), ("mean", mean),
                     ("rstd", rstd), ("dout", dout), ("dinp", x.grad), ("dw", W.grad),
                     ("db", bb.grad)]:
            save(name, k, v)


def gen_rmsnorm():
    for i, (N, C, eps) in enumerate([(7, 37, 1e-6), (40, 512, 1e-5)]):
        name = f"rms{i}"
        inp = f32(N, C, scale=1.5)
        w = f32(C) * 0.5 + 1.0
        x, W = leaf(inp), leaf(w)
        # HF LlamaRMSNorm
        var = x.pow(2).mean(-1, keepdim=True)
        out = W * (x * torch.rsqrt(var + eps))
        rstd = torch.rsqrt(var.detach() + eps).squeeze(-1)
        dout = f32(N, C)
        out.backward(dout.double())
        case("rmsnorm", name, N, C, float(eps))
        for k, v in [("inp", inp), ("w", w), ("out", out), ("rstd", rstd), ("dout", dout),
                     ("dinp", x.grad), ("dw", W.grad)]:
            save(name, k, v)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def gen_rope():
    # (B, T, nh, HS, row stride, head stride, theta); strides as inside a
    # fused QKV row (rs = 3*NH*HS) and with padded heads (hs > HS).
    for i, (B, T, nh, HS, rs, hs, theta) in enumerate([
            (2, 5, 3, 8, 3 * 3 * 8, 8, 10000.0),
            (1, 33, 4, 16, 4 * 20 + 7, 20, 10000.0),
            (3, 7, 2, 6, 3 * 2 * 6, 6, 500000.0)]):
        name = f"rope{i}"
        # HF LlamaRotaryEmbedding, fp32 tables
        inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2).float() / HS))
        t = torch.arange(T, dtype=inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # [T, HS] fp32
        buf = f32(B * T * rs)
        idx = (torch.arange(B * T)[:, None, None] * rs + torch.arange(nh)[None, :, None] * hs
               + torch.arange(HS)[None, None, :])  # [B*T, nh, HS]
        x = leaf(buf[idx].view(B, T, nh, HS))
        c = cos.double()[None, :, None, :]
        s = sin.double()[None, :, None, :]
        y = x * c + rotate_half(x) * s
        dbuf = f32(B * T * rs)
        dy = dbuf[idx].view(B, T, nh, HS)
        y.backward(dy.double())
        ybuf = buf.double().clone()
        ybuf[idx.reshape(-1)] = y.detach().reshape(-1)
        dxbuf = dbuf.double().clone()
        dxbuf[idx.reshape(-1)] = x.grad.reshape(-1)
        case("rope", name, B, T, nh, HS, rs, hs, float(theta))
        for k, v in [("cos", cos[:, :HS // 2]), ("sin", sin[:, :HS // 2]), ("x", buf),
                     ("y", ybuf), ("dy", dbuf), ("dx", dxbuf)]:
            save(name, k, v)


def gen_pointwise():
    # the large-scale case reaches the clamps of the kernels' exp
    for i, (N, scale) in enumerate([(7, 3.0), (1001, 3.0), (4096 + 3, 3.0), (257, 40.0)]):
        name = f"gelu{i}"
        inp = f32(N, scale=scale)
        x = leaf(inp)
        out = F.gelu(x, approximate="tanh")
        dout = f32(N)
        out.backward(dout.double())
        case("gelu", name, N)
        for k, v in [("x", inp), ("out", out), ("dout", dout), ("dinp", x.grad)]:
            save(name, k, v)

        name = f"swiglu{i}"
        gate, up = f32(N, scale=scale), f32(N)
        g, u = leaf(gate), leaf(up)
        out = F.silu(g) * u
        dout = f32(N)
        out.backward(dout.double())
        case("swiglu", name, N)
        for k, v in [("gate", gate), ("up", up), ("out", out), ("dout", dout),
                     ("dgate", g.grad), ("dup", u.grad)]:
            save(name, k, v)

        name = f"add{i}"
        a, b = f32(N), f32(N)
        case("add", name, N)
        for k, v in [("a", a), ("b", b), ("out", a.double() + b.double())]:
            save(name, k, v)


def gen_xent():
    for i, (N, V, scale) in enumerate([(7, 101, 3.0), (40, 1000, 5.0), (3, 2, 1.0),
                                                 (4, 50257, 4.0), (5, 300, 60.0)]):
        name = f"xent{i}"
        logits = f32(N, V, scale=scale)
        tgt = torch.randint(0, V, (N,), dtype=torch.int64)
        tgt[1] = -100
        if N > 10:
            tgt[N // 2:N // 2 + 4] = -100
        x = leaf(logits)
        losses = F.cross_entropy(x, tgt, reduction="none", ignore_index=-100)
        count = int((tgt != -100).sum())
        (losses.sum() / count).backward()
        case("xent", name, N, V, count)
        for k, v in [("logits", logits), ("tgt", tgt), ("losses", losses), ("dlogits", x.grad)]:
            save(name, k, v)


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    args = ap.parse_args()
    binary = os.path.join(args.build, "tests", "test_kernels")
    if not os.access(binary, os.X_OK):
        print(f"kernels_ref.py: {binary} not found; build the project first", file=sys.stderr)
        return 1
    OUT = tempfile.mkdtemp(prefix="cllm_kernels_")
    try:
        for gen in (gen_matmul, gen_linear, gen_embedding, gen_layernorm, gen_rmsnorm, gen_rope,
                    gen_pointwise, gen_xent):
            gen()
        with open(os.path.join(OUT, "manifest.txt"), "w") as f:
            f.write("\n".join(MANIFEST) + "\n")
        print(f"kernels_ref.py: {len(MANIFEST)} cases in {OUT}", flush=True)
        rc = subprocess.run([binary, OUT]).returncode
        if rc != 0:
            print(f"kernels_ref.py: test_kernels exited with {rc}", file=sys.stderr)
        return 1 if rc != 0 else 0
    finally:
        if args.keep:
            print(f"kernels_ref.py: kept {OUT}")
        else:
            shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
