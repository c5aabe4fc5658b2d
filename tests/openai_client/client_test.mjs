// Drives pdserve's OpenAI-compatible HTTP API with the official `openai`
// client and prints what it saw as one JSON object on stdout; the C++ test
// (tests/integration/openai_http_test.cc) checks it against the in-process
// engine. Nothing here decides pass or fail except a client that throws
// where the API should have answered.
//   node client_test.mjs CONFIG.json
// CONFIG: {baseURL, model, prompt: [token ids], maxTokens,
//          messages: [{role, content}], chatMaxTokens, longMessages}
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({ baseURL: cfg.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const model = cfg.model;
const out = {};

// Collects a streamed completion or chat completion.
async function collect(stream, chat) {
  const r = { text: '', finish_reason: null, usage: null, chunks: 0, role: null, logprobs: 0 };
  for await (const chunk of stream) {
    r.chunks++;
    if (chunk.usage) r.usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const choice = chunk.choices[0];
    if (chat) {
      if (choice.delta.role) r.role = choice.delta.role;
      r.text += choice.delta.content ?? '';
      r.logprobs += choice.logprobs?.content?.length ?? 0;
    } else {
      r.text += choice.text;
    }
    if (choice.finish_reason) r.finish_reason = choice.finish_reason;
  }
  return r;
}

async function error(promise) {
  try {
    await promise;
    return { status: 200 };
  } catch (e) {
    return { status: e.status ?? null, param: e.param ?? null, type: e.type ?? null,
             message: e.message, name: e.constructor.name };
  }
}

out.models = (await client.models.list()).data.map((m) => m.id);

const completion = await client.completions.create(
  { model, prompt: cfg.prompt, max_tokens: cfg.maxTokens, temperature: 0, logprobs: 2 });
out.completion = {
  object: completion.object,
  text: completion.choices[0].text,
  finish_reason: completion.choices[0].finish_reason,
  usage: completion.usage,
  logprob_tokens: completion.choices[0].logprobs?.tokens?.length ?? 0,
};

out.completion_stream = await collect(await client.completions.create(
  { model, prompt: cfg.prompt, max_tokens: cfg.maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true } }), false);

const chat = await client.chat.completions.create(
  { model, messages: cfg.messages, max_completion_tokens: cfg.chatMaxTokens, temperature: 0,
    logprobs: true, top_logprobs: 2 });
out.chat = {
  object: chat.object,
  role: chat.choices[0].message.role,
  text: chat.choices[0].message.content,
  finish_reason: chat.choices[0].finish_reason,
  usage: chat.usage,
  logprobs: chat.choices[0].logprobs?.content?.length ?? 0,
  top_logprobs: chat.choices[0].logprobs?.content?.[0]?.top_logprobs?.length ?? 0,
};

out.chat_stream = await collect(await client.chat.completions.create(
  { model, messages: cfg.messages, max_tokens: cfg.chatMaxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true } }), true);

// n = 3 choices with a seed, whole and through the client's own stream
// accumulator: the same three choices, each under its index.
const choicesParams = { model, messages: cfg.messages, max_tokens: cfg.chatMaxTokens,
                        temperature: 1, seed: 7, ignore_eos: true, n: 3 };
const whole = await client.chat.completions.create(choicesParams);
const accumulated = await client.chat.completions.stream(
  { ...choicesParams, stream: true, stream_options: { include_usage: true } }).finalChatCompletion();
const summary = (r) => ({
  choices: r.choices.map((c) => ({ index: c.index, content: c.message.content,
                                   finish_reason: c.finish_reason })),
  usage: r.usage,
});
out.choices = { whole: summary(whole), stream: summary(accumulated) };

out.bad_type = await error(client.completions.create({ model, prompt: 'x', temperature: 'hot' }));
out.bad_role = await error(client.chat.completions.create(
  { model, messages: [{ role: 'narrator', content: 'x' }], max_tokens: 2 }));
out.unknown_model = await error(client.completions.create({ model: 'no-such-model', prompt: 'x' }));

// A client that goes away mid-stream: the server must cancel the request.
// ignore_eos (a server extension the client passes through) and a seed: a
// sampled EOS must not end the stream before the client hangs up.
const controller = new AbortController();
const long = await client.chat.completions.create(
  { model, messages: cfg.longMessages, max_tokens: cfg.longMaxTokens, temperature: 0.8, seed: 7,
    ignore_eos: true, stream: true }, { signal: controller.signal });
let seen = 0;
for await (const chunk of long) {
  if (chunk.choices[0]?.delta?.content !== undefined) seen++;
  if (seen >= 3) {
    controller.abort();
    break;
  }
}
out.aborted_after_chunks = seen;

process.stdout.write(JSON.stringify(out) + '\n');
