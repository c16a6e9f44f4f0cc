#!/usr/bin/env python3
"""Checks a reward model's LoRA adapter written by cllm against HF transformers
+ peft: the base folder is loaded with AutoModelForSequenceClassification
(num_labels 1), the adapter folder with peft's PeftModel.from_pretrained
(task_type SEQ_CLS: the LoRA matrices and the trained score head), every
record of a small JSONL file is scored, and the rewards are compared with
those `cllm score` wrote for the same file.

    cllm score --model BASE --adapter ADAPTER --data texts.jsonl --out cllm.jsonl
    python3 scripts/hf_interop_reward_lora.py --base BASE --adapter ADAPTER \\
        --data texts.jsonl --scores cllm.jsonl

BASE is the model folder the adapter was trained on (`base_model_name_or_path`
of adapter_config.json): a reward model folder, or the causal LM that
`cllm train --task reward` turned into one (its score head is the adapter's;
pad_token_id is set to eos_token_id when the config has none, as cllm does).

Records, one JSON object a line, as `cllm score` reads them:
  {"input_ids": [...]}                          scored as given (exact)
  {"text": "..."} / {"prompt": ..., "completion": ...}
                                                tokenized with the base
                                                folder's tokenizer as cllm
                                                does (BOS where it adds
                                                one, the texts, EOS)
  preference pairs: input_ids_chosen / input_ids_rejected,
  (prompt_)chosen_input_ids / rejected_input_ids, or prompt / chosen /
  rejected texts: both rows.
Each row keeps its last --seq-len tokens and is scored alone (no padding) at
the last token that is not pad_token_id (transformers' rule).

Prints the largest absolute difference; exits 1 when it exceeds --tol
(1e-4), 2 on bad input, 0 otherwise. Prints "skipped: transformers/peft not
installed" and exits 0 where those packages are missing.
"""
import argparse
import json
import sys


def rows_of(rec, tok, T):
    """The token rows of one record, built as cllm's loader builds them: one
    for a single text, two for a pair. Texts: [BOS where the tokenizer adds
    one] + prompt ids + completion ids + [EOS], each text encoded without
    special tokens."""
    def enc(s):
        return list(tok(s, add_special_tokens=False)["input_ids"])

    def text_rows(prompt, completions):
        if tok is None:
            raise ValueError("text records need a tokenizer in the base folder")
        bos = tok.bos_token_id
        p = [bos] if bos is not None and tok("a")["input_ids"][:1] == [bos] else []
        if prompt is not None:
            p += enc(prompt)
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return [p + enc(c) + eos for c in completions]

    if "input_ids_chosen" in rec:
        rows = [rec["input_ids_chosen"], rec["input_ids_rejected"]]
    elif "chosen_input_ids" in rec:
        p = rec.get("prompt_input_ids", [])
        rows = [p + rec["chosen_input_ids"], p + rec["rejected_input_ids"]]
    elif "input_ids" in rec:
        rows = [rec["input_ids"]]
    elif "chosen" in rec:
        if not isinstance(rec["chosen"], str):
            raise ValueError("conversational records: use input_ids records here")
        rows = text_rows(rec.get("prompt"), [rec["chosen"], rec["rejected"]])
    elif "text" in rec:
        rows = text_rows(rec.get("prompt"), [rec["text"]])
    elif "completion" in rec:
        rows = text_rows(rec.get("prompt"), [rec["completion"]])
    else:
        raise ValueError("unknown record keys %s" % sorted(rec))
    return [list(r)[-T:] for r in rows]


def cllm_rewards(path):
    """The rewards of `cllm score`'s JSON lines, in record order."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            x = json.loads(line)
            if "reward" in x:
                out.append([x["reward"]])
            elif "chosen_reward" in x:
                out.append([x["chosen_reward"], x["rejected_reward"]])
            else:
                raise ValueError("%s:%d: neither reward nor chosen_reward" % (path, n))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="base model folder (reward model or causal LM)")
    ap.add_argument("--adapter", required=True, help="PEFT adapter folder written by cllm (task_type SEQ_CLS)")
    ap.add_argument("--data", required=True, help="JSONL records scored by cllm score")
    ap.add_argument("--scores", required=True, help="cllm score's JSON lines for --data")
    ap.add_argument("--seq-len", type=int, default=512, help="cllm score's --seq-len (default 512)")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest absolute difference allowed (default 1e-4)")
    a = ap.parse_args()
    try:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError:
        print("skipped: transformers/peft not installed")
        return 0
    with open(a.adapter + "/adapter_config.json") as f:
        conf = json.load(f)
    if conf.get("task_type") != "SEQ_CLS" or "score" not in (conf.get("modules_to_save") or []):
        print("%s/adapter_config.json: not a reward model's adapter (task_type %r, modules_to_save %r)" %
              (a.adapter, conf.get("task_type"), conf.get("modules_to_save")), file=sys.stderr)
        return 2
    model = AutoModelForSequenceClassification.from_pretrained(a.base, num_labels=1, torch_dtype=torch.float32)
    if model.config.pad_token_id is None and model.config.eos_token_id is not None:
        model.config.pad_token_id = model.config.eos_token_id  # what cllm's conversion writes
    model = PeftModel.from_pretrained(model, a.adapter)
    model.eval()
    try:
        tok = AutoTokenizer.from_pretrained(a.base)
    except (OSError, ValueError):
        tok = None
    want = cllm_rewards(a.scores)
    got = []
    with open(a.data) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    if len(recs) != len(want):
        print("%s has %d records, %s %d lines" % (a.data, len(recs), a.scores, len(want)), file=sys.stderr)
        return 2
    with torch.no_grad():
        for rec in recs:
            got.append([float(model(input_ids=torch.tensor([r])).logits[0, 0]) for r in rows_of(rec, tok, a.seq_len)])
    worst, where = 0.0, None
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            print("record %d: %d rewards from transformers, %d from cllm" % (i, len(g), len(w)), file=sys.stderr)
            return 2
        for x, y in zip(g, w):
            if abs(x - y) >= worst:
                worst, where = abs(x - y), i
    n = sum(len(g) for g in got)
    print("%d rewards of %d records: max abs difference %.3g (record %s), tolerance %.3g" %
          (n, len(recs), worst, where, a.tol))
    return 1 if worst > a.tol else 0


if __name__ == "__main__":
    sys.exit(main())
