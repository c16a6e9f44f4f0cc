#!/usr/bin/env python3
"""`cllm data prepare` end to end, read back by an independent reader.

The MMIDIDX reader below is written from the format description (Megatron's
indexed dataset: magic, version, dtype code, counts, int32 lengths, int64
byte pointers, int64 document indices) and docs/formats/indexed-dataset.md
for the .mask file; it shares no code with cllm. Checked: layout and dtype,
EOS closing every pretrain document, masks per record type (the decoded
text of an instruct record is the Alpaca prompt + answer), identical output
with 1 and 2 workers, truncation report numbers, Megatron split counts,
bad-record messages and --skip-bad, interrupted runs (SIGTERM and SIGKILL)
leaving an existing dataset intact, and train/eval on a prepared prefix, a
raw JSONL file and a blend.
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
EOS = 50256
failures = []


def check(cond, what):
    if cond:
        print("ok  ", what)
    else:
        print("FAIL", what)
        failures.append(what)


def read_mmidx(prefix):
    with open(prefix + ".idx", "rb") as f:
        b = f.read()
    assert b[:9] == b"MMIDIDX\x00\x00", "magic"
    (version,) = struct.unpack_from("<Q", b, 9)
    assert version == 1, "version"
    code = b[17]
    n, nd = struct.unpack_from("<QQ", b, 18)
    off = 34
    lengths = np.frombuffer(b, np.int32, n, off)
    off += 4 * n
    pointers = np.frombuffer(b, np.int64, n, off)
    off += 8 * n
    docs = np.frombuffer(b, np.int64, nd, off)
    off += 8 * nd
    assert off == len(b), "idx size"
    dt = DTYPES[code]
    item = np.dtype(dt).itemsize
    tokens = np.fromfile(prefix + ".bin", dt)
    seqs = [tokens[p // item: p // item + ln] for p, ln in zip(pointers, lengths)]
    return {"code": code, "lengths": lengths, "pointers": pointers, "docs": docs, "tokens": tokens, "seqs": seqs,
            "item": item}


def fnv1a_lengths(lengths):
    h = 0xcbf29ce484222325
    for byte in np.asarray(lengths, "<i4").tobytes():
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_mask(prefix, d):
    with open(prefix + ".mask", "rb") as f:
        b = f.read()
    assert b[:8] == b"CLLMMASK", "mask magic"
    version, flags, seq_len, pad = struct.unpack_from("<IIIi", b, 8)
    n_seq, n_tok, bin_bytes, h = struct.unpack_from("<QQQQ", b, 24)
    split = struct.unpack_from("<3d", b, 56)
    assert version == 1
    assert n_seq == len(d["lengths"]) and n_tok == len(d["tokens"]) and bin_bytes == n_tok * d["item"]
    assert h == fnv1a_lengths(d["lengths"]), "lengths checksum"
    assert len(b) == 80 + (n_tok + 7) // 8, "mask size"
    bits = np.unpackbits(np.frombuffer(b, np.uint8, offset=80), bitorder="little")[:n_tok]
    return {"flags": flags, "seq_len": seq_len, "pad": pad, "split": split, "bits": bits}


def megatron_split(weights, n):
    w = [x / sum(weights) for x in weights]
    idx = [0]
    for x in w:
        idx.append(idx[-1] + int(round(x * float(n))))
    return [i - (idx[-1] - n) for i in idx]


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def digest(prefix):
    out = {}
    for ext in (".bin", ".idx", ".mask"):
        with open(prefix + ext, "rb") as f:
            out[ext] = hashlib.sha256(f.read()).hexdigest()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    cllm, gpt2 = a.cllm, os.path.join(a.fixtures, "gpt2")
    tmp = tempfile.mkdtemp(prefix="cllm_data_", dir=a.build)
    try:
        body(cllm, gpt2, a.data, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


def prepare(cllm, gpt2, inputs, out, *extra):
    r = run([cllm, "data", "prepare", "--input", *inputs, "--tokenizer", gpt2, "--out", out, *extra])
    rep = json.loads(r.stdout) if r.returncode == 0 else None
    return r, rep


def body(cllm, gpt2, data_dir, tmp):
    j = lambda *p: os.path.join(tmp, *p)
    recs = []
    for i in range(60):
        if i % 4 == 0:
            recs.append({"text": f"Document number {i}. " + "words " * (i % 17)})
        elif i % 4 == 1:
            recs.append({"instruction": f"Repeat {i}", "input": "x" * (i % 3), "output": "y " * (i % 11 + 1)})
        elif i % 4 == 2:
            recs.append({"type": "conversation", "rounds": [["ask", f"q{i}"], ["ask", "more"], ["ans", f"a{i}"]]})
        else:
            recs.append({"input_ids": [i, i + 1, i + 2]})
    with open(j("mix.jsonl"), "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    with open(j("book.txt"), "w") as f:
        f.write("Para one.\nStill one.\n\nPara two.\n\n\nPara three.\n")
    seed = os.path.join(data_dir, "seed003.json")
    inputs = [j("mix.jsonl"), seed, j("book.txt")]

    # 1 and 2 workers: identical bytes.
    r1, rep1 = prepare(cllm, gpt2, inputs, j("w1"))
    r2, rep2 = prepare(cllm, gpt2, inputs, j("w2"), "--workers", "2")
    check(r1.returncode == 0 and r2.returncode == 0, "prepare succeeds")
    check(digest(j("w1")) == digest(j("w2")), "identical .bin/.idx/.mask with 1 and 2 workers")
    r3, _ = prepare(cllm, gpt2, inputs, j("new", "sub", "w3"))
    check(r3.returncode == 0 and digest(j("new", "sub", "w3")) == digest(j("w1")),
          "the output prefix's missing folders are created: " + r3.stderr.strip())
    d = read_mmidx(j("w1"))
    m = read_mask(j("w1"), d)
    n = 60 + 5 + 3
    check(d["code"] == 8, "GPT-2 vocabulary -> uint16 tokens (dtype code 8)")
    check(len(d["lengths"]) == n and rep1["records"] == n, "one sequence per record")
    check(list(d["docs"]) == list(range(n + 1)), "one document per sequence")
    check(list(d["pointers"]) == list(np.concatenate([[0], np.cumsum(d["lengths"][:-1]) * 2])),
          "pointers are byte offsets, back to back")
    check(rep1["by_type"] == {"pretrain": 15 + 1 + 3, "instruct": 15 + 2, "conversation": 15 + 1, "ref_qa": 1,
                              "tokens": 15}, "record types counted: " + json.dumps(rep1["by_type"]))
    bits = m["bits"]
    starts = np.concatenate([[0], np.cumsum(d["lengths"])])
    pre = [i for i in range(60) if i % 4 == 0] + [60] + [65, 66, 67]
    check(all(d["seqs"][i][-1] == EOS for i in pre), "every pretrain document ends with EOS")
    check(all(bits[starts[i]:starts[i + 1]].all() for i in pre), "pretrain: every token trained")
    ok = True
    for i in [k for k in range(60) if k % 4 in (1, 2)]:
        b = bits[starts[i]:starts[i + 1]]
        first = int(np.argmax(b))
        ok &= not b[0] and b[first:].all() and d["seqs"][i][-1] == EOS and b[-1]
    check(ok, "instruct/conversation: prompt masked, answer and closing EOS trained")
    check(all(list(d["seqs"][i]) == recs[i]["input_ids"] for i in range(3, 60, 4)), "input_ids kept")
    check(m["flags"] == 0 and m["pad"] == EOS, "mask header: not packed, pad = EOS")
    # Decoded instruct record 1: the Alpaca prompt with input, then the answer.
    with open(j("ids.json"), "w") as f:
        json.dump([int(x) for x in d["seqs"][1]], f)
    dec = run([cllm, "detokenize", "--tokenizer", gpt2, "--input", j("ids.json")]).stdout
    want = ("Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n### Instruction:\nRepeat 1\n\n"
            "### Input:\nx\n\n### Response:\ny y <|endoftext|>")
    check(dec == want, "instruct record decodes to the Alpaca rendering: " + repr(dec[-60:]))
    ans = d["seqs"][1][bits[starts[1]:starts[2]].astype(bool)]
    with open(j("ans.json"), "w") as f:
        json.dump([int(x) for x in ans], f)
    dec = run([cllm, "detokenize", "--tokenizer", gpt2, "--input", j("ans.json")]).stdout
    check(dec == "y y <|endoftext|>", "trained tokens decode to the answer + EOS: " + repr(dec))

    # A vocabulary past 65536 ids (GPT-2 plus an added token at id 70000)
    # makes prepare write int32 tokens, and the token survives as written.
    big = j("gpt2-big")
    os.makedirs(big, exist_ok=True)
    with open(os.path.join(gpt2, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    tok["added_tokens"].append({"id": 70000, "content": "<|far|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    with open(os.path.join(big, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f)
    with open(j("far.jsonl"), "w") as f:
        f.write(json.dumps({"text": "near <|far|> away"}) + "\n")
    r5, _ = prepare(cllm, big, [j("far.jsonl")], j("far"))
    check(r5.returncode == 0, "prepare with a 70001-id vocabulary: " + r5.stderr[-300:])
    if r5.returncode == 0:
        df = read_mmidx(j("far"))
        check(df["code"] == 4 and df["item"] == 4, "vocabulary > 65536 -> int32 tokens (dtype code 4)")
        check(70000 in df["seqs"][0].tolist() and df["seqs"][0][-1] == EOS,
              "int32 sequence holds id 70000 and ends with EOS: %s" % df["seqs"][0].tolist())

    # Truncation report, split counts and the packed flag.
    r3, rep3 = prepare(cllm, gpt2, inputs, j("t"), "--seq-len", "24", "--split", "8,1,1")
    L = d["lengths"].astype(np.int64)
    check(rep3["truncated"] == int((L > 24).sum()) and rep3["tokens_cut"] == int(np.maximum(L - 24, 0).sum())
          and rep3["max_cut"] == int(max(L.max() - 24, 0)),
          f"truncation report {rep3['truncated']} / {rep3['tokens_cut']} / {rep3['max_cut']}")
    dt = read_mmidx(j("t"))
    check(list(dt["lengths"]) == list(np.minimum(L, 24)), "samples truncated to --seq-len")
    b = megatron_split([8, 1, 1], n)
    check(rep3["split_docs"] == [b[1] - b[0], b[2] - b[1], b[3] - b[2]], f"split documents {rep3['split_docs']}")
    mt = read_mask(j("t"), dt)
    check(abs(mt["split"][0] - 0.8) < 1e-12 and mt["seq_len"] == 24, "split weights and seq_len stored")
    r4, _ = prepare(cllm, gpt2, [j("mix.jsonl")], j("p"), "--pack")
    check(r4.returncode == 0 and read_mask(j("p"), read_mmidx(j("p")))["flags"] == 1, "--pack sets the packed flag")

    # Bad records: FILE:LINE:COL, then --skip-bad.
    with open(j("bad.jsonl"), "w") as f:
        f.write('{"text": "fine"}\n{"type": "chat", "text": "x"}\n{"text": "fine"}\n{"instruct": "i", "output": ""}\n')
    r5, _ = prepare(cllm, gpt2, [j("bad.jsonl")], j("bad"))
    check(r5.returncode == 1 and f"{j('bad.jsonl')}:2:2: unknown type \"chat\"" in r5.stderr,
          "bad record stops the run with FILE:LINE:COL: " + r5.stderr.strip()[-200:])
    check(not os.path.exists(j("bad.bin")) and not os.path.exists(j("bad.idx")), "failed run leaves no dataset")
    r6, rep6 = prepare(cllm, gpt2, [j("bad.jsonl")], j("bad"), "--skip-bad", "2")
    check(r6.returncode == 0 and rep6["bad"] == 2 and rep6["records"] == 2 and
          f"{j('bad.jsonl')}:4:19: empty text in field \"output\"" in rep6["bad_first"][1],
          "--skip-bad 2 skips and reports both: " + json.dumps(rep6 and rep6["bad_first"]))
    r7, _ = prepare(cllm, gpt2, [j("bad.jsonl")], j("bad"), "--skip-bad", "1")
    check(r7.returncode == 1 and "more bad records than --skip-bad allows" in r7.stderr, "--skip-bad 1 is not enough")

    # Interrupted runs keep the previous dataset and leave no final files.
    with open(j("big.jsonl"), "w") as f:
        line = json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 40}) + "\n"
        f.write(line * 6000)
    good = digest(j("w1"))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for target in ("w1", "fresh"):
            p = subprocess.Popen([cllm, "data", "prepare", "--input", j("big.jsonl"), "--tokenizer", gpt2, "--out",
                                  j(target)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            tmpbin = j(f"{target}.bin.tmp.{p.pid}")
            t0 = time.time()
            while not os.path.exists(tmpbin) and p.poll() is None and time.time() - t0 < 30:
                time.sleep(0.01)
            time.sleep(0.2)
            p.send_signal(sig)
            err = p.communicate()[1].decode()
            check(p.returncode != 0, f"{sig.name} to {target}: the run stops ({p.returncode})")
            if target == "w1":
                check(digest(j("w1")) == good, f"{sig.name}: the previous dataset is intact")
            else:
                check(not any(os.path.exists(j("fresh" + e)) for e in (".bin", ".idx", ".mask")),
                      f"{sig.name}: no final files for a new prefix")
            left = [x for x in os.listdir(tmp) if ".tmp." in x]
            if sig == signal.SIGTERM:
                check(not left and "interrupted" in err, f"SIGTERM: temporary files removed ({left})")
            for x in left:
                os.remove(j(x))

    # The shipped examples, with the example template.
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data")
    files = [os.path.join(ex, f) for f in ("pretrain.jsonl", "instruct.json", "conversation.jsonl", "tokens.jsonl",
                                             "book.txt")]
    r, rep = prepare(cllm, gpt2, files, j("ex"), "--template", os.path.join(ex, "template.json"))
    check(r.returncode == 0 and rep["records"] == 13 and rep["bad"] == 0, "examples/data prepare cleanly")

    # train / eval on a prepared prefix, a raw JSONL file and a blend.
    model = j("model")
    r = run([cllm, "init", "--arch", "gpt2", "--preset", "tiny", "--set", "vocab_size=50257", "--out", model])
    check(r.returncode == 0, "init a tiny GPT-2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(gpt2, name), model)
    specs = {"prefix": j("w1"), "raw": j("mix.jsonl"), "blend": f"0.7 {j('w1')} 0.3 {j('mix.jsonl')}",
             "packed": j("p")}
    for name, spec in specs.items():
        r = run([cllm, "train", "--model", model, "--data", spec, "--out", j("out_" + name), "--steps", "2",
                 "--batch-size", "2", "--seq-len", "32", "--log-every", "100"])
        check(r.returncode == 0 and os.path.exists(j("out_" + name, "metrics.jsonl")),
              f"train on {name}: {r.stderr.strip()[-300:]}")
        r = run([cllm, "eval", "--model", model, "--data", spec, "--seq-len", "32", "--batch-size", "8"])
        ok = r.returncode == 0 and np.isfinite(json.loads(r.stdout)["loss"])
        check(ok, f"eval on {name}: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    r = run([cllm, "eval", "--model", model, "--data", j("t"), "--split", "valid", "--seq-len", "32"])
    check(r.returncode == 0 and json.loads(r.stdout)["tokens"] > 0, "eval on the stored valid split")


if __name__ == "__main__":
    sys.exit(main())
