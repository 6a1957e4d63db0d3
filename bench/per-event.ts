/**
 * `npm run bench:per-event [-- --bursts N --seconds S]`: what a stream's events cost, by
 * difference. One Switchyard (one worker, every feature on) in front of the fake upstream streams
 * the same request twice per protocol: 20 pieces of text, and one. The difference in CPU per
 * request, over 19 pieces, is what each further piece of text costs end to end (read from the
 * upstream, metered, rendered, written) in chat completions (the fast lane) and in the Responses
 * API (a Responses upstream, store: false, which goes the canonical way: events in Switchyard's
 * own event log, rendered with its own ids and sequence numbers). The share of a 20-piece stream
 * that this is bounds what a lane forwarding the upstream's events could save. Short bursts at 64
 * connections, the four cases taking turns in alternating order (this VM's speed drifts), medians.
 * Asserts nothing.
 */
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import { createBenchKey, median, spawnReady, startSwitchyard, treeCpuUs } from './lib.js';
import { requestBody } from './gateway.js';

const { values } = parseArgs({
  options: { bursts: { type: 'string', default: '12' }, seconds: { type: 'string', default: '2' } },
});
const bursts = Number(values.bursts);
const seconds = Number(values.seconds);

const responsesBody = (model: string): string =>
  JSON.stringify({
    model,
    stream: true,
    store: false,
    max_output_tokens: 64,
    temperature: 0.7,
    instructions: 'You are a helpful assistant.',
    input: 'Say hello in one short sentence.',
  });

const CASES = [
  { name: 'chat, 20 pieces', path: '/v1/chat/completions', body: requestBody('openai/bench-fake', true) },
  { name: 'chat, 1 piece', path: '/v1/chat/completions', body: requestBody('openai/bench-short', true) },
  { name: 'responses, 20 pieces', path: '/v1/responses', body: responsesBody('openai/bench-responses') },
  { name: 'responses, 1 piece', path: '/v1/responses', body: responsesBody('openai/bench-responses-short') },
] as const;

const fake = await spawnReady('fake-upstream.js', ['0']);
const sy = await startSwitchyard({ upstream: fake.url, workers: 1 });
try {
  const key = await createBenchKey(sy.url);
  const pid = sy.child.pid!;
  const run = async (c: (typeof CASES)[number], duration: number): Promise<number> => {
    const before = treeCpuUs(pid);
    const r = await autocannon({
      url: sy.url + c.path,
      method: 'POST',
      connections: 64,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: c.body,
      duration,
    });
    if (r.non2xx || r.errors) throw new Error(`${c.name}: ${r.non2xx} non-2xx answers, ${r.errors} errors`);
    return (treeCpuUs(pid) - before) / Math.max(1, r['2xx']);
  };
  for (const c of CASES) await run(c, 2);
  const cpu = new Map<string, number[]>(CASES.map((c) => [c.name, []]));
  for (let b = 0; b < bursts; b++) {
    for (const c of b % 2 === 0 ? CASES : [...CASES].reverse()) cpu.get(c.name)!.push(await run(c, seconds));
  }
  const m = (name: string) => median(cpu.get(name)!);
  const rows = CASES.map((c) => ({ case: c.name, 'CPU µs/request (median burst)': Math.round(m(c.name)) }));
  console.table(rows);
  for (const p of ['chat', 'responses']) {
    const long = m(`${p}, 20 pieces`);
    const extra = long - m(`${p}, 1 piece`);
    console.log(
      `${p}: ${(extra / 19).toFixed(1)} µs per further piece of text; 19 pieces are ${Math.round((100 * extra) / long)}% of a 20-piece stream's CPU`,
    );
  }
} finally {
  await sy.stop();
  await fake.stop();
}
