import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createKey, startServer, type TestServer } from './helpers/server.js';

describe('catalogue through the official openai SDK', () => {
  let server: TestServer;
  let client: OpenAI;
  const seenPaths: string[] = [];

  before(async () => {
    server = await startServer();
    const { key } = await createKey(server, 'acme');
    client = new OpenAI({
      apiKey: key,
      baseURL: server.baseURL,
      maxRetries: 0,
      // Record the exact paths the SDK sends, to prove retrieve() encodes the slash.
      fetch: async (input, init) => {
        seenPaths.push(new URL(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url).pathname);
        return fetch(input, init);
      },
    });
  });
  after(() => server.close());

  it('models.list() returns the catalogue with spec fields and a request id', async () => {
    const { data: page, request_id } = await client.models.list().withResponse();
    assert.match(request_id ?? '', /^req_/);
    const ids = page.data.map((m) => m.id);
    assert.ok(ids.includes('local/stories260k'), `local model listed: ${ids.join(', ')}`);
    assert.ok(ids.includes('meta-llama/llama-3.1-8b-instruct'));
    for (const m of page.data) {
      assert.equal(m.object, 'model');
      const extra = m as unknown as Record<string, unknown>;
      assert.equal(extra['model_type'], 'text_generation', `${m.id} is a text model`);
      assert.equal(typeof extra['context_length'], 'number');
      assert.ok(Array.isArray(extra['pricing']));
      assert.equal(`${String(extra['author'])}/${String(extra['slug'])}`, m.id);
    }
  });

  it('models.retrieve("author/slug") sends %2F and gets the model', async () => {
    const { data: model, request_id } = await client.models.retrieve('local/stories260k').withResponse();
    assert.equal(model.id, 'local/stories260k');
    assert.equal((model as unknown as { context_length: number }).context_length, 512);
    assert.match(request_id ?? '', /^req_/);
    assert.ok(seenPaths.includes('/v1/models/local%2Fstories260k'), `paths sent: ${seenPaths.join(' ')}`);
  });

  it('an unknown model raises NotFoundError with a request id', async () => {
    await assert.rejects(client.models.retrieve('meta-llama/no-such-model'), (err: unknown) => {
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.equal(err.status, 404);
      assert.equal(err.code, 'model_not_found');
      assert.match(err.requestID ?? '', /^req_/);
      return true;
    });
  });

  it('a bad key raises AuthenticationError with a request id', async () => {
    const bad = new OpenAI({
      apiKey: 'sk-sy-0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
      baseURL: server.baseURL,
      maxRetries: 0,
    });
    await assert.rejects(bad.models.list(), (err: unknown) => {
      assert.ok(err instanceof OpenAI.AuthenticationError);
      assert.equal(err.status, 401);
      assert.equal(err.type, 'authentication_error');
      assert.match(err.requestID ?? '', /^req_/);
      return true;
    });
  });

  it('a bad filter raises BadRequestError naming the allowed values', async () => {
    await assert.rejects(client.get('/models', { query: { type: 'video' } }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.param, 'type');
      assert.match(err.message, /text_generation/);
      assert.match(err.message, /image_generation/);
      assert.match(err.requestID ?? '', /^req_/);
      return true;
    });
    await assert.rejects(client.get('/models', { query: { author: 'nobody' } }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.param, 'author');
      assert.match(err.message, /meta-llama/);
      return true;
    });
  });

  it('the admin key can call /v1 endpoints too', async () => {
    const admin = new OpenAI({ apiKey: server.adminKey, baseURL: server.baseURL, maxRetries: 0 });
    const page = await admin.models.list();
    assert.ok(page.data.length > 0);
  });
});
