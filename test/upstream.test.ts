import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { createKey, http, startServer, tempDir, type TestServer } from './helpers/server.js';
import { chunkFrame, deadUrl, fixture } from './helpers/fixtures.js';

const MODEL = 'meta-llama/tiny-stories';

/** Config for a Switchyard whose only way to serve MODEL is the given deployments. */
function upstreamConfig(deployments: Array<{ baseUrl: string; weight?: number; apiKeyEnv?: string; upstreamModel?: string }>): string {
  return JSON.stringify({
    defaultCatalogue: false,
    models: [{ id: MODEL, name: 'TinyStories via upstream', context_length: 512 }],
    deployments: deployments.map((d) => ({ model: MODEL, upstreamModel: 'local/stories260k', ...d })),
  });
}

const ask = { messages: [{ role: 'user' as const, content: 'Once upon a time' }], max_tokens: 25, temperature: 0 };

describe('two Switchyards chained through the upstream engine', () => {
  let a: TestServer;
  let b: TestServer;
  let direct: OpenAI;
  let chained: OpenAI;

  before(async () => {
    a = await startServer();
    const upstreamKey = (await createKey(a, 'downstream-instance')).key;
    b = await startServer({
      modelsDir: tempDir(),
      env: { TEST_UPSTREAM_KEY: upstreamKey },
      configFile: { name: 'b.json', text: upstreamConfig([{ baseUrl: a.baseURL, apiKeyEnv: 'TEST_UPSTREAM_KEY' }]) },
    });
    direct = new OpenAI({ apiKey: (await createKey(a, 'acme')).key, baseURL: a.baseURL, maxRetries: 0 });
    chained = new OpenAI({ apiKey: (await createKey(b, 'acme')).key, baseURL: b.baseURL, maxRetries: 0 });
  });
  after(async () => {
    await b.close();
    await a.close();
  });

  it('serves non-stream requests through the other instance', async () => {
    const viaB = await chained.chat.completions.create({ model: MODEL, ...ask });
    const viaA = await direct.chat.completions.create({ model: 'local/stories260k', ...ask });
    assert.equal(viaB.model, MODEL);
    assert.equal(viaB.choices[0]!.message.content, viaA.choices[0]!.message.content);
    assert.equal(viaB.choices[0]!.finish_reason, 'length');
    assert.equal(viaB.usage!.completion_tokens, 25);
    assert.equal(viaB.usage!.prompt_tokens, 5);
  });

  it('streams through the other instance chunk by chunk, usage included', async () => {
    const stream = await chained.chat.completions.create({ model: MODEL, ...ask, stream: true, stream_options: { include_usage: true } });
    const chunks: OpenAI.Chat.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks[0]!.choices[0]!.delta.role, 'assistant');
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    assert.match(text, /^, there was a little girl named Lily/);
    assert.ok(chunks.filter((c) => c.choices[0]?.delta.content).length > 10, 'not collapsed into one chunk');
    assert.equal(chunks.at(-2)!.choices[0]!.finish_reason, 'length');
    assert.equal(chunks.at(-1)!.usage?.completion_tokens, 25);
    const final = await chained.chat.completions.stream({ model: MODEL, ...ask }).finalChatCompletion();
    assert.equal(final.choices[0]!.message.content, text);
  });

  it('passes the upstream context_length_exceeded through as a 400', async () => {
    // B's catalogue claims 512, so B itself lets 500 through; A knows the prompt is 5 tokens and rejects 510.
    await assert.rejects(
      chained.chat.completions.create({ model: MODEL, ...ask, max_tokens: 510 }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && err.code === 'context_length_exceeded',
    );
  });

  it('stops promptly upstream when the client disconnects', async () => {
    const stream = await chained.chat.completions.create({ model: MODEL, ...ask, max_tokens: 400, stream: true });
    let n = 0;
    for await (const _ of stream) if (++n === 3) break;
    const again = await chained.chat.completions.create({ model: MODEL, ...ask, max_tokens: 3 });
    assert.equal(again.usage!.completion_tokens, 3);
  });
});

describe('upstream failures', () => {
  const servers: Array<{ close(): Promise<void> }> = [];
  after(async () => {
    for (const s of servers) await s.close();
  });

  async function downstream(deployments: Parameters<typeof upstreamConfig>[0]) {
    const s = await startServer({ modelsDir: tempDir(), configFile: { name: 'c.json', text: upstreamConfig(deployments) } });
    servers.push(s);
    return { server: s, client: new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 }) };
  }
  async function fixtureServer(handler: (req: IncomingMessage, res: ServerResponse) => void) {
    const f = await fixture(handler);
    servers.push(f);
    return f.url;
  }

  it('answers an unreachable upstream with 502 in the envelope', async () => {
    const { server } = await downstream([{ baseUrl: await deadUrl() }]);
    const res = await http(server.url, 'POST', '/v1/chat/completions', { key: server.adminKey, body: { model: MODEL, ...ask } });
    assert.equal(res.status, 502);
    assert.equal(res.json.error.code, 'upstream_unreachable');
  });

  it('fails over to the next deployment when one is down', async () => {
    const a = await startServer();
    servers.push(a);
    const key = (await createKey(a, 'downstream')).key;
    const s = await startServer({
      modelsDir: tempDir(),
      env: { UP_KEY: key },
      configFile: {
        name: 'd.json',
        text: upstreamConfig([
          { baseUrl: await deadUrl(), weight: 1e6 },
          { baseUrl: a.baseURL, weight: 0.001, apiKeyEnv: 'UP_KEY' },
        ]),
      },
    });
    servers.push(s);
    const ok = await new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 }).chat.completions.create({
      model: MODEL,
      ...ask,
    });
    assert.match(ok.choices[0]!.message.content ?? '', /little girl/);
  });

  it('maps an upstream 503 to 502 and an upstream 429 to 429 with retry-after', async () => {
    const unavailable = await fixtureServer((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"loading","type":"server_error"}}');
    });
    const d1 = await downstream([{ baseUrl: unavailable }]);
    const r1 = await http(d1.server.url, 'POST', '/v1/chat/completions', { key: d1.server.adminKey, body: { model: MODEL, ...ask } });
    assert.equal(r1.status, 502);
    assert.equal(r1.json.error.code, 'upstream_error');
    assert.match(r1.json.error.message, /503/);

    const limited = await fixtureServer((_req, res) => {
      res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' }).end('{"error":{"message":"slow down"}}');
    });
    const d2 = await downstream([{ baseUrl: limited }]);
    const r2 = await http(d2.server.url, 'POST', '/v1/chat/completions', { key: d2.server.adminKey, body: { model: MODEL, ...ask } });
    assert.equal(r2.status, 429);
    assert.equal(r2.headers['retry-after'], '7');
    assert.equal(r2.json.error.message, 'slow down');
  });

  it('turns a stream that breaks mid-way into an error the SDK throws', async () => {
    const broken = await fixtureServer((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunkFrame({ role: 'assistant', content: '' }));
      res.write(chunkFrame({ content: 'Once' }));
      setTimeout(() => res.socket?.destroy(), 20);
    });
    const { client } = await downstream([{ baseUrl: broken }]);
    const stream = await client.chat.completions.create({ model: MODEL, ...ask, stream: true });
    let text = '';
    await assert.rejects(
      (async () => {
        for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
      })(),
      (err: unknown) => err instanceof OpenAI.APIError && /upstream/i.test(err.message),
    );
    assert.equal(text, 'Once');
  });
});
