/**
 * `npm run bench:compare -- --old <dir> [--bursts N] [--seconds S] [--workers N] [--responses]`: this build against another one
 * (a checkout of an earlier commit, built, e.g. `git worktree add /tmp/old <rev>` + a node_modules
 * link + `npx tsc -p tsconfig.json` there) on the same machine, in the same minutes. Both run at
 * once (one worker each, or `--workers` each) in front of one fake upstream, warmed up, and take turns: N short bursts
 * of load each, alternating which goes first, so that the machine's drift (this VM's speed moves by
 * a factor of several from one hour to the next, and by ±25% between runs of a few seconds) falls
 * on both alike. Each burst yields the CPU time the subject's processes spent per request (user +
 * system from /proc: what the code costs) and its requests per second; the table gives the medians,
 * the ratio of all CPU time to all requests, and in how many paired bursts the new build was the
 * cheaper. Then the added p50 at one connection, in alternating rounds. `--responses` sends the same
 * request to `/v1/responses` (stored, the API's default) instead of chat completions. Asserts nothing.
 */
import { parseArgs } from 'node:util';
import { join, resolve } from 'node:path';
import { createBenchKey, DIST, median, spawnReady, startSwitchyard, treeCpuUs, type Proc } from './lib.js';
import { load, responsesBody, sequential, type Subject } from './gateway.js';

const { values } = parseArgs({
  options: {
    old: { type: 'string' },
    bursts: { type: 'string', default: '20' },
    seconds: { type: 'string', default: '1' },
    sequential: { type: 'string', default: '1000' },
    workers: { type: 'string', default: '1' },
    responses: { type: 'boolean', default: false },
  },
});
if (!values.old) throw new Error('--old <dir with a built dist/> is required');
const OLD = join(resolve(values.old), 'dist');
const bursts = Number(values.bursts);
const seconds = Number(values.seconds);
const one = Number(values.sequential);
const workers = Number(values.workers);
const BUILDS = ['old', 'new'] as const;
type Build = (typeof BUILDS)[number];

interface Burst {
  cpu: number;
  requests: number;
}

/** One burst of load at 64 connections: CPU time used and requests answered (2xx). */
async function burst(s: Subject, stream: boolean, duration: number): Promise<Burst> {
  const before = treeCpuUs(s.pid!);
  const r = await load(s, stream, 64, duration);
  return { cpu: treeCpuUs(s.pid!) - before, requests: r['2xx'] };
}

const fake = await spawnReady('fake-upstream.js', ['0']);
const procs: Proc[] = [];
try {
  const subjects = {} as Record<Build, Subject>;
  for (const which of BUILDS) {
    const sy = await startSwitchyard({ upstream: fake.url, workers, dist: which === 'old' ? OLD : DIST });
    procs.push(sy);
    subjects[which] = {
      name: which,
      url: sy.url,
      path: values.responses ? '/v1/responses' : '/v1/chat/completions',
      headers: { authorization: `Bearer ${await createBenchKey(sy.url)}` },
      model: 'openai/bench-fake',
      ...(values.responses && { body: (stream: boolean) => responsesBody('openai/bench-fake', stream) }),
      pid: sy.child.pid!,
    };
  }
  const summary: Array<Record<string, string | number>> = [];
  for (const stream of [false, true]) {
    const label = stream ? 'stream' : 'non-stream';
    for (const which of BUILDS) await burst(subjects[which], stream, 3);
    const runs: Record<Build, Burst[]> = { old: [], new: [] };
    for (let b = 0; b < bursts; b++) {
      for (const which of b % 2 === 0 ? BUILDS : ([...BUILDS].reverse() as Build[])) {
        runs[which].push(await burst(subjects[which], stream, seconds));
      }
    }
    const perRequest = (w: Build) => runs[w].map((x) => x.cpu / Math.max(1, x.requests));
    const total = (w: Build) =>
      runs[w].reduce((a, x) => a + x.cpu, 0) /
      Math.max(
        1,
        runs[w].reduce((a, x) => a + x.requests, 0),
      );
    const wins = perRequest('new').filter((v, i) => v < perRequest('old')[i]!).length;
    summary.push(
      {
        metric: `${label} CPU µs/request (median burst)`,
        old: Math.round(median(perRequest('old'))),
        new: Math.round(median(perRequest('new'))),
        'new/old': Math.round((median(perRequest('new')) / median(perRequest('old'))) * 1000) / 1000,
      },
      {
        metric: `${label} CPU µs/request (all bursts)`,
        old: Math.round(total('old')),
        new: Math.round(total('new')),
        'new/old': Math.round((total('new') / total('old')) * 1000) / 1000,
      },
      { metric: `${label}: bursts where new was cheaper`, old: '', new: `${wins} of ${bursts}`, 'new/old': '' },
      {
        metric: `${label} req/s (median burst)`,
        old: Math.round(median(runs.old.map((x) => x.requests / seconds))),
        new: Math.round(median(runs.new.map((x) => x.requests / seconds))),
        'new/old':
          Math.round((median(runs.new.map((x) => x.requests)) / Math.max(1, median(runs.old.map((x) => x.requests)))) * 1000) / 1000,
      },
    );
    console.log(`${label}: ${bursts} bursts of ${seconds} s each done`);
  }
  // One connection: the added p50 over the fake upstream itself, in alternating rounds.
  const direct: Subject = { name: 'direct', url: fake.url, path: '/v1/chat/completions', headers: {}, model: 'fake' };
  const added: Record<Build, number[]> = { old: [], new: [] };
  for (let r = 0; r < 3; r++) {
    const base = (await sequential(direct, false, one)).p50_ms;
    for (const which of r % 2 === 0 ? BUILDS : ([...BUILDS].reverse() as Build[])) {
      added[which].push(((await sequential(subjects[which], false, one)).p50_ms - base) * 1000);
    }
  }
  summary.push({
    metric: 'added p50 µs at one connection',
    old: Math.round(median(added.old)),
    new: Math.round(median(added.new)),
    'new/old': Math.round((median(added.new) / median(added.old)) * 1000) / 1000,
  });
  console.table(summary);
  console.log(JSON.stringify({ bursts, seconds, summary }));
} finally {
  for (const p of procs) await p.stop();
  await fake.stop();
}
