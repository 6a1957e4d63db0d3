import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import SqliteDatabase from 'better-sqlite3';
import OpenAI from 'openai';
import { request } from 'undici';
import { createKey, startServer, type TestServer } from './helpers/server.js';
import { closers, fixture, GATEWAY_MODEL, startGateway } from './helpers/fixtures.js';

/**
 * The same-protocol fast lane (chat completions in, a chat-completions upstream out): the upstream's
 * frames are passed on, not re-rendered. What a client reads must be what the canonical lane gives
 * it (same text, usage with its cost, one [DONE] after the usage record is stored, the catalogue's
 * model name), and every guarantee holds: the output limit, upstream errors, metering.
 */

const PRICING = [
  { metric: 'input_tokens', rate: 1 },
  { metric: 'output_tokens', rate: 2 },
];

interface Frame {
  raw: string;
  json: Record<string, unknown> | undefined;
}

/** A streamed chat completion read as raw SSE: every data payload, in order, and the request id. */
async function rawStream(base: string, key: string, body: object): Promise<{ frames: Frame[]; requestId: string; status: number }> {
  const res = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const text = await res.body.text();
  const frames = text
    .split('\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => {
      const raw = l.slice(6);
      return { raw, json: raw === '[DONE]' ? undefined : (JSON.parse(raw) as Record<string, unknown>) };
    });
  return { frames, requestId: String(res.headers['x-request-id']), status: res.statusCode };
}

function usageRow(server: TestServer, requestId: string): Record<string, unknown> | undefined {
  const db = new SqliteDatabase(join(server.dataDir, 'switchyard.db'), { readonly: true });
  try {
    return db.prepare('select * from usage_records where request_id = ?').get(requestId) as Record<string, unknown> | undefined;
  } finally {
    db.close();
  }
}

const contentOf = (frames: Frame[]): string =>
  frames
    .map((f) => {
      const choices = f.json?.['choices'] as Array<{ delta?: { content?: string } }> | undefined;
      return choices?.[0]?.delta?.content ?? '';
    })
    .join('');

describe('chat completions through a chat upstream over a real model (one Switchyard in front of another)', () => {
  let a: TestServer;
  let b: TestServer;
  let key: string;
  const ask = { model: GATEWAY_MODEL, messages: [{ role: 'user' as const, content: 'Once upon a time' }], max_tokens: 30, temperature: 0 };

  before(async () => {
    a = await startServer();
    // B reaches A with a key of A's: non-stream answers take the fast lane; streams from a
    // deployment with a key stay canonical (see docs/decisions.md), which the frames must not show.
    const upstreamKey = (await createKey(a, 'downstream')).key;
    b = await startGateway(
      [{ baseUrl: a.baseURL, upstreamModel: 'local/stories260k', apiKeyEnv: 'UPSTREAM_KEY_A' }],
      { UPSTREAM_KEY_A: upstreamKey },
      { pricing: PRICING },
    );
    key = (await createKey(b, 'acme')).key;
  });
  after(async () => {
    await b?.close();
    await a?.close();
  });

  it('streams with the catalogue model, usage with its cost, and [DONE] last, after the usage record', async () => {
    const { frames, requestId, status } = await rawStream(b.url, key, { ...ask, stream_options: { include_usage: true } });
    assert.equal(status, 200);
    assert.equal(frames.at(-1)!.raw, '[DONE]');
    assert.equal(frames.filter((f) => f.raw === '[DONE]').length, 1);
    const chunks = frames.slice(0, -1);
    for (const c of chunks) {
      assert.equal(c.json!['model'], GATEWAY_MODEL, 'every chunk names the catalogue model, never the upstream one');
      assert.equal(c.json!['object'], 'chat.completion.chunk');
    }
    const usageChunk = chunks.at(-1)!.json!;
    assert.deepEqual(usageChunk['choices'], []);
    const usage = usageChunk['usage'] as { prompt_tokens: number; completion_tokens: number; cost: number };
    assert.equal(usage.completion_tokens, 30);
    assert.equal(usage.cost, (usage.prompt_tokens * 1 + usage.completion_tokens * 2) / 1e6);
    const finish = chunks.find((c) => (c.json!['choices'] as Array<{ finish_reason: string | null }>)[0]?.finish_reason);
    assert.equal((finish!.json!['choices'] as Array<{ finish_reason: string }>)[0]!.finish_reason, 'length');
    // The record was stored before [DONE] went out.
    const row = usageRow(b, requestId);
    assert.ok(row, 'a usage record for the request');
    assert.equal(row['output_tokens'], 30);
    assert.equal(row['cost'], usage.cost);
    assert.equal(row['status'], 200);
    assert.equal(row['estimated'], 0);
  });

  it('answers what the canonical lane answers, stream and non-stream', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: b.baseURL, maxRetries: 0 });
    // `store: true` takes the canonical lane (the completion is folded from canonical events).
    const canonical = await client.chat.completions.create({ ...ask, store: true });
    const fast = await client.chat.completions.create(ask);
    assert.equal(fast.choices[0]!.message.content, canonical.choices[0]!.message.content);
    assert.equal(fast.model, GATEWAY_MODEL);
    assert.deepEqual(
      { ...fast.usage, cost: (fast.usage as unknown as { cost: number }).cost },
      { ...canonical.usage, cost: (canonical.usage as unknown as { cost: number }).cost },
    );
    const { frames } = await rawStream(b.url, key, ask);
    assert.equal(contentOf(frames), canonical.choices[0]!.message.content);
    // Without include_usage no chunk carries usage.
    assert.ok(frames.every((f) => f.json === undefined || f.json['usage'] === undefined || f.json['usage'] === null));
  });
});

describe('the chat fast lane against upstreams that misbehave', () => {
  const c = closers();
  let gateway: TestServer;
  let key: string;
  let upstreamModelSeen: string | undefined;

  /** Upstream models, each one way an upstream's stream can differ from the plain one. */
  const upstream = (req: IncomingMessage, res: ServerResponse): void => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as { stream?: boolean; max_tokens?: number; messages: Array<{ content: string }> };
      const kind = body.messages[0]!.content;
      upstreamModelSeen = (JSON.parse(raw) as { model: string }).model;
      const head = { id: 'chatcmpl-up', object: 'chat.completion.chunk', created: 7, model: 'vendor-model-2026-01-01' };
      const frame = (o: object, spaced = false) => `data: ${spaced ? JSON.stringify(o).replace(/":/g, '": ') : JSON.stringify(o)}\n\n`;
      const delta = (content: string, finish: string | null = null) => ({
        ...head,
        choices: [{ index: 0, delta: { content }, finish_reason: finish }],
      });
      if (body.stream !== true && kind.startsWith('malformed ')) {
        // A whole answer that is JSON but not a chat completion: the rest of the message after the word.
        res.writeHead(200, { 'content-type': 'application/json' }).end(kind.slice('malformed '.length));
        return;
      }
      // Calls a tool the request may not have offered, then one it may have.
      const unofferedCalls = [
        { id: 'call_a', type: 'function', function: { name: 'delete_everything', arguments: '{"all":true}' } },
        { id: 'call_b', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
      ];
      if (body.stream !== true && kind.startsWith('calls-unoffered')) {
        res.writeHead(200, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            ...head,
            object: 'chat.completion',
            // Some servers finish a turn that called tools with `stop`.
            choices: [
              {
                index: 0,
                message: { role: 'assistant', content: null, tool_calls: unofferedCalls },
                finish_reason: kind === 'calls-unoffered-stop' ? 'stop' : 'tool_calls',
              },
            ],
            usage: { prompt_tokens: 4, completion_tokens: 9, total_tokens: 13 },
          }),
        );
        return;
      }
      if (body.stream !== true) {
        const text = kind === 'ignores-max' ? 'word '.repeat(2000) : 'a fine answer';
        // As OpenAI writes an answer; 'minimal' as some servers do, without what its schema requires
        // of them (created, logprobs, refusal).
        const minimal = kind === 'minimal';
        res.writeHead(200, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            ...head,
            ...(minimal && { created: undefined }),
            object: 'chat.completion',
            choices: [
              minimal
                ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }
                : { index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: 'stop' },
            ],
            usage:
              kind === 'ignores-max'
                ? { prompt_tokens: 37, completion_tokens: 2000, total_tokens: 2037 }
                : { prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 },
          }),
        );
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      switch (kind) {
        case 'ignores-max':
          // Sends 50 deltas whatever max_tokens says, in pieces that split frames mid-way.
          for (let i = 0; i < 50; i++) {
            const f = frame(delta(` w${i}`));
            res.write(f.slice(0, 20));
            res.write(f.slice(20));
          }
          res.end(`${frame(delta('', 'stop'))}data: [DONE]\n\n`);
          return;
        case 'one-long':
          // One delta far past a small max_tokens, then the upstream's own usage.
          res.write(frame(delta('z'.repeat(1000))));
          res.end(
            `${frame(delta('', 'stop'))}${frame({ ...head, choices: [], usage: { prompt_tokens: 4, completion_tokens: 250, total_tokens: 254 } })}data: [DONE]\n\n`,
          );
          return;
        case 'spaced':
          // Python-style JSON, usage inside the finish chunk rather than a chunk of its own.
          res.write(frame(delta('Hello'), true));
          res.write(frame(delta(' there'), true));
          res.end(
            `${frame({ ...delta('', 'stop'), usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 } }, true)}data: [DONE]\n\n`,
          );
          return;
        case 'spaced-decoy':
          // Valid JSON a string search would miss: a space before the colon, an escaped key.
          for (let i = 0; i < 20; i++) res.write(`data: {"choices":[{"index":0,"delta":{"content" : "${'x'.repeat(20)}"}}]}\n\n`);
          res.write(`data: {"choices":[{"index":0,"delta":{"\\u0063ontent":"${'y'.repeat(200)}"}}]}\n\n`);
          res.end('data: [DONE]\n\n');
          return;
        case 'model-spellings': {
          // Every way the model name can be written that a text splice could get wrong.
          const c = (i: number) => `"choices":[{"index":0,"delta":{"content":"c${i}"},"logprobs":null,"finish_reason":null}]`;
          const first = c(0).replace('"delta":{', '"delta":{"role":"assistant",');
          res.write(`data: {"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model" : "vendor-model",${first}}\n\n`);
          res.write(
            `data: {"id":"chatcmpl-up","model":"vendor-model","choices":[{"index":0,"delta":{"content":"say \\"model\\": x"}}]}\n\n`,
          );
          res.write(`data: {"id":"chatcmpl-up","model":"vendor\\/model",${c(2)}}\n\n`);
          res.write(`data: {"id":"chatcmpl-up","mod\\u0065l":"vendor-model","ext":{"model":"vendor-model"},${c(3)}}\n\n`);
          res.write(`data: {"id":"chatcmpl-up","model":"vendor-model","model":"other-model",${c(4)}}\n\n`);
          res.write(`data: {"id":"chatcmpl-up",\t"model":\t"vendor-model",${c(5)}}\n\n`);
          res.write(`data: {"id":"chatcmpl-up",\ndata: "model":"vendor-model",${c(6)}}\n\n`);
          res.write(`data: {"id":"chatcmpl-up",${c(7)}}\n\n`);
          res.end(
            `data: {"id":"chatcmpl-up","model":"vendor-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`,
          );
          return;
        }
        case 'sparse':
          // Chunks with nothing but their choices' deltas: no role, no index, no finish_reason until
          // the last (some servers write them so).
          res.write(`data: {"choices":[{"delta":{"content":"Once "}}]}\n\n`);
          res.write(`data: {"choices":[{"delta":{"content":"upon"}}]}\n\n`);
          res.end(`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`);
          return;
        case 'cr-lines': {
          // SSE lines may end with a lone CR as well as LF or CRLF: CR-only events, a CRLF split
          // between two writes, and events of two data lines (joined by a lone CR, and by a CRLF
          // split between two writes: read as a CR and a blank line, it would cut the event in two).
          // The network may join writes; test/chat-relay.test.ts splits the reads exactly.
          const j = (o: object) => JSON.stringify(o);
          // A BOM first, which SSE ignores.
          res.write(`\ufeffdata: ${j(delta('Once'))}\r\r`);
          res.write(`data: ${j(delta(' upon'))}\r`);
          res.write(`\n\r\ndata: ${j(delta(' a'))}\r\r`);
          res.write(`data: {"id":"chatcmpl-up",\rdata: "model":"vendor-model","choices":[{"index":0,"delta":{"content":" ti"}}]}\r\r`);
          res.write(`data: {"id":"chatcmpl-up",\r`);
          res.write(`\ndata: "model":"vendor-model","choices":[{"index":0,"delta":{"content":"me"}}]}\r\n\r\n`);
          res.end(`data: ${j(delta('', 'stop'))}\r\rdata: [DONE]\r\r`);
          return;
        }
        case 'cr-many':
          // 2,000 small CR-only events in one write: reads far larger than the 4 KiB line bound.
          res.end(
            `${Array.from({ length: 2000 }, (_, i) => `data: ${JSON.stringify(delta(i % 10 === 0 ? '.' : ''))}\r\r`).join('')}data: [DONE]\r\r`,
          );
          return;
        case 'calls-unoffered':
          res.write(frame({ ...head, choices: [{ index: 0, delta: { role: 'assistant', content: null }, finish_reason: null }] }));
          unofferedCalls.forEach((c, index) => {
            const start = { index, id: c.id, type: 'function', function: { name: c.function.name, arguments: '' } };
            res.write(frame({ ...head, choices: [{ index: 0, delta: { tool_calls: [start] }, finish_reason: null }] }));
            for (const piece of [c.function.arguments.slice(0, 5), c.function.arguments.slice(5)])
              res.write(
                frame({
                  ...head,
                  choices: [{ index: 0, delta: { tool_calls: [{ index, function: { arguments: piece } }] }, finish_reason: null }],
                }),
              );
          });
          res.end(`${frame({ ...head, choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] })}data: [DONE]\n\n`);
          return;
        case 'error-frame':
          res.write(frame(delta('Once')));
          res.end(`data: ${JSON.stringify({ error: { message: 'the engine fell over' } })}\n\n`);
          return;
        case 'cut-off':
          res.end(frame(delta('Once')));
          return;
        case 'no-done-empty':
          // An empty answer, closed after its finish chunk without [DONE].
          res.end(
            `${frame({ ...head, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] })}${frame(delta('', 'stop'))}`,
          );
          return;
        case 'no-done':
          // Closed after the finish chunk and usage, without [DONE], as some servers do.
          res.end(
            `${frame(delta('Once'))}${frame(delta(' more', 'stop'))}${frame({ ...head, choices: [], usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 } })}`,
          );
          return;
        default:
          res.end(`${frame(delta('fine', 'stop'))}data: [DONE]\n\n`);
      }
    });
  };

  before(async () => {
    const up = c.keep(await fixture(upstream));
    gateway = c.keep(
      await startGateway(
        [{ baseUrl: up.url, upstreamModel: 'vendor-model' }],
        // A small line bound: the CR-only stream below must pass it event by event, not read by read.
        { SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1', SWITCHYARD_UPSTREAM_MAX_LINE_BYTES: '4096' },
        { pricing: PRICING, capabilities: ['streaming', 'function_calling'] },
      ),
    );
    key = (await createKey(gateway, 'acme')).key;
  });
  after(() => c.closeAll());

  const ask = (kind: string, extra: object = {}) => ({
    model: GATEWAY_MODEL,
    messages: [{ role: 'user', content: kind }],
    ...extra,
  });

  it("opens a sparse upstream's stream with the assistant's role, each choice with its index and finish_reason, so the SDK's helpers work", async () => {
    // An outside pass: chat.completions.stream() failed with "missing role for choice 0" on the
    // fast lane, where the canonical lane (store: true) worked.
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const done = await client.chat.completions
      .stream(ask('sparse') as OpenAI.Chat.ChatCompletionCreateParamsStreaming)
      .finalChatCompletion();
    assert.equal(done.choices[0]!.message.content, 'Once upon');
    assert.equal(done.choices[0]!.message.role, 'assistant');
    assert.equal(done.choices[0]!.finish_reason, 'stop');
    const { frames } = await rawStream(gateway.url, key, ask('sparse'));
    const chunks = frames.slice(0, -1).map((f) => f.json!);
    const choices = chunks.map((c) => (c['choices'] as Array<Record<string, unknown>>)[0]!);
    assert.equal((choices[0]!['delta'] as { role?: string }).role, 'assistant');
    assert.ok(
      choices.slice(1).every((c) => (c['delta'] as { role?: string }).role === undefined),
      'the role once',
    );
    assert.ok(
      choices.every((c) => c['index'] === 0 && 'finish_reason' in c && c['logprobs'] === null),
      JSON.stringify(choices),
    );
  });

  it('holds an upstream that ignores max_tokens to it, stream and non-stream, and bills what was passed on', async () => {
    const { frames, requestId } = await rawStream(gateway.url, key, ask('ignores-max', { max_tokens: 5 }));
    assert.equal(upstreamModelSeen, 'vendor-model');
    const deltas = frames.filter((f) => {
      const ch = f.json?.['choices'] as Array<{ delta?: { content?: string } }> | undefined;
      return Boolean(ch?.[0]?.delta?.content);
    });
    assert.equal(deltas.length, 5, 'no more deltas than max_tokens');
    const finishes = frames.flatMap((f) => (f.json?.['choices'] as Array<{ finish_reason: string | null }> | undefined) ?? []);
    assert.deepEqual(
      finishes.filter((x) => x.finish_reason != null).map((x) => x.finish_reason),
      ['length'],
      'exactly one finish chunk',
    );
    assert.equal(frames.at(-1)!.raw, '[DONE]');
    const row = usageRow(gateway, requestId)!;
    assert.equal(row['output_tokens'], 5);
    assert.equal(row['estimated'], 1, 'the upstream sent no usage, so the count is an estimate');

    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const whole = await client.chat.completions.create({ ...ask('ignores-max'), max_tokens: 5 } as never);
    const completion = whole as unknown as OpenAI.Chat.ChatCompletion;
    assert.equal(completion.choices[0]!.finish_reason, 'length');
    assert.ok(completion.choices[0]!.message.content!.length <= 5 * 32, 'cut to the limit');
    assert.ok(completion.usage!.completion_tokens <= 5);
    // Its output count is past what was passed on; its count of the prompt still holds.
    assert.equal(completion.usage!.prompt_tokens, 37);
  });

  it('cuts one delta longer than the whole limit at the limit, in both lanes, and bills it', async () => {
    // It was dropped whole by the fast lane: an empty answer with finish `length`, billed no output.
    const texts: string[] = [];
    for (const store of [false, true]) {
      const { frames, requestId, status } = await rawStream(gateway.url, key, ask('one-long', { max_tokens: 4, store }));
      assert.equal(status, 200);
      texts.push(contentOf(frames));
      const finishes = frames.flatMap((f) => (f.json?.['choices'] as Array<{ finish_reason: string | null }> | undefined) ?? []);
      assert.deepEqual(
        finishes.filter((x) => x.finish_reason != null).map((x) => x.finish_reason),
        ['length'],
      );
      assert.equal(usageRow(gateway, requestId)!['output_tokens'], 4);
    }
    assert.deepEqual(texts, ['z'.repeat(4 * 32), 'z'.repeat(4 * 32)]);
  });

  it('counts output however the JSON is written, so the limit and the bill hold', async () => {
    const { frames, requestId } = await rawStream(gateway.url, key, ask('spaced-decoy', { max_tokens: 3 }));
    const text = contentOf(frames);
    assert.equal(text, 'x'.repeat(60), 'three deltas, then cut');
    const finishes = frames.flatMap((f) => (f.json?.['choices'] as Array<{ finish_reason: string | null }> | undefined) ?? []);
    assert.deepEqual(
      finishes.filter((x) => x.finish_reason != null).map((x) => x.finish_reason),
      ['length'],
    );
    assert.equal(usageRow(gateway, requestId)!['output_tokens'], 3);
  });

  it('ends every stream with exactly one finish chunk, before the usage chunk', async () => {
    for (const kind of ['plain', 'spaced']) {
      const { frames } = await rawStream(gateway.url, key, ask(kind, { stream_options: { include_usage: true } }));
      const chunks = frames.slice(0, -1).map((f) => f.json!);
      const withFinish = chunks.filter((c) =>
        (c['choices'] as Array<{ finish_reason: string | null }>).some((x) => x.finish_reason != null),
      );
      assert.equal(withFinish.length, 1, `${kind}: ${JSON.stringify(chunks)}`);
      assert.equal(chunks.indexOf(withFinish[0]!), chunks.length - 2, `${kind}: the finish chunk comes just before the usage chunk`);
      // This upstream's chunks have no logprobs and no usage member: put in as openai-wire.md has them.
      for (const c of chunks.slice(0, -1)) {
        assert.ok(c['usage'] === null, `${kind}: usage null before the usage chunk: ${JSON.stringify(c)}`);
        assert.ok(
          (c['choices'] as Array<Record<string, unknown>>).every((x) => x['logprobs'] === null),
          JSON.stringify(c),
        );
      }
      // Switchyard's own id, the same throughout (an upstream's need not be unique), and its own time.
      const ids = new Set(chunks.map((c) => c['id']));
      assert.equal(ids.size, 1, `${kind}: one id throughout`);
      assert.match(String(chunks[0]!['id']), /^chatcmpl-[0-9a-f]{32}$/, kind);
      assert.ok(
        chunks.every((c) => c['created'] !== 7 && typeof c['created'] === 'number'),
        `${kind}: Switchyard's time`,
      );
    }
  });

  it('reads JSON with spaces and usage inside the finish chunk, and still sends usage last', async () => {
    const { frames } = await rawStream(gateway.url, key, ask('spaced', { stream_options: { include_usage: true } }));
    assert.equal(contentOf(frames), 'Hello there');
    const chunks = frames.slice(0, -1).map((f) => f.json!);
    for (const ch of chunks) assert.equal(ch['model'], GATEWAY_MODEL);
    const withUsage = chunks.filter((ch) => ch['usage'] !== null && ch['usage'] !== undefined);
    assert.equal(withUsage.length, 1, 'usage only in the last chunk');
    assert.equal(withUsage[0], chunks.at(-1));
    assert.deepEqual(withUsage[0]!['choices'], []);
    assert.equal((withUsage[0]!['usage'] as { completion_tokens: number }).completion_tokens, 2);
    assert.equal((withUsage[0]!['usage'] as { cost: number }).cost, (4 * 1 + 2 * 2) / 1e6);
  });

  it('names the catalogue model in every chunk however the upstream wrote its own, and changes nothing else', async () => {
    const res = await request(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ ...ask('model-spellings'), stream: true }),
    });
    const text = await res.body.text();
    assert.ok(!text.includes('\r'), 'no CR reaches the client, where it would end a line');
    const { frames } = await rawStream(gateway.url, key, ask('model-spellings'));
    const chunks = frames.slice(0, -1).map((f) => f.json!);
    assert.equal(frames.at(-1)!.raw, '[DONE]');
    assert.equal(chunks.length, 9);
    for (const ch of chunks) assert.equal(ch['model'], GATEWAY_MODEL, JSON.stringify(ch));
    assert.equal(contentOf(frames), 'c0say "model": xc2c3c4c5c6c7');
    assert.deepEqual(chunks[3]!['ext'], { model: 'vendor-model' }, "a nested field of the same name is the upstream's own");
    const first = chunks[0]!;
    assert.equal(
      frames[0]!.raw,
      `{"id":"${String(first['id'])}","object":"chat.completion.chunk","created":${String(first['created'])},"model" : "${GATEWAY_MODEL}","choices":[{"index":0,"delta":{"role":"assistant","content":"c0"},"logprobs":null,"finish_reason":null}]}`,
      "the upstream's text as it was, but for the name, the id and the time",
    );
    assert.notEqual(first['id'], 'chatcmpl-up');
  });

  it('reads SSE lines ended by a lone CR, and a CRLF split between two reads', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    let text = '';
    let finish: string | null | undefined;
    const stream = await client.chat.completions.create({
      ...ask('cr-lines'),
      stream: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish ??= chunk.choices[0]?.finish_reason;
      assert.equal(chunk.model, GATEWAY_MODEL);
    }
    assert.equal(text, 'Once upon a time');
    assert.equal(finish, 'stop');
    // The canonical lane (`store: true`) reads the same stream the same way.
    const stored = await client.chat.completions.create({
      ...ask('cr-lines'),
      store: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    assert.equal(stored.choices[0]?.message.content, 'a fine answer', 'non-stream upstream answer');
    let canonical = '';
    const storedStream = await client.chat.completions.create({
      ...ask('cr-lines'),
      stream: true,
      store: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    for await (const chunk of storedStream) canonical += chunk.choices[0]?.delta.content ?? '';
    assert.equal(canonical, text);
    const { frames } = await rawStream(gateway.url, key, ask('cr-lines'));
    assert.equal(frames.at(-1)!.raw, '[DONE]');
    assert.ok(frames.every((f) => !f.raw.includes('\r')));
    // Many small CR-only events in large reads are held to the line bound one event at a time, in both lanes.
    for (const store of [false, true]) {
      let dots = '';
      const many = await client.chat.completions.create({
        ...ask('cr-many'),
        stream: true,
        store,
      } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
      for await (const chunk of many) dots += chunk.choices[0]?.delta.content ?? '';
      assert.equal(dots, '.'.repeat(200), store ? 'canonical lane' : 'fast lane');
    }
  });

  it('turns an upstream error frame or a cut-off stream into an error the SDK throws, and records it', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    for (const kind of ['error-frame', 'cut-off']) {
      const stream = await client.chat.completions.create({
        ...ask(kind),
        stream: true,
      } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
      let text = '';
      await assert.rejects(
        (async () => {
          for await (const ch of stream) text += ch.choices[0]?.delta.content ?? '';
        })(),
        (err: unknown) => err instanceof OpenAI.APIError,
        kind,
      );
      assert.equal(text, 'Once', kind);
    }
    const db = new SqliteDatabase(join(gateway.dataDir, 'switchyard.db'), { readonly: true });
    const failed = db.prepare("select count(*) as n from usage_records where status >= 500 and error_code = 'upstream_error'").get() as {
      n: number;
    };
    db.close();
    assert.ok(failed.n >= 2, 'both failures have a usage record');
  });

  it('takes a stream closed after its finish reason without [DONE] as complete, in both lanes', async () => {
    for (const store of [false, true]) {
      const { frames, status } = await rawStream(gateway.url, key, {
        ...ask('no-done', { store }),
        stream_options: { include_usage: true },
      });
      assert.equal(status, 200);
      assert.equal(contentOf(frames), 'Once more', `store: ${store}`);
      assert.equal(frames.at(-1)?.raw, '[DONE]', `store: ${store}`);
      const usage = frames.at(-2)?.json?.['usage'] as { completion_tokens?: number } | undefined;
      assert.equal(usage?.completion_tokens, 2, `store: ${store}`);
      assert.ok(!frames.some((f) => f.json?.['error'] !== undefined), `store: ${store}`);
    }
    // An empty answer ended that way: its own role and finish chunks, in the stream's id, then [DONE].
    const { frames, status } = await rawStream(gateway.url, key, ask('no-done-empty'));
    assert.equal(status, 200);
    const finishes = frames.filter(
      (f) => (f.json?.['choices'] as Array<{ finish_reason?: string | null }> | undefined)?.[0]?.finish_reason,
    );
    assert.equal(finishes.length, 1);
    assert.equal(finishes[0]!.json!['id'], frames[0]!.json!['id']);
    assert.match(String(finishes[0]!.json!['id']), /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(frames.at(-1)?.raw, '[DONE]');
    assert.ok(!frames.some((f) => f.json?.['error'] !== undefined));
  });

  it('answers 502 for a whole answer that is not a chat completion, in both lanes, instead of passing it on', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const message = (m: object) => JSON.stringify({ ...m, role: 'assistant' });
    const answers = [
      '{}',
      '{"choices":null}',
      '{"choices":[]}',
      '{"choices":[{"index":0,"message":null}]}',
      `{"choices":[{"index":0,"message":${message({ content: { a: 1 } })}}]}`,
      `{"choices":[{"index":0,"message":${message({ content: 'x', tool_calls: 'x' })}}]}`,
      `{"choices":[{"index":0,"message":${message({ content: 'x' })},"finish_reason":42}]}`,
    ];
    for (const answer of answers) {
      // store: true folds the answer from canonical events (the canonical lane); without it the fast lane reads it.
      for (const store of [false, true]) {
        await assert.rejects(
          client.chat.completions.create({ ...ask(`malformed ${answer}`), store } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming),
          (err: unknown) => {
            assert.ok(err instanceof OpenAI.APIError, answer);
            assert.equal(err.status, 502, answer);
            assert.equal(err.code, 'upstream_error', answer);
            assert.match(err.message, /not a chat completion/, answer);
            return true;
          },
        );
      }
    }
  });

  it('suppresses calls to tools the request did not offer, stream and non-stream, as the canonical lane does', async () => {
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: key, maxRetries: 0 });
    const weather = {
      type: 'function' as const,
      function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
    };
    const messages = [{ role: 'user' as const, content: 'calls-unoffered' }];
    for (const tools of [[weather], undefined]) {
      const offered = tools !== undefined;
      const expected = offered ? [['get_weather', '{"city":"Paris"}']] : [];
      const finish = offered ? 'tool_calls' : 'stop';
      const whole = await client.chat.completions.create({ model: GATEWAY_MODEL, messages, ...(tools && { tools }) });
      const choice = whole.choices[0]!;
      assert.deepEqual(
        (choice.message.tool_calls ?? []).map((c) => (c.type === 'function' ? [c.function.name, c.function.arguments] : [])),
        expected,
      );
      assert.equal(choice.finish_reason, finish);
      const stream = await client.chat.completions.create({ model: GATEWAY_MODEL, messages, stream: true, ...(tools && { tools }) });
      const calls = new Map<number, [string, string]>();
      let streamFinish: string | null = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        for (const t of c?.delta.tool_calls ?? []) {
          const [name, args] = calls.get(t.index) ?? ['', ''];
          calls.set(t.index, [name + (t.function?.name ?? ''), args + (t.function?.arguments ?? '')]);
        }
        streamFinish = c?.finish_reason ?? streamFinish;
      }
      assert.deepEqual([...calls.values()], expected);
      assert.equal(streamFinish, finish);
      // A non-stream turn that called tools but finished with `stop`: still a turn for tool calls
      // where a call passed, as in the canonical lane.
      const stopped = await client.chat.completions.create({
        model: GATEWAY_MODEL,
        messages: [{ role: 'user', content: 'calls-unoffered-stop' }],
        ...(tools && { tools }),
      });
      assert.equal(stopped.choices[0]!.finish_reason, finish);
    }
  });

  it('answers a non-stream request with the upstream completion under the catalogue model and metered usage', async () => {
    const res = await request(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(ask('plain')),
    });
    const raw = await res.body.text();
    const body = JSON.parse(raw) as Record<string, unknown>;
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['content-type'], 'application/json; charset=utf-8');
    assert.equal(body['model'], GATEWAY_MODEL);
    // Switchyard's own id and time, as on the canonical lane: an upstream's ids need not be unique.
    assert.match(String(body['id']), /^chatcmpl-[0-9a-f]{32}$/);
    assert.ok(typeof body['created'] === 'number' && body['created'] > 7);
    const usage = body['usage'] as { prompt_tokens: number; completion_tokens: number; cost: number };
    assert.deepEqual([usage.prompt_tokens, usage.completion_tokens, usage.cost], [4, 3, (4 + 6) / 1e6]);
    // The upstream's own text, but for the name, id, time and usage (key order and all).
    const upstreamText = JSON.stringify({
      id: body['id'],
      object: 'chat.completion',
      created: body['created'],
      model: GATEWAY_MODEL,
      choices: [
        { index: 0, message: { role: 'assistant', content: 'a fine answer', refusal: null }, logprobs: null, finish_reason: 'stop' },
      ],
      usage,
    });
    assert.equal(raw, upstreamText);
    // An upstream that leaves out what the schema requires (created, logprobs, refusal): the client gets them.
    const minimal = await request(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(ask('minimal')),
    });
    const m = (await minimal.body.json()) as {
      id: string;
      created: number;
      choices: Array<{ logprobs: unknown; message: { refusal: unknown; content: string } }>;
    };
    assert.match(m.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.notEqual(m.id, body['id'], 'one id per completion');
    assert.equal(typeof m.created, 'number');
    assert.deepEqual([m.choices[0]!.logprobs, m.choices[0]!.message.refusal, m.choices[0]!.message.content], [null, null, 'a fine answer']);
  });
});

describe('the chat fast lane fails over while nothing was generated', () => {
  const c = closers();
  let calls = 0;
  after(() => c.closeAll());

  it('moves to the next try when an upstream sends its role chunk and dies', async () => {
    const up = c.keep(
      await fixture((req, res) => {
        req.resume();
        req.on('end', () => {
          calls++;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          // Each try's chunks are told apart by their fingerprint (the id and time are Switchyard's own).
          const head = {
            id: `chatcmpl-${calls}`,
            object: 'chat.completion.chunk',
            created: 7,
            model: 'm',
            system_fingerprint: `fp_${calls}`,
          };
          const frame = (delta: object, finish: string | null = null) =>
            `data: ${JSON.stringify({ ...head, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
          // The first try sends the role chunk (as vLLM does before it generates) and breaks off.
          if (calls === 1) res.write(frame({ role: 'assistant', content: '' }), () => res.destroy());
          else res.end(`${frame({ role: 'assistant', content: '' })}${frame({ content: 'second try' }, 'stop')}data: [DONE]\n\n`);
        });
      }),
    );
    const gateway = c.keep(await startGateway([{ baseUrl: up.url }]));
    const key = (await createKey(gateway, 'acme')).key;
    const { frames, status } = await rawStream(gateway.url, key, { model: GATEWAY_MODEL, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(status, 200);
    assert.equal(calls, 2);
    assert.equal(contentOf(frames), 'second try');
    assert.ok(
      frames.every((f) => f.json === undefined || f.json['system_fingerprint'] === 'fp_2'),
      'nothing of the failed try reached the client',
    );
  });
});
