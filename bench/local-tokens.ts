/**
 * Tokens per second of the local engine through the HTTP API, as a ratio of raw node-llama-cpp on
 * the same model, thread count and prompt, measured in one run. The server runs as a child process
 * (as in production); the raw loop runs here, alternating with it, so both see the same machine.
 *
 *   npm run bench            (SWITCHYARD_BENCH_MODEL=path/to.gguf to pick another model)
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';
import { request } from 'undici';
import { PACKAGE_ROOT } from '../src/config.js';

const MODEL = resolve(process.env['SWITCHYARD_BENCH_MODEL'] ?? join(PACKAGE_ROOT, '..', 'shared', 'models', 'stories260K.gguf'));
const PROMPT = 'Once upon a time';
const TOKENS = 500;
const ROUNDS = 5;
const THREADS = 1;

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function rawRun(): Promise<() => Promise<number>> {
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: MODEL });
  const context = await model.createContext({ contextSize: Math.min(512 + TOKENS, model.trainContextSize), threads: THREADS });
  const seq = context.getSequence();
  const prompt = [model.tokens.bos!, ...model.tokenize(PROMPT)];
  return async () => {
    await seq.clearHistory();
    const t = process.hrtime.bigint();
    let n = 0;
    for await (const _ of seq.evaluate(prompt, { temperature: 0 })) if (++n >= TOKENS) break;
    return n / (Number(process.hrtime.bigint() - t) / 1e9);
  };
}

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const { port } = srv.address() as AddressInfo;
  await new Promise((r) => srv.close(r));
  return port;
}

async function startServer(): Promise<{ url: string; stop(): Promise<void> }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'switchyard-bench-'));
  const port = await freePort();
  const child = spawn(process.execPath, [join(PACKAGE_ROOT, 'dist', 'src', 'main.js'), '--port', String(port)], {
    env: {
      ...process.env, SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_MODELS_DIR: dirname(MODEL), SWITCHYARD_ADMIN_KEY: 'bench-admin-key-0123456789',
      SWITCHYARD_LOG_LEVEL: 'warn', SWITCHYARD_LOCAL_THREADS: String(THREADS), SWITCHYARD_LOCAL_PRELOAD: 'true',
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) throw new Error(`server exited with ${child.exitCode}`);
    const ok = await request(`${url}/readyz`).then((r) => r.body.text().then(() => r.statusCode === 200), () => false);
    if (ok) break;
    if (i > 200) throw new Error('server did not become ready');
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    async stop() {
      child.kill('SIGTERM');
      await new Promise((r) => child.on('exit', r));
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

async function apiRun(url: string, stream: boolean): Promise<number> {
  const id = `local/${basename(MODEL).replace(/\.gguf$/i, '').toLowerCase().replace(/[^a-z0-9._-]+/g, '-')}`;
  const t = process.hrtime.bigint();
  const res = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: 'Bearer bench-admin-key-0123456789', 'content-type': 'application/json' },
    body: JSON.stringify({ model: id, messages: [{ role: 'user', content: PROMPT }], max_tokens: TOKENS, temperature: 0, stream, stream_options: stream ? { include_usage: true } : undefined }),
  });
  const text = await res.body.text();
  const seconds = Number(process.hrtime.bigint() - t) / 1e9;
  const usage = stream
    ? (JSON.parse(text.split('\n').filter((l) => l.includes('"usage":{')).at(-1)!.slice(6)) as { usage: { completion_tokens: number } }).usage
    : (JSON.parse(text) as { usage: { completion_tokens: number } }).usage;
  return usage.completion_tokens / seconds;
}

async function main(): Promise<void> {
  console.log(`model ${MODEL}, ${TOKENS} tokens, threads ${THREADS}, ${ROUNDS} rounds, medians`);
  const raw = await rawRun();
  const server = await startServer();
  try {
    await raw();
    await apiRun(server.url, false);
    const r: number[] = [];
    const ns: number[] = [];
    const st: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      r.push(await raw());
      ns.push(await apiRun(server.url, false));
      st.push(await apiRun(server.url, true));
    }
    const base = median(r);
    const row = (name: string, v: number) => console.log(`${name.padEnd(34)} ${v.toFixed(0).padStart(6)} tok/s   ${(v / base).toFixed(3)} of raw`);
    row('raw node-llama-cpp (evaluate loop)', base);
    row('API, non-stream', median(ns));
    row('API, stream', median(st));
  } finally {
    await server.stop();
  }
  process.exit(0);
}

void main();
