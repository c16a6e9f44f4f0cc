// llama.cpp's side of bench/decode_bench.py: node-llama-cpp's prebuilt CPU
// binaries (the package pinned in tests/npm-llama/) running a GGUF file that
// `cllm convert --to gguf` wrote from the same weights.
// Reads one JSON request on stdin:
//   {"model": PATH, "threads": N, "decode_prompt": [ids], "n_new": N, "prefill_prompt": [ids]}
// and prints {"decode_tps": X, "prefill_tps": Y, "ids": [greedy ids]}:
//   decode: the greedy continuation of decode_prompt (temperature 0), tokens/s over
//           the steps after the first token ((n - 1) / (last - first token time));
//   prefill: the seconds to evaluate prefill_prompt into a fresh context
//           (evaluateWithoutGeneratingNewTokens: no sampling), as tokens/s.
// Both run with `threads` threads (minimum and ideal), one sequence.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const threads = {ideal: req.threads, min: req.threads};

const llama = await getLlama({gpu: false, build: "never", maxThreads: req.threads, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: req.model, gpuLayers: 0});
const now = () => Number(process.hrtime.bigint()) / 1e9;
const result = {};

if (req.decode_prompt) {
    const ctx = await model.createContext({contextSize: req.decode_prompt.length + req.n_new + 8, sequences: 1,
                                          threads});
    const seq = ctx.getSequence();
    const ids = [], times = [];
    for await (const tok of seq.evaluate(req.decode_prompt, {temperature: 0})) {
        times.push(now());
        ids.push(tok);
        if (ids.length >= req.n_new) break;
    }
    result.decode_tps = (times.length - 1) / (times[times.length - 1] - times[0]);
    result.ids = ids;
    await ctx.dispose();
}
if (req.prefill_prompt) {
    const n = req.prefill_prompt.length;
    const ctx = await model.createContext({contextSize: n + 8, batchSize: n, sequences: 1, threads});
    const seq = ctx.getSequence();
    const t0 = now();
    await seq.evaluateWithoutGeneratingNewTokens(req.prefill_prompt);
    result.prefill_tps = n / (now() - t0);
    await ctx.dispose();
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(result) + "\n");
