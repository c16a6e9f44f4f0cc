#!/usr/bin/env python3
"""Sequence parallelism ("sequence_parallel": true) under mpirun (label: mpi).

Equivalence (cases gpt2, llama, bloom): tensor=2 and pipe=2 x tensor=2 (1F1B; the
stages exchange each tensor rank's half of the positions) with sequence
parallelism give the per-step losses, gradient norms, evaluation losses and final
weights of the one-process run (10 fp32 AdamW steps, clipping active)
within 1e-5 relative, the replicated norm parameters agree over the tensor
ranks (their gradients come from each rank's half of the sequence, summed),
and the start-up log says it is on. LLaMA also runs micro-batches of 2
sequences (the rank-major packing of the collectives) with activation
checkpointing, and data=2 x tensor=2.

Checkpoints (case ckpt, pipe_test's harness): a checkpoint saved with
sequence parallelism (tensor=2, pipe=2 x tensor=2) resumes without it
(tensor=2, one process) and one saved by one process (the format every
tensor-parallel run writes too) resumes with it; every resumed run ends where the uninterrupted one-process
run does (losses 1e-5, weights 1e-5).

Errors (case errors): sequence_parallel without a tensor axis (one process,
data 2, pipe 2), with a seq_len the tensor size does not divide, and a non-boolean
value fail naming the key.

Memory (case memory): the activation buffer each rank allocates
(activation_bytes in metrics.jsonl) with and without sequence parallelism
for a GPT-2 (the paper's architecture: 4h MLP, one attention head set)
equals the estimator's (`cllm estimate --tensor 2 [--sequence-parallel]`),
and the per-layer part (block inputs and saved activations) equals the
paper's formula as it applies to cllm, in fp32 elements:
    without: s*b*h*(4 + 12/t) + 4*s*b + a*s*b/t
    with:    s*b*h*(16/t)     + 4*s*b/t + a*s*b/t
(Korthikanti et al.: sbh(10 + 24/t + 5as/(ht)) -> sbh(34/t + 5as/(ht))
bytes in fp16; cllm has no dropout masks (2 sbh bytes), keeps the attention's
log-sum-exp (a*s*b floats) instead of its softmax (5as^2b bytes), and keeps
the norms' statistics, 4 floats per position).

Usage: seqpar_test.py --cllm BIN --build DIR --case {gpt2,llama,bloom,ckpt,errors,memory}
"""
import json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_test as dt  # noqa: E402
import tp_test  # noqa: E402

T2 = {"axis": ["tensor"], "dims": [2]}
SP = {"sequence_parallel": True}
LAYOUTS = [("tensor2-sp", 2, T2, 0, SP), ("pipe2xtensor2-sp", 4, {"axis": ["pipe", "tensor"], "dims": [2, 2]}, 0, SP)]
LLAMA_MORE = [
    ("tensor2-sp-mb2-ckpt", 2, T2, 0, dict(SP, train_micro_batch_size_per_gpu=2, use_grad_ckpt=True,
                                              eval_iters=2)),  # the reference's 4 evaluation samples
    ("tensor2xdata2-sp", 4, {"axis": ["data", "tensor"], "dims": [2, 2]}, 0, SP),
]


def started_line(env, model):
    """The start-up line names sequence parallelism and its positions per rank."""
    cfg = env.config("log.json", model, model_topo={"process_topology": T2}, train_iters=1, **SP)
    p = env.run(["train", "--config", cfg, "--out", env.path("log")], np_=2)
    lines = [ln for ln in p.stderr.splitlines() if "sequence parallelism on" in ln]
    dt.check(p.returncode == 0 and len(lines) == 1 and "16 of 32 positions per rank" in lines[0],
             f"start-up line: {lines} {p.stderr[-1500:]}")
    if lines:
        print(lines[0])


def checkpoints(env, _case):
    import pipe_test  # noqa: E402 (same directory)
    # a checkpoint of tensor 2 with sequence parallelism resumes on tensor 2
    # without it and on one process; one saved by one process (the format
    # every tensor-parallel run writes too) resumes with it
    p2t2 = {"axis": ["pipe", "tensor"], "dims": [2, 2]}
    plans = [("t2sp", 2, T2, 0, [("t2", 2, T2, 0), ("one", 1, None, 0)]),
             ("p2t2sp", 4, p2t2, 0, [("one", 1, None, 0)])]
    pipe_test.checkpoints(env, plans, from_one=("t2sp", 2, T2, 0), bad_order=False, sharded=False,
                          extras={"t2sp": SP, "p2t2sp": SP})


def errors(env, _case):
    model = env.init("llama")

    def fails(tag, np_, topo, needle, **kw):
        cfg = dict(kw)
        if topo:
            cfg["model_topo"] = {"process_topology": topo}
        p = env.run(["train", "--config", env.config(f"{tag}.json", model, **cfg), "--out", env.path(tag)], np_=np_)
        dt.check(p.returncode not in (0, 124, 137), f"{tag}: exit {p.returncode} (expected a failure, not a hang)")
        dt.check(needle in p.stderr, f"{tag}: '{needle}' not in stderr:\n{p.stderr[-2000:]}")

    fails("no-tensor", 0, None, "sequence_parallel needs tensor parallelism", **SP)
    fails("data2", 2, {"axis": ["data"], "dims": [2]}, "sequence_parallel needs tensor parallelism", **SP)
    fails("pipe", 2, {"axis": ["pipe"], "dims": [2]}, "sequence_parallel needs tensor parallelism", **SP)
    fails("seq-len", 2, T2, "data.seq_len 33 is not divisible by the tensor axis 2",
          data={"train": env.data, "seq_len": 33}, **SP)
    fails("not-bool", 0, None, "sequence_parallel", sequence_parallel="yes")


def memory(env, _case):
    cllm = env.cllm
    sets = ["n_embd=128", "n_head=4", "n_layer=2", "n_inner=512", "vocab_size=512", "n_positions=256"]
    model = env.init("gpt2", *sets)
    B, T, t = 2, 64, 2
    C, a, L = 128, 4, 2
    s_b = B * T
    got = {}
    for sp in (False, True):
        tag = "sp" if sp else "nosp"
        cfg = env.config(f"{tag}.json", model, data={"train": env.data, "seq_len": T}, train_batch_size=B,
                         train_micro_batch_size_per_gpu=B, train_iters=1, model_topo={"process_topology": T2},
                         **(SP if sp else {}))
        p = env.run(["train", "--config", cfg, "--out", env.path(tag)], np_=2)
        if p.returncode != 0:
            dt.check(False, f"memory {tag}: {p.stderr[-2000:]}")
            return
        rec = [r for r in dt.metrics(os.path.join(env.path(tag), "metrics.jsonl")) if "activation_bytes" in r]
        e = json.loads(subprocess.run([cllm, "estimate", "--json", "--model", model, "--micro-batch", str(B),
                                       "--seq-len", str(T), "--tensor", "2"] + (["--sequence-parallel"] if sp else []),
                                      capture_output=True, text=True, check=True).stdout)
        measured = rec[-1]["activation_bytes"]
        dt.check(measured == e["activations"] + e["logits"],
                 f"memory {tag}: allocated {measured} vs estimate {e['activations'] + e['logits']}")
        per_layer = (e["block_inputs"] + e["block_saved"]) / L / 4  # fp32 elements
        if sp:
            formula = s_b * C * 16 / t + 4 * s_b / t + a * s_b / t
        else:
            formula = s_b * C * (4 + 12 / t) + 4 * s_b + a * s_b / t
        dt.check(per_layer == formula, f"memory {tag}: per-layer {per_layer} floats, formula {formula}")
        got[sp] = (measured, per_layer)
        print(f"memory {'with' if sp else 'without'} sequence parallelism: allocated {measured / 1e6:.3f} MB per rank, "
              f"per layer {per_layer * 4 / 1e6:.3f} MB (formula {formula * 4 / 1e6:.3f} MB)")
    if len(got) == 2:
        ratio = got[True][1] / got[False][1]
        paper = (34 / t) / (10 + 24 / t)  # the paper's ratio without its attention-score term
        print(f"per-layer ratio with/without: {ratio:.3f} (cllm's formula {(16 / t) / (4 + 12 / t):.3f} before the "
              f"statistics and log-sum-exp terms; the paper's {paper:.3f} with dropout masks)")
        dt.check(got[True][0] < got[False][0] and ratio < 0.85, f"memory: no reduction ({ratio:.3f})")


def equal(env, arch):
    tp_test.equivalence(env, arch, layouts=LAYOUTS + (LLAMA_MORE if arch == "llama" else []))
    if arch == "gpt2":
        started_line(env, env.init("gpt2"))


if __name__ == "__main__":
    sys.exit(dt.run_case("seqpar_", {"gpt2": equal, "llama": equal, "bloom": equal, "ckpt": checkpoints,
                                     "errors": errors, "memory": memory}))
