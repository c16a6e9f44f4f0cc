#!/usr/bin/env node
// chat_template_oracle.mjs -- renders chat-template cases with
// @huggingface/jinja (the renderer of transformers.js), with the variables
// transformers.js passes to apply_chat_template, for tests/chat_template_oracle.py.
//
// Usage (from a folder whose node_modules has @huggingface/jinja):
//   node chat_template_oracle.mjs CASES.jsonl > RESULTS.jsonl
// One output line per case: {"ok": true, "text": ...} or {"ok": false, "error": ...}.

import fs from 'node:fs';
import { Template } from '@huggingface/jinja';

const lines = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter((l) => l.length > 0);
const compiled = new Map();
const out = [];
for (const line of lines) {
  const c = JSON.parse(line);
  let res;
  try {
    let t = compiled.get(c.template);
    if (!t) {
      t = new Template(c.template);
      compiled.set(c.template, t);
    }
    const vars = {
      messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
      tools: null,
      documents: null,
      ...(c.extra || {}),
    };
    if (c.bos_token !== null && c.bos_token !== undefined) vars.bos_token = c.bos_token;
    if (c.eos_token !== null && c.eos_token !== undefined) vars.eos_token = c.eos_token;
    res = { ok: true, text: t.render(vars) };
  } catch (e) {
    res = { ok: false, error: String(e && e.message ? e.message : e) };
  }
  out.push(JSON.stringify(res));
}
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
