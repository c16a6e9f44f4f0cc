#!/usr/bin/python3
"""
`cllm train --freeze` / the config's "freeze" on a tiny LLaMA:

  sgd       3 SGD steps with the embeddings and block 0 frozen: the frozen
            tensors of the saved model are bit-identical to the start, every
            other tensor moved, and each equals torch's SGD on the same
            model with requires_grad off for the frozen ones (float64)
  inverse   --unfrozen-parameters (axolotl's unfrozen_parameters): exactly
            the named tensors move
  resume    AdamW stopped at step 2 and resumed: the bits of an
            uninterrupted run; the checkpoint holds the trained tensors only
  estimate  `cllm estimate --freeze` counts the trained tensors' parameters
            and needs less memory than full training
  errors    a pattern matching nothing, a bad regular expression, freeze
            with LoRA or with a reward head made from a causal LM: non-zero
            exit naming them
  mpi       (--case mpi) 2 ranks at ZeRO 2, ZeRO 3, and ZeRO 3 with the
            optimizer state offloaded against one process, a sharded
            checkpoint resumed exactly; pipeline refused by name

Run by ctest (label train) as
  /usr/bin/python3 tests/freeze_test.py --cllm build/cllm --build build
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lora_test as lt  # noqa: E402  (its check/run helpers and their counters)

check, run = lt.check, lt.run
FREEZE = ["embed", r"^model\.layers\.0\."]


def frozen(name):
    return any(re.search(p, name) for p in FREEZE)


def train_cmd(cllm, model, data, out, steps, extra, log="quiet"):
    return [cllm, "train", "--model", model, "--data", data, "--out", out, "--steps", str(steps), "--batch-size", "3",
            "--seq-len", "12", "--no-shuffle", "--log", log, "--seed", "1", "--freeze"] + FREEZE + extra


def torch_sgd(cfg, params, samples, lr, steps):
    cur = {k: v.double().clone() for k, v in params.items()}
    for s in range(steps):
        ids, labels = hm.micro_batch(samples, s, 3, 12)
        p = {k: v.clone().requires_grad_(not frozen(k)) for k, v in cur.items()}
        loss = hm.model_loss(cfg, p, ids, labels)[0]
        loss.backward()
        cur = {k: (v - lr * v.grad if v.grad is not None else v).detach() for k, v in p.items()}
    return cur


def test_train(cllm, tmp):
    d = os.path.join(tmp, "llama")
    r = run([cllm, "init", "--arch", "llama", "--set", "initializer_range=0.2", "--seed", "3", "--out", d])
    if not check("init: exit 0", r.returncode == 0, r.stderr[-300:]):
        return
    cfg, params = hm.load_hf_folder(d)
    g = torch.Generator().manual_seed(5)
    samples = [{"input_ids": torch.randint(0, cfg["vocab_size"], (13,), generator=g).tolist()} for _ in range(9)]
    data = os.path.join(tmp, "train.jsonl")
    hm.write_jsonl(data, samples)
    out = os.path.join(tmp, "sgd")
    r = run(train_cmd(cllm, d, data, out, 3, ["--optimizer", "sgd", "--lr", "0.1"], log="plain"))
    if not check("sgd: exit 0", r.returncode == 0, r.stderr[-300:]):
        return
    check("sgd: the run reports the frozen tensors", "freeze: 10 of 21 tensors frozen" in r.stderr, r.stderr[-300:])
    got = hm.load_hf_folder(out)[1]
    names = list(params)
    fz = [k for k in names if frozen(k)]
    check("sgd: frozen tensors bit-identical", fz and all(torch.equal(got[k], params[k]) for k in fz), str(fz))
    check("sgd: every other tensor moved", all(not torch.equal(got[k], params[k]) for k in names if k not in fz))
    ref = torch_sgd(cfg, params, samples, 0.1, 3)
    worst = max(((got[k].double() - ref[k]).norm().item() / max(ref[k].norm().item(), 1e-30), k) for k in names)
    check("sgd: tensors after 3 steps vs torch with requires_grad off (rel L2 <= 1e-5)", worst[0] <= 1e-5,
          "worst %.2e %s" % worst)

    # the inverse: axolotl's unfrozen_parameters (matched from the start, "." literal)
    inv = os.path.join(tmp, "inv")
    cmd = train_cmd(cllm, d, data, inv, 2, ["--optimizer", "sgd", "--lr", "0.1"])
    cmd = cmd[:cmd.index("--freeze")] + ["--unfrozen-parameters", "model.layers.1.", "lm_head"]
    r = run(cmd)
    if check("unfrozen_parameters: exit 0", r.returncode == 0, r.stderr[-300:]):
        got = hm.load_hf_folder(inv)[1]
        train = [k for k in names if k.startswith("model.layers.1.") or k.startswith("lm_head")]
        check("unfrozen_parameters: exactly the named tensors moved",
              all(torch.equal(got[k], params[k]) != (k in train) for k in names), str(train))

    extra = ["--micro-batch-size", "1", "--grad-accum", "3", "--grad-clip", "0.5", "--save-interval", "2",
             "--sync-save"]
    full, part = os.path.join(tmp, "full"), os.path.join(tmp, "part")
    r1 = run(train_cmd(cllm, d, data, full, 4, extra))
    r2 = run(train_cmd(cllm, d, data, part, 2, extra))
    r3 = run(train_cmd(cllm, d, data, part, 4, extra + ["--resume", "auto"]))
    ok = all(x.returncode == 0 for x in (r1, r2, r3))
    if not check("resume: runs exit 0", ok, " | ".join(x.stderr.strip()[-200:] for x in (r1, r2, r3))):
        return
    a = hm.load_hf_folder(full)[1]
    b = hm.load_hf_folder(part)[1]
    check("resume: bit-identical to an uninterrupted run", all(torch.equal(a[k], b[k]) for k in a))
    ck = hm.load_safetensors(os.path.join(part, "checkpoint-2", "model.safetensors"))
    check("resume: the checkpoint holds the trained tensors only", set(ck) == {k for k in names if k not in fz},
          str(sorted(set(names) - set(ck))))
    return d, params


def test_estimate(cllm, d, params):
    def est(extra):
        r = run([cllm, "estimate", "--model", d, "--json"] + extra)
        return r, (json.loads(r.stdout) if r.returncode == 0 else None)

    r0, full = est([])
    r1, fz = est(["--freeze"] + FREEZE)
    if not check("estimate: exit 0", full is not None and fz is not None, (r0.stderr + r1.stderr)[-300:]):
        return
    want = sum(v.numel() for k, v in params.items() if not frozen(k))
    check("estimate: trainable parameters", fz.get("trainable_params") == want, "%s vs %d" % (fz.get("trainable_params"), want))
    check("estimate: less memory than full training", fz["total"] < full["total"], "%d vs %d" % (fz["total"], full["total"]))


def test_errors(cllm, d, tmp):
    data = os.path.join(tmp, "train.jsonl")
    base = [cllm, "train", "--model", d, "--data", data, "--out", os.path.join(tmp, "err"), "--steps", "1",
            "--batch-size", "3", "--seq-len", "12", "--log", "quiet"]
    r = run(base + ["--freeze", "embed", "no_such_tensor"])
    check("errors: a pattern matching nothing", r.returncode not in (0, None) and "'no_such_tensor'" in r.stderr,
          r.stderr[-300:])
    r = run(base + ["--freeze", "layers.(0"])
    check("errors: a bad regular expression", r.returncode not in (0, None) and "layers.(0" in r.stderr, r.stderr[-300:])
    r = run(base + ["--freeze", "embed", "--lora-r", "2"])
    check("errors: freeze with LoRA", r.returncode not in (0, None) and "freeze" in r.stderr, r.stderr[-300:])
    pairs = os.path.join(tmp, "pairs.jsonl")
    hm.write_jsonl(pairs, [{"input_ids_chosen": [1, 2, 3, 4], "input_ids_rejected": [1, 2, 5, 6]}] * 4)
    r = run([cllm, "train", "--model", d, "--data", pairs, "--task", "reward", "--out", os.path.join(tmp, "rw"),
             "--steps", "1", "--batch-size", "2", "--seq-len", "4", "--log", "quiet", "--freeze", "embed"])
    check("errors: freeze with a new reward head refused", r.returncode not in (0, None) and "freeze" in r.stderr,
          r.stderr[-300:])
    r = run(base + ["--freeze", "embed", "--unfrozen-parameters", "lm_head"])
    check("errors: freeze and unfrozen_parameters together", r.returncode not in (0, None) and
          "unfrozen_parameters" in r.stderr, r.stderr[-300:])
    r = run([cllm, "estimate", "--model", d, "--freeze", "nothing_here"])
    check("errors: estimate names the pattern", r.returncode not in (0, None) and "'nothing_here'" in r.stderr,
          r.stderr[-300:])


def test_mpi(cllm, tmp):
    """2 ranks at ZeRO 2 and 3 (the trained copies sliced across ranks) and at
    ZeRO 3 with the optimizer state offloaded, against one process; a sharded
    checkpoint resumed; pipeline parallelism refused."""
    d = os.path.join(tmp, "mpi-model")
    r = run([cllm, "init", "--arch", "llama", "--set", "initializer_range=0.2", "--seed", "4", "--out", d])
    if not check("mpi: init", r.returncode == 0, r.stderr[-300:]):
        return
    cfg = hm.load_hf_folder(d)[0]
    g = torch.Generator().manual_seed(6)
    data = os.path.join(tmp, "mpi.jsonl")
    hm.write_jsonl(data, [{"input_ids": torch.randint(0, cfg["vocab_size"], (13,), generator=g).tolist()}
                          for _ in range(16)])
    common = ["train", "--model", d, "--data", data, "--steps", "3", "--batch-size", "4", "--grad-accum", "2",
              "--seq-len", "12", "--lr", "0.01", "--log", "quiet", "--peak-gflops", "1", "--no-shuffle",
              "--freeze"] + FREEZE
    one = os.path.join(tmp, "mpi.one")
    r = run([cllm] + common + ["--out", one])
    if not check("mpi: one-process run", r.returncode == 0, r.stderr[-300:]):
        return
    base = hm.load_hf_folder(one)[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    mpi = ["timeout", "-k", "5", "240", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", "2", cllm]

    def conf(name, obj):
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(obj, f)
        return path

    z2 = conf("z2", {"zero_optimization": {"stage": 2}})
    out = os.path.join(tmp, "mpi.z2")
    r = subprocess.run(mpi + common + ["--config", z2, "--out", out], capture_output=True, text=True, env=env)
    if check("mpi: ZeRO 2 on 2 ranks", r.returncode == 0, r.stderr[-300:]):
        w = hm.load_hf_folder(out)[1]
        worst = max((w[k] - base[k]).norm().item() / max(base[k].norm().item(), 1e-30) for k in base)
        check("mpi: ZeRO 2 within 1e-5 of one process after 3 AdamW steps, frozen tensors unchanged",
              worst <= 1e-5 and all(torch.equal(w[k], base[k]) for k in base if frozen(k)), "worst rel %.1e" % worst)
        part = os.path.join(tmp, "mpi.part")
        steps2 = [x if x != "3" else "2" for x in common]
        r1 = subprocess.run(mpi + steps2 + ["--config", z2, "--out", part, "--save-interval", "2"],
                            capture_output=True, text=True, env=env)
        r2 = subprocess.run(mpi + common + ["--config", z2, "--out", part, "--resume", "auto"],
                            capture_output=True, text=True, env=env)
        if check("mpi: stop at 2 and resume", r1.returncode == 0 and r2.returncode == 0, (r1.stderr + r2.stderr)[-300:]):
            a = hm.load_hf_folder(part)[1]
            check("mpi: resumed bit-identical to the straight run", all(torch.equal(a[k], w[k]) for k in w))
    # stage 3 and the offloaded optimizer state: the trained copies partitioned
    # (values, gradients, optimizer state), the frozen tensors whole
    os.makedirs(os.path.join(tmp, "nvme"), exist_ok=True)
    for name, obj in (("z3", {"zero_optimization": {"stage": 3}}),
                      ("z3off", {"zero_optimization": {"stage": 3, "offload_optimizer": {
                          "device": "nvme", "nvme_path": os.path.join(tmp, "nvme")}}})):
        out = os.path.join(tmp, "mpi." + name)
        r = subprocess.run(mpi + common + ["--config", conf(name, obj), "--out", out], capture_output=True, text=True,
                           env=env)
        if check("mpi: %s on 2 ranks" % name, r.returncode == 0, r.stderr[-300:]):
            w = hm.load_hf_folder(out)[1]
            worst = max((w[k] - base[k]).norm().item() / max(base[k].norm().item(), 1e-30) for k in base)
            check("mpi: %s within 1e-5 of one process after 3 AdamW steps, frozen tensors unchanged" % name,
                  worst <= 1e-5 and all(torch.equal(w[k], base[k]) for k in base if frozen(k)), "worst rel %.1e" % worst)
    for name, obj, what in (("pipe", {"model_topo": {"process_topology": {"axis": ["pipe", "data"], "dims": [2, 1]}}},
                             "pipeline parallelism"),):
        r = subprocess.run(mpi + common + ["--config", conf(name, obj), "--out", os.path.join(tmp, "mpi." + name)],
                           capture_output=True, text=True, env=env)
        check("mpi: %s with freeze refused by name" % what, r.returncode not in (0, None) and what in r.stderr,
              r.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--case", default="all", help="all (one process) or mpi")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cllm-freeze-")
    try:
        res = test_mpi(a.cllm, tmp) if a.case == "mpi" else test_train(a.cllm, tmp)
        if res:
            test_estimate(a.cllm, *res)
            test_errors(a.cllm, res[0], tmp)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (lt.PASSED, lt.FAILED))
    return 1 if lt.FAILED or not lt.PASSED else 0


if __name__ == "__main__":
    sys.exit(main())
