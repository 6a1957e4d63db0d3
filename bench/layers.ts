/**
 * `npm run bench:layers [-- --old <dir>] [--rounds N] [--seconds S]`: where a request's CPU goes,
 * layer by layer, in one run: the minimal pass-through (node:http + undici), the same on Fastify,
 * and Switchyard with every feature on (and an earlier build with `--old`, built as for
 * bench:compare), one at a time in front of the same fake upstream, in alternating rounds. Prints
 * the medians of requests per second and of CPU µs per request (the subject's own processes), at 64
 * connections and at one (one request at a time, where nothing is shared between requests: the
 * p50 there minus the pass-through's is the latency a subject adds).
 * Fastify's share is the second minus the first; the pipeline's is Switchyard minus Fastify.
 */
import { parseArgs } from 'node:util';
import { join, resolve } from 'node:path';
import { createBenchKey, DIST, median, spawnReady, startSwitchyard, treeCpuUs, type Proc } from './lib.js';
import { sequential, throughput, type Subject } from './gateway.js';

const { values } = parseArgs({
  options: {
    old: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '6' },
    sequential: { type: 'string', default: '2000' },
  },
});
const OLD = values.old ? join(resolve(values.old), 'dist') : undefined;
const rounds = Number(values.rounds);
const seconds = Number(values.seconds);
const one = Number(values.sequential);
const subjects = ['reference', 'fastify', ...(OLD ? ['old'] : []), 'switchyard'] as const;
type Name = (typeof subjects)[number];
const rows = new Map<string, number[]>();
const add = (k: string, v: number | undefined) => {
  if (v !== undefined) rows.set(k, [...(rows.get(k) ?? []), v]);
};

const fake = await spawnReady('fake-upstream.js', ['0']);
try {
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? subjects : [...subjects].reverse();
    for (const name of order as readonly Name[]) {
      let proc: Proc;
      let s: Subject;
      if (name === 'reference' || name === 'fastify') {
        proc = await spawnReady(name === 'reference' ? 'reference-proxy.js' : 'fastify-proxy.js', ['0', fake.url]);
        s = { name, url: proc.url, path: '/v1/chat/completions', headers: {}, model: 'fake', pid: proc.child.pid! };
      } else {
        proc = await startSwitchyard({ upstream: fake.url, workers: 1, dist: name === 'old' ? OLD! : DIST });
        const key = await createBenchKey(proc.url);
        s = {
          name,
          url: proc.url,
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${key}` },
          model: 'openai/bench-fake',
          pid: proc.child.pid!,
        };
      }
      try {
        const ns = await throughput(s, false, 64, seconds);
        const st = await throughput(s, true, 64, seconds);
        add(`${name}\tnon-stream req/s`, ns.rps);
        add(`${name}\tnon-stream CPU µs/request`, ns.cpu_us_per_request);
        add(`${name}\tstream req/s`, st.rps);
        add(`${name}\tstream CPU µs/request`, st.cpu_us_per_request);
        // One connection: sequential() sends a fifth more to warm up; CPU is per request sent.
        const cpu = treeCpuUs(s.pid!);
        const seq = await sequential(s, false, one);
        const seqCpu = Math.round((treeCpuUs(s.pid!) - cpu) / (one + Math.ceil(one / 5)));
        const first = await sequential(s, true, one);
        add(`${name}\tone connection p50 µs`, Math.round(seq.p50_ms * 1000));
        add(`${name}\tone connection CPU µs/request`, seqCpu);
        add(`${name}\tfirst chunk p50 µs`, Math.round(first.p50_ms * 1000));
        console.log(
          `round ${r + 1} ${name}: ${ns.rps} req/s ${ns.cpu_us_per_request} µs; stream ${st.rps} req/s ${st.cpu_us_per_request} µs; ` +
            `one connection ${Math.round(seq.p50_ms * 1000)} µs p50, ${seqCpu} µs CPU; first chunk ${Math.round(first.p50_ms * 1000)} µs`,
        );
      } finally {
        await proc.stop();
      }
    }
  }
} finally {
  await fake.stop();
}
console.log('\n| subject | measure | median | rounds |\n|---|---|---|---|');
for (const [k, v] of rows) {
  const [name, what] = k.split('\t');
  console.log(`| ${name} | ${what} | ${median(v)} | ${v.join(', ')} |`);
}
