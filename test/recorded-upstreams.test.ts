import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import pino from 'pino';
import { loadConfig, PACKAGE_ROOT, upstreamOptions } from '../src/config.js';
import { UpstreamEngine } from '../src/engines/upstream/upstream-engine.js';
import { newTally, type GenerationEvent, type GenerationRequest, type Usage } from '../src/core/canonical.js';
import { closers, fixture } from './helpers/fixtures.js';
import { createKey, startServer, tempDir, type TestServer } from './helpers/server.js';
import { eventSchemas, responseResource, valid } from './helpers/open-responses.js';

/**
 * The upstream engine against streams in the shapes other servers send (test/fixtures/upstream:
 * OpenAI, vLLM, llama.cpp's llama-server, Ollama, a routing provider with CRLF framing and comment
 * lines, the Responses API), not against a Switchyard: a bug shared by our chat renderer and our chat
 * reader would cancel out there and shows here. Each is replayed in 7-byte pieces, so every SSE
 * line and UTF-8 sequence is split somewhere; expected.json says what each one means.
 */

const DIR = join(PACKAGE_ROOT, 'test', 'fixtures', 'upstream');

interface Expected {
  api: 'chat' | 'responses';
  stream: boolean;
  text: string;
  reasoning?: string;
  toolCalls?: Array<{ id: string; name: string; arguments: string }>;
  finish: string;
  usage: Pick<Usage, 'input' | 'cached' | 'output' | 'reasoning'>;
}

const expected = JSON.parse(readFileSync(join(DIR, 'expected.json'), 'utf8')) as Record<string, Expected>;
const names = Object.keys(expected);

/**
 * The model id a fixture is served under in the gateway, one per file: the recorded answer and the
 * recorded stream of one exchange (`openai-chat-tools.json`, `.sse`) are two models, where they used
 * to be two deployments of one, and a request could be answered by either.
 */
const modelOf = (name: string) => `openai/recorded-${name.replace(/[^a-z0-9-]/g, '-')}`;

/** Serves /<fixture>/v1/{chat/completions,responses} from the file, in small pieces; keeps each request body. */
function replay(requests: Map<string, Record<string, unknown>>) {
  return (req: IncomingMessage, res: ServerResponse) => {
    const name = decodeURIComponent(req.url?.split('/')[1] ?? '');
    let body = '';
    req.on('data', (d: Buffer) => {
      body += d.toString();
    });
    req.on('end', () => {
      if (!(name in expected)) {
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"no such fixture"}}');
        return;
      }
      requests.set(name, JSON.parse(body) as Record<string, unknown>);
      const bytes = readFileSync(join(DIR, name));
      res.writeHead(200, { 'content-type': name.endsWith('.json') ? 'application/json' : 'text/event-stream' });
      let at = 0;
      const next = () => {
        if (at >= bytes.length) return void res.end();
        res.write(bytes.subarray(at, (at += 7)));
        setImmediate(next);
      };
      next();
    });
  };
}

function request(stream: boolean): GenerationRequest {
  return {
    model: 'm',
    messages: [{ role: 'user', content: 'Hi' }],
    sampling: {},
    maxOutputTokens: 256,
    stream,
    signal: new AbortController().signal,
    tally: newTally(),
    tools: [
      { name: 'get_weather', parameters: { type: 'object' } },
      { name: 'get_time', parameters: { type: 'object' } },
    ],
  };
}

/** Canonical events folded into what expected.json describes. */
function fold(events: GenerationEvent[]) {
  let text = '';
  let reasoning = '';
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  let finish = '';
  let usage: Usage | undefined;
  for (const e of events) {
    if (e.type === 'text.delta') text += e.text;
    else if (e.type === 'reasoning.delta') reasoning += e.text;
    else if (e.type === 'tool_call.start') calls[e.index] = { id: e.id, name: e.name, arguments: '' };
    else if (e.type === 'tool_call.delta') calls[e.index]!.arguments += e.arguments;
    else if (e.type === 'usage') usage = e.usage;
    else if (e.type === 'finish') finish = e.reason;
  }
  return { text, reasoning, calls, finish, usage };
}

describe('the upstream engine against recorded upstream streams', () => {
  const c = closers();
  const requests = new Map<string, Record<string, unknown>>();
  let base = '';
  let engine: UpstreamEngine;
  before(async () => {
    const upstream = c.keep(await fixture(replay(requests)));
    base = upstream.url.replace(/\/v1$/, '');
    engine = new UpstreamEngine(pino({ level: 'silent' }), upstreamOptions(loadConfig({ env: {} })));
    c.add(() => engine.close());
  });
  after(() => c.closeAll());

  it('has a fixture file for every expectation and the other way round', () => {
    const files = readdirSync(DIR).filter((f) => f !== 'expected.json');
    assert.deepEqual(files.sort(), [...names].sort());
  });

  for (const name of names) {
    const x = expected[name]!;
    it(`reads ${name} into the canonical events it means`, async () => {
      const events: GenerationEvent[] = [];
      const req = request(x.stream);
      for await (const e of engine.generate(req, {
        engine: 'upstream',
        id: name,
        baseUrl: `${base}/${name}/v1`,
        apiKey: 'sk-upstream',
        upstreamModel: 'their-model',
        api: x.api,
        guarded: false,
      })) {
        events.push(e);
      }
      const got = fold(events);
      assert.equal(got.text, x.text);
      assert.equal(got.reasoning, x.reasoning ?? '');
      assert.deepEqual(got.calls, x.toolCalls ?? []);
      assert.equal(got.finish, x.finish);
      assert.deepEqual(
        { input: got.usage?.input, cached: got.usage?.cached, output: got.usage?.output, reasoning: got.usage?.reasoning },
        x.usage,
      );
      assert.notEqual(got.usage?.estimated, true, 'the upstream reported usage, so nothing is estimated');
      // No recording writes to a prompt cache.
      const { cacheWrite = 0, ...tally } = req.tally;
      assert.deepEqual(tally, { ...x.usage, exact: true }, 'the tally billing reads ends where the usage does');
      assert.equal(cacheWrite, 0);
      // Events come in the canonical order: usage, then finish, last.
      assert.deepEqual(
        events.slice(-2).map((e) => e.type),
        ['usage', 'finish'],
      );

      // What was sent: the upstream's own model name, streaming with usage where the wire has it.
      const sent = requests.get(name)!;
      assert.equal(sent['model'], 'their-model');
      if (x.api === 'chat' && x.stream) assert.deepEqual(sent['stream_options'], { include_usage: true });
      if (x.api === 'responses') assert.equal(sent['stream'], true);
    });
  }
});

describe('the gateway re-rendering recorded upstream streams, read by the openai SDK', () => {
  const c = closers();
  let server: TestServer;
  let client: OpenAI;
  before(async () => {
    const upstream = c.keep(await fixture(replay(new Map())));
    const base = upstream.url.replace(/\/v1$/, '');
    server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        configFile: {
          name: 'recorded.json',
          text: JSON.stringify({
            defaultCatalogue: false,
            models: names.map((n) => ({
              id: modelOf(n),
              context_length: 8192,
              capabilities: ['streaming', 'function_calling', 'reasoning'],
            })),
            deployments: names.map((n, i) => ({ id: `r${i}`, model: modelOf(n), baseUrl: `${base}/${n}/v1`, api: expected[n]!.api })),
          }),
        },
      }),
    );
    client = new OpenAI({ apiKey: (await createKey(server, 'recorded')).key, baseURL: server.baseURL, maxRetries: 0 });
  });
  after(() => c.closeAll());

  const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = ['get_weather', 'get_time'].map((name) => ({
    type: 'function',
    function: { name, parameters: { type: 'object' } },
  }));
  const finishOf: Record<string, string> = { stop: 'stop', length: 'length', tool_calls: 'tool_calls' };

  for (const name of names) {
    const x = expected[name]!;
    it(`${name}: the same text, reasoning, tool calls, finish and usage through chat completions`, async () => {
      const params = { model: modelOf(name), messages: [{ role: 'user' as const, content: 'Hi' }], tools };
      let reasoning = '';
      let done: OpenAI.Chat.Completions.ChatCompletion;
      if (x.stream) {
        const stream = client.chat.completions.stream({ ...params, stream_options: { include_usage: true } });
        for await (const chunk of stream)
          reasoning += (chunk.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '';
        done = await stream.finalChatCompletion();
      } else {
        done = await client.chat.completions.create(params);
        reasoning = (done.choices[0]?.message as { reasoning_content?: string } | undefined)?.reasoning_content ?? '';
      }
      const choice = done.choices[0]!;
      assert.equal(choice.message.content ?? '', x.text);
      assert.equal(reasoning, x.reasoning ?? '');
      assert.deepEqual(
        (choice.message.tool_calls ?? []).map((t) =>
          t.type === 'function' ? { id: t.id, name: t.function.name, arguments: t.function.arguments } : t,
        ),
        x.toolCalls ?? [],
      );
      assert.equal(choice.finish_reason, finishOf[x.finish]);
      assert.equal(done.usage?.prompt_tokens, x.usage.input);
      assert.equal(done.usage?.completion_tokens, x.usage.output);
      assert.equal(done.usage?.prompt_tokens_details?.cached_tokens ?? 0, x.usage.cached);
    });

    // The Responses endpoint always streams from its upstream, so it replays only the streams.
    if (!x.stream) continue;
    it(`${name}: the same through the Responses API (streamed)`, async () => {
      const stream = client.responses.stream({
        model: modelOf(name),
        input: 'Hi',
        tools: tools.map((t) => ({
          type: 'function',
          name: t.type === 'function' ? t.function.name : '',
          parameters: { type: 'object' },
          strict: false,
        })),
      });
      // Every event and the final object, held to the Open Responses schemas, whatever the upstream spoke.
      for await (const ev of stream) {
        const v = eventSchemas.get(ev.type);
        assert.ok(v, `no Open Responses schema for ${ev.type}`);
        valid(v, ev, ev.type);
      }
      const r = await stream.finalResponse();
      valid(responseResource, r, 'response');
      assert.equal(r.output_text, x.text);
      const calls = r.output
        .filter((o) => o.type === 'function_call')
        .map((o) => ({ id: o.call_id, name: o.name, arguments: o.arguments }));
      assert.deepEqual(calls, x.toolCalls ?? []);
      assert.equal(r.status, x.finish === 'length' ? 'incomplete' : 'completed');
      assert.equal(r.usage?.input_tokens, x.usage.input);
      assert.equal(r.usage?.output_tokens, x.usage.output);
      assert.equal(r.usage?.output_tokens_details.reasoning_tokens, x.usage.reasoning);
    });
  }
});
