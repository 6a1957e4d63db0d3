import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import { http, pgSchema, startServer, tempDir, type TestServer, type WireKey } from './helpers/server.js';
import { closers, fixture } from './helpers/fixtures.js';
import { eventually } from './helpers/wait.js';

const REDIS_URL = process.env['SWITCHYARD_TEST_REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const MODEL = 'meta-llama/priced-stories';
const config = JSON.stringify({
  localModels: {
    'stories260K.gguf': {
      id: MODEL,
      pricing: [
        { metric: 'input_tokens', rate: 1000 },
        { metric: 'output_tokens', rate: 1000 },
      ],
    },
  },
});

async function keyWith(server: TestServer, org: string, limits: Record<string, unknown>): Promise<string> {
  const res = await http<WireKey>(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: { org, name: 'limited', limits } });
  assert.equal(res.status, 201, res.text);
  return res.json.key!;
}

const chat = (server: TestServer, key: string, model = MODEL, maxTokens = 5) =>
  http(server.url, 'POST', '/v1/chat/completions', {
    key,
    body: { model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: maxTokens },
  });

/** Every limit test starts at the beginning of a minute window when it is close to its end. */
async function awayFromMinuteEdge(): Promise<void> {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < 5_000) await new Promise((r) => setTimeout(r, left + 100));
}

describe('limits', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer({ configFile: { name: 'l.json', text: config } });
  });
  after(() => server.close());

  it('gives the 4th request of an RPM-3 key a 429 with retry-after and rate-limit headers', async () => {
    await awayFromMinuteEdge();
    const key = await keyWith(server, 'acme', { rpm: 3 });
    for (let i = 0; i < 3; i++) {
      const ok = await chat(server, key);
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.headers['x-ratelimit-limit-requests'], '3');
      assert.equal(ok.headers['x-ratelimit-remaining-requests'], String(2 - i));
      assert.match(String(ok.headers['x-ratelimit-reset-requests']), /^\d+s$/);
    }
    const fourth = await chat(server, key);
    assert.equal(fourth.status, 429);
    assert.equal(fourth.json.error.code, 'rate_limit_exceeded');
    assert.equal(fourth.json.error.type, 'rate_limit_error');
    assert.ok(Number(fourth.headers['retry-after']) >= 1);
    assert.equal(fourth.headers['x-ratelimit-remaining-requests'], '0');
    const streamed = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'x', max_output_tokens: 2 } });
    assert.equal(streamed.status, 429, 'the Responses API shares the same limit');
    const metrics = await http(server.url, 'GET', '/metrics');
    assert.match(metrics.text, /switchyard_rate_limited_total\{limit="rpm"\} [2-9]/);
    // Refused requests are counted under their model, as answered ones are.
    for (const route of ['/v1/chat/completions', '/v1/responses'])
      assert.ok(metrics.text.includes(`switchyard_requests_total{route="${route}",model="${MODEL}",status="429"}`), route);
  });

  it('exhausts a tokens-per-minute limit', async () => {
    await awayFromMinuteEdge();
    const key = await keyWith(server, 'acme', { tpm: 30 });
    const first = await chat(server, key, MODEL, 20);
    assert.equal(first.status, 200);
    assert.equal(first.headers['x-ratelimit-limit-tokens'], '30');
    // What is left counts this request's own reservation (its input and max_tokens), as the requests header counts it.
    assert.ok(Number(first.headers['x-ratelimit-remaining-tokens']) <= 10, String(first.headers['x-ratelimit-remaining-tokens']));
    const second = await chat(server, key, MODEL, 20);
    assert.equal(second.status, 200, '25 tokens used, 5 left: still admitted');
    const third = await chat(server, key, MODEL, 20);
    assert.equal(third.status, 429);
    assert.equal(third.json.error.code, 'rate_limit_exceeded');
    assert.equal(third.headers['x-ratelimit-remaining-tokens'], '0');
    assert.match(third.json.error.message, /tokens per minute/);
  });

  it('holds a tokens-per-minute limit against concurrent requests, and a request refused by one limit does not count against another', async () => {
    await awayFromMinuteEdge();
    // Each request may use its input (a few tokens) and 20 more: 60 tokens a minute admit three at
    // most at once, where counting only finished requests admitted all twenty.
    const key = await keyWith(server, 'acme', { tpm: 60 });
    const statuses = await Promise.all(Array.from({ length: 20 }, () => chat(server, key, MODEL, 20).then((r) => r.status)));
    const passed = statuses.filter((s) => s === 200).length;
    assert.ok(passed >= 1 && passed <= 3, `${passed} of 20 admitted: ${statuses.join(' ')}`);
    assert.ok(
      statuses.every((s) => s === 200 || s === 429),
      statuses.join(' '),
    );

    // Three requests refused by the organization's budget leave the key's rpm of 3 untouched.
    const org = `org-${randomBytes(4).toString('hex')}`;
    assert.equal(
      (await http(server.url, 'POST', '/admin/orgs', { key: server.adminKey, body: { id: org, limits: { budget: 0 } } })).status,
      201,
    );
    const limited = await keyWith(server, org, { rpm: 3 });
    for (let i = 0; i < 3; i++) assert.equal((await chat(server, limited)).json.error.code, 'budget_exceeded');
    assert.equal((await http(server.url, 'PATCH', `/admin/orgs/${org}`, { key: server.adminKey, body: { limits: null } })).status, 200);
    const after = await chat(server, limited);
    assert.equal(after.status, 200, after.text);
    assert.equal(after.headers['x-ratelimit-remaining-requests'], '2');
  });

  it('applies allowed models and rpm to the input-token counts too', async () => {
    await awayFromMinuteEdge();
    const key = await keyWith(server, 'acme', { rpm: 2, models: [MODEL] });
    const count = (path: string, model: string) =>
      http(server.url, 'POST', path, {
        key,
        body:
          path === '/v1/messages/count_tokens'
            ? { model, messages: [{ role: 'user', content: 'Once upon a time' }] }
            : { model, input: 'Once upon a time' },
      });
    assert.equal((await count('/v1/responses/input_tokens', 'local/llama-2-tiny-random')).status, 403);
    assert.equal((await count('/v1/messages/count_tokens', 'local/llama-2-tiny-random')).status, 403);
    const first = await count('/v1/responses/input_tokens', MODEL);
    assert.equal(first.status, 200);
    // The counts' own requests-per-minute counter, in the same headers as any answer of a key with limits.
    assert.equal(first.headers['x-ratelimit-limit-requests'], '2');
    assert.equal(first.headers['x-ratelimit-remaining-requests'], '1');
    const second = await count('/v1/messages/count_tokens', MODEL);
    assert.equal(second.status, 200);
    assert.equal(second.headers['x-ratelimit-remaining-requests'], '0');
    assert.equal((await count('/v1/responses/input_tokens', MODEL)).status, 429, 'the third request this minute');
  });

  it('exhausts a spend budget with its own error code', async () => {
    // $1000 per million tokens: 15 tokens cost $0.015.
    const key = await keyWith(server, 'acme', { budget: 0.02, budget_period: 'day' });
    assert.equal((await chat(server, key, MODEL, 10)).status, 200);
    assert.equal((await chat(server, key, MODEL, 10)).status, 200, '$0.015 spent of $0.02');
    const over = await chat(server, key, MODEL, 10);
    assert.equal(over.status, 429);
    assert.equal(over.json.error.code, 'budget_exceeded');
    assert.equal(over.headers['x-should-retry'], 'false');
    assert.ok(Number(over.headers['retry-after']) > 0);
  });

  it('reserves no more than the context for an output limit past it (tokens per minute and budget)', async () => {
    // A max_tokens of 100,000,000 was reserved whole while the request ran (a hostile pass locked a
    // key out of its month's budget and a minute's tokens with one stream to an upstream model). No
    // answer outgrows the context, so that is the most it reserves. The local engine then refuses
    // the request (prompt and completion past its context); the admission's headers say what was held.
    const key = await keyWith(server, 'huge-max', { tpm: 1_000_000, budget: 5 });
    const context = (await http<{ context_length: number }>(server.url, 'GET', `/v1/models/${MODEL}`, { key })).json.context_length;
    assert.ok(context > 0 && context < 100_000);
    const r = await chat(server, key, MODEL, 100_000_000);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.code, 'context_length_exceeded');
    const remaining = Number(r.headers['x-ratelimit-remaining-tokens']);
    assert.ok(remaining >= 1_000_000 - context && remaining < 1_000_000, `remaining ${remaining}`);
    // Nothing was generated, so nothing stays reserved: the key goes on, its budget whole.
    const next = await chat(server, key);
    assert.equal(next.status, 200, next.text);
  });

  it('keeps a key to its allowed models', async () => {
    const key = await keyWith(server, 'acme', { models: [MODEL] });
    assert.equal((await chat(server, key)).status, 200);
    const other = await chat(server, key, 'local/llama-2-tiny-random');
    assert.equal(other.status, 403);
    assert.equal(other.json.error.code, 'model_not_allowed');
  });

  it('applies organization limits to all of its keys, and limit changes at once', async () => {
    await awayFromMinuteEdge();
    const org = `org-${randomBytes(4).toString('hex')}`;
    const a = await keyWith(server, org, {});
    const b = await keyWith(server, org, {});
    const patched = await http(server.url, 'PATCH', `/admin/orgs/${org}`, { key: server.adminKey, body: { limits: { rpm: 2 } } });
    assert.equal(patched.status, 200, patched.text);
    assert.equal((await chat(server, a)).status, 200);
    assert.equal((await chat(server, b)).status, 200);
    assert.equal((await chat(server, a)).status, 429, 'the third request of the organization in this minute');
    const lifted = await http(server.url, 'PATCH', `/admin/orgs/${org}`, { key: server.adminKey, body: { limits: null } });
    assert.equal(lifted.status, 200);
    assert.equal((await chat(server, b)).status, 200);
  });

  it('validates limits', async () => {
    const bad = await http(server.url, 'POST', '/admin/keys', {
      key: server.adminKey,
      body: { org: 'acme', name: 'x', limits: { rpm: 0 } },
    });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'limits.rpm');
    // A model the catalogue does not have: kept (it may be added later), and said in the reply.
    const typo = await http<{ id: string; warning?: string }>(server.url, 'POST', '/admin/keys', {
      key: server.adminKey,
      body: { org: 'acme', name: 'x', limits: { models: [MODEL, 'local/stories260'] } },
    });
    assert.equal(typo.status, 201, typo.text);
    assert.match(typo.json.warning ?? '', /limits\.models names no model in the catalogue: 'local\/stories260'; /);
    const fixed = await http<{ warning?: string }>(server.url, 'PATCH', `/admin/keys/${typo.json.id}`, {
      key: server.adminKey,
      body: { limits: { models: [MODEL] } },
    });
    assert.equal(fixed.status, 200, fixed.text);
    assert.equal(fixed.json.warning, undefined);
    const org = await http<{ warning?: string }>(server.url, 'PATCH', '/admin/orgs/acme', {
      key: server.adminKey,
      body: { limits: { models: ['qwen/none'] } },
    });
    assert.match(org.json.warning ?? '', /'qwen\/none'/);
    await http(server.url, 'PATCH', '/admin/orgs/acme', { key: server.adminKey, body: { limits: null } });
  });
});

describe('a budget held by requests in progress', () => {
  const c = closers();
  after(() => c.closeAll());

  it('refuses for now, not for the period, while what requests in flight hold fills the budget', async () => {
    // An upstream whose streams wait until the test lets them finish.
    let finish: () => void = () => undefined;
    const released = new Promise<void>((r) => (finish = r));
    let arrived: () => void = () => undefined;
    const upstreamHasIt = new Promise<void>((r) => (arrived = r));
    const up = c.keep(
      await fixture((req, res) => {
        req.resume();
        req.on('end', () => {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          const chunk = (delta: object, finishReason: string | null = null) =>
            `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finishReason }] })}\n\n`;
          res.write(chunk({ role: 'assistant', content: 'Once' }));
          arrived();
          void released.then(() =>
            res.end(
              `${chunk({}, 'stop')}data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 } })}\n\ndata: [DONE]\n\n`,
            ),
          );
        });
      }),
    );
    const model = 'mistralai/held';
    const server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        configFile: {
          name: 'held.json',
          text: JSON.stringify({
            models: [
              {
                id: model,
                context_length: 1000,
                capabilities: ['streaming'],
                pricing: [
                  { metric: 'input_tokens', rate: 1000 },
                  { metric: 'output_tokens', rate: 1000 },
                ],
              },
            ],
            deployments: [{ model, baseUrl: up.url, upstreamModel: 'm' }],
          }),
        },
      }),
    );
    // $1000 per million tokens: a request for 900 tokens may cost about $0.9, more than the budget.
    const key = await keyWith(server, 'held', { budget: 0.5, budget_period: 'day' });
    const ask = (max: number, stream: boolean) =>
      http(server.url, 'POST', '/v1/chat/completions', {
        key,
        body: { model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: max, stream },
      });
    const first = ask(900, true);
    // Admitted (its worst case reserved) once the upstream has it.
    await upstreamHasIt;
    const second = await ask(5, false);
    assert.equal(second.status, 429, second.text);
    assert.equal(second.json.error.code, 'budget_exceeded');
    assert.match(second.json.error.message, /held by requests in progress/);
    assert.equal(second.headers['x-should-retry'], undefined, 'worth retrying');
    assert.equal(second.headers['retry-after'], '1');
    finish();
    assert.equal((await first).status, 200);
    // The stream cost $0.006: the budget is open again.
    const after = await ask(5, true);
    assert.equal(after.status, 200, after.text);
  });
});

describe('limits shared by two instances on Redis', () => {
  const prefixDb = `redis-${randomBytes(4).toString('hex')}`;
  let a: TestServer;
  let b: TestServer;
  let schema: { url: string; drop(): Promise<void> };
  before(async () => {
    const env = { REDIS_URL, SWITCHYARD_ADMIN_KEY: `sk-shared-admin-${prefixDb}` };
    // Instances that share limits share a database too: PostgreSQL, as in production.
    schema = await pgSchema();
    a = await startServer({ env: { ...env, DATABASE_URL: schema.url }, configFile: { name: 'a.json', text: config } });
    b = await startServer({ env: { ...env, DATABASE_URL: schema.url }, configFile: { name: 'b.json', text: config } });
  });
  after(async () => {
    await a.close();
    await b.close();
    await schema.drop();
  });

  it('counts requests across both instances', async () => {
    await awayFromMinuteEdge();
    const key = await keyWith(a, `shared-${prefixDb}`, { rpm: 3 });
    assert.equal((await chat(a, key)).status, 200);
    assert.equal((await chat(b, key)).status, 200);
    assert.equal((await chat(a, key)).status, 200);
    const fourth = await chat(b, key);
    assert.equal(fourth.status, 429, 'the 4th request, on the other instance, sees the shared count');
    const redis = new Redis(REDIS_URL);
    try {
      const keys = await redis.keys('switchyard:rpm:key:*');
      assert.ok(keys.length > 0, 'the counters are in Redis');
    } finally {
      await redis.quit();
    }
  });

  it('shares a spend budget, and requests sent at once, across both instances', async () => {
    // $1000 per million tokens: 15 tokens cost $0.015. The budget's counter is set up in Redis from
    // the database by whichever instance comes first (a script, so the other finds it made).
    const budget = await keyWith(a, `budget-${prefixDb}`, { budget: 0.02, budget_period: 'day' });
    assert.equal((await chat(a, budget, MODEL, 10)).status, 200);
    assert.equal((await chat(b, budget, MODEL, 10)).status, 200, '$0.015 spent of $0.02');
    const over = await chat(a, budget, MODEL, 10);
    assert.equal(over.status, 429);
    assert.equal(over.json.error.code, 'budget_exceeded');

    // Commands issued in one turn leave in one pipeline; each counter operation is still one script,
    // applied in order, so eight at once against an rpm of 5 admit exactly 5.
    await awayFromMinuteEdge();
    const key = await keyWith(a, `burst-${prefixDb}`, { rpm: 5, tpm: 1_000_000 });
    const statuses = (await Promise.all(Array.from({ length: 8 }, (_, i) => chat(i % 2 === 0 ? a : b, key, MODEL, 2)))).map(
      (r) => r.status,
    );
    assert.equal(statuses.filter((s) => s === 200).length, 5, statuses.join(','));
    assert.equal(statuses.filter((s) => s === 429).length, 3, statuses.join(','));

    // The scripts go by their SHA; a Redis that lost them (restarted, flushed) is sent them again.
    const redis = new Redis(REDIS_URL);
    try {
      await redis.script('FLUSH');
    } finally {
      await redis.quit();
    }
    await awayFromMinuteEdge();
    const again = await keyWith(a, `flushed-${prefixDb}`, { rpm: 1 });
    assert.equal((await chat(b, again)).status, 200);
    assert.equal((await chat(a, again)).status, 429);
  });
});

describe('limits when Redis cannot be reached', () => {
  let redis: ChildProcess;
  let port: number;
  let server: TestServer;
  const startRedis = async (): Promise<ChildProcess> => {
    const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
      stdio: 'ignore',
    });
    await eventually(async () => {
      const probe = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      probe.on('error', () => undefined);
      try {
        await probe.connect();
        assert.equal(await probe.ping(), 'PONG');
      } finally {
        probe.disconnect();
      }
    });
    return child;
  };
  before(async () => {
    // A Redis of its own, which the test stops (the shared one is never touched).
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
    port = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    redis = await startRedis();
    server = await startServer({ env: { REDIS_URL: `redis://127.0.0.1:${port}` }, configFile: { name: 'r.json', text: config } });
  });
  after(async () => {
    await server?.close();
    redis?.kill('SIGKILL');
  });

  it('refuses a limited key with 503 and retry-after at once, serves unlimited keys, and recovers with Redis', async () => {
    const limited = await keyWith(server, 'redis-down', { rpm: 1000 });
    const free = (
      await http<WireKey>(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: { org: 'redis-down', name: 'free' } })
    ).json.key!;
    assert.equal((await chat(server, limited)).status, 200);
    redis.kill('SIGKILL');
    await once(redis, 'exit');
    const started = Date.now();
    const refused = await chat(server, limited);
    assert.equal(refused.status, 503, refused.text);
    assert.equal(refused.json.error.code, 'service_unavailable');
    assert.ok(Number(refused.headers['retry-after']) > 0, 'retry-after');
    assert.ok(Date.now() - started < 4000, `answered in ${Date.now() - started} ms`);
    assert.equal((await chat(server, free)).status, 200, 'a key without limits never needs Redis');
    redis = await startRedis();
    await eventually(async () => assert.equal((await chat(server, limited)).status, 200), 15_000);
    // The refused request raised no counter when Redis came back (a command queued while it was
    // down, and given up on, used to be applied then): only the one request served since counts.
    const fresh = new Redis({ port, host: '127.0.0.1' });
    try {
      const keys = await fresh.keys('switchyard:rpm:key:*');
      const counted = (await Promise.all(keys.map((k) => fresh.get(k)))).reduce((sum, v) => sum + Number(v), 0);
      assert.equal(counted, 1, keys.join(','));
    } finally {
      await fresh.quit();
    }
  });
});
