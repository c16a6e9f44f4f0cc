#!/usr/bin/python3
"""
Plain-torch reference implementations of the three model families cllm
trains, with the semantics of Hugging Face transformers' GPT2LMHeadModel,
LlamaForCausalLM and BloomForCausalLM (eval mode: no dropout), plus the HF
folder format (config.json + safetensors) and the JSONL data format.

The models are written functionally: a model is a config dict plus a dict
mapping HF parameter names to tensors. That keeps the parameter names
identical to what HF saves and makes float64 reference gradients a matter of
converting the dict.

Debian's torch 1.13 is the target (/usr/bin/python3); neither transformers
nor safetensors is needed.

CLI (mirrors the cllm commands so either side can be checked by hand):
  hf_models.py init  --arch gpt2|llama|bloom [--preset NAME] [--set k=v ...]
                     [--seed N] [--dtype F32|F16|BF16] --out DIR
  hf_models.py grad  --model DIR --data FILE --seq-len T --batch-size B
                     --out GRADS.safetensors
  hf_models.py train --model DIR --data FILE --out DIR --optimizer sgd|adamw
                     --lr X --steps N --batch-size B --seq-len T
                     [--weight-decay W] [--grad-clip G]
"""

import argparse
import json
import math
import os
import struct
import sys
import time
from collections import OrderedDict

import torch
import torch.nn.functional as F

# The fallback tests cap oneDNN's ISA (ONEDNN_MAX_CPU_ISA=AVX2) for cllm's
# sake, and torch's own oneDNN reads the same variable. On a CPU with
# AVX512-BF16, torch still routes bf16 matmuls to oneDNN, which then has no
# kernel under the cap ("could not create a primitive descriptor
# iterator"): the reference takes torch's native kernels instead.
if os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"):
    torch.backends.mkldnn.enabled = False

IGNORE_INDEX = -100
PAD_ID = 0

# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------


def gpt2_config(vocab_size=101, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                n_inner=None, layer_norm_epsilon=1e-5, **extra):
    cfg = OrderedDict(
        architectures=["GPT2LMHeadModel"],
        model_type="gpt2",
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_inner=n_inner,
        layer_norm_epsilon=layer_norm_epsilon,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        scale_attn_weights=True,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    cfg.update(extra)
    return cfg


def llama_config(vocab_size=101, hidden_size=48, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=None, rms_norm_eps=1e-6,
                 rope_theta=10000.0, max_position_embeddings=64, attention_bias=False,
                 mlp_bias=False, tie_word_embeddings=False, **extra):
    cfg = OrderedDict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        rms_norm_eps=rms_norm_eps,
        rope_theta=rope_theta,
        max_position_embeddings=max_position_embeddings,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
        tie_word_embeddings=tie_word_embeddings,
        hidden_act="silu",
        attention_dropout=0.0,
        torch_dtype="float32",
    )
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(extra)
    return cfg


def bloom_config(vocab_size=101, hidden_size=48, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
                 **extra):
    cfg = OrderedDict(
        architectures=["BloomForCausalLM"],
        model_type="bloom",
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        n_layer=n_layer,
        n_head=n_head,
        layer_norm_epsilon=layer_norm_epsilon,
        apply_residual_connection_post_layernorm=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pretraining_tp=1,
        slow_but_exact=False,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    cfg.update(extra)
    return cfg


CONFIG_BUILDERS = {"gpt2": gpt2_config, "llama": llama_config, "bloom": bloom_config}

# Benchmark presets, shared with `cllm init --preset` (same numbers).
PRESETS = {
    "gpt2-124M": ("gpt2", dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
                               n_head=12)),
    "llama-100M": ("llama", dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                 num_hidden_layers=12, num_attention_heads=12,
                                 num_key_value_heads=4, max_position_embeddings=2048,
                                 rope_theta=10000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False)),
}


REQUIRED_KEYS = {
    "gpt2": ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"),
    "llama": ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "rms_norm_eps"),
    "bloom": ("vocab_size", "hidden_size", "n_layer", "n_head"),
}


def validate_config(cfg):
    t = cfg.get("model_type")
    if t not in REQUIRED_KEYS:
        raise ValueError("config.json: unknown model_type %r" % (t,))
    for k in REQUIRED_KEYS[t]:
        if k not in cfg:
            raise ValueError("config.json: missing key %s" % k)
    if t == "llama" and "num_key_value_heads" not in cfg:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]  # HF default


def make_config(arch, **overrides):
    if arch not in CONFIG_BUILDERS:
        raise ValueError("unknown arch %r" % arch)
    return CONFIG_BUILDERS[arch](**overrides)


def llama_head_dim(cfg):
    hd = cfg.get("head_dim")
    return hd if hd is not None else cfg["hidden_size"] // cfg["num_attention_heads"]


def is_tied(cfg):
    # HF's PretrainedConfig default for tie_word_embeddings is True.
    return bool(cfg.get("tie_word_embeddings", True))


# --------------------------------------------------------------------------
# Parameter shapes and random init
# --------------------------------------------------------------------------


def param_shapes(cfg):
    """OrderedDict name -> shape of every tensor HF saves for this config."""
    t = cfg["model_type"]
    s = OrderedDict()
    if t == "gpt2":
        C, V = cfg["n_embd"], cfg["vocab_size"]
        inner = cfg.get("n_inner") or 4 * C
        s["transformer.wte.weight"] = (V, C)
        s["transformer.wpe.weight"] = (cfg["n_positions"], C)
        for i in range(cfg["n_layer"]):
            p = "transformer.h.%d." % i
            s[p + "ln_1.weight"] = (C,)
            s[p + "ln_1.bias"] = (C,)
            # Conv1D: weight stored [in, out]; y = x @ W + b.
            s[p + "attn.c_attn.weight"] = (C, 3 * C)
            s[p + "attn.c_attn.bias"] = (3 * C,)
            s[p + "attn.c_proj.weight"] = (C, C)
            s[p + "attn.c_proj.bias"] = (C,)
            s[p + "ln_2.weight"] = (C,)
            s[p + "ln_2.bias"] = (C,)
            s[p + "mlp.c_fc.weight"] = (C, inner)
            s[p + "mlp.c_fc.bias"] = (inner,)
            s[p + "mlp.c_proj.weight"] = (inner, C)
            s[p + "mlp.c_proj.bias"] = (C,)
        s["transformer.ln_f.weight"] = (C,)
        s["transformer.ln_f.bias"] = (C,)
        if not is_tied(cfg):
            s["lm_head.weight"] = (V, C)
    elif t == "llama":
        C, V, I = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], llama_head_dim(cfg)
        ab, mb = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
        s["model.embed_tokens.weight"] = (V, C)
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % i
            s[p + "input_layernorm.weight"] = (C,)
            # nn.Linear: weight stored [out, in]; y = x @ W^T + b.
            for name, out_f, in_f in (("q_proj", H * hd, C), ("k_proj", KV * hd, C),
                                      ("v_proj", KV * hd, C), ("o_proj", C, H * hd)):
                s[p + "self_attn.%s.weight" % name] = (out_f, in_f)
                if ab:
                    s[p + "self_attn.%s.bias" % name] = (out_f,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            for name, out_f, in_f in (("gate_proj", I, C), ("up_proj", I, C), ("down_proj", C, I)):
                s[p + "mlp.%s.weight" % name] = (out_f, in_f)
                if mb:
                    s[p + "mlp.%s.bias" % name] = (out_f,)
        s["model.norm.weight"] = (C,)
        if not is_tied(cfg):
            s["lm_head.weight"] = (V, C)
    elif t == "bloom":
        C, V = cfg["hidden_size"], cfg["vocab_size"]
        s["transformer.word_embeddings.weight"] = (V, C)
        s["transformer.word_embeddings_layernorm.weight"] = (C,)
        s["transformer.word_embeddings_layernorm.bias"] = (C,)
        for i in range(cfg["n_layer"]):
            p = "transformer.h.%d." % i
            s[p + "input_layernorm.weight"] = (C,)
            s[p + "input_layernorm.bias"] = (C,)
            s[p + "self_attention.query_key_value.weight"] = (3 * C, C)
            s[p + "self_attention.query_key_value.bias"] = (3 * C,)
            s[p + "self_attention.dense.weight"] = (C, C)
            s[p + "self_attention.dense.bias"] = (C,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            s[p + "post_attention_layernorm.bias"] = (C,)
            s[p + "mlp.dense_h_to_4h.weight"] = (4 * C, C)
            s[p + "mlp.dense_h_to_4h.bias"] = (4 * C,)
            s[p + "mlp.dense_4h_to_h.weight"] = (C, 4 * C)
            s[p + "mlp.dense_4h_to_h.bias"] = (C,)
        s["transformer.ln_f.weight"] = (C,)
        s["transformer.ln_f.bias"] = (C,)
        if not is_tied(cfg):
            s["lm_head.weight"] = (V, C)
    else:
        raise ValueError("unknown model_type %r" % t)
    return s


def _is_norm_weight(name):
    return name.endswith(".weight") and ("ln_" in name or "layernorm" in name
                                         or name == "model.norm.weight")


def init_params(cfg, seed=0, std=0.05):
    """Random fp32 parameters. Norm weights are 1 + 0.1*randn and every bias
    is 0.1*randn (never the HF zeros/ones), so that a norm or bias bug cannot
    hide behind a neutral value."""
    g = torch.Generator().manual_seed(seed)
    params = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if _is_norm_weight(name):
            params[name] = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            params[name] = 0.1 * r
        elif name.endswith("wpe.weight"):
            params[name] = 0.02 * r
        else:
            params[name] = std * r
    return params


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: upcast to fp32, x * rsqrt(mean(x^2) + eps), cast back,
    # then scale by the weight. Inputs already wider than fp32 (the float64
    # reference) stay in their own precision so the reference remains exact.
    in_dtype = x.dtype
    work = torch.promote_types(in_dtype, torch.float32)
    h = x.to(work)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(in_dtype)


def gelu_tanh(x, c=math.sqrt(2.0 / math.pi)):
    # HF "gelu_new" (NewGELUActivation): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))


def bloom_gelu(x):
    # HF bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 x^2))).
    # Same function as gelu_new up to the rounded constant (rel. 1e-9).
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def causal_softmax(scores, upcast):
    """scores [..., T, T]; masked entries get the dtype's most negative value
    (as HF does), then softmax over keys, in fp32 when `upcast`."""
    T = scores.shape[-1]
    keep = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    if upcast:
        return F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)
                         ).to(scores.dtype)
    return F.softmax(scores, dim=-1)


def rope_cos_sin(T, hd, theta, dtype):
    # HF LlamaRotaryEmbedding (default rope): inv_freq = 1/theta^(arange(0,hd,2)/hd),
    # freqs = pos * inv_freq, emb = cat(freqs, freqs). HF computes this in fp32;
    # here it is computed in float64 and cast, which differs by one fp32 rounding.
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def alibi_slopes(n_head):
    """Slopes of HF's build_alibi_tensor, including its rule for head counts
    that are not a power of two. Returns a float32 tensor [n_head]."""
    p2 = 2 ** int(math.floor(math.log2(n_head)))
    base = torch.tensor(2.0 ** (-(2.0 ** -(math.log2(p2) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p2, dtype=torch.int32))
    if p2 != n_head:
        extra_base = torch.tensor(2.0 ** (-(2.0 ** -(math.log2(2 * p2) - 3))), dtype=torch.float32)
        n_rest = min(p2, n_head - p2)
        extra = torch.pow(extra_base, torch.arange(1, 1 + 2 * n_rest, 2, dtype=torch.int32))
        slopes = torch.cat([slopes, extra])
    return slopes


# --------------------------------------------------------------------------
# Forward passes: (cfg, params, input_ids [B,T]) -> logits [B,T,V]
# --------------------------------------------------------------------------


def _split_heads(x, n, hd):
    B, T, _ = x.shape
    return x.view(B, T, n, hd).transpose(1, 2)  # [B, n, T, hd]


def _merge_heads(x):
    B, n, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, n * hd)


def gpt2_forward(cfg, p, ids):
    B, T = ids.shape
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = C // H
    h = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        q_ = "transformer.h.%d." % i
        a = layer_norm(h, p[q_ + "ln_1.weight"], p[q_ + "ln_1.bias"], eps)
        qkv = a @ p[q_ + "attn.c_attn.weight"] + p[q_ + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = _split_heads(q, H, hd), _split_heads(k, H, hd), _split_heads(v, H, hd)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = causal_softmax(scores, upcast=False) @ v
        h = h + _merge_heads(att) @ p[q_ + "attn.c_proj.weight"] + p[q_ + "attn.c_proj.bias"]
        m = layer_norm(h, p[q_ + "ln_2.weight"], p[q_ + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[q_ + "mlp.c_fc.weight"] + p[q_ + "mlp.c_fc.bias"])
        h = h + m @ p[q_ + "mlp.c_proj.weight"] + p[q_ + "mlp.c_proj.bias"]
    h = layer_norm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if is_tied(cfg) else p["lm_head.weight"]
    return h @ head.t()


def _linear(x, p, name):
    y = x @ p[name + ".weight"].t()
    b = p.get(name + ".bias")
    return y if b is None else y + b


def llama_forward(cfg, p, ids):
    B, T = ids.shape
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], llama_head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    rep = H // KV
    h = p["model.embed_tokens.weight"][ids]
    cos, sin = rope_cos_sin(T, hd, float(cfg.get("rope_theta", 10000.0)), h.dtype)
    for i in range(cfg["num_hidden_layers"]):
        q_ = "model.layers.%d." % i
        a = rms_norm(h, p[q_ + "input_layernorm.weight"], eps)
        q = _split_heads(_linear(a, p, q_ + "self_attn.q_proj"), H, hd)
        k = _split_heads(_linear(a, p, q_ + "self_attn.k_proj"), KV, hd)
        v = _split_heads(_linear(a, p, q_ + "self_attn.v_proj"), KV, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1.
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = causal_softmax(scores, upcast=True) @ v
        h = h + _linear(_merge_heads(att), p, q_ + "self_attn.o_proj")
        m = rms_norm(h, p[q_ + "post_attention_layernorm.weight"], eps)
        m = F.silu(_linear(m, p, q_ + "mlp.gate_proj")) * _linear(m, p, q_ + "mlp.up_proj")
        h = h + _linear(m, p, q_ + "mlp.down_proj")
    h = rms_norm(h, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if is_tied(cfg) else p["lm_head.weight"]
    return h @ head.t()


def bloom_forward(cfg, p, ids):
    B, T = ids.shape
    C, H, eps = cfg["hidden_size"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = C // H
    if cfg.get("apply_residual_connection_post_layernorm", False):
        raise NotImplementedError("apply_residual_connection_post_layernorm=true")
    h = p["transformer.word_embeddings.weight"][ids]
    h = layer_norm(h, p["transformer.word_embeddings_layernorm.weight"],
                   p["transformer.word_embeddings_layernorm.bias"], eps)
    # ALiBi: slope[h] * key_position, positions 0..T-1 (no padding mask:
    # right padding never precedes a real token).
    alibi = (alibi_slopes(H).to(h.dtype)[:, None, None]
             * torch.arange(T, dtype=h.dtype)[None, None, :])  # [H, 1, T]
    for i in range(cfg["n_layer"]):
        q_ = "transformer.h.%d." % i
        a = layer_norm(h, p[q_ + "input_layernorm.weight"], p[q_ + "input_layernorm.bias"], eps)
        qkv = _linear(a, p, q_ + "self_attention.query_key_value")  # [B,T,3C]
        qkv = qkv.view(B, T, H, 3, hd)  # per head: q | k | v
        q = qkv[..., 0, :].transpose(1, 2)
        k = qkv[..., 1, :].transpose(1, 2)
        v = qkv[..., 2, :].transpose(1, 2)
        scores = alibi + (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        att = causal_softmax(scores, upcast=True) @ v
        h = h + _linear(_merge_heads(att), p, q_ + "self_attention.dense")
        m = layer_norm(h, p[q_ + "post_attention_layernorm.weight"],
                       p[q_ + "post_attention_layernorm.bias"], eps)
        m = bloom_gelu(_linear(m, p, q_ + "mlp.dense_h_to_4h"))
        h = h + _linear(m, p, q_ + "mlp.dense_4h_to_h")
    h = layer_norm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.word_embeddings.weight"] if is_tied(cfg) else p["lm_head.weight"]
    return h @ head.t()


FORWARDS = {"gpt2": gpt2_forward, "llama": llama_forward, "bloom": bloom_forward}


def forward(cfg, params, ids):
    return FORWARDS[cfg["model_type"]](cfg, params, ids)


def causal_lm_loss(logits, labels):
    """HF causal LM loss: position t predicts labels[t+1]; cross entropy
    averaged over the targets that are not -100 in the whole batch.
    Returns (loss, number of counted targets)."""
    V = logits.shape[-1]
    shift_logits = logits[:, :-1, :].reshape(-1, V)
    shift_labels = labels[:, 1:].reshape(-1)
    n = int((shift_labels != IGNORE_INDEX).sum())
    loss = F.cross_entropy(shift_logits.to(torch.promote_types(logits.dtype, torch.float32)),
                           shift_labels, ignore_index=IGNORE_INDEX, reduction="mean")
    return loss, n


def model_loss(cfg, params, ids, labels):
    return causal_lm_loss(forward(cfg, params, ids), labels)


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def write_jsonl(path, samples):
    """samples: list of dicts with "input_ids" and optionally "labels"."""
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


def read_jsonl(path, vocab_size=None):
    """Samples of a JSONL file. Errors name the line as PATH:LINE; with
    vocab_size, token ids must lie in [0, vocab_size) (labels may be -100)."""
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = "%s:%d" % (path, lineno)
            try:
                s = json.loads(line)
            except ValueError as e:
                raise ValueError("%s: malformed JSON (%s)" % (where, e))
            if not isinstance(s, dict) or not isinstance(s.get("input_ids"), list):
                raise ValueError("%s: expected an object with an input_ids list" % where)
            for key, allow_ignore in (("input_ids", False), ("labels", True)):
                if key not in s:
                    continue
                for v in s[key]:
                    if not isinstance(v, int) or isinstance(v, bool):
                        raise ValueError("%s: %s holds a non-integer" % (where, key))
                    if allow_ignore and v == IGNORE_INDEX:
                        continue
                    if v < 0 or (vocab_size is not None and v >= vocab_size):
                        raise ValueError("%s: %s holds token id %d outside [0, %s)"
                                         % (where, key, v, vocab_size))
            if "labels" in s and len(s["labels"]) != len(s["input_ids"]):
                raise ValueError("%s: labels and input_ids differ in length" % where)
            out.append(s)
    return out


def make_batch(samples, seq_len):
    """Rows of [B, T] input_ids / labels. Longer samples are truncated to T;
    shorter ones are right-padded with token 0 and label -100. Labels default
    to the input ids."""
    B = len(samples)
    ids = torch.full((B, seq_len), PAD_ID, dtype=torch.long)
    labels = torch.full((B, seq_len), IGNORE_INDEX, dtype=torch.long)
    for r, s in enumerate(samples):
        y_full = s.get("labels", s["input_ids"])
        if len(y_full) != len(s["input_ids"]):
            raise ValueError("sample %d: labels and input_ids differ in length" % r)
        x = list(s["input_ids"])[:seq_len]
        y = list(y_full)[:seq_len]
        ids[r, :len(x)] = torch.tensor(x, dtype=torch.long)
        labels[r, :len(y)] = torch.tensor(y, dtype=torch.long)
    return ids, labels


def micro_batch(samples, step, batch_size, seq_len):
    """Batch for 0-based `step` with sequential order (--no-shuffle): sample i
    is in micro-batch i // B, row i % B; micro-batches cycle through the file
    (a trailing partial micro-batch is dropped)."""
    n_batches = len(samples) // batch_size
    if n_batches == 0:
        raise ValueError("fewer samples than the batch size")
    k = step % n_batches
    return make_batch(samples[k * batch_size:(k + 1) * batch_size], seq_len)


# --------------------------------------------------------------------------
# safetensors and HF folders
# --------------------------------------------------------------------------

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "F64": torch.float64, "I64": torch.int64}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_ST_RAW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
           torch.float64: torch.int64, torch.int64: torch.int64}


def _tensor_bytes(t):
    # Bytes through an integer view: numpy has no bfloat16, and the raw bit
    # pattern is what the file holds. Assumes a little-endian host.
    return t.contiguous().view(_ST_RAW[t.dtype]).numpy().tobytes()


def save_safetensors(path, tensors, dtype=None, metadata=None):
    """tensors: name -> tensor; dtype: "F32"/"F16"/"BF16" to convert to, or
    None to keep each tensor's dtype."""
    header = OrderedDict()
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    blobs = []
    off = 0
    for name, t in tensors.items():
        t = t.detach().cpu()
        if dtype is not None:
            t = t.to(_ST_DTYPES[dtype])
        data = _tensor_bytes(t)
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path, with_dtypes=False):
    """name -> tensor in the file's dtype (F32/F16/BF16/F64), file order.
    Each tensor is read straight into its own storage, so peak memory is the
    tensors themselves (this matters for the benchmark's RSS figures)."""
    size = os.path.getsize(path)
    out = OrderedDict()
    dtypes = OrderedDict()
    with open(path, "rb") as f:
        if size < 8:
            raise ValueError("%s: too short for a safetensors file" % path)
        (hlen,) = struct.unpack("<Q", f.read(8))
        if 8 + hlen > size:
            raise ValueError("%s: header length %d beyond end of file" % (path, hlen))
        header = json.loads(f.read(hlen).decode())
        base = 8 + hlen
        entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
        for name, e in sorted(entries, key=lambda kv: kv[1]["data_offsets"][0]):
            dt = _ST_DTYPES.get(e["dtype"])
            if dt is None:
                raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, e["dtype"]))
            a, b = e["data_offsets"]
            shape = [int(x) for x in e["shape"]]
            raw = torch.empty(shape, dtype=_ST_RAW[dt])
            nbytes = raw.numel() * raw.element_size()
            if b - a != nbytes or base + b > size:
                raise ValueError("%s: tensor %s data out of range or of the wrong size" % (path, name))
            f.seek(base + a)
            if nbytes and f.readinto(memoryview(raw.numpy()).cast("B")) != nbytes:
                raise ValueError("%s: short read in tensor %s" % (path, name))
            out[name] = raw.view(dt)
            dtypes[name] = e["dtype"]
    return (out, dtypes) if with_dtypes else out


def save_hf_folder(dirpath, cfg, state_dict, dtype="F32", shards=1):
    """config.json plus model.safetensors, or with shards > 1, files
    model-0000i-of-0000n.safetensors and model.safetensors.index.json."""
    os.makedirs(dirpath, exist_ok=True)
    cfg = OrderedDict(cfg)
    cfg["torch_dtype"] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    with open(os.path.join(dirpath, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    names = list(state_dict.keys())
    if shards <= 1:
        save_safetensors(os.path.join(dirpath, "model.safetensors"), state_dict, dtype)
        return
    per = (len(names) + shards - 1) // shards
    weight_map = OrderedDict()
    total = 0
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = OrderedDict((n, state_dict[n]) for n in names[s * per:(s + 1) * per])
        save_safetensors(os.path.join(dirpath, fname), part, dtype)
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * torch.empty(0, dtype=_ST_DTYPES[dtype]).element_size()
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def load_hf_folder(dirpath, to_float32=True):
    """(config dict, name -> tensor). Handles a single model.safetensors or a
    sharded folder with model.safetensors.index.json."""
    with open(os.path.join(dirpath, "config.json")) as f:
        cfg = json.load(f, object_pairs_hook=OrderedDict)
    validate_config(cfg)
    index = os.path.join(dirpath, "model.safetensors.index.json")
    tensors = OrderedDict()
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        for fname in sorted(set(weight_map.values())):
            part = load_safetensors(os.path.join(dirpath, fname))
            for n, t in part.items():
                if weight_map.get(n) != fname:
                    raise ValueError("%s: tensor %s not listed for this shard" % (fname, n))
                tensors[n] = t
        missing = set(weight_map) - set(tensors)
        if missing:
            raise ValueError("index lists tensors absent from the shards: %s" % sorted(missing))
    else:
        tensors = load_safetensors(os.path.join(dirpath, "model.safetensors"))
    if to_float32:
        tensors = OrderedDict((n, t.float()) for n, t in tensors.items())
    # Order as the model declares them (not file order) for stable reports.
    order = list(param_shapes(cfg).keys())
    extra = [n for n in tensors if n not in order]
    if extra:
        raise ValueError("unexpected tensors: %s" % extra)
    missing = [n for n in order if n not in tensors]
    if missing:
        raise ValueError("missing tensors: %s" % missing)
    for n, shape in param_shapes(cfg).items():
        if tuple(tensors[n].shape) != tuple(shape):
            raise ValueError("tensor %s has shape %s, expected %s"
                             % (n, list(tensors[n].shape), list(shape)))
    return cfg, OrderedDict((n, tensors[n]) for n in order)


# --------------------------------------------------------------------------
# Reference computations used by the tests and the benchmark
# --------------------------------------------------------------------------


def reference_grads(cfg, params, ids, labels, dtype=torch.float64):
    """Loss, counted targets and gradients (name -> tensor in `dtype`).
    Tied heads share the embedding tensor, so its gradient includes the
    head's contribution."""
    leaves = OrderedDict((n, t.detach().to(dtype).requires_grad_(True)) for n, t in params.items())
    loss, n = model_loss(cfg, leaves, ids, labels)
    loss.backward()
    return float(loss), n, OrderedDict((k, v.grad.detach()) for k, v in leaves.items())


def reference_train(cfg, params, samples, optimizer, lr, steps, batch_size, seq_len,
                    weight_decay=0.0, grad_clip=0.0, dtype=torch.float32, step_hook=None):
    """The minimal training loop cllm's `train --no-shuffle` is checked
    against. Returns (final params, per-step losses).

    AdamW weight decay applies to matrices and embeddings only: biases and
    norm weights (the 1-D tensors) are not decayed, the usual convention of
    HF's Trainer and of cllm; SGD is plain SGD (no momentum, weight decay
    not applied); grad_clip <= 0 disables clipping,
    otherwise the global L2 norm over all parameters is clipped with
    torch.nn.utils.clip_grad_norm_."""
    leaves = OrderedDict((n, t.detach().to(dtype).clone().requires_grad_(True))
                         for n, t in params.items())
    plist = list(leaves.values())
    if optimizer == "sgd":
        opt = torch.optim.SGD(plist, lr=lr)
    elif optimizer == "adamw":
        decay = [t for t in plist if t.dim() >= 2]
        no_decay = [t for t in plist if t.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=lr, betas=(0.9, 0.999), eps=1e-8)
    else:
        raise ValueError("unknown optimizer %r" % optimizer)
    losses = []
    for step in range(steps):
        t0 = time.perf_counter()
        ids, labels = micro_batch(samples, step, batch_size, seq_len)
        opt.zero_grad(set_to_none=True)
        loss, _ = model_loss(cfg, leaves, ids, labels)
        loss.backward()
        if grad_clip and grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(plist, grad_clip)
        opt.step()
        losses.append(float(loss))
        if step_hook is not None:
            step_hook(step, float(loss), time.perf_counter() - t0)
    return OrderedDict((n, t.detach()) for n, t in leaves.items()), losses


def matmul_params(cfg):
    """Number of weights used in matrix products per token (the LM head
    counted even when tied; embeddings lookups, norms and biases not)."""
    n = 0
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 2 and "wte" not in name and "wpe" not in name \
                and "embed_tokens" not in name and "word_embeddings" not in name:
            n += shape[0] * shape[1]
    # LM head: V x C, tied or not (lm_head.weight already counted if untied).
    if is_tied(cfg):
        V = cfg["vocab_size"]
        C = cfg.get("n_embd") or cfg["hidden_size"]
        n += V * C
    return n


def attention_width(cfg):
    t = cfg["model_type"]
    if t == "gpt2":
        return cfg["n_embd"], cfg["n_layer"]
    if t == "llama":
        return cfg["num_attention_heads"] * llama_head_dim(cfg), cfg["num_hidden_layers"]
    return cfg["hidden_size"], cfg["n_layer"]


def train_step_flops(cfg, batch_size, seq_len):
    """Model FLOPs of one training step (forward + backward):
    6 * matmul_params * B*T  +  6 * L * B * T^2 * A, where A is the attention
    width (heads * head_dim). The attention term counts QK^T and PV (2*2*T^2*A
    multiply-adds forward per sequence and layer, x3 for forward + backward)
    over the causal half of the T x T scores."""
    A, L = attention_width(cfg)
    tokens = batch_size * seq_len
    return 6 * matmul_params(cfg) * tokens + 6 * L * batch_size * seq_len * seq_len * A


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _parse_value(s):
    try:
        return json.loads(s)
    except ValueError:
        return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("init", help="write a randomly initialised HF folder")
    a.add_argument("--arch", choices=sorted(CONFIG_BUILDERS))
    a.add_argument("--preset", choices=sorted(PRESETS))
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, value parsed as JSON")
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--std", type=float, default=0.02)
    a.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    a.add_argument("--shards", type=int, default=1)
    a.add_argument("--out", required=True)
    g = sub.add_parser("grad", help="loss and float64 gradients of the first B samples")
    for p in (g,):
        p.add_argument("--model", required=True)
        p.add_argument("--data", required=True)
        p.add_argument("--seq-len", type=int, required=True)
        p.add_argument("--batch-size", type=int, required=True)
        p.add_argument("--out", required=True)
    t = sub.add_parser("train", help="fp32 reference training loop (sequential batches)")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch-size", type=int, required=True)
    t.add_argument("--seq-len", type=int, required=True)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--grad-clip", type=float, default=0.0)
    t.add_argument("--no-shuffle", action="store_true",
                   help="accepted for symmetry with cllm; sequential order is the only one here")
    t.add_argument("--seed", type=int, default=1, help="accepted; unused (no randomness)")
    args = ap.parse_args(argv)

    if args.cmd == "init":
        if args.preset:
            arch, over = PRESETS[args.preset]
            if args.arch and args.arch != arch:
                ap.error("--preset %s is a %s model" % (args.preset, arch))
        elif args.arch:
            arch, over = args.arch, {}
        else:
            ap.error("--arch or --preset is required")
        over = dict(over)
        for kv in args.set:
            k, _, v = kv.partition("=")
            over[k] = _parse_value(v)
        cfg = make_config(arch, **over)
        params = init_params(cfg, seed=args.seed, std=args.std)
        save_hf_folder(args.out, cfg, params, dtype=args.dtype, shards=args.shards)
        return 0
    try:
        cfg, params = load_hf_folder(args.model)
        samples = read_jsonl(args.data, cfg["vocab_size"])
    except (OSError, ValueError, KeyError) as e:
        print("hf_models %s: %s" % (args.cmd, e), file=sys.stderr)
        return 1
    if args.cmd == "grad":
        ids, labels = make_batch(samples[:args.batch_size], args.seq_len)
        loss, n, grads = reference_grads(cfg, params, ids, labels)
        save_safetensors(args.out, grads, dtype="F32")
        print(json.dumps({"loss": loss, "tokens": n}))
        return 0
    if args.cmd == "train":
        os.makedirs(args.out, exist_ok=True)
        mpath = os.path.join(args.out, "metrics.jsonl")
        with open(mpath, "w") as mf:
            def hook(step, loss, dt):
                mf.write(json.dumps({"step": step + 1, "loss": loss, "step_time": dt}) + "\n")
            final, _ = reference_train(cfg, params, samples, args.optimizer, args.lr, args.steps,
                                       args.batch_size, args.seq_len, args.weight_decay,
                                       args.grad_clip, step_hook=hook)
        save_hf_folder(args.out, cfg, final)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
