#!/usr/bin/env node
// Thin launcher so `npx switchyard` works once the TypeScript has been built (npm ci runs the build).
import('../dist/src/cli.js').then((m) => m.main(process.argv.slice(2))).then(
  (code) => { process.exitCode = code; },
  (err) => { console.error(err instanceof Error ? err.message : err); process.exitCode = 1; },
);
