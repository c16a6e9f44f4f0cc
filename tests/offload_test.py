#!/usr/bin/env python3
"""Optimizer-state offload (zero_optimization.offload_optimizer, device
"nvme"; label: train).

The reference is the same run with the state in memory: the streamed update
is element-wise with the same coefficients, so losses and final weights must
be equal bit for bit.

Cases:
  equal       AdamW, Lion and SGD with momentum, several buffer sizes and
              counts (many chunks, a last partial chunk, one chunk), device
              "cpu" (resident); the state file is gone after the run.
  checkpoint  an offloaded run saves checkpoints whose optimizer.safetensors
              equal the in-memory run's byte for byte; resuming with offload
              from such a checkpoint ends equal to the straight in-memory run.
  errors      missing / non-folder / unwritable nvme_path, no nvme_path,
              buffer_count below 3, offload_param nvme below stage 3 or
              without nvme_path.
  params      (mpirun too) ZeRO-3 with the parameter slice in a file
              (offload_param nvme), alone and with offload_optimizer, on 1
              and 2 ranks: losses and final weights equal the in-memory
              ZeRO-3 run bit for bit, the files are gone afterwards, and a
              checkpointed + resumed run ends equal to the straight one.
  dp          (mpirun) ZeRO-2 over 2 ranks with fp16 loss scaling and
              overflows injected: offloaded slices equal the in-memory run
              bit for bit, and the loss-scale sequence equals the
              one-process run's.

Usage: offload_test.py --cllm BIN --build DIR --case NAME
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile

FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


class Env:
    def __init__(self, cllm, tmp):
        self.cllm, self.dir = cllm, tmp
        self.model = self.path("init")
        self.run_ok("init", "--arch", "gpt2", "--preset", "tiny", "--out", self.model, "--seed", "5")
        r = random.Random(3)
        self.data = self.path("train.jsonl")
        with open(self.data, "w") as f:
            for _ in range(32):
                k = r.randint(8, 30)
                ids = [r.randrange(3, 400) for _ in range(k)]
                f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
        self.nvme = self.path("nvme")
        os.makedirs(self.nvme)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run(self, *args, ranks=0, env=None):
        e = dict(os.environ, OMP_NUM_THREADS="1" if ranks else "2", OMP_WAIT_POLICY="PASSIVE")
        e.update(env or {})
        pre = []
        if ranks:
            pre = ["timeout", "-k", "5", "60", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "-np", str(ranks)] + [x for k in (env or {}) for x in ("-x", k)]
        return subprocess.run(pre + [self.cllm, *args], capture_output=True, text=True, env=e, timeout=120)

    def run_ok(self, *args):
        p = self.run(*args)
        if p.returncode != 0:
            raise SystemExit(f"cllm {' '.join(args)} failed: {p.stderr}")
        return p

    def train(self, out, offload=None, optimizer=None, extra=(), ranks=0, env=None, **kw):
        c = {"model": self.model, "data": {"train": self.data, "seq_len": 32}, "output_dir": self.path(out),
             "train_micro_batch_size_per_gpu": 4, "train_iters": 6, "log": "plain", "peak_gflops": 1.0,
             "gradient_clipping": 1.0,
             "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}}}
        if offload is not None:
            c["zero_optimization"] = {"stage": 0, "offload_optimizer": offload}
        c.update(kw)
        cfg = self.path(out + ".json")
        with open(cfg, "w") as f:
            json.dump(c, f)
        return self.run("train", "--config", cfg, *extra, ranks=ranks, env=env)

    def read(self, *p):
        with open(self.path(*p), "rb") as f:
            return f.read()

    def losses(self, out):
        with open(self.path(out, "metrics.jsonl")) as f:
            return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if "loss" in r]


def nvme(env, **kw):
    o = {"device": "nvme", "nvme_path": env.nvme}
    o.update(kw)
    return o


def case_equal(env):
    opts = {"adamw": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}},
            "lion": {"type": "Lion", "params": {"lr": 3e-4, "weight_decay": 0.05}},
            "sgdm": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": True}}}
    for name, opt in opts.items():
        p = env.train(f"{name}_mem", optimizer=opt)
        check(p.returncode == 0, f"{name} in memory: {p.stderr}")
        ref_w, ref_l = env.read(f"{name}_mem", "model.safetensors"), env.losses(f"{name}_mem")
        for count, size in ((3, 1000), (5, 4099), (4, 10 ** 8)):
            out = f"{name}_off_{count}_{size}"
            p = env.train(out, offload=nvme(env, buffer_count=count, buffer_size=size), optimizer=opt)
            check(p.returncode == 0 and "optimizer state offloaded" in p.stderr, f"{out}: {p.stderr}")
            check(env.read(out, "model.safetensors") == ref_w, f"{out}: final weights equal the in-memory run's")
            check(env.losses(out) == ref_l, f"{out}: losses equal")
            check(os.listdir(env.nvme) == [], f"{out}: state file removed at exit: {os.listdir(env.nvme)}")
        with open(env.path(f"{name}_off_3_1000", "metrics.jsonl")) as f:
            m = [json.loads(l) for l in f]
        check(all(r.get("offload_io_time", -1) >= 0 and r.get("offload_wait_time", -1) >= 0 for r in m),
              "offload I/O times in metrics.jsonl")
    # device cpu: resident state, same result
    p = env.train("cpu", offload={"device": "cpu", "pin_memory": True})
    check(p.returncode == 0 and env.read("cpu", "model.safetensors") == env.read("adamw_mem", "model.safetensors"),
          f"device cpu: {p.stderr}")


def case_checkpoint(env):
    p = env.train("mem", train_iters=8, save_interval=4, async_save=True)
    check(p.returncode == 0, f"in memory: {p.stderr}")
    p = env.train("off", offload=nvme(env, buffer_count=3, buffer_size=2000), train_iters=8, save_interval=4)
    check(p.returncode == 0, f"offloaded: {p.stderr}")
    for ck in ("checkpoint-4", "checkpoint-8"):
        check(env.read("off", ck, "optimizer.safetensors") == env.read("mem", ck, "optimizer.safetensors"),
              f"{ck}: optimizer state written from the offload file equals the in-memory one")
        check(env.read("off", ck, "model.safetensors") == env.read("mem", ck, "model.safetensors"), f"{ck}: weights")
    # resume with offload from the in-memory run's checkpoint-4 (copied), to step 8
    shutil.copytree(env.path("mem"), env.path("res"))
    shutil.rmtree(env.path("res", "checkpoint-8"))
    with open(env.path("res", "latest"), "w") as f:
        f.write("checkpoint-4\n")
    p = env.train("res", offload=nvme(env, buffer_count=4, buffer_size=3000), train_iters=8, save_interval=4,
                  extra=("--resume", "auto"))
    check(p.returncode == 0 and "(resumed)" in p.stderr, f"resume with offload: {p.stderr}")
    check(env.read("res", "model.safetensors") == env.read("mem", "model.safetensors"),
          "resumed offloaded run ends equal to the straight in-memory run")
    check(env.read("res", "checkpoint-8", "optimizer.safetensors") == env.read("mem", "checkpoint-8",
                                                                                "optimizer.safetensors"),
          "and its optimizer state too")
    check(os.listdir(env.nvme) == [], "state files removed")


def case_errors(env):
    # rc 1: found when the run opens nvme_path; rc 2: a config error, found when the config is read
    def fails(out, offload, want, rc=1, **kw):
        p = env.train(out, offload=offload, **kw)
        check(p.returncode == rc and want in p.stderr, f"{out}: rc {p.returncode}, want '{want}': {p.stderr}")

    fails("missing", {"device": "nvme", "nvme_path": env.path("no", "such")},
          "zero_optimization.offload_optimizer.nvme_path")
    with open(env.path("afile"), "w") as f:
        f.write("x")
    fails("notdir", {"device": "nvme", "nvme_path": env.path("afile")}, "is not a folder")
    fails("unwritable", {"device": "nvme", "nvme_path": "/proc"}, "cannot create")
    fails("nopath", {"device": "nvme"}, "zero_optimization.offload_optimizer.nvme_path: required", rc=2)
    fails("count", nvme(env, buffer_count=2), "zero_optimization.offload_optimizer.buffer_count", rc=2)
    p = env.train("param", zero_optimization={"stage": 2, "offload_param": {"device": "nvme", "nvme_path": env.nvme}})
    check(p.returncode != 0 and "offload_param" in p.stderr and "stage 3" in p.stderr,
          f"offload_param below stage 3: {p.stderr}")
    p = env.train("param3", zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}})
    check(p.returncode != 0 and "offload_param.nvme_path" in p.stderr, f"offload_param without nvme_path: {p.stderr}")


def case_params(env):
    """ZeRO-3 with the parameter slice (and the optimizer state) in files."""
    z3 = {"stage": 3, "stage3_param_persistence_threshold": 0}
    for ranks in (0, 2):
        tag = f"{ranks or 1} rank(s)"
        p = env.train(f"mem{ranks}", ranks=ranks, zero_optimization=z3, train_batch_size=8,
                      train_micro_batch_size_per_gpu=2)
        check(p.returncode == 0, f"{tag} in memory: {p.stderr}")
        for both in (False, True):
            out = f"off{ranks}_{both}"
            z = dict(z3, offload_param=nvme(env))
            if both:
                z["offload_optimizer"] = nvme(env, buffer_count=3, buffer_size=5000)
            p = env.train(out, ranks=ranks, zero_optimization=z, train_batch_size=8, train_micro_batch_size_per_gpu=2)
            check(p.returncode == 0, f"{tag} {out}: {p.stderr}")
            check(p.returncode == 0 and env.read(out, "model.safetensors") == env.read(f"mem{ranks}", "model.safetensors"),
                  f"{tag} {out}: final weights equal the in-memory run's")
            check(p.returncode == 0 and env.losses(out) == env.losses(f"mem{ranks}"), f"{tag} {out}: losses equal")
            check(os.listdir(env.nvme) == [], f"{tag} {out}: files removed: {os.listdir(env.nvme)}")
    # checkpoint at step 3 and resume, parameters in a file: the straight run's weights
    z = dict(z3, offload_param=nvme(env))
    p = env.train("ck", zero_optimization=z, save_interval=3, train_batch_size=8, train_micro_batch_size_per_gpu=2)
    check(p.returncode == 0, f"checkpointed run: {p.stderr}")
    p = env.train("res", zero_optimization=z, train_batch_size=8, train_micro_batch_size_per_gpu=2,
                  extra=("--resume", env.path("ck", "checkpoint-3")))
    check(p.returncode == 0 and env.read("res", "model.safetensors") == env.read("mem0", "model.safetensors"),
          f"resumed with offloaded parameters: {p.stderr[-1500:]}")


def case_dp(env):
    poison = {"CLLM_TRAIN_POISON_STEPS": "3,4,7"}
    fp16 = {"enabled": True, "initial_scale_power": 6, "loss_scale_window": 2, "hysteresis": 2}
    kw = dict(train_micro_batch_size_per_gpu=2, train_batch_size=8, train_iters=8, fp16=fp16)
    p = env.train("one", env=poison, zero_optimization={"stage": 2}, **kw)
    check(p.returncode == 0, f"one process: {p.stderr}")
    p = env.train("mem2", env=poison, ranks=2, zero_optimization={"stage": 2}, **kw)
    check(p.returncode == 0, f"2 ranks in memory: {p.stderr}")
    p = env.train("off2", env=poison, ranks=2, zero_optimization={
        "stage": 2, "offload_optimizer": nvme(env, buffer_count=3, buffer_size=3000)}, **kw)
    check(p.returncode == 0, f"2 ranks offloaded: {p.stderr}")
    check(env.read("off2", "model.safetensors") == env.read("mem2", "model.safetensors"),
          "offloaded ZeRO-2 slices: final weights equal the in-memory run's")

    def seq(out):
        with open(env.path(out, "metrics.jsonl")) as f:
            return [(r["loss_scale"], r.get("skipped", False)) for r in map(json.loads, f)]
    check(seq("off2") == seq("mem2") == seq("one") and sum(k for _, k in seq("one")) == 3,
          f"loss-scale sequence: {seq('one')} {seq('mem2')} {seq('off2')}")
    check(os.listdir(env.nvme) == [], "state files of both ranks removed")


CASES = {"equal": case_equal, "checkpoint": case_checkpoint, "errors": case_errors, "dp": case_dp,
         "params": case_params}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=f"offload_{a.case}_", dir=a.build)
    try:
        CASES[a.case](Env(a.cllm, tmp))
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {tmp})" if FAILS else ""))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
