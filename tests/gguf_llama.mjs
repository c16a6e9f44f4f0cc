// Runs GGUF files in llama.cpp (node-llama-cpp's prebuilt CPU binaries) for
// tests/gguf_test.py. Reads a JSON request on stdin:
//   {"runs": [{"model": PATH, "texts": [..], "prompts": [[ids..], ..], "n_new": N}, ..]}
// and prints one result per run:
//   [{"tokens": [[ids of each text, no BOS/EOS]..],
//     "continuations": [[up to N greedy ids after each prompt, an EOG id last if one came]..]}, ..]
// Greedy: temperature 0, so the sampler takes the argmax of the logits.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const results = [];
for (const run of req.runs) {
    const model = await llama.loadModel({modelPath: run.model, gpuLayers: 0});
    const tokens = run.texts.map((t) => Array.from(model.tokenize(t, false)));
    const continuations = [];
    for (const prompt of run.prompts) {
        const context = await model.createContext({contextSize: run.context ?? 256, sequences: 1, threads: 2});
        const seq = context.getSequence();
        const out = [];
        for await (const tok of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
            out.push(tok);
            if (out.length >= run.n_new || model.isEogToken(tok)) break;
        }
        continuations.push(out);
        await context.dispose();
    }
    await model.dispose();
    results.push({tokens, continuations});
}
await llama.dispose();
process.stdout.write(JSON.stringify(results) + "\n");
