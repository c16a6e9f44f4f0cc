#!/usr/bin/python3
"""Conversational preference records (docs/alignment.md) against a reference.

Records whose "prompt", "chosen" and "rejected" are message lists (trl's
conversational format; also the implicit prompt, where chosen and rejected
are whole conversations sharing their first messages, a prompt ending in an
assistant message that the completions continue, and content given as a
list of text parts). For each tokenizer fixture the test builds the rows trl
builds, independently of cllm's renderer:
  - TinyLlama: its tokenizer_config.json chat_template rendered by Jinja2 set
    up as transformers sets it up (tests/chat_template_oracle.py);
  - GPT-2 (no chat template): cllm's conversation format written out here
    ("### Human:\\n...\\n\\n### Assistant:\\n...<|endoftext|>", no BOS since
    GPT-2's BOS is its EOS);
then trl's apply_chat_template rules: the prompt rendered with the generation
prompt after a user message (cut after the final message's stripped content
when it is the assistant's: continue_final_message), each completion the
render of prompt + completion minus the prompt's text, and without "prompt"
the messages chosen and rejected share (extract_prompt). Texts are encoded
without special tokens (`cllm tokenize --no-special`, itself checked against
HF's tokenizers elsewhere), each completion followed by EOS.
Checks: `cllm data prepare --pairs` writes byte-identical datasets for the
conversational records and the pre-tokenized reference ids (the token ids
and prompt masks); DPO and reward training on them equal training on the ids
(loss and weights bit for bit); bad records fail naming FILE:LINE and the key.

  /usr/bin/python3 tests/dpo_chat_test.py --cllm build/cllm --fixtures DIR
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
import hf_models as hm  # noqa: E402
from chat_template_oracle import hf_environment  # noqa: E402

FAILED = []


def check(name, ok, detail=""):
    print("%s  %s%s" % ("ok  " if ok else "FAIL", name, ("  " + detail) if detail and not ok else ""))
    if not ok:
        FAILED.append(name)
    return ok


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def write_jsonl(path, recs):
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def msg(role, content):
    return {"role": role, "content": content}


RECORDS = [
    {"prompt": [msg("system", "Be brief."), msg("user", "Is 7 even?")],
     "chosen": [msg("assistant", "No, 7 is odd.")], "rejected": [msg("assistant", "Yes.")]},
    # implicit prompt: three shared messages
    {"chosen": [msg("user", "Hi"), msg("assistant", "Hello! How can I help?"), msg("user", "Name a colour."),
                msg("assistant", "Blue.")],
     "rejected": [msg("user", "Hi"), msg("assistant", "Hello! How can I help?"), msg("user", "Name a colour."),
                  msg("assistant", "The number twelve, naturally.")]},
    # a prompt ending in the assistant's unfinished turn (continue_final_message)
    {"prompt": [msg("user", "Count to five."), msg("assistant", "1, 2, 3,")],
     "chosen": [msg("assistant", " 4, 5.")], "rejected": [msg("assistant", " 7, 9?")]},
    {"prompt": [msg("user", "Say hello\nin ünïcödé ✓")], "chosen": [msg("assistant", "Hello there!")],
     "rejected": [msg("assistant", "Goodbye"), msg("user", "Why?"), msg("assistant", "Just because.")]},
]
# content as a list of text parts (the default template joins them)
PARTS = {"prompt": [msg("user", [{"type": "text", "text": "Is 4 "}, {"type": "text", "text": "even?"}])],
         "chosen": [msg("assistant", "Yes.")], "rejected": [msg("assistant", [{"type": "text", "text": "No."}])]}


def text_of(c):
    return c if isinstance(c, str) else "".join(p["text"] for p in c if p.get("type") == "text")


def cllm_format(messages, add_generation_prompt, eos):
    """cllm's conversation format (docs/data.md), written out."""
    out, prev = "", ""
    for m in messages:
        if m["role"] == "system":
            out += text_of(m["content"])
            continue
        if prev == "ans":
            out += "\n\n"
        if m["role"] == "user":
            out += "### Human:\n" + text_of(m["content"]) + "\n\n"
            prev = "ask"
        else:
            out += "### Assistant:\n" + text_of(m["content"]) + eos
            prev = "ans"
    if add_generation_prompt:
        out += ("\n\n" if prev == "ans" else "") + "### Assistant:\n"
    return out


def trl_texts(rec, render):
    """trl's extract_prompt + apply_chat_template for one record."""
    if "prompt" in rec:
        prompt, chosen, rejected = rec["prompt"], rec["chosen"], rec["rejected"]
    else:
        k = 0
        while k < min(len(rec["chosen"]), len(rec["rejected"])) and rec["chosen"][k] == rec["rejected"][k]:
            k += 1
        prompt, chosen, rejected = rec["chosen"][:k], rec["chosen"][k:], rec["rejected"][k:]
    last = prompt[-1]["role"] if prompt else None
    p = render(prompt, last == "user") if prompt else ""
    if last == "assistant":  # transformers' continue_final_message
        final = prompt[-1]["content"].strip()
        p = p[:p.rindex(final) + len(final)]
    out = [p]
    for comp in (chosen, rejected):
        full = render(prompt + comp, False)
        assert full.startswith(p)
        out.append(full[len(p):])
    return out


def reference_ids(cllm, tmp, tok, records, render, eos_id):
    cache = {}

    def encode(s):
        if s not in cache:
            path = os.path.join(tmp, "t.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(s)
            cache[s] = json.loads(run([cllm, "tokenize", "--tokenizer", tok, "--input", path,
                                       "--no-special"]).stdout)["ids"]
        return cache[s]

    out = []
    for rec in records:
        p, c, r = trl_texts(rec, render)
        out.append({"prompt_input_ids": encode(p), "chosen_input_ids": encode(c) + [eos_id],
                    "rejected_input_ids": encode(r) + [eos_id]})
    return out


def case_tokenizer(cllm, tmp, fixtures, name):
    tok = os.path.join(fixtures, name)
    if not check("%s: tokenizer fixture at %s" % (name, tok), os.path.exists(os.path.join(tok, "tokenizer.json"))):
        return
    with open(os.path.join(tok, "tokenizer_config.json"), encoding="utf-8") as f:
        tcfg = json.load(f)
    if name == "gpt2":
        eos, eos_id, V = "<|endoftext|>", 50256, 50257
        records = RECORDS + [PARTS]

        def render(messages, gen):
            return cllm_format(messages, gen, eos)
    else:
        eos_id, V = 2, 32000
        records = RECORDS
        tmpl = hf_environment().from_string(tcfg["chat_template"])

        def render(messages, gen):
            return tmpl.render(messages=messages, add_generation_prompt=gen, bos_token=tcfg["bos_token"],
                               eos_token=tcfg["eos_token"], tools=None, documents=None)
    chat, ids = os.path.join(tmp, name + ".chat.jsonl"), os.path.join(tmp, name + ".ids.jsonl")
    write_jsonl(chat, records)
    write_jsonl(ids, reference_ids(cllm, tmp, tok, records, render, eos_id))
    same = True
    for kind, data in (("chat", chat), ("ids", ids)):
        r = run([cllm, "data", "prepare", "--pairs", "--input", data, "--tokenizer", tok, "--out",
                 os.path.join(tmp, "%s.%s" % (name, kind))])
        if not check("%s: data prepare --pairs on the %s records" % (name, kind), r.returncode == 0, r.stderr[-400:]):
            return
    for ext in (".bin", ".idx", ".mask"):
        same &= filecmp.cmp(os.path.join(tmp, name + ".chat" + ext), os.path.join(tmp, name + ".ids" + ext), False)
    check("%s: data prepare --pairs: the chat records' token ids and prompt masks are the reference's (%d pairs)"
          % (name, len(records)), same)
    arch = "gpt2" if name == "gpt2" else "llama"
    cfg = hm.make_config(arch, vocab_size=V, **({"n_positions": 64} if arch == "gpt2" else {}))
    mdir = os.path.join(tmp, name + ".model")
    hm.save_hf_folder(mdir, cfg, hm.init_params(cfg, seed=9))
    tasks = [("dpo", ["--reference-free"])] + ([("reward", [])] if name == "gpt2" else [])
    for task, extra in tasks:
        outs = []
        for kind, data in (("chat", chat), ("ids", ids)):
            out = os.path.join(tmp, "%s.%s.%s" % (name, task, kind))
            r = run([cllm, "train", "--task", task, "--model", mdir, "--data", data, "--out", out, "--steps", "1",
                     "--batch-size", str(len(records)), "--seq-len", "64", "--optimizer", "sgd", "--lr", "1",
                     "--no-shuffle", "--log", "quiet", "--peak-gflops", "1", "--tokenizer", tok] + extra)
            if not check("%s: %s on the %s records" % (name, task, kind), r.returncode == 0, r.stderr[-400:]):
                return
            outs.append(out)
        with open(os.path.join(outs[0], "metrics.jsonl")) as f:
            a = [json.loads(x) for x in f if x.strip()][-1]
        with open(os.path.join(outs[1], "metrics.jsonl")) as f:
            b = [json.loads(x) for x in f if x.strip()][-1]
        same = filecmp.cmp(os.path.join(outs[0], "model.safetensors"), os.path.join(outs[1], "model.safetensors"),
                           False)
        check("%s: %s on chat records = on the reference ids (loss %r, weights bit for bit)" % (name, task, a["loss"]),
              a["loss"] == b["loss"] and same, "%r vs %r" % (a["loss"], b["loss"]))


def case_errors(cllm, tmp, fixtures):
    tok = os.path.join(fixtures, "gpt2")
    good = RECORDS[0]
    bad = [
        ({"prompt": "Is 7 even?", "chosen": good["chosen"], "rejected": good["rejected"]},
         '"prompt": expected a list of messages'),
        ({"prompt": good["prompt"], "chosen": [{"content": "No."}], "rejected": good["rejected"]},
         '"chosen"[0]: expected a message'),
        ({"prompt": good["prompt"], "chosen": good["chosen"], "rejected": ["Yes."]}, '"rejected"[0]: expected a message'),
        ({"chosen": RECORDS[1]["chosen"], "rejected": RECORDS[1]["chosen"]}, "empty chosen completion"),
        ({"prompt": [msg("tool", "42")], "chosen": good["chosen"], "rejected": good["rejected"]},
         '"prompt": the chat template failed'),
    ]
    for i, (rec, want) in enumerate(bad):
        path = os.path.join(tmp, "bad%d.jsonl" % i)
        write_jsonl(path, [good, rec])
        r = run([cllm, "data", "prepare", "--pairs", "--input", path, "--tokenizer", tok, "--out",
                 os.path.join(tmp, "bad%d" % i)])
        check("errors: %s names FILE:LINE" % want, r.returncode != 0 and ("%s:2:1: %s" % (path, want)) in r.stderr,
              r.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", default=None)
    ap.add_argument("--fixtures", default=os.path.join(HERE, "..", "..", "shared", "fixtures", "hf"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cllm-dpo-chat-")
    try:
        for name in ("gpt2", "tinyllama-1.1b-chat-v1.0"):
            case_tokenizer(a.cllm, tmp, a.fixtures, name)
        case_errors(a.cllm, tmp, a.fixtures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
