// native.mjs — llama-server's own /completion endpoint as its clients use it
// (plain fetch, the shapes of llama.cpp's tools/server/README.md): the text
// at temperature 0 equal to /v1/completions', the stream (one event per token
// with its ids, the last with "stop": true and no [DONE]), stop_type eos /
// limit / word with stopping_word, n_predict 0 and -1 (truncated at the
// context's end), prompts of token ids and strings mixed (BOS only before a
// leading string), n_probs' completion_probabilities equal to the
// /v1/completions logprobs, samplers lists, llama-server's other samplers
// taken only when off, the reported seed reproducing the answer, and
// images as multimodal_data equal to the chat endpoint's answer.
// usage: node native.mjs TEXT_URL VLM_URL IMAGE_FILE
import assert from 'node:assert/strict';
import { check, counts } from './check.mjs';
import { readFileSync } from 'node:fs';

const [base, vlm, imageFile] = process.argv.slice(2);
async function post(url, path, body) {
  const r = await fetch(url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, text: await r.text() };
}
async function json(url, path, body) {
  const r = await post(url, path, body);
  assert.equal(r.status, 200, `${path} ${JSON.stringify(body).slice(0, 200)}: ${r.status} ${r.text.slice(0, 300)}`);
  return JSON.parse(r.text);
}
const native = (body) => json(base, '/completion', body);
// a native stream: the events' objects, in order (every event is "data: {...}\n\n")
async function events(body) {
  const r = await post(base, '/completion', { ...body, stream: true });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  const ev = r.text.split('\n\n').filter((e) => e.length);
  for (const e of ev) assert.ok(e.startsWith('data: {'), `not a JSON data event: ${e.slice(0, 80)}`);
  return ev.map((e) => JSON.parse(e.slice(6)));
}

const P = 'Once upon a time';
const oai = await json(base, '/v1/completions', { prompt: P, max_tokens: 40, temperature: 0 });
const ref = oai.choices[0].text;

await check('text equals /v1/completions', async () => {
  const r = await native({ prompt: P, n_predict: 40, temperature: 0 });
  assert.equal(r.content, ref);
  assert.equal(r.stop, true);
  assert.equal(r.stop_type, 'limit');
  assert.equal(r.stopping_word, '');
  assert.equal(r.tokens_predicted, 40);
  assert.equal(r.tokens_evaluated, oai.usage.prompt_tokens);
  assert.deepEqual(r.tokens, []); // no return_tokens
  assert.equal(r.truncated, false);
  assert.equal(r.generation_settings.n_predict, 40);
  assert.equal(r.generation_settings.temperature, 0);
  assert.equal(r.kv.policy, 'full');
  assert.equal(r.timings.predicted_n, 40);
  assert.equal(r.model, oai.model);
  // max_tokens is taken as n_predict's other name, as llama-server does
  assert.equal((await native({ prompt: P, max_tokens: 40, temperature: 0 })).content, ref);
});

await check('stream', async () => {
  const all = await native({ prompt: P, n_predict: 40, temperature: 0, return_tokens: true });
  assert.equal(all.tokens.length, 40);
  const ev = await events({ prompt: P, n_predict: 40, temperature: 0 });
  const last = ev[ev.length - 1];
  assert.equal(last.stop, true);
  assert.equal(last.content, '');
  assert.equal(last.stop_type, 'limit');
  assert.equal(last.tokens_predicted, 40);
  let text = '';
  const ids = [];
  for (const e of ev.slice(0, -1)) {
    assert.equal(e.stop, false);
    assert.ok(e.tokens.length >= 1);
    text += e.content;
    ids.push(...e.tokens);
    assert.equal(e.tokens_predicted, ids.length);
  }
  assert.equal(text, ref);
  assert.deepEqual(ids, all.tokens);
  assert.ok(ev.length > 30, `${ev.length} events for 40 tokens`);
});

await check('stop word', async () => {
  const o = await json(base, '/v1/completions', { prompt: P, max_tokens: 40, temperature: 0, stop: ['park'] });
  const r = await native({ prompt: P, n_predict: 40, temperature: 0, stop: ['zzz', 'park'], n_probs: 1, return_tokens: true });
  assert.equal(r.content, o.choices[0].text);
  assert.ok(r.content.length > 10 && !r.content.includes('park'));
  assert.equal(r.stop_type, 'word');
  assert.equal(r.stopping_word, 'park');
  // the ids and probabilities of the text's tokens and of the one the stop string cut
  assert.equal(r.completion_probabilities.length, r.tokens.length);
  const spelled = (await json(base, '/detokenize', { tokens: r.tokens })).content;
  assert.ok(spelled.startsWith(r.content) && spelled.length > r.content.length, spelled);
});

// stories260K's </s> is token 2; a bias of +100 makes it the first token
await check('end of text', async () => {
  assert.equal((await json(base, '/detokenize', { tokens: [2] })).content, '</s>');
  const r = await native({ prompt: P, n_predict: 40, temperature: 0, logit_bias: [[2, 100]], n_probs: 2 });
  assert.equal(r.content, '');
  assert.equal(r.stop_type, 'eos');
  assert.equal(r.tokens_predicted, 0);
  assert.deepEqual(r.completion_probabilities, []);
  // the end-of-text token has no logprobs entry in OpenAI's shapes either (it once showed a stale one)
  const o = await json(base, '/v1/completions', { prompt: P, max_tokens: 40, temperature: 0, logit_bias: { 2: 100 }, logprobs: 2 });
  assert.equal(o.choices[0].text, '');
  assert.equal(o.choices[0].finish_reason, 'stop');
  assert.deepEqual(o.choices[0].logprobs.tokens, []);
  const c = await json(base, '/v1/chat/completions', {
    messages: [{ role: 'user', content: P }], max_tokens: 8, temperature: 0, logit_bias: { 2: 100 }, logprobs: true,
  });
  assert.deepEqual(c.choices[0].logprobs.content, []);
});

await check('n_predict 0 and -1', async () => {
  const z = await native({ prompt: P, n_predict: 0 });
  assert.equal(z.content, '');
  assert.equal(z.tokens_predicted, 0);
  assert.equal(z.tokens_evaluated, oai.usage.prompt_tokens);
  assert.equal(z.stop_type, 'limit');
  const n_ctx = (await (await fetch(`${base}/props`)).json()).default_generation_settings.n_ctx;
  const r = await native({ prompt: P, n_predict: -1, temperature: 0, ignore_eos: true });
  assert.equal(r.tokens_evaluated + r.tokens_predicted, n_ctx);
  assert.equal(r.truncated, true);
  assert.equal(r.stop_type, 'limit');
  assert.ok(r.content.startsWith(ref));
});

await check('mixed prompt', async () => {
  const tok = async (content, add_special) => (await json(base, '/tokenize', { content, add_special })).tokens;
  const head = await tok('Once upon', true);
  assert.equal(head[0], 1); // BOS
  const tail = await tok(' a time', false);
  const ids = [...head, ...tail];
  const a = await native({ prompt: ids, n_predict: 16, temperature: 0 });
  const b = await native({ prompt: ['Once upon', ...tail], n_predict: 16, temperature: 0 }); // a leading string gets BOS
  const c = await native({ prompt: [[...head, ' a time']], n_predict: 16, temperature: 0 }); // a later one does not
  assert.equal(a.tokens_evaluated, ids.length);
  for (const x of [b, c]) {
    assert.equal(x.content, a.content);
    assert.equal(x.tokens_evaluated, a.tokens_evaluated);
  }
});

await check('n_probs', async () => {
  const r = await native({ prompt: P, n_predict: 16, temperature: 0, n_probs: 3, return_tokens: true });
  const o = await json(base, '/v1/completions', { prompt: P, max_tokens: 16, temperature: 0, logprobs: 3 });
  const cp = r.completion_probabilities;
  assert.equal(cp.length, 16);
  cp.forEach((e, i) => {
    assert.equal(e.id, r.tokens[i]);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].id, e.id);
    assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob && e.top_logprobs[2].logprob <= e.top_logprobs[1].logprob);
    assert.equal(e.logprob, o.choices[0].logprobs.token_logprobs[i]);
    assert.equal(e.token, o.choices[0].logprobs.tokens[i]);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
  });
  const ev = await events({ prompt: P, n_predict: 16, temperature: 0, n_probs: 3, timings_per_token: true });
  const streamed = ev.flatMap((e) => e.completion_probabilities ?? []);
  assert.deepEqual(streamed.map((e) => [e.id, e.logprob]), cp.map((e) => [e.id, e.logprob]));
  for (const e of ev) assert.ok(e.timings && e.timings.prompt_n === o.usage.prompt_tokens, JSON.stringify(e).slice(0, 200));
});

await check('samplers and seeds', async () => {
  const q = { prompt: P, n_predict: 32, temperature: 0.9, seed: 7 };
  const noTopK = await native({ ...q, top_k: 0 });
  const listed = await native({ ...q, samplers: ['top_p', 'min_p', 'temperature'] });
  assert.equal(listed.content, noTopK.content);
  assert.equal(listed.generation_settings.top_k, 0);
  const dflt = await native(q);
  const full = await native({ ...q, samplers: ['penalties', 'dry', 'top_n_sigma', 'top_k', 'typ_p', 'top_p', 'min_p', 'xtc', 'temperature'] });
  assert.equal(full.content, dflt.content);
  // a request without a seed reports the one it drew; sent back, it gives the same answer
  const a = await native({ prompt: P, n_predict: 32, temperature: 0.9 });
  const b = await native({ prompt: P, n_predict: 32, temperature: 0.9, seed: a.generation_settings.seed });
  assert.equal(b.content, a.content);
});

await check('refusals and switches at off', async () => {
  const bad = [
    [{ mirostat: 2 }, 'mirostat'], [{ typical_p: 0.5 }, 'typical_p'], [{ dry_multiplier: 0.8 }, 'dry_multiplier'],
    [{ xtc_probability: 0.5 }, 'xtc_probability'], [{ grammar: 'root ::= "a"' }, 'grammar'], [{ json_schema: {} }, 'json_schema'],
    [{ n_cmpl: 2 }, 'n_cmpl'], [{ post_sampling_probs: true }, 'post_sampling_probs'], [{ dynatemp_range: 0.5 }, 'dynatemp_range'],
    [{ samplers: ['top_p', 'top_k', 'temperature'] }, 'samplers'], [{ samplers: ['top_k', 'warp', 'temperature'] }, 'samplers'],
    [{ samplers: ['top_k', 'top_p'] }, 'samplers'], [{ samplers: 'kpt' }, 'samplers'], [{ prompt: ['a', 'b'] }, 'prompt'],
    [{ prompt: [] }, 'prompt'], [{ prompt: {} }, 'prompt'], [{ prompt: [1, 99999] }, 'prompt'],
    [{ prompt: { prompt_string: 'x <image>', multimodal_data: ['aGVsbG8='] } }, 'prompt'], // no vision tower here
    [{ n_predict: -3 }, 'n_predict'], [{ n_probs: 21 }, 'n_probs'], [{ n_probs: 1.5 }, 'n_probs'], [{ min_keep: 5 }, 'min_keep'],
    [{ prompt: undefined, messages: [{ role: 'user', content: 'x' }] }, 'messages'],
    [{ prompt: Array(600).fill(5) }, 'prompt'], // longer than the context (-c 512)
  ];
  for (const [extra, param] of bad) {
    const r = await post(base, '/completion', { prompt: P, n_predict: 2, ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${r.status} ${r.text.slice(0, 200)}`);
    const err = JSON.parse(r.text).error;
    assert.equal(err.param, param, `${JSON.stringify(extra)}: ${r.text.slice(0, 300)}`);
    assert.ok(err.message.length > 10);
  }
  const off = {
    typical_p: 1, mirostat: 0, mirostat_tau: 5, mirostat_eta: 0.1, dry_multiplier: 0, dry_base: 1.75, xtc_probability: 0,
    xtc_threshold: 0.1, dynatemp_range: 0, top_n_sigma: -1, grammar: '', n_cmpl: 1, id_slot: -1, n_keep: 0,
    min_keep: 0, post_sampling_probs: false, lora: [], cache_prompt: true, n_indent: 0, t_max_predict_ms: 0,
  };
  const r = await native({ prompt: P, n_predict: 40, temperature: 0, ...off });
  assert.equal(r.content, ref);
});

await check('props media_marker', async () => {
  const p = await (await fetch(`${base}/props`)).json();
  assert.equal(p.media_marker, '<image>');
});

// images: the chat endpoint's prompt (from /apply-template, with a marker where the image goes)
// sent as prompt_string with the image as multimodal_data gives the chat's answer
await check('multimodal_data', async () => {
  const b64 = readFileSync(imageFile).toString('base64');
  const messages = [{ role: 'user', content: [{ type: 'text', text: 'Describe' }, { type: 'image_url', image_url: { url: `data:image/png;base64,${b64}` } }] }];
  const chat = await json(vlm, '/v1/chat/completions', { messages, max_tokens: 8, temperature: 0 });
  const prompt = (await json(vlm, '/apply-template', { messages })).prompt;
  const marker = (await (await fetch(`${vlm}/props`)).json()).media_marker;
  assert.equal(prompt.split(marker).length, 2, prompt);
  const r = await json(vlm, '/completion', { prompt: { prompt_string: prompt, multimodal_data: [b64] }, n_predict: 8, temperature: 0 });
  assert.equal(r.content, chat.choices[0].message.content);
  assert.equal(r.tokens_evaluated, chat.usage.prompt_tokens);
  const two = await post(vlm, '/completion', { prompt: { prompt_string: prompt, multimodal_data: [b64, b64] }, n_predict: 2 });
  assert.equal(two.status, 400, two.text);
  assert.equal(JSON.parse(two.text).error.param, 'prompt');
  const junk = await post(vlm, '/completion', { prompt: { prompt_string: prompt, multimodal_data: ['@@@'] }, n_predict: 2 });
  assert.equal(junk.status, 400, junk.text);
});

console.log(`native.mjs: ${counts.passed} checks passed`);
