#!/usr/bin/env node
// Thin launcher so `npx switchyard` works once the TypeScript has been built (npm ci runs the build).
import('../dist/src/cli.js').then((m) => m.main(process.argv.slice(2))).then(
  // `serve` exits as `npm start` does: a cluster worker's channel to its primary would keep it
  // running after it drained. Other commands only set the code, so their output is never cut short.
  (code) => { if (process.argv[2] === 'serve') process.exit(code); process.exitCode = code; },
  (err) => { console.error(err instanceof Error ? err.message : err); process.exitCode = 1; },
);
