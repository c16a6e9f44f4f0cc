"""Reference trajectories for cllm's optimizers, from torch.optim.

For each case, writes into DIR:
  CASE.params0   float32[n]          starting parameters
  CASE.grads     float32[steps, n]   the gradient fed at each step
  CASE.expect    float32[steps, n]   parameters after each step (torch)
and a manifest.txt line per case:
  CASE TYPE n steps lr beta1 beta2 eps wd momentum dampening nesterov split clip
The first `split` parameters are decayed, the rest are not (two param groups).
With clip > 0 the gradient is first clipped with clip_grad_norm_ over all n.
Lion has no torch.optim class: its reference is the published update
written out with torch tensor ops.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch


def lion_step(p, g, m, lr, b1, b2, wd):
    c = b1 * m + (1 - b1) * g
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(c), alpha=-lr)
    m.mul_(b2).add_(g, alpha=1 - b2)


CASES = [
    # name, type, lr, b1, b2, eps, wd, momentum, dampening, nesterov, clip
    ("sgd", "sgd", 0.1, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0),
    ("sgd_mom", "sgd", 0.05, 0, 0, 0, 0.01, 0.9, 0.1, 0, 0.0),
    ("sgd_nesterov", "sgd", 0.05, 0, 0, 0, 0.02, 0.9, 0.0, 1, 0.0),
    ("adam", "adam", 1e-2, 0.9, 0.999, 1e-8, 0.01, 0, 0, 0, 0.0),
    ("adamw", "adamw", 1e-2, 0.8, 0.95, 1e-6, 0.1, 0, 0, 0, 0.0),
    ("adamw_clip", "adamw", 3e-3, 0.9, 0.999, 1e-8, 0.01, 0, 0, 0, 0.5),
    ("lion", "lion", 1e-3, 0.9, 0.99, 0, 0.1, 0, 0, 0, 0.0),
]


def make_case(out, case, n=1037, steps=6, seed=0):
    name, typ, lr, b1, b2, eps, wd, mom, damp, nest, clip = case
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.randn(n, generator=gen, dtype=torch.float32)
    grads = torch.randn(steps, n, generator=gen, dtype=torch.float32) * 0.3
    split = n // 2
    a = p0[:split].clone().requires_grad_(True)
    b = p0[split:].clone().requires_grad_(True)
    groups = [{"params": [a], "weight_decay": wd}, {"params": [b], "weight_decay": 0.0}]
    if typ == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=mom, dampening=damp, nesterov=bool(nest))
    elif typ == "adam":
        opt = torch.optim.Adam(groups, lr=lr, betas=(b1, b2), eps=eps)
    elif typ == "adamw":
        opt = torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps)
    else:
        opt = None
        ma, mb = torch.zeros_like(a), torch.zeros_like(b)
    expect = []
    for s in range(steps):
        a.grad = grads[s, :split].clone()
        b.grad = grads[s, split:].clone()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_([a, b], clip)
        with torch.no_grad():
            if opt is not None:
                opt.step()
            else:
                lion_step(a, a.grad, ma, lr, b1, b2, wd)
                lion_step(b, b.grad, mb, lr, b1, b2, 0.0)
        expect.append(torch.cat([a.detach(), b.detach()]).clone())
    p0.numpy().tofile(os.path.join(out, name + ".params0"))
    grads.numpy().tofile(os.path.join(out, name + ".grads"))
    torch.stack(expect).numpy().tofile(os.path.join(out, name + ".expect"))
    return f"{name} {typ} {n} {steps} {lr!r} {b1!r} {b2!r} {eps!r} {wd!r} {mom!r} {damp!r} {nest} {split} {clip!r}\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm")
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "manifest.txt"), "w") as f:
            for i, c in enumerate(CASES):
                f.write(make_case(d, c, seed=i))
        r = subprocess.run([os.path.join(args.build, "tests", "test_optim"), d])
        sys.exit(r.returncode)


if __name__ == "__main__":
    main()
