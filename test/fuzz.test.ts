import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import fc from 'fast-check';
import { tempDir } from './helpers/server.js';
import { processMemory, startProcess, type Running } from './helpers/process.js';
import { settle } from './helpers/wait.js';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  encode,
  rawHeadArb,
  requestArb,
  schemaArb,
  sendRaw,
  upstreamBehaviourArb,
  type RawResponse,
  type UpstreamBehaviour,
} from './helpers/fuzz-cases.js';
import { fixture } from './helpers/fixtures.js';

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

/**
 * Waits (up to 30 s, for work still in flight such as ledger writes) for the heap, read after a full
 * collection, to come back within 16 MB of the baseline, then checks heap and RSS against it and
 * returns the reading.
 */
async function settledMemory(
  server: Running,
  baseline: { rss: number; heap: number },
  rssAllowanceMb: number,
): Promise<{ rss: number; heap: number }> {
  const now = await settle(
    () => processMemory(server.url, server.inspector),
    (m) => m.heap <= baseline.heap + 16 * 1024 * 1024,
    30_000,
    1000,
  );
  assert.ok(now.heap <= baseline.heap + 16 * 1024 * 1024, `heap ${now.heap} vs ${baseline.heap}`);
  assert.ok(now.rss <= baseline.rss + rssAllowanceMb * 1024 * 1024, `RSS ${now.rss} vs ${baseline.rss}`);
  return now;
}

/** The failure without fast-check's dump of the counterexample (its bodies run to megabytes). */
function failIf<T>(details: fc.RunDetails<T>): void {
  if (!details.failed) return;
  const error = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance);
  assert.fail(`after ${details.numRuns} runs (seed ${details.seed}, path ${details.counterexamplePath ?? ''}): ${error.slice(0, 2000)}`);
}

describe(`fuzzing every endpoint with ${RUNS} malformed requests`, () => {
  const dataDir = tempDir();
  let proc: Running | undefined;
  let upstream: Awaited<ReturnType<typeof fixture>> | undefined;
  /** The server process under test, started by whichever test runs first. */
  const server = async (): Promise<Running> => {
    proc ??= await startProcess(
      {
        SWITCHYARD_DATA_DIR: dataDir,
        SWITCHYARD_ADMIN_KEY: ADMIN,
        SWITCHYARD_WORKERS: '1',
        SWITCHYARD_LOG_LEVEL: 'info',
      },
      { inspect: true },
    );
    return proc;
  };
  after(async () => {
    proc?.child.kill('SIGKILL');
    await upstream?.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('answers each with a 4xx in the envelope (or a 2xx), never a 5xx, a crash or a hang, and memory returns to its baseline', async () => {
    proc = await server();
    const port = Number(new URL(proc.url).port);
    const warmup = Math.min(300, Math.floor(RUNS / 5));
    let baseline: { rss: number; heap: number } | undefined;
    let count = 0;
    const statuses = new Map<number, number>();
    const first = await fc.check(
      fc.asyncProperty(requestArb(ADMIN), async (r) => {
        const res = await sendRaw(port, encode(r));
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        checkEnvelope(res, `${r.method} ${r.path.slice(0, 120)} (${r.label})`);
        if (++count === warmup) baseline = await processMemory(proc!.url, proc!.inspector);
      }),
      { numRuns: RUNS, seed: Number(process.env['SWITCHYARD_FUZZ_SEED'] ?? 20261121), endOnFailure: true },
    );
    failIf(first);

    const second = await fc.check(
      fc.asyncProperty(rawHeadArb, async ({ head, label }) => {
        const res = await sendRaw(port, Buffer.from(head, 'latin1'), { end: true });
        // A head that never completes may be closed without a reply; anything answered is a 4xx envelope.
        if (res.status !== 0) checkEnvelope(res, label);
      }),
      { numRuns: Math.max(50, Math.floor(RUNS / 20)), seed: 7, endOnFailure: true },
    );
    failIf(second);

    assert.equal(proc.child.exitCode, null, 'the server is still running');
    const alive = await fetch(`${proc.url}/v1/models`, { headers: { authorization: `Bearer ${ADMIN}` } });
    assert.equal(alive.status, 200);
    assert.ok(!statuses.has(0) && [...statuses.keys()].every((s) => s < 500), JSON.stringify([...statuses]));
    assert.ok([...statuses.keys()].filter((s) => s >= 400).length >= 5, `a spread of 4xx answers: ${JSON.stringify([...statuses])}`);

    // Memory: both readings follow a full collection (through the inspector), so they compare what
    // is live. Once idle, the heap is back within 16 MB of where it was after the warm-up; nothing
    // the fuzz sent is kept.
    const limit = baseline!.heap + 16 * 1024 * 1024;
    const now = await settle(
      () => processMemory(proc!.url, proc!.inspector),
      (m) => m.heap <= limit,
      30_000,
      1000,
    );
    assert.ok(now.heap <= limit, `heap ${now.heap} vs baseline ${baseline!.heap}`);
    console.log(
      `# fuzz: ${RUNS} requests, statuses ${JSON.stringify([...statuses].sort((a, b) => a[0] - b[0]))}; heap ${Math.round(baseline!.heap / 1e6)} MB after warm-up, ${Math.round(now.heap / 1e6)} MB after; RSS ${Math.round(baseline!.rss / 1e6)} → ${Math.round(now.rss / 1e6)} MB`,
    );
  });

  it('answers generated JSON schemas (structured output and tool parameters) with a 2xx or a 4xx envelope, never a 5xx', async () => {
    const p = await server();
    const port = Number(new URL(p.url).port);
    const statuses = new Map<number, number>();
    const runs = Math.max(100, Math.floor(RUNS / 5));
    // Memory is compared from half-way: the first half fills the caches and the allocator's working
    // set (RSS climbs ~150 MB over the first 1,500 schemas here, then stays); a leak keeps climbing.
    let baseline = await processMemory(p.url, p.inspector);
    let count = 0;
    const details = await fc.check(
      fc.asyncProperty(schemaArb, fc.constantFrom('chat', 'responses', 'tool'), async (schema, where) => {
        if (++count === Math.floor(runs / 2)) baseline = await processMemory(p.url, p.inspector);
        const body =
          where === 'chat'
            ? {
                model: 'local/stories260k',
                max_tokens: 8,
                messages: [{ role: 'user', content: 'x' }],
                response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
              }
            : where === 'responses'
              ? {
                  model: 'local/stories260k',
                  max_output_tokens: 8,
                  input: 'x',
                  store: false,
                  text: { format: { type: 'json_schema', name: 'x', schema } },
                }
              : {
                  model: 'local/stories260k',
                  max_tokens: 8,
                  messages: [{ role: 'user', content: 'x' }],
                  tool_choice: 'required',
                  tools: [{ type: 'function', function: { name: 'f', parameters: schema } }],
                };
        const path = where === 'responses' ? '/v1/responses' : '/v1/chat/completions';
        const res = await sendRaw(
          port,
          encode({
            method: 'POST',
            path,
            headers: [
              ['authorization', `Bearer ${ADMIN}`],
              ['content-type', 'application/json'],
            ],
            body: Buffer.from(JSON.stringify(body)),
            label: where,
          }),
        );
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        checkEnvelope(res, `${where} schema ${JSON.stringify(schema).slice(0, 300)}`);
      }),
      { numRuns: runs, seed: 11, endOnFailure: true },
    );
    failIf(details);
    const loaded = await fetch(`${p.url}/admin/local/loaded`, { headers: { authorization: `Bearer ${ADMIN}` } });
    assert.equal(((await loaded.json()) as { schema_violations: number }).schema_violations, 0, 'every accepted schema was kept');
    // Native memory too (grammars, the schema worker's heap): a cache that kept one Ajv per schema grew RSS by 150 MB here.
    const now = await settledMemory(p, baseline, 64);
    console.log(
      `# schema fuzz: ${runs} schemas, statuses ${JSON.stringify([...statuses].sort((a, b) => a[0] - b[0]))}; heap ${Math.round(baseline.heap / 1e6)} → ${Math.round(now.heap / 1e6)} MB, RSS ${Math.round(baseline.rss / 1e6)} → ${Math.round(now.rss / 1e6)} MB`,
    );
  });

  it('survives generated upstream replies: never a 500, an error from the upstream is a 502/504 in the envelope', async () => {
    let behaviour: UpstreamBehaviour = { status: 200, body: '{}', sse: undefined, label: '' };
    upstream = await fixture((req, res) => {
      req.resume();
      const b = behaviour;
      if (b.sse) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        let i = 0;
        const next = () => {
          if (i >= b.sse!.length || res.destroyed) return void res.end();
          res.write(b.sse![i++]);
          setImmediate(next);
        };
        next();
      } else {
        res.writeHead(b.status, { 'content-type': 'application/json' }).end(b.body);
      }
    });
    const dir = tempDir();
    const config = join(dir, 'up.json');
    writeFileSync(
      config,
      JSON.stringify({
        models: [{ id: 'meta-llama/fuzzed-upstream', context_length: 4096 }],
        deployments: [{ model: 'meta-llama/fuzzed-upstream', baseUrl: upstream.url }],
      }),
    );
    const gw = await startProcess(
      {
        SWITCHYARD_DATA_DIR: dir,
        SWITCHYARD_ADMIN_KEY: ADMIN,
        SWITCHYARD_WORKERS: '1',
        SWITCHYARD_CONFIG: config,
        SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1',
      },
      { inspect: true },
    );
    try {
      const port = Number(new URL(gw.url).port);
      const baseline = await processMemory(gw.url, gw.inspector);
      const statuses = new Map<number, number>();
      const runs = Math.max(100, Math.floor(RUNS / 5));
      const details = await fc.check(
        fc.asyncProperty(upstreamBehaviourArb, fc.boolean(), fc.constantFrom('chat', 'responses'), async (b, stream, api) => {
          behaviour = b.sse ? b : { ...b, sse: undefined };
          const body =
            api === 'chat'
              ? {
                  model: 'meta-llama/fuzzed-upstream',
                  messages: [{ role: 'user', content: 'x' }],
                  stream: stream || b.sse !== undefined,
                  max_tokens: 50,
                }
              : { model: 'meta-llama/fuzzed-upstream', input: 'x', stream, max_output_tokens: 50 };
          const res = await sendRaw(
            port,
            encode({
              method: 'POST',
              path: api === 'chat' ? '/v1/chat/completions' : '/v1/responses',
              headers: [
                ['authorization', `Bearer ${ADMIN}`],
                ['content-type', 'application/json'],
              ],
              body: Buffer.from(JSON.stringify(body)),
              label: b.label,
            }),
          );
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
          const what = `${api} ${b.label}: ${JSON.stringify(b).slice(0, 300)}`;
          assert.ok(res.status > 0 && res.status !== 500, `${what} → ${res.status} ${res.body.slice(0, 200)}`);
          assert.ok(res.status < 500 || [502, 503, 504].includes(res.status), `${what} → ${res.status}`);
          if (res.status >= 400) checkEnvelope({ ...res, status: Math.min(res.status, 499) }, what);
          assert.ok(!res.body.includes('"code":"internal_error"'), `${what}: an internal error in the stream`);
        }),
        { numRuns: runs, seed: 13, endOnFailure: true },
      );
      failIf(details);
      assert.equal(gw.child.exitCode, null, 'the gateway is still running');
      const now = await settledMemory(gw, baseline, 48);
      console.log(
        `# upstream fuzz: ${runs} replies, statuses ${JSON.stringify([...statuses].sort((a, b) => a[0] - b[0]))}; heap ${Math.round(baseline.heap / 1e6)} → ${Math.round(now.heap / 1e6)} MB, RSS ${Math.round(baseline.rss / 1e6)} → ${Math.round(now.rss / 1e6)} MB`,
      );
    } finally {
      gw.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
