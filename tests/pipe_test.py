#!/usr/bin/env python3
"""Pipeline-parallel training under mpirun (label: mpi).

Equivalence: pipe=2, pipe=4 and pipe=2 x data=2 (ZeRO 0 and 1), with the
GPipe and 1F1B schedules, give the per-step losses, gradient norms and final
weights of the one-process run with the same global batch (10 fp32 AdamW
steps, 8 micro-batches per step, clipping active) within 1e-5 relative, for
LLaMA with GQA (tied and untied head), BLOOM and GPT-2 (tied heads: the
embedding is shared by the first and the last stage). Not bit-identical:
the gradient norm is summed stage by stage and MPI adds the data ranks'
gradients in its own order. The LLaMA and GPT-2 cases (and zero2, zero3)
also evaluate every 5 steps through the stages, forward only: their
evaluation losses within 1e-5 of the one-process run's, printed by rank 0
alone.

ZeRO-2 (case zero2): pipe=2 x data=2 with each stage's gradient
reduce-scattered within its data group, against the one-process run, and
its checkpoints resumed in one process, with data parallelism alone and
with a pipeline at ZeRO 0 (and a one-process checkpoint resumed by it).

ZeRO-3 (case zero3): pipe=2 x data=2 with each stage's parameters
partitioned over its data group and gathered layer by layer (an untied
LLaMA), against the one-process run; its checkpoints resumed in one
process, at ZeRO-2 in the same layout and at ZeRO-3 with data parallelism
alone. Tied heads at ZeRO-3 (a tied LLaMA, GPT-2): the embedding kept whole
on the first and the last stage, its gradient summed between them, the two
copies reported bit-identical at the end; GPT-2's checkpoints resumed in one
process and at ZeRO-2.

Errors: parts that do not add up, more stages than units, a bad schedule,
16-bit communication with a pipeline.

Usage: pipe_test.py --cllm BIN --build DIR --case {llama,llama-tied,bloom,gpt2,errors,ckpt,zero2,zero3}
"""
import argparse, os, shutil, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_test as dt  # noqa: E402

PIPE2 = {"axis": ["pipe", "data"], "dims": [2, 1]}
P2D2 = {"axis": ["pipe", "data"], "dims": [2, 2]}
# (name, ranks, topology, model_topo extras, config extras)
LAYOUTS = [
    ("pipe2-1f1b", 2, {"axis": ["pipe", "data"], "dims": [2, 1]}, {}, {}),
    ("pipe2-gpipe-ckpt", 2, {"axis": ["pipe", "data"], "dims": [2, 1]}, {"schedule": "gpipe"}, {"use_grad_ckpt": True}),
    ("pipe4", 4, {"axis": ["pipe"], "dims": [4]}, {"parts": [1, 1, 1, 1]}, {}),
    ("pipe2xdata2", 4, {"axis": ["pipe", "data"], "dims": [2, 2]}, {}, {}),
    ("pipe2xdata2-zero1", 4, {"axis": ["data", "pipe"], "dims": [2, 2]}, {"schedule": "gpipe"}, {}),
]
# ZeRO-2 inside the stages: each stage's gradient reduce-scattered over its
# data group, the slices' optimizer state (case zero2: a tied LLaMA, whose
# embedding's gradient adds up over the first and the last stage before the
# stage's range is reduced, and an untied one, reduced layer by layer)
ZERO2_LAYOUTS = [("pipe2xdata2-zero2", 4, P2D2, {}, {}),
                 ("pipe2xdata2-zero2-gpipe", 4, P2D2, {"schedule": "gpipe"}, {"use_grad_ckpt": True})]
# ZeRO-3 inside the stages: each stage's parameters partitioned over its
# data group, gathered layer by layer in the stage's passes
ZERO3_LAYOUTS = [("pipe2xdata2-zero3", 4, P2D2, {}, {}),
                 ("pipe2xdata2-zero3-gpipe", 4, P2D2, {"schedule": "gpipe"}, {"use_grad_ckpt": True})]
# checkpoints of ZeRO-2 stages resume in other layouts and stages
ZERO2_PLANS = [("p2d2z2", 4, P2D2, 2, [("one", 1, None, 0), ("dp2z2", 2, None, 2), ("p2z0", 2, PIPE2, 0)])]
ZERO3_PLANS = [("p2d2z3", 4, P2D2, 3, [("one", 1, None, 0), ("p2d2z2", 4, P2D2, 2), ("dp2z3", 2, None, 3)])]
# a tied head at ZeRO-3 (GPT-2): the first stage's copy of the embedding is the one saved
ZERO3_TIED_PLANS = [("p2d2z3", 4, P2D2, 3, [("one", 1, None, 0), ("p2d2z2", 4, P2D2, 2)])]


def equivalence(env, arch, tie, layouts=LAYOUTS, evals=False):
    """evals: evaluation every 5 steps (4 batches), its losses against the
    one-process run's too (the stages pass the batches on, forward only)."""
    model = env.init(arch)
    if tie:  # a tied llama: no lm_head tensor, the embedding serves as the head
        shutil.rmtree(model)
        p = env.run(["init", "--arch", "llama", "--preset", "tiny", "--set", "tie_word_embeddings=true",
                     "--out", model, "--seed", "3"])
        if p.returncode != 0:
            raise SystemExit(p.stderr)
    ref_out = env.path("ref")
    base = dict(train_batch_size=8, train_micro_batch_size_per_gpu=1)
    if evals:
        base.update(eval_interval=5, eval_iters=4, data={"train": env.data, "eval": env.data, "seq_len": 32})
    p = env.run(["train", "--config", env.config("ref.json", model, **base), "--out", ref_out])
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
        dt.check(False, f"{arch}: one-process run failed")
        return
    ref_all = dt.metrics(os.path.join(ref_out, "metrics.jsonl"))
    ref_m = [r for r in ref_all if "loss" in r]
    ref_eval = [r["eval_loss"] for r in ref_all if "eval_loss" in r]
    dt.check(len(ref_eval) == (2 if evals else 0), f"{arch}: reference run: {len(ref_eval)} evaluations")
    ref_w = dt.tensors(os.path.join(ref_out, "model.safetensors"))
    start = dt.tensors(os.path.join(model, "model.safetensors"))
    dt.check(all(r["grad_norm"] > 0.5 for r in ref_m[:3]), f"{arch}: clipping not active in the reference")
    for name, n, topo, extra, top in layouts:
        tag = f"{arch}{' tied' if tie else ''} {name}"
        stage = 3 if "zero3" in name else 2 if "zero2" in name else 1 if "zero1" in name else 0
        zero = {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 5000}
        if stage == 3:  # tensors under 2000 elements stay whole, the others are partitioned
            zero["stage3_param_persistence_threshold"] = 2000
        cfg = env.config(f"{name}.json", model, model_topo=dict(process_topology=topo, **extra),
                         zero_optimization=zero, **base, **top)
        out = env.path(name)
        p = env.run(["train", "--config", cfg, "--out", out], np_=n)
        if p.returncode != 0:
            print(p.stdout, p.stderr[-3000:], file=sys.stderr)
            dt.check(False, f"{tag}: mpirun failed ({p.returncode})")
            continue
        dt.check("pipeline stage of units" in p.stderr and "waited" in p.stderr, f"{tag}: no stage report")
        if stage == 3 and (tie or arch in ("gpt2", "bloom")):  # each end of the pipeline updated its own copy
            dt.check("copies on the first and the last stage are identical" in p.stderr,
                     f"{tag}: the tied embedding's copies were not reported identical")
        m_all = dt.metrics(os.path.join(out, "metrics.jsonl"))
        m = [r for r in m_all if "loss" in r]
        dt.check(len(m) == 10, f"{tag}: {len(m)} metrics records")
        evals = [r["eval_loss"] for r in m_all if "eval_loss" in r]
        dt.check(len(evals) == len(ref_eval), f"{tag}: {len(evals)} evaluations, expected {len(ref_eval)}")
        dt.check(p.stderr.count("eval      5") == (1 if evals else 0), f"{tag}: ranks > 0 are not quiet in evaluation")
        worst_eval = 0.0
        for a, b in zip(evals, ref_eval):
            worst_eval = max(worst_eval, dt.rel(a, b))
            dt.check(dt.rel(a, b) <= 1e-5, f"{tag}: eval loss {a} vs {b}")
        for a, b in zip(m, ref_m):
            dt.check(a["tokens"] == b["tokens"], f"{tag} step {b['step']}: tokens {a['tokens']} vs {b['tokens']}")
            dt.check(dt.rel(a["loss"], b["loss"]) <= 1e-5, f"{tag} step {b['step']}: loss {a['loss']} vs {b['loss']}")
            dt.check(dt.rel(a["grad_norm"], b["grad_norm"]) <= 1e-5,
                     f"{tag} step {b['step']}: grad norm {a['grad_norm']} vs {b['grad_norm']}")
        w = dt.tensors(os.path.join(out, "model.safetensors"))
        dt.check(w.keys() == ref_w.keys(), f"{tag}: tensor names differ")
        worst = max((float(np.max(np.abs(w[k] - ref_w[k]))) / max(float(np.max(np.abs(ref_w[k]))), 1e-30), k)
                    for k in ref_w if k in w)
        dt.check(worst[0] <= 1e-5, f"{tag}: final weights differ, worst {worst[1]} rel {worst[0]:.2e}")
        moved = min(float(np.max(np.abs(w[k] - start[k]))) for k in w if "norm" not in k and "ln" not in k)
        dt.check(moved > 1e-4, f"{tag}: some weight matrix did not train (min change {moved:.1e})")
        print(f"{tag}: ok (worst weight rel diff {worst[0]:.1e} in {worst[1]}"
              + (f", eval loss rel diff {worst_eval:.1e})" if evals else ")"))


def errors(env):
    model = env.init("llama")

    def fails(tag, np_, topo, *needles, mdl=model, **kw):
        cfg = env.config(f"{tag}.json", mdl, model_topo=topo, **kw)
        p = env.run(["train", "--config", cfg, "--out", env.path(tag)], np_=np_)
        dt.check(p.returncode not in (0, 124, 137), f"{tag}: exit {p.returncode} (expected a failure, not a hang)")
        for s in needles:
            dt.check(s in p.stderr, f"{tag}: '{s}' not in stderr:\n{p.stderr[-2000:]}")

    pipe2 = {"axis": ["pipe", "data"], "dims": [2, 1]}
    fails("parts", 2, {"process_topology": pipe2, "parts": [1, 2]}, "model_topo.parts sums to 3, but the model has 4")
    fails("stages", 2, {"process_topology": {"axis": ["pipe"], "dims": [5]}}, "pipe 5 x tensor 1 = 5 does not divide the 2 ranks")
    p5 = {"process_topology": {"axis": ["pipe"], "dims": [5]}}
    fails("too-many", 5, p5, "5 pipeline stages but the model has only 4 units")
    fails("schedule", 2, {"process_topology": pipe2, "schedule": "zigzag"}, "model_topo.schedule")
    fails("commtype", 2, {"process_topology": pipe2}, "communication_data_type bf16 with pipeline",
          communication_data_type="bf16")



# (source tag, ranks, topology, ZeRO stage, [(target tag, ranks, topology, ZeRO stage)])
PIPE_PLANS = [("p2", 2, PIPE2, 0, [("one", 1, None, 0), ("p2d2z1", 4, P2D2, 1)]),
              ("p2d2z0", 4, P2D2, 0, [("dp2z1", 2, None, 1), ("p2", 2, PIPE2, 0)]),
              ("p2d2z1", 4, P2D2, 1, [("one", 1, None, 0)])]


def checkpoints(env, plans=PIPE_PLANS, from_one=("p2d2z1", 4, P2D2, 1), bad_order=True, sharded=True, zero_extra=None,
                extras=None, arch="llama"):
    """Checkpoints saved in one layout resume in others, and the reverse
    (zero_extra: more zero_optimization keys for every run; extras: {layout
    tag: config keys that layout adds}, e.g. sequence_parallel)."""
    extras = extras or {}
    model = env.init(arch)
    base = dict(train_batch_size=8, train_micro_batch_size_per_gpu=1)
    ref_out = env.path("ref")
    p = env.run(["train", "--config", env.config("ref.json", model, **base), "--out", ref_out])
    if p.returncode != 0:
        dt.check(False, f"one-process run failed: {p.stderr[-2000:]}")
        return
    ref_m = {r["step"]: r for r in dt.metrics(os.path.join(ref_out, "metrics.jsonl"))}
    ref_w = dt.tensors(os.path.join(ref_out, "model.safetensors"))

    def run(tag, n, topo, zero, *extra, layout=None, **kw):
        cfg = dict(base, **extras.get(layout, {}), **kw)
        if topo:
            cfg["model_topo"] = {"process_topology": topo}
        cfg["zero_optimization"] = dict({"stage": zero, "reduce_bucket_size": 3000, "allgather_bucket_size": 5000},
                                        **(zero_extra or {}))
        out = env.path(tag)
        p = env.run(["train", "--config", env.config(tag + ".json", model, **cfg), "--out", out, *extra], np_=n)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            dt.check(False, f"{tag}: failed ({p.returncode})")
            return None
        return out

    def compare(tag, out, first):
        m = [r for r in dt.metrics(os.path.join(out, "metrics.jsonl")) if "loss" in r]
        dt.check([r["step"] for r in m] == list(range(first, 11)), f"{tag}: steps {[r['step'] for r in m]}")
        for r in m:
            b = ref_m[r["step"]]
            dt.check(dt.rel(r["loss"], b["loss"]) <= 1e-5, f"{tag} step {r['step']}: loss {r['loss']} vs {b['loss']}")
        w = dt.tensors(os.path.join(out, "model.safetensors"))
        worst = max(float(np.max(np.abs(w[k] - ref_w[k]))) / max(float(np.max(np.abs(ref_w[k]))), 1e-30) for k in ref_w)
        dt.check(worst <= 1e-5, f"{tag}: final weights differ by {worst:.2e}")
        print(f"{tag}: ok (worst weight rel diff {worst:.1e})")

    for src, n, topo, zero, targets in plans:
        out = run(f"src_{src}", n, topo, zero, save_interval=5, layout=src)
        if not out:
            continue
        ck = os.path.join(out, "checkpoint-5")
        dt.check(os.path.isfile(os.path.join(ck, "layout.json")) == sharded,
                 f"{src}: {'not ' if sharded else ''}a sharded checkpoint")
        compare(f"uninterrupted {src}", out, 1)
        for tgt, tn, ttopo, tzero in targets:
            res = run(f"res_{src}_{tgt}", tn, ttopo, tzero, "--resume", ck, layout=tgt)
            if res:
                compare(f"{src} -> {tgt}", res, 6)
    # one process -> the parallel layout
    out = run("src_one", 1, None, 0, save_interval=5, layout="one")
    tag, tn, ttopo, tzero = from_one
    if out:
        res = run(f"res_one_{tag}", tn, ttopo, tzero, "--resume", os.path.join(out, "checkpoint-5"), layout=tag)
        if res:
            compare(f"one -> {tag}", res, 6)
    if not bad_order:
        return
    # an axis order whose parts do not follow rank order cannot save
    cfg = dict(base, save_interval=5, model_topo={"process_topology": {"axis": ["data", "pipe"], "dims": [2, 2]}},
               zero_optimization={"stage": 1})
    p = env.run(["train", "--config", env.config("dp.json", model, **cfg), "--out", env.path("dp")], np_=4)
    dt.check(p.returncode not in (0, 124, 137) and "list \"pipe\" before \"data\"" in p.stderr,
             f"data-before-pipe checkpoints: {p.returncode} {p.stderr[-1500:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["llama", "llama-tied", "bloom", "gpt2", "errors", "ckpt", "zero2", "zero3"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    env = dt.Env(a.cllm, a.build, "pipe_" + a.case)
    try:
        if a.case == "errors":
            errors(env)
        elif a.case == "ckpt":
            checkpoints(env)
        elif a.case == "zero2":
            equivalence(env, "llama", True, ZERO2_LAYOUTS, evals=True)
            equivalence(env, "llama", False, ZERO2_LAYOUTS[:1])
            checkpoints(env, ZERO2_PLANS, from_one=("p2d2z2", 4, P2D2, 2), bad_order=False)
        elif a.case == "zero3":
            equivalence(env, "llama", False, ZERO3_LAYOUTS, evals=True)
            checkpoints(env, ZERO3_PLANS, from_one=("p2d2z3", 4, P2D2, 3), bad_order=False,
                        zero_extra={"stage3_param_persistence_threshold": 2000})
            # tied heads: the embedding kept whole on the first and the last stage
            equivalence(env, "llama", True, ZERO3_LAYOUTS[:1], evals=True)
            equivalence(env, "gpt2", False, ZERO3_LAYOUTS[1:], evals=True)
            checkpoints(env, ZERO3_TIED_PLANS, from_one=("p2d2z3", 4, P2D2, 3), bad_order=False,
                        zero_extra={"stage3_param_persistence_threshold": 2000}, arch="gpt2")
        else:
            equivalence(env, a.case.split("-")[0], a.case.endswith("tied"), evals=a.case in ("llama", "gpt2"))
    finally:
        if not a.keep and not dt.FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    print(f"{a.case}: {len(dt.FAILS)} failure(s)" + (f" (files kept in {env.dir})" if dt.FAILS else ""))
    return 1 if dt.FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
