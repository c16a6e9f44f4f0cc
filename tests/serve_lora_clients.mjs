// The official `openai` npm client against `cllm serve --lora-adapters x=...`
// (run by tests/serve_lora_test.py: base URL, prompt, and the greedy text of
// adapter x that TGI's /generate returned). The adapter is chosen by `model`;
// an unknown model is an APIError with status 404 and code model_not_found.
import OpenAI from "openai";

const [base, prompt, wantX] = process.argv.slice(2);
let failures = 0;
function check(cond, msg) {
  if (!cond) {
    failures++;
    console.log("FAIL:", msg);
  }
}

const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "unused" });
const comp = await openai.completions.create({ model: "x", prompt, max_tokens: 12, temperature: 0 });
check(comp.choices[0].text === wantX, `model x: ${JSON.stringify(comp.choices[0].text)} != ${JSON.stringify(wantX)}`);
check(comp.model === "x", `response model ${comp.model}`);
let streamed = "";
for await (const ch of await openai.completions.create({ model: "x", prompt, max_tokens: 12, temperature: 0, stream: true }))
  if (ch.choices.length) streamed += ch.choices[0].text;
check(streamed === wantX, `model x streamed: ${JSON.stringify(streamed)}`);
const ids = [];
for await (const m of openai.models.list()) ids.push(m.id);
check(JSON.stringify(ids) === JSON.stringify(["tiny", "x", "y"]), `models.list ${JSON.stringify(ids)}`);
try {
  await openai.completions.create({ model: "nope", prompt, max_tokens: 2 });
  check(false, "unknown model accepted");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 404 && e.code === "model_not_found", `unknown model: ${e}`);
}
console.log(failures ? `serve_lora_clients: ${failures} failures` : "serve_lora_clients: ok");
process.exit(failures ? 1 : 0);
