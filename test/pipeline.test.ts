import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { http, startServer, type TestServer, type WireKey } from './helpers/server.js';

/**
 * Both generation endpoints run one pipeline (core/generation.ts) in one order: resolve → checks on
 * the canonical request → admission. So the same problem gets the same answer on either, and a
 * request refused by a check never uses up a rate limit.
 */

const MODEL = 'local/stories260k';
const IMAGE = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const HUGE_SCHEMA = { type: 'object', properties: { v: { enum: Array.from({ length: 1001 }, (_, i) => `v${i}`) } } };

type Endpoint = 'chat' | 'responses';
const path = (e: Endpoint) => (e === 'chat' ? '/v1/chat/completions' : '/v1/responses');

/** The same request on either endpoint: plain, with an image, or with an oversized output schema. */
function body(e: Endpoint, kind: 'plain' | 'image' | 'schema'): Record<string, unknown> {
  if (e === 'chat') {
    const content =
      kind === 'image'
        ? [
            { type: 'text', text: 'Once upon a time' },
            { type: 'image_url', image_url: { url: IMAGE } },
          ]
        : 'Once upon a time';
    return {
      model: MODEL,
      max_tokens: 3,
      messages: [{ role: 'user', content }],
      ...(kind === 'schema' && { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: HUGE_SCHEMA } } }),
    };
  }
  const input =
    kind === 'image'
      ? [
          {
            role: 'user',
            content: [
              { type: 'input_text', text: 'Once upon a time' },
              { type: 'input_image', image_url: IMAGE },
            ],
          },
        ]
      : 'Once upon a time';
  return {
    model: MODEL,
    max_output_tokens: 3,
    input,
    ...(kind === 'schema' && { text: { format: { type: 'json_schema', name: 'x', schema: HUGE_SCHEMA } } }),
  };
}

describe('one pipeline for chat completions and Responses', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(() => server.close());

  const codes: Record<Endpoint, string[]> = { chat: [], responses: [] };

  for (const endpoint of ['chat', 'responses'] as const) {
    it(`${endpoint}: refuses an image for a text-only model and an oversized schema with 400, and neither uses up rpm: 1`, async () => {
      // rpm counts fixed one-minute windows: the four requests below must fall in one, so a test
      // that would start in a minute's last seconds starts with the next minute instead.
      const left = 60_000 - (Date.now() % 60_000);
      if (left < 10_000) await new Promise((r) => setTimeout(r, left + 50));
      const created = await http<WireKey>(server.url, 'POST', '/admin/keys', {
        key: server.adminKey,
        body: { org: `pipeline-${endpoint}`, name: 'one a minute', limits: { rpm: 1 } },
      });
      assert.equal(created.status, 201, created.text);
      const key = created.json.key!;

      const image = await http(server.url, 'POST', path(endpoint), { key, body: body(endpoint, 'image') });
      assert.equal(image.status, 400, image.text);
      assert.equal(image.json.error.code, 'unsupported_content');
      assert.match(image.json.error.message, /vision/);
      // Named where the request has it, on either endpoint.
      assert.equal(image.json.error.param, endpoint === 'chat' ? 'messages[0].content[1]' : 'input[0].content[1]');
      const schema = await http(server.url, 'POST', path(endpoint), { key, body: body(endpoint, 'schema') });
      assert.equal(schema.status, 400, schema.text);
      assert.equal(schema.json.error.code, 'schema_too_large');
      codes[endpoint].push(image.json.error.code!, schema.json.error.code!);

      // The minute's one request is still there: the refusals above came before admission.
      const plain = await http(server.url, 'POST', path(endpoint), { key, body: body(endpoint, 'plain') });
      assert.equal(plain.status, 200, plain.text);
      assert.equal(plain.headers['x-ratelimit-remaining-requests'], '0');
      const next = await http(server.url, 'POST', path(endpoint), { key, body: body(endpoint, 'plain') });
      assert.equal(next.status, 429);
      assert.equal(next.json.error.code, 'rate_limit_exceeded');
    });
  }

  it('answered both endpoints with the same codes', () => {
    assert.deepEqual(codes.chat, codes.responses);
  });
});
