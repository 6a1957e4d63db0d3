/**
 * `npm run bench`: every scenario in one run, each figure with its ratio to the reference measured
 * in the same run. Writes bench/results/<date>.json and the table in bench/README.md.
 * `npm run bench -- --quick` runs every scenario briefly to check that the harness works; it writes
 * its results to the temp folder and leaves the committed ones alone. `--only=gateway|local`
 * runs one part; `--only=schemas` the structured-output costs over ../shared/schemas.
 */
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { PACKAGE_ROOT } from '../src/config.js';
import { createBenchKey, spawnReady, startSwitchyard, type Proc } from './lib.js';
import { check, idleStreams, interleavedSequential, interleavedThroughput, throughput, type Subject } from './gateway.js';
import { localScenarios, type LocalResult } from './local.js';
import { renderTable, TARGETS, type Results } from './report.js';
import { renderSchemaTable, schemaScenario } from './schemas.js';
import { summarizeProfile } from './profile.js';

const quick = process.argv.includes('--quick');
const only = process.argv.find((a) => a.startsWith('--only='))?.slice(7);
const SECONDS = quick ? 1 : 10;
const SEQUENTIAL = quick ? 50 : 3000;
/** Seconds of each burst when subjects take turns (SECONDS in all per subject). */
const BURST_SECONDS = quick ? 1 : 2;
/** Rounds of the one-connection requests, subjects taking turns. */
const ROUNDS = quick ? 1 : 5;
const IDLE_STREAMS = quick ? 100 : 10_000;
/** Seconds of each load (non-stream, then stream) under the profiler. */
const PROFILE_SECONDS = quick ? 1 : 5;
/** The profile of the last gateway run, kept beside its results. */
let profile: string | undefined;

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

async function gateway(results: Results): Promise<void> {
  const procs: Proc[] = [];
  try {
    const fake = await spawnReady('fake-upstream.js', ['0']);
    procs.push(fake);
    const ref = await spawnReady('reference-proxy.js', ['0', fake.url]);
    procs.push(ref);
    const direct: Subject = {
      name: 'direct',
      url: fake.url,
      path: '/v1/chat/completions',
      headers: {},
      model: 'fake',
      pid: fake.child.pid!,
    };
    const reference: Subject = { ...direct, name: 'reference', url: ref.url, pid: ref.child.pid! };

    for (const workers of [1, 2]) {
      const sy = await startSwitchyard({ upstream: fake.url, workers });
      procs.push(sy);
      const key = await createBenchKey(sy.url);
      const switchyard: Subject = {
        name: `switchyard (${workers} worker${workers > 1 ? 's' : ''})`,
        url: sy.url,
        path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${key}` },
        model: 'openai/bench-fake',
        pid: sy.child.pid!,
      };
      await check(switchyard);
      const w = workers === 1 ? 'workers_1' : 'workers_2';
      if (workers === 1) {
        await check(direct);
        await check(reference);
        // The three take turns (bursts of BURST_SECONDS, the order turned each burst), so that the
        // machine's drift falls on each alike: every ratio compares the same minutes.
        const subjects = [direct, reference, switchyard];
        const names = ['direct', 'reference', 'switchyard'] as const;
        for (const stream of [false, true]) {
          log(`throughput, ${stream ? 'stream' : 'non-stream'}: ${subjects.map((s) => s.name).join(', ')} in turns`);
          const t = await interleavedThroughput(subjects, stream, 64, SECONDS / BURST_SECONDS, BURST_SECONDS);
          names.forEach((name, i) => (results.gateway.throughput[stream ? 'stream' : 'non_stream'][name] = t[i]!));
        }
        for (const stream of [false, true]) {
          log(`one connection, ${stream ? 'first chunk' : 'non-stream'}: in turns`);
          const l = await interleavedSequential(subjects, stream, SEQUENTIAL, ROUNDS);
          names.forEach((name, i) => (results.gateway.one_connection[stream ? 'first_chunk' : 'non_stream'][name] = l[i]!));
        }
      } else {
        // 10,000 streams hold 20,000 sockets in the gateway (client and upstream side); this machine
        // allows 20,000 open files per process, so the streams are spread over two workers.
        log(`${switchyard.name}: ${IDLE_STREAMS} idle streams`);
        results.gateway.idle_streams = {
          workers,
          ...(await idleStreams({ ...switchyard, model: 'openai/bench-hold' }, sy.child.pid!, IDLE_STREAMS)),
        };
      }
      log(`${switchyard.name}: throughput`);
      results.gateway.workers[w] = {
        non_stream: await throughput(switchyard, false, 64, SECONDS),
        stream: await throughput(switchyard, true, 64, SECONDS),
      };
      await sy.stop();
      procs.pop();
    }

    // Where the time goes: one worker under the same load, with V8's CPU profiler on.
    log('switchyard (1 worker): CPU profile');
    const profDir = mkdtempSync(join(tmpdir(), 'switchyard-prof-'));
    const sy = await startSwitchyard({ upstream: fake.url, workers: 1, nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${profDir}`] });
    procs.push(sy);
    const key = await createBenchKey(sy.url);
    const profiled: Subject = {
      name: 'switchyard (profiled)',
      url: sy.url,
      path: '/v1/chat/completions',
      headers: { authorization: `Bearer ${key}` },
      model: 'openai/bench-fake',
    };
    const start = performance.now();
    await throughput(profiled, false, 64, PROFILE_SECONDS);
    await throughput(profiled, true, 64, PROFILE_SECONDS);
    const windowMs = performance.now() - start;
    await sy.stop();
    procs.pop();
    const summary = summarizeProfile(profDir, PACKAGE_ROOT, windowMs);
    results.gateway.profile = { sampled_ms: summary.sampled_ms, by_package: summary.by_package, by_function: summary.by_function };
    profile = summary.file;
  } finally {
    for (const p of procs.reverse()) await p.stop();
  }
}

async function main(): Promise<void> {
  const cpu = cpus()[0]?.model ?? 'unknown';
  const results: Results = {
    date: new Date().toISOString(),
    quick,
    machine: { cpus: cpus().length, cpu, memory_gb: Math.round(totalmem() / 2 ** 30), node: process.version },
    targets: TARGETS,
    gateway: { throughput: { non_stream: {}, stream: {} }, one_connection: { non_stream: {}, first_chunk: {} }, workers: {} },
    local: [] as LocalResult[],
  };
  if (only === undefined || only === 'gateway') await gateway(results);
  if (only === undefined || only === 'local') results.local = await localScenarios({ quick, log });
  if (only === undefined || only === 'schemas') results.schemas = await schemaScenario({ quick, log });

  const table = `${renderTable(results)}${results.schemas ? `\n\n${renderSchemaTable(results.schemas)}` : ''}`;
  process.stdout.write(`${table}\n`);
  const day = results.date.slice(0, 10);
  if (quick || only !== undefined) {
    // A quick or partial run would leave the README's table incomplete: it goes to the temp folder.
    const path = join(tmpdir(), `switchyard-bench-${quick ? 'quick' : only}-${day}.json`);
    writeFileSync(path, JSON.stringify(results, null, 2));
    log(`${quick ? 'quick' : 'partial'} run: results in ${path}; bench/README.md left as it was`);
  } else {
    const dir = join(PACKAGE_ROOT, 'bench', 'results');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, `${day}.json`), `${JSON.stringify(results, null, 2)}\n`);
    if (profile) copyFileSync(profile, join(dir, `${day}.cpuprofile`));
    const readme = join(PACKAGE_ROOT, 'bench', 'README.md');
    const text = readFileSync(readme, 'utf8');
    const start = '<!-- results:start -->';
    const end = '<!-- results:end -->';
    const a = text.indexOf(start);
    const b = text.indexOf(end);
    if (a < 0 || b < a) throw new Error('bench/README.md lacks the results markers');
    writeFileSync(readme, `${text.slice(0, a + start.length)}\n${table}\n${text.slice(b)}`);
    log(`results in bench/results/${day}.json and bench/README.md`);
  }
  process.exit(0);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
