// Structured output through the official `openai` client, every reply
// checked with the Ajv JSON Schema validator; prints what it saw as one JSON
// object on stdout for the C++ test (tests/integration/structured_output_test.cc)
// to judge.
//   node structured_output.mjs CONFIG.json
// CONFIG (mode "http"): {baseURL, model, count, seed, maxTokens, prompt: [token ids],
//   messages: [{role, content}], concurrency, unconstrained}
//   `count` random schemas (objects, arrays, enums, const, required and
//   optional properties, anyOf, $defs/$ref, nested), each asked once with its
//   own seed at temperature 1, alternating completions / chat, streamed / not,
//   strict / not; `unconstrained` of them asked again without response_format.
// CONFIG (mode "validate"): {cases: [{schema, text}]}: only the validation
//   (replies the C++ test got over gRPC).
import { readFileSync } from 'node:fs';
import Ajv from 'ajv';
import OpenAI from 'openai';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));

// Mulberry32: the schemas are a function of cfg.seed.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const NAMES = ['id', 'name', 'age', 'tags', 'ok', 'score', 'kind', 'items', 'note', 'x', 'y',
               'value', 'a b', 'quote"d', 'ünï'];

function randomSchema(r, depth, defs, forced) {
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const leaf = ['string', 'integer', 'number', 'boolean', 'null', 'enum', 'const', 'nullable'];
  const inner = ['object', 'object', 'array', 'anyOf', 'ref'];
  const kind = forced ?? pick(depth >= 3 ? leaf : leaf.concat(inner, inner));
  switch (kind) {
    case 'string': case 'integer': case 'number': case 'boolean': case 'null':
      return { type: kind };
    case 'nullable':
      return { type: [pick(['string', 'integer', 'number', 'boolean']), 'null'] };
    case 'enum': {
      const pool = ['red', 'green', 'blue', 'a"b', 'line\nbreak', 1, 2.5, -3, true, null];
      const n = 1 + Math.floor(r() * 4);
      const values = [];
      while (values.length < n) {
        const v = pick(pool);
        if (!values.includes(v)) values.push(v);
      }
      return { enum: values };
    }
    case 'const':
      return { const: pick(['fixed', 42, false, { k: [1, 'v'] }]) };
    case 'object': {
      const n = 1 + Math.floor(r() * 4);
      const properties = {};
      const required = [];
      for (let i = 0; i < n; ++i) {
        const key = pick(NAMES);
        if (key in properties) continue;
        properties[key] = randomSchema(r, depth + 1, defs);
        if (r() < 0.6) required.push(key);
      }
      const s = { type: 'object', properties, required };
      if (r() < 0.5) s.additionalProperties = false;
      return s;
    }
    case 'array': {
      const s = { type: 'array', items: randomSchema(r, depth + 1, defs) };
      const min = Math.floor(r() * 3);
      if (r() < 0.5) s.minItems = min;
      if (r() < 0.7) s.maxItems = (s.minItems ?? 0) + Math.floor(r() * 3);
      return s;
    }
    case 'anyOf':
      return { anyOf: [randomSchema(r, depth + 1, defs), randomSchema(r, depth + 1, defs)] };
    case 'ref': {
      // Reserved first: definitions made inside get other names.
      const name = `D${Object.keys(defs).length}`;
      defs[name] = null;
      defs[name] = randomSchema(r, depth + 1, defs);
      return { $ref: `#/$defs/${name}` };
    }
  }
  throw new Error(kind);
}

// An object at the top, as clients send; anything inside.
function topSchema(r) {
  const defs = {};
  const s = randomSchema(r, 0, defs, 'object');
  if (Object.keys(defs).length > 0) s.$defs = defs;
  return s;
}

const ajv = new Ajv({ strict: false, allErrors: false });

function check(schema, text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { parses: false, valid: false, error: `not JSON: ${e.message}` };
  }
  const validate = ajv.compile(schema);
  const valid = validate(value);
  return { parses: true, valid, error: valid ? null : ajv.errorsText(validate.errors) };
}

if (cfg.mode === 'validate') {
  console.log(JSON.stringify({ results: cfg.cases.map((c) => check(c.schema, c.text)) }));
  process.exit(0);
}

const client = new OpenAI({ baseURL: cfg.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const model = cfg.model;

async function ask(c, constrained) {
  const common = { model, max_tokens: c.maxTokens, temperature: 1, seed: c.seed };
  if (constrained) {
    common.response_format = c.jsonObject
      ? { type: 'json_object' }
      : { type: 'json_schema', json_schema: { name: `s${c.index}`, schema: c.schema, strict: c.strict } };
  }
  if (c.api === 'chat') {
    const params = { ...common, messages: cfg.messages };
    if (c.stream) {
      let text = '';
      let finish = null;
      for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
        if (chunk.choices.length === 0) continue;
        text += chunk.choices[0].delta.content ?? '';
        if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      }
      return { text, finish_reason: finish };
    }
    if (constrained && !c.jsonObject) {
      // What chat.completions.parse users get: message.parsed.
      const reply = await client.chat.completions.parse(params);
      const m = reply.choices[0].message;
      return { text: m.content, finish_reason: reply.choices[0].finish_reason,
               parsed_matches: JSON.stringify(m.parsed) === JSON.stringify(JSON.parse(m.content)) };
    }
    const reply = await client.chat.completions.create(params);
    return { text: reply.choices[0].message.content, finish_reason: reply.choices[0].finish_reason };
  }
  const params = { ...common, prompt: cfg.prompt };
  if (c.stream) {
    let text = '';
    let finish = null;
    for await (const chunk of await client.completions.create({ ...params, stream: true })) {
      if (chunk.choices.length === 0) continue;
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    return { text, finish_reason: finish };
  }
  const reply = await client.completions.create(params);
  return { text: reply.choices[0].text, finish_reason: reply.choices[0].finish_reason };
}

const r = rng(cfg.seed);
const cases = [];
for (let i = 0; i < cfg.count; ++i) {
  const jsonObject = i % 10 === 9;
  cases.push({
    index: i,
    schema: jsonObject ? { type: 'object' } : topSchema(r),
    jsonObject,
    strict: i % 2 === 0,
    api: i % 4 < 2 ? 'completions' : 'chat',
    stream: i % 3 === 0,
    seed: 1000 + i,
    maxTokens: cfg.maxTokens,
  });
}

async function runAll(list, constrained) {
  const out = new Array(list.length);
  let next = 0;
  async function worker() {
    while (next < list.length) {
      const c = list[next++];
      try {
        const reply = await ask(c, constrained);
        // strict without additionalProperties: OpenAI's reading (closed objects).
        out[c.index] = { ...reply, ...check(c.schema, reply.text) };
      } catch (e) {
        out[c.index] = { text: null, parses: false, valid: false, error: `${e.status ?? ''} ${e.message}` };
      }
    }
  }
  await Promise.all(Array.from({ length: cfg.concurrency ?? 4 }, worker));
  return out;
}

const results = await runAll(cases, true);
const unconstrainedCases = cases.slice(0, cfg.unconstrained ?? 0)
  .map((c, i) => ({ ...c, index: i, jsonObject: false }));
const unconstrained = await runAll(unconstrainedCases, false);

// A schema the grammar cannot enforce: refused naming the keyword.
let refusal = null;
try {
  await client.chat.completions.create({
    model, messages: cfg.messages, max_tokens: 16,
    response_format: { type: 'json_schema', json_schema: { name: 'p', schema:
      { type: 'object', properties: { s: { type: 'string', pattern: '^a+$' } } } } } });
  refusal = { status: 200 };
} catch (e) {
  refusal = { status: e.status ?? null, param: e.param ?? null, message: e.message };
}

console.log(JSON.stringify({
  cases: cases.map((c, i) => ({ api: c.api, stream: c.stream, strict: c.strict, json_object: c.jsonObject,
                                schema: c.schema, seed: c.seed, ...results[i] })),
  unconstrained: unconstrained.map((u) => ({ parses: u.parses, valid: u.valid })),
  refusal,
}));
