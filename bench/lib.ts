/** Process and measurement helpers shared by the benchmark scenarios. */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { createServer, type AddressInfo } from 'node:net';
import { request, type Dispatcher } from 'undici';
import { PACKAGE_ROOT } from '../src/config.js';
import { SERVER_NODE_FLAGS } from '../src/runtime-flags.js';

export const DIST = join(PACKAGE_ROOT, 'dist');
export const ADMIN_KEY = 'sk-bench-admin-key-0123456789';

export interface Proc {
  child: ChildProcess;
  port: number;
  url: string;
  stop(): Promise<void>;
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
  await exited;
  clearTimeout(timer);
}

/** Starts one of the bench's own processes, which prints `ready <port>` once it listens. */
export async function spawnReady(script: string, args: string[], wrap: readonly string[] = []): Promise<Proc> {
  const [cmd, ...rest] = [...wrap, process.execPath, join(DIST, 'bench', script), ...args];
  const child = spawn(cmd!, rest, { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on('line', (line) => {
      const m = /^ready (\d+)$/.exec(line);
      if (m) resolve(Number(m[1]));
    });
    child.once('exit', (code) => reject(new Error(`${script} exited with ${code}`)));
  });
  return { child, port, url: `http://127.0.0.1:${port}`, stop: () => stopChild(child) };
}

export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const { port } = srv.address() as AddressInfo;
  await new Promise((r) => srv.close(r));
  return port;
}

/**
 * Switchyard as users run it (`node dist/src/main.js` with the Node option `npm start` sets) on a
 * free port, with its own data dir and the bench admin key; resolves once /readyz answers. Its
 * stdout (the access log) goes to /dev/null.
 */
export async function startMain(
  env: Record<string, string>,
  prepare?: (dataDir: string) => Record<string, string>,
  dist = DIST,
  nodeArgs: readonly string[] = [],
  /** A command the server runs under (`valgrind …`: bench/instructions.ts). */
  wrap: readonly string[] = [],
): Promise<Proc & { dataDir: string }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'switchyard-bench-'));
  const port = await freePort();
  // With the Node options `npm start` passes (src/runtime-flags.ts), as users run it.
  const [cmd, ...args] = [
    ...wrap,
    process.execPath,
    ...SERVER_NODE_FLAGS,
    ...nodeArgs,
    join(dist, 'src', 'main.js'),
    '--port',
    String(port),
  ];
  const child = spawn(cmd!, args, {
    env: { ...process.env, SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_ADMIN_KEY: ADMIN_KEY, ...env, ...prepare?.(dataDir) },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) throw new Error(`switchyard exited with ${child.exitCode}`);
    const ok = await request(`${url}/readyz`).then(
      (r) => r.body.text().then(() => r.statusCode === 200),
      () => false,
    );
    if (ok) break;
    // Under valgrind (bench/instructions.ts) starting takes a minute or more.
    if (i > (wrap.length > 0 ? 3000 : 600)) throw new Error('switchyard did not become ready');
    await sleep(100);
  }
  return {
    child,
    port,
    url,
    dataDir,
    async stop() {
      await stopChild(child);
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * The priced catalogue models deployed on the fake upstream: id, name, the upstream's model (see
 * fake-upstream.ts) and the protocol Switchyard speaks to it.
 */
const BENCH_MODELS = [
  ['openai/bench-fake', 'Bench fake', 'fake', 'chat'],
  ['openai/bench-hold', 'Bench fake that holds streams open', 'hold', 'chat'],
  ['openai/bench-short', 'Bench fake, one piece of text per stream', 'short', 'chat'],
  ['openai/bench-responses', 'Bench fake, a Responses upstream', 'fake', 'responses'],
  ['openai/bench-responses-short', 'Bench fake, a Responses upstream, one piece of text per stream', 'short', 'responses'],
] as const;

/**
 * Switchyard in front of the fake upstream: a catalogue model deployed on it with its price set (so
 * every request is costed and written to the ledger), and info logging.
 */
export function startSwitchyard(o: {
  upstream: string;
  workers: number;
  modelsDir?: string;
  dist?: string;
  /** Node options for the server process (`--cpu-prof` for the flame summary). */
  nodeArgs?: readonly string[];
  wrap?: readonly string[];
  env?: Record<string, string>;
}): Promise<Proc & { dataDir: string }> {
  return startMain(
    { SWITCHYARD_WORKERS: String(o.workers), SWITCHYARD_LOG_LEVEL: 'info', ...o.env },
    (dataDir) => {
      const config = join(dataDir, 'bench.json');
      writeFileSync(
        config,
        JSON.stringify({
          models: BENCH_MODELS.map(([id, name]) => ({
            id,
            name,
            model_type: 'text_generation',
            context_length: 8192,
            ...(id === 'openai/bench-fake' && { capabilities: ['function_calling', 'structured_output'] }),
            pricing: [
              { metric: 'input_tokens', rate: 0.15 },
              { metric: 'output_tokens', rate: 0.6 },
            ],
          })),
          deployments: BENCH_MODELS.map(([model, , upstreamModel, api]) => ({ model, baseUrl: `${o.upstream}/v1`, upstreamModel, api })),
        }),
      );
      return { SWITCHYARD_CONFIG: config, SWITCHYARD_MODELS_DIR: o.modelsDir ?? join(dataDir, 'models') };
    },
    o.dist,
    o.nodeArgs,
    o.wrap,
  );
}

/** An inference key with rate limits set high enough never to bite, so the limit checks run on every request. */
export async function createBenchKey(url: string): Promise<string> {
  const res = await request(`${url}/admin/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ org: 'bench', name: 'bench', limits: { rpm: 100_000_000, tpm: 1_000_000_000 } }),
  });
  const body = (await res.body.json()) as { key?: string };
  if (res.statusCode !== 201 || !body.key) throw new Error(`key creation failed: ${res.statusCode} ${JSON.stringify(body)}`);
  return body.key;
}

/** The process and all its descendants, from /proc. */
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(name)]);
    } catch {
      // the process ended meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    out.push(p);
    for (const c of children.get(p) ?? []) walk(c);
  };
  walk(pid);
  return out;
}

/** CPU time (user + system) a process and its descendants have used, in microseconds (clock ticks of 10 ms). */
export function treeCpuUs(pid: number): number {
  let total = 0;
  for (const p of processTree(pid)) {
    try {
      const fields = readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1]!.split(' ');
      total += (Number(fields[11]) + Number(fields[12])) * 10_000;
    } catch {
      // ended meanwhile
    }
  }
  return total;
}

/** Resident memory of a process and all its descendants (a cluster's primary and workers), in bytes. */
export function treeRss(pid: number): number {
  let total = 0;
  for (const p of processTree(pid)) {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${p}/status`, 'utf8'));
      total += m ? Number(m[1]) * 1024 : 0;
    } catch {
      // ended meanwhile
    }
  }
  return total;
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

export const median = (xs: readonly number[]): number =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Asks `/healthz` through `dispatcher` one request at a time (waiting `pauseMs` between them) until
 * stopped; `stop()` resolves to the slowest answer in ms: how long the server stopped answering.
 */
export function probeHealth(dispatcher: Dispatcher, pauseMs = 0): { stop(): Promise<number> } {
  let slowest = 0;
  let probing = true;
  const probes = (async () => {
    while (probing) {
      const t = performance.now();
      const res = await dispatcher.request({ path: '/healthz', method: 'GET' });
      await res.body.dump();
      slowest = Math.max(slowest, performance.now() - t);
      if (pauseMs > 0) await sleep(pauseMs);
    }
  })();
  return {
    async stop() {
      probing = false;
      await probes;
      return slowest;
    },
  };
}
