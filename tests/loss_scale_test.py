#!/usr/bin/env python3
"""fp16 loss scaling (label: train).

The reference is written here from DeepSpeed's documented behaviour of its
DynamicLossScaler (fp16 config keys: loss_scale 0 = dynamic,
initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis,
min_loss_scale):
  - the scale starts at 2^initial_scale_power; every update advances an
    iteration counter (starting at 0); the last overflow starts at -1;
  - overflow: if hysteresis is 1 or the remaining allowance is 1, the scale
    is halved but not below min_loss_scale, and when it already equals the
    minimum the run stops with "Current loss scale already at minimum -
    cannot decrease scale anymore. Exiting run."; otherwise the allowance
    decreases by one. The iteration is recorded as the last overflow;
  - no overflow: consecutive_hysteresis refills the allowance; when the
    iterations since the last overflow are a multiple of the window the
    scale doubles (refilling the allowance when consecutive_hysteresis is
    off);
  - a step with an overflow is skipped; a static scale never changes.

Cases:
  sequences  hand-built and random overflow sequences over hysteresis 1/2/3,
             consecutive on/off, several windows and minimums, compared step
             by step (scale used, skipped) with the C scaler driven by
             test_loss_scale.
  train      `cllm train` with fp16 on a tiny llama: overflows injected at
             chosen steps (CLLM_TRAIN_POISON_STEPS), the loss_scale and
             skipped fields of metrics.jsonl against the reference; resume
             from a checkpoint continues the same sequence and weights; the
             minimum-scale stop; and without overflows the final weights of
             an fp16-scaled run equal those of a plain fp32 run.

Usage: loss_scale_test.py --cllm BIN --build DIR --case NAME
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile

FAILS = []
MIN_MSG = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


class RefScaler:
    """DeepSpeed's dynamic (or static) loss scaler, from its documentation."""

    def __init__(self, loss_scale, power, window, hysteresis, consecutive, min_scale):
        self.dynamic = loss_scale == 0
        self.scale = float(2 ** power) if self.dynamic else float(loss_scale)
        self.window, self.hyst, self.consec, self.min = window, hysteresis, consecutive, min_scale
        self.allow = hysteresis
        self.it = 0
        self.last = -1

    def step(self, overflow):
        """Returns (scale used, skipped) or raises RuntimeError at the minimum."""
        used = self.scale
        if not self.dynamic:
            return used, overflow
        if overflow:
            if self.hyst == 1 or self.allow == 1:
                if self.scale == self.min:
                    raise RuntimeError(MIN_MSG)
                self.scale = max(self.scale / 2.0, self.min)
            else:
                self.allow -= 1
            self.last = self.it
        else:
            if self.consec:
                self.allow = self.hyst
            if (self.it - self.last) % self.window == 0:
                if not self.consec:
                    self.allow = self.hyst
                self.scale *= 2.0
        self.it += 1
        return used, overflow


def ref_run(params, seq):
    s = RefScaler(*params)
    out = []
    for o in seq:
        try:
            out.append(s.step(o))
        except RuntimeError as e:
            return out, str(e)
    return out, None


def c_run(driver, params, seq):
    ls, power, window, hyst, consec, mn = params
    p = subprocess.run([driver, repr(float(ls)), str(power), str(window), str(hyst), "1" if consec else "0",
                        repr(float(mn)), "".join("1" if o else "0" for o in seq)],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return None, f"driver failed: {p.stderr}"
    out, err = [], None
    for line in p.stdout.splitlines():
        if line.startswith("error "):
            err = line[6:]
            break
        a, b = line.split()
        out.append((float(a), b == "1"))
    return out, err


def case_sequences(cllm, build, tmp):
    driver = os.path.join(build, "tests", "test_loss_scale")
    hand = [
        [0] * 12,
        [1, 1, 1, 1, 1, 1],
        [1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1],
    ]
    rng = random.Random(7)
    rand = [[1 if rng.random() < p else 0 for _ in range(rng.randint(20, 80))] for p in (0.1, 0.3, 0.5, 0.8)
            for _ in range(3)]
    n = 0
    for hyst in (1, 2, 3):
        for consec in (False, True):
            for window in (1, 2, 3, 5):
                for power, mn in ((4, 1.0), (3, 2.0), (5, 3.0), (6, 0.5)):
                    for seq in hand + rand:
                        params = (0, power, window, hyst, consec, mn)
                        ref, rerr = ref_run(params, seq)
                        got, gerr = c_run(driver, params, seq)
                        n += 1
                        ok = got == ref and (rerr is None) == (gerr is None) and (gerr is None or MIN_MSG in gerr)
                        check(ok, f"params {params} seq {''.join(map(str, seq))}: C {got} {gerr} vs ref {ref} {rerr}")
                        if not ok:
                            return
    # the minimum was reached (and refused) in some of them, doubling happened in others
    errs = sum(ref_run((0, 3, 2, h, False, 2.0), [1] * 10)[1] is not None for h in (1, 2, 3))
    check(errs == 3, "all-overflow sequences reach the minimum")
    # static scale
    seq = hand[4]
    ref, _ = ref_run((1024, 0, 1000, 2, False, 1.0), seq)
    got, gerr = c_run(driver, (1024, 0, 1000, 2, False, 1.0), seq)
    check(got == ref and gerr is None, f"static scale: {got} vs {ref}")
    print(f"{n} dynamic sequences compared")


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


class Env:
    def __init__(self, cllm, tmp):
        self.cllm, self.dir = cllm, tmp
        self.model = self.path("init")
        self.run_ok("init", "--arch", "llama", "--preset", "tiny", "--out", self.model, "--seed", "3")
        r = random.Random(1)
        self.data = self.path("train.jsonl")
        with open(self.data, "w") as f:
            for _ in range(40):
                k = r.randint(6, 30)
                ids = [r.randrange(3, 500) for _ in range(k)]
                prompt = r.randint(0, k - 2)
                f.write(json.dumps({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]}) + "\n")

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run(self, *args, env=None):
        e = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
        e.pop("CLLM_TRAIN_POISON_STEPS", None)
        if env:
            e.update(env)
        return subprocess.run([self.cllm, *args], capture_output=True, text=True, env=e, timeout=120)

    def run_ok(self, *args):
        p = self.run(*args)
        if p.returncode != 0:
            raise SystemExit(f"cllm {' '.join(args)} failed: {p.stderr}")
        return p

    def train(self, out, poison=None, extra=(), **kw):
        c = {"model": self.model, "data": {"train": self.data, "seq_len": 32}, "output_dir": self.path(out),
             "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_iters": 12,
             "log": "plain", "peak_gflops": 1.0, "gradient_clipping": 1.0,
             "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
             "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}}
        c.update(kw)
        cfg = self.path(out + ".json")
        with open(cfg, "w") as f:
            json.dump(c, f)
        # loss scaling on its own: fp16.enabled also switches the matmuls to
        # (emulated) fp16, which CLLM_TRAIN_PRECISION keeps at fp32 here
        env = {"CLLM_TRAIN_PRECISION": "fp32"}
        if poison:
            env["CLLM_TRAIN_POISON_STEPS"] = ",".join(map(str, poison))
        return self.run("train", "--config", cfg, *extra, env=env)

    def weights(self, out):
        with open(self.path(out, "model.safetensors"), "rb") as f:
            return f.read()


def case_train(cllm, build, tmp):
    env = Env(cllm, tmp)
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 5, "loss_scale_window": 2, "hysteresis": 2,
            "consecutive_hysteresis": False, "min_loss_scale": 1}
    poison = [3, 4, 6, 9, 10, 11]
    p = env.train("dyn", poison, fp16=fp16)
    check(p.returncode == 0, f"fp16 run with overflows: {p.stderr}")
    m = metrics(env.path("dyn", "metrics.jsonl"))
    ref, _ = ref_run((0, 5, 2, 2, False, 1.0), [s in poison for s in range(1, 13)])
    got = [(r.get("loss_scale"), r.get("skipped", False)) for r in m]
    check(got == ref, f"scale trajectory and skipped steps: {got} vs reference {ref}")
    for cons in (True,):
        f2 = dict(fp16, consecutive_hysteresis=cons, hysteresis=3, loss_scale_window=3)
        p = env.train("dyn_c", poison, fp16=f2)
        m = metrics(env.path("dyn_c", "metrics.jsonl"))
        ref, _ = ref_run((0, 5, 3, 3, cons, 1.0), [s in poison for s in range(1, 13)])
        got = [(r.get("loss_scale"), r.get("skipped", False)) for r in m]
        check(p.returncode == 0 and got == ref, f"consecutive hysteresis: {got} vs {ref}")
    # resume: checkpoints every 3 steps; stop after 7 and resume to 12
    p = env.train("res", poison, fp16=fp16, save_interval=3, train_iters=7)
    check(p.returncode == 0, f"first half: {p.stderr}")
    with open(env.path("res", "checkpoint-6", "trainer_state.json")) as f:
        st = json.load(f)
    s = RefScaler(0, 5, 2, 2, False, 1.0)
    for k in range(1, 7):
        s.step(k in poison)
    check(st.get("loss_scale") == s.scale and st.get("loss_scaler") ==
          {"iter": s.it, "last_overflow_iter": s.last, "cur_hysteresis": s.allow},
          f"checkpoint scaler state {st.get('loss_scale')} {st.get('loss_scaler')} vs {s.scale} {s.it} {s.last} {s.allow}")
    p = env.train("res", poison, extra=("--resume", "auto", "--steps", "12"), fp16=fp16, save_interval=3,
                  train_iters=7)
    check(p.returncode == 0 and "(resumed)" in p.stderr, f"second half: {p.stderr}")
    a = [(r["step"], r["loss"], r.get("loss_scale"), r.get("skipped", False)) for r in metrics(env.path("dyn", "metrics.jsonl"))]
    b = [(r["step"], r["loss"], r.get("loss_scale"), r.get("skipped", False)) for r in metrics(env.path("res", "metrics.jsonl"))]
    check(a == b, f"resumed run continues the same sequence: {b} vs {a}")
    check(env.weights("dyn") == env.weights("res"), "resumed final weights equal the straight run's")
    # the minimum: hysteresis 1, scale 2^2, min 1, overflows at steps 2..
    p = env.train("min", list(range(2, 12)), fp16=dict(fp16, initial_scale_power=2, hysteresis=1))
    check(p.returncode == 1 and MIN_MSG in p.stderr, f"stop at the minimum scale: rc {p.returncode} {p.stderr}")
    m = metrics(env.path("min", "metrics.jsonl"))
    ref, err = ref_run((0, 2, 2, 1, False, 1.0), [s in range(2, 12) for s in range(1, 13)])
    got = [(r.get("loss_scale"), r.get("skipped", False)) for r in m]
    check(err == MIN_MSG and got == ref, f"steps until the stop: {got} vs {ref}")
    # no overflow: the scaled run equals the plain fp32 run bit for bit
    p1 = env.train("plain")
    p2 = env.train("scaled", fp16=dict(fp16, initial_scale_power=12, loss_scale_window=4))
    check(p1.returncode == 0 and p2.returncode == 0, f"plain/scaled runs: {p1.stderr} {p2.stderr}")
    la = [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(env.path("plain", "metrics.jsonl"))]
    lb = [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(env.path("scaled", "metrics.jsonl"))]
    check(la == lb, f"losses and gradient norms identical: {la} vs {lb}")
    check(env.weights("plain") == env.weights("scaled"), "final weights bit-identical with and without loss scaling")
    sc = [r["loss_scale"] for r in metrics(env.path("scaled", "metrics.jsonl"))]
    check(sc == [4096.0 * 2 ** (k // 4) for k in range(12)], f"clean run doubles every window: {sc}")
    # static scale: constant, overflow still skips
    p = env.train("static", [5], fp16=dict(fp16, loss_scale=256))
    m = metrics(env.path("static", "metrics.jsonl"))
    check(p.returncode == 0 and [r.get("loss_scale") for r in m] == [256] * 12 and
          [r.get("skipped", False) for r in m] == [k == 5 for k in range(1, 13)], "static scale")


CASES = {"sequences": case_sequences, "train": case_train}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=f"loss_scale_{a.case}_", dir=a.build)
    try:
        CASES[a.case](a.cllm, a.build, tmp)
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {tmp})" if FAILS else ""))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
