/**
 * Builds the web console (console/) into dist/console, served under /console by src/http/console.ts.
 * Part of `npm run build`, so `npm ci` (through `prepare`) and `npm start` (through `prestart`) build it.
 *
 * esbuild bundles console/src/main.tsx (Preact, uPlot and their CSS) into content-hashed files under
 * assets/, and index.html is written from console/index.html with their names. Everything the page
 * loads comes from this origin: no CDN, no external font.
 */
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { build } from 'esbuild';

const ROOT = resolve(dirname(new URL(import.meta.url).pathname), '..', '..');
const SOURCE = join(ROOT, 'console');
const OUT = join(ROOT, 'dist', 'console');

rmSync(OUT, { recursive: true, force: true });
mkdirSync(join(OUT, 'assets'), { recursive: true });

const result = await build({
  entryPoints: [join(SOURCE, 'src', 'main.tsx')],
  outdir: join(OUT, 'assets'),
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  bundle: true,
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  legalComments: 'none',
  metafile: true,
  logLevel: 'warning',
});

const outputs = Object.keys(result.metafile.outputs).map((p) => basename(p));
const script = outputs.find((n) => n.endsWith('.js'));
const style = outputs.find((n) => n.endsWith('.css'));
if (!script || !style) throw new Error(`console build: expected a .js and a .css output, got ${outputs.join(', ')}`);

const html = readFileSync(join(SOURCE, 'index.html'), 'utf8')
  .replace('%SCRIPT%', `/console/assets/${script}`)
  .replace('%STYLE%', `/console/assets/${style}`);
writeFileSync(join(OUT, 'index.html'), html);
if (existsSync(join(SOURCE, 'public'))) cpSync(join(SOURCE, 'public'), OUT, { recursive: true });
