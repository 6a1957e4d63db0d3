/**
 * `npm run check:layers`: the import rules of docs/decisions.md ("Layout"), checked on the sources.
 *
 * A request reads top-down: http → api → protocols → core → engines → store. The files directly in
 * src/ (main, app, cli, cluster, config) put the layers together and may import anything; no layer
 * imports them, except the settings type from config.ts. Every rule below is on all imports, type
 * imports included; the cycle check is on the imports that exist at run time.
 *
 * Written on the TypeScript compiler's parser (already a dependency) rather than a new tool: it is
 * fifty lines, and the rules are ours.
 */
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

const ROOT = resolve(dirname(new URL(import.meta.url).pathname), '..', '..');
const SRC = join(ROOT, 'src');

type Layer = 'root' | 'http' | 'api' | 'protocols' | 'core' | 'engines' | 'store';

/** What each layer may import (besides itself). */
const ALLOWED: Record<Layer, readonly Layer[]> = {
  root: ['http', 'api', 'protocols', 'core', 'engines', 'store'],
  http: ['api', 'protocols', 'core', 'engines', 'store'],
  api: ['protocols', 'core', 'store'],
  protocols: ['core'],
  // Core runs engines through their one interface; the engines' own folders are theirs.
  core: ['engines', 'store'],
  // Engines speak upstream protocols through the protocol modules' client side, and use core's
  // canonical types and errors.
  engines: ['protocols', 'core', 'store'],
  store: [],
};

/** Core files an engine or protocol may use: the canonical types, errors and small shared helpers, not the pipeline. */
const CORE_KERNEL = new Set([
  'canonical.ts',
  'cancellation.ts',
  'channel.ts',
  'errors.ts',
  'ids.ts',
  'items.ts',
  'json-walk.ts',
  'estimate.ts',
  'stop-matcher.ts',
  'think-splitter.ts',
  'responses/format.ts',
]);

function layerOf(file: string): Layer {
  const rel = relative(SRC, file);
  const top = rel.split('/')[0]!;
  if (!rel.includes('/')) return 'root';
  if (['http', 'api', 'protocols', 'core', 'engines', 'store'].includes(top)) return top as Layer;
  throw new Error(`${rel}: not in a known layer`);
}

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

interface Import {
  target: string;
  typeOnly: boolean;
}

function importsOf(file: string): Import[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, false);
  const out: Import[] = [];
  for (const s of source.statements) {
    if (!(ts.isImportDeclaration(s) || ts.isExportDeclaration(s)) || !s.moduleSpecifier || !ts.isStringLiteral(s.moduleSpecifier)) continue;
    const spec = s.moduleSpecifier.text;
    if (!spec.startsWith('.')) continue;
    let typeOnly: boolean;
    if (ts.isImportDeclaration(s)) {
      const c = s.importClause;
      const named = c?.namedBindings && ts.isNamedImports(c.namedBindings) ? c.namedBindings.elements : undefined;
      typeOnly =
        c !== undefined &&
        (c.isTypeOnly || (c.name === undefined && named !== undefined && named.length > 0 && named.every((e) => e.isTypeOnly)));
    } else {
      typeOnly = s.isTypeOnly;
    }
    out.push({ target: resolve(dirname(file), spec.replace(/\.js$/, '.ts')), typeOnly });
  }
  return out;
}

const files = sources(SRC);
const graph = new Map(files.map((f) => [f, importsOf(f)]));
const problems: string[] = [];
const name = (f: string) => relative(ROOT, f);

for (const [file, imports] of graph) {
  const from = layerOf(file);
  for (const { target, typeOnly } of imports) {
    const to = layerOf(target);
    if (to === from) continue;
    if (to === 'root') {
      if (!(target === join(SRC, 'config.ts') && typeOnly))
        problems.push(`${name(file)} imports ${name(target)}: layers do not import the composition root (only the Config type)`);
      continue;
    }
    if (!ALLOWED[from].includes(to)) {
      problems.push(
        `${name(file)} (${from}) imports ${name(target)} (${to}): ${from} may import ${ALLOWED[from].join(', ') || 'nothing outside itself'}`,
      );
      continue;
    }
    if (to === 'core' && (from === 'engines' || from === 'protocols') && !CORE_KERNEL.has(relative(join(SRC, 'core'), target))) {
      problems.push(
        `${name(file)} (${from}) imports ${name(target)}: ${from} may use core's canonical types, errors and helpers, not ${relative(SRC, target)}`,
      );
    }
  }
}

// Cycles among run-time imports (a type-only import is erased and cannot form one).
const state = new Map<string, 'open' | 'done'>();
const stack: string[] = [];
function visit(f: string): void {
  state.set(f, 'open');
  stack.push(f);
  for (const { target, typeOnly } of graph.get(f) ?? []) {
    if (typeOnly || !graph.has(target)) continue;
    const s = state.get(target);
    if (s === 'open') problems.push(`import cycle: ${[...stack.slice(stack.indexOf(target)), target].map(name).join(' → ')}`);
    else if (s === undefined) visit(target);
  }
  stack.pop();
  state.set(f, 'done');
}
for (const f of files) if (!state.has(f)) visit(f);

if (problems.length) {
  console.error(`${problems.length} layering problem(s):\n${problems.map((p) => `  ${p}`).join('\n')}`);
  process.exit(1);
}
console.log(
  `layers: ${files.length} files, ${[...graph.values()].reduce((n, i) => n + i.length, 0)} imports, no upward import and no cycle`,
);
