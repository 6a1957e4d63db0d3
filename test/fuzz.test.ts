import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import fc from 'fast-check';
import { tempDir } from './helpers/server.js';
import { startProcess, type Running } from './helpers/process.js';
import { encode, rawHeadArb, requestArb, sendRaw, type RawResponse } from './helpers/fuzz-cases.js';

/** `npm test` runs a reduced count; `npm run fuzz` sets SWITCHYARD_FUZZ_RUNS=10000. */
const RUNS = Number(process.env['SWITCHYARD_FUZZ_RUNS'] ?? 1500);
const ADMIN = 'sk-test-admin-fuzz-0123456789abcdef';

function checkEnvelope(r: RawResponse, what: string): void {
  assert.ok(r.status > 0, `${what}: no answer`);
  assert.ok(r.status < 500, `${what}: ${r.status} ${r.body.slice(0, 300)}`);
  if (r.status < 400) return;
  assert.ok(r.headers.get('x-request-id'), `${what}: no x-request-id`);
  const body = JSON.parse(r.body) as { error?: { message?: unknown; type?: unknown; param?: unknown; code?: unknown } };
  const e = body.error;
  assert.ok(e && typeof e.message === 'string' && typeof e.type === 'string', `${what}: not the envelope: ${r.body.slice(0, 200)}`);
  assert.ok(e.param === null || typeof e.param === 'string', `${what}: param`);
  assert.ok(e.code === null || typeof e.code === 'string', `${what}: code`);
}

/** The failure without fast-check's dump of the counterexample (its bodies run to megabytes). */
function failIf<T>(details: fc.RunDetails<T>): void {
  if (!details.failed) return;
  const error = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance);
  assert.fail(`after ${details.numRuns} runs (seed ${details.seed}, path ${details.counterexamplePath ?? ''}): ${error.slice(0, 2000)}`);
}

async function memory(url: string): Promise<{ rss: number; heap: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
  return { rss: read('switchyard_process_process_resident_memory_bytes'), heap: read('switchyard_process_nodejs_heap_size_used_bytes') };
}

describe(`fuzzing every endpoint with ${RUNS} malformed requests`, () => {
  const dataDir = tempDir();
  let proc: Running | undefined;
  after(() => {
    proc?.child.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('answers each with a 4xx in the envelope (or a 2xx), never a 5xx, a crash or a hang, and memory returns to its baseline', async () => {
    proc = await startProcess({ SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_ADMIN_KEY: ADMIN, SWITCHYARD_WORKERS: '1', SWITCHYARD_LOG_LEVEL: 'info' });
    const port = Number(new URL(proc.url).port);
    const warmup = Math.min(300, Math.floor(RUNS / 5));
    let baseline: { rss: number; heap: number } | undefined;
    let count = 0;
    const statuses = new Map<number, number>();
    const first = await fc.check(fc.asyncProperty(requestArb(ADMIN), async (r) => {
      const res = await sendRaw(port, encode(r));
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
      checkEnvelope(res, `${r.method} ${r.path.slice(0, 120)} (${r.label})`);
      if (++count === warmup) baseline = await memory(proc!.url);
    }), { numRuns: RUNS, seed: Number(process.env['SWITCHYARD_FUZZ_SEED'] ?? 20261121), endOnFailure: true });
    failIf(first);

    const second = await fc.check(fc.asyncProperty(rawHeadArb, async ({ head, label }) => {
      const res = await sendRaw(port, Buffer.from(head, 'latin1'), { end: true });
      // A head that never completes may be closed without a reply; anything answered is a 4xx envelope.
      if (res.status !== 0) checkEnvelope(res, label);
    }), { numRuns: Math.max(50, Math.floor(RUNS / 20)), seed: 7, endOnFailure: true });
    failIf(second);

    assert.equal(proc.child.exitCode, null, 'the server is still running');
    const alive = await fetch(`${proc.url}/v1/models`, { headers: { authorization: `Bearer ${ADMIN}` } });
    assert.equal(alive.status, 200);
    assert.ok(!statuses.has(0) && [...statuses.keys()].every((s) => s < 500), JSON.stringify([...statuses]));
    assert.ok([...statuses.keys()].filter((s) => s >= 400).length >= 5, `a spread of 4xx answers: ${JSON.stringify([...statuses])}`);

    // Memory: once idle (V8 collects an idle heap within seconds), the heap is back within 16 MB of
    // where it was after the warm-up; nothing the fuzz sent is kept.
    const limit = baseline!.heap + 16 * 1024 * 1024;
    let now = await memory(proc.url);
    const deadline = Date.now() + 30_000;
    while (now.heap > limit && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 1000));
      now = await memory(proc.url);
    }
    assert.ok(now.heap <= limit, `heap ${now.heap} vs baseline ${baseline!.heap}`);
    console.log(`# fuzz: ${RUNS} requests, statuses ${JSON.stringify([...statuses].sort((a, b) => a[0] - b[0]))}; heap ${Math.round(baseline!.heap / 1e6)} MB after warm-up, ${Math.round(now.heap / 1e6)} MB after; RSS ${Math.round(baseline!.rss / 1e6)} → ${Math.round(now.rss / 1e6)} MB`);
  });
});
