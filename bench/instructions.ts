/**
 * `npm run bench:instructions [-- --old <dir>] [--warmup N] [--requests N] [--non-stream-only | --stream-only] [--fastify] [--functions N] [--responses]`:
 * instructions per request, counted by valgrind's callgrind, for the reference pass-through and
 * Switchyard (the same pass-through on Fastify too with `--fastify`, and an earlier build with
 * `--old`, built as for bench:compare). Time on this VM drifts by ±25% between
 * runs of a few seconds, so a change of a few percent cannot be seen in req/s or CPU time; the
 * main thread's instruction count is the same from run to run (within 1.5% here) whatever else the
 * machine does.
 *
 * Each subject runs under callgrind with instrumentation off, answers `--warmup` requests one at a
 * time (until V8 has compiled its hot code: fewer than about 5,000 leave the optimizing compiler in
 * the count), then counts `--requests` more with instrumentation on (`callgrind_control -i on`),
 * non-stream, then the same for streams. What is counted: every instruction of the subject's
 * process in user space, on its main thread and on all its threads (V8's compiler and GC threads,
 * SQLite's checkpoint thread, the log writer). What is not: the kernel (socket writes and reads,
 * which every gateway pays alike), cache misses and waiting. The main thread's count is the one to
 * compare builds by: the optimizing compiler, on a background thread, still recompiles now and then
 * after the warm-up (a function deoptimized by an object of a shape it had not seen), and how much
 * of that falls in the counted window varies (8-51k instructions per request between runs here).
 * The subjects run one after another, as a precaution: a thread that waits for a core may spin,
 * and spinning would be counted.
 * A stream's count moves by 5-15% between runs: how many reads its 22 upstream writes arrive in
 * depends on timing. `--keep` keeps the callgrind files (one per thread, `-01` the main one) for
 * `callgrind_annotate` (native functions by name; V8's compiled JavaScript shows only as addresses).
 * `--functions N` runs the subjects with Node's `--perf-basic-prof`, which names V8's compiled
 * JavaScript for callgrind (bench/callgrind-functions.ts), and prints where a non-stream request's
 * (with `--stream-only`, a stream's) main-thread instructions went: by layer (Switchyard's code, Fastify, undici, Node's modules, V8's
 * builtins and runtime, SQLite, …) and the N functions Switchyard spends most above the reference on.
 * `--responses` counts stored `/v1/responses` requests instead (bench/gateway.ts's `responsesBody`),
 * for Switchyard alone: the reference only forwards chat completions.
 * Needs valgrind (Debian's `valgrind`); asserts nothing.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { Client } from 'undici';
import { createBenchKey, DIST, spawnReady, startSwitchyard, type Proc } from './lib.js';
import { functionCosts, type FunctionCosts } from './callgrind-functions.js';
import { requestBody, responsesBody } from './gateway.js';

const run = promisify(execFile);
const { values } = parseArgs({
  options: {
    old: { type: 'string' },
    warmup: { type: 'string', default: '6000' },
    requests: { type: 'string', default: '1000' },
    keep: { type: 'boolean', default: false },
    'non-stream-only': { type: 'boolean', default: false },
    'stream-only': { type: 'boolean', default: false },
    fastify: { type: 'boolean', default: false },
    functions: { type: 'string', default: '0' },
    responses: { type: 'boolean', default: false },
  },
});
const FUNCTIONS = Number(values.functions);
// Inherited by every subject; V8 then writes /tmp/perf-<pid>.map as it compiles.
if (FUNCTIONS > 0) process.env['NODE_OPTIONS'] = `${process.env['NODE_OPTIONS'] ?? ''} --perf-basic-prof`.trim();
const WARMUP = Number(values.warmup);
/** What is counted: non-stream requests, streams, or both (the function profile is of streams only with --stream-only). */
const KINDS = values['stream-only'] ? [true] : values['non-stream-only'] ? [false] : [false, true];
const PROFILED_STREAM = values['stream-only'] === true;
const REQUESTS = Number(values.requests);

interface Count {
  main: number;
  all: number;
}

interface Counted {
  subject: string;
  non_stream: Count;
  stream: Count;
  /** The main thread by function (`--functions`): the non-stream count's, or the stream's with --stream-only. */
  functions?: FunctionCosts;
}

/**
 * `count` requests one at a time on `client`'s one keep-alive connection. The warm-up and the counted
 * requests share it: a new connection's objects make V8 compile the hot code again, and that
 * compiling would be counted.
 */
async function drive(client: Client, headers: Record<string, string>, stream: boolean, count: number): Promise<void> {
  const body = (values.responses ? responsesBody : requestBody)('openai/bench-fake', stream);
  for (let i = 0; i < count; i++) {
    const res = await client.request({
      path: values.responses ? '/v1/responses' : '/v1/chat/completions',
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body,
    });
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}: ${text.slice(0, 200)}`);
  }
}

/** The perf map V8 wrote for the subject (`--functions`). */
function perfMap(pid: number): string {
  const file = `/tmp/perf-${pid}.map`;
  if (!existsSync(file)) throw new Error(`${file} is missing: Node did not take --perf-basic-prof`);
  return file;
}

/**
 * The instructions counted since the last dump, on the main thread and on all threads: with
 * `--separate-threads=yes` callgrind writes `<out>.<n>-<thread>` at each dump, thread 01 the main
 * one. `callgrind_control` runs the dump as a monitor command through vgdb, which answers once the
 * files are written.
 */
async function dump(pid: number, dir: string, n: number): Promise<Count> {
  await run('callgrind_control', ['-d', String(pid)]);
  const total = (file: string): number => {
    const m = /^(?:summary|totals): (\d+)/m.exec(readFileSync(join(dir, file), 'utf8'));
    if (!m) throw new Error(`${file} has no total`);
    return Number(m[1]);
  };
  const files = readdirSync(dir).filter((f) => f.startsWith(`callgrind.out.${n}-`));
  return { main: total(`callgrind.out.${n}-01`), all: files.reduce((sum, f) => sum + total(f), 0) };
}

async function count(
  subject: string,
  start: (wrap: string[]) => Promise<Proc>,
  headers: (p: Proc) => Promise<Record<string, string>>,
): Promise<Counted> {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-instructions-'));
  const out = join(dir, 'callgrind.out');
  const proc = await start([
    'valgrind',
    '--tool=callgrind',
    '--instr-atstart=no',
    '--separate-threads=yes',
    `--callgrind-out-file=${out}`,
    '-q',
  ]);
  const client = new Client(proc.url, { pipelining: 1, keepAliveTimeout: 600_000, headersTimeout: 600_000, bodyTimeout: 600_000 });
  try {
    // valgrind runs the program in its own process: the pid is the subject's.
    const pid = proc.child.pid!;
    const h = await headers(proc);
    const result: Counted = { subject, non_stream: { main: 0, all: 0 }, stream: { main: 0, all: 0 } };
    let dumps = 0;
    for (const stream of KINDS) {
      await drive(client, h, stream, WARMUP);
      await run('callgrind_control', ['-i', 'on', String(pid)]);
      await run('callgrind_control', ['-z', String(pid)]);
      await drive(client, h, stream, REQUESTS);
      const counted = await dump(pid, dir, ++dumps);
      await run('callgrind_control', ['-i', 'off', String(pid)]);
      result[stream ? 'stream' : 'non_stream'] = { main: Math.round(counted.main / REQUESTS), all: Math.round(counted.all / REQUESTS) };
      if (FUNCTIONS > 0 && stream === PROFILED_STREAM)
        result.functions = functionCosts(join(dir, `callgrind.out.${dumps}-01`), perfMap(pid));
    }
    return result;
  } finally {
    await client.close();
    await proc.stop();
    if (FUNCTIONS > 0) rmSync(`/tmp/perf-${proc.child.pid!}.map`, { force: true });
    if (values.keep) console.log(`${subject}: callgrind files in ${dir} (non-stream .1-NN, stream .2-NN by thread, 01 the main one)`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Where a non-stream request's main-thread instructions went (per request): by layer for every
 * subject, each layer's own instructions and then with the V8 and native work its JavaScript called
 * charged to it; the functions the first Switchyard build spends most above the reference on (own
 * instructions); and Switchyard's own functions by what they cost with what they called.
 */
function printFunctions(results: Counted[]): void {
  const k = (x: number) => `${(x / REQUESTS / 1000).toFixed(1)}k`;
  const perRequest = (x: number) => Math.round(x / REQUESTS).toLocaleString('en-US');
  const layers = (r: Counted, costs: Map<string, number>) => {
    const m = new Map<string, number>();
    for (const [fn, cost] of costs) {
      const o = r.functions!.origins.get(fn)!;
      m.set(o, (m.get(o) ?? 0) + cost);
    }
    return m;
  };
  const own = results.map((r) => layers(r, r.functions!.byFunction));
  const charged = results.map((r) => layers(r, r.functions!.charged));
  const last = own.length - 1;
  const names = [...new Set(own.flatMap((m) => [...m.keys()]))].sort((a, b) => (own[last]!.get(b) ?? 0) - (own[last]!.get(a) ?? 0));
  console.log(
    `\nA ${PROFILED_STREAM ? 'stream' : 'non-stream request'}'s main-thread instructions by layer (thousands per request): its own, and with the V8 and native work its JavaScript called\n`,
  );
  console.log(`| layer | ${results.map((r) => `${r.subject}: own | with what it called`).join(' | ')} |`);
  console.log(`|---|${results.map(() => '---|---|').join('')}`);
  for (const o of names)
    console.log(`| ${o} | ${results.map((_, i) => `${k(own[i]!.get(o) ?? 0)} | ${k(charged[i]!.get(o) ?? 0)}`).join(' | ')} |`);
  console.log(`| total | ${results.map((r) => `${k(r.functions!.total)} | ${k(r.functions!.total)}`).join(' | ')} |`);
  const ours = results.find((r) => r.subject === 'switchyard')!.functions!;
  const cell = (fn: string) => `\`${fn.slice(0, 100).replaceAll('|', '\\|')}\``;
  if (results[0]!.subject === 'reference pass-through') {
    const ref = results[0]!.functions!.byFunction;
    const rows = [...ours.byFunction].map(([fn, cost]) => [fn, cost, cost - (ref.get(fn) ?? 0)] as const).sort((a, b) => b[2] - a[2]);
    console.log(`\nThe ${FUNCTIONS} functions Switchyard spends most above the reference on (own instructions per request)\n`);
    console.log('| function | switchyard | reference | more |');
    console.log('|---|---|---|---|');
    for (const [fn, cost, more] of rows.slice(0, FUNCTIONS))
      console.log(`| ${cell(fn)} | ${perRequest(cost)} | ${perRequest(ref.get(fn) ?? 0)} | ${perRequest(more)} |`);
  }
  const dearest = (title: string, keep: (fn: string) => boolean) => {
    const rows = [...ours.charged].filter(([fn]) => keep(fn)).sort((a, b) => b[1] - a[1]);
    console.log(`\n${title} (instructions per request)\n`);
    console.log('| function | with what it called | own |');
    console.log('|---|---|---|');
    for (const [fn, cost] of rows.slice(0, FUNCTIONS))
      console.log(`| ${cell(fn)} | ${perRequest(cost)} | ${perRequest(ours.byFunction.get(fn) ?? 0)} |`);
  };
  dearest(`Switchyard's ${FUNCTIONS} dearest JavaScript functions, any layer's, with what they called`, (fn) => fn.startsWith('JS:'));
  dearest(
    `Switchyard's own ${FUNCTIONS} dearest functions, with the V8 and native work they called`,
    (fn) => ours.origins.get(fn) === 'Switchyard (src/)',
  );
}

const fake = await spawnReady('fake-upstream.js', ['0']);
try {
  // The server under valgrind is about 50 times slower: its event loop lags, which must not shed
  // the requests being counted.
  const env = { SWITCHYARD_MAX_EVENT_LOOP_DELAY_MS: '0' };
  const switchyard = (dist: string) => (wrap: string[]) => startSwitchyard({ upstream: fake.url, workers: 1, dist, wrap, env });
  const key = async (p: Proc) => ({ authorization: `Bearer ${await createBenchKey(p.url)}` });
  const jobs: (() => Promise<Counted>)[] = [];
  if (!values.responses)
    jobs.push(() =>
      count(
        'reference pass-through',
        (wrap) => spawnReady('reference-proxy.js', ['0', fake.url], wrap),
        async () => ({}),
      ),
    );
  // The same pass-through on Fastify (bench/fastify-proxy.ts): what the framework alone executes.
  if (values.fastify && !values.responses)
    jobs.push(() =>
      count(
        'the pass-through on Fastify',
        (wrap) => spawnReady('fastify-proxy.js', ['0', fake.url], wrap),
        async () => ({}),
      ),
    );
  jobs.push(() => count('switchyard', switchyard(DIST), key));
  const old = values.old;
  if (old !== undefined) jobs.push(() => count(`switchyard (${old})`, switchyard(join(resolve(old), 'dist')), key));
  const results: Counted[] = [];
  for (const job of jobs) results.push(await job());
  const ref = results[0]!;
  const n = (x: number) => x.toLocaleString('en-US');
  const vs = (r: number, x: number) => `${(r / x).toFixed(2)}×`;
  console.log(
    `\nInstructions per ${values.responses ? 'stored /v1/responses ' : ''}request (callgrind, user space, ${REQUESTS} requests after ${WARMUP} warm-up ones, one connection)\n`,
  );
  const kinds = KINDS.map((stream) => (stream ? ('stream' as const) : ('non_stream' as const)));
  const title = { non_stream: 'non-stream', stream: 'stream (20 chunks)' };
  console.log(`| subject |${kinds.map((k) => ` ${title[k]}, main thread | vs ${ref.subject} | all threads |`).join('')}`);
  console.log(`|---|${kinds.map(() => '---|---|---|').join('')}`);
  for (const r of results)
    console.log(`| ${r.subject} |${kinds.map((k) => ` ${n(r[k].main)} | ${vs(ref[k].main, r[k].main)} | ${n(r[k].all)} |`).join('')}`);
  if (FUNCTIONS > 0) printFunctions(results);
} finally {
  await fake.stop();
}
