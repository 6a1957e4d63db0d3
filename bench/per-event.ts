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
 * With `--old <dir>` (a built checkout, as for bench:compare) that build runs the same cases in
 * the same turns. Asserts nothing.
 */
import { parseArgs } from 'node:util';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { createBenchKey, DIST, median, spawnReady, startSwitchyard, treeCpuUs, type Proc } from './lib.js';
import { requestBody, responsesBody } from './gateway.js';

const { values } = parseArgs({
  options: { bursts: { type: 'string', default: '12' }, seconds: { type: 'string', default: '2' }, old: { type: 'string' } },
});
const builds = [{ name: 'this build', dist: DIST }, ...(values.old ? [{ name: 'old', dist: join(resolve(values.old), 'dist') }] : [])];
const bursts = Number(values.bursts);
const seconds = Number(values.seconds);

const CASES = [
  { name: 'chat, 20 pieces', path: '/v1/chat/completions', body: requestBody('openai/bench-fake', true) },
  { name: 'chat, 1 piece', path: '/v1/chat/completions', body: requestBody('openai/bench-short', true) },
  { name: 'responses, 20 pieces', path: '/v1/responses', body: responsesBody('openai/bench-responses', true, false) },
  { name: 'responses, 1 piece', path: '/v1/responses', body: responsesBody('openai/bench-responses-short', true, false) },
] as const;

const fake = await spawnReady('fake-upstream.js', ['0']);
const procs: Proc[] = [];
try {
  const subjects: Array<{ name: string; url: string; pid: number; key: string }> = [];
  for (const b of builds) {
    const sy = await startSwitchyard({ upstream: fake.url, workers: 1, dist: b.dist });
    procs.push(sy);
    subjects.push({ name: b.name, url: sy.url, pid: sy.child.pid!, key: await createBenchKey(sy.url) });
  }
  const run = async (s: (typeof subjects)[number], c: (typeof CASES)[number], duration: number): Promise<number> => {
    const before = treeCpuUs(s.pid);
    const r = await autocannon({
      url: s.url + c.path,
      method: 'POST',
      connections: 64,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${s.key}` },
      body: c.body,
      duration,
    });
    if (r.non2xx || r.errors) throw new Error(`${s.name}, ${c.name}: ${r.non2xx} non-2xx answers, ${r.errors} errors`);
    return (treeCpuUs(s.pid) - before) / Math.max(1, r['2xx']);
  };
  const turns = subjects.flatMap((s) => CASES.map((c) => ({ s, c, label: `${s.name}: ${c.name}` })));
  for (const t of turns) await run(t.s, t.c, 2);
  const cpu = new Map<string, number[]>(turns.map((t) => [t.label, []]));
  for (let b = 0; b < bursts; b++) {
    for (const t of b % 2 === 0 ? turns : [...turns].reverse()) cpu.get(t.label)!.push(await run(t.s, t.c, seconds));
  }
  const m = (label: string) => median(cpu.get(label)!);
  console.table(turns.map((t) => ({ case: t.label, 'CPU µs/request (median burst)': Math.round(m(t.label)) })));
  for (const s of subjects) {
    for (const p of ['chat', 'responses']) {
      const long = m(`${s.name}: ${p}, 20 pieces`);
      const extra = long - m(`${s.name}: ${p}, 1 piece`);
      console.log(
        `${s.name}, ${p}: ${(extra / 19).toFixed(1)} µs per further piece of text; 19 pieces are ${Math.round((100 * extra) / long)}% of a 20-piece stream's CPU`,
      );
    }
  }
} finally {
  for (const p of procs) await p.stop();
  await fake.stop();
}
