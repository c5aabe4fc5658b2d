// A two-turn tool loop through the official `openai` client, streamed and
// not, arguments checked by Ajv against each tool's parameters; prints what
// it saw as one JSON object on stdout for tests/integration/tool_calls_test.cc.
//   node tool_calls.mjs CONFIG.json
// CONFIG: {baseURL, model, maxTokens, seed}
import { readFileSync } from 'node:fs';
import Ajv from 'ajv';
import OpenAI from 'openai';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({ baseURL: cfg.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const model = cfg.model;
const ajv = new Ajv({ strict: false });

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } },
                  required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', description: 'Time in a zone',
    parameters: { type: 'object', properties: { zone: { type: 'string' }, hours: { type: 'integer' } },
                  required: ['zone'], additionalProperties: false } } },
];
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function checkCalls(calls) {
  return (calls ?? []).map((c) => {
    let args = null;
    let valid = false;
    try {
      args = JSON.parse(c.function.arguments);
      valid = validators[c.function.name]?.(args) ?? false;
    } catch (e) { /* not JSON: valid stays false */ }
    return { id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments, valid };
  });
}

// One request, streamed (collected by hand and by the client's own stream
// helper) or not.
async function turn(messages, toolChoice, stream, seed) {
  const params = { model, messages, tools, tool_choice: toolChoice, max_tokens: cfg.maxTokens,
                   temperature: 1, seed };
  if (!stream) {
    const r = await client.chat.completions.create(params);
    const m = r.choices[0].message;
    return { content: m.content, finish_reason: r.choices[0].finish_reason, calls: checkCalls(m.tool_calls),
             message: m };
  }
  const s = client.chat.completions.stream({ ...params, stream: true });
  let argumentDeltas = 0;
  s.on('chunk', (chunk) => {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      if (tc.function?.arguments) argumentDeltas++;
    }
  });
  const final = await s.finalChatCompletion();
  const m = final.choices[0].message;
  return { content: m.content, finish_reason: final.choices[0].finish_reason, calls: checkCalls(m.tool_calls),
           argument_deltas: argumentDeltas, message: { role: 'assistant', content: m.content ?? null,
                                                       tool_calls: m.tool_calls } };
}

async function loop(toolChoice, stream, seed) {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await turn(messages, toolChoice, stream, seed);
  messages.push(first.message);
  for (const c of first.calls) {
    messages.push({ role: 'tool', tool_call_id: c.id, content: JSON.stringify({ ok: true, name: c.name }) });
  }
  // The answer turn: tools still offered, no call wanted.
  const second = await turn(messages, 'none', stream, seed + 1);
  delete first.message;
  delete second.message;
  return { first, second };
}

async function error(promise) {
  try {
    await promise;
    return { status: 200 };
  } catch (e) {
    return { status: e.status ?? null, param: e.param ?? null, message: e.message };
  }
}

const out = { loops: [] };
let seed = cfg.seed;
for (const stream of [false, true]) {
  for (const choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
    for (let i = 0; i < 3; ++i) {
      out.loops.push({ stream, choice, ...(await loop(choice, stream, seed++)) });
    }
  }
}
// auto on a random model: whatever it says is content or a valid call.
out.auto = await turn([{ role: 'user', content: 'Hi' }], 'auto', false, seed++);
delete out.auto.message;
out.unknown_tool = await error(client.chat.completions.create(
  { model, messages: [{ role: 'user', content: 'x' }], tools,
    tool_choice: { type: 'function', function: { name: 'nope' } } }));
out.with_format = await error(client.chat.completions.create(
  { model, messages: [{ role: 'user', content: 'x' }], tools, tool_choice: 'required',
    response_format: { type: 'json_object' } }));
console.log(JSON.stringify(out));
