#!/usr/bin/env python3
"""Tests of `cllm train` (label: train): config parsing and resolution,
learning-rate schedules against DeepSpeed's published formulas (written out
here independently), gradient accumulation, clipping, non-finite steps,
checkpoints (contents, rotation, CRC-32 checked with zlib, corruption),
bit-identical resume, SIGTERM, evaluation records and the SVG plot.

Usage: trainer_test.py --cllm BIN --build DIR --case NAME
Every case uses a tiny llama (cllm init --preset tiny) and generated
pre-tokenized JSONL with SFT-like labels (a different number of -100 per
sample)."""
import argparse, json, math, os, random, shutil, signal, struct, subprocess, sys, tempfile, time, zlib

import numpy as np

import signal_util  # tests/

FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


class Env:
    def __init__(self, cllm, build, name):
        self.cllm = cllm
        self.dir = tempfile.mkdtemp(prefix=f"train_{name}_", dir=build)
        self.model = os.path.join(self.dir, "init")
        self.run_ok("init", "--arch", "llama", "--preset", "tiny", "--out", self.model, "--seed", "3")
        self.data = self.write_data("train.jsonl", 40, seed=1)
        self.eval_data = self.write_data("eval.jsonl", 10, seed=2)

    def write_data(self, name, n, seed):
        r = random.Random(seed)
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            for _ in range(n):
                k = r.randint(6, 30)
                ids = [r.randrange(3, 500) for _ in range(k)]
                prompt = r.randint(0, k - 2)
                labels = [-100] * prompt + ids[prompt:]
                f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
        return path

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run(self, *args, env=None, check_rc=None):
        e = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
        if env:
            e.update(env)
        p = subprocess.run([self.cllm, *args], capture_output=True, text=True, env=e, timeout=120)
        if check_rc is not None and p.returncode != check_rc:
            print(p.stdout, p.stderr, file=sys.stderr)
        return p

    def run_ok(self, *args, **kw):
        p = self.run(*args, **kw, check_rc=0)
        if p.returncode != 0:
            raise SystemExit(f"cllm {' '.join(args)} failed ({p.returncode})")
        return p

    def config(self, name, obj):
        path = self.path(name)
        with open(path, "w") as f:
            json.dump(obj, f)
        return path

    def base(self, out, **kw):
        c = {"model": self.model, "data": {"train": self.data, "seq_len": 32}, "output_dir": self.path(out),
             "train_micro_batch_size_per_gpu": 4, "train_iters": 6, "log": "plain", "peak_gflops": 1.0,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
        c.update(kw)
        return c


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def tensors(path):
    """safetensors -> {name: np.float32 array} (F32 only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=np.float32).reshape(v["shape"])
    return out


def print_config(env, cfg, *flags, rc=0):
    p = env.run("train", "--config", env.config("c.json", cfg), "--print-config", *flags)
    if rc == 0 and p.returncode == 0:
        return json.loads(p.stdout), p
    return None, p


# ------------------------------------------------------------------ cases

def case_config(env):
    cfg, p = print_config(env, {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "train_iters": 5,
                                "optimizer": {"type": "Adam", "params": {"lr": 0.1}}})
    check(cfg is not None, f"print-config failed: {p.stderr}")
    check(cfg["gradient_accumulation_steps"] == 4, "gas = 16 / 4 / 1")
    check(cfg["optimizer"]["type"] == "AdamW", "DeepSpeed Adam with adam_w_mode default true is AdamW")
    check(cfg["optimizer"]["params"]["weight_decay"] == 0.0, "DeepSpeed weight_decay default 0")
    check(cfg["optimizer"]["params"]["betas"] == [0.9, 0.999], "betas default")
    check(cfg["optimizer"]["params"]["eps"] == 1e-8, "eps default")
    check(cfg["steps_per_print"] == 10, "steps_per_print default 10")
    check(cfg["gradient_clipping"] == 0.0, "gradient_clipping default 0")
    check(cfg["zero_optimization"]["stage"] == 0, "zero stage default 0")
    check(cfg["fp16"]["enabled"] is False and cfg["fp16"]["initial_scale_power"] == 16, "fp16 defaults")
    check(cfg["scheduler"]["type"] == "constant", "no scheduler = constant")
    check(cfg["weight_decay_skip"] == ["bias", "norm"], "no-decay default")
    # a block of the wrong type is the file's error naming the key, even
    # where flags would write into it (it used to be replaced by AdamW)
    for bad, key in (({"optimizer": 5}, "optimizer"), ({"optimizer": {"params": [1]}}, "optimizer.params"),
                     ({"data": 7}, "data")):
        cfg, p = print_config(env, dict(bad, train_batch_size=4, train_iters=5), "--lr", "0.1", rc=2)
        check(p.returncode == 2 and f"{key}: expected an object" in p.stderr, f"{bad}: {p.stderr}")
    # Adam with adam_w_mode false is L2-coupled Adam
    cfg, p = print_config(env, {"train_batch_size": 4, "train_iters": 5,
                                "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}})
    check(cfg and cfg["optimizer"]["type"] == "Adam", "adam_w_mode false keeps Adam")
    # "auto" resolution
    cfg, p = print_config(env, {"train_batch_size": 12, "train_micro_batch_size_per_gpu": "auto",
                                "gradient_accumulation_steps": 3, "train_iters": 5,
                                "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
                                "optimizer": {"type": "AdamW", "params": {"lr": 0.25}}})
    check(cfg and cfg["train_micro_batch_size_per_gpu"] == 4, f"auto micro batch: {p.stderr}")
    check(cfg and cfg["scheduler"]["params"]["warmup_max_lr"] == 0.25, "auto warmup_max_lr = optimizer lr")
    cfg, p = print_config(env, {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5, "train_iters": 5})
    check(cfg and cfg["train_batch_size"] == 15, "train_batch_size = micro * gas * dp")
    # inconsistent triple: the arithmetic is in the message
    _, p = print_config(env, {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2, "train_iters": 5}, rc=2)
    check(p.returncode == 2, "inconsistent batch sizes exit 2")
    check("train_batch_size (16) must equal train_micro_batch_size_per_gpu (4) * gradient_accumulation_steps (2)"
          " * data-parallel size (1) = 8" in p.stderr, f"arithmetic in message: {p.stderr}")
    _, p = print_config(env, {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "train_iters": 5}, rc=2)
    check(p.returncode == 2 and "not divisible" in p.stderr, f"indivisible: {p.stderr}")
    # unknown keys: warning, or error with --strict
    c = {"train_batch_size": 4, "train_iters": 5, "foo": 1, "optimizer": {"type": "AdamW", "params": {"lrr": 1}}}
    cfg, p = print_config(env, c)
    check(cfg is not None and "unknown key 'foo'" in p.stderr and "optimizer.params.lrr" in p.stderr,
          f"unknown keys warned: {p.stderr}")
    _, p = print_config(env, c, "--strict", rc=2)
    check(p.returncode == 2 and "unknown key 'foo'" in p.stderr, f"--strict rejects: {p.stderr}")
    _, p = print_config(env, {"train_batch_size": 4, "train_iters": 5, "gradient_clipping": "x"}, rc=2)
    check(p.returncode == 2 and "gradient_clipping" in p.stderr, "wrong type names the key")
    # a wrong type or value at a nested key names the full key path and the value
    base = {"train_batch_size": 4, "train_iters": 5}
    for extra, want in [
        ({"zero_optimization": {"offload_param": {"device": 5}}},
         'zero_optimization.offload_param.device: expected "cpu", "nvme" or "none", got 5'),
        ({"zero_optimization": {"offload_optimizer": {"device": "disk"}}},
         'zero_optimization.offload_optimizer.device: expected "cpu", "nvme" or "none", got "disk"'),
        ({"zero_optimization": {"reduce_bucket_size": "big"}},
         'zero_optimization.reduce_bucket_size: expected a number of elements, got "big"'),
        ({"zero_optimization": {"allgather_bucket_size": 0}}, "zero_optimization.allgather_bucket_size: 0 (expected"),
        ({"zero_optimization": {"stage3_param_persistence_threshold": -1}},
         "zero_optimization.stage3_param_persistence_threshold: -1 (expected"),
        ({"zero_optimization": {"overlap_comm": 1}}, "zero_optimization.overlap_comm: expected true or false, got 1"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "buffer_count": "x"}}},
         'zero_optimization.offload_optimizer.buffer_count: expected an integer, got "x"'),
        ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
         "zero_optimization.offload_optimizer.nvme_path: required"),
        ({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 2}}},
         "zero_optimization.offload_optimizer.buffer_count: 2 (expected 3 to 64"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": 7}}},
         "zero_optimization.offload_param.nvme_path: expected a string, got 7"),
        ({"zero_optimization": {"offload_param": []}}, "zero_optimization.offload_param: expected an object, got []"),
        ({"optimizer": {"type": "SGD", "params": 3}}, "optimizer.params: expected an object, got 3"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1.5}}},
         "scheduler.params.warmup_num_steps: expected an integer, got 1.5"),
        ({"fp16": {"enabled": "yes"}}, 'fp16.enabled: expected true or false, got "yes"'),
        ({"activation_checkpointing": {"cpu_checkpointing": 1}},
         "activation_checkpointing.cpu_checkpointing: expected true or false, got 1"),
        ({"model": {"arch": "llama", "preset": "tiny", "set": 1}}, "model.set: expected an object, got 1"),
        ({"model": {"arch": "gpt3", "preset": "tiny"}}, "model.arch: unknown architecture 'gpt3'"),
        ({"data": {"seq_len": 1}}, "data.seq_len: 1 is out of range (minimum 2)"),
        ({"model_topo": {"process_topology": {"axis": ["pipe", "data"], "dims": [0, 2]}}},
         "model_topo.process_topology.dims[0] (pipe): expected a positive integer"),
        ({"model_topo": {"parts": [1, "x"]}}, "model_topo.parts[1]: expected a positive number of blocks"),
        ({"model_topo": {"schedule": "zigzag"}}, 'model_topo.schedule: expected "gpipe" or "1f1b", got "zigzag"'),
    ]:
        _, p = print_config(env, {**base, **extra}, rc=2)
        check(p.returncode == 2 and "c.json: " + want in p.stderr, f"{extra}: want '{want}': {p.stderr}")
    # an unknown nested key is named by its path: a warning, or an error with --strict
    c = {**base, "zero_optimization": {"offload_param": {"device": "cpu", "nvme_pth": "/x"}}}
    cfg, p = print_config(env, c)
    check(cfg is not None and "unknown key 'zero_optimization.offload_param.nvme_pth' ignored" in p.stderr,
          f"nested unknown key warned: {p.stderr}")
    _, p = print_config(env, c, "--strict", rc=2)
    check(p.returncode == 2 and "unknown key 'zero_optimization.offload_param.nvme_pth'" in p.stderr,
          f"nested unknown key rejected with --strict: {p.stderr}")
    # the zero_optimization block as the run uses it, DeepSpeed's defaults filled in; "auto" sizes keep them
    cfg, p = print_config(env, {**base, "zero_optimization": {
        "stage": 2, "reduce_bucket_size": "auto", "allgather_bucket_size": 3e3, "overlap_comm": True,
        "stage3_prefetch_bucket_size": "auto", "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp",
                                                                     "buffer_size": 1024}}})
    check(cfg is not None, f"zero block: {p.stderr}")
    if cfg:
        z = cfg["zero_optimization"]
        check(z["stage"] == 2 and z["reduce_bucket_size"] == 500000000 and z["allgather_bucket_size"] == 3000
              and z["overlap_comm"] is True and z["stage3_prefetch_bucket_size"] == 5e7
              and z["stage3_param_persistence_threshold"] == 1e5, f"zero sizes: {z}")
        check(z["offload_optimizer"] == {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 4, "buffer_size": 1024}
              and z["offload_param"]["device"] == "none", f"offload blocks: {z}")
    cfg, p = print_config(env, {**base, "model_topo": {"process_topology": {"axis": ["model", "data"], "dims": [2, -1]},
                                                       "schedule": "gpipe"}})
    check(cfg is not None and cfg["model_topo"] == {"process_topology": {"axis": ["tensor", "data"], "dims": [2, "auto"]},
                                                    "parts": "parameters", "schedule": "gpipe"},
          f"model_topo as read: {cfg and cfg['model_topo']} {p.stderr}")
    # an integer written as a real beyond a long is out of range (it used to be converted first: UB)
    _, p = print_config(env, {"train_batch_size": 4, "train_iters": 9.3e19}, rc=2)
    check(p.returncode == 2 and "train_iters" in p.stderr and "out of range" in p.stderr, f"9.3e19: {p.stderr}")
    cfg, p = print_config(env, {"train_batch_size": 4, "train_iters": 1e3})
    check(cfg and cfg["train_iters"] == 1000, f"1e3 is the integer 1000: {p.stderr}")
    # epochs worth more steps than a long holds: refused once the data size is known
    p = env.run("train", "--config", env.config("e.json", {"train_batch_size": 4, "epochs": 1e300}),
                "--model", env.model, "--data", env.data, "--out", env.path("epochs"), "--seq-len", "16")
    check(p.returncode != 0 and "too many (lower epochs)" in p.stderr, f"epochs 1e300: {p.returncode} {p.stderr}")
    # flags override the file
    cfg, p = print_config(env, {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 4, "train_iters": 5, "seed": 1,
                                "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}},
                          "--lr", "0.5", "--batch-size", "32", "--steps", "77", "--seed", "9", "--seq-len", "64",
                          "--no-shuffle", "--save-interval", "3", "--eval-interval", "4", "--out", "/tmp/x")
    check(cfg is not None, f"overrides: {p.stderr}")
    if cfg:
        check(cfg["optimizer"]["params"]["lr"] == 0.5, "--lr overrides")
        check(cfg["train_batch_size"] == 32 and cfg["gradient_accumulation_steps"] == 8, "--batch-size keeps micro")
        check(cfg["train_iters"] == 77 and cfg["seed"] == 9 and cfg["data"]["seq_len"] == 64, "--steps/--seed/--seq-len")
        check(cfg["shuffle"] is False and cfg["save_interval"] == 3 and cfg["eval_interval"] == 4, "flags")
        check(cfg["output_dir"] == "/tmp/x", "--out")
    # every example config parses strictly
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "configs")
    for name in sorted(os.listdir(ex)):
        p = env.run("train", "--config", os.path.join(ex, name), "--print-config", "--strict")
        check(p.returncode == 0, f"example {name}: {p.stderr}")
        if name.startswith("seed003") and p.returncode == 0:
            cfg = json.loads(p.stdout)
            check(cfg["use_grad_ckpt"] is True and cfg["model_topo"]["parts"] == [1, 5, 5, 5, 5, 5, 5, 1],
                  "seed-003 keys stored")
            check(cfg["zero_optimization"]["stage"] == 1, "zero stage stored")
    # minimal-loop flags still work and write the old metrics fields
    p = env.run("train", "--model", env.model, "--data", env.data, "--out", env.path("mini"), "--steps", "3",
                "--batch-size", "4", "--seq-len", "32", "--optimizer", "sgd", "--lr", "0.05", "--peak-gflops", "1")
    check(p.returncode == 0, f"minimal loop: {p.stderr}")
    m = metrics(env.path("mini", "metrics.jsonl"))
    check([r["step"] for r in m] == [1, 2, 3], "one record per step")
    for k in ["step", "loss", "lr", "grad_norm", "tokens", "step_time", "tokens_per_sec", "mfu", "time_data",
              "time_fwdbwd", "time_optim", "time_save"]:
        check(k in m[0], f"metrics field {k}")
    check(all(r["lr"] == 0.05 for r in m), "constant lr")
    check(os.path.exists(env.path("mini", "model.safetensors")), "final model")
    p = env.run("train", "--model", env.model, "--data", env.data, "--out", env.path("mini2"))
    check(p.returncode == 2, "minimal loop needs --steps")
    cfg, p = print_config(env, {"train_batch_size": 4, "train_iters": 2}, "--lr", "0.02")
    check(cfg and cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["lr"] == 0.02,
          f"--lr alone keeps the default AdamW: {p.stderr}")
    p = env.run("train", "--model", env.model, "--data", env.data, "--out", env.path("mini3"), "--steps", "2",
                "--lr", "0.02", "--batch-size", "2", "--seq-len", "16", "--peak-gflops", "1")
    check(p.returncode == 0 and "adamw" in p.stderr, f"minimal loop with --lr only: {p.stderr}")


# DeepSpeed's formulas, transcribed from its documentation/source semantics;
# `it` is last_batch_iteration (update s uses it = s - 1).
def ds_warmup_gamma(it, n, typ):
    n = max(2, n)
    if it < n:
        return math.log(it + 1) / math.log(n) if typ == "log" else it / n
    return None


def expected_lr(typ, p, base, it):
    if typ == "WarmupLR":
        g = ds_warmup_gamma(it, p.get("warmup_num_steps", 1000), p.get("warmup_type", "log"))
        g = 1.0 if g is None else g
        return p.get("warmup_min_lr", 0) + (p.get("warmup_max_lr", 0.001) - p.get("warmup_min_lr", 0)) * g
    if typ == "WarmupDecayLR":
        n = max(2, p.get("warmup_num_steps", 1000))
        g = ds_warmup_gamma(it, n, p.get("warmup_type", "log"))
        if g is None:
            T = p["total_num_steps"]
            g = max(0.0, (T - it) / max(1.0, T - n))
        return p.get("warmup_min_lr", 0) + (p.get("warmup_max_lr", 0.001) - p.get("warmup_min_lr", 0)) * g
    if typ == "WarmupCosineLR":
        n = max(2, p.get("warmup_num_steps", 1000))
        wmin, cmin = p.get("warmup_min_ratio", 0.0), p.get("cos_min_ratio", 0.0001)
        if it < n:
            g = ds_warmup_gamma(it, n, p.get("warmup_type", "log"))
            return base * (wmin + (1 - wmin) * g)
        T = p["total_num_steps"]
        r = (1 + math.cos(math.pi * (it - n + 1) / (T - n))) / 2
        return base * max(0.0, cmin + (1 - cmin) * r)
    if typ == "OneCycle":
        s1 = float(p.get("cycle_first_step_size", 2000))
        s2 = float(p.get("cycle_second_step_size", s1))
        total, ratio = s1 + s2, s1 / (s1 + s2)
        lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
        if it < total:
            b = it + 1
            cyc = math.floor(1 + b / total)
            x = 1.0 + b / total - cyc
            sf = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
            return lo + (hi - lo) * sf
        if p.get("decay_step_size", 0) == 0 or p.get("decay_lr_rate", 0) == 0:
            return lo
        return lo / (1 + p["decay_lr_rate"] * ((it - total + 1) / p["decay_step_size"]))
    if typ == "linear":
        w, T = p.get("warmup_num_steps", 0), p["total_num_steps"]
        if it < w:
            return base * it / max(1, w)
        return base * max(0.0, (T - it) / max(1, T - w))
    if typ == "cosine":
        w, T = p.get("warmup_num_steps", 0), p["total_num_steps"]
        if it < w:
            return base * it / max(1, w)
        prog = (it - w) / max(1, T - w)
        return base * max(0.0, 0.5 * (1 + math.cos(math.pi * prog)))
    return base


def case_schedules(env):
    steps = 14
    scheds = [
        ("WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-2, "warmup_num_steps": 5}),
        ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 6, "warmup_type": "linear"}),
        ("WarmupLR", {"warmup_max_lr": 2e-3, "warmup_num_steps": 1}),
        ("WarmupDecayLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-2, "warmup_num_steps": 4, "total_num_steps": 12}),
        ("WarmupCosineLR", {"total_num_steps": 12, "warmup_num_steps": 4, "warmup_min_ratio": 0.1,
                            "cos_min_ratio": 0.05, "warmup_type": "linear"}),
        ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 5}),
        ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 4,
                      "cycle_second_step_size": 3, "decay_lr_rate": 0.5, "decay_step_size": 2,
                      "cycle_first_stair_count": 2}),
        ("OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 5e-3, "cycle_first_step_size": 3}),
        ("linear", {"warmup_num_steps": 3, "total_num_steps": 12}),
        ("cosine", {"warmup_num_steps": 4}),
        ("constant", {}),
        # "auto" (HF placeholders): the peak is the optimizer's lr, warmup_num_steps 0, total the run's steps
        ("WarmupLR", {"warmup_max_lr": "auto", "warmup_num_steps": 5}),
        ("WarmupDecayLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                           "total_num_steps": "auto"}),
        ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": "auto", "cycle_first_step_size": 3}),
    ]
    base = 3e-3
    auto = {"warmup_max_lr": base, "cycle_max_lr": base, "warmup_num_steps": 0, "total_num_steps": steps}
    for i, (typ, params) in enumerate(scheds):
        out = f"s{i}"
        cfg = env.base(out, train_iters=steps, scheduler={"type": typ, "params": params},
                       optimizer={"type": "SGD", "params": {"lr": base}}, log="quiet")
        p = env.run("train", "--config", env.config(f"s{i}.json", cfg))
        check(p.returncode == 0, f"{typ}: {p.stderr}")
        if p.returncode:
            continue
        pp = {k: auto[k] if v == "auto" else v for k, v in params.items()}
        pp.setdefault("total_num_steps", steps)
        got = [r["lr"] for r in metrics(env.path(out, "metrics.jsonl"))]
        want = [expected_lr(typ, pp, base, s - 1) for s in range(1, steps + 1)]
        ok = len(got) == steps and all(abs(a - b) <= 1e-8 * max(abs(b), 1e-12) + 1e-15 for a, b in zip(got, want))
        check(ok, f"{typ} {params}: got {got} want {want}")


def case_accum(env):
    outs = {}
    for name, mb, ga in [("k4", 2, 4), ("k1", 8, 1)]:
        cfg = env.base(name, train_micro_batch_size_per_gpu=mb, gradient_accumulation_steps=ga, train_iters=3,
                       shuffle=True, optimizer={"type": "SGD", "params": {"lr": 0.5}})
        p = env.run("train", "--config", env.config(name + ".json", cfg))
        check(p.returncode == 0, f"accum {name}: {p.stderr}")
        outs[name] = tensors(env.path(name, "model.safetensors"))
    m4, m1 = metrics(env.path("k4", "metrics.jsonl")), metrics(env.path("k1", "metrics.jsonl"))
    check([r["tokens"] for r in m4] == [r["tokens"] for r in m1], "same counted targets per step")
    check(all(abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]) for a, b in zip(m4, m1)), "same losses")
    worst = max(float(np.max(np.abs(outs["k4"][k] - outs["k1"][k]))) for k in outs["k1"])
    check(worst <= 1e-6, f"k=4 x B=2 vs k=1 x B=8 weights differ by {worst}")
    init = tensors(os.path.join(env.model, "model.safetensors"))
    moved = max(float(np.max(np.abs(outs["k1"][k] - init[k]))) for k in init)
    check(moved > 1e-4, "training moved the weights")


def case_clip(env):
    res = {}
    for name, clip in [("noclip", 0.0), ("clip", 0.05)]:
        cfg = env.base(name, train_iters=1, gradient_clipping=clip, optimizer={"type": "SGD", "params": {"lr": 0.1}})
        p = env.run("train", "--config", env.config(name + ".json", cfg))
        check(p.returncode == 0, f"{name}: {p.stderr}")
        res[name] = tensors(env.path(name, "model.safetensors"))
    init = tensors(os.path.join(env.model, "model.safetensors"))
    norm = metrics(env.path("clip", "metrics.jsonl"))[0]["grad_norm"]
    check(norm > 0.05, "gradient norm above the clip value")
    coef = 0.05 / (norm + 1e-6)
    for k in init:
        d_clip = res["clip"][k].astype(np.float64) - init[k]
        d_full = res["noclip"][k].astype(np.float64) - init[k]
        err = np.max(np.abs(d_clip - coef * d_full))
        check(err <= 1e-6 + 1e-3 * np.max(np.abs(d_clip)), f"{k}: clipped update is not coef * update ({err})")


def case_nonfinite(env):
    cfg = env.base("nf", train_iters=6, optimizer={"type": "SGD", "params": {"lr": 0.01}},
                   scheduler={"type": "linear", "params": {"warmup_num_steps": 2}})
    p = env.run("train", "--config", env.config("nf.json", cfg), env={"CLLM_TRAIN_POISON_STEPS": "3,4"})
    check(p.returncode == 0, f"transient non-finite steps are skipped: {p.stderr}")
    m = metrics(env.path("nf", "metrics.jsonl"))
    check([r.get("skipped", False) for r in m] == [False, False, True, True, False, False], "steps 3,4 skipped")
    check(m[2]["loss"] is not None and m[2]["grad_norm"] is None, "skipped records: loss kept, grad_norm null")
    check("update skipped" in p.stderr, "skip reported")
    # the schedule does not advance on skipped steps (DeepSpeed semantics)
    check(m[4]["lr"] == m[2]["lr"], f"lr at step 5 equals step 3's: {m[4]['lr']} {m[2]['lr']}")
    cfg["max_consecutive_skips"] = 2
    p = env.run("train", "--config", env.config("nf2.json", cfg), env={"CLLM_TRAIN_POISON_STEPS": "2,3"})
    check(p.returncode == 1 and "2 consecutive steps with non-finite" in p.stderr, f"stop after N: {p.stderr}")
    # a diverging run (absurd lr) stops with a clear message
    cfg = env.base("nf3", train_iters=20, max_consecutive_skips=3, optimizer={"type": "SGD", "params": {"lr": 1e30}})
    p = env.run("train", "--config", env.config("nf3.json", cfg))
    check(p.returncode == 1 and "diverged" in p.stderr, f"absurd lr stops: {p.stderr}")


def manifest_ok(d):
    with open(os.path.join(d, "manifest.json")) as f:
        man = json.load(f)
    for e in man["files"]:
        with open(os.path.join(d, e["name"]), "rb") as f:
            b = f.read()
        if len(b) != e["bytes"] or "%08x" % zlib.crc32(b) != e["crc32"]:
            return False
    return True


def case_checkpoint(env):
    cfg = env.base("ck", train_iters=7, save_interval=2, save_total_limit=2)
    p = env.run("train", "--config", env.config("ck.json", cfg))
    check(p.returncode == 0, f"run: {p.stderr}")
    names = sorted(n for n in os.listdir(env.path("ck")) if n.startswith("checkpoint-"))
    check(names == ["checkpoint-6", "checkpoint-7"], f"rotation keeps the newest 2 (final included): {names}")
    check(not any(n.startswith(".") for n in os.listdir(env.path("ck"))), "no temporary folders left")
    with open(env.path("ck", "latest")) as f:
        check(f.read().strip() == "checkpoint-7", "latest points at the newest")
    d = env.path("ck", "checkpoint-7")
    for f in ["config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json", "manifest.json"]:
        check(os.path.exists(os.path.join(d, f)), f"checkpoint has {f}")
    check(manifest_ok(d), "manifest sizes and CRC-32 match zlib")
    with open(os.path.join(d, "trainer_state.json")) as f:
        st = json.load(f)
    check(st["global_step"] == 7 and st["optimizer_step"] == 7 and st["scheduler_iteration"] == 7, "step counts")
    check(int(st["next_sample"], 16) == 28, "data position = 7 steps x 4 samples")
    check(st["optimizer"] == "adamw" and len(st["rng"]) == 4 and st["loss_scale"] == 1.0, "state fields")
    opt = tensors(os.path.join(d, "optimizer.safetensors"))
    check(set(opt) == {"state0", "state1"} and float(np.abs(opt["state1"]).sum()) > 0, "Adam moments saved")
    # the final model equals the checkpoint's model; a checkpoint evaluates
    check(open(os.path.join(d, "model.safetensors"), "rb").read() ==
          open(env.path("ck", "model.safetensors"), "rb").read(), "final model = last checkpoint")
    p = env.run("eval", "--model", d, "--data", env.eval_data, "--seq-len", "32", "--batch-size", "4")
    check(p.returncode == 0 and "ppl" in p.stdout, f"cllm eval on a checkpoint: {p.stderr}")
    # corruption: flip one byte, resume and eval refuse naming the file
    bad = env.path("ck_bad")
    shutil.copytree(env.path("ck"), bad)
    f = os.path.join(bad, "checkpoint-7", "model.safetensors")
    b = bytearray(open(f, "rb").read())
    b[len(b) // 2] ^= 0x40
    open(f, "wb").write(bytes(b))
    cfg2 = env.base("ck_bad", train_iters=9, save_interval=2)
    p = env.run("train", "--config", env.config("ckb.json", cfg2), "--resume", "auto")
    check(p.returncode == 1 and "model.safetensors" in p.stderr and "corrupted" in p.stderr,
          f"corrupted checkpoint refused: {p.stderr}")
    os.remove(os.path.join(bad, "config.json"))
    p = env.run("eval", "--model", bad, "--data", env.eval_data, "--seq-len", "32")
    check(p.returncode == 1 and "corrupted" in p.stderr, f"eval refuses it too: {p.stderr}")
    # what a save killed half-way leaves (a checkpoint folder being
    # assembled, the `latest` temporary of a process that is gone) is
    # removed at the next start; a live process's temporary is kept
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.makedirs(env.path("ck", ".checkpoint-9.tmp"))
    open(env.path("ck", ".checkpoint-9.tmp", "model.safetensors"), "wb").write(b"partial")
    open(env.path("ck", f"latest.tmp.{dead.pid}"), "w").write("checkpoint-9\n")
    open(env.path("ck", f"model.safetensors.tmp.{os.getpid()}"), "w").write("in use")
    cfg_again = env.base("ck", train_iters=8, save_interval=2, save_total_limit=2)
    p = env.run("train", "--config", env.config("ck2.json", cfg_again), "--resume", "auto")
    left = sorted(os.listdir(env.path("ck")))
    check(p.returncode == 0 and ".checkpoint-9.tmp" not in left and f"latest.tmp.{dead.pid}" not in left,
          f"stale temporaries removed at start: {left} {p.stderr[-300:]}")
    check(f"model.safetensors.tmp.{os.getpid()}" in left, "a live process's temporary is kept")
    os.remove(env.path("ck", f"model.safetensors.tmp.{os.getpid()}"))
    with open(env.path("ck", "latest")) as f:
        check(f.read().strip() == "checkpoint-8", "the resumed run saved and moved latest")


def resume_cfg(env, out, steps):
    return env.base(out, train_iters=steps, save_interval=3, gradient_accumulation_steps=2,
                    train_micro_batch_size_per_gpu=2, gradient_clipping=1.0,
                    scheduler={"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3, "total_num_steps": 40}},
                    optimizer={"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}})


def losses(run):
    return [(r["step"], r["loss"]) for r in metrics(os.path.join(run, "metrics.jsonl")) if "loss" in r]


def case_resume(env):
    N = 6
    p = env.run("train", "--config", env.config("a.json", resume_cfg(env, "straight", 2 * N)))
    check(p.returncode == 0, f"straight: {p.stderr}")
    p = env.run("train", "--config", env.config("b.json", resume_cfg(env, "resumed", N)))
    check(p.returncode == 0, f"first half: {p.stderr}")
    p = env.run("train", "--config", env.config("b.json", resume_cfg(env, "resumed", N)), "--resume", "auto",
                "--steps", str(2 * N))
    check(p.returncode == 0 and "(resumed)" in p.stderr, f"second half: {p.stderr}")
    a = open(env.path("straight", "model.safetensors"), "rb").read()
    b = open(env.path("resumed", "model.safetensors"), "rb").read()
    check(a == b, "straight and resumed final weights are bit-identical")
    check(losses(env.path("straight")) == losses(env.path("resumed")), "identical loss sequences")
    sa = [r["samples"] for r in metrics(env.path("straight", "metrics.jsonl"))]
    sb = [r["samples"] for r in metrics(env.path("resumed", "metrics.jsonl"))]
    check(sa == sb, "same data positions")
    # a killed run (SIGKILL mid-training, after some checkpoints) resumes to
    # the same result as a straight run
    cfg = resume_cfg(env, "killed", 100000)
    cfg["save_interval"] = 2
    cfg["save_total_limit"] = 2
    path = env.config("k.json", cfg)
    proc = subprocess.Popen([env.cllm, "train", "--config", path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="2"))
    latest = env.path("killed", "latest")
    t0 = time.time()
    while time.time() - t0 < 60 and not (os.path.exists(latest) and open(latest).read().strip() >= "checkpoint-4"):
        time.sleep(0.05)
    time.sleep(0.1)
    proc.kill()
    proc.wait()
    step = int(open(latest).read().strip().split("-")[1])
    target = step + 3
    p = env.run("train", "--config", path, "--resume", "auto", "--steps", str(target))
    check(p.returncode == 0, f"resume after kill: {p.stderr}")
    p = env.run("train", "--config", env.config("k2.json", resume_cfg(env, "killed_ref", target)),
                "--save-interval", "2")
    check(p.returncode == 0, f"reference: {p.stderr}")
    check(open(env.path("killed", "model.safetensors"), "rb").read() ==
          open(env.path("killed_ref", "model.safetensors"), "rb").read(), "killed + resumed = straight")
    check(losses(env.path("killed")) == losses(env.path("killed_ref")), "metrics trimmed to one clean sequence")


def case_sigterm(env):
    cfg = env.base("sig", train_iters=1000000, save_interval=0)
    path = env.config("sig.json", cfg)
    proc = subprocess.Popen([env.cllm, "train", "--config", path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    mpath = env.path("sig", "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < 60:
        if os.path.exists(mpath) and len(open(mpath).read().splitlines()) >= 3:
            break
        time.sleep(0.05)
    # no thread that computes may run a handler (oneDNN's sgemm kernels keep the stack pointer in a heap buffer)
    takers = signal_util.stop_signal_takers(proc.pid)
    check([t[1] for t in takers] == ["cllm-signals"],
          f"only the signal thread takes SIGINT/SIGTERM (pid {proc.pid}): {takers}")
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        check(False, "SIGTERM: no exit within 60 s")
        return
    check(proc.returncode == 0, f"SIGTERM exits 0 (got {proc.returncode}): {err}")
    check("stop requested" in err, "stop reported")
    latest = env.path("sig", "latest")
    check(os.path.exists(latest), "checkpoint written on SIGTERM")
    if not os.path.exists(latest):
        return
    step = int(open(latest).read().strip().split("-")[1])
    last = metrics(mpath)[-1]["step"]
    check(step == last, f"checkpoint at the last logged step ({step} vs {last})")
    check(manifest_ok(env.path("sig", f"checkpoint-{step}")), "SIGTERM checkpoint verifies")
    p = env.run("train", "--config", path, "--resume", "auto", "--steps", str(step + 2))
    check(p.returncode == 0, f"resume after SIGTERM: {p.stderr}")
    check([r["step"] for r in metrics(mpath)][-3:] == [step, step + 1, step + 2], "continues after the checkpoint")


def case_eval(env):
    cfg = env.base("ev", train_iters=4, eval_interval=2, eval_iters=2)
    cfg["data"]["eval"] = env.eval_data
    p = env.run("train", "--config", env.config("ev.json", cfg))
    check(p.returncode == 0, f"run: {p.stderr}")
    m = metrics(env.path("ev", "metrics.jsonl"))
    ev = [r for r in m if "eval_loss" in r]
    check([r["step"] for r in ev] == [2, 4], f"eval records at steps 2 and 4: {ev}")
    for r in ev:
        check(abs(r["eval_ppl"] - math.exp(r["eval_loss"])) <= 1e-6 * r["eval_ppl"], "ppl = exp(loss)")
        check(r["eval_batches"] == 2, "eval_iters batches")
    check(all("loss" in r for r in m if "eval_loss" not in r), "training records carry loss")
    # eval split from the training file ("splits"), whole split when eval_iters is 0
    cfg = env.base("ev2", train_iters=2, eval_interval=2)
    cfg["data"]["splits"] = "80,20,0"
    p = env.run("train", "--config", env.config("ev2.json", cfg))
    check(p.returncode == 0, f"splits: {p.stderr}")
    ev = [r for r in metrics(env.path("ev2", "metrics.jsonl")) if "eval_loss" in r]
    check(len(ev) == 1 and ev[0]["eval_batches"] == 2, f"valid split of 8 samples = 2 batches of 4: {ev}")
    # the same eval loss as `cllm eval` on the final model over the same rows
    p = env.run("eval", "--model", env.path("ev"), "--data", env.eval_data, "--seq-len", "32", "--batch-size", "4")
    check(p.returncode == 0, f"cllm eval: {p.stderr}")


def case_plot(env):
    cfg = env.base("pl", train_iters=8, eval_interval=4,
                   scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 1e-3}})
    cfg["data"]["eval"] = env.eval_data
    p = env.run("train", "--config", env.config("pl.json", cfg))
    check(p.returncode == 0, f"run: {p.stderr}")
    p = env.run("plot", env.path("pl"))
    check(p.returncode == 0, f"plot: {p.stderr}")
    svg = env.path("pl", "plot.svg")
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(svg).getroot()
    except Exception as e:  # noqa: BLE001
        check(False, f"SVG is not well-formed XML: {e}")
        return
    ns = "{http://www.w3.org/2000/svg}"
    check(root.tag == ns + "svg", "root is <svg>")
    check(len(root.findall(ns + "polyline")) == 2, "train loss and lr lines")
    check(len(root.findall(ns + "circle")) >= 2, "eval points")
    texts = [t.text for t in root.iter(ns + "text")]
    check("loss" in texts and "learning rate" in texts and "step" in texts, "titles and labels")
    p = env.run("plot", env.path("nothing"))
    check(p.returncode == 1, "missing run folder is an error")
    if shutil.which("rsvg-convert"):
        r = subprocess.run(["rsvg-convert", "-o", env.path("pl", "plot.png"), svg], capture_output=True)
        check(r.returncode == 0, f"rsvg-convert renders the SVG: {r.stderr}")


def case_zero(env):
    """ZeRO stages 2 and 3 in one process (the layer hooks, per-layer
    reduction, gathered groups, replicated small tensors, overlap_comm
    without MPI) against stage 0: same losses and weights within 1e-5."""
    opt = {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-5, "weight_decay": 0.1}}
    runs = {}
    for name, zero in [("z0", {"stage": 0}), ("z2", {"stage": 2, "reduce_bucket_size": 3000}),
                       ("z3", {"stage": 3, "reduce_bucket_size": 3000, "allgather_bucket_size": 5000,
                               "stage3_param_persistence_threshold": 3000, "overlap_comm": True})]:
        cfg = env.base(name, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2, train_iters=4,
                       gradient_clipping=0.5, use_grad_ckpt=True, optimizer=opt, zero_optimization=zero)
        p = env.run("train", "--config", env.config(name + ".json", cfg))
        check(p.returncode == 0, f"{name}: {p.stderr}")
        runs[name] = (metrics(env.path(name, "metrics.jsonl")), tensors(env.path(name, "model.safetensors")))
    m0, w0 = runs["z0"]
    for name in ("z2", "z3"):
        m, w = runs[name]
        check(all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) for a, b in zip(m, m0)), f"{name}: losses")
        worst = max(float(np.max(np.abs(w[k] - w0[k]))) / max(float(np.max(np.abs(w0[k]))), 1e-30) for k in w0)
        check(worst <= 1e-5, f"{name}: weights differ from stage 0 by {worst:.2e} relative")
        check(m[0]["state_bytes_work"] > 0, f"{name}: working buffers not reported")


def case_metrics(env):
    """Per-step throughput fields, checked against their documented formulas
    (docs/training.md): tokens_per_sec = rows * seq_len / step_time;
    gflops = flops / step_time with flops = 6 * P_mm * B * T + 6 * L * B * T * (T + 1) * A
    (P_mm from tests/ref/hf_models.py, not from cllm); mfu = gflops / peak_gflops
    (here the configured peak). The progress line shows the same tok/s and
    MFU. CLLM_PROFILE=1 adds each phase's seconds, which add up to at most
    time_fwdbwd; any other value is refused by name."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
    import hf_models as hm
    with open(os.path.join(env.model, "config.json")) as f:
        mcfg = json.load(f)
    B, T, peak = 4, 32, 2.5
    A, L = hm.attention_width(mcfg)
    flops = 6 * hm.matmul_params(mcfg) * B * T + 6 * L * B * T * (T + 1) * A
    cfg = env.base("metrics", train_iters=3, steps_per_print=1, peak_gflops=peak)
    p = env.run("train", "--config", env.config("metrics.json", cfg), env={"CLLM_PROFILE": "1"})
    check(p.returncode == 0, f"profiled run: {p.stderr}")
    m = metrics(env.path("metrics", "metrics.jsonl"))
    check(len(m) == 3, f"three records: {len(m)}")
    lines = [l for l in p.stderr.splitlines() if l.startswith("step ")]
    check(len(lines) == 3, f"one progress line per step: {lines}")
    phases = ["gemm_fwd", "gemm_bwd", "head_gemm", "xent", "attn_fwd", "attn_bwd", "norm", "act", "rope",
              "residual", "zero", "embed", "other"]
    for r, line in zip(m, lines):
        dt = r["step_time"]
        check(math.isclose(r["tokens_per_sec"], B * T / dt, rel_tol=1e-6), f"tokens_per_sec {r}")
        check(math.isclose(r["gflops"], flops / dt / 1e9, rel_tol=1e-6), f"gflops {r['gflops']} vs {flops / dt / 1e9}")
        check(math.isclose(r["mfu"], r["gflops"] / peak, rel_tol=1e-6), f"mfu {r['mfu']} vs gflops / {peak}")
        check(f"| {B * T / dt:.0f} tok/s" in line and f"| MFU {100 * r['mfu']:.1f}%" in line,
              f"progress line shows tok/s and MFU of the record: {line!r} vs {r}")
        for ph in phases:
            check(isinstance(r.get("prof_" + ph), (int, float)) and r["prof_" + ph] >= 0, f"prof_{ph} in {r}")
        total = sum(r.get("prof_" + ph) or 0 for ph in phases)
        check(total <= r["time_fwdbwd"] * (1 + 1e-6) + 1e-6, f"phases {total} within time_fwdbwd {r}")
        for ph in ("gemm_fwd", "gemm_bwd", "head_gemm", "attn_fwd", "attn_bwd", "norm", "act", "rope"):
            check(r["prof_" + ph] > 0, f"a llama step runs phase {ph}: {r}")
    p = env.run("train", "--config", env.config("metrics2.json", env.base("metrics2", train_iters=1)))
    check(p.returncode == 0 and not any(k.startswith("prof_") for k in metrics(env.path("metrics2", "metrics.jsonl"))[0]),
          f"no prof_ fields without CLLM_PROFILE: {p.stderr}")
    p = env.run("train", "--config", env.config("metrics3.json", env.base("metrics3", train_iters=1)),
                env={"CLLM_PROFILE": "yes"})
    check(p.returncode != 0 and "CLLM_PROFILE" in p.stderr, f"CLLM_PROFILE=yes refused by name: {p.stderr}")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    env = Env(a.cllm, a.build, a.case)
    try:
        CASES[a.case](env)
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {env.dir})" if FAILS else ""))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
