/**
 * `npm run bench:compare -- --old <dir>`: the gateway scenarios against this build and another
 * one (a checkout of an earlier commit, built, e.g. `git worktree add /tmp/old <rev>` + `npm ci` or a
 * node_modules link + `npm run build` there), in the same run on the same machine: one fake
 * upstream, one Switchyard at a time (one worker), rounds alternating old and new so drift in the
 * machine's speed hits both. Prints the medians of each and their ratio; asserts nothing.
 */
import { parseArgs } from 'node:util';
import { join, resolve } from 'node:path';
import { createBenchKey, DIST, median, spawnReady, startSwitchyard } from './lib.js';
import { sequential, throughput, type Subject } from './gateway.js';

const { values } = parseArgs({
  options: { old: { type: 'string' }, rounds: { type: 'string', default: '3' }, seconds: { type: 'string', default: '10' } },
});
if (!values.old) throw new Error('--old <dir with a built dist/> is required');
const OLD = join(resolve(values.old), 'dist');
const rounds = Number(values.rounds);
const seconds = Number(values.seconds);

type Row = { nonstream_rps: number; stream_rps: number; added_us: number; nonstream_cpu_us: number; stream_cpu_us: number };

const results: Record<'old' | 'new', Row[]> = { old: [], new: [] };

const fake = await spawnReady('fake-upstream.js', ['0']);
try {
  const direct: Subject = { name: 'direct', url: fake.url, path: '/v1/chat/completions', headers: {}, model: 'fake' };
  const base = (await sequential(direct, false, 2000)).p50_ms;
  for (let r = 0; r < rounds; r++) {
    for (const which of r % 2 === 0 ? (['old', 'new'] as const) : (['new', 'old'] as const)) {
      const sy = await startSwitchyard({ upstream: fake.url, workers: 1, dist: which === 'old' ? OLD : DIST });
      try {
        const key = await createBenchKey(sy.url);
        const s: Subject = {
          name: which,
          url: sy.url,
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${key}` },
          model: 'openai/bench-fake',
        };
        // CPU per request is what the code costs; unlike requests per second it hardly moves with a
        // noisy machine (throughput measures it over the timed run).
        const nonstream = await throughput({ ...s, pid: sy.child.pid! }, false, 64, seconds);
        const stream = await throughput({ ...s, pid: sy.child.pid! }, true, 64, seconds);
        const one = await sequential(s, false, 2000);
        const row = {
          nonstream_rps: nonstream.rps,
          stream_rps: stream.rps,
          added_us: Math.round((one.p50_ms - base) * 1000),
          nonstream_cpu_us: nonstream.cpu_us_per_request ?? NaN,
          stream_cpu_us: stream.cpu_us_per_request ?? NaN,
        };
        results[which].push(row);
        console.log(`round ${r + 1} ${which}: ${JSON.stringify(row)}`);
      } finally {
        await sy.stop();
      }
    }
  }
} finally {
  await fake.stop();
}

const med = (which: 'old' | 'new', k: keyof Row) => median(results[which].map((x) => x[k]));
const summary = (['nonstream_rps', 'stream_rps', 'added_us', 'nonstream_cpu_us', 'stream_cpu_us'] as const).map((k) => ({
  metric: k,
  old: med('old', k),
  new: med('new', k),
  'new/old': Math.round((med('new', k) / med('old', k)) * 100) / 100,
}));
console.table(summary);
console.log(JSON.stringify({ rounds, seconds, summary }));
