// The official clients against `cllm serve` (run by tests/serve_test.py with
// the base URL as argument, from the folder where tests/npm is installed).
//   openai: chat.completions.create and completions.create, streaming and not;
//           an error status surfaces as the client's APIError with our message
//   @huggingface/inference: textGeneration and textGenerationStream against the
//           TGI routes (the client posts {inputs, parameters} to the endpoint)
// Greedy results must equal what raw HTTP /generate returns for the same prompt.
import OpenAI from "openai";
import { HfInference } from "@huggingface/inference";

const base = process.argv[2];
let failures = 0;
function check(cond, msg) {
  if (!cond) {
    failures++;
    console.log("FAIL:", msg);
  }
}

async function tgi(path, body) {
  const r = await fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  return r.json();
}

const prompt = "The quick brown fox";
const want = (await tgi("/generate", { inputs: prompt, parameters: { max_new_tokens: 10 } })).generated_text;

// ---- openai
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "unused" });
const comp = await openai.completions.create({ model: "tiny", prompt, max_tokens: 10, temperature: 0 });
check(comp.choices[0].text === want, `openai completions ${JSON.stringify(comp.choices[0].text)} != ${JSON.stringify(want)}`);
check(comp.usage.completion_tokens >= 1, "openai completions usage");

let streamed = "";
let usage = null;
const cs = await openai.completions.create({ model: "tiny", prompt, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
for await (const ch of cs) {
  if (ch.choices.length) streamed += ch.choices[0].text;
  if (ch.usage) usage = ch.usage;
}
check(streamed === want, `openai completions stream ${JSON.stringify(streamed)}`);
check(usage && usage.completion_tokens === comp.usage.completion_tokens, "openai stream usage");

const msgs = [{ role: "user", content: "Say something" }];
const chat = await openai.chat.completions.create({ model: "tiny", messages: msgs, max_tokens: 8, temperature: 0, seed: 1 });
check(chat.choices[0].message.role === "assistant" && typeof chat.choices[0].message.content === "string", "openai chat");
check(["stop", "length"].includes(chat.choices[0].finish_reason), `chat finish_reason ${chat.choices[0].finish_reason}`);
let chatStreamed = "";
let finish = null;
const chs = await openai.chat.completions.create({ model: "tiny", messages: msgs, max_tokens: 8, temperature: 0, stream: true });
for await (const ch of chs) {
  chatStreamed += ch.choices[0]?.delta?.content ?? "";
  if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
}
check(chatStreamed === chat.choices[0].message.content, `openai chat stream ${JSON.stringify(chatStreamed)} != ${JSON.stringify(chat.choices[0].message.content)}`);
check(finish === chat.choices[0].finish_reason, "chat stream finish_reason");

const sampled = await openai.chat.completions.create({ model: "tiny", messages: msgs, max_tokens: 8, n: 2, seed: 11, temperature: 1.0 });
const again = await openai.chat.completions.create({ model: "tiny", messages: msgs, max_tokens: 8, n: 2, seed: 11, temperature: 1.0 });
check(sampled.choices.length === 2 && sampled.choices[1].message.content === again.choices[1].message.content, "seeded n=2");

try {
  await openai.completions.create({ model: "tiny", prompt, max_tokens: 10, temperature: 5 });
  check(false, "temperature 5 accepted");
} catch (e) {
  check(e.status === 400 && /temperature/.test(e.message), `openai error ${e.status} ${e.message}`);
}

// ---- @huggingface/inference (TGI routes)
const hf = new HfInference();
const ep = hf.endpoint(base);
const out = await ep.textGeneration({ model: "tiny", inputs: prompt, parameters: { max_new_tokens: 10 } });
check(out.generated_text === want, `hf textGeneration ${JSON.stringify(out.generated_text)}`);
let hfText = "";
let last = null;
for await (const ev of ep.textGenerationStream({ model: "tiny", inputs: prompt, parameters: { max_new_tokens: 10, details: true } })) {
  hfText += ev.token.text;
  last = ev;
}
check(hfText === want && last.generated_text === want, `hf textGenerationStream ${JSON.stringify(hfText)}`);
check(last.details && last.details.generated_tokens >= 1, "hf stream details");
try {
  await ep.textGeneration({ model: "tiny", inputs: prompt, parameters: { top_p: 2 } });
  check(false, "top_p 2 accepted");
} catch (e) {
  check(/top_p/.test(e.message), `hf error ${e.message}`);
}

console.log(failures ? `npm clients: ${failures} failures` : "npm clients: ok");
process.exit(failures ? 1 : 0);
