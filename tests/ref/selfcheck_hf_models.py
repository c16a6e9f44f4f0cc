#!/usr/bin/python3
"""
Self-checks of the torch reference models in hf_models.py, independent of
the cllm binary: gradient vs finite differences, GQA vs MHA, ALiBi slopes
against the ALiBi paper's formula, RoPE against the complex-rotation form,
causality and padding invariance, the loss convention, the safetensors
writer/reader and the reference optimiser loop.

Registered with ctest (label model); accepts and ignores --cllm/--build.
Prints `N passed, M failed` and exits non-zero on any failure.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models as hm  # noqa: E402

PASSED = 0
FAILED = 0


def check(name, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print("ok    %s" % name)
    else:
        FAILED += 1
        print("FAIL  %s %s" % (name, detail))


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


TINY = {
    "gpt2": hm.make_config("gpt2", vocab_size=53, n_positions=16, n_embd=24, n_layer=2, n_head=3),
    "llama-gqa": hm.make_config("llama", vocab_size=53, hidden_size=24, intermediate_size=40,
                                num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2),
    "llama-bias-hd": hm.make_config("llama", vocab_size=53, hidden_size=24, intermediate_size=40,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, attention_bias=True,
                                    mlp_bias=True, tie_word_embeddings=True),
    "bloom-6": hm.make_config("bloom", vocab_size=53, hidden_size=24, n_layer=2, n_head=6),
}


def random_batch(cfg, B, T, seed, ragged=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    labels = ids.clone()
    if ragged:
        labels[0, T // 2:] = hm.IGNORE_INDEX
        ids[0, T // 2:] = hm.PAD_ID
        labels[1, 2:5] = hm.IGNORE_INDEX
    return ids, labels


def check_finite_differences():
    """Directional derivatives, one random direction per tensor, float64."""
    for key, cfg in TINY.items():
        params = OrderedDict((n, t.double()) for n, t in hm.init_params(cfg, seed=3).items())
        ids, labels = random_batch(cfg, 2, 7, seed=4)
        _, _, grads = hm.reference_grads(cfg, params, ids, labels)
        g = torch.Generator().manual_seed(5)
        worst, worst_name = 0.0, ""
        for name in params:
            d = torch.randn(params[name].shape, generator=g, dtype=torch.float64)
            eps = 1e-5
            plus = OrderedDict(params)
            plus[name] = params[name] + eps * d
            minus = OrderedDict(params)
            minus[name] = params[name] - eps * d
            with torch.no_grad():
                lp, _ = hm.model_loss(cfg, plus, ids, labels)
                lm, _ = hm.model_loss(cfg, minus, ids, labels)
            fd = (float(lp) - float(lm)) / (2 * eps)
            an = float((grads[name] * d).sum())
            # Relative error, floored so that near-zero directional
            # derivatives (e.g. k_proj biases, which softmax almost cancels)
            # are judged on an absolute scale of 1e-4 instead.
            err = abs(fd - an) / (abs(an) + 1e-4)
            if err > worst:
                worst, worst_name = err, name
        check("finite differences %s (worst %.1e at %s)" % (key, worst, worst_name), worst < 1e-6)


def check_gqa_equals_mha():
    """A GQA model equals the MHA model whose k/v projections repeat each kv
    head's rows for the query heads it serves; NKV=NH is plain MHA."""
    for bias in (False, True):
        gqa = hm.make_config("llama", vocab_size=31, hidden_size=24, intermediate_size=32,
                             num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                             attention_bias=bias)
        mha = hm.make_config("llama", vocab_size=31, hidden_size=24, intermediate_size=32,
                             num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=6,
                             attention_bias=bias)
        p = OrderedDict((n, t.double()) for n, t in hm.init_params(gqa, seed=7).items())
        q = OrderedDict(p)
        hd, rep = 4, 3
        for n in p:
            if ".k_proj." in n or ".v_proj." in n:
                t = p[n]
                blocks = t.reshape(2, hd, *t.shape[1:])  # [kv, hd, ...]
                q[n] = blocks.repeat_interleave(rep, dim=0).reshape(6 * hd, *t.shape[1:])
        ids, _ = random_batch(gqa, 2, 9, seed=8, ragged=False)
        a = hm.forward(gqa, p, ids)
        b = hm.forward(mha, q, ids)
        check("llama GQA == expanded MHA (bias=%s)" % bias, rel(a, b) < 1e-13, "rel %.2e" % rel(a, b))
    # NKV == NH against an attention written with explicit loops.
    cfg = hm.make_config("llama", vocab_size=31, hidden_size=16, intermediate_size=24,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    p = OrderedDict((n, t.double()) for n, t in hm.init_params(cfg, seed=9).items())
    ids, _ = random_batch(cfg, 1, 5, seed=10, ragged=False)
    check("llama MHA == loop implementation", rel(hm.forward(cfg, p, ids), naive_llama(cfg, p, ids)) < 1e-12)


def naive_llama(cfg, p, ids):
    """Scalar-loop llama (batch 1) written from the paper-level description:
    RMSNorm, RoPE as complex rotation of pairs (i, i+hd/2), causal softmax
    attention, SwiGLU."""
    T = ids.shape[1]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hm.llama_head_dim(cfg)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

    def rms(x, w):
        return w * x / math.sqrt(float((x * x).mean()) + eps)

    def rope(v, pos):
        out = v.clone()
        for i in range(hd // 2):
            ang = pos * theta ** (-2.0 * i / hd)
            z = complex(float(v[i]), float(v[i + hd // 2])) * complex(math.cos(ang), math.sin(ang))
            out[i], out[i + hd // 2] = z.real, z.imag
        return out

    x = [p["model.embed_tokens.weight"][int(ids[0, t])] for t in range(T)]
    for L in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % L
        a = [rms(v, p[pre + "input_layernorm.weight"]) for v in x]
        qs = [p[pre + "self_attn.q_proj.weight"] @ v for v in a]
        ks = [p[pre + "self_attn.k_proj.weight"] @ v for v in a]
        vs = [p[pre + "self_attn.v_proj.weight"] @ v for v in a]
        outs = []
        for t in range(T):
            heads = []
            for h in range(H):
                kh = h // (H // KV)
                qv = rope(qs[t][h * hd:(h + 1) * hd], t)
                sc = [float(qv @ rope(ks[s][kh * hd:(kh + 1) * hd], s)) / math.sqrt(hd) for s in range(t + 1)]
                m = max(sc)
                e = [math.exp(c - m) for c in sc]
                z = sum(e)
                heads.append(sum(e[s] / z * vs[s][kh * hd:(kh + 1) * hd] for s in range(t + 1)))
            outs.append(p[pre + "self_attn.o_proj.weight"] @ torch.cat(heads))
        x = [x[t] + outs[t] for t in range(T)]
        m_in = [rms(v, p[pre + "post_attention_layernorm.weight"]) for v in x]
        x = [x[t] + p[pre + "mlp.down_proj.weight"] @ (
            torch.nn.functional.silu(p[pre + "mlp.gate_proj.weight"] @ m_in[t])
            * (p[pre + "mlp.up_proj.weight"] @ m_in[t])) for t in range(T)]
    head = p["model.embed_tokens.weight"] if hm.is_tied(cfg) else p["lm_head.weight"]
    return torch.stack([head @ rms(v, p["model.norm.weight"]) for v in x])[None]


def paper_alibi_slopes(n):
    """ALiBi slopes as the ALiBi authors define them (float64)."""
    def pow2(k):
        start = 2.0 ** (-(2.0 ** -(math.log2(k) - 3)))
        return [start * start ** i for i in range(k)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + pow2(2 * c)[0::2][:n - c]


def check_alibi():
    worst = 0.0
    for n in range(1, 17):
        ours = hm.alibi_slopes(n).double()
        ref = torch.tensor(paper_alibi_slopes(n), dtype=torch.float64)
        ok_len = ours.shape == ref.shape
        worst = max(worst, float(((ours - ref).abs() / ref).max()) if ok_len else 1.0)
    # HF builds the slopes in fp32 as powers of a rounded base, hence a few ulp.
    check("alibi slopes n_head 1..16 vs paper formula (worst rel %.1e)" % worst, worst < 1e-6)
    # Spot values: 8 heads -> 2^-1 .. 2^-8; 6 heads -> 4-head set + odd 8-head entries.
    check("alibi 8 heads = 2^-1..2^-8",
          torch.allclose(hm.alibi_slopes(8).double(), torch.tensor([2.0 ** -k for k in range(1, 9)], dtype=torch.float64)))
    check("alibi 6 heads = [2^-2,2^-4,2^-6,2^-8,2^-1,2^-3]",
          torch.allclose(hm.alibi_slopes(6).double(),
                         torch.tensor([2.0 ** -k for k in (2, 4, 6, 8, 1, 3)], dtype=torch.float64)))


def check_bloom_alibi_in_scores():
    """With q = k = 0 the bloom scores are exactly the ALiBi bias; the
    attention output then weighs values by softmax(slope * s)."""
    cfg = hm.make_config("bloom", vocab_size=17, hidden_size=12, n_layer=1, n_head=3)
    p = OrderedDict((n, t.double()) for n, t in hm.init_params(cfg, seed=2).items())
    # Zero the q and k rows of the fused projection (layout per head: q,k,v).
    w = p["transformer.h.0.self_attention.query_key_value.weight"].clone().view(3, 3, 4, 12)
    b = p["transformer.h.0.self_attention.query_key_value.bias"].clone().view(3, 3, 4)
    w[:, 0:2] = 0
    b[:, 0:2] = 0
    p["transformer.h.0.self_attention.query_key_value.weight"] = w.reshape(36, 12)
    p["transformer.h.0.self_attention.query_key_value.bias"] = b.reshape(36)
    ids = torch.tensor([[1, 5, 7, 2]])
    T = 4
    h = p["transformer.word_embeddings.weight"][ids]
    h = hm.layer_norm(h, p["transformer.word_embeddings_layernorm.weight"],
                      p["transformer.word_embeddings_layernorm.bias"], 1e-5)
    a = hm.layer_norm(h, p["transformer.h.0.input_layernorm.weight"],
                      p["transformer.h.0.input_layernorm.bias"], 1e-5)
    vfull = (a @ w.reshape(36, 12).t() + b.reshape(36)).view(1, T, 3, 3, 4)[..., 2, :]  # [1,T,H,hd]
    slopes = hm.alibi_slopes(3).double()
    ctx = torch.zeros(1, T, 3, 4, dtype=torch.float64)
    for hh in range(3):
        for t in range(T):
            wts = torch.softmax(slopes[hh] * torch.arange(t + 1, dtype=torch.float64), 0)
            ctx[0, t, hh] = (wts[:, None] * vfull[0, :t + 1, hh]).sum(0)
    h2 = h + ctx.reshape(1, T, 12) @ p["transformer.h.0.self_attention.dense.weight"].t() \
        + p["transformer.h.0.self_attention.dense.bias"]
    m = hm.layer_norm(h2, p["transformer.h.0.post_attention_layernorm.weight"],
                      p["transformer.h.0.post_attention_layernorm.bias"], 1e-5)
    m = hm.bloom_gelu(m @ p["transformer.h.0.mlp.dense_h_to_4h.weight"].t()
                      + p["transformer.h.0.mlp.dense_h_to_4h.bias"])
    h3 = h2 + m @ p["transformer.h.0.mlp.dense_4h_to_h.weight"].t() + p["transformer.h.0.mlp.dense_4h_to_h.bias"]
    h3 = hm.layer_norm(h3, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    ref = h3 @ p["transformer.word_embeddings.weight"].t()
    got = hm.forward(cfg, p, ids)
    check("bloom alibi bias added as slope * key position, fused qkv per head",
          rel(got, ref) < 1e-12, "rel %.2e" % rel(got, ref))


def check_rope_relative():
    """RoPE scores depend only on the position difference."""
    hd = 8
    cos, sin = hm.rope_cos_sin(12, hd, 10000.0, torch.float64)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(hd, generator=g, dtype=torch.float64), torch.randn(hd, generator=g, dtype=torch.float64)

    def rot(v, t):
        return v * cos[t] + hm.rotate_half(v) * sin[t]
    s1 = float(rot(q, 7) @ rot(k, 3))
    s2 = float(rot(q, 4) @ rot(k, 0))
    check("rope score depends on relative position", abs(s1 - s2) < 1e-12)


def check_activations_norms():
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    check("gelu_new == F.gelu(approximate='tanh')",
          rel(hm.gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh")) < 1e-15)
    check("bloom gelu ~= gelu_new", rel(hm.bloom_gelu(x), hm.gelu_tanh(x)) < 1e-8)
    v = torch.randn(3, 10, dtype=torch.float64)
    w = 1 + 0.1 * torch.randn(10, dtype=torch.float64)
    ref = w * v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-6)
    check("rms_norm formula", rel(hm.rms_norm(v, w, 1e-6), ref) < 1e-14)
    # fp32 input is computed in fp32, bf16 input is upcast then cast back.
    vb = v.to(torch.bfloat16)
    check("rms_norm keeps input dtype", hm.rms_norm(vb, w.to(torch.bfloat16), 1e-6).dtype == torch.bfloat16)


def check_causality_and_padding():
    for key, cfg in TINY.items():
        p = OrderedDict((n, t.double()) for n, t in hm.init_params(cfg, seed=11).items())
        ids, _ = random_batch(cfg, 1, 8, seed=12, ragged=False)
        ids2 = ids.clone()
        ids2[0, 5:] = (ids2[0, 5:] + 1) % cfg["vocab_size"]
        a, b = hm.forward(cfg, p, ids), hm.forward(cfg, p, ids2)
        check("causal %s" % key, rel(a[:, :5], b[:, :5]) < 1e-14 and rel(a[:, 5:], b[:, 5:]) > 1e-6)
        # Loss of a batch = token-weighted mean of per-sample losses; right
        # padding does not change the unpadded sample's loss.
        s_short = {"input_ids": [3, 4, 5, 6, 7]}
        s_long = {"input_ids": list(range(1, 12))}
        s_lab = {"input_ids": [9, 8, 7, 6, 5, 4, 3], "labels": [9, -100, -100, 6, 5, -100, 3]}
        T = 8
        ids, labels = hm.make_batch([s_short, s_long, s_lab], T)
        loss, n = hm.model_loss(cfg, p, ids, labels)
        parts = []
        for s in (s_short, s_long, s_lab):
            L = min(len(s["input_ids"]), T)
            i1, l1 = hm.make_batch([s], L)
            l, c = hm.model_loss(cfg, p, i1, l1)
            parts.append((float(l), c))
        expect = sum(l * c for l, c in parts) / sum(c for _, c in parts)
        check("loss = token-weighted mean, padding/truncation invariant %s" % key,
              n == 4 + 7 + 3 and abs(float(loss) - expect) < 1e-12,
              "n=%d loss=%r expect=%r" % (n, float(loss), expect))


def check_make_batch():
    ids, labels = hm.make_batch([{"input_ids": [5, 6]}, {"input_ids": [1, 2, 3, 4, 5],
                                                        "labels": [-100, 2, -100, 4, 5]}], 4)
    check("make_batch pads with 0/-100 and truncates",
          ids.tolist() == [[5, 6, 0, 0], [1, 2, 3, 4]]
          and labels.tolist() == [[5, 6, -100, -100], [-100, 2, -100, 4]])


def check_safetensors(tmp):
    g = torch.Generator().manual_seed(0)
    ts = OrderedDict([("a.weight", torch.randn(3, 5, generator=g)),
                      ("b.bias", torch.randn(7, generator=g)),
                      ("c", torch.tensor([1.0, -2.0, 0.5, 65504.0])),
                      ("empty", torch.zeros(0, 4))])
    for dt, tdt in (("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16)):
        path = os.path.join(tmp, "t_%s.safetensors" % dt)
        hm.save_safetensors(path, ts, dtype=dt)
        back, dts = hm.load_safetensors(path, with_dtypes=True)
        ok = list(back) == list(ts) and all(dts[n] == dt for n in back)
        ok = ok and all(back[n].dtype == tdt and torch.equal(back[n], ts[n].to(tdt)) for n in ts)
        with open(path, "rb") as f:
            raw = f.read()
        (hlen,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + hlen])
        ok = ok and hlen % 8 == 0 and header["__metadata__"] == {"format": "pt"}
        ok = ok and len(raw) == 8 + hlen + max(e["data_offsets"][1] for k, e in header.items()
                                               if k != "__metadata__")
        check("safetensors round trip %s" % dt, ok)
    # Known bit patterns: bf16 1.0 = 0x3f80, f16 1.0 = 0x3c00, f32 1.0 = 0x3f800000.
    for dt, want in (("BF16", b"\x80\x3f"), ("F16", b"\x00\x3c"), ("F32", b"\x00\x00\x80\x3f")):
        path = os.path.join(tmp, "one_%s.safetensors" % dt)
        hm.save_safetensors(path, {"x": torch.ones(1)}, dtype=dt)
        with open(path, "rb") as f:
            raw = f.read()
        check("safetensors %s bit pattern of 1.0" % dt, raw.endswith(want))
    # HF folders, single and sharded, round trip through load_hf_folder.
    cfg = TINY["llama-bias-hd"]
    params = hm.init_params(cfg, seed=1)
    for shards in (1, 3):
        d = os.path.join(tmp, "folder%d" % shards)
        hm.save_hf_folder(d, cfg, params, shards=shards)
        cfg2, p2 = hm.load_hf_folder(d)
        ok = list(p2) == list(params) and all(torch.equal(p2[n], params[n]) for n in params)
        ok = ok and cfg2["model_type"] == "llama" and ("lm_head.weight" not in p2)
        if shards > 1:
            ok = ok and os.path.exists(os.path.join(d, "model.safetensors.index.json")) \
                and not os.path.exists(os.path.join(d, "model.safetensors"))
        check("hf folder round trip, %d shard(s)" % shards, ok)
    d = os.path.join(tmp, "bf16")
    hm.save_hf_folder(d, cfg, params, dtype="BF16")
    _, p3 = hm.load_hf_folder(d)
    check("hf folder BF16 loads as fp32 of the rounded values",
          all(p3[n].dtype == torch.float32 and torch.equal(p3[n], params[n].bfloat16().float())
              for n in params))


def check_names():
    g = hm.param_shapes(hm.make_config("gpt2", n_layer=1))
    check("gpt2 names/shapes", g["transformer.h.0.attn.c_attn.weight"] == (48, 144)
          and g["transformer.h.0.mlp.c_proj.weight"] == (192, 48) and "lm_head.weight" not in g
          and len(g) == 2 + 12 + 2)
    l = hm.param_shapes(TINY["llama-bias-hd"])
    check("llama names/shapes (bias, head_dim, tied)",
          l["model.layers.0.self_attn.q_proj.weight"] == (32, 24)
          and l["model.layers.0.self_attn.k_proj.weight"] == (16, 24)
          and l["model.layers.0.self_attn.o_proj.weight"] == (24, 32)
          and l["model.layers.0.self_attn.o_proj.bias"] == (24,)
          and l["model.layers.0.mlp.down_proj.bias"] == (24,)
          and "lm_head.weight" not in l)
    l2 = hm.param_shapes(TINY["llama-gqa"])
    check("llama untied has lm_head, no biases", "lm_head.weight" in l2
          and not any(n.endswith(".bias") for n in l2))
    b = hm.param_shapes(TINY["bloom-6"])
    check("bloom names/shapes", b["transformer.h.1.self_attention.query_key_value.weight"] == (72, 24)
          and b["transformer.h.1.mlp.dense_4h_to_h.weight"] == (24, 96)
          and "lm_head.weight" not in b)
    # Preset sizes, for the benchmark.
    gp = hm.make_config("gpt2", **hm.PRESETS["gpt2-124M"][1])
    n = sum(math.prod(s) for s in hm.param_shapes(gp).values())
    check("gpt2-124M has 124,439,808 parameters", n == 124439808, str(n))


def check_train_loop():
    cfg = TINY["gpt2"]
    params = hm.init_params(cfg, seed=1)
    samples = [{"input_ids": [(3 * i + j) % 53 for j in range(6)]} for i in range(4)]
    final, losses = hm.reference_train(cfg, params, samples, "sgd", 0.1, 1, 2, 6)
    ids, labels = hm.micro_batch(samples, 0, 2, 6)
    l0, _, g = hm.reference_grads(cfg, params, ids, labels, dtype=torch.float32)
    check("train loop: one SGD step is p - lr*g",
          all(torch.allclose(final[n], params[n] - 0.1 * g[n], atol=1e-7) for n in params)
          and abs(losses[0] - l0) < 1e-6)
    final, _ = hm.reference_train(cfg, params, samples, "sgd", 0.1, 1, 2, 6, grad_clip=1e-3)
    step = torch.cat([(params[n] - final[n]).reshape(-1) for n in params]).norm()
    check("train loop: clipped SGD step has norm lr*G", abs(float(step) - 1e-4) < 1e-8, str(float(step)))
    check("micro_batch cycles", torch.equal(hm.micro_batch(samples, 2, 2, 6)[0],
                                            hm.micro_batch(samples, 0, 2, 6)[0]))


def check_cli(tmp):
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_models.py")
    d = os.path.join(tmp, "cli_model")
    data = os.path.join(tmp, "cli.jsonl")
    hm.write_jsonl(data, [{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6, 7, 8]}])
    r1 = subprocess.run([sys.executable, here, "init", "--arch", "bloom", "--set", "hidden_size=16",
                         "--set", "n_head=2", "--set", "vocab_size=11", "--out", d])
    r2 = subprocess.run([sys.executable, here, "grad", "--model", d, "--data", data, "--seq-len", "4",
                         "--batch-size", "2", "--out", os.path.join(tmp, "g.safetensors")],
                        stdout=subprocess.PIPE, text=True)
    ok = r1.returncode == 0 and r2.returncode == 0
    if ok:
        line = json.loads(r2.stdout.strip().splitlines()[-1])
        grads = hm.load_safetensors(os.path.join(tmp, "g.safetensors"))
        cfg, p = hm.load_hf_folder(d)
        ok = line["tokens"] == 3 + 2 and list(grads) == list(p) and all(
            grads[n].dtype == torch.float32 for n in grads)
    check("CLI init + grad", ok)


def check_test_harness(tmp):
    """Runs part of test_model_vs_torch.py with this module's CLI standing in
    for the cllm binary: the harness must then pass (this checks the
    harness, not cllm)."""
    here = os.path.dirname(os.path.abspath(__file__))
    fake = os.path.join(tmp, "fake-cllm")
    with open(fake, "w") as f:
        f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, os.path.join(here, "hf_models.py")))
    os.chmod(fake, 0o755)
    r = subprocess.run([sys.executable, os.path.join(here, "..", "test_model_vs_torch.py"),
                        "--cllm", fake, "--only", "llama-gqa-"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    check("test_model_vs_torch.py passes with the reference as the binary (%s)" % last,
          r.returncode == 0 and last.endswith(" 0 failed"), r.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm")
    ap.add_argument("--build")
    ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="cllm-selfcheck-") as tmp:
        check_names()
        check_make_batch()
        check_activations_norms()
        check_rope_relative()
        check_alibi()
        check_bloom_alibi_in_scores()
        check_gqa_equals_mha()
        check_causality_and_padding()
        check_finite_differences()
        check_safetensors(tmp)
        check_train_loop()
        check_cli(tmp)
        check_test_harness(tmp)
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
