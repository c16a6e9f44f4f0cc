// Encode throughput of the JavaScript tokenizers on one text file, in the
// same chunks cllm's tokenizer_bench uses: tiktoken (npm build, GPT-2
// encoding) and transformers.js (HF's tokenizer.json pipeline).
// Usage (from a folder whose node_modules has both packages):
//   node tokenize_js.mjs <model dir> <text file> <chunk bytes> [tiktoken]
import fs from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

const [modelDir, file, chunkArg, which] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf8');
const chunk = Number(chunkArg) || text.length;
const pieces = [];
for (let i = 0; i < text.length; i += chunk) pieces.push(text.slice(i, i + chunk));
const mb = Buffer.byteLength(text, 'utf8') / 1e6;

let encode, name;
if (which === 'tiktoken') {
  const { get_encoding } = await import('tiktoken');
  const enc = get_encoding('gpt2');
  encode = (s) => enc.encode_ordinary(s).length;
  name = 'tiktoken (npm) gpt2';
} else {
  env.allowRemoteModels = false;
  env.localModelPath = path.dirname(path.resolve(modelDir));
  const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(modelDir)));
  encode = (s) => tok.encode(s, { add_special_tokens: false }).length;
  name = `transformers.js ${path.basename(modelDir)}`;
}
encode(pieces[0]); // warm-up
const t0 = process.hrtime.bigint();
let n = 0;
for (const p of pieces) n += encode(p);
const dt = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`${name}: ${mb.toFixed(1)} MB in ${dt.toFixed(3)} s = ${(mb / dt).toFixed(2)} MB/s, ${n} tokens`);
