import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'undici';
import { createKey, http, startServer, type TestServer, type WireList, type WireModel } from './helpers/server.js';

describe('catalogue over plain HTTP', () => {
  let server: TestServer;
  let acme: string;
  let globex: string;

  before(async () => {
    server = await startServer();
    acme = (await createKey(server, 'acme')).key;
    globex = (await createKey(server, 'globex')).key;
  });
  after(() => server.close());

  const list = (query: string, key = acme) => http<WireList<WireModel>>(server.url, 'GET', `/v1/models${query}`, { key });

  it('accepts the key as Authorization: Bearer and as x-api-key', async () => {
    const bearer = await http<WireList<WireModel>>(server.url, 'GET', '/v1/models', { headers: { authorization: `Bearer ${acme}` } });
    const xApiKey = await http<WireList<WireModel>>(server.url, 'GET', '/v1/models', { headers: { 'x-api-key': acme } });
    assert.equal(bearer.status, 200);
    assert.equal(xApiKey.status, 200);
    assert.equal(bearer.json.object, 'list');
    assert.deepEqual(
      bearer.json.data.map((m) => m.id),
      xApiKey.json.data.map((m) => m.id),
    );
  });

  it('refuses a request with two Authorization headers (401), whichever key comes first', async () => {
    for (const [a, b] of [
      [acme, globex],
      [globex, acme],
    ]) {
      const res = await request(`${server.url}/v1/models`, {
        headers: ['authorization', `Bearer ${a!}`, 'authorization', `Bearer ${b!}`],
      });
      const body = (await res.body.json()) as { error: { code: string; message: string } };
      assert.equal(res.statusCode, 401);
      assert.equal(body.error.code, 'invalid_api_key');
      assert.match(body.error.message, /more than one Authorization header/);
      assert.ok(res.headers['x-request-id']);
    }
    // An empty first line does not hand the choice to x-api-key.
    const emptyFirst = await request(`${server.url}/v1/models`, {
      headers: ['authorization', '', 'x-api-key', acme, 'authorization', `Bearer ${globex}`],
    });
    await emptyFirst.body.dump();
    assert.equal(emptyFirst.statusCode, 401);
    // Authorization and x-api-key together: the Bearer key is used (a documented decision).
    const both = await http(server.url, 'GET', '/v1/models', { headers: { authorization: `Bearer ${acme}`, 'x-api-key': 'sk-nope' } });
    assert.equal(both.status, 200);
  });

  it('reads a model by raw slash and by %2F', async () => {
    const raw = await http<WireModel>(server.url, 'GET', '/v1/models/meta-llama/llama-3.1-8b-instruct', { key: acme });
    const encoded = await http<WireModel>(server.url, 'GET', '/v1/models/meta-llama%2Fllama-3.1-8b-instruct', { key: acme });
    assert.equal(raw.status, 200);
    assert.equal(encoded.status, 200);
    assert.deepEqual(raw.json, encoded.json);
    assert.equal(raw.json.id, 'meta-llama/llama-3.1-8b-instruct');
    assert.equal(raw.json.author, 'meta-llama');
    assert.equal(raw.json.slug, 'llama-3.1-8b-instruct');
    assert.equal(raw.json.context_length, 131072);
    assert.equal(raw.json.status, 'active');
    assert.equal(raw.json.visibility, 'public');
    assert.equal(typeof raw.json.created, 'number');
    assert.equal(typeof raw.json.name, 'string');
    assert.equal(typeof raw.json.description, 'string');
    assert.ok(raw.json.pricing.some((p) => p.metric === 'input_tokens' && p.rate > 0));
  });

  it('an unknown id is a 404 in the envelope', async () => {
    const res = await http(server.url, 'GET', '/v1/models/meta-llama%2Fnope', { key: acme });
    assert.equal(res.status, 404);
    assert.equal(res.json.error.code, 'model_not_found');
    assert.equal(res.json.error.type, 'not_found_error');
    assert.match(String(res.headers['content-type']), /^application\/json/);
  });

  it('decodes the id in the path once: %252F is a literal %2F, not a slash', async () => {
    const res = await http(server.url, 'GET', '/v1/models/meta-llama%252Fllama-3.1-8b-instruct', { key: acme });
    assert.equal(res.status, 404, res.text);
    assert.equal(res.json.error.code, 'model_not_found');
  });

  it('reads, changes and deletes a model whose id has the longest length allowed (255)', async () => {
    const id = `openai/${'m'.repeat(248)}`;
    assert.equal(id.length, 255);
    const made = await http(server.url, 'POST', '/admin/models', {
      key: server.adminKey,
      body: { id, context_length: 1000, pricing: [{ metric: 'input_tokens', rate: 1 }] },
    });
    assert.equal(made.status, 201, made.text);
    for (const path of [`/v1/models/${id}`, `/v1/models/${encodeURIComponent(id)}`]) {
      const res = await http<WireModel>(server.url, 'GET', path, { key: acme });
      assert.equal(res.status, 200, res.text);
      assert.equal(res.json.id, id);
    }
    const patched = await http<WireModel>(server.url, 'PATCH', `/admin/models/${encodeURIComponent(id)}`, {
      key: server.adminKey,
      body: { context_length: 2000 },
    });
    assert.equal(patched.status, 200, patched.text);
    assert.equal(patched.json.context_length, 2000);
    assert.equal((await http(server.url, 'DELETE', `/admin/models/${id}`, { key: server.adminKey })).status, 200);
    assert.equal((await http(server.url, 'GET', `/v1/models/${id}`, { key: acme })).status, 404);
  });

  it('lists image models with output_size and no context_length', async () => {
    const res = await list('?type=image_generation');
    assert.equal(res.status, 200);
    assert.ok(res.json.data.length >= 2);
    for (const m of res.json.data) {
      assert.equal(m.model_type, 'image_generation');
      assert.match(m.output_size ?? '', /^\d+x\d+(,\d+x\d+)*$/);
      assert.ok(!('context_length' in m), `${m.id} has no context_length`);
      assert.ok(m.capabilities.includes('image_generation'));
      assert.ok(m.pricing.some((p) => p.metric === 'megapixels'));
    }
  });

  it('lists every other model type', async () => {
    for (const type of ['speech_to_text', 'text_to_speech', 'moderation']) {
      const res = await list(`?type=${type}`);
      assert.equal(res.status, 200);
      assert.ok(res.json.data.length > 0, `a ${type} model ships`);
      assert.ok(res.json.data.every((m) => m.model_type === type));
    }
  });

  it('defaults to text_generation and treats text_to_text as its alias', async () => {
    const plain = await list('');
    const explicit = await list('?type=text_generation');
    const alias = await list('?type=text_to_text');
    assert.ok(plain.json.data.length > 0);
    assert.ok(plain.json.data.every((m) => m.model_type === 'text_generation'));
    assert.deepEqual(
      alias.json.data.map((m) => m.id),
      plain.json.data.map((m) => m.id),
    );
    assert.deepEqual(
      explicit.json.data.map((m) => m.id),
      plain.json.data.map((m) => m.id),
    );
  });

  it('filters by author', async () => {
    const res = await list('?author=meta-llama');
    assert.equal(res.status, 200);
    assert.ok(res.json.data.length > 0);
    assert.ok(res.json.data.every((m) => m.author === 'meta-llama'));
    const images = await list('?author=black-forest-labs&type=image_generation');
    assert.deepEqual(
      images.json.data.map((m) => m.id),
      ['black-forest-labs/flux.1-schnell'],
    );
    const bad = await http(server.url, 'GET', '/v1/models?author=Meta', { key: acme });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'author');
    // Given twice: said so, not "must be one of" a list naming the very values sent.
    for (const q of ['?author=openai&author=google', '?type=chat&type=chat&type=embedding']) {
      const twice = await http(server.url, 'GET', `/v1/models${q}`, { key: acme });
      assert.equal(twice.status, 400, q);
      assert.equal(twice.json.error.code, 'invalid_value');
      assert.equal(twice.json.error.param, q.slice(1, q.indexOf('=')));
      assert.match(twice.json.error.message, /was given [23] times; give it once/);
    }
  });

  it('keeps private models invisible to other organizations', async () => {
    const created = await http<WireModel>(server.url, 'POST', '/admin/models', {
      key: server.adminKey,
      body: {
        id: 'meta-llama/acme-support-ft',
        name: 'Acme support fine-tune',
        visibility: 'private',
        owned_by: 'acme',
        context_length: 8192,
      },
    });
    assert.equal(created.status, 201, created.text);

    const mine = await list('', acme);
    assert.ok(mine.json.data.some((m) => m.id === 'meta-llama/acme-support-ft'));
    const own = await http<WireModel>(server.url, 'GET', '/v1/models/meta-llama/acme-support-ft', { key: acme });
    assert.equal(own.status, 200);
    assert.equal(own.json.visibility, 'private');

    const theirs = await list('', globex);
    assert.ok(!theirs.json.data.some((m) => m.id === 'meta-llama/acme-support-ft'));
    const byAuthor = await list('?author=meta-llama', globex);
    assert.ok(!byAuthor.json.data.some((m) => m.id === 'meta-llama/acme-support-ft'));
    for (const path of ['/v1/models/meta-llama/acme-support-ft', '/v1/models/meta-llama%2Facme-support-ft']) {
      const res = await http(server.url, 'GET', path, { key: globex });
      assert.equal(res.status, 404, 'another org gets the same answer as for a model that does not exist');
      assert.equal(res.json.error.code, 'model_not_found');
    }
  });

  it('applies the documented status rules', async () => {
    const mk = (slug: string, status: string) =>
      http(server.url, 'POST', '/admin/models', {
        key: server.adminKey,
        body: { id: `qwen/${slug}`, status, context_length: 4096 },
      });
    for (const [slug, status] of [
      ['st-pending', 'pending'],
      ['st-inactive', 'inactive'],
      ['st-deleted', 'deleted'],
    ] as const) {
      assert.equal((await mk(slug, status)).status, 201);
    }
    const ids = (await list('?author=qwen')).json.data.map((m) => m.id);
    assert.ok(ids.includes('qwen/st-pending'), 'pending is listed');
    assert.ok(!ids.includes('qwen/st-inactive'), 'inactive is not listed');
    assert.ok(!ids.includes('qwen/st-deleted'), 'deleted is never listed');
    assert.equal((await http<WireModel>(server.url, 'GET', '/v1/models/qwen/st-inactive', { key: acme })).json.status, 'inactive');
    assert.equal((await http(server.url, 'GET', '/v1/models/qwen/st-deleted', { key: acme })).status, 404);

    const del = await http<WireModel>(server.url, 'DELETE', '/admin/models/qwen/st-pending', { key: server.adminKey });
    assert.equal(del.json.status, 'deleted');
    assert.ok(!(await list('?author=qwen')).json.data.some((m) => m.id === 'qwen/st-pending'));
  });

  it('rejects a revoked key', async () => {
    const { key, id } = await createKey(server, 'acme', 'short-lived');
    assert.equal((await http(server.url, 'GET', '/v1/models', { key })).status, 200);
    const revoked = await http(server.url, 'DELETE', `/admin/keys/${id}`, { key: server.adminKey });
    assert.equal(revoked.status, 200);
    const res = await http(server.url, 'GET', '/v1/models', { key });
    assert.equal(res.status, 401);
    assert.equal(res.json.error.code, 'invalid_api_key');
    assert.match(res.json.error.message, /revoked/);
  });

  it('rejects missing, malformed and unknown keys with 401 in the envelope', async () => {
    const cases: Array<[Record<string, string>, string]> = [
      [{}, 'missing_api_key'],
      [{ authorization: 'Basic abc' }, 'invalid_api_key'],
      [{ authorization: 'Bearer ' }, 'invalid_api_key'],
      [{ 'x-api-key': 'short' }, 'invalid_api_key'],
      [{ authorization: `Bearer ${acme.slice(0, -1)}${acme.endsWith('A') ? 'B' : 'A'}` }, 'invalid_api_key'],
      [{ 'x-api-key': 'sk-sy-ffffffffffffffff_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' }, 'invalid_api_key'],
    ];
    for (const [headers, code] of cases) {
      const res = await http(server.url, 'GET', '/v1/models', { headers });
      assert.equal(res.status, 401, JSON.stringify(headers));
      assert.equal(res.json.error.code, code);
      assert.equal(res.json.error.type, 'authentication_error');
      assert.match(String(res.headers['x-request-id']), /^req_/);
    }
  });
});
