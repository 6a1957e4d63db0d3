/**
 * Several Switchyard instances behind HAProxy, as docs/deployment.md runs them: each instance is
 * `node bin/switchyard.js serve --port N` (a node:cluster primary and its workers) in a process group
 * of its own, so a test can SIGKILL the whole instance at once; HAProxy runs in the foreground on the
 * documented config (deploy/haproxy.cfg) with the placeholders filled in.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { freePort } from '../../bench/lib.js';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { PACKAGE_ROOT } from '../../src/config.js';

export const HAPROXY_TEMPLATE = join(PACKAGE_ROOT, 'deploy', 'haproxy.cfg');
export const SWITCHYARD_BIN = join(PACKAGE_ROOT, 'bin', 'switchyard.js');

/** Process groups started here that are still alive: killed if the test process exits without cleaning up. */
const groups = new Set<number>();
let exitHook = false;
function track(pid: number): void {
  groups.add(pid);
  if (exitHook) return;
  exitHook = true;
  const killAll = () => {
    for (const g of groups) killGroup(g, 'SIGKILL');
  };
  process.on('exit', killAll);
  // Detached groups do not get the terminal's Ctrl-C, and a process ended by a signal runs no 'exit'
  // listeners: take them down on the way out.
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      killAll();
      if (process.listenerCount(signal) === 0) process.exit(128 + (osConstants.signals[signal] ?? 0));
    });
  }
}

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // already gone
  }
}

/** Keeps the last `max` characters of a process's output, for failure messages. */
function tail(max = 256 * 1024): { add(s: string): void; text(): string } {
  let buf = '';
  return {
    add(s) {
      buf += s;
      if (buf.length > max) buf = buf.slice(buf.length - max);
    },
    text: () => buf,
  };
}

/** Whether an `haproxy` binary is on PATH (.ci/run installs Debian's package). */
export function haproxyInstalled(): boolean {
  return spawnSync('haproxy', ['-v'], { stdio: 'ignore' }).status === 0;
}

/** The documented config with its `{{NAME}}` placeholders filled in; every placeholder must be given. */
export function renderHaproxyConfig(values: Record<string, string>, template = readFileSync(HAPROXY_TEMPLATE, 'utf8')): string {
  return template.replace(/\{\{(\w+)\}\}/g, (_, name: string) => {
    const v = values[name];
    if (v === undefined) throw new Error(`deploy/haproxy.cfg needs a value for {{${name}}}`);
    return v;
  });
}

export interface Managed {
  child: ChildProcess;
  pid: number;
  /** The last 256 KB of stdout and stderr. */
  output(): string;
  exited: Promise<number | null>;
  alive(): boolean;
  /** Signals the whole process group (an instance: its primary and every worker). */
  kill(signal: NodeJS.Signals): void;
  /** SIGKILL to the group, and waits for the leader to exit. */
  destroy(): Promise<void>;
}

function manage(child: ChildProcess): Managed {
  const pid = child.pid;
  if (pid === undefined) throw new Error('spawn failed');
  track(pid);
  const out = tail();
  child.stdout?.on('data', (d: Buffer) => out.add(d.toString()));
  child.stderr?.on('data', (d: Buffer) => out.add(d.toString()));
  let running = true;
  const exited = new Promise<number | null>((res) =>
    child.once('exit', (code) => {
      running = false;
      res(code);
    }),
  );
  return {
    child,
    pid,
    output: out.text,
    exited,
    alive: () => running,
    kill: (signal) => killGroup(pid, signal),
    async destroy() {
      // The group outlives its leader when workers are left behind: always signal the group.
      killGroup(pid, 'SIGKILL');
      groups.delete(pid);
      if (running) await Promise.race([exited, sleep(5000)]);
    },
  };
}

export interface Instance extends Managed {
  name: string;
  port: number;
  url: string;
}

/**
 * Starts one instance exactly as docs/deployment.md does (`node bin/switchyard.js serve --port N`, the
 * settings in the environment) and resolves once its primary announces that every worker listens.
 */
export async function startInstance(name: string, port: number, env: Record<string, string>, timeoutMs = 30_000): Promise<Instance> {
  const child = spawn(process.execPath, [SWITCHYARD_BIN, 'serve', '--port', String(port)], {
    cwd: PACKAGE_ROOT,
    env: { PATH: process.env['PATH'] ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  const m = manage(child);
  let pending = '';
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`instance ${name} did not start in ${timeoutMs} ms:\n${m.output()}`)), timeoutMs);
    const onData = (d: Buffer) => {
      pending += d.toString();
      const lines = pending.split('\n');
      pending = lines.pop() ?? '';
      // The primary's line (no "worker" field) comes once every worker listens.
      if (lines.some((l) => l.includes('"switchyard listening"') && !l.includes('"worker":'))) {
        clearTimeout(timer);
        child.stdout?.off('data', onData);
        resolve();
      }
    };
    child.stdout?.on('data', onData);
    void m.exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`instance ${name} exited with ${code} while starting:\n${m.output()}`));
    });
  });
  try {
    await ready;
  } catch (err) {
    await m.destroy();
    throw err;
  }
  return { ...m, name, port, url: `http://127.0.0.1:${port}` };
}

export interface Haproxy extends Managed {
  url: string;
  statsUrl: string;
  /** The check status HAProxy reports for each server of the `switchyard` backend (`UP`, `DOWN`, …). */
  serverStatus(): Promise<Record<string, string>>;
}

/**
 * HAProxy in the foreground (`-db`) on deploy/haproxy.cfg, with the given instance addresses in its
 * `server` lines; resolves once its status page answers and every server is UP.
 */
export async function startHaproxy(instances: readonly string[], configPath: string, timeoutMs = 10_000): Promise<Haproxy> {
  const front = await freePort();
  const stats = await freePort();
  const values: Record<string, string> = { FRONTEND: `127.0.0.1:${front}`, STATS: `127.0.0.1:${stats}` };
  instances.forEach((addr, i) => (values[`INSTANCE_${i + 1}`] = addr));
  writeFileSync(configPath, renderHaproxyConfig(values));
  const child = spawn('haproxy', ['-db', '-f', configPath], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const m = manage(child);
  const statsUrl = `http://127.0.0.1:${stats}/stats`;
  const serverStatus = async (): Promise<Record<string, string>> => {
    const res = await request(`${statsUrl};csv`, { headersTimeout: 2000, bodyTimeout: 2000 });
    const [head, ...rows] = (await res.body.text()).split('\n');
    const cols = (head ?? '').replace(/^# /, '').split(',');
    const px = cols.indexOf('pxname');
    const sv = cols.indexOf('svname');
    const st = cols.indexOf('status');
    const out: Record<string, string> = {};
    for (const row of rows) {
      const f = row.split(',');
      if (f[px] === 'switchyard' && f[sv] !== 'BACKEND' && f[sv] !== 'FRONTEND' && f[sv] !== undefined) out[f[sv]] = f[st] ?? '';
    }
    return out;
  };
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (!m.alive()) throw new Error(`haproxy exited:\n${m.output()}`);
    const status = await serverStatus().catch(() => ({}) as Record<string, string>);
    const names = Object.keys(status);
    if (names.length === instances.length && names.every((n) => status[n]?.startsWith('UP'))) break;
    if (Date.now() > deadline) {
      await m.destroy();
      throw new Error(`haproxy not ready in ${timeoutMs} ms (servers ${JSON.stringify(status)}):\n${m.output()}`);
    }
    await sleep(50);
  }
  return { ...m, url: `http://127.0.0.1:${front}`, statsUrl, serverStatus };
}
