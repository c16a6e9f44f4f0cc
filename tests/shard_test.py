#!/usr/bin/env python3
"""Sharded ZeRO checkpoints under mpirun (label: mpi).

resume   a 10-step run checkpointed at step 5 on 4 ranks at ZeRO stage 2 is
         resumed on 2 ranks at stage 1, on one process and on 4 ranks at
         stage 0; one checkpointed on 2 ranks at stage 1 is resumed on 4 at
         stage 2; a single-process checkpoint is resumed on 2 ranks at
         stages 2 and 3; one checkpointed on 4 ranks at stage 3 (matrices
         partitioned, small tensors replicated) is resumed on 2 ranks at
         stages 1 and 3 and on one process. Losses of steps 6-10 and the final weights equal the
         uninterrupted one-process run within 1e-5 relative (the tolerance of
         dist_test.py: the ranks' partial sums are added in MPI's order).
convert  `cllm convert` of a sharded checkpoint (one file, and shards with
         an index) and of a single-process one gives tensors bit-identical,
         read here with an independent safetensors parser, to the model the
         run saved at that step; the converted folder loads with `cllm eval`.
errors   a corrupted params or optim shard is reported naming the file (by
         resume and by convert); a checkpoint of another optimizer is
         refused; a leftover .checkpoint-STEP.tmp of an interrupted save and
         a save killed half-way leave the previous checkpoint usable.

Usage: shard_test.py --cllm BIN --build DIR --case {resume,convert,errors}
"""
import argparse, json, os, shutil, signal, subprocess, sys, time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_test import MPIRUN, Env, metrics, rel, tensors  # noqa: E402

FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def zero(stage):
    z = {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 5000}
    if stage == 3:  # matrices partitioned, norms kept whole on every rank
        z["stage3_param_persistence_threshold"] = 1000
    return z


def train(env, tag, model, out, np_, stage, *extra, **kw):
    cfg = env.config(f"{tag}.json", model, zero_optimization=zero(stage), **kw)
    p = env.run(["train", "--config", cfg, "--out", out, *extra], np_=np_ if np_ > 1 else 0)
    if p.returncode != 0:
        print(p.stdout, p.stderr[-3000:], file=sys.stderr)
        check(False, f"{tag}: training failed ({p.returncode})")
        return False
    return True


def compare(tag, out, ref_m, ref_w, first):
    m = metrics(os.path.join(out, "metrics.jsonl"))
    check([r["step"] for r in m] == list(range(first, 11)), f"{tag}: steps {[r['step'] for r in m]}")
    want = {r["step"]: r for r in ref_m}
    for r in m:
        b = want[r["step"]]
        check(rel(r["loss"], b["loss"]) <= 1e-5, f"{tag} step {r['step']}: loss {r['loss']} vs {b['loss']}")
        check(rel(r["grad_norm"], b["grad_norm"]) <= 1e-5,
              f"{tag} step {r['step']}: grad norm {r['grad_norm']} vs {b['grad_norm']}")
    w = tensors(os.path.join(out, "model.safetensors"))
    check(w.keys() == ref_w.keys(), f"{tag}: tensor names differ")
    worst = max((float(np.max(np.abs(w[k] - ref_w[k]))) / max(float(np.max(np.abs(ref_w[k]))), 1e-30), k)
                for k in ref_w if k in w)
    check(worst[0] <= 1e-5, f"{tag}: final weights differ, worst {worst[1]} rel {worst[0]:.2e}")
    print(f"{tag}: ok (worst weight rel diff {worst[0]:.1e})")


def reference(env, model):
    out = env.path("ref")
    train(env, "ref", model, out, 1, 0)
    return metrics(os.path.join(out, "metrics.jsonl")), tensors(os.path.join(out, "model.safetensors"))


def case_resume(env):
    model = env.init("llama")
    ref_m, ref_w = reference(env, model)
    plans = [((4, 2), [(2, 1), (1, 0), (4, 0)]), ((2, 1), [(4, 2)]), ((1, 0), [(2, 2), (2, 3)]),
             ((4, 3), [(2, 1), (1, 0), (2, 3)])]
    for (n, s), targets in plans:
        src = env.path(f"src_n{n}_s{s}")
        if not train(env, f"src_n{n}_s{s}", model, src, n, s, save_interval=5):
            continue
        ck = os.path.join(src, "checkpoint-5")
        sharded = (n > 1 and s > 0) or s == 3
        check(os.path.isfile(os.path.join(ck, "layout.json")) == sharded,
              f"{n} ranks stage {s}: layout.json {'missing' if sharded else 'present'}")
        if sharded:
            names = sorted(os.listdir(ck))
            want = sorted([f"params-{r:05d}-of-{n:05d}.safetensors" for r in range(1, n + 1)] +
                          [f"optim-{r:05d}-of-{n:05d}.safetensors" for r in range(1, n + 1)] +
                          ["config.json", "layout.json", "manifest.json", "trainer_state.json"])
            check(names == want, f"{n} ranks stage {s}: checkpoint files {names}")
            with open(os.path.join(ck, "layout.json")) as f:
                lay = json.load(f)
            # each optim shard holds state of its own slice only
            for r, sh in enumerate(lay["shards"]):
                o = tensors(os.path.join(ck, sh["optim"]))
                check(o["state0"].shape == (sh["end"] - sh["begin"],), f"shard {r}: state0 {o['state0'].shape}")
        compare(f"uninterrupted {n} ranks stage {s}", src, ref_m, ref_w, 1)
        for tn, ts in targets:
            out = env.path(f"res_n{n}_s{s}_to_n{tn}_s{ts}")
            if train(env, f"res_{n}{s}{tn}{ts}", model, out, tn, ts, "--resume", ck):
                compare(f"{n} ranks stage {s} -> {tn} rank(s) stage {ts}", out, ref_m, ref_w, 6)


def case_convert(env):
    model = env.init("gpt2")
    out = env.path("run")
    if not train(env, "run", model, out, 2, 2, save_interval=5):
        return
    conv = env.path("conv")
    p = env.run(["convert", "--checkpoint", out, "--out", conv])  # `latest` = checkpoint-10
    check(p.returncode == 0, f"convert: rc {p.returncode}\n{p.stderr}")
    final = os.path.join(out, "model.safetensors")
    got = tensors(os.path.join(conv, "model.safetensors"))
    want = tensors(final)
    check(got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want),
          "convert: tensors differ from the run's final model")
    with open(os.path.join(conv, "config.json")) as a, open(os.path.join(out, "config.json")) as b:
        check(json.load(a) == json.load(b), "convert: config.json differs")
    p = env.run(["eval", "--model", conv, "--data", env.data, "--seq-len", "32"])
    check(p.returncode == 0 and '"loss"' in p.stdout, f"convert: the folder does not load with cllm eval\n{p.stderr}")
    # sharded output with an index
    conv2 = env.path("conv2")
    p = env.run(["convert", "--checkpoint", os.path.join(out, "checkpoint-10"), "--out", conv2,
                 "--max-shard-size", "100KB"])
    check(p.returncode == 0, f"convert --max-shard-size: rc {p.returncode}\n{p.stderr}")
    idx_path = os.path.join(conv2, "model.safetensors.index.json")
    if os.path.isfile(idx_path):
        with open(idx_path) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        check(len(files) > 1, f"convert: {len(files)} shard(s)")
        got = {}
        for fn in files:
            got.update(tensors(os.path.join(conv2, fn)))
        check(got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want),
              "convert (sharded output): tensors differ")
    else:
        check(False, "convert --max-shard-size 100KB: no index")
    # a single-process checkpoint converts to its own model files
    single = env.path("single")
    if train(env, "single", model, single, 1, 0, save_interval=5, train_iters=5):
        conv3 = env.path("conv3")
        p = env.run(["convert", "--checkpoint", os.path.join(single, "checkpoint-5"), "--out", conv3])
        check(p.returncode == 0, f"convert single: rc {p.returncode}\n{p.stderr}")
        with open(os.path.join(conv3, "model.safetensors"), "rb") as a, \
                open(os.path.join(single, "model.safetensors"), "rb") as b:
            check(a.read() == b.read(), "convert single: model.safetensors differs from the run's")
    # the sharded checkpoint at step 5 against the one-process checkpoint at
    # step 5 (other world size: within the tolerance)
    conv5 = env.path("conv5")
    p = env.run(["convert", "--checkpoint", os.path.join(out, "checkpoint-5"), "--out", conv5])
    a, b = tensors(os.path.join(conv5, "model.safetensors")), tensors(os.path.join(single, "model.safetensors"))
    worst = max(float(np.max(np.abs(a[k] - b[k]))) / max(float(np.max(np.abs(b[k]))), 1e-30) for k in b)
    check(worst <= 1e-5, f"convert step 5: differs from the one-process run by {worst:.2e}")
    print("convert: ok")


def flip(path, offset_from_end=100):
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, 2)
        b = f.read(1)
        f.seek(-offset_from_end, 2)
        f.write(bytes([b[0] ^ 0x55]))


def case_errors(env):
    model = env.init("llama")
    ref_m, ref_w = reference(env, model)
    out = env.path("run")
    if not train(env, "run", model, out, 2, 1, save_interval=5, train_iters=5):
        return
    ck = os.path.join(out, "checkpoint-5")

    def fails(tag, args, np_, *needles):
        p = env.run(args, np_=np_)
        check(p.returncode not in (0, 124, 137), f"{tag}: exit {p.returncode} (expected a failure, not a hang)")
        for s in needles:
            check(s in p.stderr, f"{tag}: '{s}' not in stderr:\n{p.stderr[-2000:]}")

    cfg1 = env.config("e1.json", model, zero_optimization=zero(1))
    for name, np_ in (("params-00002-of-00002.safetensors", 0), ("optim-00001-of-00002.safetensors", 2)):
        bad = env.path(f"bad_{name[:5]}")
        shutil.copytree(ck, bad)
        flip(os.path.join(bad, name))
        path = os.path.join(bad, name)
        fails(f"corrupt {name}", ["train", "--config", cfg1, "--out", env.path("x"), "--resume", bad], np_,
              f"checkpoint file '{path}' is corrupted")
        if name.startswith("params"):
            fails(f"convert corrupt {name}", ["convert", "--checkpoint", bad, "--out", env.path("xc")], 0,
                  f"checkpoint file '{path}' is corrupted")
    lion = env.config("lion.json", model, zero_optimization=zero(1),
                      optimizer={"type": "Lion", "params": {"lr": 1e-4}})
    fails("other optimizer", ["train", "--config", lion, "--out", env.path("y"), "--resume", ck], 2,
          "was written by optimizer adamw")
    # an interrupted save: its .tmp folder is ignored and replaced
    run2 = env.path("run2")
    shutil.copytree(out, run2)
    os.remove(os.path.join(run2, "model.safetensors"))
    tmp = os.path.join(run2, ".checkpoint-10.tmp")
    os.makedirs(tmp)
    with open(os.path.join(tmp, "params-00001-of-00002.safetensors"), "wb") as f:
        f.write(b"partial")
    if train(env, "resume_tmp", model, run2, 2, 1, "--resume", "auto", save_interval=5):
        compare("resume past a leftover .tmp", run2, ref_m, ref_w, 1)
        check(not os.path.exists(tmp), "the leftover .tmp folder is still there")
        with open(os.path.join(run2, "latest")) as f:
            check(f.read().strip() == "checkpoint-10", "latest does not name checkpoint-10")
    # a save killed half-way (SIGKILL to every rank while checkpoint-10 is
    # being written): `latest` still names checkpoint-5, which resumes
    run3 = env.path("run3")
    shutil.copytree(out, run3)
    os.remove(os.path.join(run3, "model.safetensors"))
    cfg = env.config("kill.json", model, zero_optimization=zero(1), save_interval=5)
    envv = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.Popen(MPIRUN + ["-np", "2", env.cllm, "train", "--config", cfg, "--out", run3, "--resume",
                                      "auto"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=envv,
                            start_new_session=True)
    killed = False
    t_end = time.time() + 60
    while proc.poll() is None and time.time() < t_end:
        if os.path.isdir(os.path.join(run3, ".checkpoint-10.tmp")):
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.001)
    proc.wait()
    # the kill may land before or after the rename: either way `latest`
    # names a complete checkpoint, which the resumed run verifies and uses
    with open(os.path.join(run3, "latest")) as f:
        latest = f.read().strip()
    check(killed and latest in ("checkpoint-5", "checkpoint-10"), f"killed save: killed {killed}, latest {latest}")
    print(f"killed during the save; latest names {latest}")
    if train(env, "resume_kill", model, run3, 2, 1, "--resume", "auto", save_interval=5):
        compare("resume after a killed save", run3, ref_m, ref_w, 1)
    print("errors: done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["resume", "convert", "errors"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    env = Env(a.cllm, a.build, "shard_" + a.case)
    try:
        {"resume": case_resume, "convert": case_convert, "errors": case_errors}[a.case](env)
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {env.dir})" if FAILS else ""))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
