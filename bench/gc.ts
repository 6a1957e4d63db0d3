/**
 * `npm run bench:gc [-- --semi 16,32,64] [--rounds 3] [--seconds 10]`: what V8's young-generation
 * size does to Switchyard under the bench's load (64 connections, one worker, the fake upstream).
 * For every round, non-stream then stream, Switchyard starts once per semi-space size
 * (`--max-semi-space-size`, after the options `npm start` passes, so it wins) with `--trace-gc`,
 * takes the throughput load, and reports its CPU per request, requests per second, the time its
 * main thread spent in scavenges and the number of mark-compacts over the whole run (warm-up and
 * start included: two of the mark-compacts happen while the server starts), and its peak RSS.
 * The sizes take turns within each round, so the machine's drift falls on all alike. Asserts
 * nothing; bench/README.md, "A larger young generation", has a run.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { createBenchKey, spawnReady, startSwitchyard } from './lib.js';
import { throughput, type Subject, type Throughput } from './gateway.js';

const { values } = parseArgs({
  options: {
    semi: { type: 'string', default: '16,32,64' },
    rounds: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '10' },
  },
});
const SIZES = values.semi.split(',').map(Number);
const ROUNDS = Number(values.rounds);
const SECONDS = Number(values.seconds);

/** The time in scavenges and the mark-compacts in a `--trace-gc` log. */
function gcOf(trace: string): { scavenges: number; scavenge_ms: number; mark_compacts: number } {
  let scavenges = 0;
  let ms = 0;
  let markCompacts = 0;
  for (const line of trace.split('\n')) {
    // `[pid:isolate]  1234 ms: Scavenge 77.4 (124.7) -> 67.4 (124.7) MB, 2.51 / 0.01 ms  (...)`
    if (line.includes(': Scavenge ')) {
      scavenges++;
      ms += Number(/MB, ([\d.]+) \//.exec(line)?.[1] ?? 0);
    } else if (line.includes(': Mark-Compact ')) markCompacts++;
  }
  return { scavenges, scavenge_ms: Math.round(ms), mark_compacts: markCompacts };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-gc-'));
  const fake = await spawnReady('fake-upstream.js', ['0']);
  const rows: string[] = [];
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      for (const stream of [false, true]) {
        for (const semi of SIZES) {
          const trace = join(dir, `trace-${semi}.log`);
          // The server's stdout (where --trace-gc writes) goes to a file; `exec` keeps its pid.
          const sy = await startSwitchyard({
            upstream: fake.url,
            workers: 1,
            nodeArgs: [`--max-semi-space-size=${semi}`, '--trace-gc'],
            wrap: ['sh', '-c', `exec "$@" > '${trace}'`, 'sh'],
          });
          let t: Throughput;
          let peak: number;
          try {
            const key = await createBenchKey(sy.url);
            const s: Subject = {
              name: `semi-space ${semi} MB`,
              url: sy.url,
              path: '/v1/chat/completions',
              headers: { authorization: `Bearer ${key}` },
              model: 'openai/bench-fake',
              pid: sy.child.pid!,
            };
            t = await throughput(s, stream, 64, SECONDS);
            peak = Number(/VmHWM:\s*(\d+)/.exec(readFileSync(`/proc/${sy.child.pid!}/status`, 'utf8'))?.[1] ?? 0);
          } finally {
            await sy.stop();
          }
          const gc = gcOf(readFileSync(trace, 'utf8'));
          rows.push(
            `| ${round} | ${stream ? 'stream' : 'non-stream'} | ${semi} MB | ${t.rps} | ${t.cpu_us_per_request ?? '?'} | ${gc.scavenges} | ${gc.scavenge_ms} | ${gc.mark_compacts} | ${Math.round(peak / 1024)} MB |`,
          );
          process.stderr.write(`[gc] ${rows.at(-1)!}\n`);
        }
      }
    }
  } finally {
    await fake.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  process.stdout.write(
    `| round | load | semi-space | req/s | CPU µs/request | scavenges | in scavenges, ms | mark-compacts | peak RSS |\n|---|---|---|---|---|---|---|---|---|\n${rows.join('\n')}\n`,
  );
}

await main();
