import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import WebSocket from 'ws';
import { PACKAGE_ROOT } from '../../src/config.js';
import { SERVER_NODE_FLAGS } from '../../src/runtime-flags.js';
import { SHARED_MODELS } from './server.js';

export const MAIN = join(PACKAGE_ROOT, 'dist', 'src', 'main.js');

export interface Running {
  child: ChildProcess;
  url: string;
  stdout: () => string;
  exited: Promise<number | null>;
  /** The V8 inspector's WebSocket, when started with `inspect` (for forcing a collection before a memory reading). */
  inspector?: string;
}

/**
 * Starts `node dist/src/main.js` as npm start does (with its Node options), on a free port (or `port`), and waits for it to listen.
 * `inspect` opens the V8 inspector on a free loopback port, so that memory tests can collect
 * garbage before reading the heap (see processMemory).
 */
export async function startProcess(env: Record<string, string>, opts: { inspect?: boolean; port?: number } = {}): Promise<Running> {
  const port = String(opts.port ?? 0);
  const args = [...SERVER_NODE_FLAGS, ...(opts.inspect ? ['--inspect=127.0.0.1:0'] : []), MAIN, '--port', port];
  const child = spawn(process.execPath, args, {
    env: { PATH: process.env['PATH'] ?? '', SWITCHYARD_MODELS_DIR: SHARED_MODELS, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise<number | null>((res) => child.on('exit', (code) => res(code)));
  const url = await new Promise<string>((res, rej) => {
    // Generous: two workers loading their catalogues beside a busy test runner on 2 cores took over 20 s.
    const timer = setTimeout(() => rej(new Error(`server did not start:\n${out}`)), 60_000);
    // The service's own announcement: the primary's with several workers (after every worker
    // listens), the process's own otherwise; a single worker's line does not count.
    const check = () => {
      for (const line of out.split('\n')) {
        if (!line.includes('"switchyard listening"') || line.includes('"worker":')) continue;
        const m = /"address":"(http:\/\/[^"]+)"/.exec(line);
        if (!m) continue;
        clearTimeout(timer);
        child.stdout!.off('data', check);
        return res(m[1]!);
      }
    };
    child.stdout!.on('data', check);
    void exited.then((code) => rej(new Error(`server exited with ${code}:\n${out}`)));
  });
  const inspector = /Debugger listening on (ws:\/\/\S+)/.exec(out)?.[1];
  return inspector ? { child, url, stdout: () => out, exited, inspector } : { child, url, stdout: () => out, exited };
}

/**
 * A full, synchronous garbage collection in the server, through its inspector. Without it the heap
 * a test reads is whatever V8 has not yet bothered to collect: used heap climbs tens of MB between
 * major collections and an idle process may not run one for a long time, so a comparison of two
 * uncollected readings measures V8's schedule, not what the server keeps.
 */
export async function collectGarbage(inspector: string): Promise<void> {
  const socket = new WebSocket(inspector);
  try {
    await new Promise<void>((res, rej) => {
      socket.once('open', () => res());
      socket.once('error', rej);
    });
    await new Promise<void>((res, rej) => {
      socket.on('message', (data: Buffer) => {
        const reply = JSON.parse(data.toString()) as { id?: number; error?: { message: string } };
        if (reply.id !== 1) return;
        if (reply.error) rej(new Error(reply.error.message));
        else res();
      });
      socket.send(JSON.stringify({ id: 1, method: 'HeapProfiler.collectGarbage' }));
    });
  } finally {
    socket.close();
  }
}

/**
 * A server's resident memory and V8 heap, from its /metrics; after a full collection when the
 * server was started with `inspect`.
 */
export async function processMemory(url: string, inspector?: string): Promise<{ rss: number; heap: number }> {
  if (inspector) await collectGarbage(inspector);
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
  return { rss: read('switchyard_process_resident_memory_bytes'), heap: read('switchyard_nodejs_heap_size_used_bytes') };
}
