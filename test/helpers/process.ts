import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { PACKAGE_ROOT } from '../../src/config.js';
import { SHARED_MODELS } from './server.js';

export const MAIN = join(PACKAGE_ROOT, 'dist', 'src', 'main.js');

export interface Running {
  child: ChildProcess;
  url: string;
  stdout: () => string;
  exited: Promise<number | null>;
}

/** Starts `node dist/src/main.js` as npm start does, on a free port, and waits for it to listen. */
export async function startProcess(env: Record<string, string>): Promise<Running> {
  const child = spawn(process.execPath, [MAIN, '--port', '0'], {
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
    const timer = setTimeout(() => rej(new Error(`server did not start:\n${out}`)), 20_000);
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
  return { child, url, stdout: () => out, exited };
}

/** A server's resident memory and V8 heap, from its /metrics. */
export async function processMemory(url: string): Promise<{ rss: number; heap: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
  return { rss: read('switchyard_process_process_resident_memory_bytes'), heap: read('switchyard_process_nodejs_heap_size_used_bytes') };
}
