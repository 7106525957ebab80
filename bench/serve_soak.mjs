// serve_soak.mjs — the soak of issue 23 (not a test; bench/serve_soak.sh runs
// it): C clients send a mix of requests to ekv serve for a fixed time, each on
// its own connection (raw sockets, so that every byte the server sends is
// seen): completions and chats, streams read in full, streams cancelled part
// way, streams read slowly (paused for seconds) and streams never read (held,
// then dropped), malformed requests (bad JSON, bad fields, bad HTTP framing)
// and oversized bodies. Every answer is checked: one HTTP response per
// request and nothing after it, 200 with a well-formed body (a stream ends in
// exactly one [DONE] after one finish_reason), 503 only as the documented
// server_busy with Retry-After, 4xx for the malformed ones as OpenAI's JSON
// error object. Each --sample seconds one CSV row: the server's RSS, open file
// descriptors and threads (from /proc with --pid), requests by outcome and
// latency percentiles of the interval.
//
// usage: node bench/serve_soak.mjs --url http://127.0.0.1:PORT --pid PID [--duration 3600]
//          [--concurrency 32] [--sample 60] [--max-body BYTES] [--csv OUT.csv] [--json OUT.json]
//          [--text FILE.jsonl] [--seed N]
// Exit status 1 when a check failed (the first failures are printed).
import { readFileSync, readdirSync, writeFileSync, appendFileSync } from 'node:fs';
import net from 'node:net';

function args() {
  const a = { duration: '3600', concurrency: '32', sample: '60', 'max-body': '1048576', seed: '1' };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    if (!v[i].startsWith('--') || i + 1 >= v.length) throw new Error(`bad argument ${v[i]}`);
    a[v[i].slice(2)] = v[i + 1];
  }
  return a;
}
const A = args();
const url = new URL(A.url);
const host = url.hostname;
const port = Number(url.port);
const pid = A.pid ? Number(A.pid) : 0;
const duration = Number(A.duration) * 1000;
const C = Number(A.concurrency);
const sampleMs = Number(A.sample) * 1000;
const maxBody = Number(A['max-body']);
let seed = Number(A.seed) >>> 0 || 1;
const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rnd() * a.length)];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// prompts: pieces of the text file's documents, else a few fixed ones
let texts = ['static int', 'The kernel', '#include <linux/', 'Once upon a time', 'struct device *dev'];
if (A.text) {
  const docs = readFileSync(A.text, 'utf8').split('\n').filter((l) => l.trim())
    .map((l) => { const o = JSON.parse(l); return o.text ?? o.document ?? o.context ?? ''; }).filter((s) => s.length > 400);
  if (docs.length) texts = docs;
}
const prompt = () => {
  const t = pick(texts);
  const n = 40 + Math.floor(rnd() * 1200); // characters: ~10-400 tokens
  const at = Math.floor(rnd() * Math.max(1, t.length - n));
  return t.slice(at, at + n);
};
const kvs = [null, { policy: 'h2o', budget: 0.5 }, { policy: 'snapkv', budget: 0.3 }, { policy: 'local', budget: 0.25 },
  { policy: 'elastic-v2', budget: 0.2 }, { policy: 'tova', budget: 0.4, type: 'q8_0' }, { policy: 'full', type: 'kivi4' }];

// ---- one exchange on a fresh connection: send, read until the server closes ----
// mode: 'read' | {cancelAfter: n events} | {pauseMs} | {stallMs}
function exchange(reqBytes, mode = 'read', timeoutMs = 600000) {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    const chunks = [];
    let got = 0;
    let events = 0;
    let done = false;
    let firstAt = 0;
    const t0 = performance.now();
    const finish = (how, err) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ how, err, data: Buffer.concat(chunks), ms: performance.now() - t0, firstMs: firstAt ? firstAt - t0 : 0 });
    };
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    s.on('connect', () => {
      const parts = Array.isArray(reqBytes) ? reqBytes : [reqBytes];
      for (const p of parts) s.write(p);
      if (mode.stallMs !== undefined) { s.pause(); setTimeout(() => finish('stalled'), mode.stallMs); }
    });
    s.on('data', (d) => {
      chunks.push(d);
      got += d.length;
      if (!firstAt && /"(text|content)":"[^"]/.test(d.toString('latin1'))) firstAt = performance.now(); // the first token
      if (mode.cancelAfter !== undefined) {
        events += d.toString('latin1').split('\ndata: {').length - 1;
        if (events >= mode.cancelAfter) finish('cancelled');
      }
      if (mode.pauseMs !== undefined && !mode.paused) {
        mode.paused = true;
        s.pause();
        setTimeout(() => s.resume(), mode.pauseMs);
      }
    });
    s.on('end', () => finish('closed'));
    s.on('error', (e) => finish(got ? 'closed' : 'error', e.code ?? String(e)));
  });
}

// ---- the response: status line, headers, body (Content-Length or chunked), what follows ----
function parseResponse(buf) {
  const he = buf.indexOf('\r\n\r\n');
  if (he < 0) return { error: 'no complete response header' };
  const head = buf.subarray(0, he).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3}) /.exec(head[0]);
  if (!m) return { error: `bad status line ${JSON.stringify(head[0].slice(0, 60))}` };
  const headers = {};
  for (const l of head.slice(1)) {
    const i = l.indexOf(':');
    if (i > 0) headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
  }
  let p = he + 4;
  let body;
  if ((headers['transfer-encoding'] ?? '').toLowerCase() === 'chunked') {
    const parts = [];
    for (;;) {
      const e = buf.indexOf('\r\n', p);
      if (e < 0) return { error: 'chunked body cut' };
      const n = parseInt(buf.subarray(p, e).toString('latin1'), 16);
      if (!(n >= 0)) return { error: 'bad chunk size' };
      p = e + 2;
      if (n === 0) {
        const te = buf.indexOf('\r\n', p); // no trailers expected: one empty line
        if (te < 0) return { error: 'chunked body without its last CRLF' };
        p = te + 2;
        break;
      }
      if (p + n + 2 > buf.length) return { error: 'chunk cut' };
      parts.push(buf.subarray(p, p + n));
      p += n + 2;
    }
    body = Buffer.concat(parts);
  } else if (headers['content-length'] !== undefined) {
    const n = Number(headers['content-length']);
    if (p + n > buf.length) return { error: 'body shorter than Content-Length' };
    body = buf.subarray(p, p + n);
    p += n;
  } else {
    body = buf.subarray(p);
    p = buf.length;
  }
  return { status: Number(m[1]), headers, body: body.toString('utf8'), extra: buf.length - p };
}

function request(method, path, body, extraHeaders = '') {
  const b = Buffer.from(body ?? '');
  return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: ${host}:${port}\r\nConnection: close\r\n` +
    (body !== undefined ? `Content-Type: application/json\r\nContent-Length: ${b.length}\r\n` : '') + extraHeaders + '\r\n'), b]);
}

// ---- counters ----
const tot = { sent: 0, ok: 0, busy: 0, refused4xx: 0, cancelled: 0, stalled: 0, fail: 0, nonJsonError: 0 };
const byKind = {};
let iv = { ok: 0, busy: 0, fail: 0, lat: [], ttft: [] };
const failures = [];
const failKinds = {};
function fail(kind, why) {
  tot.fail++;
  iv.fail++;
  failKinds[kind] = (failKinds[kind] ?? 0) + 1;
  if (failures.length < 20) failures.push(`${kind}: ${why}`);
}
const isBusy = (r) => r.status === 503 && r.headers['retry-after'] && /"code":"server_busy"/.test(r.body);
const isJsonError = (r) => { try { const e = JSON.parse(r.body).error; return e && typeof e.message === 'string' && 'type' in e && 'param' in e && 'code' in e; } catch { return false; } };

// checks one answer; expect: 'ok' (200 or busy) | 'error' (a 4xx) | 'any' (only framing)
function check(kind, x, expect, stream) {
  (byKind[kind] ??= { n: 0, ok: 0, busy: 0, err4xx: 0 }).n++;
  if (x.how === 'error' || x.how === 'timeout') return fail(kind, `no answer (${x.how} ${x.err ?? ''})`);
  const r = parseResponse(x.data);
  if (r.error) return fail(kind, `${r.error}: ${JSON.stringify(x.data.subarray(0, 120).toString('latin1'))}`);
  if (r.extra) return fail(kind, `${r.extra} bytes after the response (answered twice?): ${JSON.stringify(x.data.toString('latin1').slice(0, 200))}`);
  if (r.status >= 500 && !isBusy(r)) return fail(kind, `status ${r.status}: ${r.body.slice(0, 200)}`);
  if (isBusy(r)) { tot.busy++; iv.busy++; byKind[kind].busy++; return; }
  if (expect === 'error') {
    if (r.status < 400 || r.status >= 500) return fail(kind, `expected a 4xx, got ${r.status}: ${r.body.slice(0, 120)}`);
    if (!isJsonError(r)) { tot.nonJsonError++; if (failures.length < 20) failures.push(`${kind}: ${r.status} not the JSON error object: ${r.body.slice(0, 120)}`); }
    tot.refused4xx++;
    byKind[kind].err4xx++;
    return;
  }
  if (r.status !== 200) return fail(kind, `status ${r.status}: ${r.body.slice(0, 200)}`);
  if (stream) {
    const ev = r.body.split('\n\n').filter((e) => e.length);
    if (ev[ev.length - 1] !== 'data: [DONE]') return fail(kind, 'stream does not end in [DONE]');
    let fin = 0;
    for (const e of ev.slice(0, -1)) {
      if (!e.startsWith('data: ')) return fail(kind, `not an SSE event: ${e.slice(0, 80)}`);
      let c;
      try { c = JSON.parse(e.slice(6)); } catch { return fail(kind, `event not JSON: ${e.slice(0, 80)}`); }
      if (c.error) return fail(kind, `error event ${JSON.stringify(c.error).slice(0, 120)}`);
      if (c.choices?.[0]?.finish_reason) fin++;
    }
    if (fin !== 1) return fail(kind, `${fin} finish_reason events`);
    if (ev.filter((e) => e === 'data: [DONE]').length !== 1) return fail(kind, 'more than one [DONE]');
    iv.ttft.push(x.firstMs);
  } else {
    let o;
    try { o = JSON.parse(r.body); } catch { return fail(kind, `body not JSON: ${r.body.slice(0, 100)}`); }
    const c = o.choices?.[0];
    if (!c || typeof (c.text ?? c.message?.content) !== 'string' || !(o.usage?.completion_tokens >= 1)) return fail(kind, `bad body ${r.body.slice(0, 200)}`);
    iv.lat.push(x.ms);
  }
  tot.ok++;
  iv.ok++;
  byKind[kind].ok++;
}

// ---- the mix ----
const malformed = [
  () => request('POST', '/v1/completions', '{"prompt": "x", "max_tokens": '),
  () => request('POST', '/v1/completions', '{"prompt": "x", "max_tokens": 01}'),
  () => request('POST', '/v1/completions', '{"prompt": "a\u0001b"}'.replace('\u0001', '\x01')),
  () => request('POST', '/v1/completions', '{"prompt": "x", "temperature": "hot"}'),
  () => request('POST', '/v1/completions', '{"messages": [{"role": "user", "content": "x"}]}'),
  () => request('POST', '/v1/chat/completions', '{"messages": [{"role": "wizard", "content": "x"}]}'),
  () => request('POST', '/v1/completions', '{"prompt": "x", "kv": {"policy": "nope"}}'),
  () => request('POST', '/v1/completions', '{"prompt": "x", "kv": {"budget": 7}}'),
  () => request('GET', '/v1/nothing-here'),
  () => request('DELETE', '/v1/completions'),
  () => request('POST', '/v1/completions', '{"prompt": "x"}', 'Content-Type: text/plain\r\n').toString('latin1')
    .replace('Content-Type: application/json\r\n', ''),
  () => Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 15\r\n\r\n{"prompt": "x"}`),
  // framing libmicrohttpd reads before ekv sees the request
  () => Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: -4\r\n\r\n'),
  () => Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 1x\r\n\r\n'),
  () => Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nBad header line\r\n\r\n'),
];
// a chunked body whose chunk syntax is wrong (the door answers it: JSON like every other error)
const badChunks = () => Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n');

// two answers on one connection: the first request's (200, or 503 busy), then the JSON 4xx of a malformed one
function checkKeptAlive(kind, x) {
  (byKind[kind] ??= { n: 0, ok: 0, busy: 0, err4xx: 0 }).n++;
  if (x.how === 'error' || x.how === 'timeout') return fail(kind, `no answer (${x.how} ${x.err ?? ''})`);
  const r1 = parseResponse(x.data);
  if (r1.error) return fail(kind, `first answer: ${r1.error}`);
  if (isBusy(r1)) { tot.busy++; iv.busy++; byKind[kind].busy++; return; }
  if (r1.status !== 200) return fail(kind, `first answer: status ${r1.status}: ${r1.body.slice(0, 200)}`);
  const r2 = parseResponse(x.data.subarray(x.data.length - r1.extra));
  if (r2.error) return fail(kind, `second answer: ${r2.error}: ${JSON.stringify(x.data.subarray(x.data.length - r1.extra).toString('latin1').slice(0, 120))}`);
  if (r2.extra) return fail(kind, `${r2.extra} bytes after the second answer`);
  if (r2.status < 400 || r2.status >= 500) return fail(kind, `second answer: expected a 4xx, got ${r2.status}`);
  if (!isJsonError(r2)) { tot.nonJsonError++; if (failures.length < 20) failures.push(`${kind}: ${r2.status} not the JSON error object: ${r2.body.slice(0, 120)}`); }
  tot.ok++; iv.ok++; byKind[kind].ok++;
  tot.refused4xx++; byKind[kind].err4xx++;
}

async function one(id) {
  const u = rnd();
  const kv = pick(kvs);
  const base = { max_tokens: 8 + Math.floor(rnd() * 56), ...(kv ? { kv } : {}) };
  tot.sent++;
  if (u < 0.25) {
    const x = await exchange(request('POST', '/v1/completions', JSON.stringify({ prompt: prompt(), ...base })));
    check('completion', x, 'ok', false);
  } else if (u < 0.38) {
    const msgs = [{ role: 'system', content: 'You write C.' }, { role: 'user', content: prompt() }];
    const x = await exchange(request('POST', '/v1/chat/completions', JSON.stringify({ messages: msgs, ...base })));
    check('chat', x, 'ok', false);
  } else if (u < 0.58) {
    const x = await exchange(request('POST', '/v1/completions', JSON.stringify({ prompt: prompt(), stream: true,
      stream_options: { include_usage: true }, ...base })));
    check('stream', x, 'ok', true);
  } else if (u < 0.68) {
    const x = await exchange(request('POST', '/v1/completions', JSON.stringify({ prompt: prompt(), stream: true,
      ...base, max_tokens: 200, ignore_eos: true })), { cancelAfter: 1 + Math.floor(rnd() * 8) });
    if (x.how === 'cancelled') { tot.cancelled++; (byKind.cancel ??= { n: 0 }).n++; } else check('cancel', x, 'ok', true);
  } else if (u < 0.76) {
    const x = await exchange(request('POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: prompt() }],
      stream: true, ...base })), { pauseMs: 2000 + Math.floor(rnd() * 8000) });
    check('slow_reader', x, 'ok', true);
  } else if (u < 0.80) {
    const x = await exchange(request('POST', '/v1/completions', JSON.stringify({ prompt: prompt(), stream: true,
      ...base, max_tokens: 256, ignore_eos: true })), { stallMs: 5000 + Math.floor(rnd() * 25000) });
    tot.stalled++;
    (byKind.stalled_reader ??= { n: 0 }).n++;
    if (x.how !== 'stalled') check('stalled_reader', x, 'any', true);
  } else if (u < 0.935) {
    const x = await exchange(pick(malformed)(), 'read', 60000);
    check('malformed', x, 'error', false);
  } else if (u < 0.94) {
    // kept alive: a completion, then on the same connection (pipelined) a malformed request
    const first = Buffer.from(request('POST', '/v1/completions', JSON.stringify({ prompt: prompt(), ...base }))
      .toString('latin1').replace('Connection: close\r\n', ''), 'latin1');
    const bad = pick(malformed)();
    const x = await exchange(Buffer.concat([first, Buffer.isBuffer(bad) ? bad : Buffer.from(bad, 'latin1')]), 'read', 60000);
    checkKeptAlive('kept_alive_malformed', x);
  } else if (u < 0.95) {
    const x = await exchange(badChunks(), 'read', 60000);
    check('bad_chunks', x, 'error', false);
  } else {
    // a body over --max-body, sent in full (the server reads and drops it, then answers 413):
    // with its Content-Length, or chunked
    let req;
    if (rnd() < 0.5) {
      const n = maxBody + 1 + Math.floor(rnd() * 1e6);
      const head = `POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${n}\r\n\r\n`;
      req = [Buffer.from(head), Buffer.alloc(n, 0x20)];
    } else {
      const parts = [Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n')];
      for (let n = 0; n <= maxBody; n += 65536) parts.push(Buffer.from('10000\r\n'), Buffer.alloc(65536, 0x20), Buffer.from('\r\n'));
      parts.push(Buffer.from('0\r\n\r\n'));
      req = parts;
    }
    const x = await exchange(req, 'read', 60000);
    check('oversized', x, 'error', false);
  }
}

// ---- sampling ----
function procStat() {
  if (!pid) return { rss: 0, fds: 0, threads: 0 };
  const st = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k) => Number((new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(st) ?? [0, 0])[1]);
  return { rss: kb('VmRSS') / 1024, fds: readdirSync(`/proc/${pid}/fd`).length, threads: kb('Threads') };
}
const pct = (a, q) => { if (!a.length) return 0; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(q * s.length))]; };
const samples = [];
const t0 = Date.now();
function sample(tag = '') {
  const p = procStat();
  const row = { t_s: Math.round((Date.now() - t0) / 1000), rss_mib: +p.rss.toFixed(1), fds: p.fds, threads: p.threads,
    ok: iv.ok, busy: iv.busy, fail: iv.fail, lat_p50_ms: Math.round(pct(iv.lat, 0.5)), lat_p95_ms: Math.round(pct(iv.lat, 0.95)),
    ttft_p50_ms: Math.round(pct(iv.ttft, 0.5)), ttft_p95_ms: Math.round(pct(iv.ttft, 0.95)), inflight, tag };
  samples.push(row);
  if (A.csv) appendFileSync(A.csv, (samples.length === 1 ? Object.keys(row).join(',') + '\n' : '') + Object.values(row).join(',') + '\n');
  process.stderr.write(`serve_soak: ${row.t_s} s: RSS ${row.rss_mib} MiB, ${row.fds} fds, ${row.threads} threads; ` +
    `${row.ok} ok, ${row.busy} busy, ${row.fail} failed this interval; latency p50/p95 ${row.lat_p50_ms}/${row.lat_p95_ms} ms, ` +
    `TTFT p50 ${row.ttft_p50_ms} ms; total ${tot.sent} sent\n`);
  iv = { ok: 0, busy: 0, fail: 0, lat: [], ttft: [] };
}

let inflight = 0;
async function client(id) {
  while (Date.now() - t0 < duration) {
    inflight++;
    try { await one(id); } catch (e) { fail('client', String(e)); }
    inflight--;
  }
}
sample('start');
const timer = setInterval(() => sample(), sampleMs);
await Promise.all(Array.from({ length: C }, (_, i) => client(i)));
clearInterval(timer);
await sleep(3000); // the server closes what the last requests left
sample('end');

// RSS growth is measured from the first sample after a warm-up of a twelfth of the run (5 minutes
// of an hour: allocator arenas, the prefix cache and the queue fill first) to the last one
const warm = samples.find((s) => s.t_s >= Math.max(sampleMs / 1000, duration / 1000 / 12) && s.tag !== 'start') ?? samples[0];
const last = samples[samples.length - 1];
const peak = Math.max(...samples.filter((s) => s.t_s >= warm.t_s).map((s) => s.rss_mib));
const summary = {
  duration_s: last.t_s, concurrency: C, ...tot, by_kind: byKind,
  rss_mib: { first: samples[0].rss_mib, after_warmup: warm.rss_mib, at_s: warm.t_s, peak_after_warmup: peak, last: last.rss_mib },
  rss_growth: warm.rss_mib ? +((last.rss_mib - warm.rss_mib) / warm.rss_mib).toFixed(4) : 0,
  fds: { first: samples[0].fds, max: Math.max(...samples.map((s) => s.fds)), last: last.fds },
  threads: { first: samples[0].threads, last: last.threads }, failures_by_kind: failKinds, failures,
};
const okAll = tot.fail === 0 && tot.nonJsonError === 0 && summary.rss_growth < 0.05 && last.fds <= samples[0].fds;
summary.pass = okAll;
console.log(JSON.stringify(summary));
if (A.json) writeFileSync(A.json, JSON.stringify({ summary, samples }, null, 1) + '\n');
process.exit(okAll ? 0 : 1);
