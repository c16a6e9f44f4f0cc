#!/usr/bin/python3
"""
Mixture-of-experts training: capacity and expert parallelism (docs/moe.md).

  - capacity: `cllm train` with moe.capacity_factor 0.5 (one process): the
    first step's loss and its count of dropped choices equal an independent
    PyTorch Mixtral (float64) that keeps each expert's first
    max(min_capacity, ceil(N*k/E*factor)) choices in DeepSpeed's order
    (first choices before second choices, rows in order) and gives a dropped
    choice no output; train-time evaluation at eval_capacity_factor;
  - expert parallelism over mpirun: 2 ranks with expert_parallel_size 2
    (ZeRO-1, 2 and 3) and 4 ranks with expert_parallel_size 2 and 4
    against one process accumulating the same micro-batches: losses and
    gradient norms within 1e-5, final weights within rel-L2 1e-5, the same
    expert loads; the first step's all-to-all bytes against the routing of
    each rank's rows; cllm plot's expert-load panel;
  - a checkpoint of an expert_parallel_size 2 run resumed with size 1 (and
    one of size 1 with size 2) ends within 1e-5 of the straight run;
  - the "moe" keys' errors (sizes that divide neither the ranks nor the
    experts, bad values, both names of one setting, an unknown key, LoRA).

Run by ctest (label mpi) as
  /usr/bin/python3 tests/test_moe_ep.py --cllm build/cllm
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import hf_models as hm  # noqa: E402
import test_mixtral_vs_torch as mx  # noqa: E402  (the Mixtral config, weights and reference pieces)

FAILED = 0


def check(name, ok, detail=""):
    global FAILED
    FAILED += not ok
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail and not ok else ""))
    sys.stdout.flush()
    return ok


def run(cmd, np=None, env=None):
    if np:
        cmd = ["timeout", "240", shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(np)] + cmd
    e = dict(os.environ, OMP_NUM_THREADS="1")
    if not np and "ASAN_OPTIONS" in e:  # leaks are checked in one process (ctest turns them off for MPI's)
        e["ASAN_OPTIONS"] = e["ASAN_OPTIONS"].replace("detect_leaks=0", "detect_leaks=1")
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=e)


def write_config(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if '"step_time"' in l]


def samples(c, T, n, seed):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, c["vocab_size"], (T,), generator=g).tolist()} for _ in range(n)]


# ------------------------------------------------------------ capacity


def kept_mask(sel, E, cap):
    """DeepSpeed's order: all first choices, then all second choices, rows in
    order; an expert keeps its first `cap`."""
    N, k = sel.shape
    used = [0] * E
    keep = torch.zeros(N, k, dtype=torch.bool)
    for j in range(k):
        for n in range(N):
            e = int(sel[n, j])
            if used[e] < cap:
                used[e] += 1
                keep[n, j] = True
    return keep


def forward_capacity(c, p, ids, factor, min_cap):
    """mx.forward with a capacity: the logits and the choices dropped."""
    B, T = ids.shape
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    C, E, k = c["hidden_size"], c["num_local_experts"], c["num_experts_per_tok"]
    hd, eps = C // H, c["rms_norm_eps"]
    allowed = torch.arange(T).unsqueeze(0) <= torch.arange(T).unsqueeze(1)
    h = p["model.embed_tokens.weight"][ids]
    N = B * T
    cap = max(min_cap, math.ceil(N * k / E * factor))
    dropped = 0
    for l in range(c["num_hidden_layers"]):
        q_ = "model.layers.%d." % l
        a = mx.rms_norm(h, p[q_ + "input_layernorm.weight"], eps)
        q = (a @ p[q_ + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        kk = (a @ p[q_ + "self_attn.k_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        v = (a @ p[q_ + "self_attn.v_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        q, kk = mx.rope(q, T, c["rope_theta"]), mx.rope(kk, T, c["rope_theta"])
        kk, v = kk.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = ((q @ kk.transpose(-1, -2)) / math.sqrt(hd)).masked_fill(~allowed, float("-inf"))
        h = h + (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * hd) @ p[q_ + "self_attn.o_proj.weight"].t()
        x = mx.rms_norm(h, p[q_ + "post_attention_layernorm.weight"], eps).reshape(N, C)
        probs = torch.softmax(x @ p[q_ + "block_sparse_moe.gate.weight"].t(), -1)
        w, sel = mx.topk_lower_index(probs, k)
        w = w / w.sum(-1, keepdim=True)
        keep = kept_mask(sel, E, cap)
        dropped += int((~keep).sum())
        out = torch.zeros_like(x)
        for n in range(N):
            for j in range(k):
                if not keep[n, j]:
                    continue
                pe = q_ + "block_sparse_moe.experts.%d." % int(sel[n, j])
                xe = x[n:n + 1]
                ye = (F.silu(xe @ p[pe + "w1.weight"].t()) * (xe @ p[pe + "w3.weight"].t())) @ p[pe + "w2.weight"].t()
                out[n] += w[n, j] * ye[0]
        h = h + out.view(B, T, C)
    h = mx.rms_norm(h, p["model.norm.weight"], eps)
    return h @ p["lm_head.weight"].t(), dropped


def test_capacity(cllm, tmp):
    c = mx.config(num_local_experts=4)
    d = os.path.join(tmp, "cap-model")
    params = mx.write_model(d, c, mx.init_params(c, seed=3, tie=None))
    T, B = 10, 4
    rows = samples(c, T, B, seed=5)
    data = os.path.join(tmp, "cap.jsonl")
    hm.write_jsonl(data, rows)
    ids = torch.tensor([r["input_ids"] for r in rows])
    # the last: min_capacity = N*k, above any expert's load, wins over the factor
    for factor, min_cap in ((0.5, 2), (0.75, 0), (1.0, 25), (0.25, B * T * 2)):
        cfg = write_config(os.path.join(tmp, "cap.json"),
                           {"moe": {"capacity_factor": factor, "min_capacity": min_cap, "drop_tokens": True}})
        out = os.path.join(tmp, "cap-run-%g" % factor)
        r = run([cllm, "train", "--config", cfg, "--model", d, "--data", data, "--out", out, "--steps", "1",
                 "--batch-size", str(B), "--seq-len", str(T), "--no-shuffle", "--optimizer", "sgd", "--lr", "0.1"])
        if not check("capacity %g: train exits 0" % factor, r.returncode == 0, r.stderr[-500:]):
            continue
        rec = records(out)[0]
        with torch.no_grad():
            logits, dropped = forward_capacity(c, OrderedDict((n, t.double()) for n, t in params.items()), ids,
                                               factor, min_cap)
            V = logits.shape[-1]
            loss = float(F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)))
        choices = c["num_hidden_layers"] * B * T * c["num_experts_per_tok"]
        check("capacity %g (min %d): %d of %d choices dropped (reference %d)" % (factor, min_cap, rec["moe_dropped"],
              choices, dropped), rec["moe_dropped"] == dropped and rec["moe_choices"] == choices)
        check("capacity %g: loss %.7f equals the reference %.7f (rel 1e-5)" % (factor, rec["loss"], loss),
              abs(rec["loss"] - loss) <= 1e-5 * abs(loss))
        check("capacity %g: expert_load sums to the choices" % factor, sum(rec["expert_load"]) == choices)
        if min_cap >= B * T * 2:
            check("capacity: min_capacity above every load drops nothing", dropped == 0)
        else:
            check("capacity %g drops some choices (the case is exercised)" % factor, dropped > 0)
    # train-time evaluation runs at eval_capacity_factor: lr 0 keeps the weights, the eval set is the batch
    cfg = write_config(os.path.join(tmp, "cap-eval.json"),
                       {"moe": {"capacity_factor": 0.5, "eval_capacity_factor": 0.75, "min_capacity": 0}})
    out = os.path.join(tmp, "cap-eval")
    r = run([cllm, "train", "--config", cfg, "--model", d, "--data", data, "--eval-data", data, "--eval-interval", "1",
             "--out", out, "--steps", "1", "--batch-size", str(B), "--seq-len", str(T), "--no-shuffle",
             "--optimizer", "sgd", "--lr", "0"])
    if check("eval capacity: train exits 0", r.returncode == 0, r.stderr[-500:]):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            ev = [json.loads(l) for l in f if '"eval_loss"' in l]
        with torch.no_grad():
            p64 = OrderedDict((n, t.double()) for n, t in params.items())
            want = {}
            for fct in (0.5, 0.75):
                logits, _ = forward_capacity(c, p64, ids, fct, 0)
                V = logits.shape[-1]
                want[fct] = float(F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)))
        got_train, got_eval = records(out)[0]["loss"], ev[0]["eval_loss"] if ev else float("nan")
        check("capacity: training loss at capacity_factor 0.5 (%.6f, reference %.6f), evaluation at "
              "eval_capacity_factor 0.75 (%.6f, reference %.6f)" % (got_train, want[0.5], got_eval, want[0.75]),
              abs(got_train - want[0.5]) <= 1e-5 * want[0.5] and abs(got_eval - want[0.75]) <= 1e-5 * want[0.75])


# ---------------------------------------------------------- expert parallel


def setup_ep(tmp):
    c = mx.config(num_local_experts=4, output_router_logits=True, router_aux_loss_coef=0.05)
    d = os.path.join(tmp, "ep-model")
    params = mx.write_model(d, c, mx.init_params(c, seed=8, tie=None))
    data = os.path.join(tmp, "ep.jsonl")
    rows = samples(c, 12, 32, seed=4)
    hm.write_jsonl(data, rows)
    return d, data, c, params, rows


def compare(tmp, ref, got, what, steps):
    a, b = records(ref), records(got)
    if not check("%s: %d steps recorded" % (what, steps), len(a) == len(b) == steps, "%d, %d" % (len(a), len(b))):
        return
    wl = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
    wg = max(abs(x["grad_norm"] - y["grad_norm"]) / abs(x["grad_norm"]) for x, y in zip(a, b))
    check("%s: losses within 1e-5 (worst %.1e), gradient norms within 1e-5 (worst %.1e)" % (what, wl, wg),
          wl <= 1e-5 and wg <= 1e-5)
    check("%s: the same expert loads per step" % what, [x["expert_load"] for x in a] == [y["expert_load"] for y in b])
    w1 = hm.load_safetensors(os.path.join(ref, "model.safetensors"))
    w2 = hm.load_safetensors(os.path.join(got, "model.safetensors"))
    e = max(mx.rel_l2(w2[n], w1[n]) for n in w1)
    check("%s: final weights within rel-L2 1e-5 (worst %.1e)" % (what, e), e <= 1e-5)
    return b


def a2a_bytes(c, params, rows, P, micro):
    """Bytes one step sends between ranks (no recomputation): per block and
    rank, the counts (E/P ints to each other rank) and four trips (dispatch,
    combine, forward and backward) of each choice routed to another rank's
    experts, C floats each; rank r's micro-batch is rows r*micro.. ."""
    E, k, C = c["num_local_experts"], c["num_experts_per_tok"], c["hidden_size"]
    El, total = E // P, 0
    p = OrderedDict((n, t.double()) for n, t in params.items())
    for r in range(P):
        ids = torch.tensor([x["input_ids"] for x in rows[r * micro:(r + 1) * micro]])
        with torch.no_grad():
            _, router = mx.forward(c, p, ids)
        for logits in router:
            _, sel = mx.topk_lower_index(torch.softmax(logits, -1), k)
            remote = int((sel // El != r).sum())
            total += (P - 1) * El * 4 + 4 * remote * C * 4
    return total


def test_expert_parallel(cllm, tmp, big):
    d, data, c, params, rows = setup_ep(tmp)
    common = ["--model", d, "--data", data, "--optimizer", "adamw", "--lr", "1e-2", "--steps", "3",
              "--micro-batch-size", "2", "--seq-len", "12", "--no-shuffle", "--grad-ckpt"]
    nodrop = {"drop_tokens": False}
    one = os.path.join(tmp, "ep-one")
    cfg1 = write_config(os.path.join(tmp, "one.json"), {"moe": nodrop})
    r = run([cllm, "train", "--config", cfg1, "--out", one, "--batch-size", "4", "--grad-accum", "2"] + common)
    if not check("one process: exits 0", r.returncode == 0, r.stderr[-500:]):
        return
    # gradient clipping below the gradient norm (so it acts) and a train-time evaluation, in the reference too;
    # SGD, whose update is linear in the clipped gradient (AdamW divides each element by its own magnitude, so
    # elements with gradients near its eps turn last-bit differences of the summation order into 2e-5 of a
    # tensor, with or without sliced experts; AdamW's runs are those below)
    clip = 0.05
    adamw, common = common, [("sgd" if x == "adamw" else "1.0" if x == "1e-2" else x) for x in common]
    onec = os.path.join(tmp, "ep-one-clip")
    cfg1c = write_config(os.path.join(tmp, "one-clip.json"), {"moe": nodrop, "gradient_clipping": clip})
    evald = ["--eval-data", data, "--eval-interval", "3", "--eval-iters", "2"]
    r = run([cllm, "train", "--config", cfg1c, "--out", onec, "--batch-size", "4", "--grad-accum", "2"] + common + evald)
    if not check("one process with clipping: exits 0", r.returncode == 0, r.stderr[-500:]):
        return
    check("clipping acts: every step's gradient norm is above %g" % clip, all(x["grad_norm"] > clip for x in records(onec)))
    shp = mx.shapes(c)
    n_all = sum(math.prod(v) for v in shp.values())
    n_exp = sum(math.prod(v) for k, v in shp.items() if ".experts." in k)
    for stage in (0, 1, 2, 3):
        cfg = write_config(os.path.join(tmp, "ep2-z%d.json" % stage),
                           {"moe": dict(nodrop, expert_parallel_size=2), "zero_optimization": {"stage": stage},
                            "gradient_clipping": clip})
        out = os.path.join(tmp, "ep2-z%d" % stage)
        r = run([cllm, "train", "--config", cfg, "--out", out, "--batch-size", "4"] + common + evald, np=2)
        if not check("2 ranks, expert_parallel_size 2, ZeRO-%d, clipping %g: exits 0" % (stage, clip), r.returncode == 0,
                     r.stderr[-800:]):
            continue
        recs = compare(tmp, onec, out, "EP 2 x ZeRO-%d with clipping" % stage, 3)
        ev = [[json.loads(l)["eval_loss"] for l in open(os.path.join(d_, "metrics.jsonl")) if '"eval_loss"' in l]
              for d_ in (onec, out)]
        check("EP 2 x ZeRO-%d: train-time evaluation %s equals one process's %s (rel 1e-5)" % (stage, ev[1], ev[0]),
              len(ev[0]) == len(ev[1]) == 1 and abs(ev[0][0] - ev[1][0]) <= 1e-5 * ev[0][0])
        # the rank's flat buffers: the non-expert tensors and 2 of the 4 experts (ZeRO-3: every expert, said)
        want = n_all - n_exp // 2 if stage < 3 else None
        line = [x for x in r.stderr.splitlines() if "parameters on this rank:" in x]
        if stage < 3:
            check("EP 2 x ZeRO-%d: rank 0 holds %d parameters (experts: local 2 of 4), the whole model %d" %
                  (stage, want, n_all), len(line) == 1 and ("parameters on this rank: %d (experts: local 2 of 4 per block, "
                                                            "%d expert parameters; the whole model %d)" %
                                                            (want, n_exp // 2, n_all)) in line[0], r.stderr[-600:])
            print("      " + "\n      ".join(x for x in r.stderr.splitlines() if "ZeRO stage" in x))
        else:
            check("EP 2 x ZeRO-3: every expert on every rank, said with the reason", not line and
                  "expert parallelism keeps every expert on every rank (%d parameters per rank): ZeRO-3 with sliced "
                  "experts is not built" % n_all in r.stderr, r.stderr[-600:])
        if stage == 1:
            r = run([cllm, "plot", out])
            svg = open(os.path.join(out, "plot.svg")).read() if r.returncode == 0 else ""
            check("cllm plot: an expert-load panel with a line per expert", "expert load" in svg and
                  svg.count("<polyline") == 2 + 4 and "expert 3" in svg, r.stderr[-300:])
        if recs:
            check("EP 2: all-to-all bytes and time reported", all(x["a2a_bytes"] > 0 and x["expert_parallel_size"] == 2
                                                                  and x["time_a2a"] >= 0 for x in recs))
    common = adamw
    # bf16 matmuls: the same operands rounded on both layouts (losses, gradient norms within 1e-4)
    b1, b2 = os.path.join(tmp, "bf16-one"), os.path.join(tmp, "bf16-ep2")
    cb1 = write_config(os.path.join(tmp, "bf16-one.json"), {"moe": nodrop, "bf16": {"enabled": True}})
    cb2 = write_config(os.path.join(tmp, "bf16-ep2.json"), {"moe": dict(nodrop, expert_parallel_size=2),
                                                            "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
    r1 = run([cllm, "train", "--config", cb1, "--out", b1, "--batch-size", "4", "--grad-accum", "2"] + common)
    r2 = run([cllm, "train", "--config", cb2, "--out", b2, "--batch-size", "4"] + common, np=2)
    if check("bf16: both runs exit 0", r1.returncode == r2.returncode == 0, (r1.stderr + r2.stderr)[-600:]):
        a, b = records(b1), records(b2)
        worst = max(max(abs(x["loss"] - y["loss"]) / x["loss"], abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"])
                    for x, y in zip(a, b)) if len(a) == len(b) == 3 else float("inf")
        check("bf16: EP 2 losses and gradient norms within 1e-4 of one process (worst %.1e)" % worst, worst <= 1e-4)
    # the first step's all-to-all bytes against the routing of each rank's rows
    cfg = write_config(os.path.join(tmp, "ep2-bytes.json"), {"moe": dict(nodrop, expert_parallel_size=2)})
    out = os.path.join(tmp, "ep2-bytes")
    r = run([cllm, "train", "--config", cfg, "--out", out, "--batch-size", "4"] +
            [x for x in common if x != "--grad-ckpt"], np=2)
    if check("EP 2 without recomputation: exits 0", r.returncode == 0, r.stderr[-500:]):
        want = a2a_bytes(c, params, rows, 2, 2)
        got = records(out)[0]["a2a_bytes"]
        check("EP 2: step 1 sent %d all-to-all bytes, the routing of each rank's rows implies %d" % (got, want),
              got == want)
    if not big:
        return
    # 4 ranks: one micro-batch each, against one process accumulating 4
    one4 = os.path.join(tmp, "ep-one4")
    r = run([cllm, "train", "--config", cfg1, "--out", one4, "--batch-size", "8", "--grad-accum", "4"] + common)
    check("one process (4 micro-batches): exits 0", r.returncode == 0, r.stderr[-500:])
    for P, stage in ((2, 1), (2, 2), (4, 1)):
        cfg = write_config(os.path.join(tmp, "ep4-%d.json" % P),
                           {"moe": dict(nodrop, expert_parallel_size=P), "zero_optimization": {"stage": stage}})
        out = os.path.join(tmp, "ep4-%d-z%d" % (P, stage))
        r = run([cllm, "train", "--config", cfg, "--out", out, "--batch-size", "8"] + common, np=4)
        if check("4 ranks, expert_parallel_size %d, ZeRO-%d: exits 0" % (P, stage), r.returncode == 0, r.stderr[-800:]):
            compare(tmp, one4, out, "4 ranks x EP %d x ZeRO-%d" % (P, stage), 3)


def test_resume(cllm, tmp):
    d, data = setup_ep(tmp)[:2]
    common = ["--model", d, "--data", data, "--optimizer", "adamw", "--lr", "1e-2", "--batch-size", "4",
              "--micro-batch-size", "2", "--seq-len", "12", "--no-shuffle"]
    cfg = {(P, z): write_config(os.path.join(tmp, "res%d-z%d.json" % (P, z)),
                                {"moe": {"drop_tokens": False, "expert_parallel_size": P},
                                 "zero_optimization": {"stage": z}})
           for P in (1, 2) for z in (0, 1, 2)}
    straight = os.path.join(tmp, "res-straight")
    r = run([cllm, "train", "--config", cfg[2, 1], "--out", straight, "--steps", "4"] + common, np=2)
    if not check("resume: straight run exits 0", r.returncode == 0, r.stderr[-500:]):
        return
    # sliced experts write the whole model's checkpoint (every expert, gathered to rank 0) and cut theirs out of it
    # (b = 0: one process, accumulating both ranks' micro-batches)
    for a, b, za, zb in ((2, 1, 1, 1), (1, 2, 1, 1), (2, 1, 2, 0), (1, 2, 0, 2), (2, 0, 1, 0)):
        out = os.path.join(tmp, "res-%d-%d-z%d%d" % (a, b, za, zb))
        r1 = run([cllm, "train", "--config", cfg[a, za], "--out", out, "--steps", "2", "--save-interval", "2"] + common,
                 np=2)
        r2 = run([cllm, "train", "--config", cfg[max(b, 1), zb], "--out", out, "--steps", "4", "--resume", "auto"] +
                 common, np=2 if b else None)
        to = "EP %d on 2 ranks" % b if b else "one process"
        if not check("resume: EP %d (ZeRO-%d) -> %s (ZeRO-%d) runs exit 0" % (a, za, to, zb),
                     r1.returncode == r2.returncode == 0, (r1.stderr + r2.stderr)[-600:]):
            continue
        if a == 2:
            ck = hm.load_safetensors(os.path.join(out, "checkpoint-2", "model.safetensors"))
            check("resume: the EP 2 checkpoint holds all 4 experts of every block",
                  all("model.layers.%d.block_sparse_moe.experts.%d.w2.weight" % (l, e) in ck
                      for l in range(2) for e in range(4)), sorted(ck)[:8])
        w1 = hm.load_safetensors(os.path.join(straight, "model.safetensors"))
        w2 = hm.load_safetensors(os.path.join(out, "model.safetensors"))
        e = max(mx.rel_l2(w2[n], w1[n]) for n in w1)
        check("resume: checkpoint of EP %d (ZeRO-%d) at step 2 resumed with %s (ZeRO-%d) to step 4 within 1e-5 of "
              "the straight run (worst %.1e)" % (a, za, to, zb, e), e <= 1e-5)


def test_errors(cllm, tmp):
    d, data = setup_ep(tmp)[:2]
    common = ["--model", d, "--data", data, "--steps", "1", "--batch-size", "4", "--seq-len", "12"]
    cases = [
        (1, {"expert_parallel_size": 2}, "moe.expert_parallel_size 2 does not divide the 1 ranks"),
        (1, {"expert_parallel_size": 0}, "moe.expert_parallel_size: 0 is out of range"),
        (1, {"capacity_factor": -1}, "moe.capacity_factor: -1 is out of range"),
        (1, {"drop_tokens": "yes"}, "moe.drop_tokens: expected true or false"),
        (1, {"capacity_factor": 1, "moe_expert_capacity_factor": 2}, "moe.capacity_factor and "
         "moe.moe_expert_capacity_factor name the same setting"),
        (1, {"expert_paralel_size": 2}, "expert_paralel_size"),
        (2, {"expert_parallel_size": 4}, "moe.expert_parallel_size 4 does not divide the 2 ranks"),
    ]
    # LoRA with expert parallelism is refused by name
    lora = write_config(os.path.join(tmp, "lora.json"), {"moe": {"expert_parallel_size": 2}, "lora": {"r": 4}})
    r = run([cllm, "train", "--config", lora, "--out", os.path.join(tmp, "bad")] + common, np=2)
    check("error: expert parallelism with LoRA is refused by name",
          r.returncode != 0 and "moe.expert_parallel_size with LoRA: not supported" in r.stderr, r.stderr[-300:])
    for np_, moe, want in cases:
        cfg = write_config(os.path.join(tmp, "bad.json"), {"moe": moe})
        r = run([cllm, "train", "--config", cfg, "--strict", "--out", os.path.join(tmp, "bad")] + common,
                np=np_ if np_ > 1 else None)
        check("error: %s names it" % json.dumps(moe), r.returncode != 0 and want in r.stderr, r.stderr[-300:])
    # experts not divisible: 6 experts over 4
    c = mx.config(num_local_experts=6)
    d6 = os.path.join(tmp, "six")
    mx.write_model(d6, c, mx.init_params(c, seed=2, tie=None))
    cfg = write_config(os.path.join(tmp, "bad4.json"), {"moe": {"expert_parallel_size": 4}})
    r = run([cllm, "train", "--config", cfg, "--model", d6, "--data", data, "--steps", "1", "--batch-size", "4",
             "--seq-len", "12", "--out", os.path.join(tmp, "bad")], np=4)
    check("error: expert_parallel_size 4 of 6 experts names it",
          r.returncode != 0 and "moe.expert_parallel_size 4 does not divide the model's 6 experts" in r.stderr,
          r.stderr[-300:])


def test_estimate(cllm, tmp):
    """cllm estimate: the parameter count and the active parameters per token
    from the tensor shapes; the expert-parallel rows at the capacity bound
    (F = 1.25: N*k*F rows per block plus one per expert) and in the worst case
    (P*N*k); the sizes that do not divide named."""
    c = mx.config(num_local_experts=4)
    d = os.path.join(tmp, "est-model")
    mx.write_model(d, c, mx.init_params(c, seed=1, tie=None))
    shp = mx.shapes(c)
    n = sum(math.prod(v) for v in shp.values())
    expert = sum(math.prod(v) for k, v in shp.items() if ".experts." in k)
    E, k, C, Fw, L = 4, 2, c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    B, T = 2, 12

    def est(*extra):
        r = run([cllm, "estimate", "--model", d, "--micro-batch", str(B), "--seq-len", str(T), "--json"] + list(extra))
        return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr}
    e = est()
    check("estimate: %d parameters, %d active per token (k/E of the experts)" % (e.get("n_params", -1),
          e.get("active_params", -1)), e.get("n_params") == n and e.get("active_params") == n - expert * (E - k) // E)

    def rows_bytes(r):
        return (L * r * (C + 3 * Fw) + r * (3 * C + 3 * Fw)) * 4
    w = est("--dp", "2", "--expert-parallel", "2")
    b = est("--dp", "2", "--expert-parallel", "2", "--capacity-factor", "1.25")
    check("estimate: expert-parallel rows, worst case %s and at capacity factor 1.25 %s" %
          (w.get("expert_buffers"), b.get("expert_buffers")),
          w.get("expert_buffers") == rows_bytes(2 * B * T * k + E) and
          b.get("expert_buffers") == rows_bytes(int(B * T * k * 1.25) + E) and
          w.get("total", 0) - e.get("total", 0) == w.get("expert_buffers", 0) -
          sum(e.get(x, 0) - w.get(x, 0) for x in ("params", "grads", "optim", "precision", "snapshot")))
    # each rank holds the non-expert tensors and E/P experts: parameters, gradients and (ZeRO-1 over the dp/P
    # ranks holding the same experts) AdamW's two states; what `cllm train` reports holding
    def shard(n, dp):
        s_ = (n + dp - 1) // dp
        return min(n, (s_ + 15) // 16 * 16)
    mine = n - expert // 2
    for dp, zs in ((2, 0), (2, 1), (4, 1), (4, 2)):
        x = est("--dp", str(dp), "--expert-parallel", "2", "--zero-stage", str(zs))
        dz = shard(mine, dp // 2) if zs >= 1 else mine
        check("estimate: dp %d, expert-parallel 2, ZeRO-%d: %s parameters per rank (want %d), params %s grads %s optim "
              "%s bytes" % (dp, zs, x.get("rank_params"), mine, x.get("params"), x.get("grads"), x.get("optim")),
              x.get("rank_params") == mine and x.get("params") == 4 * mine and
              x.get("grads") == 4 * (dz if zs >= 2 else mine) and x.get("optim") == 2 * 4 * dz)
    x = est("--dp", "2", "--expert-parallel", "2", "--zero-stage", "3")
    check("estimate: ZeRO-3 keeps every expert (%s parameters per rank)" % x.get("rank_params"), x.get("rank_params") == n)
    r = run([cllm, "estimate", "--model", d, "--seq-len", "12", "--dp", "3", "--expert-parallel", "2"])
    check("estimate: --expert-parallel 2 over --dp 3 names it", r.returncode != 0 and
          "expert parallelism 2 does not divide the 3 data-parallel ranks" in r.stderr, r.stderr[-300:])
    r = run([cllm, "estimate", "--model", d, "--seq-len", "12", "--dp", "3", "--expert-parallel", "3"])
    check("estimate: --expert-parallel 3 of 4 experts names it", r.returncode != 0 and
          "expert parallelism 3 does not divide the model's 4 experts" in r.stderr, r.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", help="unused (the ctest wrapper passes it)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-4", action="store_true", help="skip the 4-rank runs")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cllm-moe-ep-")
    try:
        test_capacity(a.cllm, tmp)
        test_estimate(a.cllm, tmp)
        if shutil.which("mpirun"):
            test_expert_parallel(a.cllm, tmp, not a.no_4)
            test_resume(a.cllm, tmp)
        else:
            print("skip  expert parallelism: no mpirun")
        test_errors(a.cllm, tmp)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        print("FAILED %d" % FAILED if FAILED else "all passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
