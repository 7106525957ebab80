// sdk.mjs — ekv serve driven by a client nobody here wrote: the official
// OpenAI SDK for Node (npm package `openai`, pinned in package-lock.json),
// with baseURL pointing at the server. Chat, streaming (chunks reassemble to
// the non-streamed text), legacy completions, n choices, models.list and .retrieve, the per-request KV
// extension passed through the SDK, the penalties, logit_bias, logprobs (chat and
// legacy completions, streamed and not), and errors the SDK maps to its own
// classes (400 BadRequestError with OpenAI's error shape, 401
// AuthenticationError).
// usage: node sdk.mjs BASE_URL API_KEY
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { check, counts } from './check.mjs';

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });

const messages = [
  { role: 'system', content: 'A story for children.' },
  { role: 'user', content: 'Once upon a time there was a little dog' },
];

let chatText = '';
await check('chat', async () => {
  const r = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 48, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  chatText = r.choices[0].message.content;
  assert.ok(chatText.length > 20, `short answer: ${chatText}`);
  assert.equal(r.usage.completion_tokens, 48);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 48);
  assert.equal(r.usage.kv.policy, 'full');
});

// the SDK's own penalty fields: taken (200), the text changed, the same when repeated
await check('chat penalties', async () => {
  const ask = () => client.chat.completions.create({
    model: 'stories', messages, max_tokens: 48, temperature: 0, presence_penalty: 1.5, frequency_penalty: 1,
  });
  const a = await ask();
  const b = await ask();
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, chatText);
  assert.equal(a.usage.completion_tokens, 48);
});

// the SDK's logit_bias (token ids from /tokenize as keys): the answer's first tokens banned
// (-100) change it, and the list is taken as given (the same when repeated)
await check('chat logit_bias', async () => {
  const res = await fetch(`${base}/tokenize`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ content: chatText, add_special: false }),
  });
  const ids = (await res.json()).tokens.slice(0, 3);
  assert.ok(ids.length > 0);
  const logit_bias = Object.fromEntries(ids.map((id) => [String(id), -100]));
  const ask = () => client.chat.completions.create({ model: 'stories', messages, max_tokens: 48, temperature: 0, logit_bias });
  const a = await ask();
  const b = await ask();
  assert.notEqual(a.choices[0].message.content, chatText);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

await check('chat stream', async () => {
  const stream = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 48, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    text += chunk.choices[0].delta?.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    chunks++;
  }
  assert.equal(text, chatText);
  assert.ok(chunks > 3, `only ${chunks} chunks`);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 48);
});

await check('kv extension through the SDK', async () => {
  const r = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 48, temperature: 0, kv: { policy: 'h2o', budget: 0.3 },
  });
  assert.equal(r.usage.kv.policy, 'h2o');
  assert.ok(r.usage.kv.bytes < r.usage.kv.bytes_full * 0.5, JSON.stringify(r.usage.kv));
  assert.ok(r.usage.kv.evicted > 0);
});

await check('completions', async () => {
  const r = await client.completions.create({ model: 'stories', prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.startsWith(', there was'), r.choices[0].text);
  const s = await client.completions.create({ model: 'stories', prompt: 'Once upon a time', max_tokens: 24, temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

// logprobs (OpenAI's two shapes): at temperature 0 each chosen token is its own most likely one;
// the tokens spell the text; top_logprobs descending with at most the mass 1; a stream carries
// the same entries, chunk by chunk; the legacy completions' arrays line up with the text
await check('chat logprobs', async () => {
  const ask = (stream) => client.chat.completions.create({
    model: 'stories', messages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3, stream,
  });
  const r = await ask(false);
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 24);
  assert.equal(lp.map((e) => e.token).join(''), r.choices[0].message.content);
  for (const e of lp) {
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    assert.ok(e.logprob <= 0 && e.top_logprobs[1].logprob <= e.logprob && e.top_logprobs[2].logprob <= e.top_logprobs[1].logprob);
    assert.ok(e.top_logprobs.reduce((a, t) => a + Math.exp(t.logprob), 0) <= 1 + 1e-6);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
  }
  const streamed = [];
  for await (const c of await ask(true)) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((e) => [e.token, e.logprob]), lp.map((e) => [e.token, e.logprob]));
});

// n choices: choice i is the request sent alone with seed + i (each its own cache); usage
// counts the prompt once and every choice's tokens; a stream's chunks, sorted by their index,
// reassemble to the same choices
await check('n choices', async () => {
  const q = { model: 'stories', messages, max_tokens: 24, temperature: 0.9, seed: 11 };
  const r = await client.chat.completions.create({ ...q, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (let i = 0; i < 3; i++) {
    const one = await client.chat.completions.create({ ...q, seed: 11 + i });
    assert.equal(r.choices[i].message.content, one.choices[0].message.content);
    if (i === 0) assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  }
  assert.equal(r.usage.completion_tokens, 72);
  assert.ok(new Set(r.choices.map((c) => c.message.content)).size > 1, 'three equal samples at temperature 0.9');
  const text = ['', '', ''];
  let usage = null;
  const stream = await client.chat.completions.create({ ...q, n: 3, stream: true, stream_options: { include_usage: true } });
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) text[ch.index] += ch.delta?.content ?? '';
  }
  assert.deepEqual(text, r.choices.map((c) => c.message.content));
  assert.equal(usage.completion_tokens, 72);
  const g = await client.completions.create({ model: 'stories', prompt: 'Once upon a time', max_tokens: 16, temperature: 0, n: 2 });
  assert.equal(g.choices.length, 2);
  assert.equal(g.choices[0].text, g.choices[1].text);
});

// a batch of prompts (legacy completions; lm-evaluation-harness sends its batches so): choice c of
// prompt k has index k * n + c and is that prompt sent alone (seed + c); usage sums the prompts
await check('batch of prompts', async () => {
  const prompts = ['Once upon a time', 'Lily and Tom', [1, 403, 407]];
  const q = { model: 'stories', max_tokens: 12, temperature: 0.9, seed: 3, n: 2 };
  const r = await client.completions.create({ ...q, prompt: prompts });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5]);
  let promptTokens = 0;
  for (let k = 0; k < 3; k++) {
    const one = await client.completions.create({ ...q, prompt: prompts[k] });
    assert.deepEqual([r.choices[2 * k].text, r.choices[2 * k + 1].text], one.choices.map((c) => c.text));
    promptTokens += one.usage.prompt_tokens;
  }
  assert.equal(r.usage.prompt_tokens, promptTokens);
  assert.equal(r.usage.completion_tokens, 72);
});

await check('completions logprobs', async () => {
  const r = await client.completions.create({
    model: 'stories', prompt: 'Once upon a time', max_tokens: 16, temperature: 0, logprobs: 2,
  });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.token_logprobs.length, 16);
  let off = 0;
  lp.tokens.forEach((t, i) => {
    assert.equal(lp.text_offset[i], off);
    off += Buffer.byteLength(t);
    const top = Object.entries(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 2);
    assert.equal(top[0][0], t);
    assert.equal(top[0][1], lp.token_logprobs[i]);
  });
});

await check('models', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].object, 'model');
  assert.equal(list.data[0].id, 'stories260K.gguf');
  const one = await client.models.retrieve('stories260K.gguf');
  assert.equal(one.id, 'stories260K.gguf');
  assert.equal(one.object, 'model');
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

await check('400 -> BadRequestError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'stories', messages, max_tokens: 8, kv: { policy: 'h2o', budget: 2 } }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, e.constructor.name);
      assert.equal(e.status, 400);
      assert.equal(e.error.type, 'invalid_request_error');
      assert.match(e.error.message, /budget/);
      return true;
    },
  );
  await assert.rejects(client.chat.completions.create({ model: 'stories', messages: [], max_tokens: 8 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
});

await check('401 -> AuthenticationError', async () => {
  const wrong = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-the-key', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

await check('abort mid-stream', async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model: 'stories', messages, max_tokens: 400, ignore_eos: true, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const chunk of stream) { // the SDK ends the iteration (or throws) once aborted
      if (++n === 3) ac.abort();
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  assert.ok(n >= 3 && n < 400, `${n} chunks`);
  const r = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 48, temperature: 0 });
  assert.equal(r.choices[0].message.content, chatText);
});

console.log(`sdk: ${counts.passed} passed`);
