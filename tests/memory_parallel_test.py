#!/usr/bin/env python3
"""`cllm estimate --pipe/--tensor` against the measured peak RSS of each rank
of a pipeline-parallel and a tensor-parallel `cllm train` under mpirun
(label: mpi).

The tensor layout runs with and without sequence parallelism
(sequence_parallel): the peak RSS of each is reported, the estimate checked.

Each rank runs under /usr/bin/time, whose "%M" is that process's peak RSS
(written to a file per rank).
The fixed per-process overhead under MPI (libraries, OpenMPI's shared
memory and threads) is measured first: the largest rank's peak RSS of a
2-rank data-parallel run of a tiny model minus that model's estimate. The
estimate of each configuration must be within 10% of its largest rank's
peak RSS.

Usage: memory_parallel_test.py --cllm BIN --build DIR
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
MPIRUN = ["timeout", "-k", "5", "120", "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
LLAMA = ["hidden_size=256", "num_hidden_layers=4", "num_attention_heads=8", "num_key_value_heads=2",
         "intermediate_size=688", "vocab_size=8192", "max_position_embeddings=512"]
CONFIGS = [  # (name, ranks, topology, micro-batch, seq-len, accumulation, estimate flags)
    ("pipe 2", 2, {"axis": ["pipe"], "dims": [2]}, 2, 256, 4, ["--pipe", "2"]),
    ("pipe 4", 4, {"axis": ["pipe"], "dims": [4]}, 2, 256, 4, ["--pipe", "4"]),
    # ZeRO-3 inside the stages: each stage's range partitioned over its data
    # group, its own layers gathered (with a tied head, the embedding kept
    # whole on the first and the last stage)
    ("pipe 2 x data 2 zero 3", 4, {"axis": ["pipe", "data"], "dims": [2, 2]}, 2, 256, 4,
     ["--pipe", "2", "--dp", "2", "--zero-stage", "3"]),
    ("pipe 2 x data 2 zero 3 tied", 4, {"axis": ["pipe", "data"], "dims": [2, 2]}, 2, 256, 4,
     ["--pipe", "2", "--dp", "2", "--zero-stage", "3"]),
    ("tensor 2", 2, {"axis": ["tensor"], "dims": [2]}, 2, 256, 2, ["--tensor", "2"]),
    ("tensor 2 sequence-parallel", 2, {"axis": ["tensor"], "dims": [2]}, 2, 256, 2,
     ["--tensor", "2", "--sequence-parallel"]),
]


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=180, **kw)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="memory_parallel_", dir=a.build)
    data = os.path.join(d, "train.jsonl")
    r = random.Random(2)
    with open(data, "w") as f:
        for _ in range(96):
            ids = [r.randrange(3, 500) for _ in range(r.randint(100, 250))]
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")

    def train(name, model, n, topo, B, T, accum):
        cfg = {"model": model, "data": {"train": data, "seq_len": T}, "train_micro_batch_size_per_gpu": B,
               "gradient_accumulation_steps": accum, "train_iters": 2, "log": "quiet", "peak_gflops": 1.0,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
        if topo:
            cfg["model_topo"] = {"process_topology": topo}
        if "sequence-parallel" in name:
            cfg["sequence_parallel"] = True
        if "zero_3" in name:
            cfg["zero_optimization"] = {"stage": 3}
        path = os.path.join(d, name + ".json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        # one file per rank: the ranks' stderr streams interleave
        rss = os.path.join(d, name + ".rss")
        wrap = f'exec /usr/bin/time -f %M -o "{rss}.$OMPI_COMM_WORLD_RANK" "$@"'
        run(MPIRUN + ["-np", str(n), "sh", "-c", wrap, "sh", a.cllm, "train", "--config", path, "--out",
                      os.path.join(d, name)])
        kb = []
        for r in range(n):
            with open(f"{rss}.{r}") as f:
                kb.append(int(f.read().split()[-1]))
        return max(kb) * 1024

    def estimate(model, B, T, accum, flags, overhead):
        p = run([a.cllm, "estimate", "--json", "--model", model, "--micro-batch", str(B), "--seq-len", str(T),
                 "--grad-accum", str(accum), "--overhead", str(overhead)] + flags)
        return json.loads(p.stdout)

    tiny = os.path.join(d, "tiny")
    run([a.cllm, "init", "--arch", "llama", "--preset", "tiny", "--out", tiny])
    base = train("tiny", tiny, 2, None, 1, 16, 1)
    overhead = max(0, base - estimate(tiny, 1, 16, 1, ["--dp", "2"], 0)["total"])
    print(f"per-rank overhead under mpirun: {overhead / 1e6:.1f} MB")
    model = os.path.join(d, "llama")
    cmd = [a.cllm, "init", "--arch", "llama", "--out", model, "--seed", "1"]
    for s in LLAMA:
        cmd += ["--set", s]
    run(cmd)
    tied = os.path.join(d, "llama_tied")
    run([tied if x == model else x for x in cmd] + ["--set", "tie_word_embeddings=true"])
    fails = []
    print("| layout | B x T x accum | estimate MB | largest rank's peak RSS MB | error |")
    print("|---|---|---|---|---|")
    for name, n, topo, B, T, accum, flags in CONFIGS:
        mdl = tied if name.endswith("tied") else model
        e = estimate(mdl, B, T, accum, flags, overhead)
        rss = train(name.replace(" ", "_"), mdl, n, topo, B, T, accum)
        err = (e["total"] - rss) / rss
        print(f"| {name} | {B} x {T} x {accum} | {e['total'] / 1e6:.1f} | {rss / 1e6:.1f} | {100 * err:+.1f}% |")
        if abs(err) > 0.10:
            fails.append(f"{name}: estimate {e['total']} vs peak RSS {rss}")
    for f in fails:
        print("FAIL:", f, file=sys.stderr)
    if fails:
        sys.exit(1)
    shutil.rmtree(d, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
