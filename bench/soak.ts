/**
 * `npm run soak`: Switchyard at a fixed request rate for 10 minutes (`--seconds=N` for another
 * length), as users run it: one worker, a priced model on the fake upstream, the real stories260K
 * model, stored Responses, the ledger, metrics and the access log. Samples the server's RSS every
 * 5 s and counts every answer that is not a complete 2xx. RSS after the warm-up must stay within
 * ±10% of its median and there must be 0 errors. The warm-up lasts a fifth of the run (2 minutes at
 * most) and at least until the server's first major GC under load: before it, V8 is still growing
 * the heap to its working size (at 200 req/s here, the first major GC came at 105 s). Writes bench/results/soak-<date>.json (full runs)
 * or a file in the temp folder (shorter ones).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool, request } from 'undici';
import { PACKAGE_ROOT } from '../src/config.js';
import { createBenchKey, median, percentile, sleep, spawnReady, startSwitchyard, treeRss, type Proc } from './lib.js';

const arg = (name: string) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
const SECONDS = Number(arg('seconds') ?? 600);
const RATE = Number(arg('rate') ?? 200);
/** A fifth of the run, 2 minutes at most: the heap grows to its working size and settles after its first major GC. */
const WARMUP_S = Math.min(120, Math.max(5, Math.round(SECONDS / 5)));
const SHARED_MODELS = join(PACKAGE_ROOT, '..', 'shared', 'models');
const log = (msg: string) => process.stderr.write(`[soak] ${msg}\n`);

type Kind = 'chat' | 'chat_stream' | 'responses_stored' | 'local';
/** Out of every 20 requests: 12 chat, 4 streamed chat, 3 stored Responses, 1 on the local model. */
const MIX: Kind[] = [
  ...Array<Kind>(12).fill('chat'),
  ...Array<Kind>(4).fill('chat_stream'),
  ...Array<Kind>(3).fill('responses_stored'),
  'local',
];

function requestFor(kind: Kind, i: number): { path: string; body: string } {
  const messages = [{ role: 'user', content: `Say hello (${i}).` }];
  switch (kind) {
    case 'chat':
      return { path: '/v1/chat/completions', body: JSON.stringify({ model: 'openai/bench-fake', messages, max_tokens: 64 }) };
    case 'chat_stream':
      return { path: '/v1/chat/completions', body: JSON.stringify({ model: 'openai/bench-fake', messages, max_tokens: 64, stream: true }) };
    case 'responses_stored':
      return { path: '/v1/responses', body: JSON.stringify({ model: 'openai/bench-fake', input: `Say hello (${i}).`, store: true }) };
    case 'local':
      return {
        path: '/v1/chat/completions',
        body: JSON.stringify({ model: 'local/stories260k', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 32 }),
      };
  }
}

async function main(): Promise<void> {
  const procs: Proc[] = [];
  try {
    const fake = await spawnReady('fake-upstream.js', ['0']);
    procs.push(fake);
    const sy = await startSwitchyard({ upstream: fake.url, workers: 1, modelsDir: SHARED_MODELS });
    procs.push(sy);
    const key = await createBenchKey(sy.url);
    const pool = new Pool(sy.url, { connections: 64 });
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const counts: Record<Kind, number> = { chat: 0, chat_stream: 0, responses_stored: 0, local: 0 };
    const errors: string[] = [];
    const latencies: number[] = [];
    const samples: Array<{ t: number; rss: number; in_flight: number; major_gcs: number }> = [];
    const majorGcs = async () => {
      const res = await request(`${sy.url}/metrics`);
      const text = await res.body.text();
      return Number(/nodejs_gc_duration_seconds_count\{kind="major"\} (\d+)/.exec(text)?.[1] ?? 0);
    };
    const gcsAtStart = await majorGcs();
    let sent = 0;
    let inFlight = 0;

    const one = async (i: number) => {
      const kind = MIX[i % MIX.length]!;
      const { path, body } = requestFor(kind, i);
      const start = performance.now();
      inFlight += 1;
      try {
        const res = await pool.request({ path, method: 'POST', headers, body });
        const text = await res.body.text();
        const complete = kind === 'chat_stream' ? text.includes('data: [DONE]') : res.statusCode === 200;
        if (res.statusCode !== 200 || !complete) errors.push(`${kind} ${res.statusCode} ${text.slice(0, 120)}`);
        else counts[kind] += 1;
      } catch (err) {
        errors.push(`${kind} ${(err as Error).message}`);
      } finally {
        inFlight -= 1;
        latencies.push(performance.now() - start);
      }
    };

    log(`${RATE} req/s for ${SECONDS} s (warm-up ${WARMUP_S} s), pid ${sy.child.pid}`);
    const started = Date.now();
    const sampler = setInterval(() => {
      const t = Math.round((Date.now() - started) / 1000);
      const rss = treeRss(sy.child.pid!);
      void majorGcs().then((gcs) => samples.push({ t, rss, in_flight: inFlight, major_gcs: gcs - gcsAtStart }));
      if (t % 60 < 5) log(`${t} s: RSS ${(rss / 1e6).toFixed(0)} MB, ${sent} sent, ${errors.length} errors`);
    }, 5000);
    // A fixed rate, whatever the answers do: due requests go out every 10 ms.
    while (Date.now() - started < SECONDS * 1000) {
      const due = Math.floor(((Date.now() - started) / 1000) * RATE);
      while (sent < due) void one(sent++);
      await sleep(10);
    }
    clearInterval(sampler);
    while (inFlight > 0) await sleep(50);
    await pool.close();

    const firstGc = samples.find((x) => x.major_gcs > 0)?.t ?? null;
    // A run too short for a major GC is judged after the fixed warm-up alone.
    const warmup = Math.max(WARMUP_S, firstGc !== null && firstGc < SECONDS - 60 ? firstGc : 0);
    const steady = samples.filter((x) => x.t >= warmup).map((x) => x.rss);
    const mid = median(steady);
    const lo = Math.min(...steady);
    const hi = Math.max(...steady);
    const deviation = Math.max(hi / mid - 1, 1 - lo / mid);
    const sorted = [...latencies].sort((a, b) => a - b);
    const result = {
      at: new Date().toISOString(),
      seconds: SECONDS,
      rate: RATE,
      warmup_s: warmup,
      first_major_gc_s: firstGc,
      sent,
      completed: counts,
      errors: errors.length,
      first_errors: errors.slice(0, 10),
      latency_ms: { p50: percentile(sorted, 50), p99: percentile(sorted, 99), max: sorted.at(-1) },
      rss_mb: { median: mid / 1e6, min: lo / 1e6, max: hi / 1e6, first: (steady[0] ?? 0) / 1e6, last: (steady.at(-1) ?? 0) / 1e6 },
      rss_max_deviation: deviation,
      verdict: errors.length === 0 && deviation <= 0.1 ? 'met' : 'missed',
      samples,
    };
    const dir = SECONDS >= 600 ? join(PACKAGE_ROOT, 'bench', 'results') : tmpdir();
    mkdirSync(dir, { recursive: true });
    const file = join(dir, `soak-${result.at.slice(0, 10)}.json`);
    writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    log(`sent ${sent}, completed ${JSON.stringify(counts)}, errors ${errors.length}`);
    log(`first major GC under load at ${firstGc ?? '(none)'} s; warm-up ${warmup} s`);
    log(
      `RSS after warm-up: median ${(mid / 1e6).toFixed(1)} MB, range ${(lo / 1e6).toFixed(1)}–${(hi / 1e6).toFixed(1)} MB (±${(deviation * 100).toFixed(1)}%)`,
    );
    log(
      `latency p50 ${result.latency_ms.p50.toFixed(1)} ms, p99 ${result.latency_ms.p99.toFixed(1)} ms; ${result.verdict}; results in ${file}`,
    );
    if (result.verdict !== 'met') process.exitCode = 1;
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
}

await main();
