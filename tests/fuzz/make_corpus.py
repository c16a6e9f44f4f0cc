#!/usr/bin/env python3
"""Writes the hand-made seed inputs of tests/fuzz/corpus/ (standard library
only). Usage: make_corpus.py FIXTURES_DIR (the shared fixtures folder with
hf/gpt2, hf/tinyllama-1.1b-chat-v1.0, ...). Cut-down copies of the fixture
tokenizers keep each seed a few KB. Inputs found by fuzzing (regressions)
are added to the corpus by hand and are not written here."""
import json, os, struct, sys, zlib

SEP = b"\n--8<--\n"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
FIX = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/fixtures"


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def jdump(o):
    return json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode()


# ------------------------------------------------------------ safetensors
def st_file(tensors, meta=None):
    hdr, data = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda xs: struct.pack("<%df" % len(xs), *xs)
put("safetensors", "raw_f32", b"\x00" + st_file([("w", "F32", [2, 3], f32([1, 2, 3, 4, 5, 6]))], {"format": "pt"}))
put("safetensors", "raw_mixed", b"\x02" + st_file([
    ("a", "F16", [4], struct.pack("<4e", 1, -2, 0.5, 65504)),
    ("b", "BF16", [2, 1], struct.pack("<2H", 0x3f80, 0xc000)),
    ("c", "I64", [2], struct.pack("<2q", 7, -1)),
    ("d", "U8", [3], b"\x01\x02\x03"),
    ("e", "F32", [], f32([3.5])),
    ("z", "F32", [0, 4], b""),
]))
put("safetensors", "raw_bad_overlap", b"\x00" + struct.pack("<Q", 96) + json.dumps(
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode().ljust(96) + bytes(12))
# Builder mode (odd first byte): the bytes are fields, see fuzz_safetensors.c.
# mode, count-1, metadata, then per tensor: dtype | ndim << 3 | repeat-name << 7, the dims, an offsets mode
# (+ its bytes); then shard kind, padding, data length delta + 2, and the data bytes.
put("safetensors", "built_one", bytes([1, 0, 1, 0 | 2 << 3, 2, 3, 0, 2, 0, 2]) + bytes(range(24)))
put("safetensors", "built_three_set", bytes([3, 2, 1, 0 | 1 << 3, 4, 0, 1 | 2 << 3, 2, 2, 0, 2 | 3 << 3,
                                           1, 2, 3, 1, 2, 2, 2, 1, 2]) + bytes(range(36)))
put("safetensors", "built_dup_name", bytes([1, 1, 0, 0 | 1 << 3, 2, 0, 0x80 | 1 << 3, 2, 0, 2, 0, 2]) + bytes(16))
put("safetensors", "built_overlap", bytes([1, 1, 0, 0 | 1 << 3, 2, 0, 3 | 1 << 3, 2, 3, 2, 0, 2]) + bytes(16))
put("safetensors", "built_huge_dims", bytes([1, 1, 0, 0 | 4 << 3, 242, 243, 2, 1, 0, 1 | 1 << 3, 241, 0, 2, 0, 2])
    + bytes(16))

# ------------------------------------------------------------ model config
for fam in ("gpt2", "mistral-7b-v0.1", "tinyllama-1.1b-chat-v1.0"):
    p = os.path.join(FIX, "hf", fam, "config.json")
    if os.path.exists(p):
        put("model_config", fam, open(p, "rb").read())
put("model_config", "bloom", jdump({
    "model_type": "bloom", "vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 4,
    "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "apply_residual_connection_post_layernorm": False,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}))
put("model_config", "llama_gqa", jdump({
    "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "rope_scaling": None}))

# ------------------------------------------------------------ train config
ex = os.path.join(os.path.dirname(ROOT), "..", "..", "examples", "configs")
for n in sorted(os.listdir(ex)):
    put("train_config", n.replace(".json", ""), open(os.path.join(ex, n), "rb").read() + b"\x03")

# ------------------------------------------------------------ tokenizer
def cut_bpe(src, keep_ids, n_merges):
    t = json.load(open(src, encoding="utf-8"))
    m = t["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep_ids}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
        if len(merges) >= n_merges:
            break
    m["vocab"], m["merges"] = vocab, merges
    t["added_tokens"] = [a for a in t.get("added_tokens", []) if a["id"] < keep_ids or True][:4]
    return json.dumps(t, ensure_ascii=False, separators=(",", ":")).encode()


gpt2 = os.path.join(FIX, "hf", "gpt2", "tokenizer.json")
if os.path.exists(gpt2):
    put("tokenizer", "gpt2_cut", cut_bpe(gpt2, 300, 44))
    put("tokenizer", "gpt2_cut_config", cut_bpe(gpt2, 300, 44) + SEP +
        open(os.path.join(FIX, "hf", "gpt2", "tokenizer_config.json"), "rb").read())
tl = os.path.join(FIX, "hf", "tinyllama-1.1b-chat-v1.0", "tokenizer.json")
if os.path.exists(tl):
    put("tokenizer", "llama_cut", cut_bpe(tl, 300, 40) + SEP +
        open(os.path.join(FIX, "hf", "tinyllama-1.1b-chat-v1.0", "tokenizer_config.json"), "rb").read())
base = {"version": "1.0", "truncation": None, "padding": None}
put("tokenizer", "bpe_bert_like", jdump(dict(base, added_tokens=[
    {"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
    {"id": 1, "content": "[CLS]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
    {"id": 2, "content": "[SEP]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
    normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}, {"type": "Strip", "left": True, "right": True}]},
    pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "Digits", "individual_digits": True}]},
    post_processor={"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]},
    decoder=None,
    model={"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": None,
           "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False,
           "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "h": 3, "e": 4, "l": 5, "o": 6, "el": 7, "ll": 8,
                     "w": 9, "r": 10, "d": 11, "2": 12, "0": 13, "4": 14},
           "merges": ["e l", "l l"]})))
put("tokenizer", "bpe_metaspace", jdump(dict(base, added_tokens=[],
    normalizer={"type": "NFKC"},
    pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
    post_processor=None,
    decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
    model={"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
           "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False,
           "vocab": {"<unk>": 0, "\u2581": 1, "h": 2, "e": 3, "l": 4, "o": 5, "\u2581h": 6, "ll": 7, "\u2581he": 8},
           "merges": ["\u2581 h", "l l", "\u2581h e"]})))
put("tokenizer", "bpe_split_regex", jdump(dict(base, added_tokens=[
    {"id": 6, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
    normalizer={"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
    pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    post_processor={"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|end|>", "type_id": 0}}], "pair": [],
                    "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [6], "tokens": ["<|end|>"]}}},
    decoder={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    model={"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
           "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "He": 4, "ll": 5}, "merges": ["H e", "l l"]})))

# ------------------------------------------------------------ sample / records
dd = os.path.join(os.path.dirname(ROOT), "..", "..", "examples", "data")
tmpl = open(os.path.join(dd, "template.json"), "rb").read()
recs = {
    "pretrain": {"type": "pretrain", "text": "Once upon a time."},
    "instruct": {"type": "instruct", "instruct": "Add the numbers.", "input": "2 and 3", "output": "5"},
    "instruct_noinput": {"type": "instruct", "instruct": "Say hi.", "output": "hi"},
    "conversation": {"type": "conversation", "rounds": [["ask", "Hi?"], ["ans", "Hello."], ["user", "Bye?"],
                                                        ["gpt", "Bye."]]},
    "ref_qa": {"type": "ref_qa", "reference": "Paris is in France.", "rounds": [["human", "Where?"], ["assistant", "France"]]},
    "untyped_rounds": {"rounds": [["ask", "a"], ["ask", "b"], ["ans", "c"]]},
    "tokens": {"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, -100]},
    "tokens_nolabels": {"input_ids": [5, 6, 99]},
}
for n, r in recs.items():
    put("sample", n, jdump(r))
put("sample", "instruct_template", jdump(recs["instruct"]) + SEP + tmpl)
put("sample", "conversation_template", jdump(recs["conversation"]) + SEP + tmpl)
kinds = {".jsonl": b"\x00", ".json": b"\x01", ".txt": b"\x02"}
for n in sorted(os.listdir(dd)):
    ext = os.path.splitext(n)[1]
    if ext in kinds and n != "template.json":
        put("records", n.replace(".", "_"), kinds[ext] + open(os.path.join(dd, n), "rb").read())
put("records", "array_comments", b"\x01[\n // a comment\n {\"type\": \"pretrain\", \"text\": \"a\"}, /* b */\n"
    b" {\"input_ids\": [1, 2]},\n]\n")
put("records", "jsonl_first_brace_json", b"\x01{\"type\":\"pretrain\",\"text\":\"x\"}\n{\"input_ids\":[3]}\n")


# ------------------------------------------------------------ indexed
def lengths_hash(lengths):
    h = 0xcbf29ce484222325
    for L in lengths:
        for b in struct.pack("<i", L):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def indexed(code, fmt, seqs, docs, mask_bits=None, flags=0, seq_len=0, pad=-1, split=(0, 0, 0)):
    item = struct.calcsize("<" + fmt)
    lengths = [len(s) for s in seqs]
    ptr, pointers = 0, []
    for L in lengths:
        pointers.append(ptr)
        ptr += L * item
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(docs))
    idx += struct.pack("<%di" % len(seqs), *lengths) + struct.pack("<%dq" % len(seqs), *pointers)
    idx += struct.pack("<%dq" % len(docs), *docs)
    binf = b"".join(struct.pack("<%d%s" % (len(s), fmt), *s) for s in seqs)
    out = idx + SEP + binf
    if mask_bits is not None:
        n_tok = sum(lengths)
        bitmap = bytearray((n_tok + 7) // 8)
        for i, b in enumerate(mask_bits):
            if b:
                bitmap[i // 8] |= 1 << (i % 8)
        out += SEP + b"CLLMMASK" + struct.pack("<IIIiQQQQ3d", 1, flags, seq_len, pad, len(seqs), n_tok, len(binf),
                                               lengths_hash(lengths), *split) + bytes(bitmap)
    return out


put("indexed", "u16", indexed(8, "H", [[1, 2, 3], [4, 5]], [0, 1, 2]))
put("indexed", "i32_mask", indexed(4, "i", [[10, 11, 12, 13], [14], [15, 16]], [0, 2, 3],
                                   mask_bits=[0, 1, 1, 1, 0, 1, 1], flags=0, seq_len=8, pad=0, split=(0.9, 0.1, 0)))
put("indexed", "u8_packed_mask", indexed(1, "B", [[1] * 9], [0, 1], mask_bits=[1] * 9, flags=1, seq_len=4))
put("indexed", "i64_empty_seq", indexed(5, "q", [[], [7]], [0, 2]))


# ------------------------------------------------------------ checkpoint
def manifest(files):
    return jdump({"files": [{"name": n, "bytes": len(b), "crc32": "%08x" % (zlib.crc32(b) & 0xFFFFFFFF)}
                            for n, b in files]})


state = {"version": 1, "global_step": 1, "optimizer_step": 1, "scheduler_iteration": 1, "next_sample": "8",
         "data_seed": "2a", "rng": ["1", "2", "3", "4"], "skipped_steps": 0, "consecutive_skips": 0,
         "tokens_seen": 64.0, "train_seconds": 0.5, "loss_scale": 1.0, "config_hash": "deadbeef",
         "optimizer": "adamw", "train_batch_size": 8, "dp_size": 1}
st_bytes = jdump(state)
model = st_file([("w", "F32", [2], f32([1, 2]))])
put("checkpoint", "valid", b"checkpoint-1\n" + SEP + manifest([("trainer_state.json", st_bytes),
    ("model.safetensors", model)]) + SEP + st_bytes + SEP + model)
st_fp16 = jdump(dict(state, loss_scaler={"iter": 3, "last_overflow_iter": -1, "cur_hysteresis": 2}))
put("checkpoint", "fp16_scaler", b"checkpoint-1" + SEP + manifest([("trainer_state.json", st_fp16)]) + SEP + st_fp16)
put("checkpoint", "corrupt_crc", b"checkpoint-1\n" + SEP + jdump({"files": [{"name": "model.safetensors",
    "bytes": len(model), "crc32": "00000000"}]}) + SEP + st_bytes + SEP + model)
put("checkpoint", "no_latest", b"" + SEP + manifest([("model.safetensors", model)]) + SEP + st_bytes + SEP + model)
