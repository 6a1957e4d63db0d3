import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { Pool } from 'undici';
import { http, SHARED_MODELS, startServer, tempDir, type TestServer } from './helpers/server.js';
import { processMemory, startProcess, type Running } from './helpers/process.js';
import { closers } from './helpers/fixtures.js';
import { eventually, settle } from './helpers/wait.js';
import { probeHealth } from '../bench/lib.js';
import { getLlama, LlamaLogLevel, type Llama } from 'node-llama-cpp';
import { pino } from 'pino';
import { SchemaGrammars } from '../src/engines/local/schema-grammar.js';

const STORIES = 'local/stories260k';
const SCHEMAS = join(SHARED_MODELS, '..', 'schemas');
/** `npm test` sends 2,000 distinct schemas; `npm run fuzz` sets SWITCHYARD_FUZZ_RUNS=10000 and sends 20,000. */
const DISTINCT = Number(process.env['SWITCHYARD_FUZZ_RUNS'] ?? 0) >= 10_000 ? 20_000 : 2_000;

const nested = (depth: number): Record<string, unknown> => {
  let s: Record<string, unknown> = { type: 'string' };
  for (let i = 0; i < depth; i++) s = { type: 'object', properties: { a: s }, required: ['a'] };
  return s;
};
const chat = (schema: unknown) => ({
  model: STORIES,
  max_tokens: 20,
  messages: [{ role: 'user', content: 'Describe it.' }],
  response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
});

describe('JSON schemas in requests: bounded, compiled off the event loop, never a 500', () => {
  const open = closers();
  let server: TestServer;
  after(() => open.closeAll());

  it('refuses a schema past each limit with a 400 that names the limit, at once', async () => {
    server = open.keep(await startServer());
    const cases: Array<[string, object, RegExp, string]> = [
      [
        'a 200,000-value enum',
        chat({ type: 'object', properties: { v: { enum: Array.from({ length: 200_000 }, (_, i) => `value${i}`) } }, required: ['v'] }),
        /enum .* 200000 values.*SWITCHYARD_SCHEMA_MAX_ENUM/,
        'response_format.json_schema.schema',
      ],
      [
        '1,500 levels of nesting in a tool',
        {
          model: STORIES,
          messages: [{ role: 'user', content: 'x' }],
          tool_choice: 'required',
          tools: [{ type: 'function', function: { name: 'f', parameters: nested(1500) } }],
        },
        /deeper than 64 levels.*SWITCHYARD_SCHEMA_MAX_DEPTH/,
        'tools[0].function.parameters',
      ],
      ['1,500 levels of nesting in json_schema', chat(nested(1500)), /SWITCHYARD_SCHEMA_MAX_DEPTH/, 'response_format.json_schema.schema'],
      [
        'minItems: 100000',
        chat({ type: 'array', items: { type: 'integer' }, minItems: 100_000 }),
        /minItems .* 100000.*SWITCHYARD_SCHEMA_MAX_MIN_COUNT/,
        'response_format.json_schema.schema',
      ],
      [
        'minLength: 100000',
        chat({ type: 'string', minLength: 100_000 }),
        /minLength.*SWITCHYARD_SCHEMA_MAX_MIN_COUNT/,
        'response_format.json_schema.schema',
      ],
      [
        '2 MB of schema',
        chat({ type: 'object', description: 'd'.repeat(2 * 1024 * 1024) }),
        /more than 1048576 bytes.*SWITCHYARD_SCHEMA_MAX_BYTES/,
        'response_format.json_schema.schema',
      ],
      [
        '30,000 subschemas',
        chat({ type: 'object', properties: Object.fromEntries(Array.from({ length: 30_000 }, (_, i) => [`p${i}`, { type: 'null' }])) }),
        /more than 20000 objects.*SWITCHYARD_SCHEMA_MAX_NODES/,
        'response_format.json_schema.schema',
      ],
    ];
    for (const [label, body, message, param] of cases) {
      const started = Date.now();
      const r = await http(server.url, 'POST', '/v1/chat/completions', { key: server.adminKey, body });
      assert.equal(r.status, 400, `${label}: ${r.text.slice(0, 300)}`);
      assert.equal(r.json.error.code, 'schema_too_large', label);
      assert.match(r.json.error.message, message, label);
      assert.equal(r.json.error.param, param, label);
      assert.ok(Date.now() - started < 3_000, `${label} took ${Date.now() - started} ms`);
    }
    // The same limits on the Responses API, and on a tool's parameters there.
    const deep = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: { model: STORIES, input: 'x', text: { format: { type: 'json_schema', name: 'x', schema: nested(1500) } } },
    });
    assert.equal(deep.status, 400, deep.text.slice(0, 200));
    assert.equal(deep.json.error.code, 'schema_too_large');
    const tool = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: { model: STORIES, input: 'x', tools: [{ type: 'function', name: 'f', parameters: { type: 'array', minItems: 100_000 } }] },
    });
    assert.equal(tool.status, 400);
    assert.equal(tool.json.error.param, 'tools[0].parameters');
  });

  it('compiles schemas in a worker: others are answered meanwhile, and an overrun is a 400', async () => {
    const s = open.keep(await startServer({ env: { SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS: '150' } }));
    // Within every limit (126 KB, 3,001 subschemas), but Ajv's compile time grows with the square of
    // the properties: 1,000 of them take ~1.4 s here, where a small schema takes ~1 ms.
    const props: Record<string, unknown> = {};
    for (let i = 0; i < 1000; i++)
      props[`p${i}`] = {
        type: 'object',
        properties: { [`a${i}`]: { type: 'string', maxLength: i + 1 }, [`b${i}`]: { type: 'integer' } },
        required: [`a${i}`],
      };
    const big = { type: 'object', properties: props };
    const pool = new Pool(s.url, { connections: 4 });
    open.add(() => pool.close());
    const pings = probeHealth(pool);
    const refused = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        http(s.url, 'POST', '/v1/chat/completions', {
          key: s.adminKey,
          body: chat({ ...big, description: `copy ${i}` }),
        }),
      ),
    );
    const slowest = { ms: await pings.stop() };
    for (const r of refused) {
      assert.equal(r.status, 400, r.text.slice(0, 200));
      assert.equal(r.json.error.code, 'schema_too_large');
      assert.match(r.json.error.message, /longer than 150 ms to compile.*SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS/);
    }
    // The main thread answered throughout: a compile on it would have held a ping for over a second
    // (the margin leaves room for a loaded machine; it is not a latency target).
    assert.ok(slowest.ms < 500, `a health check waited ${slowest.ms.toFixed(1)} ms while schemas compiled`);
    // The worker that was stopped is replaced: a small schema compiles and generates.
    const ok = await http<{ choices: Array<{ message: { content: string } }> }>(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: chat({ type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false }),
    });
    assert.equal(ok.status, 200, ok.text);
    assert.match(ok.json.choices[0]!.message.content, /^\{"ok":(true|false)\}$/);
  });

  it('refuses a schema whose pattern backtracks on the output with a 400, and other schemas are served meanwhile', async () => {
    const s = open.keep(await startServer());
    // The grammar can only write the enum's value; checking it against the pattern backtracks
    // through 2^41 ways of splitting the a's (hours), in the schema worker every schema shares.
    // (The back-reference keeps the pattern from having an automaton: `^(a+)+$` alone is tested by
    // its automaton at compile time, below, and the enum's value refused at once.)
    const redos = { type: 'string', pattern: '^(?:(a+)+|(c+)d\\2)$', enum: [`${'a'.repeat(41)}!`] };
    // Room for the whole value (a document cut at the limit is not checked).
    const first = http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...chat(redos), max_tokens: 200 } });
    // Another client's schema, sent while that check runs: answered once the worker is replaced.
    const other = http<{ choices: Array<{ message: { content: string } }> }>(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: chat({ type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false }),
    });
    const r = await first;
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.equal(r.json.error.code, 'unsupported_schema');
    assert.equal(r.json.error.param, 'response_format');
    assert.match(r.json.error.message, /took longer than \d+ ms.*pattern/);
    const ok = await other;
    assert.equal(ok.status, 200, ok.text);
    assert.match(ok.json.choices[0]!.message.content, /^\{"ok":(true|false)\}$/);
    // The same schema again, on the Responses API: refused before anything is generated.
    const again = await http(s.url, 'POST', '/v1/responses', {
      key: s.adminKey,
      body: {
        model: STORIES,
        input: 'Describe it.',
        max_output_tokens: 200,
        text: { format: { type: 'json_schema', name: 'x', schema: redos } },
      },
    });
    assert.equal(again.status, 400, again.text.slice(0, 300));
    assert.equal(again.json.error.code, 'unsupported_schema');
    assert.equal(again.json.error.param, 'text.format');
    // With an automaton, the value is tested without backtracking: no value of the enum matches.
    const regular = await http(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: chat({ type: 'string', pattern: '^(a+)+$', enum: [`${'a'.repeat(41)}!`] }),
    });
    assert.equal(regular.status, 400, regular.text.slice(0, 300));
    assert.equal(regular.json.error.code, 'invalid_value');
    assert.match(regular.json.error.message, /no value of the enum/);
    // The server is whole: health and a plain request.
    assert.equal((await http(s.url, 'GET', '/healthz')).status, 200);
  });

  it(`keeps memory flat over ${DISTINCT.toLocaleString('en')} distinct schemas (bounded caches)`, async () => {
    const dataDir = tempDir();
    const admin = 'sk-test-admin-schemas-0123456789abcdef';
    let proc: Running | undefined;
    open.add(async () => {
      proc?.child.kill('SIGKILL');
      rmSync(dataDir, { recursive: true, force: true });
    });
    proc = await startProcess(
      {
        SWITCHYARD_DATA_DIR: dataDir,
        SWITCHYARD_ADMIN_KEY: admin,
        SWITCHYARD_WORKERS: '1',
        SWITCHYARD_SCHEMA_CACHE_SIZE: '64',
      },
      { inspect: true },
    );
    const pool = new Pool(proc.url, { connections: 8 });
    open.add(() => pool.close());
    let next = 0;
    let baseline = { rss: 0, heap: 0 };
    // Heap readings follow a full collection (through the inspector). RSS still grows toward the
    // allocator's working size over the first few thousand requests: the baseline is taken well into
    // the run, and the end once the heap settled.
    const warmup = Math.floor(DISTINCT * 0.4);
    const send = async () => {
      while (next < DISTINCT) {
        const i = next++;
        if (i === warmup) baseline = await processMemory(proc!.url, proc!.inspector);
        const schema = {
          type: 'object',
          properties: { [`field_${i}`]: { type: 'boolean' } },
          required: [`field_${i}`],
          additionalProperties: false,
        };
        const res = await pool.request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
          body: JSON.stringify({ ...chat(schema), max_tokens: 12 }),
        });
        const text = await res.body.text();
        assert.equal(res.statusCode, 200, text);
      }
    };
    await Promise.all(Array.from({ length: 8 }, send));
    const loaded = await http<{ cached_schemas: number; schema_violations: number }>(proc.url, 'GET', '/admin/local/loaded', {
      key: admin,
    });
    assert.ok(loaded.json.cached_schemas <= 64, `cache holds ${loaded.json.cached_schemas}`);
    assert.equal(loaded.json.schema_violations, 0);
    const { url, inspector } = proc;
    const end = await settle(
      () => processMemory(url, inspector),
      (m) => m.heap <= baseline.heap + 8 * 1024 * 1024,
      20_000,
    );
    const growth = end.rss - baseline.rss;
    console.log(
      `# ${DISTINCT} distinct schemas: RSS ${Math.round(baseline.rss / 1e6)} MB after ${warmup}, ${Math.round(end.rss / 1e6)} MB at the end; ${loaded.json.cached_schemas} cached`,
    );
    // Unbounded caches grew ~100 KB per schema (120 MB over the last 1,200 of 2,000). Over 2,000 the heap
    // is still growing toward its first major GC (~6,000 here), hence the wider margin; over 20,000
    // the baseline comes after it and RSS holds within a few MB.
    const allowed = (DISTINCT >= 20_000 ? 48 : 80) * 1024 * 1024;
    assert.ok(growth < allowed, `RSS grew ${Math.round(growth / 1e6)} MB`);
  });

  it('stops within the shutdown timeout on SIGTERM, right after the schemas that used to freeze it', async () => {
    const dataDir = tempDir();
    const admin = 'sk-test-admin-sigterm-0123456789abcdef';
    const proc = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_ADMIN_KEY: admin,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_SHUTDOWN_TIMEOUT_MS: '8000',
      // Draining waits for each compile until its own limit, one after the other: two limits
      // (3 s) on a starved machine (a busy CI runner, two busy loops on two cores here) came within
      // a 3 s shutdown timeout's reach, and the stop was forced (exit code 1). 8 s leaves room;
      // what this test guards is that the stop comes at all, within its timeout.
      SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS: '1500',
    });
    open.add(async () => {
      proc.child.kill('SIGKILL');
      rmSync(dataDir, { recursive: true, force: true });
    });
    // Either may be cut off by the stop (a compile can outlast the shutdown timeout): a closed
    // connection reads as status 0, caught at once so it is never an unhandled rejection.
    const huge = http(proc.url, 'POST', '/v1/chat/completions', {
      key: admin,
      body: chat({ type: 'object', properties: { v: { enum: Array.from({ length: 200_000 }, (_, i) => `value${i}`) } } }),
    }).catch(() => ({ status: 0 }));
    const big = JSON.parse(readFileSync(join(SCHEMAS, 'JsonSchemaStore', 'meta.schema.json'), 'utf8')) as object;
    const heavy = http(proc.url, 'POST', '/v1/chat/completions', { key: admin, body: chat(big) }).catch(() => ({ status: 0 }));
    // Both have arrived (in progress, or already answered) when the signal comes.
    await eventually(async () => {
      const text = await (await fetch(`${proc.url}/metrics`)).text();
      const inFlight = Number(/^switchyard_in_flight_requests (\d+)$/m.exec(text)?.[1] ?? 0);
      const answered = [...text.matchAll(/^switchyard_requests_total\{route="\/v1\/chat\/completions"[^}]*\} (\d+)$/gm)].reduce(
        (n, m) => n + Number(m[1]),
        0,
      );
      assert.ok(inFlight + answered >= 2, `${inFlight} in flight, ${answered} answered`);
    });
    const stopAt = Date.now();
    proc.child.kill('SIGTERM');
    const code = await proc.exited;
    const took = Date.now() - stopAt;
    assert.equal(code, 0);
    assert.ok(took < 8_000 + 1_000, `stopped after ${took} ms`);
    assert.notEqual((await huge).status, 500);
    assert.notEqual((await heavy).status, 500);
  });
});

/**
 * The schema worker is one thread every request shares. A hostile pass held it for minutes with one
 * request (128 `strict: false` tools, each just under the time limit) and made another tenant's
 * first structured output wait 21 s behind four such requests. Here against the real worker, with
 * llama.cpp making the grammars: turns taken by organization, one budget for a request's schemas,
 * and a schema too slow for the whole limit refused again without running.
 */
describe('the schema worker shared fairly between organizations and bounded per request', () => {
  const lines: string[] = [];
  const log = pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) });
  const overruns = () => lines.filter((l) => l.includes('overran its time limit')).length;
  let llama: Promise<Llama> | undefined;
  const grammars = new SchemaGrammars(() => (llama ??= getLlama({ gpu: false, logLevel: LlamaLogLevel.error })), {
    cacheSize: 64,
    compileTimeoutMs: 300,
    log,
  });
  // The worker thread does not hold the process open (a server's socket does): this does, meanwhile.
  const alive = setInterval(() => undefined, 1000);
  after(async () => {
    clearInterval(alive);
    await grammars.close();
  });
  // As above: 1,000 properties compile in about 1.4 s, far past 300 ms; each copy is a new schema.
  const props: Record<string, unknown> = {};
  for (let i = 0; i < 1000; i++)
    props[`p${i}`] = { type: 'object', properties: { [`a${i}`]: { type: 'string', maxLength: i + 1 }, [`b${i}`]: { type: 'integer' } } };
  const slow = (i: number) => ({ type: 'object', properties: props, description: `copy ${i}` });
  const small = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] };

  it('takes organizations in turn: a small schema waits for the compile under way, not for every queued one', async () => {
    // llama.cpp loaded first (the first grammar waits for it), with a schema of its own.
    await grammars.forSchema({ ...small, description: 'warm-up' }, 'response_format', 'org_c');
    const order: string[] = [];
    const mark = (who: string) => () => void order.push(who);
    const a = [0, 1, 2].map((i) => grammars.forSchema(slow(i), 'tools', 'org_a').then(mark('a'), mark('a')));
    const b = grammars.forSchema(small, 'response_format', 'org_b').then(mark('b'));
    await Promise.all([...a, b]);
    assert.deepEqual(order, ['a', 'b', 'a', 'a']);
    assert.equal(overruns(), 3);
  });

  it("shares one compile budget among a request's schemas, and keeps a schema too slow for the whole limit refused", async () => {
    const before = overruns();
    const budget = grammars.budget();
    const results = await Promise.allSettled([3, 4, 5].map((i) => grammars.forSchema(slow(i), 'tools', 'org_a', budget)));
    const messages = results.map((r) => (r.status === 'rejected' ? String((r.reason as Error).message) : 'compiled'));
    assert.match(messages[0]!, /took longer than 300 ms to compile \(/);
    for (const m of messages.slice(1)) assert.match(m, /schemas took longer than 300 ms to compile between them/);
    // The first used up the budget; the others never ran.
    assert.equal(overruns(), before + 1);
    // Sent again, the one that overran the whole limit is refused without running; one refused only
    // for its request's budget is compiled again (and overruns on its own).
    await assert.rejects(grammars.forSchema(slow(3), 'tools', 'org_b'), /took longer than 300 ms to compile \(/);
    assert.equal(overruns(), before + 1);
    await assert.rejects(grammars.forSchema(slow(4), 'tools', 'org_b'), /took longer than 300 ms to compile \(/);
    assert.equal(overruns(), before + 2);
    // The worker that was stopped is replaced: a small schema still compiles.
    const ok = await grammars.forSchema(small, 'response_format', 'org_c');
    assert.deepEqual(await ok.check('{"ok":true}'), { valid: true, errors: undefined });
  });
});
