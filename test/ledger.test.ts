import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import pino from 'pino';
import SqliteDatabase from 'better-sqlite3';
import OpenAI from 'openai';
import pg from 'pg';
import { KyselyStore } from '../src/store/kysely-store.js';
import { Ledger } from '../src/core/ledger.js';
import { MeteredStream, type EventSource } from '../src/core/metering.js';
import { Metrics } from '../src/core/metrics.js';
import { resolveModelSpec } from '../src/core/model-spec.js';
import { newTally, type GenerationRequest } from '../src/core/canonical.js';
import type { UsageRecord } from '../src/store/store.js';
import { http, pgSchema, tempDir, type TestServer, type WireList } from './helpers/server.js';
import { usageRecord } from './helpers/usage.js';
import { GATEWAY_MODEL as MODEL, chatFixture, chunkFrame, closers, completionJson, startGateway } from './helpers/fixtures.js';

const log = pino({ level: 'silent' });

interface Total {
  requests: number;
  errors: number;
  input_tokens: number;
  output_tokens: number;
  estimated_requests: number;
  unpriced_requests: number;
  cost: number;
}

const record = (id: string, over: Partial<Record<keyof UsageRecord, unknown>> = {}): UsageRecord =>
  usageRecord(id, { model: MODEL, ...over });

/** Usage values an upstream may send that are not counts of tokens. */
const BAD_USAGE: Array<[string, Record<string, unknown>]> = [
  ['cached_tokens: false', { prompt_tokens: 12, completion_tokens: 3, prompt_tokens_details: { cached_tokens: false } }],
  ['counts as strings', { prompt_tokens: '12', completion_tokens: '3' }],
  ['negative counts', { prompt_tokens: -12, completion_tokens: -3 }],
  ['objects', { prompt_tokens: { n: 12 }, completion_tokens: [3] }],
  ['fractions', { prompt_tokens: 12.5, completion_tokens: 2.25, completion_tokens_details: { reasoning_tokens: 'x' } }],
];

/** An upstream answering every request with `usage`, streamed or not. */
function upstreamWithUsage(usage: () => Record<string, unknown>) {
  return chatFixture((stream, res) => {
    if (!stream) {
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(completionJson({ role: 'assistant', content: 'Once upon' }, 'stop', usage()));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
    res.write(chunkFrame({ content: ' upon' }, 'stop'));
    res.end(
      `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: usage() })}\n\ndata: [DONE]\n\n`,
    );
  });
}

async function totals(s: TestServer): Promise<Total> {
  const r = await http<WireList<Total>>(s.url, 'GET', '/admin/usage?group_by=model', { key: s.adminKey });
  return r.json.data[0]!;
}

describe('usage ledger: bad values never wedge it', () => {
  const open = closers();
  after(() => open.closeAll());

  for (const dialect of ['sqlite', 'postgres'] as const) {
    it(`answers and records every request when an upstream reports nonsense usage, flagged as estimated (${dialect})`, async () => {
      let i = 0;
      const upstream = open.keep(await upstreamWithUsage(() => BAD_USAGE[i++ % BAD_USAGE.length]![1]));
      const env: Record<string, string> = {};
      if (dialect === 'postgres') {
        const schema = await pgSchema();
        open.add(() => schema.drop());
        env['DATABASE_URL'] = schema.url;
      }
      const s = open.keep(
        await startGateway([{ baseUrl: upstream.url }], env, {
          pricing: [
            { metric: 'input_tokens', rate: 1 },
            { metric: 'output_tokens', rate: 2 },
          ],
        }),
      );
      const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0, timeout: 10_000 });
      for (let round = 0; round < 2; round++) {
        for (const [label] of BAD_USAGE) {
          const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }] });
          assert.equal(r.choices[0]!.message.content, 'Once upon', label);
          const u = r.usage as unknown as { prompt_tokens: number; completion_tokens: number; estimated?: boolean };
          assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `${label}: ${JSON.stringify(u)}`);
          assert.ok(Number.isInteger(u.completion_tokens) && u.completion_tokens > 0, `${label}: ${JSON.stringify(u)}`);
          assert.equal(u.estimated, true, label);
        }
        let text = '';
        for await (const c of await client.chat.completions.create({
          model: MODEL,
          messages: [{ role: 'user', content: 'x' }],
          stream: true,
          stream_options: { include_usage: true },
        })) {
          text += c.choices[0]?.delta.content ?? '';
        }
        assert.equal(text, 'Once upon');
      }
      const t = await totals(s);
      assert.equal(t.requests, 12);
      assert.equal(t.errors, 0);
      assert.equal(t.estimated_requests, 12, 'every record built on an estimate says so');
      assert.equal(t.unpriced_requests, 0);
      assert.ok(t.cost > 0, 'estimated usage is billed, not free');
      assert.equal((await http(s.url, 'GET', '/readyz')).status, 200);
      assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_upstream_usage_invalid_total\{deployment="d0"\} 1[02]/);
    });
  }

  it('quarantines a record the database refuses and writes the others (SQLite, the ledger on its own)', async () => {
    const dir = tempDir();
    const store = new KyselyStore({ sqlitePath: join(dir, 'ledger.db') });
    await store.migrate();
    open.add(() => store.close());
    let quarantined = 0;
    const ledger = new Ledger(store, log, 50, {
      onQuarantine: () => {
        quarantined++;
      },
    });
    ledger.start();
    // What the old reader let through: better-sqlite3 cannot bind a boolean or an object.
    // And fields that are not text: an array would have been spread over the columns after it.
    const bad = [
      record('usage_bad1', { cached_tokens: false }),
      record('usage_bad2', { input_tokens: { n: 1 } }),
      record('usage_bad3', { model: ['a', 'b'], deployment: [] }),
      record('usage_bad4', { error_code: { code: 'x' } }),
    ];
    const good = Array.from({ length: 5 }, (_, k) => record(`usage_good${k}`));
    await Promise.all([...bad, ...good].map((r) => ledger.record(r)));
    // Later records are not held up either.
    await ledger.record(record('usage_after'));
    await ledger.close();
    const totalsNow = await store.usageTotals('model', {});
    assert.equal(totalsNow[0]!.requests, 6);
    const q = await store.listQuarantinedUsage();
    assert.deepEqual(q.map((x) => x.id).sort(), ['usage_bad1', 'usage_bad2', 'usage_bad3', 'usage_bad4']);
    assert.match(q[0]!.record, /"request_id":"req_usage_bad/);
    assert.equal(quarantined, 4);
    assert.equal(ledger.writable, true);
  });

  /** A migrated store on a file of its own, closed after the suite. */
  async function migratedStore(): Promise<{ store: KyselyStore; file: string }> {
    const file = join(tempDir(), 'ledger.db');
    const store = new KyselyStore({ sqlitePath: file });
    await store.migrate();
    open.add(() => store.close());
    return { store, file };
  }

  /** A second connection to the file holding its write lock (BEGIN IMMEDIATE) until it commits. */
  function holdWriteLock(file: string): SqliteDatabase.Database {
    const other = new SqliteDatabase(file);
    open.add(async () => void other.close());
    other.exec('BEGIN IMMEDIATE');
    return other;
  }

  /**
   * Another process committing holds SQLite's write lock; here a second connection in this process
   * holds it (BEGIN IMMEDIATE) for as long as the test says. The ledger must not wait for it on the
   * event loop (SQLite's busy handler sleeps there): it tries again on later turns, stays writable,
   * and writes the record, with those recorded meanwhile, once the lock is free.
   */
  it(
    'does not block the event loop while another connection holds the write lock, and writes once it is free',
    { timeout: 4000 },
    async () => {
      const { store, file } = await migratedStore();
      let tries = 0;
      let busyErrors = 0;
      const counting = new Proxy(store, {
        get(target, prop, receiver) {
          if (prop !== 'insertUsage') return Reflect.get(target, prop, receiver) as unknown;
          return async (records: readonly UsageRecord[]) => {
            tries++;
            try {
              await target.insertUsage(records);
            } catch (err) {
              if (target.isBusyError(err)) busyErrors++;
              throw err;
            }
          };
        },
      });
      const states: boolean[] = [];
      const ledger = new Ledger(counting, log, 1000, { onWritable: (ok) => states.push(ok) });
      ledger.start();
      const other = holdWriteLock(file);
      let written = 0;
      const first = ledger.record(record('usage_busy1')).then(() => written++);
      // The event loop keeps turning while the record waits. A ledger that waited in SQLite's busy
      // handler would block each try for the busy timeout (5 s) and miss the test's deadline.
      let turns = 0;
      while (busyErrors < 4) {
        await new Promise((resolve) => setImmediate(resolve));
        if (++turns === 2) void ledger.record(record('usage_busy2')).then(() => written++);
        assert.ok(turns < 100_000, 'the ledger stopped trying');
      }
      assert.equal(written, 0, 'nothing is reported written while the lock is held');
      assert.equal(ledger.writable, true, 'a busy database is not one that cannot be written');
      other.exec('COMMIT');
      await first;
      await ledger.close();
      assert.equal(written, 2);
      assert.deepEqual(states, [], 'readiness never changed');
      assert.equal((await store.usageTotals('model', {}))[0]!.requests, 2);
      assert.ok(tries > busyErrors, 'the records were written by a later try');
    },
  );

  it(
    'counts a database busy for longer than the limit as not writable, and recovers when the lock is freed',
    { timeout: 2000 },
    async () => {
      const { store, file } = await migratedStore();
      const states: boolean[] = [];
      let changed: (() => void) | undefined;
      const ledger = new Ledger(store, log, 20, {
        busyLimitMs: 30,
        onWritable: (ok) => {
          states.push(ok);
          changed?.();
        },
      });
      ledger.start();
      const other = holdWriteLock(file);
      const since = performance.now();
      const done = ledger.record(record('usage_long_busy'));
      await new Promise<void>((resolve) => {
        changed = resolve;
      });
      assert.deepEqual(states, [false]);
      assert.ok(performance.now() - since >= 30, 'not before the busy limit');
      assert.equal(ledger.writable, false);
      const back = new Promise<void>((resolve) => {
        changed = resolve;
      });
      other.exec('COMMIT');
      await done;
      await back;
      assert.deepEqual(states, [false, true]);
      await ledger.close();
      assert.equal((await store.usageTotals('model', {}))[0]!.requests, 1);
    },
  );

  it('records what a generation that does not stop has used so far when the process must exit', async () => {
    const dir = tempDir();
    const store = new KyselyStore({ sqlitePath: join(dir, 'ledger.db') });
    await store.migrate();
    open.add(() => store.close());
    const ledger = new Ledger(store, log, 50);
    ledger.start();
    const metrics = new Metrics(() => ({
      models: [],
      schemaViolations: 0,
      schemaOutcomes: { resampled: 0, failed: 0, returnedInvalid: 0 },
    }));
    const model = resolveModelSpec({ id: 'test/stuck', context_length: 100, pricing: [] }, 'config', Date.now());
    if (typeof model === 'string') throw new Error(model);
    const req: GenerationRequest = {
      model: model.id,
      messages: [{ role: 'user', content: 'hi' }],
      sampling: {},
      stream: true,
      signal: new AbortController().signal,
      tally: newTally(),
    };
    // An engine that gave one event and then neither yields nor ends, whatever it is told.
    const stuck: EventSource = {
      open: (r) => {
        r.tally.input = 2;
        r.tally.output = 7;
        return Promise.resolve({
          first: { type: 'text.delta', text: 'Once' },
          rest: { next: () => new Promise<never>(() => undefined), return: () => new Promise<never>(() => undefined) },
        });
      },
    };
    const who = { keyId: 'key_stuck', orgId: 'org_stuck', role: 'inference' as const, keyLimits: null, orgLimits: null };
    const s = await MeteredStream.open(
      stuck,
      req,
      { model, who, endpoint: 'chat.completions', requestId: 'req_stuck', stream: true, started: performance.now(), trace: {} },
      ledger,
      metrics,
    );
    assert.equal((await s.next())?.type, 'text.delta');
    // Whoever reads it waits for an event that never comes (so nobody closes it).
    void s.next();
    // close() waits for every metered generation: this one never ends by itself.
    let closed = false;
    void ledger.close().then(() => {
      closed = true;
    });
    await ledger.recordOpen();
    const [total] = await store.usageTotals('model', {});
    assert.equal(total?.requests, 1);
    assert.equal(total?.errors, 1);
    assert.equal(total?.output_tokens, 7);
    // The server's failure, not a client that cancelled.
    const db = new SqliteDatabase(join(dir, 'ledger.db'), { readonly: true });
    assert.deepEqual(db.prepare('select status, error_code from usage_records').all(), [
      { status: 503, error_code: 'service_unavailable' },
    ]);
    db.close();
    await ledger.close();
    assert.ok(closed, 'the ledger closed once nothing was left open');
  });

  it('quarantines a record PostgreSQL refuses (an integer out of range) and writes the rest', async () => {
    const schema = await pgSchema();
    open.add(() => schema.drop());
    const store = new KyselyStore({ databaseUrl: schema.url, sqlitePath: '' });
    await store.migrate();
    open.add(() => store.close());
    const ledger = new Ledger(store, log, 50);
    ledger.start();
    // A safe integer for JavaScript, too large for the integer column: only the database can tell.
    const refused = record('usage_big', { latency_ms: 3_000_000_000 });
    await Promise.all([refused, record('usage_ok1'), record('usage_ok2')].map((r) => ledger.record(r)));
    await ledger.close();
    assert.equal((await store.usageTotals('model', {}))[0]!.requests, 2);
    assert.deepEqual(
      (await store.listQuarantinedUsage()).map((x) => x.id),
      ['usage_big'],
    );
  });

  it('holds answers and reports not ready while the ledger cannot write, then writes them (PostgreSQL)', async () => {
    const upstream = open.keep(await upstreamWithUsage(() => ({ prompt_tokens: 5, completion_tokens: 2 })));
    const schema = await pgSchema();
    open.add(() => schema.drop());
    const s = open.keep(await startGateway([{ baseUrl: upstream.url }], { DATABASE_URL: schema.url, SWITCHYARD_LEDGER_FLUSH_MS: '100' }));
    const admin = new pg.Client({ connectionString: schema.url });
    await admin.connect();
    open.add(() => admin.end());
    assert.equal((await http(s.url, 'GET', '/readyz')).status, 200);
    await admin.query('alter table usage_records rename to usage_records_away');
    const answered = http(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }] },
    });
    let ready = await http<{ error: { message: string } }>(s.url, 'GET', '/readyz');
    for (const deadline = Date.now() + 10_000; ready.status === 200 && Date.now() < deadline;) ready = await http(s.url, 'GET', '/readyz');
    assert.equal(ready.status, 503);
    assert.match(ready.json.error.message, /usage ledger cannot write/);
    assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_ledger_writable 0/);
    await admin.query('alter table usage_records_away rename to usage_records');
    const r = await answered;
    assert.equal(r.status, 200, 'the held answer goes out once its record is written');
    assert.equal((await http(s.url, 'GET', '/readyz')).status, 200);
    assert.equal((await totals(s)).requests, 1);
    assert.deepEqual(await s.service.store.listQuarantinedUsage(), [], 'an outage is not a bad record');
  });

  it('holds answers and reports not ready while SQLite refuses writes, then writes them (SQLite)', async () => {
    const upstream = open.keep(await upstreamWithUsage(() => ({ prompt_tokens: 5, completion_tokens: 2 })));
    const s = open.keep(await startGateway([{ baseUrl: upstream.url }], { SWITCHYARD_LEDGER_FLUSH_MS: '100' }));
    // The ledger's own connection turned read-only: every write fails (SQLITE_READONLY), reads work.
    const db = (s.service.store as unknown as { ledgerDb: SqliteDatabase.Database }).ledgerDb;
    db.pragma('query_only = ON');
    const answered = http(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }] },
    });
    let ready = await http(s.url, 'GET', '/readyz');
    for (const deadline = Date.now() + 10_000; ready.status === 200 && Date.now() < deadline;) ready = await http(s.url, 'GET', '/readyz');
    assert.equal(ready.status, 503, 'not ready while the ledger cannot write');
    db.pragma('query_only = OFF');
    assert.equal((await answered).status, 200);
    assert.equal((await http(s.url, 'GET', '/readyz')).status, 200);
    assert.equal((await totals(s)).requests, 1);
    assert.deepEqual(await s.service.store.listQuarantinedUsage(), []);
  });
});
