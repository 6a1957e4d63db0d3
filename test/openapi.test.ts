import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Validator } from '@seriousme/openapi-schema-validator';
import { http, startServer, type TestServer } from './helpers/server.js';

interface OpenApiDoc {
  openapi: string;
  paths: Record<
    string,
    Record<string, { requestBody?: { content: Record<string, { schema: { properties?: Record<string, unknown> } }> } }>
  >;
}

describe('GET /openapi.json', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(() => server.close());

  it('is a valid OpenAPI 3 document generated from the validating schemas', async () => {
    const res = await http<OpenApiDoc>(server.url, 'GET', '/openapi.json');
    assert.equal(res.status, 200);
    const result = await new Validator().validate(res.json as unknown as Parameters<Validator['validate']>[0]);
    assert.equal(result.valid, true, JSON.stringify(result.errors));
    assert.match(res.json.openapi, /^3\./);
    const chat = res.json.paths['/v1/chat/completions']?.['post'];
    const props = chat?.requestBody?.content['application/json']?.schema.properties ?? {};
    assert.deepEqual(
      props['temperature'],
      { type: 'number', minimum: 0, maximum: 2, nullable: true },
      'the same limits the server enforces',
    );
    for (const path of [
      '/v1/responses',
      '/v1/messages',
      '/v1/messages/count_tokens',
      '/v1/models',
      '/v1/conversations',
      '/admin/keys',
      '/admin/usage',
      '/v1/usage',
    ])
      assert.ok(res.json.paths[path], path);
    // The lists of stored responses and conversations are documented with their cursor parameters.
    for (const path of ['/v1/responses', '/v1/conversations', '/v1/chat/completions']) {
      const list = res.json.paths[path]?.['get'] as { parameters?: Array<{ name: string; in: string }> } | undefined;
      assert.deepEqual(
        (list?.parameters ?? [])
          .filter((p) => p.in === 'query' && ['limit', 'after', 'order'].includes(p.name))
          .map((p) => p.name)
          .sort(),
        ['after', 'limit', 'order'],
        path,
      );
    }
    assert.equal(res.json.paths['/v1/models']?.['put'], undefined, 'the 405 answers are not documented as operations');
  });
});
