import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { once } from 'node:events';
import { createServer } from 'node:http';
import { Pool, errors } from 'undici';
import pino from 'pino';
import { loadConfig, routingPolicy } from '../src/config.js';
import { Catalogue } from '../src/core/catalogue.js';
import { newTally, type GenerationEvent, type GenerationRequest } from '../src/core/canonical.js';
import { RetryBudget } from '../src/core/deployment-health.js';
import { fileDeployment } from '../src/core/deployments.js';
import { ApiError } from '../src/core/errors.js';
import { OutputLimit } from '../src/core/estimate.js';
import { Cancellation, onAbort } from '../src/core/cancellation.js';
import { orderedId } from '../src/core/ids.js';
import { Ledger } from '../src/core/ledger.js';
import { Limiter, MemoryCounters, type Admission, type Limited } from '../src/core/limits.js';
import { Metrics } from '../src/core/metrics.js';
import type { Model } from '../src/core/model-spec.js';
import { Router, type RoutingPolicy } from '../src/core/router.js';
import type { DeploymentTarget, Engine } from '../src/engines/engine.js';
import { KyselyStore } from '../src/store/kysely-store.js';
import type { Store, UsageRecord } from '../src/store/store.js';
import { SHARED_MODELS, tempDir } from './helpers/server.js';
import { usageRecord } from './helpers/usage.js';

/**
 * Units of core that the end-to-end suites reach only through a server: the router (weights,
 * failover, breaker, retry budget), the limiter and the ledger, on a real SQLite store.
 */

const log = pino({ level: 'silent' });
const MODEL = 'meta-llama/unit';

/** An engine whose deployments behave as scripted: 'ok' answers, an ApiError is thrown before any event. */
class ScriptedEngine implements Engine {
  readonly kind = 'upstream';
  readonly calls: string[] = [];
  constructor(public behaviour: (id: string) => 'ok' | ApiError) {}
  async *generate(_req: GenerationRequest, target: DeploymentTarget): AsyncGenerator<GenerationEvent> {
    const id = target.engine === 'upstream' ? target.id : 'local';
    this.calls.push(id);
    const b = this.behaviour(id);
    if (b !== 'ok') throw b;
    yield { type: 'text.delta', text: id };
    yield { type: 'usage', usage: { input: 1, cached: 0, output: 1, reasoning: 0 } };
    yield { type: 'finish', reason: 'stop' };
  }
  async probe(): Promise<boolean> {
    return true;
  }
  async close(): Promise<void> {}
}

const down = () => new ApiError('upstream_error', 'Upstream answered 503', { failover: true });
const refused = () => new ApiError('upstream_error', 'Upstream answered 400', { failover: false });

function request(): GenerationRequest {
  return {
    model: MODEL,
    messages: [{ role: 'user', content: 'x' }],
    sampling: {},
    stream: false,
    signal: new AbortController().signal,
    tally: newTally(),
  };
}

describe('router', () => {
  const dir = tempDir();
  let store: KyselyStore;
  let catalogue: Catalogue;
  let model: Model;
  before(async () => {
    mkdirSync(join(dir, 'models'));
    writeFileSync(join(dir, 'c.json'), JSON.stringify({ defaultCatalogue: false, models: [{ id: MODEL, context_length: 1000 }] }));
    const config = loadConfig({
      env: { SWITCHYARD_CONFIG: join(dir, 'c.json'), SWITCHYARD_MODELS_DIR: join(dir, 'models'), SWITCHYARD_CATALOGUE_REFRESH_MS: '0' },
    });
    store = new KyselyStore({ sqlitePath: join(dir, 'unit.db') });
    await store.migrate();
    catalogue = new Catalogue(store, config, log);
    await catalogue.init();
    model = catalogue.find(MODEL)!;
  });
  after(async () => {
    catalogue.stop();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const basePolicy = routingPolicy(loadConfig({ env: {} }));
  function router(engine: ScriptedEngine, weights: number[], policy: Partial<RoutingPolicy> = {}, errors: string[] = []): Router {
    const deployments = weights.map((weight, i) =>
      fileDeployment({ id: `d${i}`, model: MODEL, baseUrl: `http://127.0.0.1:1/d${i}/v1`, weight }, i),
    );
    return new Router(
      catalogue,
      engine,
      engine,
      deployments,
      {},
      log,
      { ...basePolicy, ...policy },
      { onDeploymentError: (id, code) => errors.push(`${id}:${code}`) },
    );
  }

  it('logs a deployment whose key variable is unset once, not on every catalogue refresh', () => {
    const lines: Array<{ msg?: string; deployment?: string }> = [];
    const capture = pino({ level: 'warn' }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg?: string }) });
    const engine = new ScriptedEngine(() => 'ok');
    const keyed = (id: string) =>
      fileDeployment({ id, model: MODEL, baseUrl: `http://127.0.0.1:1/${id}/v1`, apiKeyEnv: 'UPSTREAM_KEY_UNSET' }, 0);
    const r = new Router(catalogue, engine, engine, [keyed('k0')], {}, capture, basePolicy);
    // The refresh that runs every few seconds: the same table again, then one more deployment.
    r.setDeployments([]);
    r.setDeployments([]);
    r.setDeployments([{ ...keyed('k1'), source: 'database' }]);
    // A stored row naming a variable deployments may not use: refused, and said once too.
    const refused = { ...keyed('k2'), apiKeyEnv: 'SWITCHYARD_ADMIN_KEY', source: 'database' as const };
    r.setDeployments([refused]);
    r.setDeployments([refused]);
    r.close();
    const unset = lines.filter((l) => l.msg === 'deployment API key variable is not set').map((l) => l.deployment);
    assert.deepEqual(unset, ['k0', 'k1']);
    const refusals = lines.filter((l) => l.msg?.startsWith('deployment key variable refused')).map((l) => l.deployment);
    assert.deepEqual(refusals, ['k2']);
  });

  it('spreads first attempts by weight', async () => {
    const engine = new ScriptedEngine(() => 'ok');
    const r = router(engine, [3, 1]);
    const served = new Map<string, number>();
    for (let i = 0; i < 4000; i++) {
      const trace: { deployment?: string } = {};
      await r.open(request(), model, trace);
      served.set(trace.deployment!, (served.get(trace.deployment!) ?? 0) + 1);
    }
    r.close();
    // 3:1 is 0.75; 4,000 draws put the share within ±0.03 far beyond any chance of a false alarm (±4.4 sd).
    const share = (served.get('d0') ?? 0) / 4000;
    assert.ok(Math.abs(share - 0.75) < 0.03, `d0 served ${share}`);
  });

  it('fails over past a deployment that fails before its first event, and counts each failed attempt once', async () => {
    const errors: string[] = [];
    const engine = new ScriptedEngine((id) => (id === 'd0' ? down() : 'ok'));
    const r = router(engine, [1e9, 1], {}, errors);
    const trace: { deployment?: string } = {};
    const { first } = await r.open(request(), model, trace);
    r.close();
    assert.deepEqual(first, { type: 'text.delta', text: 'd1' });
    assert.equal(trace.deployment, 'd1');
    assert.deepEqual(engine.calls, ['d0', 'd1']);
    assert.deepEqual(errors, ['d0:upstream_error']);
  });

  it('does not fail over an error the upstream gave for the request itself', async () => {
    const errors: string[] = [];
    const engine = new ScriptedEngine(() => refused());
    const r = router(engine, [1, 1], {}, errors);
    await assert.rejects(r.open(request(), model), (e: unknown) => e instanceof ApiError && e.failover === false);
    r.close();
    assert.equal(engine.calls.length, 1);
    assert.equal(errors.length, 1);
  });

  it('tries a lone deployment twice, and never more than maxAttempts in all', async () => {
    const lone = new ScriptedEngine(() => down());
    const r1 = router(lone, [1]);
    await assert.rejects(r1.open(request(), model), (e: unknown) => e instanceof ApiError && e.code === 'upstream_error');
    r1.close();
    assert.deepEqual(lone.calls, ['d0', 'd0']);

    const many = new ScriptedEngine(() => down());
    const r2 = router(many, [1, 1, 1, 1, 1], { maxAttempts: 3 });
    await assert.rejects(r2.open(request(), model));
    r2.close();
    assert.equal(many.calls.length, 3);
  });

  it('ejects a deployment after consecutive failures and sends requests to the healthy one first', async () => {
    const engine = new ScriptedEngine((id) => (id === 'd0' ? down() : 'ok'));
    const r = router(engine, [1e9, 1], { health: { failures: 3, ejectMs: 60_000, probeIntervalMs: 60_000 } });
    for (let i = 0; i < 3; i++) await r.open(request(), model);
    assert.equal(r.listDeployments().find((d) => d.deployment.id === 'd0')?.health, 'ejected');
    engine.calls.length = 0;
    await r.open(request(), model);
    r.close();
    assert.deepEqual(engine.calls, ['d1'], 'an ejected deployment is tried only as a last resort');
  });

  it('keeps off a deployment for its 429 retry-after, answering 429 without calling it', async () => {
    const engine = new ScriptedEngine(() => new ApiError('rate_limited', 'slow down', { failover: true, retryAfterMs: 20_000 }));
    const r = router(engine, [1]);
    await assert.rejects(r.open(request(), model), (e: unknown) => e instanceof ApiError && e.code === 'rate_limited');
    const calls = engine.calls.length;
    await assert.rejects(
      r.open(request(), model),
      (e: unknown) => e instanceof ApiError && e.code === 'rate_limited' && (e.retryAfterMs ?? 0) > 19_000,
    );
    r.close();
    assert.equal(engine.calls.length, calls);
  });
});

describe('output limit (both chat lanes count with it)', () => {
  it('passes deltas up to the limit in tokens, one token at least per delta', () => {
    const limit = new OutputLimit(3);
    assert.deepEqual(
      ['a', 'b', 'c', 'd'].map((t) => limit.clip(t, false)),
      ['a', 'b', 'c', ''],
    );
    assert.equal(limit.capped, true);
    assert.equal(limit.outputTokens, 3);
  });

  it('cuts the delta that crosses the character limit there, never inside a surrogate pair', () => {
    // Two tokens at two characters a token: four characters pass.
    const limit = new OutputLimit(2, 2);
    assert.equal(limit.clip('abc😀d', false), 'abc', 'the pair at 3–4 would be split at 4: it is left out whole');
    assert.equal(limit.capped, true);
    assert.equal(limit.clip('e', false), '');
    const exact = new OutputLimit(2, 2);
    assert.equal(exact.clip('a😀', true), 'a😀');
  });

  it('counts nothing for a delta that passes nothing, and counts reasoning apart', () => {
    const limit = new OutputLimit(4, 2);
    assert.equal(limit.admit('', false), 0);
    assert.equal(limit.admit('abcdefgh', true), 8, 'exactly the character limit');
    assert.equal(limit.capped, false);
    assert.equal(limit.admit('x', false), 0);
    assert.equal(limit.capped, true);
    assert.deepEqual([limit.deltas, limit.chars, limit.reasoningChars], [1, 8, 8]);
    assert.deepEqual([limit.outputTokens, limit.reasoningTokens], [2, 2]);
  });
});

describe('retry budget', () => {
  it('allows a floor of retries per second plus a ratio of requests, over a sliding window of two', () => {
    const b = new RetryBudget(0.2, 1, 10_000);
    const t = 1_000_000_000_000;
    for (let i = 0; i < 100; i++) b.request(t);
    // 10 (1 per second over 10 s) + 20 (0.2 × 100).
    let granted = 0;
    while (b.tryRetry(t)) granted++;
    assert.equal(granted, 30);
    // The next window still counts the last one's requests and retries.
    assert.equal(b.tryRetry(t + 10_000), false);
    // Two windows on, everything has rolled off: the floor again.
    let later = 0;
    while (b.tryRetry(t + 20_000)) later++;
    assert.equal(later, 10);
  });
});

describe('limiter', () => {
  const dir = tempDir();
  let store: KyselyStore;
  before(async () => {
    store = new KyselyStore({ sqlitePath: join(dir, 'limits.db') });
    await store.migrate();
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const metrics = new Metrics(() => ({ models: [], schemaViolations: 0, schemaOutcomes: { resampled: 0, failed: 0, returnedInvalid: 0 } }));
  const who = (keyLimits: Limited['keyLimits'], orgLimits: Limited['orgLimits'] = null, keyId = 'key_1'): Limited => ({
    keyId,
    orgId: 'org_1',
    keyLimits,
    orgLimits,
  });

  it('admits rpm requests a minute, then refuses with retry-after and headers', async () => {
    const limiter = new Limiter(new MemoryCounters(), store, metrics);
    const k = who({ rpm: 2 }, null, 'key_rpm');
    const a = await limiter.admit(k, 'm');
    assert.equal(a.headers['x-ratelimit-remaining-requests'], '1');
    await limiter.admit(k, 'm');
    await assert.rejects(
      async () => limiter.admit(k, 'm'),
      (e: unknown) =>
        e instanceof ApiError &&
        e.code === 'rate_limit_exceeded' &&
        e.status === 429 &&
        (e.retryAfterMs ?? 0) >= 1000 &&
        e.headers?.['x-ratelimit-remaining-requests'] === '0',
    );
  });

  it('starts every minute window afresh, for requests and tokens, and counts a late settle in its own window', async (t) => {
    t.mock.timers.enable({ apis: ['Date'], now: 1_700_000_040_000 });
    const counters = new MemoryCounters();
    const limiter = new Limiter(counters, store, metrics);
    const k = who({ rpm: 2, tpm: 100 }, null, 'key_windows');
    const admit = () => limiter.admit(k, 'm') as Admission;
    const first = admit();
    assert.equal(first.headers['x-ratelimit-remaining-requests'], '1');
    admit().settle(90, null);
    assert.throws(admit, (e: unknown) => e instanceof ApiError && e.code === 'rate_limit_exceeded');
    // The next window: two requests again, and none of the last window's tokens.
    t.mock.timers.tick(60_000);
    const next = admit();
    assert.equal(next.headers['x-ratelimit-remaining-requests'], '1');
    assert.equal(next.headers['x-ratelimit-remaining-tokens'], '100');
    // A request admitted in the window before settles now: its tokens count there, not here.
    first.settle(50, null);
    assert.equal(admit().headers['x-ratelimit-remaining-tokens'], '100');
    const minute = Math.floor(Date.now() / 60_000);
    assert.equal(await counters.get(`tpm:key:key_windows:${minute - 1}`), 140);
    assert.equal(await counters.get(`rpm:key:key_windows:${minute}`), 2);
    // A count of input tokens has a requests-per-minute counter of its own.
    (limiter.admit(k, 'm', undefined, 'count') as Admission).settle(0, null);
    assert.equal(await counters.get(`rpm-count:key:key_windows:${minute}`), 1);
    assert.equal(await counters.get(`rpm:key:key_windows:${minute}`), 2);
    // And the window after that, while this one's names were built and kept.
    t.mock.timers.tick(60_000);
    assert.equal(admit().headers['x-ratelimit-remaining-requests'], '1');
  });

  it("counts tokens when a request settles, and refuses once the minute's tokens are used", async () => {
    const limiter = new Limiter(new MemoryCounters(), store, metrics);
    const k = who({ tpm: 100 }, null, 'key_tpm');
    (await limiter.admit(k, 'm')).settle(60, null);
    (await limiter.admit(k, 'm')).settle(60, null);
    await assert.rejects(
      async () => limiter.admit(k, 'm'),
      (e: unknown) => e instanceof ApiError && e.code === 'rate_limit_exceeded',
    );
  });

  it('holds the tighter of key and organization, and keeps a key to its models', async () => {
    const limiter = new Limiter(new MemoryCounters(), store, metrics);
    const a = await limiter.admit(who({ rpm: 10 }, { rpm: 3 }, 'key_both'), 'm');
    assert.equal(a.headers['x-ratelimit-limit-requests'], '3');
    await assert.rejects(
      async () => limiter.admit(who({ models: ['x/a'] }, null, 'key_models'), 'x/b'),
      (e: unknown) => e instanceof ApiError && e.code === 'model_not_allowed',
    );
  });

  it('reserves a budget at the worst case so concurrent requests cannot overshoot it, then settles to the real cost', async () => {
    const limiter = new Limiter(new MemoryCounters(), store, metrics);
    const k = who({ budget: 1, budget_period: 'day' }, null, 'key_budget');
    const worst = () => ({ tokens: 100, cost: 0.6 });
    const first = await limiter.admit(k, 'm', worst);
    // The first's worst case is held: a second worst case of 0.6 is admitted (0.6 < 1 before it) but a third is not.
    const second = await limiter.admit(k, 'm', worst);
    await assert.rejects(
      async () => limiter.admit(k, 'm', worst),
      (e: unknown) => e instanceof ApiError && e.code === 'budget_exceeded',
    );
    // Both cost almost nothing in the end: the reservations are given back and room returns.
    first.settle(10, 0.01);
    second.settle(10, 0.01);
    await limiter.admit(k, 'm', worst);
  });

  it('refuses for now a budget held by requests in flight in another process sharing the counters, and for the period once spent', async (t) => {
    t.mock.timers.enable({ apis: ['Date', 'setInterval'], now: Date.UTC(2026, 10, 28, 12) });
    // Two processes (a cluster's workers, or instances on one Redis): one set of counters, two limiters.
    const counters = new MemoryCounters();
    const here = new Limiter(counters, store, metrics);
    const there = new Limiter(counters, store, metrics);
    const k = who({ budget: 1, budget_period: 'day' }, null, 'key_budget_shared');
    const worst = () => ({ tokens: 100, cost: 1 });
    const holding = await there.admit(k, 'm', worst);
    const temporary = (e: unknown) => e instanceof ApiError && e.code === 'budget_exceeded' && e.retryAfterMs === 1000 && e.final !== true;
    await assert.rejects(async () => here.admit(k, 'm', worst), temporary);
    await assert.rejects(async () => there.admit(k, 'm', worst), temporary);
    // Ended, it spent the whole budget: refused for the rest of the day in both.
    holding.settle(10, 1);
    const spent = (e: unknown) =>
      e instanceof ApiError && e.code === 'budget_exceeded' && e.final === true && (e.retryAfterMs ?? 0) > 60_000;
    await assert.rejects(async () => here.admit(k, 'm', worst), spent);
    await assert.rejects(async () => there.admit(k, 'm', worst), spent);

    // A request that runs for longer than the windows still holds: its process moves its hold along.
    const k3 = who({ budget: 1, budget_period: 'day' }, null, 'key_budget_long');
    const long = await there.admit(k3, 'm', worst);
    for (let minute = 0; minute < 45; minute++) t.mock.timers.tick(60_000);
    await assert.rejects(async () => here.admit(k3, 'm', worst), temporary);
    long.settle(10, 0.1);
    (await here.admit(k3, 'm', worst)).settle(0, 0);

    // A hold never taken back nor moved (its process died) is forgotten within two windows of ten minutes.
    const orphans = new MemoryCounters();
    const dead = new Limiter(orphans, store, metrics);
    const alive = new Limiter(orphans, store, metrics);
    const k2 = who({ budget: 1, budget_period: 'day' }, null, 'key_budget_orphan');
    await dead.admit(k2, 'm', worst);
    (dead as unknown as { holding: Set<unknown> }).holding.clear();
    await assert.rejects(async () => alive.admit(k2, 'm', worst), temporary);
    for (let minute = 0; minute < 21; minute++) t.mock.timers.tick(60_000);
    await assert.rejects(async () => alive.admit(k2, 'm', worst), spent);
  });
});

describe('ledger', () => {
  const dir = tempDir();
  let store: KyselyStore;
  before(async () => {
    store = new KyselyStore({ sqlitePath: join(dir, 'ledger.db') });
    await store.migrate();
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  let n = 0;
  const record = (over: Partial<UsageRecord> = {}): UsageRecord =>
    usageRecord(`u${++n}`, { key_id: 'key_l', org_id: 'org_l', deployment: null, ...over });

  /** The store, with its usage inserts counted (and optionally failing as an unreachable database would). */
  function counted(failures: { left: number }) {
    const inserts: number[] = [];
    const proxy = new Proxy(store, {
      get(target, prop, receiver) {
        if (prop === 'insertUsage') {
          return async (rs: readonly UsageRecord[]) => {
            if (failures.left > 0) {
              failures.left--;
              throw new Error('connect ECONNREFUSED 127.0.0.1:5432');
            }
            inserts.push(rs.length);
            return target.insertUsage(rs);
          };
        }
        const v: unknown = Reflect.get(target, prop, receiver);
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    }) as Store;
    return { proxy, inserts };
  }

  const total = async (key: string) => (await store.usageTotals('key', { key })).reduce((s, t) => s + t.requests, 0);

  it('writes everything recorded in one turn in one transaction, and resolves each record once it is stored', async () => {
    const { proxy, inserts } = counted({ left: 0 });
    const ledger = new Ledger(proxy, log);
    await Promise.all(Array.from({ length: 50 }, () => ledger.record(record({ key_id: 'key_batch' }))));
    assert.deepEqual(inserts, [50]);
    assert.equal(await total('key_batch'), 50);
  });

  it('quarantines a malformed record and writes the others', async () => {
    const ledger = new Ledger(store, log);
    await Promise.all([
      ledger.record(record({ key_id: 'key_q' })),
      ledger.record(record({ key_id: 'key_q', output_tokens: -3 })),
      ledger.record(record({ key_id: 'key_q' })),
    ]);
    assert.equal(await total('key_q'), 2);
    const q = await store.listQuarantinedUsage();
    assert.ok(q.some((x) => x.error.includes('output_tokens')));
  });

  it('quarantines a record with any one field of the wrong kind, naming that field', async () => {
    const bad: [keyof UsageRecord, unknown][] = [
      ...(['at', 'input_tokens', 'cached_tokens', 'output_tokens', 'reasoning_tokens', 'latency_ms', 'status'] as const).flatMap(
        (f): [keyof UsageRecord, unknown][] => [
          [f, -1],
          [f, 1.5],
          [f, '3'],
          [f, null],
        ],
      ),
      ['cost', -0.5],
      ['cost', Number.NaN],
      ['cost', '0.1'],
      ['ttft_ms', 2.5],
      ['ttft_ms', undefined],
      ...(['id', 'day', 'request_id', 'key_id', 'org_id', 'model', 'endpoint'] as const).map((f): [keyof UsageRecord, unknown] => [f, 7]),
      ['deployment', 7],
      ['error_code', {}],
    ];
    const ledger = new Ledger(store, log);
    const before = (await store.listQuarantinedUsage()).length;
    await Promise.all(bad.map(([f, v]) => ledger.record({ ...record({ key_id: 'key_kinds' }), [f]: v } as UsageRecord)));
    await ledger.record(record({ key_id: 'key_kinds', cost: null, ttft_ms: -4, deployment: 'd', error_code: null }));
    assert.equal(await total('key_kinds'), 1, 'only the well-formed record is written');
    const q = (await store.listQuarantinedUsage()).slice(before);
    assert.equal(q.length, bad.length);
    for (const [f] of bad)
      assert.ok(
        q.some((x) => x.error.startsWith(`${f} is`)),
        `a record with a bad ${f} is quarantined naming it`,
      );
  });

  it('keeps records queued while the database cannot be written, reports it, and writes them when it can', async () => {
    const failures = { left: 2 };
    const { proxy } = counted(failures);
    const states: boolean[] = [];
    const ledger = new Ledger(proxy, log, 1000, { onWritable: (ok) => states.push(ok) });
    let stored = false;
    const pending = ledger.record(record({ key_id: 'key_down' })).then(() => {
      stored = true;
    });
    await ledger.flush();
    await ledger.flush();
    assert.equal(ledger.writable, false);
    assert.equal(stored, false, 'not acknowledged while not stored');
    await ledger.flush();
    await pending;
    assert.equal(ledger.writable, true);
    assert.deepEqual(states, [false, true]);
    assert.equal(await total('key_down'), 1);
  });
});

describe('cancellation', () => {
  it('aborts an undici request the way an AbortSignal does, and runs each listener once', async () => {
    // An upstream that never answers: only the abort can end the request.
    let closed!: () => void;
    const serverSawClose = new Promise<void>((r) => (closed = r));
    const server = createServer((req) => req.socket.once('close', () => closed()));
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as { port: number };
    const pool = new Pool(`http://127.0.0.1:${port}`);
    try {
      const gone = new Cancellation();
      let calls = 0;
      const forget = onAbort(gone, () => calls++);
      const forgotten = onAbort(gone, () => assert.fail('a removed listener ran'));
      forgotten();
      const pending = pool.request({ path: '/', method: 'POST', body: '{}', signal: gone });
      setTimeout(() => gone.abort(), 50);
      await assert.rejects(pending, errors.RequestAbortedError);
      await serverSawClose;
      gone.abort();
      assert.equal(calls, 1);
      assert.equal(gone.aborted, true);
      forget();
      assert.equal(gone.listenerCount('abort'), 0, 'undici removed its listener too');
    } finally {
      await pool.destroy();
      server.closeAllConnections();
      server.close();
    }
  });
});

describe('catalogue: a models entry with the id of a local model file', () => {
  it('is not used, and the start says so (the file is what is served: its fields go under localModels)', async () => {
    const dir = tempDir();
    const lines: string[] = [];
    const capture = pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) });
    writeFileSync(
      join(dir, 'c.json'),
      JSON.stringify({
        defaultCatalogue: false,
        localModels: { 'stories260K.gguf': { id: 'meta-llama/tiny-stories' } },
        models: [{ id: 'meta-llama/tiny-stories', context_length: 256, pricing: [{ metric: 'input_tokens', rate: 5 }] }],
      }),
    );
    const config = loadConfig({
      env: { SWITCHYARD_CONFIG: join(dir, 'c.json'), SWITCHYARD_MODELS_DIR: SHARED_MODELS, SWITCHYARD_CATALOGUE_REFRESH_MS: '0' },
    });
    const store = new KyselyStore({ sqlitePath: join(dir, 'shadow.db') });
    await store.migrate();
    const catalogue = new Catalogue(store, config, capture);
    try {
      await catalogue.init();
      assert.equal(catalogue.isLocal('meta-llama/tiny-stories'), true);
      assert.deepEqual(
        catalogue.find('meta-llama/tiny-stories')?.pricing.map((p) => p.rate),
        [0, 0],
        "the file's entry is served",
      );
      const warned = lines.map((l) => JSON.parse(l) as { msg: string; id?: string }).find((l) => l.id === 'meta-llama/tiny-stories');
      assert.match(warned?.msg ?? '', /not used.*localModels/);
    } finally {
      catalogue.stop();
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('ordered ids', () => {
  it('start with the time of their making in milliseconds (12 hex digits) and sort in the order they were made', () => {
    const before = Date.now();
    const ids = Array.from({ length: 2000 }, () => orderedId('usage'));
    const after = Date.now();
    for (const id of ids) {
      assert.match(id, /^usage_[0-9a-f]{30}$/);
      const ms = parseInt(id.slice(6, 18), 16);
      assert.ok(ms >= before && ms <= after, `${ms} outside ${before}..${after}`);
    }
    assert.deepEqual([...ids].sort(), ids);
    assert.equal(new Set(ids).size, ids.length);
  });
});
