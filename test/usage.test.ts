import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import OpenAI from 'openai';
import { createKey, http, startServer, tempDir, type TestServer } from './helpers/server.js';

interface Total {
  group: string;
  requests: number;
  errors: number;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  cost: number;
  unpriced_requests: number;
}

const PRICED = 'meta-llama/tiny-stories';
const config = JSON.stringify({
  localModels: {
    // $1.50 per million input tokens, $2.00 per million output tokens, cached input at $0.50.
    'stories260K.gguf': {
      id: PRICED,
      pricing: [
        { metric: 'input_tokens', rate: 1.5 },
        { metric: 'output_tokens', rate: 2 },
        { metric: 'cached_input_tokens', rate: 0.5 },
      ],
    },
    // No price at all: its cost is unknown, never $0.
    'llama-2-tiny-random.gguf': { id: 'local/unpriced', pricing: [] },
  },
});

/** Parses Prometheus text into `name{labels}` → value. */
function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    const raw = line.slice(at + 1);
    const value = Number(raw);
    assert.ok(!Number.isNaN(value) || /^(nan|[+-]inf)$/i.test(raw), `metric line parses: ${line}`);
    out.set(line.slice(0, at), value);
  }
  return out;
}

describe('usage and cost accounting', () => {
  const dataDir = tempDir();
  const adminKey = 'usage-test-admin-key-0001';
  let server: TestServer;
  after(async () => {
    await server?.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('computes the cost from the pricing, returns it in usage, and records it', async () => {
    server = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey }, configFile: { name: 'u.json', text: config } });
    const { key, id } = await createKey(server, 'acme', 'billing');
    const client = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
    const r = await client.chat.completions.create({
      model: PRICED,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 20,
      temperature: 0,
    });
    const u = r.usage! as typeof r.usage & { cost: number };
    const expected =
      ((u.prompt_tokens - u.prompt_tokens_details!.cached_tokens!) * 1.5 +
        u.prompt_tokens_details!.cached_tokens! * 0.5 +
        u.completion_tokens * 2) /
      1e6;
    assert.equal(u.prompt_tokens, 5);
    assert.equal(u.completion_tokens, 20);
    assert.ok(Math.abs(u.cost - expected) < 1e-12, `${u.cost} vs ${expected}`);

    // The second identical request reuses the cached prefix, which is cheaper.
    const again = await client.chat.completions.create({
      model: PRICED,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 20,
      temperature: 0,
    });
    const u2 = again.usage! as typeof r.usage & { cost: number };
    assert.equal(u2.prompt_tokens_details!.cached_tokens, 4);
    assert.ok(Math.abs(u2.cost - (1 * 1.5 + 4 * 0.5 + 20 * 2) / 1e6) < 1e-12);

    const resp = await client.responses.create({ model: PRICED, input: 'Once upon a time', max_output_tokens: 10, temperature: 0 });
    assert.equal(typeof (resp.usage as unknown as { cost: number }).cost, 'number');

    const totals = await http<{ data: Total[] }>(server.url, 'GET', `/admin/usage?group_by=key&key=${id}`, { key: adminKey });
    assert.equal(totals.json.data.length, 1);
    const t = totals.json.data[0]!;
    assert.equal(t.group, id);
    assert.equal(t.requests, 3);
    assert.equal(t.input_tokens, 15);
    assert.equal(t.output_tokens, 50);
    assert.ok(Math.abs(t.cost - (u.cost + u2.cost + (resp.usage as unknown as { cost: number }).cost)) < 1e-12);
    assert.equal(t.unpriced_requests, 0);
  });

  it('flags a missing price instead of recording $0', async () => {
    const client = new OpenAI({ apiKey: adminKey, baseURL: server.baseURL, maxRetries: 0 });
    const r = await client.chat.completions.create({ model: 'local/unpriced', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal((r.usage as unknown as { cost: number | null }).cost, null);
    const totals = await http<{ data: Total[] }>(server.url, 'GET', '/admin/usage?group_by=model&model=local/unpriced', { key: adminKey });
    assert.equal(totals.json.data[0]!.unpriced_requests, 1);
    assert.equal(totals.json.data[0]!.cost, 0, 'unpriced requests are counted apart, not as $0 cost');
    const metrics = parseMetrics((await http(server.url, 'GET', '/metrics')).text);
    assert.equal(metrics.get('switchyard_price_missing_total{model="local/unpriced"}'), 1);
  });

  it('records failures too, and groups totals by org, model and day', async () => {
    const key = (await createKey(server, 'globex', 'fails')).key;
    const res = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: PRICED, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1000 },
    });
    assert.equal(res.status, 400);
    const byOrg = await http<{ data: Total[] }>(server.url, 'GET', '/admin/usage?group_by=org', { key: adminKey });
    const globex = byOrg.json.data.find((d) => d.group === 'globex');
    assert.equal(globex?.requests, 1);
    assert.equal(globex?.errors, 1);
    const today = new Date().toISOString().slice(0, 10);
    const byDay = await http<{ data: Total[] }>(server.url, 'GET', `/admin/usage?group_by=day&from=${today}&to=${today}`, {
      key: adminKey,
    });
    assert.equal(byDay.json.data.length, 1);
    assert.equal(byDay.json.data[0]!.group, today);
    assert.equal(byDay.json.data[0]!.requests, 5);
    const inference = await http(server.url, 'GET', '/admin/usage', { key });
    assert.equal(inference.status, 403);
  });

  it('exposes Prometheus metrics that move with requests', async () => {
    const before = parseMetrics((await http(server.url, 'GET', '/metrics')).text);
    const client = new OpenAI({ apiKey: adminKey, baseURL: server.baseURL, maxRetries: 0 });
    await client.chat.completions.create({ model: PRICED, messages: [{ role: 'user', content: 'Once' }], max_tokens: 7 });
    const res = await http(server.url, 'GET', '/metrics');
    assert.match(String(res.headers['content-type']), /text\/plain/);
    const now = parseMetrics(res.text);
    const key = `switchyard_requests_total{route="/v1/chat/completions",model="${PRICED}",status="200"}`;
    assert.equal((now.get(key) ?? 0) - (before.get(key) ?? 0), 1);
    const out = `switchyard_tokens_total{model="${PRICED}",kind="output"}`;
    assert.equal((now.get(out) ?? 0) - (before.get(out) ?? 0), 7);
    assert.ok(
      (now.get(`switchyard_cost_usd_total{model="${PRICED}"}`) ?? 0) > (before.get(`switchyard_cost_usd_total{model="${PRICED}"}`) ?? 0),
    );
    assert.ok([...now.keys()].some((k) => k.startsWith('switchyard_time_to_first_token_seconds_count')));
    // The request-duration histogram of this route and model: one more observation, its buckets
    // cumulative (non-decreasing in `le`, +Inf equal to the count), with the TYPE line scrapers need.
    const labels = `route="/v1/chat/completions",model="${PRICED}",status="200"`;
    const count = `switchyard_request_duration_seconds_count{${labels}}`;
    assert.equal((now.get(count) ?? 0) - (before.get(count) ?? 0), 1);
    assert.ok((now.get(`switchyard_request_duration_seconds_sum{${labels}}`) ?? 0) > 0);
    const buckets = [...now]
      .filter(([k]) => k.startsWith('switchyard_request_duration_seconds_bucket{') && k.includes(labels))
      .map(([k, v]) => ({ le: /le="([^"]+)"/.exec(k)![1]!, v }));
    assert.equal(buckets.length, 14, 'thirteen bounds and +Inf');
    assert.equal(buckets.at(-1)!.le, '+Inf');
    assert.equal(buckets.at(-1)!.v, now.get(count));
    buckets.forEach((b, i) => i === 0 || assert.ok(b.v >= buckets[i - 1]!.v, `bucket le=${b.le} is cumulative`));
    assert.match(res.text, /^# TYPE switchyard_request_duration_seconds histogram$/m);
    assert.match(res.text, /^# TYPE switchyard_requests_total counter$/m);
    assert.ok(now.has(`switchyard_local_active_sequences{model="${PRICED}"}`));
    assert.ok(now.has(`switchyard_local_queue_depth{model="${PRICED}"}`));
    assert.equal(now.get('switchyard_schema_violations'), 0);
  });

  it('keeps the ledger across a restart', async () => {
    await server.close();
    server = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey }, configFile: { name: 'u.json', text: config } });
    const byOrg = await http<{ data: Total[] }>(server.url, 'GET', '/admin/usage?group_by=org', { key: adminKey });
    const total = byOrg.json.data.reduce((a, d) => a + d.requests, 0);
    assert.equal(total, 6, 'every request answered before the shutdown was recorded');
  });

  it('protects /metrics with a token when one is configured', async () => {
    const s = await startServer({ env: { SWITCHYARD_METRICS_TOKEN: 'scrape-token-123' } });
    try {
      assert.equal((await http(s.url, 'GET', '/metrics')).status, 401);
      for (const authorization of ['Bearer scrape-token-12', 'Bearer scrape-token-1234', 'scrape-token-123', 'Basic scrape-token-123'])
        assert.equal((await http(s.url, 'GET', '/metrics', { headers: { authorization } })).status, 401, authorization);
      assert.equal((await http(s.url, 'GET', '/metrics', { headers: { authorization: 'Bearer scrape-token-123' } })).status, 200);
    } finally {
      await s.close();
    }
  });
});
