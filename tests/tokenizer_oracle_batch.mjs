#!/usr/bin/env node
// tokenizer_oracle_batch.mjs -- the tokenizer oracle (transformers.js on
// local tokenizer.json files, loaded exactly as shared/tools/tokenizer_oracle.mjs
// loads them) run once over many samples, so the test pays for node start-up
// and tokenizer loading once per model instead of once per sample.
//
// Usage (run from a folder whose node_modules has @huggingface/transformers):
//   node tokenizer_oracle_batch.mjs <fixtures/hf dir> <samples.json> <out.json> <model>...
// samples.json: a JSON array of strings. out.json receives, per model, one
// record per sample: ids with and without special tokens, and the decoding
// of the ids with special tokens (kept and skipped) and of the plain ids.
// Decoding uses clean_up_tokenization_spaces=false, like the oracle.

import fs from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

const [root, samplesFile, outFile, ...models] = process.argv.slice(2);
if (!root || !samplesFile || !outFile || models.length === 0) {
  process.stderr.write('usage: tokenizer_oracle_batch.mjs <fixtures/hf> <samples.json> <out.json> <model>...\n');
  process.exit(2);
}
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.resolve(root) + path.sep;
env.useBrowserCache = false;

const samples = JSON.parse(fs.readFileSync(samplesFile, 'utf8'));
const ids = (x) => Array.from(x, (v) => Number(v));
const out = {};
for (const m of models) {
  const tok = await AutoTokenizer.from_pretrained(m);
  const dec = (v, skip) => (v.length === 0 ? '' : tok.decode(v, { skip_special_tokens: skip,
                                                                 clean_up_tokenization_spaces: false }));
  out[m] = samples.map((s) => {
    const withSpecial = ids(tok.encode(s, { add_special_tokens: true }));
    const plain = ids(tok.encode(s, { add_special_tokens: false }));
    return {
      ids: withSpecial,
      ids_plain: plain,
      text: dec(withSpecial, false),
      text_skip: dec(withSpecial, true),
      text_plain: dec(plain, false),
    };
  });
}
fs.writeFileSync(outFile, JSON.stringify(out));
