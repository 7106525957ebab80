// jget.mjs — reads JSON (or an SSE stream with --sse) on stdin for the shell
// tests of ekv serve (tests/cli_serve.sh): prints the value at a dotted path
// ("choices.0.text"; objects and arrays as JSON), or with --sse the text the
// stream's chunks add up to, and fails on anything malformed.
import { readFileSync } from 'node:fs';

const args = process.argv.slice(2);
const input = readFileSync(0, 'utf8');
function at(obj, path) {
  let v = obj;
  for (const k of path.split('.').filter((s) => s.length)) {
    if (v === null || typeof v !== 'object' || !(k in v)) throw new Error(`no '${path}' in ${input.slice(0, 300)}`);
    v = v[k];
  }
  return v;
}
function show(v) {
  process.stdout.write(typeof v === 'string' ? v : JSON.stringify(v));
}
if (args[0] === '--sse') {
  // every event is "data: <json>\n\n"; the last is "data: [DONE]"
  const events = input.split('\n\n').filter((e) => e.length);
  if (events[events.length - 1] !== 'data: [DONE]') throw new Error('the stream does not end with data: [DONE]');
  let text = '';
  let finish = null;
  let role = null;
  for (const e of events.slice(0, -1)) {
    if (!e.startsWith('data: ')) throw new Error(`not an SSE data event: ${e.slice(0, 100)}`);
    const c = JSON.parse(e.slice(6));
    if (c.error) throw new Error(`error event: ${JSON.stringify(c.error)}`);
    if (!c.choices.length) continue; // the usage chunk
    const ch = c.choices[0];
    if (ch.delta) {
      if (ch.delta.role) role = ch.delta.role;
      text += ch.delta.content ?? '';
    } else {
      text += ch.text;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  if (!finish) throw new Error('no finish_reason in the stream');
  if (args[1] === 'finish') show(finish);
  else if (args[1] === 'role') show(role);
  else if (args[1] === 'usage') show(at(JSON.parse(events[events.length - 2].slice(6)), args[2] ?? 'usage'));
  else show(text);
} else {
  show(at(JSON.parse(input), args[0] ?? ''));
}
