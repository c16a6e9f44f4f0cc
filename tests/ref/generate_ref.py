"""Greedy generation of cllm against a plain-PyTorch reference.

For each family (gpt2; llama with grouped-query heads; bloom with a
non-power-of-two head count) a tiny random model is written with
`cllm init`, continued greedily with `cllm generate --prompt-ids ...
--greedy --ignore-eos --output ids`, and the continuation is checked token
by token against a float64 PyTorch forward written here from HF semantics
(GPT-2 Conv1D + learned positions, LLaMA RoPE rotate-half + RMSNorm + GQA +
SwiGLU, BLOOM ALiBi with HF's slopes and key positions + embedding
LayerNorm). The weights are read from the safetensors file with a small
reader (8-byte little-endian header length, JSON header, raw F32 data).

Each cllm token must be the reference argmax given the same prefix
(teacher forcing); a different token is accepted only when the two logits
are a tie within 1e-5 of the logit scale, and the run also reports whether
free-running torch greedy decoding reproduces the whole sequence.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch

F = torch.float64


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(info["shape"])
        out[name] = t.to(F)
    return out


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def layernorm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def causal_softmax(scores):
    T, S = scores.shape[-2:]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def gpt2_logits(W, c, ids):
    T, C, NH = len(ids), c["n_embd"], c["n_head"]
    HS = C // NH
    p = "transformer."
    x = W[p + "wte.weight"][ids] + W[p + "wpe.weight"][:T]
    for l in range(c["n_layer"]):
        h = f"{p}h.{l}."
        a = layernorm(x, W[h + "ln_1.weight"], W[h + "ln_1.bias"], c["layer_norm_epsilon"])
        qkv = a @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"]
        q, k, v = (t.view(T, NH, HS).transpose(0, 1) for t in qkv.split(C, dim=-1))
        att = causal_softmax(q @ k.transpose(-1, -2) / math.sqrt(HS)) @ v
        x = x + att.transpose(0, 1).reshape(T, C) @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
        a = layernorm(x, W[h + "ln_2.weight"], W[h + "ln_2.bias"], c["layer_norm_epsilon"])
        m = gelu_tanh(a @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"])
        x = x + m @ W[h + "mlp.c_proj.weight"] + W[h + "mlp.c_proj.bias"]
    x = layernorm(x, W[p + "ln_f.weight"], W[p + "ln_f.bias"], c["layer_norm_epsilon"])
    return x[-1] @ W[p + "wte.weight"].T


def rope(x, theta):
    """x [nh, T, HS] rotated at positions 0..T-1, HF rotate-half."""
    HS, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.float32) / HS))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(F), emb.sin().to(F)
    x1, x2 = x[..., : HS // 2], x[..., HS // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def llama_logits(W, c, ids):
    T, C, NH = len(ids), c["hidden_size"], c["num_attention_heads"]
    NKV = c.get("num_key_value_heads") or NH
    HS = c.get("head_dim") or C // NH
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    x = W["model.embed_tokens.weight"][ids]

    def lin(name, a):
        y = a @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    for l in range(c["num_hidden_layers"]):
        h = f"model.layers.{l}."
        a = rmsnorm(x, W[h + "input_layernorm.weight"], eps)
        q = lin(h + "self_attn.q_proj", a).view(T, NH, HS).transpose(0, 1)
        k = lin(h + "self_attn.k_proj", a).view(T, NKV, HS).transpose(0, 1)
        v = lin(h + "self_attn.v_proj", a).view(T, NKV, HS).transpose(0, 1)
        q, k = rope(q, theta), rope(k, theta)
        k = k.repeat_interleave(NH // NKV, dim=0)
        v = v.repeat_interleave(NH // NKV, dim=0)
        att = causal_softmax(q @ k.transpose(-1, -2) / math.sqrt(HS)) @ v
        x = x + lin(h + "self_attn.o_proj", att.transpose(0, 1).reshape(T, NH * HS))
        a = rmsnorm(x, W[h + "post_attention_layernorm.weight"], eps)
        g = lin(h + "mlp.gate_proj", a)
        x = x + lin(h + "mlp.down_proj", g * torch.sigmoid(g) * lin(h + "mlp.up_proj", a))
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x[-1] @ head.T


def hf_alibi_slopes(nh):
    p = 2 ** math.floor(math.log2(nh))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.int32))
    if p != nh:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32)
        n_rem = min(p, nh - p)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n_rem, 2, dtype=torch.int32))])
    return slopes.to(F)


def bloom_logits(W, c, ids):
    T, C, NH = len(ids), c["hidden_size"], c["n_head"]
    HS, eps = C // NH, c["layer_norm_epsilon"]
    p = "transformer."
    x = layernorm(W[p + "word_embeddings.weight"][ids], W[p + "word_embeddings_layernorm.weight"],
                  W[p + "word_embeddings_layernorm.bias"], eps)
    alibi = hf_alibi_slopes(NH)[:, None, None] * torch.arange(T, dtype=F)[None, None, :]  # [NH,1,T] key positions
    for l in range(c["n_layer"]):
        h = f"{p}h.{l}."
        a = layernorm(x, W[h + "input_layernorm.weight"], W[h + "input_layernorm.bias"], eps)
        qkv = (a @ W[h + "self_attention.query_key_value.weight"].T + W[h + "self_attention.query_key_value.bias"])
        qkv = qkv.view(T, NH, 3, HS)
        q, k, v = (qkv[:, :, i].transpose(0, 1) for i in range(3))
        att = causal_softmax(alibi + q @ k.transpose(-1, -2) / math.sqrt(HS)) @ v
        x = x + att.transpose(0, 1).reshape(T, C) @ W[h + "self_attention.dense.weight"].T + W[h + "self_attention.dense.bias"]
        a = layernorm(x, W[h + "post_attention_layernorm.weight"], W[h + "post_attention_layernorm.bias"], eps)
        m = gelu_tanh(a @ W[h + "mlp.dense_h_to_4h.weight"].T + W[h + "mlp.dense_h_to_4h.bias"])
        x = x + m @ W[h + "mlp.dense_4h_to_h.weight"].T + W[h + "mlp.dense_4h_to_h.bias"]
    x = layernorm(x, W[p + "ln_f.weight"], W[p + "ln_f.bias"], eps)
    return x[-1] @ W[p + "word_embeddings.weight"].T


# Config overrides. Larger-than-default weights make the blocks matter: at
# 0.02 a tied-embedding BLOOM just repeats its last input token.
FAMILIES = {
    "gpt2": (gpt2_logits, ["initializer_range=0.15"]),
    "llama": (llama_logits, ["initializer_range=0.15", "num_attention_heads=4", "num_key_value_heads=2"]),
    "bloom": (bloom_logits, ["initializer_range=0.8", "hidden_size=48", "n_head=6"]),
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompt = [5, 17, 42, 7, 99, 3]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fam, (fwd, sets) in FAMILIES.items():
            d = os.path.join(tmp, fam)
            run([args.cllm, "init", "--arch", fam, "--preset", "tiny", "--seed", "3", "--out", d, "--set", *sets])
            out = run([args.cllm, "generate", "--model", d, "--prompt-ids", ",".join(map(str, prompt)), "--greedy",
                       "--ignore-eos", "--output", "ids", "--max-new-tokens", str(args.new_tokens)])
            gen = [int(t) for t in out.split()]
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            W = read_safetensors(os.path.join(d, "model.safetensors"))
            if len(gen) != args.new_tokens:
                print(f"{fam}: expected {args.new_tokens} tokens, got {len(gen)}")
                failures += 1
                continue
            ties, bad = 0, 0
            seq = list(prompt)
            for i, t in enumerate(gen):
                logits = fwd(W, cfg, torch.tensor(seq))
                top = int(torch.argmax(logits))
                if t != top:
                    gap = float(logits[top] - logits[t])
                    if gap <= 1e-5 * float(logits.abs().max()):
                        ties += 1
                    else:
                        bad += 1
                        print(f"{fam}: step {i}: cllm chose {t}, reference argmax {top} (logit gap {gap:.3g})")
                seq.append(t)
            free = list(prompt)
            for _ in range(args.new_tokens):
                free.append(int(torch.argmax(fwd(W, cfg, torch.tensor(free)))))
            same = free[len(prompt):] == gen
            distinct = len(set(gen))
            print(f"{fam}: {len(gen)} tokens ({distinct} distinct), mismatches {bad}, ties {ties}, "
                  f"free-running torch greedy {'identical' if same else 'differs'}")
            if distinct < 3:
                print(f"{fam}: continuation too repetitive to be a meaningful test: {gen}")
                bad += 1
            failures += bad
    print("FAILED" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
