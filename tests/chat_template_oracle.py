#!/usr/bin/env python3
"""Chat templates: cllm's renderer against two independent ones.

Templates: every chat_template of the fixture folders (shared/fixtures/hf/*/
tokenizer_config.json) and the public chat formats in tests/data/chat_templates/.
For each, message lists generated with a fixed seed (with or without a system
message, 1..8 turns, unicode, quotes, newlines, empty content, content as a
list of text parts, some with roles out of order), add_generation_prompt on
and off. The same cases are rendered by
  - tests/chat_template_render (cllm),
  - Jinja2 set up exactly as transformers' apply_chat_template sets it up
    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
    a generation tag, its tojson, raise_exception and strftime_now),
  - @huggingface/jinja (pinned in tests/npm, installed with npm ci into
    BUILD/npm; skipped with a line saying so when npm is missing).
cllm must equal Jinja2 on every case: the same text byte for byte, or an
error in both (for raise_exception with the same message). It must equal
@huggingface/jinja on every case where the two reference renderers agree;
cases where they disagree are listed by kind (KNOWN_JS_DIFFERENCES) and any
other disagreement fails the test.
"""
import argparse
import filecmp
import glob
import json
import os
import random
import shutil
import subprocess
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

# Where @huggingface/jinja 0.5 and Jinja2 (transformers) disagree, cllm follows
# Jinja2. Each disagreement must be one of these kinds (or the test fails).
def js_difference_kind(name, case, js, ref):
    if name == "features_jinja2.jinja":
        return "constructs @huggingface/jinja lacks or renders its own way (see the template's header)"
    if not ref["ok"] and js["ok"] and "TypeError" in ref["error"] and "concatenate" in ref["error"]:
        return ("a list of content parts added to a string: Jinja2 raises TypeError, "
                "@huggingface/jinja prints the list as JSON")
    if ref["ok"] and not js["ok"] and "ArrayValue filter: trim" in js["error"]:
        return "trim of a list: Jinja2 trims str(list), @huggingface/jinja has no trim for lists"
    if (name == "llama2_chat.jinja" and case["messages"][0]["role"] == "system"
            and case["messages"][0]["content"] == ""):
        return "'' != false: true in Python (different types), false in @huggingface/jinja"
    if (name == "features.jinja" and js["ok"] and ref["ok"]
            and any(ord(ch) > 0xFFFF for ch in json.dumps(case["messages"], ensure_ascii=False))):
        return ("length, reversing and slicing of text outside the Basic Multilingual Plane: Python counts "
                "code points, @huggingface/jinja UTF-16 units")
    return None


class GenerationTag(Extension):
    """transformers' {% generation %} tag: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class TemplateError(Exception):
    pass


def hf_environment():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_jinja2(env, cache, case):
    try:
        t = cache.get(case["template"])
        if t is None:
            t = cache[case["template"]] = env.from_string(case["template"])
        kw = {"messages": case["messages"], "tools": None, "documents": None,
              "add_generation_prompt": case["add_generation_prompt"]}
        for k in ("bos_token", "eos_token"):
            if case.get(k) is not None:
                kw[k] = case[k]
        kw.update(case.get("extra") or {})
        return {"ok": True, "text": t.render(**kw)}
    except TemplateError as e:
        return {"ok": False, "error": str(e), "raised": True}
    except Exception as e:  # noqa: BLE001 - any Jinja2 error is a failed render
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}


TEXTS = [
    "hello", "Hello, world.", "  padded with spaces  ", "line one\nline two\n", "", "it's a \"quote\"",
    "back\\slash and {{ braces }} and {% tags %}", "ünïcödé ✓ 日本語 🎉", "tab\tseparated\tvalues",
    "trailing newline\n\n", "What is 2 + 2?", "a", "ß and İ", "<s>[INST] fake tokens </s>", "\u00a0nbsp\u00a0",
]


def gen_messages(rng, parts_ok):
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": rng.choice(TEXTS)})
    turns = rng.randint(1, 8)
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        content = rng.choice(TEXTS)
        if parts_ok and rng.random() < 0.3:
            content = [{"type": "text", "text": rng.choice(TEXTS)} for _ in range(rng.randint(1, 3))]
        msgs.append({"role": role, "content": content})
    r = rng.random()
    if r < 0.08:  # roles out of order
        msgs.insert(0, {"role": "assistant", "content": "out of order"})
    elif r < 0.12:
        msgs.append({"role": msgs[-1]["role"], "content": "same role twice"})
    return msgs


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, in °C",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds \"a\" and 'b'",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}},
]


def gen_tool_messages(rng):
    msgs = gen_messages(rng, True)
    if rng.random() < 0.6:
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": rng.choice(["Paris", "Zürich"]), "days": 3}}}]})
        msgs.append({"role": "tool", "content": rng.choice(["21.5", '{"temp": 21.5}', "ünïcödé"])})
    return msgs


def load_templates(fixtures):
    out = []
    for cfg in sorted(glob.glob(os.path.join(fixtures, "*", "tokenizer_config.json"))):
        with open(cfg, encoding="utf-8") as f:
            c = json.load(f)
        ct = c.get("chat_template")
        if isinstance(ct, list):
            ct = next((x["template"] for x in ct if x.get("name") == "default"), None)
        if not isinstance(ct, str):
            continue

        def tok(v):
            return v.get("content") if isinstance(v, dict) else v
        out.append((os.path.basename(os.path.dirname(cfg)), ct, tok(c.get("bos_token")), tok(c.get("eos_token"))))
    for p in sorted(glob.glob(os.path.join(HERE, "data", "chat_templates", "*.jinja"))):
        with open(p, encoding="utf-8") as f:
            out.append((os.path.basename(p), f.read(), "<s>", "</s>"))
    return out


def trained_template(cllm, build, fixtures):
    """The chat_template `cllm train` writes into its output folder: a tiny
    LLaMA trained one step on conversation records with TinyLlama's
    tokenizer. Its render of a fixed conversation must be the default
    conversation format of docs/data.md."""
    work = os.path.abspath(os.path.join(build, "chat_template_oracle", "train"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tok = os.path.join(fixtures, "tinyllama-1.1b-chat-v1.0")
    data = os.path.join(work, "d.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.write(json.dumps({"type": "conversation", "rounds": [["ask", "Is 4 even?"], ["ans", "Yes."]]}) + "\n")
        f.write(json.dumps({"type": "conversation", "rounds": [["ask", "Is 5 even?"], ["ans", "No."]]}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for cmd in ([cllm, "init", "--arch", "llama", "--preset", "tiny", "--set", "vocab_size=32000", "--seed", "1",
                 "--out", os.path.join(work, "m")],
                [cllm, "train", "--model", os.path.join(work, "m"), "--data", data, "--tokenizer", tok,
                 "--out", os.path.join(work, "out"), "--steps", "1", "--batch-size", "2", "--seq-len", "32"]):
        r = subprocess.run(cmd, capture_output=True, env=env)
        if r.returncode != 0:
            sys.stderr.write(r.stderr.decode(errors="replace"))
            raise SystemExit("%s failed" % " ".join(cmd[:2]))
    with open(os.path.join(work, "out", "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    src = cfg.get("chat_template")
    if not isinstance(src, str):
        raise SystemExit("cllm train wrote no chat_template")
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        if not os.path.exists(os.path.join(work, "out", name)):
            raise SystemExit("cllm train did not write " + name)
    got = hf_environment().from_string(src).render(
        messages=[{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "Yes."},
                  {"role": "user", "content": "And 5?"}], add_generation_prompt=True,
        bos_token=cfg["bos_token"], eos_token=cfg["eos_token"], tools=None, documents=None)
    want = "<s>### Human:\nIs 4 even?\n\n### Assistant:\nYes.</s>\n\n### Human:\nAnd 5?\n\n### Assistant:\n"
    if got != want:
        raise SystemExit("the trained folder's template renders %r, want %r" % (got, want))
    print("cllm train wrote a chat_template that Jinja2 renders in the training format")
    return ("cllm-train-output", src, cfg["bos_token"], cfg["eos_token"])


def make_cases(templates, per_template, seed):
    rng = random.Random(seed)
    cases, names = [], []
    for name, src, bos, eos in templates:
        tools = name.startswith("tools")
        parts_ok = tools or name.startswith("features")
        for i in range(per_template):
            msgs = gen_tool_messages(rng) if tools else gen_messages(rng, parts_ok or rng.random() < 0.05)
            extra = {}
            if tools:
                extra["tools"] = TOOLS[:rng.randint(0, 2)] if rng.random() < 0.7 else None
                if rng.random() < 0.5:
                    extra["date_string"] = "25 Nov 2026"
            cases.append({"template": src, "messages": msgs, "add_generation_prompt": i % 2 == 1,
                          "bos_token": bos if rng.random() < 0.9 else None, "eos_token": eos, "extra": extra})
            names.append(name)
    return cases, names


def install_npm(build):
    dst = os.path.abspath(os.path.join(build, "npm"))
    os.makedirs(dst, exist_ok=True)
    src = os.path.join(HERE, "npm")
    ok = (os.path.exists(os.path.join(dst, "node_modules", "@huggingface", "jinja", "package.json"))
          and os.path.exists(os.path.join(dst, "package-lock.json"))
          and filecmp.cmp(os.path.join(src, "package-lock.json"), os.path.join(dst, "package-lock.json"),
                          shallow=False))
    for f in ("package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    shutil.copyfile(os.path.join(HERE, "chat_template_oracle.mjs"), os.path.join(dst, "chat_template_oracle.mjs"))
    if not ok:
        print("installing @huggingface/jinja: npm ci --ignore-scripts in", dst, flush=True)
        r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=dst,
                           capture_output=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace"))
            raise SystemExit("npm ci failed")
    return dst


def run_lines(cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr.decode(errors="replace"))
        raise SystemExit("%s failed (exit %d)" % (cmd[0], r.returncode))
    return [json.loads(x) for x in r.stdout.decode().splitlines()]


def show(s, n=300):
    r = repr(s)
    return r if len(r) <= n else r[:n] + "..."


def first_diff(a, b):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return "first difference at %d: cllm %s / reference %s" % (i, show(a[max(0, i - 20):i + 40]),
                                                                 show(b[max(0, i - 20):i + 40]))


def same(ours, ref):
    if ref["ok"]:
        return ours["ok"] and ours["text"] == ref["text"]
    if ours["ok"]:
        return False
    if ref.get("raised"):  # raise_exception: the template's own message
        return ours["error"] == "cllm_chat_template_render: " + ref["error"]
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm")
    ap.add_argument("--build", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--per-template", type=int, default=60)
    ap.add_argument("--seed", type=int, default=20261125)
    a = ap.parse_args()

    templates = load_templates(a.fixtures)
    if a.cllm:
        templates.append(trained_template(a.cllm, a.build, a.fixtures))
    fixture_names = [t[0] for t in templates if not t[0].endswith(".jinja")]
    if not fixture_names:
        raise SystemExit("no fixture folder has a chat_template under " + a.fixtures)
    cases, names = make_cases(templates, a.per_template, a.seed)
    work = os.path.join(a.build, "chat_template_oracle")
    os.makedirs(work, exist_ok=True)
    cases_path = os.path.abspath(os.path.join(work, "cases.jsonl"))
    with open(cases_path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")

    ours = run_lines([a.driver, cases_path])
    env, cache = hf_environment(), {}
    ref = [render_jinja2(env, cache, c) for c in cases]
    if len(ours) != len(cases):
        raise SystemExit("the driver printed %d results for %d cases" % (len(ours), len(cases)))

    js = None
    if shutil.which("npm") and shutil.which("node"):
        d = install_npm(a.build)
        js = run_lines(["node", os.path.join(d, "chat_template_oracle.mjs"), cases_path], cwd=d)
    else:
        print("skipped the @huggingface/jinja comparison: npm/node is not installed")

    fails, stats, js_diff = 0, {}, {}
    for i, (c, o, r) in enumerate(zip(cases, ours, ref)):
        s = stats.setdefault(names[i], [0, 0, 0, 0])  # cases, ok renders, errors, js disagreements
        s[0] += 1
        s[1 if r["ok"] else 2] += 1
        if not same(o, r):
            fails += 1
            if fails <= 8:
                print("MISMATCH %s case %d (add_generation_prompt=%s)" % (names[i], i, c["add_generation_prompt"]))
                print("  messages:", show(c["messages"], 400))
                if o["ok"] and r["ok"]:
                    print("  " + first_diff(o["text"], r["text"]))
                else:
                    print("  cllm:", show(o), "\n  jinja2:", show(r))
        if js is not None:
            j = js[i]
            js_same = (j["ok"] == r["ok"]) and (not r["ok"] or j["text"] == r["text"])
            if not js_same:
                s[3] += 1
                js_diff.setdefault(names[i], []).append((i, j, r))
    for name, s in stats.items():
        print("%-28s %3d cases: %3d rendered, %2d errors (raise_exception or type errors) in both; "
              "@huggingface/jinja differs from jinja2 on %d" % (name, s[0], s[1], s[2], s[3]))
    bad_js = 0
    for name, diffs in js_diff.items():
        kinds = {}
        for i, j, r in diffs:
            k = js_difference_kind(name, cases[i], j, r)
            if k is None:
                bad_js += 1
                if bad_js <= 4:
                    print("  %s case %d: @huggingface/jinja differs from jinja2 in an unexpected way" % (name, i))
                    if j["ok"] and r["ok"]:
                        print("    " + first_diff(j["text"], r["text"]).replace("cllm", "js"))
                    else:
                        print("    js:", show(j, 600))
                        print("    jinja2:", show(r, 600))
            else:
                kinds[k] = kinds.get(k, 0) + 1
        for k, cnt in kinds.items():
            print("  %s: %d cases where @huggingface/jinja differs (known: %s); cllm follows jinja2" % (name, cnt, k))
    print("%d cases, %d mismatches against jinja2, %d unexplained @huggingface/jinja differences"
          % (len(cases), fails, bad_js))
    return 1 if fails or bad_js else 0


if __name__ == "__main__":
    sys.exit(main())
