#!/usr/bin/env python3
"""
Checks that the folders cllm writes load in Hugging Face transformers (and
PEFT) and compute what cllm computes. Needs transformers and peft; where they
are not installed it prints "skipped" and exits 0. Not part of the test
suite (Debian ships neither); run it by hand where they are installed:

    python3 scripts/hf_interop_check.py --cllm build/cllm [--workdir DIR]

For each family (gpt2, llama, bloom, mixtral), on a `cllm init --preset tiny`
model and two rows of random token ids:
  1. the loss and every parameter gradient of `cllm grad` against
     transformers' AutoModelForCausalLM (labels = input ids, float32);
  2. greedy continuations: `cllm generate --greedy` against
     transformers' generate(do_sample=False);
  3. the folder `cllm train` writes after two full-parameter steps loads in
     transformers, and its loss equals `cllm eval`'s;
  4. the PEFT adapter folder `cllm train --lora-r 4` writes loads with
     peft.PeftModel, and the loss equals `cllm eval --adapter`'s (not for
     mixtral: its experts' names differ between the two layouts transformers
     reads).
Bounds: losses within 1e-5 relative, gradients within 1e-4 relative L2 per
tensor, identical greedy ids. Prints one line per check and exits 1 if any
fails.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    import peft
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover - depends on the machine
    print("skipped: transformers/peft not installed (%s)" % e)
    sys.exit(0)

FAILS = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILS.append(what)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), p.stderr[-2000:]))
    return p.stdout


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def hf_loss(model, rows):
    ids = torch.tensor(rows)
    out = model(input_ids=ids, labels=ids)
    return out


def family(cllm, arch, wd):
    d = os.path.join(wd, arch)
    os.makedirs(d, exist_ok=True)
    m = os.path.join(d, "model")
    run([cllm, "init", "--arch", arch, "--preset", "tiny", "--seed", "1", "--out", m])
    cfg = json.load(open(os.path.join(m, "config.json")))
    rng = random.Random(7)
    V = cfg["vocab_size"]
    # ids away from the special tokens, so that no row ends early
    rows = [[rng.randrange(8, V) for _ in range(16)] for _ in range(2)]
    data = os.path.join(d, "data.jsonl")
    with open(data, "w") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r}) + "\n")
    common = ["--data", data, "--seq-len", "16", "--batch-size", "2"]

    # 1. loss and gradients
    gfile = os.path.join(d, "grad.safetensors")
    got = json.loads(run([cllm, "grad", "--model", m, "--out", gfile] + common).strip().splitlines()[-1])
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(m, torch_dtype=torch.float32)
    hf.eval()
    out = hf_loss(hf, rows)
    check(rel(got["loss"], out.loss.item()) < 1e-5,
          "%s: cllm grad loss %.8f, transformers %.8f" % (arch, got["loss"], out.loss.item()))
    out.loss.backward()
    grads = load_file(gfile)
    worst, worst_name, compared, missing = 0.0, "", 0, []
    for name, p in hf.named_parameters():
        if p.grad is None:
            continue
        if name not in grads:
            missing.append(name)
            continue
        g = grads[name].to(torch.float64)
        r = p.grad.to(torch.float64)
        e = ((g - r).norm() / max(r.norm().item(), 1e-30)).item()
        compared += 1
        if e > worst:
            worst, worst_name = e, name
    check(worst < 1e-4 and compared > 0,
          "%s: %d gradients, worst relative L2 %.2e (%s)%s" % (
              arch, compared, worst, worst_name,
              "; not in cllm's file (another layout): %s" % ", ".join(missing[:3]) if missing else ""))
    if arch != "mixtral":
        check(not missing, "%s: every transformers parameter has a cllm gradient" % arch)

    # 2. greedy continuation
    prompt = rows[0][:5]
    ids = run([cllm, "generate", "--model", m, "--prompt-ids", ",".join(map(str, prompt)), "--greedy",
               "--max-new-tokens", "8", "--output", "ids"]).split()
    ids = [int(x) for x in ids]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, min_new_tokens=8,
                          pad_token_id=0)[0, len(prompt):].tolist()
    check(ids == ref[:len(ids)] and len(ids) > 0, "%s: greedy cllm %s, transformers %s" % (arch, ids, ref))

    # 3. a trained folder
    t = os.path.join(d, "trained")
    run([cllm, "train", "--model", m, "--out", t, "--steps", "2", "--lr", "1e-2", "--no-shuffle"] + common)
    ev = json.loads(run([cllm, "eval", "--model", t] + common).strip().splitlines()[-1])
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(t, torch_dtype=torch.float32)
    with torch.no_grad():
        l2 = hf_loss(hf2, rows).loss.item()
    check(rel(ev["loss"], l2) < 1e-5, "%s: trained folder, cllm eval %.8f, transformers %.8f" % (arch, ev["loss"], l2))

    # 4. a PEFT adapter
    if arch == "mixtral":
        return
    a = os.path.join(d, "adapter")
    run([cllm, "train", "--model", m, "--out", a, "--steps", "2", "--lr", "1e-2", "--no-shuffle", "--lora-r", "4",
         "--lora-target", "all-linear"] + common)
    ev = json.loads(run([cllm, "eval", "--model", m, "--adapter", a] + common).strip().splitlines()[-1])
    base = transformers.AutoModelForCausalLM.from_pretrained(m, torch_dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(base, a)
    pm.eval()
    with torch.no_grad():
        l3 = hf_loss(pm, rows).loss.item()
    check(rel(ev["loss"], l3) < 1e-5, "%s: LoRA adapter, cllm eval %.8f, peft %.8f" % (arch, ev["loss"], l3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", default="build/cllm")
    ap.add_argument("--workdir")
    ap.add_argument("--arch", default="gpt2,llama,bloom,mixtral")
    a = ap.parse_args()
    print("transformers %s, peft %s, torch %s" % (transformers.__version__, peft.__version__, torch.__version__))
    wd = a.workdir or tempfile.mkdtemp(prefix="hf_interop_")
    cllm = os.path.abspath(a.cllm)
    for arch in a.arch.split(","):
        try:
            family(cllm, arch, wd)
        except Exception as e:  # one family's failure is reported, the others still run
            check(False, "%s: %s" % (arch, e))
    print("%d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
