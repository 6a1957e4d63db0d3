/**
 * The flame summary: Switchyard run with `--cpu-prof` under the gateway load, its V8 CPU profile
 * reduced to where the time goes (self time by package and by function, the load window only).
 * The whole profile is kept beside the results for a flame-graph viewer (Chrome DevTools,
 * speedscope): `bench/results/<date>.cpuprofile`.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileSummary {
  /** Milliseconds of samples summarized (the load window). */
  sampled_ms: number;
  by_package: Array<{ name: string; percent: number }>;
  by_function: Array<{ name: string; percent: number }>;
}

/** Where a frame's code lives: our own file, a dependency, Node's internals, or V8 (native, GC, idle). */
function placeOf(url: string, root: string): string {
  if (url === '') return '(V8 native)';
  const path = url.replace(/^file:\/\//, '');
  const nm = path.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = path.slice(nm + 14).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  if (path.startsWith('node:')) return 'node (internals)';
  return path.startsWith(root) ? path.slice(root.length + 1).replace(/^dist\//, '') : path;
}

/**
 * Summarizes the newest main-thread profile in `dir`: only the last `windowMs` of samples count (the load,
 * not the start-up), and the `top` largest entries are kept.
 */
export function summarizeProfile(dir: string, root: string, windowMs: number, top = 15): ProfileSummary & { file: string } {
  // Node writes one profile per thread (CPU.<date>.<time>.<pid>.<thread>.<n>.cpuprofile): the
  // main thread is 0; the others (the SQLite checkpoint worker, the schema worker) are not the request path.
  const name = readdirSync(dir)
    .filter((f) => f.endsWith('.cpuprofile') && f.split('.')[4] === '0')
    .sort()
    .at(-1);
  if (!name) throw new Error(`no CPU profile in ${dir}`);
  const file = join(dir, name);
  const prof = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const total = prof.timeDeltas.reduce((a, b) => a + b, 0);
  const from = total - windowMs * 1000;
  const self = new Map<number, number>();
  let t = 0;
  prof.samples.forEach((id, i) => {
    const dt = prof.timeDeltas[i] ?? 0;
    t += dt;
    if (t >= from) self.set(id, (self.get(id) ?? 0) + dt);
  });
  let sampled = 0;
  const packages = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const [id, us] of self) {
    const cf = byId.get(id)!.callFrame;
    sampled += us;
    const place = placeOf(cf.url, root);
    packages.set(place, (packages.get(place) ?? 0) + us);
    const fn = `${cf.functionName || '(anonymous)'} ${place}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;
    functions.set(fn, (functions.get(fn) ?? 0) + us);
  }
  const best = (m: Map<string, number>) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([n, us]) => ({ name: n, percent: Math.round((1000 * us) / sampled) / 10 }));
  return { file, sampled_ms: Math.round(sampled / 1000), by_package: best(packages), by_function: best(functions) };
}
