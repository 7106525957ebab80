// serve_load.mjs — closed-loop load on an OpenAI-compatible completions
// endpoint (ekv serve, or llama.cpp's llama-server for comparison): C
// clients each send a streamed /v1/completions request, wait for its end and
// send the next, for a fixed time. Reports aggregate generated tokens/s,
// requests/s, time to first token and inter-token latency (p50/p99), the most
// sequences the server had admitted at once (ekv's /metrics), and the
// server's RSS (from /proc with --pid). A benchmark, not a test.
//
// usage: node bench/serve_load.mjs --url http://127.0.0.1:8080 [--concurrency 1,8,32,64]
//          [--text FILE.jsonl|.txt] [--prompt-tokens 2048-3584] [--max-tokens 128] [--duration 120]
//          [--kv '{"policy":"elastic","budget":0.2}'] [--label NAME] [--pid PID] [--json OUT.json]
//          [--token-ids VOCAB] (random token-id prompts, for synthetic models)
// Prompts are token slices of the text file (JSONL: the "text", "document" or
// "context" field of each line), tokenized by the server (POST /tokenize),
// their lengths drawn uniformly in the token range, sent as token ids.
import { readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';

function args() {
  const a = { concurrency: '1,8,32', 'prompt-tokens': '2048-3584', 'max-tokens': '128', duration: '120', label: '' };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i++) {
    if (!v[i].startsWith('--')) throw new Error(`unexpected ${v[i]}`);
    a[v[i].slice(2)] = v[i + 1];
    i++;
  }
  return a;
}
const A = args();
const url = A.url;
const maxTokens = Number(A['max-tokens']);
const duration = Number(A.duration) * 1000;
const warmup = Number(A.warmup ?? 0) * 1000; // excluded from the window: clients ramp up first
const [pmin, pmax] = A['prompt-tokens'].split('-').map(Number);
const kv = A.kv ? JSON.parse(A.kv) : null;
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);

// node:http rather than fetch: a request may wait in the server's queue for minutes, and
// fetch (undici) gives up after 300 s without a byte. One connection per request: reusing
// kept-alive sockets raced with llama-server closing idle ones ("socket hang up")
const agent = new http.Agent({ keepAlive: false, maxSockets: 1024 });
const inflight = new Set(); // requests under way: cut off at the end of a level's window
function postRaw(path, body) {
  return new Promise((resolve, reject) => {
    const u = new URL(path, url);
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': data.length } }, resolve);
    inflight.add(req);
    req.on('close', () => inflight.delete(req));
    req.on('error', reject);
    req.end(data);
  });
}
async function readAll(res) {
  const parts = [];
  for await (const c of res) parts.push(c);
  return Buffer.concat(parts).toString('utf8');
}
async function post(body) {
  const res = await postRaw('/v1/completions', body);
  if (res.statusCode !== 200) throw new Error(`${res.statusCode}: ${(await readAll(res)).slice(0, 300)}`);
  return res;
}

// ---- prompts ----
function loadText(path) {
  const raw = readFileSync(path, 'utf8');
  if (!path.endsWith('.jsonl')) return raw;
  return raw.split('\n').filter((l) => l.trim()).map((l) => {
    const o = JSON.parse(l);
    return o.text ?? o.document ?? o.context ?? Object.values(o).filter((x) => typeof x === 'string').join('\n');
  }).join('\n\n');
}
async function makePrompts(n) {
  if (A['token-ids']) {
    const V = Number(A['token-ids']);
    return Array.from({ length: n }, () => {
      const len = Math.floor(pmin + rnd() * (pmax - pmin));
      return Array.from({ length: len }, () => 1 + Math.floor(rnd() * (V - 1)));
    });
  }
  // real text, tokenized once by the server itself (POST /tokenize, as llama.cpp's server has
  // it), cut into token slices of the wanted lengths: every prompt has an exact length
  const text = loadText(A.text);
  const tokenize = async (content, add_special) => {
    const res = await postRaw('/tokenize', { content, add_special });
    const text = await readAll(res);
    if (res.statusCode !== 200) throw new Error(`/tokenize: ${res.statusCode} ${text}`);
    return JSON.parse(text).tokens;
  };
  const bos = await tokenize('', true);
  const all = [];
  for (let i = 0; i < text.length; i += 200000) all.push(...await tokenize(text.slice(i, i + 200000), false));
  const out = [];
  for (let i = 0; i < n; i++) {
    const len = Math.floor(pmin + rnd() * (pmax - pmin)) - bos.length;
    const start = Math.floor(rnd() * Math.max(1, all.length - len));
    out.push([...bos, ...all.slice(start, start + len)]);
  }
  return out;
}

// ---- one streamed request ----
async function one(prompt, rec) {
  const t0 = performance.now();
  const body = { prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true };
  if (kv) body.kv = kv;
  const r = await post(body);
  const dec = new TextDecoder();
  let buf = '';
  let last = null;
  let n = 0;
  for await (const chunk of r) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const c = JSON.parse(ev.slice(6));
      if (c.error) throw new Error(JSON.stringify(c.error));
      const text = c.choices?.[0]?.text ?? c.content ?? '';
      if (!text.length && !c.choices?.[0]?.finish_reason) continue;
      const now = performance.now();
      if (text.length) {
        n++;
        rec.tokenTimes.push(now);
        if (now >= rec.win0) { // latencies of the timed window only
          if (last === null) rec.ttft.push(now - t0);
          else rec.itl.push(now - last);
        }
        last = now;
      }
    }
  }
  rec.done.push({ t: performance.now(), n });
}

async function metrics() {
  try {
    const m = await (await fetch(`${url}/metrics`)).text();
    const get = (k) => Number((new RegExp(`^${k} ([0-9.e+-]+)`, 'm').exec(m) ?? [])[1]);
    return { running_max: get('ekv_requests_running_max'), kv_used: get('ekv_kv_bytes_used'), running: get('ekv_requests_running'),
      rows: get('ekv_decode_rows_total'), dsec: get('ekv_engine_decode_seconds_total'), psec: get('ekv_engine_prefill_seconds_total') };
  } catch { return {}; }
}
function rss() {
  if (!A.pid) return null;
  try {
    const s = readFileSync(`/proc/${A.pid}/status`, 'utf8');
    return Number(/VmRSS:\s+(\d+)/.exec(s)[1]) * 1024;
  } catch { return null; }
}
const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function level(C, prompts) {
  const rec = { tokenTimes: [], ttft: [], itl: [], done: [], errors: 0 };
  const tStart = performance.now();
  const t0 = tStart + warmup; // the timed window
  const tEnd = t0 + duration;
  rec.win0 = t0;
  let next = 0;
  let rssMax = 0;
  let runMax = 0;
  let m0 = null;
  const sampler = setInterval(async () => {
    if (!m0 && performance.now() >= t0) m0 = await metrics();
    rssMax = Math.max(rssMax, rss() ?? 0);
    const m = await metrics();
    if (m.running > runMax) runMax = m.running;
  }, 500);
  async function client() {
    while (performance.now() < tEnd) {
      const p = prompts[next++ % prompts.length];
      try { await one(p, rec); } catch (e) {
        if (performance.now() >= tEnd) break; // cut off at the end of the window
        if (rec.errors++ < 3) console.error(`request failed: ${e.message}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }
  // at the end of the window: read the counters, then hang up on every request
  // still under way (a long generation would otherwise run on for minutes; the
  // server cancels them and frees their caches)
  let m1 = null;
  const stopper = new Promise((resolve) => setTimeout(async () => {
    m1 = await metrics();
    for (const r of inflight) r.destroy();
    resolve();
  }, tEnd - performance.now()));
  await Promise.all([stopper, ...Array.from({ length: C }, client)]);
  clearInterval(sampler);
  await new Promise((r) => setTimeout(r, 1000)); // the server reaps the cancelled jobs
  const wall = (performance.now() - tStart) / 1000;
  // tokens and requests inside the timed window (after the warm-up; clients finish their last request after it)
  const inWin = rec.tokenTimes.filter((t) => t >= t0 && t <= tEnd).length;
  const reqs = rec.done.filter((d) => d.t >= t0 && d.t <= tEnd).length;
  const win = duration / 1000;
  return {
    label: A.label, concurrency: C, window_s: win, wall_s: wall, requests: reqs, errors: rec.errors,
    tokens: inWin, tok_s: inWin / win, req_s: reqs / win,
    ttft_p50_ms: pct(rec.ttft, 50), ttft_p99_ms: pct(rec.ttft, 99), itl_p50_ms: pct(rec.itl, 50), itl_p99_ms: pct(rec.itl, 99),
    running_max: runMax, rss_max_mib: rssMax / 1048576,
    // ekv only: decode rows per second of engine time spent in batched decode steps (the
    // decode throughput at the batch sizes admission allowed, prompt reading excluded)
    engine_decode_tok_s: m0 ? (m1.rows - m0.rows) / (m1.dsec - m0.dsec) : NaN,
    engine_prefill_share: m0 ? (m1.psec - m0.psec) / win : NaN,
  };
}

const levels = A.concurrency.split(',').map(Number);
const prompts = await makePrompts(256);
const results = [];
for (const C of levels) {
  const r = await level(C, prompts);
  results.push(r);
  console.log(JSON.stringify(r));
}
if (A.json) writeFileSync(A.json, JSON.stringify({ url, kv, max_tokens: maxTokens, prompt_tokens: A['prompt-tokens'], results }, null, 1));
