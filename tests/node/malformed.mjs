// malformed.mjs — robustness of ekv serve: well over 1,000 malformed
// requests (truncated and non-object JSON, wrong types and absurd numbers in
// every field, unknown KV policies and parameters, invalid UTF-8, oversized
// bodies by Content-Length and chunked, deep nesting, bad images, wrong
// paths and methods), each must be answered with a 4xx status and an
// OpenAI-shaped JSON error; afterwards the server answers a normal request
// exactly as before. Run against a server started with --max-body MAXBODY;
// VLM_URL (optional) is a server with a vision tower, for the image cases.
// usage: node malformed.mjs BASE_URL MAXBODY [VLM_URL]
import http from 'node:http';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const [base, maxBodyArg, vlmBase] = process.argv.slice(2);
const maxBody = Number(maxBodyArg);
const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });

function send(url, { method = 'POST', path, body = '', chunked = false }) {
  return new Promise((resolve, reject) => {
    const u = new URL(path, url);
    const buf = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
    const headers = { 'Content-Type': 'application/json' };
    if (!chunked && method !== 'GET') headers['Content-Length'] = buf.length;
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method, headers, agent }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, type: res.headers['content-type'], body: Buffer.concat(parts).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (method !== 'GET') {
      if (chunked) for (let i = 0; i < buf.length; i += 1000) req.write(buf.subarray(i, i + 1000));
      else req.write(buf);
    }
    req.end();
  });
}

const cases = [];
const add = (what, opts, want = null) => cases.push({ what, opts, want });
const C = '/v1/completions';
const H = '/v1/chat/completions';
const good = { prompt: 'Once upon a time', max_tokens: 16, temperature: 0 };
const goodChat = { messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 16, temperature: 0 };

// 1. truncated JSON: every proper prefix of four valid bodies
const sources = [
  [C, JSON.stringify({ ...good, kv: { policy: 'h2o', budget: 0.5 }, stop: ['a', 'b'] })],
  [H, JSON.stringify({ ...goodChat, stream: true, stream_options: { include_usage: true } })],
  [H, JSON.stringify({ messages: [{ role: 'system', content: 'Sé breve. 日本語 ✓' }, { role: 'user', content: [{ type: 'text', text: 'Hi' }] }], kv_policy: 'elastic', kv_budget: 0.2 })],
  [C, JSON.stringify({ prompt: [1, 2, 3, 4, 5], max_tokens: 4, seed: 42, top_k: 5, top_p: 0.9, min_p: 0.1 })],
];
for (const [path, body] of sources) {
  const bytes = Buffer.from(body, 'utf8');
  for (let n = 0; n < bytes.length; n++) add(`truncated ${path} at ${n}`, { path, body: bytes.subarray(0, n) });
}

// 2. not one JSON object
for (const b of ['[]', '"x"', '5', 'null', 'true', '{} {}', '{"prompt": "x"} x', '{"prompt": "x",}', "{'prompt': 'x'}",
  '{"prompt": NaN}', '{"prompt": "x", "temperature": Infinity}', '{"prompt": "x", "max_tokens": 0x10}',
  '{"prompt": "\\ud800"}', '{"prompt": "\\udc00x"}', '{"prompt": "\\u12"}', '{"prompt": "a\u0001b"}', ' ', '\n'])
  for (const p of [C, H]) add(`not an object: ${b}`, { path: p, body: b });
add('deep nesting', { path: C, body: '{"prompt": ' + '['.repeat(5000) + ']'.repeat(5000) + '}' });
add('deep nesting 2', { path: H, body: '{"messages": [' + '{"a":'.repeat(3000) + '1' + '}'.repeat(3000) + ']}' });

// 3. wrong types and absurd numbers, field by field
const bad = {
  prompt: [true, 5, {}, [], [[]], [1.5], [-1], [1e9], ['a', 5], [[1], {}], [['a']], Array(65).fill('a'), [null]],
  max_tokens: ['10', true, -1, 0, 1.5, 1e30, -1e30, [], {}, 2 ** 31],
  max_completion_tokens: [0, 'x', -5],
  temperature: ['0', -0.1, 2.5, 1e308, true, [], {}],
  top_p: [-1, 1.5, 'x', true], top_k: [-1, 0.5, 'x', 1e12], min_p: [2, -1, 'x'],
  seed: ['x', 1.5, 1e30, true, {}],
  stop: [5, [1], ['a', 'b', 'c', 'd', 'e'], [''], {}, '', ['x'.repeat(2000)], true],
  stream: ['yes', 1, {}], stream_options: [5, 'x', { include_usage: 'x' }],
  n: [17, 0, '1', 1.5], presence_penalty: ['x', 5, -2.5], frequency_penalty: [3, 'x', {}],
  repeat_penalty: [0, -1, 'x', 1e7], repeat_last_n: [-2, 1.5, 'x', 1e9],
  logprobs: ['x', 21, -1, 1.5, {}], top_logprobs: [3, 21, -1, 'x'], tools: [[{}]], functions: [[{}]], tool_choice: ['auto', {}],
  logit_bias: [{ 99999: 5 }, 'x', 5, { 1: 500 }, { 1: 'x' }, { a: 1 }, { '-1': 1 }, [[1]], [[1, 2, 3]], [[{}, 1]], [1]], response_format: [{ type: 'json_object' }, 'x', {}], echo: [true], best_of: [3, 'x'],
  suffix: ['x'], model: [5, {}, true], user: [5], ignore_eos: ['x', 1],
  kv: [5, 'x', [], true],
};
for (const [field, values] of Object.entries(bad))
  for (const v of values) {
    add(`completion ${field}=${JSON.stringify(v)?.slice(0, 40)}`, { path: C, body: JSON.stringify({ ...good, [field]: v }) });
    if (field !== 'prompt') add(`chat ${field}=${JSON.stringify(v)?.slice(0, 40)}`, { path: H, body: JSON.stringify({ ...goodChat, [field]: v }) });
  }
// KV parameters: validated by the CLI's own rows
const badKv = [
  { policy: 5 }, { policy: 'nope' }, { policy: '' }, { policy: 'H2O' }, { policy: 'x'.repeat(100) }, { budget: 0 },
  { budget: -1 }, { budget: 1.01 }, { budget: 1e-9 }, { budget: 'x' }, { budget: true }, { budget: null, sinks: -2 },
  { sinks: 1.5 }, { sinks: 1e12 }, { pool: 4 }, { pool: 0 }, { pool: 2001 }, { pool_type: 'med' }, { pool_type: 3 },
  { compat: 'x' }, { nosuch: 1 }, { mem: 5 }, { Policy: 'h2o' }, { obs_window: 0 }, { beta: 0.5 }, { beta: 1e9 },
  { sparsity_p: 2 }, { recent_ratio: -1 }, { chunk: -5 }, { tokens: 0 }, { tokens: -1 }, { distance: 1e20 },
  { seed: -1 }, { seed: 1.5 }, { '': 1 }, { 'kv-budget': 0.5 }, { window: -3 }, { window: [] }, { policy: {} },
];
for (const kv of badKv) {
  add(`kv ${JSON.stringify(kv).slice(0, 60)}`, { path: C, body: JSON.stringify({ ...good, kv }) });
  add(`chat kv ${JSON.stringify(kv).slice(0, 60)}`, { path: H, body: JSON.stringify({ ...goodChat, kv }) });
  const top = Object.fromEntries(Object.entries(kv).map(([k, v]) => [`kv_${k}`, v]));
  if (Object.keys(kv)[0] !== '') add(`kv_* ${JSON.stringify(top).slice(0, 60)}`, { path: C, body: JSON.stringify({ ...good, ...top }) });
}
// unknown policies
for (let i = 0; i < 60; i++) {
  const name = ['x', 'fullx', 'h2', 'elastic2', 'lru', 'snap kv', 'LOCAL', 'random ', ' tova', 'vl-cache'][i % 10] + (i >= 10 ? String(i) : '');
  add(`policy ${name}`, { path: i % 2 ? C : H, body: JSON.stringify({ ...(i % 2 ? good : goodChat), kv: { policy: name, budget: 0.5 } }) });
}
// chat messages
for (const m of [undefined, 'x', [], [5], [{}], [{ role: 'user' }], [{ role: 'tool', content: 'x' }], [{ role: 5, content: 'x' }],
  [{ role: 'user', content: 5 }], [{ role: 'user', content: null }], [{ role: 'user', content: [{ type: 'audio' }] }],
  [{ role: 'user', content: [{ type: 'text' }] }], [{ role: 'user', content: [5] }], [{ role: 'user', content: [{ text: 'x' }] }],
  [{ role: 'function', content: 'x' }], [{ role: 'user', content: 'x' }, 5],
  [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }],
  Array.from({ length: 5000 }, () => ({ role: 'user', content: 'x' }))])
  add(`messages ${JSON.stringify(m)?.slice(0, 50)}`, { path: H, body: JSON.stringify({ max_tokens: 4, messages: m }) });
add('prompt beyond the context', { path: C, body: JSON.stringify({ prompt: 'a b '.repeat(3000), max_tokens: 4 }) });
add('chat beyond the context', { path: H, body: JSON.stringify({ messages: [{ role: 'user', content: 'a b '.repeat(3000) }] }) });
add('completion with an image marker', { path: C, body: JSON.stringify({ prompt: 'look <image> here' }) });

// 4. invalid UTF-8 inside strings
const utf8Bad = [[0x80], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf5, 0x80, 0x80, 0x80], [0xff], [0xfe],
  [0xc3], [0xe6, 0x97], [0xf0, 0x9f, 0x98], [0xf4, 0x90, 0x80, 0x80], [0xc3, 0x28]];
for (const seq of utf8Bad)
  for (const [path, obj, key] of [[C, good, 'prompt'], [H, null, null], [C, { ...good, stop: 'PLACE' }, 'stop'],
    [C, { ...good, kv: { policy: 'PLACE' } }, null], [C, { ...good, model: 'PLACE' }, 'model']]) {
    const text = obj ? JSON.stringify(obj) : JSON.stringify({ messages: [{ role: 'user', content: 'PLACE' }] });
    const at = text.includes('PLACE') ? text.indexOf('PLACE') : text.indexOf('Once');
    const body = Buffer.concat([Buffer.from(text.slice(0, at)), Buffer.from(seq), Buffer.from(text.slice(at + 5))]);
    add(`invalid UTF-8 ${seq.map((b) => b.toString(16)).join(' ')} in ${key ?? path}`, { path, body });
  }

// 5. oversized bodies (413), by Content-Length and chunked
for (const extra of [1, 10, 1000, maxBody]) {
  const body = JSON.stringify({ prompt: 'a'.repeat(maxBody + extra) });
  add(`oversized +${extra}`, { path: C, body }, 413);
  add(`oversized chunked +${extra}`, { path: H, body, chunked: true }, 413);
}
add('no body', { path: C, body: '' });
for (const b of ['', '[]', '{}', '{"content": 5}', '{"content": "x", "add_special": "yes"}', '{"content": "x"'])
  add(`tokenize ${b}`, { path: '/tokenize', body: b });
add('tokenize invalid UTF-8', { path: '/tokenize', body: Buffer.concat([Buffer.from('{"content": "'), Buffer.from([0xff]), Buffer.from('"}')]) });

// 6. wrong paths and methods
for (const [method, path, want] of [['GET', C, 405], ['GET', H, 405], ['POST', '/v1/models', 405], ['POST', '/health', 405],
  ['DELETE', '/v1/models', 405], ['POST', '/v2/completions', 404], ['GET', '/', 404], ['PUT', C, 405],
  ['POST', '/v1/completions/', 404], ['GET', '/v1/embeddings', 404], ['GET', '/tokenize', 405], ['POST', '/v1/embeddings', 404]])
  add(`${method} ${path}`, { method, path, body: method === 'GET' ? '' : '{}' }, want);

// 7. bad images, on a server with a vision tower
if (vlmBase) {
  const jpg = readFileSync(new URL('../../data/images/astronaut_crop.jpg', import.meta.url));
  const img = (url) => JSON.stringify({ max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'What is it?' }, { type: 'image_url', image_url: typeof url === 'string' ? { url } : url }] }] });
  const urls = [
    'data:image/jpeg;base64,!!!!', 'data:image/jpeg;base64,', 'data:image/jpeg;base64,QUJD=', 'data:image/jpeg,rawdata',
    'http://example.com/a.jpg', 'https://example.com/a.png', 'file:///etc/passwd',
    'data:image/jpeg;base64,' + Buffer.from('not an image at all').toString('base64'),
    'data:image/jpeg;base64,' + jpg.subarray(0, 200).toString('base64'),
    'data:image/jpeg;base64,' + jpg.subarray(0, jpg.length / 2).toString('base64'),
    'data:image/png;base64,' + Buffer.concat([Buffer.from('\x89PNG\r\n\x1a\n', 'latin1'), Buffer.alloc(64, 0xff)]).toString('base64'),
    'data:image/jpeg;base64,' + jpg.toString('base64').replace(/[A-Z]/g, '-').slice(0, 400), '', 5,
  ];
  for (const u of urls) cases.push({ what: `image ${String(u).slice(0, 40)}`, opts: { path: H, body: img(u) }, want: null, base: vlmBase });
  for (const iu of [5, 'x', {}, { url: 5 }, null])
    cases.push({ what: `image_url ${JSON.stringify(iu)}`, opts: { path: H, body: JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: iu }] }] }) }, base: vlmBase });
  const many = Array.from({ length: 17 }, () => ({ type: 'image_url', image_url: { url: 'data:image/jpeg;base64,' + jpg.toString('base64') } }));
  cases.push({ what: '17 images', opts: { path: H, body: JSON.stringify({ messages: [{ role: 'user', content: many }] }) }, base: vlmBase });
}

// ---- run ----
async function normal(url) {
  const r = await send(url, { path: C, body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 32, temperature: 0 }) });
  assert.equal(r.status, 200, r.body);
  return JSON.parse(r.body).choices[0].text;
}
const before = await normal(base);
let failed = 0;
let next = 0;
async function worker() {
  while (next < cases.length) {
    const c = cases[next++];
    let r;
    try {
      r = await send(c.base ?? base, c.opts);
    } catch (e) {
      failed++;
      console.error(`FAIL ${c.what}: ${e}`);
      continue;
    }
    let okShape = false;
    try {
      const j = JSON.parse(r.body);
      okShape = typeof j.error?.message === 'string' && typeof j.error?.type === 'string' && 'param' in j.error && 'code' in j.error;
    } catch { /* not JSON */ }
    const okStatus = c.want ? r.status === c.want : r.status >= 400 && r.status < 500;
    if (!okStatus || !okShape || !/^application\/json/.test(r.type ?? '')) {
      failed++;
      console.error(`FAIL ${c.what}: ${r.status} ${r.type} ${r.body.slice(0, 200)}`);
    }
  }
}
await Promise.all(Array.from({ length: 8 }, worker));
const after = await normal(base);
if (vlmBase) { // and a good image still works there
  const jpg = readFileSync(new URL('../../data/images/astronaut_crop.jpg', import.meta.url));
  const r = await send(vlmBase, { path: H, body: JSON.stringify({ max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'text', text: 'What is it?' }, { type: 'image_url', image_url: { url: 'data:image/jpeg;base64,' + jpg.toString('base64') } }] }] }) });
  if (r.status !== 200 || !(JSON.parse(r.body).usage.prompt_tokens > 16)) {
    failed++;
    console.error(`FAIL a good image: ${r.status} ${r.body.slice(0, 300)}`);
  }
}
const health = await send(base, { method: 'GET', path: '/health' });
console.log(`malformed: ${cases.length} requests, ${failed} failed; normal request before/after ${before === after ? 'equal' : 'DIFFERENT'}`);
if (cases.length < 1000) console.error('FAIL fewer than 1000 cases');
if (failed || before !== after || health.status !== 200 || cases.length < 1000) process.exitCode = 1;
agent.destroy();
