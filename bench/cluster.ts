/**
 * `npm run build && node dist/bench/cluster.js [--seconds=10] [--connections=64] [--shared]`: non-stream
 * chat completion throughput of one Switchyard serving from 1, 2 and 4 processes (SWITCHYARD_WORKERS),
 * on SQLite in a temp data dir (with `--shared`: on PostgreSQL, a fresh schema of
 * SWITCHYARD_TEST_PG_URL, and Redis, as several instances run), in front of the fake upstream
 * (bench/fake-upstream.ts), driven by the
 * gateway scenarios' load generator (autocannon, a warm-up run first). The load generator, the fake
 * upstream and Switchyard share the machine's cores, so on a small machine the figures say as much
 * about that contention as about Switchyard. Prints a Markdown table (docs/deployment.md, Throughput).
 */
import { randomBytes } from 'node:crypto';
import { cpus } from 'node:os';
import pg from 'pg';
import { createBenchKey, spawnReady, startSwitchyard, type Proc } from './lib.js';
import { check, throughput, type Throughput } from './gateway.js';

const arg = (name: string, fallback: number): number => {
  const v = process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
  return v === undefined ? fallback : Number(v);
};
const SECONDS = arg('seconds', 10);
const CONNECTIONS = arg('connections', 64);
const SHARED = process.argv.includes('--shared');
const WORKERS = [1, 2, 4];
const PG_URL = process.env['SWITCHYARD_TEST_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
const REDIS_URL = process.env['SWITCHYARD_TEST_REDIS_URL'] ?? 'redis://127.0.0.1:6379';

/** A PostgreSQL schema of its own for one measurement (startMain passes this process's environment on). */
async function useSchema(): Promise<() => Promise<void>> {
  const schema = `sy_bench_${randomBytes(6).toString('hex')}`;
  const run = async (q: string) => {
    const c = new pg.Client({ connectionString: PG_URL });
    await c.connect();
    await c.query(q);
    await c.end();
  };
  await run(`create schema ${schema}`);
  process.env['DATABASE_URL'] = `${PG_URL}${PG_URL.includes('?') ? '&' : '?'}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
  process.env['REDIS_URL'] = REDIS_URL;
  return () => run(`drop schema ${schema} cascade`);
}

const log = (msg: string) => process.stderr.write(`[bench:cluster] ${msg}\n`);

async function main(): Promise<void> {
  const procs: Proc[] = [];
  const rows: Array<{ workers: number } & Throughput> = [];
  try {
    const fake = await spawnReady('fake-upstream.js', ['0']);
    procs.push(fake);
    for (const workers of WORKERS) {
      const drop = SHARED ? await useSchema() : undefined;
      const sy = await startSwitchyard({ upstream: fake.url, workers });
      procs.push({ ...sy, stop: () => sy.stop().then(() => drop?.()) });
      const key = await createBenchKey(sy.url);
      const subject = {
        name: `switchyard (${workers} process${workers > 1 ? 'es' : ''})`,
        url: sy.url,
        path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${key}` },
        model: 'openai/bench-fake',
      };
      await check(subject);
      log(`${subject.name}: ${SECONDS} s at ${CONNECTIONS} connections`);
      rows.push({ workers, ...(await throughput(subject, false, CONNECTIONS, SECONDS)) });
      await procs.pop()?.stop();
    }
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
  const one = rows[0]?.rps ?? NaN;
  const lines = [
    `${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}; non-stream chat completions, ${CONNECTIONS} connections, ${SECONDS} s each, ${SHARED ? 'PostgreSQL and Redis' : 'SQLite'}`,
    '',
    '| processes | req/s | vs 1 | p50 ms | p99 ms | non-2xx | errors |',
    '|---|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.workers} | ${r.rps.toLocaleString('en-US')} | ${(r.rps / one).toFixed(2)}× | ${r.p50_ms} | ${r.p99_ms} | ${r.non2xx} | ${r.errors} |`,
    ),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  process.exit(0);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
