#!/usr/bin/python3
"""`cllm train --task reward` and `cllm score` against an independent float64
PyTorch implementation of trl's RewardTrainer on HF's
*ForSequenceClassification models (docs/alignment.md).

The reward of a row is score.weight [1, C] times the final-norm hidden
state at HF's scored token: on a batch padded with the config's
pad_token_id, the last position whose token is not pad_token_id
(transformers' argmax rule), computed here from the padded batch, not from
cllm's rule. The loss of trl's RewardTrainer:
  -logsigmoid(r_c - r_r - margin).mean() + coef * ((r_c + r_r) ** 2).mean()

Cases:
  losses  tiny GPT-2, LLaMA and BLOOM reward folders (written here, HF
          layout: score.weight, no lm_head); ragged pairs in trl's formats
          (prompt + completions, implicit prompts, input_ids_chosen /
          input_ids_rejected), completions ending in pad tokens (the scored
          token moves back), per-pair margins, centring: one SGD step's loss
          (rel 1e-5), accuracy / rewards metrics, and the update / lr against
          autograd's gradient for every tensor (score head included; rel L2
          1e-4); gradient accumulation.
  learn   from a causal LM: the folder written is a reward model (config,
          tensors, score head drawn with std initializer_range, base tensors
          kept), it learns a trivially separable preference (eval_accuracy
          1.0), and `cllm score` on it gives torch's rewards of pairs and
          single records, and the pairwise accuracy.
  resume  a resumed run ends bit-identical to the straight one.
  errors  missing score head, num_labels 2, malformed pairs, a causal LM to
          `cllm score`, an LM task on a reward model: clear messages; LoRA
          (--lora-r) from a reward folder and from a causal LM writes a
          SEQ_CLS adapter with the score head.
  prepared  `cllm data prepare --pairs`: the prepared dataset trains
          bit-identically to its .jsonl (reward and DPO).
  mpi     2 ranks at ZeRO 1 and 3 against one process, and LoRA (the
          adapters and score head) at ZeRO 3 (label mpi).

Run by ctest as
  /usr/bin/python3 tests/reward_test.py --cllm build/cllm --build build --case CASE
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
FAILED = []
SEQ_CLS = {"gpt2": "GPT2ForSequenceClassification", "llama": "LlamaForSequenceClassification",
           "bloom": "BloomForSequenceClassification"}
PAD = 3  # the configs' pad_token_id


def check(name, ok, detail=""):
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail else ""))
    if not ok:
        FAILED.append(name)
    return ok


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


# ------------------------------------------------------------------ torch side


def reward_config(arch, **kw):
    cfg = hm.make_config(arch, **kw)
    cfg["architectures"] = [SEQ_CLS[arch]]
    cfg["id2label"] = {"0": "LABEL_0"}
    cfg["label2id"] = {"LABEL_0": 0}
    cfg["pad_token_id"] = PAD
    return cfg


def reward_params(cfg, seed):
    """A reward model's tensors: the causal LM's without an lm_head, plus
    score.weight [1, C]."""
    p = hm.init_params(dict(cfg, architectures=["x"]), seed=seed)
    p.pop("lm_head.weight", None)
    C = cfg.get("n_embd") or cfg["hidden_size"]
    g = torch.Generator().manual_seed(seed + 100)
    p["score.weight"] = 0.3 * torch.randn(1, C, generator=g)
    return p


def rewards(cfg, params, rows, T):
    """HF's sequence-classification reward of each row, on a batch padded
    with pad_token_id: the score at the last non-pad token (without a pad
    token, each row alone: its last token)."""
    pad = cfg.get("pad_token_id")
    ids = padded(rows, T, pad if pad is not None else 0)
    head_cfg = OrderedDict(cfg)
    head_cfg["tie_word_embeddings"] = False
    p = dict(params)
    p["lm_head.weight"] = params["score.weight"]
    scores = hm.forward(head_cfg, p, ids)[..., 0]  # [B, T]
    if pad is None:
        last = torch.tensor([len(x) - 1 for x in rows])
    else:
        idx = torch.arange(ids.shape[1])
        last = (idx * (ids != pad).long()).argmax(-1)
    return scores[torch.arange(ids.shape[0]), last]


def load_rm(d):
    """(config, tensors) of a reward model folder: exactly the causal LM's
    tensors without lm_head, plus score.weight [1, C]."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f, object_pairs_hook=OrderedDict)
    t = OrderedDict((n, x.float()) for n, x in hm.load_safetensors(os.path.join(d, "model.safetensors")).items())
    want = [n for n in hm.param_shapes(cfg) if n != "lm_head.weight"] + ["score.weight"]
    if sorted(t) != sorted(want):
        raise ValueError("%s: tensors %s, expected %s" % (d, sorted(set(t) ^ set(want)), "the reward model's"))
    return cfg, t


def rows_of(rec, T):
    """The two token rows of a preference record (pre-tokenized formats),
    the last T tokens kept."""
    if "input_ids_chosen" in rec:
        return [rec["input_ids_chosen"][-T:], rec["input_ids_rejected"][-T:]]
    p = rec.get("prompt_input_ids", [])
    return [(p + rec["chosen_input_ids"])[-T:], (p + rec["rejected_input_ids"])[-T:]]


def padded(rows, T, pad=PAD):
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    for i, x in enumerate(rows):
        ids[i, :len(x)] = torch.tensor(x)
    return ids


def trl_loss(rc, rr, margin, coef):
    loss = -F.logsigmoid(rc - rr - margin).mean()
    if coef:
        loss = loss + coef * torch.mean((rc + rr) ** 2)
    return loss


def torch_step(cfg, params, recs, T, coef):
    leaves = {n: t.detach().double().requires_grad_(True) for n, t in params.items()}
    rows = [r for rec in recs for r in rows_of(rec, T)]
    r = rewards(cfg, leaves, rows, T)
    rc, rr = r[0::2], r[1::2]
    margin = torch.tensor([float(x.get("margin", 0.0)) for x in recs], dtype=torch.float64)
    loss = trl_loss(rc, rr, margin, coef)
    loss.backward()
    rc, rr = rc.detach(), rr.detach()
    metrics = {"accuracy": float((rc > rr).double().mean()), "rewards/chosen": float(rc.mean()),
               "rewards/rejected": float(rr.mean()), "rewards/margins": float((rc - rr).mean())}
    return float(loss), metrics, {n: t.grad for n, t in leaves.items()}


# ------------------------------------------------------------------- data


def make_records(V, n, seed, T):
    """Ragged pairs in three formats; some completions end in pad tokens
    (HF then scores an earlier token); some carry a margin."""
    r = random.Random(seed)
    tok = lambda k: [r.randrange(4, V) for _ in range(k)]  # noqa: E731 (ids >= 4: never PAD)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            rec = {"prompt_input_ids": tok(r.randint(1, 5)), "chosen_input_ids": tok(r.randint(1, 6)),
                   "rejected_input_ids": tok(r.randint(1, 6))}
        elif kind == 1:
            rec = {"input_ids_chosen": tok(r.randint(2, 9)), "input_ids_rejected": tok(r.randint(2, 9))}
        else:
            rec = {"chosen_input_ids": tok(r.randint(2, 7)), "rejected_input_ids": tok(r.randint(2, 7))}
        if i % 2 == 1:
            rec["margin"] = round(r.uniform(-1, 2), 3)
        out.append(rec)
    out[0]["chosen_input_ids"] += [PAD, PAD]       # scored token: two back
    out[1]["input_ids_rejected"] += [PAD]          # one back
    out[3]["prompt_input_ids"] = tok(T + 2)         # longer than T: keep_end
    return out


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for x in recs:
            f.write((x if isinstance(x, str) else json.dumps(x)) + "\n")


def metrics_of(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def last_metrics(out):
    return [m for m in metrics_of(out) if "loss" in m][-1]


def rel_l2(a, b):
    a, b = a.double(), b.double()
    d = float(torch.linalg.vector_norm(a - b))
    n = float(torch.linalg.vector_norm(b))
    return d / n if n > 0 else d


def train_cmd(cllm, model, data, out, *extra):
    return [cllm, "train", "--task", "reward", "--model", model, "--data", data, "--out", out, "--log", "quiet",
            "--peak-gflops", "1"] + list(extra)


# --------------------------------------------------------------------- cases


def case_losses(cllm, tmp):
    T, LR = 12, 100.0
    for arch in ("gpt2", "llama", "bloom"):
        cfg = reward_config(arch)
        params = reward_params(cfg, seed=len(arch))
        mdir = os.path.join(tmp, arch + ".rm")
        hm.save_hf_folder(mdir, cfg, params)
        recs = make_records(cfg["vocab_size"], 6, seed=len(arch) + 1, T=T)
        data = os.path.join(tmp, arch + ".pairs.jsonl")
        write_jsonl(data, recs)
        variants = [("plain", 0.0, ["--batch-size", "4"]),
                    ("center", 0.05, ["--batch-size", "4", "--center-rewards-coefficient", "0.05"]),
                    ("accum", 0.0, ["--batch-size", "3", "--micro-batch-size", "1", "--grad-accum", "3"])]
        for name, coef, extra in variants:
            tag = "%s %s" % (arch, name)
            out = os.path.join(tmp, "%s.%s.out" % (arch, name))
            n = int(extra[1])
            r = run(train_cmd(cllm, mdir, data, out, "--steps", "1", "--seq-len", str(T), "--optimizer", "sgd",
                              "--lr", str(LR), "--no-shuffle", *extra))
            if not check("%s: exit 0" % tag, r.returncode == 0, r.stderr[-400:] if r.returncode else ""):
                continue
            loss, metrics, grads = torch_step(cfg, params, recs[:n], T, coef)
            m = last_metrics(out)
            lrel = abs(m["loss"] - loss) / max(abs(loss), 1e-30)
            check("%s: loss = trl's" % tag, lrel <= LOSS_RTOL, "cllm %.9g torch %.9g rel %.1e" % (m["loss"], loss, lrel))
            bad = ["%s %.9g vs %.9g" % (k, m.get(k, float("nan")), x) for k, x in metrics.items()
                   if not (abs(m.get(k, float("nan")) - x) <= 1e-5 * max(1.0, abs(x)))]
            check("%s: accuracy and rewards metrics" % tag, not bad, "; ".join(bad))
            ocfg, new = load_rm(out)
            check("%s: writes a %s folder" % (tag, SEQ_CLS[arch]), ocfg.get("architectures") == [SEQ_CLS[arch]] and
                  "lm_head.weight" not in new and tuple(new["score.weight"].shape) == (1, len(params["score.weight"][0])))
            worst, errs = 0.0, []
            for name_, g in grads.items():
                e = rel_l2((params[name_].double() - new[name_].double()) / LR, g)
                worst = max(worst, e)
                if e > GRAD_RTOL:
                    errs.append("%s rel %.1e" % (name_, e))
            check("%s: SGD update = trl gradient (%d tensors, score head included)" % (tag, len(grads)), not errs,
                  "; ".join(errs[:6]) if errs else "worst rel-L2 %.1e" % worst)


def separable(V, n, seed):
    """Chosen completions end in token 5, rejected ones in token 7."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        p = [r.randrange(10, V) for _ in range(r.randint(1, 4))]
        body = [r.randrange(10, V) for _ in range(r.randint(1, 4))]
        body2 = [r.randrange(10, V) for _ in range(r.randint(1, 4))]
        out.append({"prompt_input_ids": p, "chosen_input_ids": body + [5], "rejected_input_ids": body2 + [7]})
    return out


def learn_lm(tmp):
    """The causal LLaMA (EOS 2, initializer_range 0.02) the learn cases
    start from: (config, folder, tensors)."""
    cfg = hm.make_config("llama", eos_token_id=2)
    cfg["initializer_range"] = 0.02
    lm_dir = os.path.join(tmp, "learn.lm")
    lm = hm.init_params(cfg, seed=11)
    hm.save_hf_folder(lm_dir, cfg, lm)
    return cfg, lm_dir, lm


def case_learn(cllm, tmp):
    cfg, lm_dir, lm = learn_lm(tmp)
    V = cfg["vocab_size"]
    train, held = os.path.join(tmp, "learn.train.jsonl"), os.path.join(tmp, "learn.eval.jsonl")
    write_jsonl(train, separable(V, 32, seed=1))
    write_jsonl(held, separable(V, 16, seed=2))
    # a step at lr 0: the conversion alone
    z = os.path.join(tmp, "learn.zero")
    r = run(train_cmd(cllm, lm_dir, train, z, "--steps", "1", "--batch-size", "4", "--seq-len", "12", "--lr", "0"))
    if check("learn: lr-0 run from a causal LM", r.returncode == 0, r.stderr[-400:]):
        zc, zp = load_rm(z)
        ok = zc["architectures"] == ["LlamaForSequenceClassification"] and zc.get("id2label") == {"0": "LABEL_0"}
        check("learn: config names LlamaForSequenceClassification with one label", ok, str(zc.get("architectures")))
        check("learn: pad_token_id set to eos_token_id", zc.get("pad_token_id") == 2, str(zc.get("pad_token_id")))
        check("learn: no lm_head, base tensors kept", "lm_head.weight" not in zp and
              all(torch.equal(zp[n], lm[n]) for n in lm if n != "lm_head.weight"))
        s = zp.get("score.weight", torch.zeros(0))
        std = float(s.std()) if s.numel() else 0.0
        check("learn: score head [1, C] drawn with std initializer_range", tuple(s.shape) == (1, 48) and
              0.012 < std < 0.03 and float(s.abs().max()) > 0, "shape %s std %.4f" % (tuple(s.shape), std))
    out = os.path.join(tmp, "learn.out")
    r = run(train_cmd(cllm, lm_dir, train, out, "--steps", "40", "--batch-size", "8", "--seq-len", "12", "--lr",
                      "0.003", "--eval-data", held, "--eval-interval", "40"))
    if not check("learn: 40 steps", r.returncode == 0, r.stderr[-400:]):
        return
    ev = [m for m in metrics_of(out) if "eval_accuracy" in m]
    first = [m for m in metrics_of(out) if "accuracy" in m][0]
    check("learn: held-out eval_accuracy 1.0 after training", ev and ev[-1]["eval_accuracy"] == 1.0,
          "eval %s" % (ev[-1] if ev else None))
    # the score head starts near 0 (rewards ~0, loss ~log 2): the separation is learnt
    check("learn: loss from near log 2 at the first step to < 0.05 on held-out pairs", first["loss"] > 0.4 and
          ev and ev[-1]["eval_loss"] < 0.05 and abs(first["rewards/margins"]) < 0.5,
          "first step loss %.4f margin %.4f, eval loss %s" % (first["loss"], first["rewards/margins"],
                                                             ev[-1]["eval_loss"] if ev else None))
    # cllm score on the output: pairs, and single records
    ocfg, op = load_rm(out)
    recs = separable(V, 16, seed=2)
    singles = [{"input_ids": [12, 40, 5]}, {"input_ids": [12, 40, 7]}, {"input_ids": [30, 31, 32, 5]}]
    data = os.path.join(tmp, "score.jsonl")
    write_jsonl(data, recs[:5] + singles)
    sout = os.path.join(tmp, "score.out.jsonl")
    r = run([cllm, "score", "--model", out, "--data", data, "--seq-len", "12", "--batch-size", "3", "--out", sout])
    if not check("score: exit 0", r.returncode == 0, r.stderr[-400:]):
        return
    lines = [json.loads(l) for l in open(sout)]
    T = 12
    prows = [x for rec in recs[:5] for x in rows_of(rec, T)]
    srows = [s["input_ids"] for s in singles]
    ref = rewards(ocfg, {n: t.double() for n, t in op.items()}, prows + srows, T)
    got = []
    for i, l in enumerate(lines[:5]):
        got += [l.get("chosen_reward"), l.get("rejected_reward")]
    got += [l.get("reward") for l in lines[5:]]
    ok = len(lines) == 8 and all(l["index"] == i for i, l in enumerate(lines)) and None not in got
    err = max(abs(a - float(b)) for a, b in zip(got, ref)) if ok else float("nan")
    check("score: one line per record, rewards = torch's (pairs and singles)", ok and err <= 1e-4,
          "max |diff| %.2e; %s" % (err, lines[:2]))
    check("score: pairs report correct, singles reward", all("correct" in l for l in lines[:5]) and
          all(set(l) == {"index", "reward"} for l in lines[5:]))
    check("score: pairwise accuracy 1.0 on stderr", "5 pairs: accuracy 1.0000" in r.stderr, r.stderr[-300:])
    check("score: single records end in 5 score above 7", got[10] > got[11])


def case_resume(cllm, tmp):
    cfg = hm.make_config("gpt2")
    lm_dir = os.path.join(tmp, "res.lm")
    hm.save_hf_folder(lm_dir, cfg, hm.init_params(cfg, seed=8))
    data = os.path.join(tmp, "res.jsonl")
    write_jsonl(data, make_records(cfg["vocab_size"], 8, seed=4, T=12))
    common = ["--batch-size", "2", "--seq-len", "12", "--optimizer", "adamw", "--lr", "0.01",
              "--center-rewards-coefficient", "0.01"]
    a, b = os.path.join(tmp, "res.a"), os.path.join(tmp, "res.b")
    runs = [train_cmd(cllm, lm_dir, data, a, "--steps", "4", *common),
            train_cmd(cllm, lm_dir, data, b, "--steps", "2", "--save-interval", "2", *common),
            train_cmd(cllm, lm_dir, data, b, "--steps", "4", "--save-interval", "2", "--resume", "auto", *common)]
    for i, cmd in enumerate(runs):
        r = run(cmd)
        if not check("resume: run %d" % i, r.returncode == 0, r.stderr[-300:]):
            return
    with open(os.path.join(a, "model.safetensors"), "rb") as f1, open(os.path.join(b, "model.safetensors"), "rb") as f2:
        check("resume: resumed reward model bit-identical to the straight run", f1.read() == f2.read())
    la = [m["loss"] for m in metrics_of(a) if "loss" in m]
    lb = [m["loss"] for m in metrics_of(b) if "loss" in m]
    check("resume: same losses", la == lb[-len(la):] if lb else False, "%s vs %s" % (la, lb))


def case_errors(cllm, tmp):
    cfg = reward_config("llama")
    params = reward_params(cfg, seed=1)
    good = {"prompt_input_ids": [10, 11], "chosen_input_ids": [12], "rejected_input_ids": [13]}
    data = os.path.join(tmp, "good.jsonl")
    write_jsonl(data, [good, good])
    # no score head
    d1 = os.path.join(tmp, "noscore")
    hm.save_hf_folder(d1, cfg, OrderedDict((n, t) for n, t in params.items() if n != "score.weight"))
    r = run(train_cmd(cllm, d1, data, os.path.join(tmp, "o1"), "--steps", "1", "--batch-size", "1", "--seq-len", "8"))
    check("missing score.weight: exit 1 naming it", r.returncode == 1 and "missing tensor 'score.weight'" in r.stderr,
          r.stderr[-300:])
    # LoRA: no longer refused; the adapters are the reward model's (PEFT's
    # SEQ_CLS, the score head trained beside them), not a causal LM's whose
    # LM head is dropped (reward_lora_test.py checks the values)
    rm_dir, lm_dir = os.path.join(tmp, "lora-rm"), os.path.join(tmp, "lora-lm")
    hm.save_hf_folder(rm_dir, cfg, params)
    lm_cfg = hm.make_config("llama")
    hm.save_hf_folder(lm_dir, lm_cfg, hm.init_params(lm_cfg, seed=8))
    for what, model in (("reward folder", rm_dir), ("causal LM", lm_dir)):
        o = os.path.join(tmp, "olora-" + what.split()[0])
        r = run(train_cmd(cllm, model, data, o, "--steps", "1", "--batch-size", "1", "--seq-len", "8", "--lora-r", "4"))
        conf, keys = {}, []
        if r.returncode == 0:
            conf = json.load(open(os.path.join(o, "adapter_config.json")))
            keys = list(hm.load_safetensors(os.path.join(o, "adapter_model.safetensors")))
        check("LoRA with task reward (%s): a SEQ_CLS adapter with the score head" % what, r.returncode == 0 and
              conf.get("task_type") == "SEQ_CLS" and "base_model.model.score.weight" in keys and
              not any("lm_head" in k for k in keys), r.stderr[-300:] or str(conf.get("task_type")))
    # two labels
    d2 = os.path.join(tmp, "twolabels")
    c2 = dict(cfg, id2label={"0": "LABEL_0", "1": "LABEL_1"})
    p2 = dict(params)
    p2["score.weight"] = torch.zeros(2, 48)
    hm.save_hf_folder(d2, c2, p2)
    for cmd in (train_cmd(cllm, d2, data, os.path.join(tmp, "o2"), "--steps", "1", "--batch-size", "1",
                          "--seq-len", "8"), [cllm, "score", "--model", d2, "--data", data]):
        r = run(cmd)
        check("num_labels 2 (%s): exit 1 naming it" % cmd[1], r.returncode == 1 and "2 labels" in r.stderr and
              "num_labels 1" in r.stderr, r.stderr[-300:])
    # a score head of the wrong shape with one label
    d3 = os.path.join(tmp, "badshape")
    hm.save_hf_folder(d3, cfg, p2)
    r = run([cllm, "score", "--model", d3, "--data", data])
    check("score.weight [2, C] with one label: exit 1 naming the shape", r.returncode == 1 and "score.weight" in
          r.stderr and "[2, 48]" in r.stderr, r.stderr[-300:])
    # bad records
    rm = os.path.join(tmp, "rm")
    hm.save_hf_folder(rm, cfg, params)
    cases = [("missing key", {"input_ids_chosen": [10, 11]}, 'missing key "input_ids_rejected"'),
             ("margin not a number", dict(good, margin="big"), '"margin": expected a finite number'),
             ("margin beyond float range", dict(good, margin=1e300), '"margin": expected a finite number'),
             ("malformed JSON", '{"chosen_input_ids": [1,', "malformed JSON"),
             ("single record in training data", {"input_ids": [10, 11, 12]}, "needs a tokenizer")]
    for name, rec, needle in cases:
        path = os.path.join(tmp, "bad.jsonl")
        write_jsonl(path, [good, "", rec])
        r = run(train_cmd(cllm, rm, path, os.path.join(tmp, "o3"), "--steps", "1", "--batch-size", "1",
                          "--seq-len", "8"))
        check("bad record (%s): exit 1 naming FILE:LINE" % name,
              r.returncode == 1 and ("%s:3:" % path) in r.stderr and needle in r.stderr, r.stderr[-300:])
    r = run(train_cmd(cllm, rm, data, os.path.join(tmp, "o4"), "--steps", "1", "--center-rewards-coefficient", "-1"))
    check("negative center_rewards_coefficient: usage error", r.returncode == 2, r.stderr[-200:])
    conf = os.path.join(tmp, "c.json")
    with open(conf, "w") as f:
        json.dump({"task": "reward", "reward": {"center_rewards_coeff": 0.1}}, f)
    r = run(train_cmd(cllm, rm, data, os.path.join(tmp, "o5"), "--steps", "1", "--config", conf, "--strict"))
    check("misspelt reward key: usage error naming reward.center_rewards_coeff", r.returncode == 2 and
          "center_rewards_coeff" in r.stderr, r.stderr[-200:])
    # a causal LM to cllm score; a reward model to an LM task or to generate
    lm = os.path.join(tmp, "lm")
    lcfg = hm.make_config("llama")
    hm.save_hf_folder(lm, lcfg, hm.init_params(lcfg, seed=2))
    r = run([cllm, "score", "--model", lm, "--data", data])
    check("cllm score on a causal LM: exit 1", r.returncode == 1 and "not a reward model" in r.stderr, r.stderr[-200:])
    lmdata = os.path.join(tmp, "lm.jsonl")
    write_jsonl(lmdata, [{"input_ids": [10, 11, 12, 13]}] * 4)
    r = run([cllm, "train", "--model", rm, "--data", lmdata, "--out", os.path.join(tmp, "o6"), "--steps", "1",
             "--batch-size", "1", "--seq-len", "8", "--log", "quiet"])
    check("task lm on a reward model: exit 1 naming task reward", r.returncode == 1 and "task \"reward\"" in r.stderr,
          r.stderr[-200:])


def case_prepared(cllm, tmp, fixtures):
    """`cllm data prepare --pairs`: a prepared preference dataset trains
    bit-identically to its .jsonl (text pairs with the GPT-2 tokenizer,
    explicit and implicit prompts, margins, keep_end), for reward and DPO;
    it refuses the LM task, and an LM dataset refuses task reward."""
    tok = os.path.join(fixtures, "gpt2")
    if not check("prepared: tokenizer fixture at %s" % tok, os.path.exists(os.path.join(tok, "tokenizer.json"))):
        return
    cfg = hm.make_config("gpt2", vocab_size=50257)
    mdir = os.path.join(tmp, "prep.lm")
    hm.save_hf_folder(mdir, cfg, hm.init_params(cfg, seed=5))
    texts = [{"prompt": "Is 7 even?", "chosen": " No, it is odd.", "rejected": " Yes.", "margin": 0.5},
             {"chosen": "The sky is blue.", "rejected": "The sky is a potato and also very much green."},
             {"prompt": "Name a colour.", "chosen": " Blue", "rejected": " Twelve", "margin": -1.25},
             {"prompt_input_ids": [464, 3290], "chosen_input_ids": [318, 4171, 13],
              "rejected_input_ids": [318, 257, 8509, 13]},
             {"input_ids_chosen": [40, 588, 340, 13], "input_ids_rejected": [40, 5465, 340, 13], "margin": 2.0},
             {"prompt": "Say hello", "chosen": " Hello there!", "rejected": " Goodbye"}]
    data = os.path.join(tmp, "prep.jsonl")
    write_jsonl(data, texts)
    prefix = os.path.join(tmp, "prep", "pairs")
    r = run([cllm, "data", "prepare", "--pairs", "--input", data, "--tokenizer", tok, "--out", prefix,
             "--seq-len", "10"])
    if not check("prepared: data prepare --pairs", r.returncode == 0 and json.loads(r.stdout)["records"] == 6,
                 r.stderr[-300:] + r.stdout[-200:]):
        return
    for task, extra in (("reward", ["--center-rewards-coefficient", "0.1"]), ("dpo", ["--reference-free"])):
        outs = []
        for name, spec in (("jsonl", data), ("prefix", prefix)):
            out = os.path.join(tmp, "prep.%s.%s" % (task, name))
            r = run([cllm, "train", "--task", task, "--model", mdir, "--data", spec, "--out", out, "--steps", "3",
                     "--batch-size", "2", "--seq-len", "10", "--lr", "0.01", "--tokenizer", tok, "--log", "quiet",
                     "--peak-gflops", "1"] + extra)
            if not check("prepared: %s on the %s" % (task, name), r.returncode == 0, r.stderr[-300:]):
                return
            outs.append(out)
        la = [m["loss"] for m in metrics_of(outs[0]) if "loss" in m]
        lb = [m["loss"] for m in metrics_of(outs[1]) if "loss" in m]
        with open(os.path.join(outs[0], "model.safetensors"), "rb") as f1, \
                open(os.path.join(outs[1], "model.safetensors"), "rb") as f2:
            same = f1.read() == f2.read()
        check("prepared: %s trains bit-identically on the prefix and the .jsonl (margins kept)" % task,
              la == lb and same, "%s vs %s" % (la, lb))
    r = run([cllm, "train", "--model", mdir, "--data", prefix, "--out", os.path.join(tmp, "p1"), "--steps", "1",
             "--batch-size", "1", "--seq-len", "10", "--log", "quiet"])
    check("prepared: the LM task refuses a preference dataset", r.returncode != 0 and "preference dataset" in
          r.stderr, r.stderr[-300:])
    lm_prefix = os.path.join(tmp, "prep", "lm")
    write_jsonl(os.path.join(tmp, "lm.jsonl"), [{"text": "hello world"}, {"text": "good night"}])
    r = run([cllm, "data", "prepare", "--input", os.path.join(tmp, "lm.jsonl"), "--tokenizer", tok, "--out",
             lm_prefix])
    r = run(train_cmd(cllm, mdir, lm_prefix, os.path.join(tmp, "p2"), "--steps", "1", "--batch-size", "1",
                      "--seq-len", "10"))
    check("prepared: task reward refuses an LM dataset", r.returncode != 0 and "not a preference dataset" in
          r.stderr, r.stderr[-300:])


def case_mpi(cllm, tmp):
    cfg = reward_config("bloom")
    mdir = os.path.join(tmp, "mpi.rm")
    hm.save_hf_folder(mdir, cfg, reward_params(cfg, seed=3))
    data = os.path.join(tmp, "mpi.jsonl")
    write_jsonl(data, make_records(cfg["vocab_size"], 8, seed=2, T=12))
    common = ["--steps", "3", "--batch-size", "4", "--grad-accum", "2", "--seq-len", "12", "--optimizer", "sgd",
              "--lr", "0.01", "--center-rewards-coefficient", "0.1"]
    one = os.path.join(tmp, "mpi.one")
    r = run(train_cmd(cllm, mdir, data, one, *common))
    if not check("mpi: one-process run", r.returncode == 0, r.stderr[-300:]):
        return
    base_losses = [m["loss"] for m in metrics_of(one) if "loss" in m]
    base = load_rm(one)[1]
    for stage in (1, 3):
        conf = os.path.join(tmp, "z%d.json" % stage)
        with open(conf, "w") as f:
            json.dump({"zero_optimization": {"stage": stage}}, f)
        out = os.path.join(tmp, "mpi.z%d" % stage)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = run(["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                 "-np", "2"] + train_cmd(cllm, mdir, data, out, "--config", conf, *common), env=env)
        if not check("mpi: ZeRO %d on 2 ranks" % stage, r.returncode == 0, r.stderr[-300:]):
            continue
        losses = [m["loss"] for m in metrics_of(out) if "loss" in m]
        check("mpi: ZeRO %d losses" % stage, len(losses) == len(base_losses) and
              all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, base_losses)), "%s vs %s" % (losses, base_losses))
        a, b = last_metrics(out), last_metrics(one)
        keys = ["accuracy", "rewards/chosen", "rewards/rejected", "rewards/margins"]
        bad = [k for k in keys if not abs(a.get(k, float("nan")) - b[k]) <= 1e-5 * max(1.0, abs(b[k]))]
        check("mpi: ZeRO %d metrics averaged over ranks" % stage, not bad,
              "; ".join("%s %r vs %r" % (k, a.get(k), b[k]) for k in bad))
        w = load_rm(out)[1]
        diff = max(float((w[n] - base[n]).abs().max()) for n in base)
        check("mpi: ZeRO %d weights (score head included) within 1e-5 of one process" % stage, diff <= 1e-5,
              "max |diff| %.1e" % diff)
    # LoRA (PEFT's SEQ_CLS: adapters and the score head sliced over the ranks) at ZeRO 3
    lora = common + ["--lora-r", "2"]
    one, out = os.path.join(tmp, "mpi.lora.one"), os.path.join(tmp, "mpi.lora.z3")
    r1 = run(train_cmd(cllm, mdir, data, one, *lora))
    r2 = run(["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
              "-np", "2"] + train_cmd(cllm, mdir, data, out, "--config", os.path.join(tmp, "z3.json"), *lora),
             env=dict(os.environ, OMP_NUM_THREADS="1"))
    if check("mpi: LoRA at ZeRO 3 on 2 ranks and in one process", r1.returncode == 0 and r2.returncode == 0,
             (r1.stderr + r2.stderr)[-300:]):
        a, b = (hm.load_safetensors(os.path.join(x, "adapter_model.safetensors")) for x in (one, out))
        diff = max(float((a[k] - b[k]).abs().max()) for k in a) if sorted(a) == sorted(b) else float("inf")
        check("mpi: LoRA adapters and score head at ZeRO 3 within 1e-5 of one process",
              diff <= 1e-5 and "base_model.model.score.weight" in a, "max |diff| %.1e" % diff)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--case", default="all")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "..", "shared", "fixtures", "hf"))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    cases = {"losses": case_losses, "learn": case_learn, "resume": case_resume, "errors": case_errors,
             "prepared": lambda c, t: case_prepared(c, t, a.fixtures), "mpi": case_mpi}
    return run_cases(a, "cllm-reward-", cases, not_in_all=("mpi",))


def run_cases(a, prefix, cases, not_in_all=()):
    """Runs the case a.case names (or every case but not_in_all for "all")
    in a temporary folder (kept with a.keep); 1 if any check failed."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        for name, fn in cases.items():
            if a.case == name or (a.case == "all" and name not in not_in_all):
                fn(a.cllm, tmp)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
