// determinism.mjs — determinism under load: 32 requests of mixed KV policies
// and budgets, mixed prompt lengths (some read in several prefill pieces),
// streamed and not, at temperature 0, sent all at once (twice, in two
// orders, so that batches are composed differently), must give exactly the
// texts each gives alone.
// usage: node determinism.mjs BASE_URL
import assert from 'node:assert/strict';

const base = process.argv[2];
const policies = [
  ['full', 1], ['h2o', 0.3], ['local', 0.5], ['elastic', 0.25], ['snapkv', 0.4], ['tova', 0.3],
  ['scissorhands', 0.5], ['pyramidkv', 0.3], ['roco', 0.4], ['random', 0.5], ['vlcache', 0.3], ['elastic', 1],
];
const starts = [
  'Once upon a time', 'One day, a little girl named Lily', 'Tom had a big red ball', 'The sun was shining',
  'There was a small bird in the tree', 'Sue and her mom went to the park', 'A cat saw a fish', 'Ben wanted to fly',
];
const filler = ' She liked to play with her friends in the park and they had lots of fun together every day.';

function request(i) {
  const [policy, budget] = policies[i % policies.length];
  // lengths from a few tokens to several hundred (the prefill reads 256 rows per piece)
  const prompt = starts[i % starts.length] + filler.repeat((i * 7) % 12);
  return {
    prompt, max_tokens: 64 + (i % 5) * 16, temperature: 0, ignore_eos: true,
    kv: { policy, budget }, stream: i % 3 === 0,
  };
}

async function run(body) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text.slice(0, 300));
  if (!body.stream) return JSON.parse(text).choices[0].text;
  const events = text.split('\n\n').filter((e) => e.length);
  assert.equal(events[events.length - 1], 'data: [DONE]');
  return events.slice(0, -1).map((e) => JSON.parse(e.slice(6)).choices[0]?.text ?? '').join('');
}

const N = 32;
const bodies = Array.from({ length: N }, (_, i) => request(i));
const alone = [];
for (const b of bodies) alone.push(await run(b));
for (const t of alone) assert.ok(t.length > 0);

let mismatches = 0;
for (const order of [bodies.map((_, i) => i), bodies.map((_, i) => (i * 13 + 5) % N)]) {
  const got = await Promise.all(order.map((i) => run(bodies[i])));
  order.forEach((i, k) => {
    if (got[k] !== alone[i]) {
      mismatches++;
      console.error(`FAIL request ${i} (${bodies[i].kv.policy} ${bodies[i].kv.budget}, ${bodies[i].prompt.length} chars, ` +
        `stream ${bodies[i].stream}) under load:\n  alone: ${JSON.stringify(alone[i])}\n  load:  ${JSON.stringify(got[k])}`);
    }
  });
}
const m = await (await fetch(`${base}/metrics`)).text();
const most = Number(/^ekv_requests_running_max (\d+)/m.exec(m)[1]);
const steps = Number(/^ekv_decode_steps_total (\d+)/m.exec(m)[1]);
const rows = Number(/^ekv_decode_rows_total (\d+)/m.exec(m)[1]);
console.log(`determinism: ${N} requests x 2 concurrent rounds, ${mismatches} mismatches; at most ${most} sequences ` +
  `at once, ${(rows / steps).toFixed(1)} sequences per decode step on average`);
if (most < 8) {
  console.error(`FAIL the load never batched: at most ${most} sequences at once`);
  process.exitCode = 1;
}
if (mismatches) process.exitCode = 1;
