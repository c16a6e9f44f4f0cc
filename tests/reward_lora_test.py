#!/usr/bin/python3
"""LoRA on a reward model (`cllm train --task reward` with adapters, PEFT's
task_type SEQ_CLS) against an independent float64 PyTorch implementation:
the reward model's linear layers carry W + scale * B @ A (transposed for
GPT-2's Conv1D), its score head [1, C] trains in full (PEFT adds it to
modules_to_save for SEQ_CLS) and trl's RewardTrainer loss is taken on the
rewards at HF's scored token (reward_test.py's torch side).

Cases:
  grads   tiny GPT-2, LLaMA and BLOOM reward folders with a PEFT SEQ_CLS
          adapter written here (B non-zero, a perturbed score head,
          modules_to_save ["classifier", "score"] as PEFT writes it): one SGD
          step's loss (rel 1e-5) and the update / lr against autograd's
          gradient of every lora_A, lora_B and score.weight (rel L2 1e-4); the
          folder written has the same keys and task_type SEQ_CLS; `cllm score
          --adapter` gives torch's rewards (abs 2e-5), `cllm lora merge` a
          *ForSequenceClassification folder scoring the same; the same step on a
          quantized reward folder (QLoRA: LLaMA nf4 with double quant, BLOOM
          int8) against torch on its dequantized weights.
  learn   from a causal LM with --lora-r: the adapter folder (task_type
          SEQ_CLS, modules_to_save with score, PEFT's default targets,
          base_model_name_or_path the causal LM, base untouched; `cllm
          estimate` counts its parameters), the loss
          falls, `cllm score --model LM --adapter` = `cllm score` of the
          `cllm lora merge` output (a *ForSequenceClassification folder) =
          torch's rewards; `--adapter` continues training from the folder.
  resume  stopped at step 2 and resumed: the adapter file of an
          uninterrupted run, bit for bit (AdamW, dropout 0.1).
  ppo     `cllm train --task ppo --reward-model ADAPTER_DIR`: the rewards of
          its base with the adapter merged, those of the `cllm lora merge`
          folder; `--ref-model` a causal LM's adapter folder: the merged
          folder's KL.
  errors  a CAUSAL_LM adapter on a reward model, a SEQ_CLS adapter to
          `cllm eval` of a causal LM, QLoRA from a causal LM: refused by name.

Run by ctest (label lora) as
  /usr/bin/python3 tests/reward_lora_test.py --cllm build/cllm --case CASE
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, HERE)
import hf_models as hm  # noqa: E402
import lora_test as lt  # noqa: E402
import qlora_test as qt  # noqa: E402
import reward_test as rt  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
REWARD_ATOL = 2e-5
PREFIX = lt.PREFIX
DEFAULT_TARGETS = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "bloom": ["query_key_value"]}


check = rt.check  # its FAILED list counts this file's failures too


def folded(cfg, base, adapter, scales, mods):
    """The reward model's tensors with the adapter folded in (torch leaves:
    the adapter's tensors)."""
    return lt.torch_lora_loss(cfg, base, adapter, scales, mods)


def torch_step(cfg, base, adapter, scales, mods, recs, T):
    p, leaves = folded(cfg, base, adapter, scales, mods)
    rows = [r for rec in recs for r in rt.rows_of(rec, T)]
    r = rt.rewards(cfg, p, rows, T)
    margin = torch.tensor([float(x.get("margin", 0.0)) for x in recs], dtype=torch.float64)
    loss = rt.trl_loss(r[0::2], r[1::2], margin, 0.0)
    loss.backward()
    return float(loss), OrderedDict((k, v.grad) for k, v in leaves.items())


def torch_rewards(cfg, base, adapter, scales, mods, rows, T):
    p, _ = folded(cfg, base, adapter, scales, mods)
    with torch.no_grad():
        return rt.rewards(cfg, p, rows, T)


def score_file(cllm, model, data, T, out, adapter=None):
    cmd = [cllm, "score", "--model", model, "--data", data, "--seq-len", str(T), "--batch-size", "3", "--out", out]
    r = rt.run(cmd + (["--adapter", adapter] if adapter else []))
    if r.returncode != 0:
        return None, r.stderr[-300:]
    vals = []
    for line in open(out):
        x = json.loads(line)
        vals += [x["chosen_reward"], x["rejected_reward"]] if "chosen_reward" in x else [x["reward"]]
    return torch.tensor(vals, dtype=torch.float64), ""


def max_diff(a, b):
    return float((a.double() - b.double()).abs().max()) if a is not None and a.shape == b.shape else float("inf")


# --------------------------------------------------------------------- cases


def grads_one(cllm, tmp, arch, quant=None):
    """One SGD step with a SEQ_CLS adapter on a reward folder (quant: (kind,
    double quant) for a quantized base, torch then on its dequantized
    weights)."""
    T, LR, R, ALPHA = 12, 100.0, 2, 4.0
    tag = arch + ("-%s%s" % (quant[0], "-dq" if quant[1] else "") if quant else "")
    cfg = rt.reward_config(arch)
    params = rt.reward_params(cfg, seed=3 + len(arch))
    mdir = os.path.join(tmp, tag + ".rm")
    hm.save_hf_folder(mdir, cfg, params)
    mods = lt.linear_modules(cfg)
    ad = os.path.join(tmp, tag + ".adapter")
    targets = sorted({m.split(".")[-1] for m, _ in mods})
    acfg = {"task_type": "SEQ_CLS", "r": R, "lora_alpha": ALPHA, "target_modules": targets,
            "modules_to_save": ["classifier", "score"], "fan_in_fan_out": arch == "gpt2"}
    adapter = lt.make_adapter(ad, cfg, params, mods, lambda m: R, acfg, seed=len(arch), extra=["score.weight"])
    scales = {m: ALPHA / R for m, _ in mods}
    recs = rt.make_records(cfg["vocab_size"], 4, seed=len(arch) + 1, T=T)
    data = os.path.join(tmp, tag + ".pairs.jsonl")
    rt.write_jsonl(data, recs)
    out = os.path.join(tmp, tag + ".out")
    qflags = qt.quant_flags(*quant) if quant else []
    r = rt.run(rt.train_cmd(cllm, mdir, data, out, "--steps", "1", "--seq-len", str(T), "--optimizer", "sgd",
                            "--lr", str(LR), "--no-shuffle", "--batch-size", "4", "--adapter", ad, *qflags))
    if not check("grads %s: exit 0" % tag, r.returncode == 0, r.stderr[-400:]):
        return
    base = qt.dequantized(cfg, params, *quant) if quant else params
    loss, grads = torch_step(cfg, base, adapter, scales, mods, recs, T)
    m = rt.last_metrics(out)
    lrel = abs(m["loss"] - loss) / abs(loss)
    check("grads %s: loss = torch's" % tag, lrel <= LOSS_RTOL, "cllm %.9g torch %.9g rel %.1e" % (m["loss"], loss, lrel))
    new = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    check("grads %s: same PEFT keys written, task_type SEQ_CLS, score in modules_to_save" % tag,
          sorted(new) == sorted(adapter) and conf.get("task_type") == "SEQ_CLS" and
          "score" in (conf.get("modules_to_save") or []) and conf.get("peft_type") == "LORA",
          "keys %s; config %s" % (sorted(set(new) ^ set(adapter))[:4], {k: conf.get(k) for k in
                                                                        ("task_type", "modules_to_save")}))
    if sorted(new) != sorted(adapter):
        return
    worst, errs = 0.0, []
    for k, g in grads.items():
        e = rt.rel_l2((adapter[k].double() - new[k].double()) / LR, g)
        worst = max(worst, e)
        if e > GRAD_RTOL:
            errs.append("%s rel %.1e" % (k, e))
    n_ab = sum(".lora_" in k for k in grads)
    check("grads %s: SGD update = torch gradient (%d lora_A/B, score.weight)" % (tag, n_ab), not errs,
          "; ".join(errs[:6]) if errs else "worst rel-L2 %.1e" % worst)
    if quant:  # the quantization took effect: the fp32 base's loss is far off
        fp = torch_step(cfg, params, adapter, scales, mods, recs, T)[0]
        check("grads %s: unlike the fp32 base's loss" % tag, abs(fp - loss) > 100 * abs(m["loss"] - loss),
              "fp32 base %.6g, quantized %.6g" % (fp, loss))
        return
    # the adapter on the reward folder: cllm score --adapter = torch
    rows = [x for rec in recs for x in rt.rows_of(rec, T)]
    got, err = score_file(cllm, mdir, data, T, os.path.join(tmp, tag + ".score.jsonl"), ad)
    ref = torch_rewards(cfg, params, adapter, scales, mods, rows, T)
    d = max_diff(got, ref)
    check("grads %s: cllm score --adapter = torch rewards (abs %.0e)" % (tag, REWARD_ATOL), d <= REWARD_ATOL,
          err or "max |diff| %.1e (rewards up to %.2f)" % (d, float(ref.abs().max())))
    # merged onto the reward folder: a reward folder scoring the same
    merged = os.path.join(tmp, tag + ".merged")
    r = rt.run([cllm, "lora", "merge", "--model", mdir, "--adapter", ad, "--out", merged])
    got_m, err = score_file(cllm, merged, data, T, os.path.join(tmp, tag + ".score-merged.jsonl")) \
        if r.returncode == 0 else (None, r.stderr[-300:])
    arch_ok = r.returncode == 0 and json.load(open(os.path.join(merged, "config.json"))).get("architectures") == \
        [rt.SEQ_CLS[arch]]
    d = max_diff(got_m, got)
    check("grads %s: lora merge onto the reward folder: a %s scoring as --adapter (abs 1e-5)" % (tag, rt.SEQ_CLS[arch]),
          arch_ok and d <= 1e-5, err or "max |diff| %.1e" % d)


def case_grads(cllm, tmp):
    for arch in ("gpt2", "llama", "bloom"):
        grads_one(cllm, tmp, arch)
    # QLoRA: a quantized reward folder (its score head stays fp32, as bitsandbytes leaves the output layer)
    grads_one(cllm, tmp, "llama", ("nf4", True))
    grads_one(cllm, tmp, "bloom", ("int8", False))


def case_learn(cllm, tmp):
    T = 12
    cfg, lm_dir, lm = rt.learn_lm(tmp)
    V = cfg["vocab_size"]
    train = os.path.join(tmp, "learn.train.jsonl")
    rt.write_jsonl(train, rt.separable(V, 32, seed=1))
    out = os.path.join(tmp, "learn.out")
    r = rt.run(rt.train_cmd(cllm, lm_dir, train, out, "--steps", "30", "--batch-size", "8", "--seq-len", str(T),
                            "--lr", "0.02", "--lora-r", "4", "--lora-alpha", "8"))
    if not check("learn: 30 steps with --lora-r from a causal LM", r.returncode == 0, r.stderr[-400:]):
        return
    losses = [m["loss"] for m in rt.metrics_of(out) if "loss" in m]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    check("learn: loss falls (mean of the first 5 steps to the last 5)", last < 0.7 * first,
          "%.4f -> %.4f" % (first, last))
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    t = hm.load_safetensors(os.path.join(out, "adapter_model.safetensors"))
    mods = [(m, c) for m, c in lt.linear_modules(cfg) if m.split(".")[-1] in DEFAULT_TARGETS["llama"]]
    want = {PREFIX + m + s for m, _ in mods for s in (".lora_A.weight", ".lora_B.weight")} | {PREFIX + "score.weight"}
    check("learn: adapter_config is PEFT's SEQ_CLS LoRA", conf.get("task_type") == "SEQ_CLS" and
          conf.get("peft_type") == "LORA" and "score" in conf.get("modules_to_save", []) and conf.get("r") == 4 and
          conf.get("lora_alpha") == 8 and conf.get("target_modules") == DEFAULT_TARGETS["llama"] and
          conf.get("base_model_name_or_path") == lm_dir, json.dumps(conf)[:300])
    check("learn: adapter tensors: the default targets' A and B, and score.weight [1, C]", set(t) == want and
          tuple(t[PREFIX + "score.weight"].shape) == (1, cfg["hidden_size"]), str(sorted(set(t) ^ want)[:4]))
    check("learn: no model.safetensors (the base is not rewritten)",
          not os.path.exists(os.path.join(out, "model.safetensors")))
    r = rt.run([cllm, "estimate", "--model", lm_dir, "--task", "reward", "--lora-r", "4", "--seq-len", str(T)])
    n = sum(x.numel() for x in t.values())
    check("learn: cllm estimate --task reward --lora-r counts the adapters and the score head (%d)" % n,
          r.returncode == 0 and (" %d trainable parameters" % n) in r.stdout, (r.stdout + r.stderr)[-300:])
    # scoring: the causal LM + adapter, the merged folder, torch
    recs = rt.separable(V, 6, seed=2)
    singles = [{"input_ids": [12, 40, 5]}, {"input_ids": [12, 40, 7]}]
    data = os.path.join(tmp, "learn.score.jsonl")
    rt.write_jsonl(data, recs + singles)
    got, err = score_file(cllm, lm_dir, data, T, os.path.join(tmp, "s1.jsonl"), out)
    check("learn: cllm score --model LM --adapter", got is not None, err)
    merged = os.path.join(tmp, "learn.merged")
    r = rt.run([cllm, "lora", "merge", "--model", lm_dir, "--adapter", out, "--out", merged])
    if not check("learn: cllm lora merge", r.returncode == 0, r.stderr[-300:]):
        return
    mcfg, mp = rt.load_rm(merged)
    check("learn: merged folder is a LlamaForSequenceClassification with one label, pad_token_id eos",
          mcfg.get("architectures") == ["LlamaForSequenceClassification"] and mcfg.get("id2label") == {"0": "LABEL_0"}
          and mcfg.get("pad_token_id") == 2, str(mcfg.get("architectures")))
    got_m, err = score_file(cllm, merged, data, T, os.path.join(tmp, "s2.jsonl"))
    d = max_diff(got, got_m)
    check("learn: rewards of LM + adapter = rewards of the merged model (abs 1e-5)", d <= 1e-5, err or "%.1e" % d)
    rows = [x for rec in recs for x in rt.rows_of(rec, T)] + [s["input_ids"] for s in singles]
    base = OrderedDict((k, v) for k, v in lm.items() if k != "lm_head.weight")
    ref = torch_rewards(mcfg, base, t, {m: 8 / 4 for m, _ in mods}, mods, rows, T)
    d = max_diff(got, ref)
    check("learn: cllm score --adapter = torch rewards (abs %.0e)" % REWARD_ATOL, d <= REWARD_ATOL, "%.1e" % d)
    # continuing from the adapter folder: one step at lr 0 writes it back unchanged
    cont = os.path.join(tmp, "learn.cont")
    r = rt.run(rt.train_cmd(cllm, lm_dir, train, cont, "--steps", "1", "--batch-size", "8", "--seq-len", str(T),
                            "--optimizer", "sgd", "--lr", "0", "--adapter", out))
    if check("learn: --adapter continues training from the folder", r.returncode == 0, r.stderr[-300:]):
        t2 = hm.load_safetensors(os.path.join(cont, "adapter_model.safetensors"))
        check("learn: continued adapter read back exactly", set(t2) == set(t) and
              all(torch.equal(t2[k], t[k]) for k in t))


def case_resume(cllm, tmp):
    cfg = hm.make_config("gpt2")
    lm_dir = os.path.join(tmp, "res.lm")
    hm.save_hf_folder(lm_dir, cfg, hm.init_params(cfg, seed=8))
    data = os.path.join(tmp, "res.jsonl")
    rt.write_jsonl(data, rt.make_records(cfg["vocab_size"], 8, seed=4, T=12))
    common = ["--batch-size", "2", "--seq-len", "12", "--optimizer", "adamw", "--lr", "0.01", "--lora-r", "2",
              "--lora-dropout", "0.1"]
    a, b = os.path.join(tmp, "res.a"), os.path.join(tmp, "res.b")
    runs = [rt.train_cmd(cllm, lm_dir, data, a, "--steps", "4", *common),
            rt.train_cmd(cllm, lm_dir, data, b, "--steps", "2", "--save-interval", "2", *common),
            rt.train_cmd(cllm, lm_dir, data, b, "--steps", "4", "--save-interval", "2", "--resume", "auto", *common)]
    for i, cmd in enumerate(runs):
        r = rt.run(cmd)
        if not check("resume: run %d" % i, r.returncode == 0, r.stderr[-300:]):
            return
    fa, fb = (open(os.path.join(x, "adapter_model.safetensors"), "rb").read() for x in (a, b))
    check("resume: resumed adapter (score head included) bit-identical to the straight run", fa == fb)
    la = [m["loss"] for m in rt.metrics_of(a) if "loss" in m]
    lb = [m["loss"] for m in rt.metrics_of(b) if "loss" in m]
    check("resume: same losses", la == lb[-len(la):] if lb else False, "%s vs %s" % (la, lb))


def case_ppo(cllm, tmp):
    """PPO scored by a reward LoRA adapter folder: the rewards of its base
    with the adapter merged, as the `cllm lora merge` folder gives them."""
    cfg = hm.make_config("llama")
    pol_dir = os.path.join(tmp, "ppo.pol")
    hm.save_hf_folder(pol_dir, cfg, hm.init_params(cfg, seed=3))
    rcfg = rt.reward_config("llama")
    params = rt.reward_params(rcfg, seed=5)
    rm_dir = os.path.join(tmp, "ppo.rm")
    hm.save_hf_folder(rm_dir, rcfg, params)
    mods = [(m, c) for m, c in lt.linear_modules(rcfg) if m.split(".")[-1] in ("q_proj", "v_proj")]
    ad = os.path.join(tmp, "ppo.adapter")
    lt.make_adapter(ad, rcfg, params, mods, lambda m: 2, {"task_type": "SEQ_CLS", "r": 2, "lora_alpha": 4,
                                                          "target_modules": ["q_proj", "v_proj"],
                                                          "modules_to_save": ["score"],
                                                          "base_model_name_or_path": rm_dir},
                    seed=9, extra=["score.weight"])
    merged = os.path.join(tmp, "ppo.merged")
    r = rt.run([cllm, "lora", "merge", "--model", rm_dir, "--adapter", ad, "--out", merged])
    if not check("ppo: lora merge of the reward adapter", r.returncode == 0, r.stderr[-300:]):
        return
    prompts = os.path.join(tmp, "ppo.prompts.jsonl")
    rt.write_jsonl(prompts, [{"input_ids": [10 + i, 20 + i, 30 + i]} for i in range(8)])
    conf = os.path.join(tmp, "ppo.json")
    with open(conf, "w") as f:
        json.dump({"task": "ppo", "ppo": {"ppo_epochs": 1, "batch_size": 8,
                                          "generation_kwargs": {"max_new_tokens": 3}}}, f)
    rewards = {}
    for name, rm in (("merged folder", merged), ("adapter folder", ad), ("base", rm_dir)):
        out = os.path.join(tmp, "ppo.out-" + name.split()[0])
        r = rt.run([cllm, "train", "--config", conf, "--model", pol_dir, "--reward-model", rm, "--data", prompts,
                    "--out", out, "--steps", "1", "--batch-size", "8", "--seq-len", "12", "--lr", "1e-3",
                    "--log", "quiet", "--peak-gflops", "1"])
        if check("ppo: --reward-model %s" % name, r.returncode == 0, r.stderr[-300:]):
            rewards[name] = [m.get("env/reward_mean") for m in rt.metrics_of(out) if "env/reward_mean" in m]
    if len(rewards) == 3:
        check("ppo: an adapter folder as --reward-model scores as its merged folder (and unlike its base)",
              rewards["adapter folder"] == rewards["merged folder"] and rewards["base"] != rewards["merged folder"]
              and rewards["base"], str(rewards))
    # --ref-model: a causal LM's adapter folder, as its merged folder
    pol = hm.load_hf_folder(pol_dir)[1]
    cmods = [(m, c) for m, c in lt.linear_modules(cfg) if m.endswith("q_proj")]
    cad, cmerged = os.path.join(tmp, "ppo.ref-adapter"), os.path.join(tmp, "ppo.ref-merged")
    lt.make_adapter(cad, cfg, pol, cmods, lambda m: 2, {"r": 2, "target_modules": ["q_proj"],
                                                        "base_model_name_or_path": pol_dir}, seed=4)
    r = rt.run([cllm, "lora", "merge", "--model", pol_dir, "--adapter", cad, "--out", cmerged])
    kls = []
    for ref in (cad, cmerged):
        out = ref + ".out"
        r = rt.run([cllm, "train", "--config", conf, "--model", pol_dir, "--reward-model", rm_dir, "--ref-model", ref,
                    "--data", prompts, "--out", out, "--steps", "1", "--batch-size", "8", "--seq-len", "12",
                    "--log", "quiet", "--peak-gflops", "1"])
        kls.append([m.get("objective/kl") for m in rt.metrics_of(out)] if r.returncode == 0 else r.stderr[-300:])
    check("ppo: an adapter folder as --ref-model gives its merged folder's KL", kls[0] == kls[1] and
          isinstance(kls[0], list) and kls[0][0] != 0, str(kls))


def case_errors(cllm, tmp):
    cfg = rt.reward_config("llama")
    params = rt.reward_params(cfg, seed=1)
    rm_dir = os.path.join(tmp, "err.rm")
    hm.save_hf_folder(rm_dir, cfg, params)
    lm_cfg = hm.make_config("llama")
    lm_dir = os.path.join(tmp, "err.lm")
    hm.save_hf_folder(lm_dir, lm_cfg, hm.init_params(lm_cfg, seed=8))
    data = os.path.join(tmp, "err.jsonl")
    good = {"prompt_input_ids": [10, 11], "chosen_input_ids": [12], "rejected_input_ids": [13]}
    rt.write_jsonl(data, [good, good])
    mods = [(m, c) for m, c in lt.linear_modules(cfg) if m.endswith("q_proj")]
    causal = os.path.join(tmp, "err.causal-adapter")
    lt.make_adapter(causal, cfg, params, mods, lambda m: 2, {"r": 2, "target_modules": ["q_proj"]}, seed=1)
    r = rt.run(rt.train_cmd(cllm, rm_dir, data, os.path.join(tmp, "e1"), "--steps", "1", "--batch-size", "1",
                            "--seq-len", "8", "--adapter", causal))
    check("errors: a CAUSAL_LM adapter on a reward model refused naming task_type", r.returncode == 1 and
          "CAUSAL_LM" in r.stderr and "reward model" in r.stderr, r.stderr[-300:])
    seq = os.path.join(tmp, "err.seq-adapter")
    lt.make_adapter(seq, cfg, params, mods, lambda m: 2, {"r": 2, "target_modules": ["q_proj"], "task_type": "SEQ_CLS",
                                                          "modules_to_save": ["score"]}, seed=1, extra=["score.weight"])
    r = rt.run([cllm, "eval", "--model", lm_dir, "--adapter", seq, "--data", data, "--seq-len", "8"])
    check("errors: a SEQ_CLS adapter to cllm eval of a causal LM refused naming it", r.returncode == 1 and
          "SEQ_CLS" in r.stderr, r.stderr[-300:])
    r = rt.run(rt.train_cmd(cllm, lm_dir, data, os.path.join(tmp, "e3"), "--steps", "1", "--batch-size", "1",
                            "--seq-len", "8", "--lora-r", "2", "--load-in-4bit"))
    check("errors: QLoRA from a causal LM with task reward refused by name", r.returncode == 1 and
          "quantized base" in r.stderr, r.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--case", default="all")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    cases = {"grads": case_grads, "learn": case_learn, "resume": case_resume, "ppo": case_ppo, "errors": case_errors}
    return rt.run_cases(a, "cllm-reward-lora-", cases)


if __name__ == "__main__":
    sys.exit(main())
