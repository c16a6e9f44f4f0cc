"""Activation checkpointing end to end (label: model).

For tiny gpt2, llama (GQA) and bloom models with 4 blocks:
  grad   `cllm grad --grad-ckpt` writes the same bytes and loss as without;
  train  a few `cllm train --grad-ckpt` steps give a byte-identical
         model.safetensors and the same losses;
  bytes  activation_bytes in metrics.jsonl shrinks by (n_layer-1)/n_layer of
         the per-block saved activations (measured from 2- and 4-block runs);
  config use_grad_ckpt and DeepSpeed's activation_checkpointing block turn
         checkpointing on; an empty block does not.
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile

FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


LAYER_KEY = {"gpt2": "n_layer", "llama": "num_hidden_layers", "bloom": "n_layer"}


class Env:
    def __init__(self, cllm, build):
        self.cllm = cllm
        self.dir = tempfile.mkdtemp(prefix="ckpt_", dir=build)
        r = random.Random(1)
        self.data = os.path.join(self.dir, "d.jsonl")
        with open(self.data, "w") as f:
            for _ in range(40):
                k = r.randint(6, 30)
                ids = [r.randrange(3, 500) for _ in range(k)]
                p = r.randint(0, k - 2)
                f.write(json.dumps({"input_ids": ids, "labels": [-100] * p + ids[p:]}) + "\n")

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run(self, *args):
        e = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
        p = subprocess.run([self.cllm, *args], capture_output=True, text=True, env=e, timeout=120)
        if p.returncode != 0:
            print(p.stdout, p.stderr, file=sys.stderr)
            raise SystemExit(f"cllm {' '.join(args)} failed ({p.returncode})")
        return p

    def model(self, arch, n_layer):
        out = self.path(f"{arch}_{n_layer}")
        if not os.path.isdir(out):
            self.run("init", "--arch", arch, "--preset", "tiny", "--seed", "5", "--out", out,
                     "--set", f"{LAYER_KEY[arch]}={n_layer}")
        return out

    def train(self, model, out, *extra):
        self.run("train", "--model", model, "--data", self.data, "--out", self.path(out), "--steps", "3",
                 "--batch-size", "4", "--seq-len", "32", "--log", "plain", "--peak-gflops", "1",
                 "--sync-save", *extra)
        with open(self.path(out, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f if l.strip()]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def case_grad(env):
    for arch in ("gpt2", "llama", "bloom"):
        m = env.model(arch, 4)
        outs = []
        for flag in ([], ["--grad-ckpt"]):
            g = env.path(f"grad_{arch}{''.join(flag)}.safetensors")
            p = env.run("grad", "--model", m, "--data", env.data, "--seq-len", "32", "--batch-size", "6", "--out", g,
                        *flag)
            outs.append((p.stdout.strip(), read(g)))
        check(outs[0][0] == outs[1][0], f"{arch}: loss differs with --grad-ckpt: {outs[0][0]} vs {outs[1][0]}")
        check(outs[0][1] == outs[1][1], f"{arch}: gradient file differs with --grad-ckpt")


def case_train(env):
    for arch in ("gpt2", "llama", "bloom"):
        m = env.model(arch, 4)
        a = env.train(m, f"tr_{arch}")
        b = env.train(m, f"tr_{arch}_ckpt", "--grad-ckpt")
        check([r["loss"] for r in a] == [r["loss"] for r in b], f"{arch}: losses differ with --grad-ckpt")
        check(read(env.path(f"tr_{arch}", "model.safetensors")) == read(env.path(f"tr_{arch}_ckpt", "model.safetensors")),
              f"{arch}: trained model.safetensors differs with --grad-ckpt")


def case_bytes(env):
    for arch in ("gpt2", "llama", "bloom"):
        act = {}
        for L in (2, 4):
            for on in (False, True):
                r = env.train(env.model(arch, L), f"by_{arch}_{L}_{on}", *(["--grad-ckpt"] if on else []))
                act[L, on] = r[-1]["activation_bytes"]
        # off(L) = base + L*(x + set); on(L) = base + L*x + set
        per_block = (act[4, False] - act[2, False]) / 2   # x + set
        inputs = (act[4, True] - act[2, True]) / 2        # x
        block_set = per_block - inputs
        saved = 4 * block_set                             # the per-layer saved part without checkpointing
        shrink = act[4, False] - act[4, True]
        print(f"{arch}: activation bytes {act[4, False]} -> {act[4, True]} (per-layer saved part {saved:.0f})")
        check(block_set > 0 and shrink >= 3 / 4 * saved,
              f"{arch}: activations shrink by {shrink}, less than 3/4 of the per-layer part {saved}")


def case_config(env):
    m = env.model("llama", 4)
    for name, extra, want in (("use_grad_ckpt", {"use_grad_ckpt": True}, True),
                              ("ds_block", {"activation_checkpointing": {"partition_activations": True,
                                                                          "cpu_checkpointing": False}}, True),
                              ("ds_count", {"activation_checkpointing": {"number_checkpoints": 2}}, True),
                              ("ds_off", {"activation_checkpointing": {"partition_activations": False}}, False),
                              ("none", {}, False)):
        cfg = {"model": m, "data": {"train": env.data, "seq_len": 32}, "output_dir": env.path("cf_" + name),
               "train_micro_batch_size_per_gpu": 4, "train_iters": 1, "log": "plain", "peak_gflops": 1.0}
        cfg.update(extra)
        path = env.path(f"cf_{name}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = env.run("train", "--config", path, "--strict")
        on = "activation checkpointing on" in p.stderr
        check(on == want, f"config {name}: checkpointing {'on' if on else 'off'}, expected {want}: {p.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["grad", "train", "bytes", "config"])
    a = ap.parse_args()
    env = Env(a.cllm, a.build)
    try:
        globals()["case_" + a.case](env)
    finally:
        if not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} failure(s)", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
