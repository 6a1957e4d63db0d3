/**
 * Where a callgrind count went, by function: the self cost of every function in a callgrind output
 * file, with V8's compiled JavaScript named. Callgrind knows native functions by their symbols, but
 * code V8 compiled at run time has none: it shows as bare addresses. Node's `--perf-basic-prof`
 * writes `/tmp/perf-<pid>.map` (start, size and name of each piece of code V8 compiles: JavaScript
 * functions with their file and line, regular expressions), which names those addresses.
 * Used by bench/instructions.ts (`--functions`).
 */
import { readFileSync } from 'node:fs';

/** Self cost (instructions) by function, and what each function is part of. */
export interface FunctionCosts {
  total: number;
  byFunction: Map<string, number>;
  origins: Map<string, string>;
  /**
   * The same total with the cost of native code and V8's builtins charged to the JavaScript that
   * called them (a regular expression's match to the function that ran it, a JSON.parse to its
   * caller, a SQLite statement to the binding's caller): split among callers in proportion to
   * each call edge's inclusive cost, from the callee up until a JavaScript function is reached.
   * Callgrind keeps callers, not whole stacks, so a builtin called from several places is split
   * by what it cost from each, not exactly per call.
   */
  charged: Map<string, number>;
}

interface CodeRange {
  start: number;
  end: number;
  name: string;
}

/**
 * The perf map's ranges, sorted. Code V8 dropped may have its address reused by later code; the
 * map lists both, and the later entry (the code that ran after the warm-up) is kept.
 */
function readPerfMap(file: string): CodeRange[] {
  const byStart = new Map<number, CodeRange>();
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const a = line.indexOf(' ');
    const b = line.indexOf(' ', a + 1);
    if (a < 0 || b < 0) continue;
    const start = parseInt(line.slice(0, a), 16);
    byStart.set(start, { start, end: start + parseInt(line.slice(a + 1, b), 16), name: line.slice(b + 1) });
  }
  return [...byStart.values()].sort((x, y) => x.start - y.start);
}

function lookup(ranges: CodeRange[], addr: number): string | undefined {
  let lo = 0;
  let hi = ranges.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid]!.start <= addr) {
      found = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  // Ranges may nest (a function's code inside a larger region): look back a little.
  for (let i = found; i >= 0 && i > found - 8; i--) {
    const r = ranges[i]!;
    if (addr >= r.start && addr < r.end) return r.name;
  }
  return undefined;
}

const ADDRESS = /^0x([0-9a-f]+)$/;
const SHORTEN: [RegExp, string][] = [
  [/(?:file:\/\/)?\/\S*?\/node_modules\//g, ''],
  [/file:\/\/\/\S*?\/dist\//g, ''],
];

/**
 * Reads a callgrind output file (`callgrind.out.N-01`: one dump of one thread) and names each
 * function: a native one by its symbol (`sqlite3VdbeExec`), a V8 builtin by its own
 * (`Builtins_LoadIC`), compiled JavaScript as the perf map names it (`JS:*relay src/…/relay.js:558:17`,
 * `*` optimized, `^` baseline), an address the map does not cover as `JIT code, unnamed`.
 */
export function functionCosts(callgrindFile: string, perfMap: string | undefined): FunctionCosts {
  const ranges = perfMap ? readPerfMap(perfMap) : [];
  const names = new Map<string, string>();
  const objects = new Map<string, string>();
  const byFunction = new Map<string, number>();
  const origins = new Map<string, string>();
  let total = 0;
  let current = '';
  let object = '';
  // The line after `calls=` is the call's inclusive cost, which is not the caller's own.
  let callLine = false;
  const compressed = (table: Map<string, string>, value: string): string => {
    const m = /^\((\d+)\)(?: (.*))?$/.exec(value);
    if (!m) return value;
    if (m[2] !== undefined) table.set(m[1]!, m[2]);
    return table.get(m[1]!) ?? value;
  };
  const callers = new Map<string, Map<string, number>>();
  let callee = '';
  const label = (fn: string): string => {
    const m = ADDRESS.exec(fn);
    let name = m ? lookup(ranges, parseInt(m[1]!, 16)) : fn;
    if (name === undefined) name = 'JIT code, unnamed';
    for (const [re, to] of SHORTEN) name = name.replace(re, to);
    return name;
  };
  for (const line of readFileSync(callgrindFile, 'utf8').split('\n')) {
    const c = line.charCodeAt(0);
    if ((c >= 48 && c <= 57) || c === 43 || c === 45 || c === 42) {
      const space = line.indexOf(' ');
      if (space < 0) continue;
      const cost = Number(line.slice(space + 1).split(' ', 1)[0]);
      if (callLine) {
        callLine = false;
        let from = callers.get(callee);
        if (!from) callers.set(callee, (from = new Map()));
        from.set(current, (from.get(current) ?? 0) + cost);
        continue;
      }
      total += cost;
      byFunction.set(current, (byFunction.get(current) ?? 0) + cost);
    } else if (line.startsWith('fn=')) {
      const fn = compressed(names, line.slice(3));
      current = label(fn);
      if (!origins.has(current)) origins.set(current, origin(current, ADDRESS.test(fn) ? '' : object));
    } else if (line.startsWith('ob=')) object = compressed(objects, line.slice(3));
    else if (line.startsWith('cfn=')) callee = label(compressed(names, line.slice(4)));
    else if (line.startsWith('cob=')) compressed(objects, line.slice(4));
    else if (line.startsWith('calls=')) callLine = true;
  }
  return { total, byFunction, origins, charged: charge(byFunction, origins, callers) };
}

const NATIVE = new Set(['V8 builtins', 'V8 runtime and Node C++', 'libc, libm, libstdc++', 'SQLite (better-sqlite3)', 'JIT code, unnamed']);

/**
 * FunctionCosts.charged: native functions' cost pushed up to their callers, round after round, until
 * it reaches JavaScript (or a function nobody called, such as the event loop's). Rounds rather than
 * a recursive walk, since native code calls itself in cycles (a builtin calling the runtime calling
 * the builtin): what goes round a cycle reaches JavaScript over a few rounds. After 64 rounds any
 * remainder stays where it is.
 */
function charge(
  byFunction: Map<string, number>,
  origins: Map<string, string>,
  callers: Map<string, Map<string, number>>,
): Map<string, number> {
  const charged = new Map<string, number>();
  const add = (m: Map<string, number>, fn: string, cost: number) => m.set(fn, (m.get(fn) ?? 0) + cost);
  const up = new Map<string, [string, number][]>();
  for (const [fn, from] of callers) {
    const edges = [...from].filter(([c]) => c !== fn);
    const sum = edges.reduce((n, [, c]) => n + c, 0);
    if (sum > 0)
      up.set(
        fn,
        edges.map(([c, cost]) => [c, cost / sum]),
      );
  }
  let pending = new Map<string, number>();
  for (const [fn, cost] of byFunction) add(pending, fn, cost);
  for (let round = 0; round < 64 && pending.size > 0; round++) {
    const next = new Map<string, number>();
    for (const [fn, cost] of pending) {
      const edges = up.get(fn);
      if (!NATIVE.has(origins.get(fn) ?? '') || edges === undefined || round === 63) add(charged, fn, cost);
      else for (const [caller, f] of edges) add(next, caller, cost * f);
    }
    pending = next;
  }
  return charged;
}

/** What a function is part of, by its name and the object file it is in, for a summary by layer. */
function origin(fn: string, object: string): string {
  if (fn.startsWith('RegExp:')) return 'regular expressions (compiled)';
  if (fn.startsWith('JS:')) {
    if (/ src\//.test(fn)) return 'Switchyard (src/)';
    if (/ bench\//.test(fn)) return 'bench/ (the pass-through itself)';
    if (/ node:/.test(fn)) return 'Node (node: modules)';
    const pkg = / (@[^/\s]+\/[^/\s]+|[^/\s:]+)\//.exec(fn)?.[1];
    if (pkg === undefined) return 'generated code (ajv validators, serializers)';
    return `npm: ${pkg.startsWith('@fastify/') || pkg === 'find-my-way' || pkg === 'avvio' ? 'fastify' : pkg}`;
  }
  if (fn === 'JIT code, unnamed') return fn;
  if (object.includes('better_sqlite3')) return 'SQLite (better-sqlite3)';
  if (fn.startsWith('Builtins_')) return 'V8 builtins';
  if (/\/lib(c|m|stdc\+\+)[.-]/.test(object)) return 'libc, libm, libstdc++';
  return 'V8 runtime and Node C++';
}
