#!/usr/bin/python3
"""
LoRA against an independent torch LoRA (PEFT's math written out here: the
layer's weight becomes W + scale * B @ A, transposed for GPT-2's Conv1D,
scale = lora_alpha / r or lora_alpha / sqrt(r) with use_rslora).

  grad-*      `cllm grad --adapter` on tiny GPT-2, LLaMA and BLOOM models
              with PEFT-format adapter folders written here (B non-zero):
              loss and the gradient of every trainable tensor (lora_A,
              lora_B, trained biases, modules_to_save) in float64 torch;
              exactly those tensors are reported (the base has none);
              activation checkpointing gives the same bits
  train-sgd   `cllm train --adapter` with SGD: the adapters after 3 steps
              against torch's SGD on the same adapters
  resume      a run stopped at step 2 and resumed gives the bits of an
              uninterrupted one (AdamW, dropout 0.1, clipping)
  new         `cllm train --lora-r`: PEFT names and shapes in --out,
              lora_B zero-initialised in a step-0 run, adapter_config keys
  merge       `cllm lora merge` against W + scale * B A per tensor
  generate    greedy tokens of base + --adapter equal those of the merged model
  errors      unknown lora keys, targets matching nothing, an unexpected
              tensor in an adapter file: non-zero exit naming them
  mpi         (--case mpi) 2 ranks at ZeRO 1, 2 and 3 against one process
              (adapters within 1e-5 after 3 AdamW steps, losses within 1e-5;
              stopped at 2 and resumed: the straight run's bits); ZeRO 3 with
              the optimizer state offloaded (nvme) and QLoRA (nf4) at ZeRO 3
              against their one-process runs; offload_param (nvme) and
              pipeline parallelism refused by name

Run by ctest (label lora) as
  /usr/bin/python3 tests/lora_test.py --cllm build/cllm --build build
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

PASSED = 0
FAILED = 0
PREFIX = "base_model.model."


def check(name, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
    else:
        FAILED += 1
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail else ""))
    sys.stdout.flush()
    return ok


def run(cmd):
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, None, e.stdout or "", "timeout")


def rel(got, ref):
    got, ref = got.double(), ref.double()
    r = float(ref.norm())
    return float((got - ref).norm()) / (r if r > 0 else 1.0)


def linear_modules(cfg):
    """(module path, is Conv1D) of every linear layer but the head."""
    t = cfg["model_type"]
    out = []
    if t == "gpt2":
        for i in range(cfg["n_layer"]):
            for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                out.append(("transformer.h.%d.%s" % (i, m), True))
    elif t == "llama":
        for i in range(cfg["num_hidden_layers"]):
            for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                out.append(("model.layers.%d.%s" % (i, m), False))
    else:
        for i in range(cfg["n_layer"]):
            for m in ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                      "mlp.dense_4h_to_h"):
                out.append(("transformer.h.%d.%s" % (i, m), False))
    return out


def in_out(params, module, conv):
    w = params[module + ".weight"]
    return (w.shape[0], w.shape[1]) if conv else (w.shape[1], w.shape[0])


def make_adapter(d, cfg, params, modules, r_of, acfg, seed, extra=None):
    """Writes a PEFT adapter folder with random A and B; returns its tensors."""
    g = torch.Generator().manual_seed(seed)
    t = OrderedDict()
    for mod, conv in modules:
        i, o = in_out(params, mod, conv)
        r = r_of(mod)
        t[PREFIX + mod + ".lora_A.weight"] = (torch.rand(r, i, generator=g) - 0.5) * 0.4
        t[PREFIX + mod + ".lora_B.weight"] = (torch.rand(o, r, generator=g) - 0.5) * 0.4
    for name in (extra or []):  # trained copies, perturbed so they differ from the base
        t[PREFIX + name] = params[name] + 0.01 * torch.randn(params[name].shape, generator=g)
    os.makedirs(d, exist_ok=True)
    hm.save_safetensors(os.path.join(d, "adapter_model.safetensors"), t, dtype="F32")
    conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny",
            "inference_mode": True, "use_dora": False, "layer_replication": None, "revision": None}
    conf.update(acfg)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(conf, f)
    return t


def torch_lora_loss(cfg, base, adapter, scales, modules, dtype=torch.float64):
    """Loss of the base with the adapters folded in, and the leaves."""
    leaves = OrderedDict((k, v.detach().to(dtype).requires_grad_(True)) for k, v in adapter.items())
    p = OrderedDict((k, v.detach().to(dtype)) for k, v in base.items())
    for k, v in leaves.items():  # trained copies replace the base tensor
        name = k[len(PREFIX):]
        if ".lora_" not in name:
            p[name] = v
    for mod, conv in modules:
        A, B = leaves[PREFIX + mod + ".lora_A.weight"], leaves[PREFIX + mod + ".lora_B.weight"]
        delta = scales[mod] * (B @ A)
        p[mod + ".weight"] = p[mod + ".weight"] + (delta.t() if conv else delta)
    return p, leaves


def grads_of(cfg, base, adapter, scales, modules, ids, labels):
    p, leaves = torch_lora_loss(cfg, base, adapter, scales, modules)
    loss, n = hm.model_loss(cfg, p, ids, labels)
    loss.backward()
    return float(loss), n, OrderedDict((k, v.grad) for k, v in leaves.items())


def samples_for(cfg, T, n, seed=7):
    g = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    return [{"input_ids": torch.randint(0, V, (T + 1,), generator=g).tolist()} for _ in range(n)]


# ---------------------------------------------------------------- cases

def case_defs():
    gpt2 = hm.make_config("gpt2", vocab_size=101, n_positions=32, n_embd=48, n_layer=2, n_head=4)
    llama = hm.make_config("llama", vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                           num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)
    bloom = hm.make_config("bloom", vocab_size=101, hidden_size=48, n_layer=2, n_head=4)
    out = []
    # GPT-2: Conv1D layers (c_attn fused qkv, both c_proj), every bias trained
    mods = [m for m in linear_modules(gpt2) if m[0].endswith(("c_attn", "c_proj"))]
    out.append(("gpt2-conv1d-bias-all", gpt2, mods, {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_proj"],
                                                     "bias": "all", "fan_in_fan_out": True},
                lambda m: 4, lambda m: 8 / 4, "bias-all"))
    # LLaMA: all-linear, rank and alpha patterns, rsLoRA, lm_head saved
    mods = linear_modules(llama)
    rank = lambda m: 2 if m.endswith("o_proj") else 4
    alpha = lambda m: 3.0 if m.endswith("down_proj") else 16.0
    out.append(("llama-all-linear-rslora-patterns", llama, mods,
                {"r": 4, "lora_alpha": 16, "target_modules": "all-linear", "use_rslora": True,
                 "rank_pattern": {"o_proj": 2}, "alpha_pattern": {"down_proj": 3.0}, "modules_to_save": ["lm_head"]},
                rank, lambda m: alpha(m) / math.sqrt(rank(m)), "save-head"))
    # BLOOM: fused query_key_value and dense_4h_to_h by a regular expression,
    # layer 1 only, biases of the adapted layers trained
    mods = [m for m in linear_modules(bloom) if m[0].startswith("transformer.h.1.")
            and m[0].endswith(("query_key_value", "dense_4h_to_h"))]
    out.append(("bloom-regex-layer1-lora-only", bloom, mods,
                {"r": 3, "lora_alpha": 6, "target_modules": r".*\.(query_key_value|dense_4h_to_h)",
                 "layers_to_transform": [1], "bias": "lora_only"},
                lambda m: 3, lambda m: 2.0, "bias-lora"))
    return out


def extra_tensors(kind, params, mods):
    if kind == "bias-all":
        return [k for k in params if k.endswith(".bias")]
    if kind == "bias-lora":
        return [m + ".bias" for m, _ in mods if m + ".bias" in params]
    if kind == "save-head":
        return ["lm_head.weight"]
    return []


def test_grads(cllm, tmp):
    T, B = 12, 3
    for name, cfg, mods, acfg, r_of, s_of, kind in case_defs():
        d = os.path.join(tmp, name)
        params = hm.init_params(cfg, seed=3)
        hm.save_hf_folder(d, cfg, params)
        params = hm.load_hf_folder(d)[1]
        ad = os.path.join(tmp, name + "-adapter")
        adapter = make_adapter(ad, cfg, params, mods, r_of, acfg, seed=5, extra=extra_tensors(kind, params, mods))
        data = os.path.join(tmp, name + ".jsonl")
        samples = samples_for(cfg, T, B)
        hm.write_jsonl(data, samples)
        outs = []
        for ckpt in (False, True):
            gp = os.path.join(tmp, "%s-%d.safetensors" % (name, ckpt))
            r = run([cllm, "grad", "--model", d, "--adapter", ad, "--data", data, "--seq-len", str(T),
                     "--batch-size", str(B), "--out", gp] + (["--grad-ckpt"] if ckpt else []))
            if not check("grad %s%s: exit 0" % (name, " grad-ckpt" if ckpt else ""), r.returncode == 0,
                         r.stderr.strip()[-300:]):
                return
            outs.append((json.loads(r.stdout.strip().splitlines()[-1]), hm.load_safetensors(gp)))
        ids, labels = hm.make_batch(samples, T)
        scales = {m: s_of(m) for m, _ in mods}
        ref_loss, ref_n, ref = grads_of(cfg, params, adapter, scales, mods, ids, labels)
        line, got = outs[0]
        check("grad %s: loss" % name, abs(line["loss"] - ref_loss) <= 1e-5 * abs(ref_loss),
              "%.9g vs %.9g" % (line["loss"], ref_loss))
        check("grad %s: exactly the trainable tensors" % name, set(got) == set(ref),
              "extra %s missing %s" % (sorted(set(got) - set(ref))[:3], sorted(set(ref) - set(got))[:3]))
        worst = max((rel(got[k], ref[k]), k) for k in ref if k in got)
        check("grad %s: every gradient (rel L2 <= 1e-4)" % name, worst[0] <= 1e-4, "worst %.2e %s" % worst)
        same = all(torch.equal(outs[0][1][k], outs[1][1][k]) for k in got)
        check("grad %s: activation checkpointing gives the same bits" % name, same)
        # bf16 matmuls of the frozen base, fp32 adapters: within bf16's rounding of the float64 values
        gp = os.path.join(tmp, "%s-bf16.safetensors" % name)
        r = run([cllm, "grad", "--model", d, "--adapter", ad, "--data", data, "--seq-len", str(T), "--batch-size",
                 str(B), "--out", gp, "--precision", "bf16"])
        if check("grad %s bf16: exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            g16 = hm.load_safetensors(gp)
            worst = max((rel(g16[k], ref[k]), k) for k in ref)
            check("grad %s bf16: every gradient within rel L2 3e-2" % name, worst[0] <= 3e-2, "worst %.2e %s" % worst)


def sgd_reference(cfg, params, adapter, scales, mods, samples, lr, steps, B, T):
    cur = OrderedDict((k, v.double()) for k, v in adapter.items())
    for s in range(steps):
        ids, labels = hm.micro_batch(samples, s, B, T)
        _, _, g = grads_of(cfg, params, cur, scales, mods, ids, labels)
        cur = OrderedDict((k, v - lr * g[k]) for k, v in cur.items())
    return cur


def train_cmd(cllm, model, data, out, steps, extra):
    return [cllm, "train", "--model", model, "--data", data, "--out", out, "--steps", str(steps), "--batch-size", "3",
            "--seq-len", "12", "--no-shuffle", "--log", "quiet", "--seed", "1"] + extra


def test_train(cllm, tmp):
    name, cfg, mods, acfg, r_of, s_of, kind = case_defs()[1]  # llama: all-linear, patterns, saved head
    d = os.path.join(tmp, name)  # written by test_grads
    params = hm.load_hf_folder(d)[1]
    ad = os.path.join(tmp, name + "-adapter")
    adapter = hm.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
    samples = samples_for(cfg, 12, 9, seed=11)
    data = os.path.join(tmp, "train.jsonl")
    hm.write_jsonl(data, samples)
    out = os.path.join(tmp, "train-sgd")
    r = run(train_cmd(cllm, d, data, out, 3, ["--adapter", ad, "--optimizer", "sgd", "--lr", "0.1"]))
    if not check("train-sgd: exit 0", r.returncode == 0, r.stderr.strip()[-300:]):
        return
    got = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
    ref = sgd_reference(cfg, params, adapter, {m: s_of(m) for m, _ in mods}, mods, samples, 0.1, 3, 3, 12)
    worst = max((rel(got[k], ref[k]), k) for k in ref)
    moved = min(rel(adapter[k], ref[k]) for k in ref if ".lora_" in k)
    check("train-sgd: adapters after 3 steps vs torch (rel L2 <= 1e-4)", worst[0] <= 1e-4 and moved > 1e-4,
          "worst %.2e %s; smallest change %.2e" % (worst + (moved,)))
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    check("train-sgd: adapter_config keeps the adapter's settings",
          conf["r"] == 4 and conf["use_rslora"] and conf["rank_pattern"] == {"o_proj": 2}
          and conf["modules_to_save"] == ["lm_head"] and conf["peft_type"] == "LORA" and conf["task_type"] == "CAUSAL_LM")

    # exact resume: AdamW, dropout, clipping, grad accumulation
    extra = ["--lora-r", "4", "--lora-dropout", "0.1", "--lora-target", "q_proj,v_proj,down_proj", "--grad-clip",
             "0.5", "--micro-batch-size", "1", "--grad-accum", "3", "--save-interval", "2", "--sync-save"]
    extra = [x for x in extra if x != "--batch-size"]
    full, part = os.path.join(tmp, "full"), os.path.join(tmp, "part")
    r1 = run(train_cmd(cllm, d, data, full, 4, extra))
    r2 = run(train_cmd(cllm, d, data, part, 2, extra))
    r3 = run(train_cmd(cllm, d, data, part, 4, extra + ["--resume", "auto"]))
    ok = all(x.returncode == 0 for x in (r1, r2, r3))
    if not check("resume: runs exit 0", ok, " | ".join(x.stderr.strip()[-200:] for x in (r1, r2, r3))):
        return
    a = open(os.path.join(full, "adapter_model.safetensors"), "rb").read()
    b = open(os.path.join(part, "adapter_model.safetensors"), "rb").read()
    check("resume: adapters bit-identical to an uninterrupted run", a == b)
    ck = os.path.join(part, "checkpoint-2")
    check("resume: the checkpoint holds the adapters, not the base",
          os.path.exists(os.path.join(ck, "adapter_config.json")) and
          set(hm.load_safetensors(os.path.join(ck, "model.safetensors"))) ==
          set(hm.load_safetensors(os.path.join(full, "adapter_model.safetensors"))))
    # SIGTERM: a checkpoint of the adapters at the last step, from which a run continues
    sig = os.path.join(tmp, "sig")
    proc = subprocess.Popen(train_cmd(cllm, d, data, sig, 1000000, ["--lora-r", "2"]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    mpath = os.path.join(sig, "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < 60 and not (os.path.exists(mpath) and len(open(mpath).read().splitlines()) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        err = "no exit"
    latest = os.path.join(sig, "latest")
    ok = proc.returncode == 0 and os.path.exists(latest)
    if check("SIGTERM: exits 0 with a checkpoint", ok, err.strip()[-200:]):
        step = int(open(latest).read().strip().split("-")[1])
        ck = os.path.join(sig, "checkpoint-%d" % step)
        r = run(train_cmd(cllm, d, data, sig, step + 1, ["--lora-r", "2", "--resume", "auto"]))
        check("SIGTERM: the checkpoint holds the adapters and the run resumes",
              os.path.exists(os.path.join(ck, "adapter_config.json")) and r.returncode == 0 and
              os.path.exists(os.path.join(sig, "adapter_model.safetensors")), r.stderr.strip()[-200:])
    rd = run([cllm, "eval", "--model", d, "--adapter", full, "--data", data, "--seq-len", "12", "--batch-size", "3"])
    rb = run([cllm, "eval", "--model", d, "--data", data, "--seq-len", "12", "--batch-size", "3"])
    check("eval --adapter: runs and differs from the base", rd.returncode == 0 and rb.returncode == 0 and
          rd.stdout != rb.stdout, (rd.stderr + rb.stderr).strip()[-200:])


def test_new_and_merge(cllm, tmp):
    for name, cfg, mods, acfg, r_of, s_of, kind in case_defs():
        d = os.path.join(tmp, name)
        params = hm.load_hf_folder(d)[1]
        data = os.path.join(tmp, name + ".jsonl")
        out = os.path.join(tmp, name + "-new")
        # one step at learning rate 0: the adapters as initialised
        r = run(train_cmd(cllm, d, data, out, 1, ["--lora-r", "4", "--lora-alpha", "16", "--optimizer", "sgd",
                                                  "--lr", "0"]))
        if not check("new %s: exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            continue
        t = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
        conf = json.load(open(os.path.join(out, "adapter_config.json")))
        default = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "bloom": ["query_key_value"]}[cfg["model_type"]]
        want = set()
        for m, conv in linear_modules(cfg):
            if m.split(".")[-1] in default:
                want |= {PREFIX + m + ".lora_A.weight", PREFIX + m + ".lora_B.weight"}
        shapes_ok = all(t[PREFIX + m + ".lora_A.weight"].shape == (4, in_out(params, m, c)[0]) and
                        t[PREFIX + m + ".lora_B.weight"].shape == (in_out(params, m, c)[1], 4)
                        for m, c in linear_modules(cfg) if PREFIX + m + ".lora_A.weight" in want)
        bound = max(1.0 / math.sqrt(in_out(params, m, c)[0]) for m, c in linear_modules(cfg))
        init_ok = all(float(v.abs().max()) == 0.0 for k, v in t.items() if "lora_B" in k) and \
            all(0 < float(v.abs().max()) <= bound for k, v in t.items() if "lora_A" in k)
        check("new %s: PEFT default targets, names and shapes" % name, set(t) == want and shapes_ok,
              str(sorted(t)[:2]))
        check("new %s: B zero, A kaiming-uniform" % name, init_ok)
        check("new %s: adapter_config" % name, conf["target_modules"] == default and conf["r"] == 4 and
              conf["lora_alpha"] == 16 and conf["fan_in_fan_out"] == (cfg["model_type"] == "gpt2") and
              conf["base_model_name_or_path"] == d)

        # merge: the adapter of test_grads (non-zero B)
        ad = os.path.join(tmp, name + "-adapter")
        adapter = hm.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
        mo = os.path.join(tmp, name + "-merged")
        r = run([cllm, "lora", "merge", "--model", d, "--adapter", ad, "--out", mo])
        if not check("merge %s: exit 0" % name, r.returncode == 0, r.stderr.strip()[-300:]):
            continue
        merged = hm.load_hf_folder(mo)[1]
        p, _ = torch_lora_loss(cfg, params, adapter, {m: s_of(m) for m, _ in mods}, mods)
        worst = max((rel(merged[k], p[k].detach()), k) for k in params)
        untouched = all(torch.equal(merged[k], params[k]) for k in params if k not in
                        {m + ".weight" for m, _ in mods} and PREFIX + k not in adapter)
        check("merge %s: W + scale * B A (rel <= 1e-6), other tensors unchanged" % name,
              worst[0] <= 1e-6 and untouched, "worst %.2e %s" % worst)
        # greedy generation: base + adapter vs the merged model
        ga = run([cllm, "generate", "--model", d, "--adapter", ad, "--prompt-ids", "1,2,3", "--max-new-tokens", "8",
                  "--greedy", "--output", "ids"])
        gm = run([cllm, "generate", "--model", mo, "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--greedy",
                  "--output", "ids"])
        check("generate %s: --adapter gives the merged model's tokens" % name,
              ga.returncode == 0 and gm.returncode == 0 and ga.stdout == gm.stdout and ga.stdout.strip() != "",
              (ga.stderr + gm.stderr).strip()[-200:] or "%r vs %r" % (ga.stdout, gm.stdout))


def test_errors(cllm, tmp):
    name, cfg, mods, acfg, r_of, s_of, kind = case_defs()[1]
    d = os.path.join(tmp, name)
    data = os.path.join(tmp, name + ".jsonl")
    conf = os.path.join(tmp, "bad.json")
    with open(conf, "w") as f:
        json.dump({"lora": {"rank": 4}}, f)
    r = run(train_cmd(cllm, d, data, os.path.join(tmp, "e1"), 1, ["--config", conf]))
    check("errors: unknown lora key named", r.returncode not in (0, None) and "rank" in r.stderr, r.stderr.strip()[-200:])
    r = run(train_cmd(cllm, d, data, os.path.join(tmp, "e2"), 1, ["--lora-target", "q_proj,foo_proj"]))
    check("errors: a target matching nothing named", r.returncode not in (0, None) and "foo_proj" in r.stderr,
          r.stderr.strip()[-200:])
    r = run(train_cmd(cllm, d, data, os.path.join(tmp, "e3"), 1, ["--lora-target", "input_layernorm"]))
    check("errors: a target that is not linear named", r.returncode not in (0, None) and "input_layernorm" in r.stderr,
          r.stderr.strip()[-200:])
    bad = os.path.join(tmp, "bad-adapter")
    shutil.copytree(os.path.join(tmp, name + "-adapter"), bad)
    t = hm.load_safetensors(os.path.join(bad, "adapter_model.safetensors"))
    t[PREFIX + "model.layers.0.mlp.stray.lora_A.weight"] = torch.zeros(2, 2)
    hm.save_safetensors(os.path.join(bad, "adapter_model.safetensors"), t)
    r = run([cllm, "grad", "--model", d, "--adapter", bad, "--data", data, "--seq-len", "12", "--batch-size", "3",
             "--out", os.path.join(tmp, "x.safetensors")])
    check("errors: an unexpected adapter tensor named", r.returncode not in (0, None) and "stray" in r.stderr,
          r.stderr.strip()[-200:])
    c = json.load(open(os.path.join(bad, "adapter_config.json")))
    c["use_dora"] = True
    json.dump(c, open(os.path.join(bad, "adapter_config.json"), "w"))
    r = run([cllm, "grad", "--model", d, "--adapter", bad, "--data", data, "--seq-len", "12", "--batch-size", "3",
             "--out", os.path.join(tmp, "x.safetensors")])
    check("errors: use_dora refused by name", r.returncode not in (0, None) and "use_dora" in r.stderr,
          r.stderr.strip()[-200:])


def test_mpi(cllm, tmp):
    """2 ranks at ZeRO 1 and 2 (adapters sliced across ranks), and the
    layouts that refuse a frozen base."""
    cfg = hm.make_config("llama", vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)
    d = os.path.join(tmp, "mpi-model")
    hm.save_hf_folder(d, cfg, hm.init_params(cfg, seed=3))
    data = os.path.join(tmp, "mpi.jsonl")
    hm.write_jsonl(data, samples_for(cfg, 12, 16, seed=2))
    common = ["train", "--model", d, "--data", data, "--steps", "3", "--batch-size", "4", "--grad-accum", "2",
              "--seq-len", "12", "--lr", "0.01", "--log", "quiet", "--peak-gflops", "1", "--lora-r", "4",
              "--lora-target", "all-linear", "--no-shuffle"]
    one = os.path.join(tmp, "mpi.one")
    r = run([cllm] + common + ["--out", one])
    if not check("mpi: one-process LoRA run", r.returncode == 0, r.stderr[-300:]):
        return
    base = hm.load_safetensors(os.path.join(one, "adapter_model.safetensors"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one_losses = losses_of(one)
    for stage in (1, 2, 3):
        conf = os.path.join(tmp, "z%d.json" % stage)
        with open(conf, "w") as f:
            json.dump({"zero_optimization": {"stage": stage}}, f)
        out = os.path.join(tmp, "mpi.z%d" % stage)
        r = subprocess.run(["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",
                            "none", "-np", "2", cllm] + common + ["--config", conf, "--out", out],
                           capture_output=True, text=True, env=env)
        if not check("mpi: LoRA at ZeRO %d on 2 ranks" % stage, r.returncode == 0, r.stderr[-300:]):
            continue
        w = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
        worst = max(rel(w[k], base[k]) for k in base)
        check("mpi: ZeRO %d adapters within 1e-5 of one process after 3 AdamW steps" % stage,
              set(w) == set(base) and worst <= 1e-5, "worst rel %.1e" % worst)
        ls = losses_of(out)
        check("mpi: ZeRO %d losses within 1e-5 of one process" % stage, len(ls) == 3 and
              max(abs(a - b) for a, b in zip(ls, one_losses)) <= 1e-5, "%s vs %s" % (ls, one_losses))
        # sharded checkpoint of the adapter slices at step 2, resumed to 3: the straight run's bits
        part = os.path.join(tmp, "mpi.z%d.part" % stage)
        mpi = ["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", "2", cllm]
        steps3 = [x if x != "3" else "2" for x in common]
        r1 = subprocess.run(mpi + steps3 + ["--config", conf, "--out", part, "--save-interval", "2"],
                            capture_output=True, text=True, env=env)
        r2 = subprocess.run(mpi + common + ["--config", conf, "--out", part, "--resume", "auto"],
                            capture_output=True, text=True, env=env)
        ok = r1.returncode == 0 and r2.returncode == 0
        if check("mpi: ZeRO %d stop at 2 and resume" % stage, ok, (r1.stderr + r2.stderr)[-300:]):
            same = open(os.path.join(part, "adapter_model.safetensors"), "rb").read() == \
                open(os.path.join(out, "adapter_model.safetensors"), "rb").read()
            check("mpi: ZeRO %d resumed adapters bit-identical to the straight run (sharded checkpoint: %s)" %
                  (stage, os.path.exists(os.path.join(part, "checkpoint-2", "layout.json"))), same)
    mpi = ["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", "2", cllm]
    # ZeRO 3 with the adapters' optimizer state streamed from a file: the in-memory run's bits
    conf = os.path.join(tmp, "z3off.json")
    os.makedirs(os.path.join(tmp, "nvme"), exist_ok=True)
    with open(conf, "w") as f:
        json.dump({"zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": os.path.join(tmp, "nvme"), "buffer_size": 64}}}, f)
    out = os.path.join(tmp, "mpi.z3off")
    r = subprocess.run(mpi + common + ["--config", conf, "--out", out], capture_output=True, text=True, env=env)
    if check("mpi: LoRA at ZeRO 3 with offload_optimizer on 2 ranks", r.returncode == 0, r.stderr[-300:]):
        same = open(os.path.join(out, "adapter_model.safetensors"), "rb").read() == \
            open(os.path.join(tmp, "mpi.z3", "adapter_model.safetensors"), "rb").read()
        check("mpi: offloaded optimizer state gives the in-memory run's adapters bit for bit", same)
    # QLoRA (nf4, double quantization) at ZeRO 3 against its one-process run
    q = ["--load-in-4bit", "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant"]
    qone = os.path.join(tmp, "mpi.qone")
    r = run([cllm] + common + q + ["--out", qone])
    qout = os.path.join(tmp, "mpi.qz3")
    r2 = subprocess.run(mpi + common + q + ["--config", os.path.join(tmp, "z3.json"), "--out", qout],
                        capture_output=True, text=True, env=env)
    if check("mpi: QLoRA nf4 at ZeRO 3 on 2 ranks", r.returncode == 0 and r2.returncode == 0,
             (r.stderr + r2.stderr)[-300:]):
        qa = hm.load_safetensors(os.path.join(qone, "adapter_model.safetensors"))
        qb = hm.load_safetensors(os.path.join(qout, "adapter_model.safetensors"))
        worst = max(rel(qb[k], qa[k]) for k in qa)
        moved = min(rel(qa[k], base[k]) for k in base if "lora_B" in k)
        check("mpi: QLoRA ZeRO 3 adapters within 1e-5 of one process (and not the fp32 base's)",
              set(qa) == set(qb) and worst <= 1e-5 and moved > 1e-4, "worst rel %.1e, vs fp32 %.1e" % (worst, moved))
    # the layouts a frozen base still refuses, by name
    conf = os.path.join(tmp, "z3offp.json")
    with open(conf, "w") as f:
        json.dump({"zero_optimization": {"stage": 3, "offload_param": {
            "device": "nvme", "nvme_path": os.path.join(tmp, "nvme")}}}, f)
    r = run([cllm] + common + ["--config", conf, "--out", os.path.join(tmp, "mpi.offp")])
    check("mpi: LoRA with offload_param (nvme) refused by name", r.returncode not in (0, None) and
          "offload_param" in r.stderr, r.stderr[-300:])


def losses_of(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [x["loss"] for x in recs if "loss" in x and "step" in x and not any(k.startswith("eval") for k in x)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--case", default="all", help="all (one process) or mpi")
    a = ap.parse_args()
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="cllm-lora-")
    try:
        if a.case == "mpi":
            test_mpi(a.cllm, tmp)
        else:
            test_grads(a.cllm, tmp)
            test_train(a.cllm, tmp)
            test_new_and_merge(a.cllm, tmp)
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
