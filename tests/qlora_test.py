#!/usr/bin/python3
"""
QLoRA: LoRA adapters on a quantized base against torch on the same
dequantized weights (the base's block linear layers replaced by their
nf4 / fp4 / int8 values, computed by tests/ref/bnb_ref.py's independent
implementation of bitsandbytes' formulas, which test_bnb_torch checks bit
for bit against cllm's quantizer), in float64.

  grad-*    `cllm grad --adapter --load-in-4bit|--load-in-8bit` on tiny GPT-2
            (nf4, double quant), LLaMA (fp4; nf4 double quant; int8) and BLOOM
            (int8): loss and every adapter gradient, and that they differ
            from those of the fp32 base (the quantization took effect)
  compute   --bnb-4bit-compute-dtype bfloat16 (GPT-2 nf4 double quant with
            biases; LLaMA fp4) and float16 (LLaMA nf4): loss and adapter
            gradients against torch running the 4-bit layers' matmuls in that
            dtype (weight, input and bias cast, output cast back, adapters in
            float64), and unlike those of float32 compute; `cllm eval` with it
  train     `cllm train --config` with a "quantization" section (nf4, double
            quant, llm_int8_skip_modules) and SGD: the adapters after 3 steps
            against torch's SGD on the dequantized base, and the same with
            bnb_4bit_compute_dtype "torch.bfloat16"; a run stopped at
            step 2 and resumed gives the bits of an uninterrupted one
  eval      `cllm eval --load-in-4bit --adapter`: the loss of the dequantized
            base with the adapter
  estimate  `cllm estimate --load-in-4bit --json`: the nf4 layers' bytes (codes,
            uint8 absmax, absmax2) in place of their fp32 bytes
  errors    unknown quantization key named, load_in_8bit with load_in_4bit,
            neither, a bad bnb_4bit_quant_type or compute dtype, a quantized
            base without adapters, --precision bf16, a quantized layer in
            modules_to_save, --weights with
            --load-in-4bit: non-zero exit naming them

Run by ctest (label lora) as
  /usr/bin/python3 tests/qlora_test.py --cllm build/cllm --build build
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import OrderedDict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
import bnb_ref  # noqa: E402
import hf_models as hm  # noqa: E402
import lora_test as lt  # noqa: E402

PASSED = 0
FAILED = 0


def check(name, ok, detail=""):
    global PASSED, FAILED
    PASSED += bool(ok)
    FAILED += not ok
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail else ""))
    sys.stdout.flush()
    return ok


def quant_flags(kind, dq):
    f = ["--load-in-8bit"] if kind == "int8" else ["--load-in-4bit", "--bnb-4bit-quant-type", kind]
    return f + (["--bnb-4bit-use-double-quant"] if dq else [])


def dequantized(cfg, params, kind, dq, skip=()):
    """params with every block linear weight replaced by its quantized values."""
    out = OrderedDict(params)
    for mod, conv in lt.linear_modules(cfg):
        if any(mod == s or mod.endswith("." + s) for s in skip):
            continue
        w = params[mod + ".weight"].float()
        wq = w.t().contiguous() if conv else w  # quantized as [out, in]
        d = bnb_ref.dequant(kind, dq, wq)
        out[mod + ".weight"] = d.t().contiguous() if conv else d
    return out


def grad_cases():
    defs = lt.case_defs()
    gpt2, llama, bloom = defs[0], defs[1], defs[2]
    return [("gpt2-nf4-dq", gpt2, "nf4", True), ("llama-fp4", llama, "fp4", False),
            ("llama-nf4-dq", llama, "nf4", True), ("llama-int8", llama, "int8", False),
            ("bloom-int8", bloom, "int8", False)]


def test_grads(cllm, tmp):
    T, B = 12, 3
    for name, (cname, cfg, mods, acfg, r_of, s_of, kind_extra), kind, dq in grad_cases():
        d = os.path.join(tmp, cname)
        if not os.path.exists(d):
            hm.save_hf_folder(d, cfg, hm.init_params(cfg, seed=3))
        params = hm.load_hf_folder(d)[1]
        ad = os.path.join(tmp, cname + "-adapter")
        adapter = lt.make_adapter(ad, cfg, params, mods, r_of, acfg, seed=5,
                                  extra=lt.extra_tensors(kind_extra, params, mods))
        data = os.path.join(tmp, cname + ".jsonl")
        samples = lt.samples_for(cfg, T, B)
        hm.write_jsonl(data, samples)
        gp = os.path.join(tmp, name + ".safetensors")
        r = lt.run([cllm, "grad", "--model", d, "--adapter", ad, "--data", data, "--seq-len", str(T),
                    "--batch-size", str(B), "--out", gp] + quant_flags(kind, dq))
        if not check("grad %s: exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            continue
        line, got = json.loads(r.stdout.strip().splitlines()[-1]), hm.load_safetensors(gp)
        ids, labels = hm.make_batch(samples, T)
        scales = {m: s_of(m) for m, _ in mods}
        ref_loss, _, ref = lt.grads_of(cfg, dequantized(cfg, params, kind, dq), adapter, scales, mods, ids, labels)
        fp_loss, _, fp = lt.grads_of(cfg, params, adapter, scales, mods, ids, labels)
        check("grad %s: loss of the dequantized base" % name, abs(line["loss"] - ref_loss) <= 1e-5 * abs(ref_loss),
              "%.9g vs %.9g (fp32 base %.9g)" % (line["loss"], ref_loss, fp_loss))
        check("grad %s: exactly the trainable tensors" % name, set(got) == set(ref))
        worst = max((lt.rel(got[k], ref[k]), k) for k in ref if k in got)
        check("grad %s: every gradient (rel L2 <= 1e-4)" % name, worst[0] <= 1e-4, "worst %.2e %s" % worst)
        off = max(lt.rel(got[k], fp[k]) for k in fp if k in got)
        check("grad %s: differs from the fp32 base's gradients" % name, off > 10 * max(worst[0], 1e-6),
              "largest rel difference %.2e" % off)


class RoundedLinear(torch.autograd.Function):
    """F.linear as torch computes it in a 16-bit dtype `dt` on exact
    operands: x, W and b rounded to dt, the exact sum rounded once (what an
    fp32-accumulating GEMM gives but for rare ties; torch's CPU bf16 F.linear
    matches it on contiguous operands only, and has no float16 one); backward: the output gradient rounded to dt, the input gradient
    round(g . W) and the bias gradient round(sum g), as autograd gives
    through Linear4bit's casts. Computed in float64."""

    @staticmethod
    def forward(ctx, x, W, b, dt):
        r = lambda t: t.to(dt).double()
        Wr = r(W)
        ctx.save_for_backward(Wr)
        ctx.dt, ctx.has_b = dt, b is not None
        y = r(x) @ Wr.t()
        return r(y + r(b)) if b is not None else r(y)

    @staticmethod
    def backward(ctx, g):
        (Wr,) = ctx.saved_tensors
        r = lambda t: t.to(ctx.dt).double()
        g = r(g)
        gb = r(g.reshape(-1, g.shape[-1]).sum(0)) if ctx.has_b and ctx.needs_input_grad[2] else None
        return r(g @ Wr), None, gb, None


class QLinear:
    """A 4-bit layer under bnb_4bit_compute_dtype `dt`, as bitsandbytes'
    Linear4bit with PEFT's adapter: the dequantized weight and the input cast
    to dt, F.linear in dt (bias cast to dt too), the output cast back; the
    adapter path in the model's dtype. Stands in for the weight tensor in
    hf_models' forwards (`x @ W` for Conv1D, `x @ W.t()` otherwise), with
    the bias folded in (the model then adds zero)."""

    def __init__(self, w, b, A, B, scale, conv, dt):
        self.w, self.b, self.A, self.B, self.scale, self.conv, self.dt = w, b, A, B, scale, conv, dt

    def t(self):
        return self

    def __rmatmul__(self, x):
        W = self.w.t() if self.conv else self.w  # [out, in]
        if self.dt == torch.float64:
            y = torch.nn.functional.linear(x, W, self.b)
        else:
            y = RoundedLinear.apply(x, W, self.b, self.dt)
        if self.A is not None:
            y = y + self.scale * ((x @ self.A.t()) @ self.B.t())
        return y


def compute_grads(cfg, base, adapter, scales, mods, ids, labels, dt, skip=()):
    """Loss and adapter gradients with every block linear layer of base
    (its dequantized values) but those in skip computing in dt, the rest in
    float64."""
    leaves = OrderedDict((k, v.detach().double().requires_grad_(True)) for k, v in adapter.items())
    p = OrderedDict((k, v.detach().double()) for k, v in base.items())
    for k, v in leaves.items():
        if ".lora_" not in k:
            p[k[len(lt.PREFIX):]] = v
    adapted = dict(mods)
    for mod, conv in lt.linear_modules(cfg):
        A = leaves[lt.PREFIX + mod + ".lora_A.weight"] if mod in adapted else None
        B = leaves[lt.PREFIX + mod + ".lora_B.weight"] if mod in adapted else None
        b = p.get(mod + ".bias")
        kept = any(mod == k or mod.endswith("." + k) for k in skip)  # fp32, not quantized
        p[mod + ".weight"] = QLinear(p[mod + ".weight"], b, A, B, scales.get(mod), conv,
                                     torch.float64 if kept else dt)
        if b is not None:
            p[mod + ".bias"] = torch.zeros((), dtype=torch.float64)
    loss, _ = hm.model_loss(cfg, p, ids, labels)
    loss.backward()
    return float(loss), OrderedDict((k, v.grad) for k, v in leaves.items())


def test_compute_dtype(cllm, tmp):
    """bnb_4bit_compute_dtype bfloat16 / float16 against torch computing the
    4-bit layers in that dtype, and unlike the float32-compute run."""
    T, B = 12, 3
    defs = lt.case_defs()
    cases = [("gpt2-nf4-dq-bf16", defs[0], "nf4", True, "bfloat16", torch.bfloat16),
             ("llama-fp4-bf16", defs[1], "fp4", False, "bfloat16", torch.bfloat16),
             ("llama-nf4-fp16", defs[1], "nf4", False, "float16", torch.float16)]
    for name, (cname, cfg, mods, _, _, s_of, _), kind, dq, flag, dt in cases:
        d, ad = os.path.join(tmp, cname), os.path.join(tmp, cname + "-adapter")  # written by test_grads
        data = os.path.join(tmp, cname + ".jsonl")
        params = hm.load_hf_folder(d)[1]
        adapter = hm.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
        gp = os.path.join(tmp, name + ".safetensors")
        r = lt.run([cllm, "grad", "--model", d, "--adapter", ad, "--data", data, "--seq-len", str(T),
                    "--batch-size", str(B), "--out", gp, "--bnb-4bit-compute-dtype", flag] + quant_flags(kind, dq))
        if not check("compute %s: exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            continue
        line, got = json.loads(r.stdout.strip().splitlines()[-1]), hm.load_safetensors(gp)
        ids, labels = hm.make_batch(lt.samples_for(cfg, T, B), T)
        deq, scales = dequantized(cfg, params, kind, dq), {m: s_of(m) for m, _ in mods}
        ref_loss, ref = compute_grads(cfg, deq, adapter, scales, mods, ids, labels, dt)
        f32_loss, f32 = compute_grads(cfg, deq, adapter, scales, mods, ids, labels, torch.float64)
        # the loss alone cannot tell the compute dtypes apart: a rounding flip
        # of one bf16 output moves it by about as much as the dtype does
        # (both ~1e-5 relative here), and the input's last bit differs with
        # the compiler's contraction of the norm; the gradients below can
        err = abs(line["loss"] - ref_loss)
        check("compute %s: loss (within 2e-4 relative)" % name, err <= 2e-4 * abs(ref_loss),
              "%.9g vs %.9g (float32 compute %.9g)" % (line["loss"], ref_loss, f32_loss))
        worst = max((lt.rel(got[k], ref[k]), k) for k in ref if k in got)
        offg = min(lt.rel(f32[k], ref[k]) for k in ref if ".lora_" in k)
        check("compute %s: every gradient (rel L2 <= 3e-3)" % name, set(got) == set(ref) and worst[0] <= 3e-3,
              "worst %.2e %s" % worst)
        off32 = max(lt.rel(got[k], f32[k]) for k in f32 if k in got)
        check("compute %s: gradients differ from float32 compute" % name, off32 > 3 * worst[0],
              "largest rel difference %.2e (torch's own %s vs float32: smallest %.2e)" % (off32, flag, offg))
        # eval and its forward-only scratch: the same batch's loss
        r = lt.run([cllm, "eval", "--model", d, "--adapter", ad, "--data", data, "--seq-len", str(T), "--batch-size",
                    str(B), "--bnb-4bit-compute-dtype", flag] + quant_flags(kind, dq))
        if check("compute %s: eval exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            ev = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
            check("compute %s: eval loss equals grad's (same forward)" % name,
                  abs(ev - line["loss"]) <= 1e-6 * abs(line["loss"]), "%.9g vs %.9g" % (ev, line["loss"]))


def test_train(cllm, tmp):
    cname, cfg, mods, acfg, r_of, s_of, _ = lt.case_defs()[1]  # llama: all-linear, patterns, saved head
    d = os.path.join(tmp, cname)  # written by test_grads
    params = hm.load_hf_folder(d)[1]
    ad = os.path.join(tmp, cname + "-adapter")
    adapter = hm.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
    samples = lt.samples_for(cfg, 12, 9, seed=11)
    data = os.path.join(tmp, "train.jsonl")
    hm.write_jsonl(data, samples)
    conf = os.path.join(tmp, "qlora.json")
    with open(conf, "w") as f:
        json.dump({"quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                    "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32",
                                    "llm_int8_skip_modules": ["down_proj"]}}, f)
    out = os.path.join(tmp, "train-sgd")
    r = lt.run(lt.train_cmd(cllm, d, data, out, 3, ["--config", conf, "--adapter", ad, "--optimizer", "sgd",
                                                     "--lr", "0.1"]))
    if not check("train: exit 0", r.returncode == 0, r.stderr.strip()[-300:]):
        return
    got = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
    base = dequantized(cfg, params, "nf4", True, skip=("down_proj",))
    ref = lt.sgd_reference(cfg, base, adapter, {m: s_of(m) for m, _ in mods}, mods, samples, 0.1, 3, 3, 12)
    worst = max((lt.rel(got[k], ref[k]), k) for k in ref)
    moved = min(lt.rel(adapter[k], ref[k]) for k in ref if ".lora_" in k)
    check("train: adapters after 3 SGD steps on the nf4 base vs torch (rel L2 <= 1e-4)",
          worst[0] <= 1e-4 and moved > 1e-4, "worst %.2e %s; smallest change %.2e" % (worst + (moved,)))
    # the same run computing the 4-bit layers in bfloat16 (the key as transformers writes it)
    with open(conf, "w") as f:
        json.dump({"quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                    "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "torch.bfloat16",
                                    "llm_int8_skip_modules": ["down_proj"]}}, f)
    outb = os.path.join(tmp, "train-sgd-bf16")
    r = lt.run(lt.train_cmd(cllm, d, data, outb, 3, ["--config", conf, "--adapter", ad, "--optimizer", "sgd",
                                                      "--lr", "0.1"]))
    if check("train bf16 compute: exit 0", r.returncode == 0, r.stderr.strip()[-300:]):
        gotb = hm.load_safetensors(os.path.join(outb, "adapter_model.safetensors"))
        cur = OrderedDict((k, v.double()) for k, v in adapter.items())
        for step in range(3):
            ids, labels = hm.micro_batch(samples, step, 3, 12)
            _, g = compute_grads(cfg, base, cur, {m: s_of(m) for m, _ in mods}, mods, ids, labels, torch.bfloat16,
                                 skip=("down_proj",))
            cur = OrderedDict((k, v - 0.1 * g[k]) for k, v in cur.items())
        worstb = max((lt.rel(gotb[k], cur[k]), k) for k in cur)
        off = max(lt.rel(gotb[k], ref[k]) for k in ref)
        check("train bf16 compute: adapters after 3 SGD steps vs torch in bfloat16 (rel L2 <= 2e-3), unlike float32's",
              worstb[0] <= 2e-3 and off > 4 * worstb[0], "worst %.2e %s; from float32 compute's %.2e" % (worstb + (off,)))
    # exact resume on a quantized base: the checkpoint holds the adapters, the base is quantized again
    extra = ["--lora-r", "2", "--load-in-4bit", "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant",
             "--save-interval", "2", "--sync-save"]
    full, part = os.path.join(tmp, "q-full"), os.path.join(tmp, "q-part")
    r1 = lt.run(lt.train_cmd(cllm, d, data, full, 4, extra))
    r2 = lt.run(lt.train_cmd(cllm, d, data, part, 2, extra))
    r3 = lt.run(lt.train_cmd(cllm, d, data, part, 4, extra + ["--resume", "auto"]))
    if check("resume: runs exit 0", all(x.returncode == 0 for x in (r1, r2, r3)),
             " | ".join(x.stderr.strip()[-200:] for x in (r1, r2, r3))):
        a = open(os.path.join(full, "adapter_model.safetensors"), "rb").read()
        b = open(os.path.join(part, "adapter_model.safetensors"), "rb").read()
        check("resume: adapters bit-identical to an uninterrupted run", a == b)
    # eval: the loss of the dequantized base with the trained adapter
    r = lt.run([cllm, "eval", "--model", d, "--adapter", out, "--data", data, "--seq-len", "12", "--batch-size",
                "3", "--load-in-4bit", "--bnb-4bit-quant-type", "fp4"])
    if check("eval --load-in-4bit --adapter: exit 0", r.returncode == 0, r.stderr.strip()[-300:]):
        res = json.loads(r.stdout.strip().splitlines()[-1])
        p, leaves = lt.torch_lora_loss(cfg, dequantized(cfg, params, "fp4", False), got,
                                       {m: s_of(m) for m, _ in mods}, mods)
        total, count = 0.0, 0
        for s in range(len(samples) // 3):
            ids, labels = hm.micro_batch(samples, s, 3, 12)
            loss, n = hm.model_loss(cfg, p, ids, labels)
            total += float(loss) * n
            count += n
        check("eval --load-in-4bit: loss of the fp4 base with the adapter", abs(res["loss"] - total / count) <= 1e-5 *
              abs(total / count), "%.9g vs %.9g" % (res["loss"], total / count))


def test_errors(cllm, tmp):
    cname = lt.case_defs()[1][0]
    d = os.path.join(tmp, cname)
    data = os.path.join(tmp, cname + ".jsonl")
    cases = [
        ("unknown key named", {"quantization": {"load_in_4bit": True, "bnb_4bit_quant": "nf4"}}, [], "bnb_4bit_quant"),
        ("8bit and 4bit both set", {"quantization": {"load_in_4bit": True, "load_in_8bit": True}}, [],
         "load_in_8bit and load_in_4bit"),
        ("neither set", {"quantization": {"bnb_4bit_quant_type": "nf4"}}, [], "neither load_in_8bit"),
        ("bad quant type", {"quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf8"}}, [],
         "bnb_4bit_quant_type"),
        ("unknown compute dtype", {"quantization": {"load_in_4bit": True, "bnb_4bit_compute_dtype": "float8"}}, [],
         "bnb_4bit_compute_dtype"),
        ("cpu offload", {"quantization": {"load_in_8bit": True, "llm_int8_enable_fp32_cpu_offload": True}}, [],
         "llm_int8_enable_fp32_cpu_offload"),
        ("no adapters", {}, ["--load-in-4bit"], "LoRA"),
        ("bf16 precision", {"bf16": {"enabled": True}}, ["--load-in-4bit", "--lora-r", "2"], "bf16"),
    ]
    for i, (what, cfg, flags, needle) in enumerate(cases):
        conf = os.path.join(tmp, "bad%d.json" % i)
        with open(conf, "w") as f:
            json.dump(cfg, f)
        extra = ["--config", conf] + flags + (["--lora-r", "2"] if "--lora-r" not in flags and what != "no adapters"
                                              else [])
        r = lt.run(lt.train_cmd(cllm, d, data, os.path.join(tmp, "e%d" % i), 1, extra))
        check("errors: %s" % what, r.returncode not in (0, None) and needle in r.stderr, r.stderr.strip()[-240:])
    conf = os.path.join(tmp, "bad-save.json")
    with open(conf, "w") as f:
        json.dump({"lora": {"r": 2, "modules_to_save": ["model.layers.0.mlp.up_proj"]}}, f)
    r = lt.run(lt.train_cmd(cllm, d, data, os.path.join(tmp, "e-save"), 1, ["--config", conf, "--load-in-8bit"]))
    check("errors: a quantized layer in modules_to_save named", r.returncode not in (0, None) and
          "model.layers.0.mlp.up_proj.weight is held quantized" in r.stderr, r.stderr.strip()[-240:])
    r = lt.run([cllm, "estimate", "--model", d, "--load-in-4bit"])
    check("errors: estimate of a quantized base without --lora-r", r.returncode not in (0, None) and
          "--lora-r" in r.stderr, r.stderr.strip()[-240:])
    # estimate: the quantized layers at their bytes (nf4 + double quant: codes, uint8 absmax, absmax2 per 256)
    cfg = lt.case_defs()[1][1]
    pad = lambda b: (b + 63) // 64 * 64
    al4 = lambda b: (b + 3) // 4 * 4
    want = 0
    for mod, conv in lt.linear_modules(cfg):
        n = hm.load_hf_folder(d)[1][mod + ".weight"].numel()
        nb = (n + 63) // 64
        want += pad(al4((n + 1) // 2) + al4(nb) + 4 * ((nb + 255) // 256))
    r = lt.run([cllm, "estimate", "--model", d, "--lora-r", "2", "--load-in-4bit", "--bnb-4bit-quant-type", "nf4",
                "--bnb-4bit-use-double-quant", "--json", "--seq-len", "12"])
    r8 = lt.run([cllm, "estimate", "--model", d, "--lora-r", "2", "--json", "--seq-len", "12"])
    if check("estimate --load-in-4bit --json: exit 0", r.returncode == 0 and r8.returncode == 0, r.stderr[-200:]):
        e4, e32 = json.loads(r.stdout), json.loads(r8.stdout)
        nq = sum(hm.load_hf_folder(d)[1][m + ".weight"].numel() for m, _ in lt.linear_modules(cfg))
        check("estimate --load-in-4bit: the nf4 layers' bytes replace their fp32 ones",
              e4.get("quantized_bytes") == want and e4.get("quantized_params") == nq and
              e4["params"] == e32["params"] - 4 * nq + want,
              "%s vs %d bytes; params %d vs %d" % (e4.get("quantized_bytes"), want, e4["params"],
                                                   e32["params"] - 4 * nq + want))
    # bf16 compute: two regions of one layer's rounded operands at the widest layer (F = 80 here)
    rb = lt.run([cllm, "estimate", "--model", d, "--lora-r", "2", "--load-in-4bit", "--bnb-4bit-compute-dtype",
                 "bfloat16", "--json", "--seq-len", "12", "--micro-batch", "2"])
    rf = lt.run([cllm, "estimate", "--model", d, "--lora-r", "2", "--load-in-4bit", "--json", "--seq-len", "12",
                 "--micro-batch", "2"])
    if check("estimate --bnb-4bit-compute-dtype bfloat16: exit 0", rb.returncode == 0 and rf.returncode == 0,
             rb.stderr[-200:]):
        wb, wf = json.loads(rb.stdout)["work"], json.loads(rf.stdout)["work"]
        w = max(cfg["hidden_size"], cfg["intermediate_size"])
        check("estimate: bf16 compute's operand scratch in work", wb - wf == 2 * (2 * 12 + 1) * w * 4,
              "%d - %d vs %d" % (wb, wf, 2 * (2 * 12 + 1) * w * 4))
    r = lt.run([cllm, "generate", "--model", d, "--load-in-4bit", "--weights", "q4", "--prompt-ids", "1,2",
                "--max-new-tokens", "2"])
    check("errors: --weights with --load-in-4bit", r.returncode not in (0, None) and "--weights" in r.stderr,
          r.stderr.strip()[-240:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="cllm-qlora-")
    try:
        test_grads(a.cllm, tmp)
        test_compute_dtype(a.cllm, tmp)
        test_train(a.cllm, tmp)
        test_errors(a.cllm, tmp)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED or not PASSED else 0


if __name__ == "__main__":
    sys.exit(main())
