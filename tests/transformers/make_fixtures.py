#!/usr/bin/env python3
"""
Writes the fixtures under tests/data/transformers/: tiny models built and
run by Hugging Face transformers itself (and PEFT, where installed), so that
cllm is checked against the library its users come from, not only against
tests/ref/hf_models.py (our own torch reading of the same semantics).

It needs transformers and safetensors, which Debian's python3-torch lacks, so
it is run once on a machine that has them and its output is committed; the
test (tests/transformers_test.py) needs only cllm and Debian's torch.

For each model NAME it writes NAME/ (save_pretrained: config.json and
model.safetensors, float32) and NAME.expect.safetensors + NAME.expect.json:
  ids [B,T]              the batch (full rows, no padding; labels = ids)
  logits [B,T,V]         float64, transformers' forward in float64 eval mode
  grad.<param> ...       float64 gradients of HF's causal LM loss
  expect.json            loss, greedy continuation of a prompt (recomputed
                         in full for each token, float64), the smallest
                         top-1/top-2 logit gap of that loop and, for MoE
                         models, the smallest top-k router gap: a test can
                         only demand equal tokens where the gaps are clear
                         of fp32 rounding; library versions.
Seeds (and weight scales) are tried until those gaps exceed 1e-3 and the
greedy continuation holds at least 5 distinct tokens; GPT-2 and BLOOM, whose
output matrix is the embedding, repeat one token for every seed tried, and
keep the last one (its gaps are recorded; the test checks them).

  python3 make_fixtures.py --out DIR
"""

import argparse
import json
import os
import sys
import traceback

import torch

B, T, PROMPT, NEW = 3, 12, 5, 12
MIN_GAP = 1e-3


def log(*a):
    print(*a, flush=True)


def randomize(model, g, std):
    """Weights large enough that the logits are far from uniform: norms near 1,
    biases and matrices random (scaled by 1/sqrt(fan_in) * std)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                if n.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (std / fan_in ** 0.5))


def router_gap(out, k):
    rl = getattr(out, "router_logits", None)
    if not rl:
        return None
    gap = float("inf")
    for r in rl:
        s = r.sort(dim=-1, descending=True).values
        gap = min(gap, float((s[:, k - 1] - s[:, k]).min()))
    return gap


def run_model(model, V, g, moe_k=None):
    ids = torch.randint(1, V, (B, T), generator=g)
    kw = {"output_router_logits": True} if moe_k else {}
    model.zero_grad()
    out = model(input_ids=ids, labels=ids, **kw)
    # HF adds the load-balancing loss when router logits are output; the
    # fixtures use plain cross-entropy (router_aux_loss_coef is set to 0).
    loss = out.loss
    loss.backward()
    rgap = router_gap(out, moe_k) if moe_k else None
    prompt = torch.randint(1, V, (1, PROMPT), generator=g)
    seq = prompt.clone()
    lgap = float("inf")
    with torch.no_grad():
        for _ in range(NEW):
            o = model(input_ids=seq, **kw)
            last = o.logits[0, -1]
            top = last.topk(2).values
            lgap = min(lgap, float(top[0] - top[1]))
            if moe_k:
                rgap = min(rgap, router_gap(o, moe_k))
            seq = torch.cat([seq, last.argmax().view(1, 1)], dim=1)
    return ids, out.logits.detach(), loss, prompt[0].tolist(), seq[0, PROMPT:].tolist(), lgap, rgap


def build(kind, cfg_kw):
    import transformers as tf
    cls = {"gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel), "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "bloom": (tf.BloomConfig, tf.BloomForCausalLM), "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
           "llama_reward": (tf.LlamaConfig, tf.LlamaForSequenceClassification)}[kind]
    cfg = cls[0](**cfg_kw)
    # Plain eager code paths: fused kernels (grouped_mm experts) refuse float64.
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(cfg, attr, "eager")
        except Exception:
            pass
    return cfg, cls[1]


def eager(model):
    try:
        model.set_experts_implementation("eager")
    except Exception:
        pass
    return model


def save_expect(out, name, tensors, meta):
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.path.join(out, name + ".expect.safetensors"))
    with open(os.path.join(out, name + ".expect.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def versions():
    import transformers
    v = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import safetensors
        v["safetensors"] = safetensors.__version__
    except Exception:
        pass
    try:
        import peft
        v["peft"] = peft.__version__
    except Exception:
        pass
    return v


def causal(out, name, kind, cfg_kw, moe_k=None):
    V = cfg_kw["vocab_size"]
    for seed in range(120):
        std = (1.0, 0.7, 0.5, 0.35)[seed % 4]
        g = torch.Generator().manual_seed(1000 + seed)
        cfg, cls = build(kind, cfg_kw)
        torch.manual_seed(seed)
        model = eager(cls(cfg).float().eval())
        randomize(model, g, std)
        d = os.path.join(out, name)
        model.save_pretrained(d, safe_serialization=True)
        saved_keys = sorted(__import__("safetensors").safe_open(os.path.join(d, "model.safetensors"), "pt").keys())
        m64 = model.double()
        ids, logits, loss, prompt, cont, lgap, rgap = run_model(m64, V, g, moe_k)
        # a continuation that varies exercises the KV cache; one repeated
        # token would pass with a broken one
        if lgap > MIN_GAP and (rgap is None or rgap > MIN_GAP) and len(set(cont)) >= 5:
            break
        log("%s: seed %d gaps %.2e %s, %d distinct tokens, retrying" % (name, seed, lgap, rgap, len(set(cont))))
    tensors = {"ids": ids.to(torch.int64), "logits": logits}
    for n, p in m64.named_parameters():
        if p.grad is not None:
            tensors["grad." + n] = p.grad.detach()
    meta = {"kind": kind, "loss": float(loss), "prompt": prompt, "greedy": cont, "min_logit_gap": lgap, "std": std,
            "min_router_gap": rgap, "saved_keys": saved_keys,
            "param_names": [n for n, _ in m64.named_parameters()], "versions": versions(), "seed": seed}
    save_expect(out, name, tensors, meta)
    log("%s: loss %.6f gaps %.2e %s keys %d" % (name, float(loss), lgap, rgap, len(saved_keys)))
    return model, cfg, g


def reward(out):
    name = "llama_reward"
    cfg_kw = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, num_labels=1, pad_token_id=0,
                  tie_word_embeddings=False)
    g = torch.Generator().manual_seed(77)
    cfg, cls = build("llama_reward", cfg_kw)
    model = cls(cfg).float().eval()
    randomize(model, g, 1.0)
    d = os.path.join(out, name)
    model.save_pretrained(d, safe_serialization=True)
    m64 = model.double()
    rows, rewards = [], []
    with torch.no_grad():
        for L in (7, 12, 3):
            x = torch.randint(1, 96, (1, L), generator=g)
            rows.append(x[0].tolist())
            rewards.append(float(m64(input_ids=x).logits[0, 0]))
    save_expect(out, name, {"rewards": torch.tensor(rewards, dtype=torch.float64)},
                {"kind": "llama_reward", "rows": rows, "rewards": rewards, "versions": versions()})
    log("%s: rewards %s" % (name, rewards))


def lora(out, base_name, base_model, g):
    import peft
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"],
                          lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
    base = base_model.float()
    pm = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    d = os.path.join(out, base_name + "_lora")
    pm.save_pretrained(d)
    pm = pm.double().eval()
    V = base.config.vocab_size
    ids = torch.randint(1, V, (B, T), generator=g)
    o = pm(input_ids=ids, labels=ids)
    save_expect(out, base_name + "_lora", {"ids": ids, "logits": o.logits.detach()},
                {"kind": "lora", "base": base_name, "loss": float(o.loss), "versions": versions()})
    log("%s_lora: loss %.6f" % (base_name, float(o.loss)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(4)
    log("versions", versions())
    jobs = [
        ("gpt2", "gpt2", dict(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                              activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        ("llama", "llama", dict(vocab_size=96, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)),
        ("llama_tied_bias", "llama", dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                          max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                                          tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
        ("bloom", "bloom", dict(vocab_size=96, hidden_size=48, n_layer=2, n_head=6, layer_norm_epsilon=1e-5,
                                hidden_dropout=0.0, attention_dropout=0.0)),
        ("mixtral", "mixtral", dict(vocab_size=96, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.0,
                                    rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False)),
        ("mixtral_window", "mixtral", dict(vocab_size=96, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.0,
                                           rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False)),
    ]
    failed = 0
    built = {}
    for name, kind, kw in jobs:
        try:
            built[name] = causal(a.out, name, kind, kw, moe_k=kw.get("num_experts_per_tok"))
        except Exception:
            failed += 1
            log("FAILED", name)
            traceback.print_exc()
    for fn in (lambda: reward(a.out), lambda: lora(a.out, "llama", *[built["llama"][0], built["llama"][2]])):
        try:
            fn()
        except Exception:
            failed += 1
            traceback.print_exc()
    log("failed", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
