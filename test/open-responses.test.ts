import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { PACKAGE_ROOT } from '../src/config.js';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { chunkFrame, closers, completionJson, fixture, jsonFixture, startCatalogueGateway } from './helpers/fixtures.js';
import { createKey, http, readSse, startServer, tempDir, type TestServer } from './helpers/server.js';
import { checkStream } from './helpers/responses.js';
import { eventually } from './helpers/wait.js';
import { eventSchemas, responseResource, valid, validator } from './helpers/open-responses.js';
import { once } from 'node:events';
import { WebSocket } from 'ws';

/**
 * What the server emits on /v1/responses, validated against the Open Responses specification's own
 * OpenAPI document (shared/spec/open-responses/openapi.json, release 2026-04-24), not against our
 * types: the response object, and every stream event by the schema its `type` names.
 */

const MODEL = 'local/stories260k';

describe("Open Responses: what the server emits matches the specification's schemas", () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  before(async () => {
    assert.ok(eventSchemas.size >= 20, `event schemas found: ${[...eventSchemas.keys()].join(', ')}`);
    server = c.keep(await startServer());
    key = (await createKey(server, 'open-responses')).key;
  });
  after(() => c.closeAll());

  it("a response object, with every required field and the request's values echoed", async () => {
    const r = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: {
        model: MODEL,
        input: 'Once upon a time',
        max_output_tokens: 8,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        top_logprobs: 0,
        max_tool_calls: 3,
        service_tier: 'auto',
        safety_identifier: 'user-123',
        prompt_cache_key: 'stories',
        text: { format: { type: 'text' }, verbosity: 'low' },
      },
    });
    assert.equal(r.status, 200, r.text);
    valid(responseResource, r.json, 'response');
    const o = r.json as unknown as Record<string, unknown>;
    assert.equal(o['presence_penalty'], 0.5);
    assert.equal(o['frequency_penalty'], 0.25);
    assert.equal(o['top_logprobs'], 0);
    assert.equal(o['max_tool_calls'], 3);
    assert.equal(o['service_tier'], 'default', 'the tier that was used');
    assert.equal(o['safety_identifier'], 'user-123');
    assert.equal(o['prompt_cache_key'], 'stories');
    assert.deepEqual(o['text'], { format: { type: 'text' }, verbosity: 'low' });

    // The same object read back, and one with defaults only.
    const got = await http(server.url, 'GET', `/v1/responses/${String(o['id'])}`, { key });
    valid(responseResource, got.json, 'retrieved response');
    const plain = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'Once', max_output_tokens: 3 } });
    valid(responseResource, plain.json, 'response with defaults');
  });

  for (const [label, extra] of [
    ['text', {}],
    [
      'structured output',
      {
        text: {
          format: {
            type: 'json_schema',
            name: 'flag',
            strict: true,
            schema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false },
          },
        },
      },
    ],
  ] as const) {
    it(`every stream event (${label}) by the schema of its type`, async () => {
      const { status, events, done } = await readSse(server.url, 'POST', '/v1/responses', {
        key,
        body: { model: MODEL, input: 'Once upon a time', max_output_tokens: 12, stream: true, ...extra },
      });
      assert.equal(status, 200);
      // "The terminal event MUST be the literal string [DONE]" (Streaming HTTP Responses).
      assert.ok(done, 'the stream ends with data: [DONE]');
      const parsed = checkStream(events);
      for (const e of parsed) {
        const v = eventSchemas.get(e.type);
        assert.ok(v, `no schema for event ${e.type}`);
        valid(v, e, e.type);
      }
    });
  }

  it('lists input and conversation items as the item schemas require, status included', async () => {
    const input = [
      { type: 'message', role: 'user', content: 'What is the weather in Paris?' },
      { type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'Be brief.' }] },
      { type: 'reasoning', summary: [{ type: 'summary_text', text: 'Look it up.' }] },
      { type: 'function_call', call_id: 'call_1', name: 'weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '{"temp":21}' },
    ];
    const r = await http<{ id: string }>(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input, max_output_tokens: 3 },
    });
    assert.equal(r.status, 200, r.text);
    const item = validator('ItemField');
    const listed = await http<{ data: Array<{ type: string; status?: string }> }>(
      server.url,
      'GET',
      `/v1/responses/${r.json.id}/input_items`,
      {
        key,
      },
    );
    assert.equal(listed.json.data.length, input.length);
    for (const i of listed.json.data) {
      valid(item, i, `input item ${i.type}`);
      assert.equal(i.status, 'completed');
    }
    const conv = await http<{ id: string }>(server.url, 'POST', '/v1/conversations', { key, body: { items: input } });
    await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'And tomorrow?', conversation: conv.json.id, max_output_tokens: 3 },
    });
    const items = await http<{ data: Array<{ type: string }> }>(server.url, 'GET', `/v1/conversations/${conv.json.id}/items?limit=100`, {
      key,
    });
    assert.equal(items.json.data.length, input.length + 2);
    for (const i of items.json.data) valid(item, i, `conversation item ${i.type}`);
    // A status the items do not have is refused, naming the field.
    const bad = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ type: 'message', role: 'user', content: 'x', status: 'done' }] },
    });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, 'input[0].status');
  });

  it('refuses what it cannot do with a 400 naming the parameter, never a silent null', async () => {
    const logprobs = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'x', top_logprobs: 2 } });
    assert.equal(logprobs.status, 400);
    assert.equal(logprobs.json.error.param, 'top_logprobs');
    const chat = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: MODEL, messages: [{ role: 'user', content: 'x' }], logprobs: true },
    });
    assert.equal(chat.status, 400);
    assert.equal(chat.json.error.param, 'logprobs');
    const chatTop = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: MODEL, messages: [{ role: 'user', content: 'x' }], logprobs: false, top_logprobs: 3 },
    });
    assert.equal(chatTop.json.error.param, 'top_logprobs');
    // Parameters that would change the answer and that nothing here applies: each a 400 naming it.
    const refused: Array<[string, Record<string, unknown>, string]> = [
      ['/v1/responses', { model: MODEL, input: 'x', include: ['message.output_text.logprobs'] }, 'include'],
      ['/v1/responses', { model: MODEL, input: 'x', prompt: { id: 'pmpt_1' } }, 'prompt'],
      ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], logit_bias: { '300': 100 } }, 'logit_bias'],
      ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], logit_bias: { abc: 100 } }, 'logit_bias'],
      [
        '/v1/chat/completions',
        { model: MODEL, messages: [{ role: 'user', content: 'x' }], functions: [{ name: 'f', parameters: { type: 'object' } }] },
        'functions',
      ],
      ['/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], function_call: { name: 'f' } }, 'function_call'],
    ];
    for (const [path, body, param] of refused) {
      const r = await http(server.url, 'POST', path, { key, body });
      assert.equal(r.status, 400, `${param}: ${r.text}`);
      assert.equal(r.json.error.param, param);
      assert.equal(r.json.error.code, 'unsupported_parameter');
    }
    // Empty or null, they ask for nothing and are accepted.
    const empty = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: {
        model: MODEL,
        messages: [{ role: 'user', content: 'x' }],
        logit_bias: {},
        functions: [],
        function_call: 'none',
        max_tokens: 1,
      },
    });
    assert.equal(empty.status, 200, empty.text);
  });

  it('refuses a malformed `text` and lists every format type in the error', async () => {
    const bogus = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'x', text: { type: 'bogus' } } });
    assert.equal(bogus.status, 400, bogus.text);
    const badType = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'x', text: { format: { type: 'bogus' } } },
    });
    assert.equal(badType.status, 400);
    assert.match(badType.json.error.message, /json_schema/);
    assert.match(badType.json.error.message, /json_object/);
  });

  it('takes a json_schema format without a name or a schema, as the specification allows (any JSON document)', async () => {
    for (const format of [{ type: 'json_schema' }, { type: 'json_schema', schema: { type: 'object' } }]) {
      const res = await http(server.url, 'POST', '/v1/responses', {
        key,
        body: { model: MODEL, input: 'x', max_output_tokens: 40, text: { format } },
      });
      assert.equal(res.status, 200, res.text);
      const body = res.json as unknown as { status: string; output_text?: string; output: Array<{ content?: Array<{ text: string }> }> };
      valid(responseResource, body, 'response');
      const echoed = (body as unknown as { text: { format: { type: string; name: string } } }).text.format;
      assert.deepEqual([echoed.type, echoed.name], ['json_schema', ''], 'the name echoes as ""');
      if (body.status === 'completed') JSON.parse(body.output.at(-1)!.content![0]!.text);
    }
  });
});

describe('Open Responses: item_reference', () => {
  const c = closers();
  let server: TestServer;
  before(async () => {
    server = c.keep(await startServer());
  });
  after(() => c.closeAll());

  it("resolves any item its organization stored, without chaining, and no other organization's", async () => {
    const { key } = await createKey(server, 'refs');
    const { key: other } = await createKey(server, 'someone-else');
    const first = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'Once upon a time', max_output_tokens: 4 },
    });
    assert.equal(first.status, 200, first.text);
    const output = (first.json as unknown as { id: string; output: Array<{ id: string; type: string }> }).output;
    const message = output.find((o) => o.type === 'message')!;
    const inputs = await http<{ data: Array<{ id: string }> }>(
      server.url,
      'GET',
      `/v1/responses/${(first.json as unknown as { id: string }).id}/input_items`,
      { key },
    );

    // Neither previous_response_id nor a conversation: the references name a stored response's items.
    const refs = [
      { type: 'item_reference', id: inputs.json.data[0]!.id },
      { type: 'item_reference', id: message.id },
      { role: 'user', content: 'The end.' },
    ];
    const next = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: refs, max_output_tokens: 4 } });
    assert.equal(next.status, 200, next.text);
    const seen = await http<{ data: Array<{ id: string }> }>(
      server.url,
      'GET',
      `/v1/responses/${(next.json as unknown as { id: string }).id}/input_items?order=asc`,
      { key },
    );
    assert.deepEqual(
      seen.json.data.slice(0, 2).map((i) => i.id),
      [inputs.json.data[0]!.id, message.id],
    );

    const foreign = await http(server.url, 'POST', '/v1/responses', {
      key: other,
      body: { model: MODEL, input: refs, max_output_tokens: 4 },
    });
    assert.equal(foreign.status, 404);
    assert.equal(foreign.json.error.param, 'input[0].id');
    const missing = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ type: 'item_reference', id: 'msg_nope' }], max_output_tokens: 4 },
    });
    assert.equal(missing.status, 404);
    assert.equal(missing.json.error.message, foreign.json.error.message.replace(inputs.json.data[0]!.id, 'msg_nope'));

    // A reference without its type (Open Responses allows that) works the same; a control character in an id is a 400.
    const untyped = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ id: message.id }], max_output_tokens: 4 },
    });
    assert.equal(untyped.status, 200, untyped.text);
    const control = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ type: 'item_reference', id: 'x\u0000' }] },
    });
    assert.equal(control.status, 400);
    assert.equal(control.json.error.param, 'input[0].id');

    // Referred into a conversation, the item becomes part of it.
    const conv = await http<{ id: string }>(server.url, 'POST', '/v1/conversations', { key, body: {} });
    const inConv = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: {
        model: MODEL,
        conversation: conv.json.id,
        input: [
          { type: 'item_reference', id: message.id },
          { role: 'user', content: 'Then?' },
        ],
        max_output_tokens: 4,
      },
    });
    assert.equal(inConv.status, 200, inConv.text);
    const convItems = await http<{ data: Array<{ id: string }> }>(server.url, 'GET', `/v1/conversations/${conv.json.id}/items?order=asc`, {
      key,
    });
    assert.equal(convItems.json.data[0]?.id, message.id);

    // Deleting the response takes its items with it (the message lives on in the conversation above;
    // the input item was only referred to since, never stored again).
    assert.equal((await http(server.url, 'DELETE', `/v1/responses/${(first.json as unknown as { id: string }).id}`, { key })).status, 200);
    const gone = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ type: 'item_reference', id: inputs.json.data[0]!.id }], max_output_tokens: 4 },
    });
    assert.equal(gone.status, 404);
    const kept = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [{ type: 'item_reference', id: message.id }], max_output_tokens: 4 },
    });
    assert.equal(kept.status, 200, kept.text);
  });
});

describe('POST /v1/responses/input_tokens', () => {
  const c = closers();
  let server: TestServer;
  before(async () => {
    server = c.keep(await startServer());
  });
  after(() => c.closeAll());

  it('counts exactly what the local model then reads, without generating, storing or billing', async () => {
    const body = { model: MODEL, instructions: 'Once upon a time,', input: [{ role: 'user', content: 'there was a dog named Max.' }] };
    const counted = await http(server.url, 'POST', '/v1/responses/input_tokens', { key: server.adminKey, body });
    assert.equal(counted.status, 200, counted.text);
    const answer = counted.json as unknown as { object: string; input_tokens: number };
    assert.equal(answer.object, 'response.input_tokens');
    assert.equal(counted.headers['x-switchyard-estimated'], undefined, 'the local tokenizer counts exactly');
    const real = await http(server.url, 'POST', '/v1/responses', { key: server.adminKey, body: { ...body, max_output_tokens: 1 } });
    assert.equal((real.json as unknown as { usage: { input_tokens: number } }).usage.input_tokens, answer.input_tokens);
    // Nothing was recorded for the count: one request (the real one) in the usage.
    const usage = await eventually(async () => {
      const u = await http<{ data: Array<{ requests: number }> }>(server.url, 'GET', '/admin/usage?group_by=model', {
        key: server.adminKey,
      });
      assert.equal(
        u.json.data.reduce((n, r) => n + r.requests, 0),
        1,
      );
      return u;
    });
    assert.equal(usage.status, 200);
    // The same checks as a real request.
    const unknown = await http(server.url, 'POST', '/v1/responses/input_tokens', {
      key: server.adminKey,
      body: { model: 'nobody/none', input: 'x' },
    });
    assert.equal(unknown.status, 404);
  });

  it('flags the count of a prompt too long to tokenize as estimated, and never counts more text as fewer tokens', async () => {
    const count = async (n: number) => {
      const r = await http(server.url, 'POST', '/v1/responses/input_tokens', {
        key: server.adminKey,
        body: { model: MODEL, input: 'Once upon a time '.repeat(n) },
      });
      assert.equal(r.status, 200, r.text);
      return { tokens: (r.json as unknown as { input_tokens: number }).input_tokens, estimated: r.headers['x-switchyard-estimated'] };
    };
    const fits = await count(800);
    assert.equal(fits.estimated, undefined, 'counted by the tokenizer');
    const past = await count(2000);
    assert.equal(past.estimated, 'true', 'past what the context can hold: not tokenized');
    assert.ok(past.tokens > fits.tokens, `${past.tokens} tokens for 2000 repeats, ${fits.tokens} for 800`);
  });
});

describe('Open Responses: max_tool_calls', () => {
  const c = closers();
  let server: TestServer;
  before(async () => {
    // An upstream that always answers with two tool calls (OpenAI's stream shape, from the recorded fixtures).
    const tools = readFileSync(join(PACKAGE_ROOT, 'test', 'fixtures', 'upstream', 'openai-chat-tools.sse'));
    const upstream = c.keep(
      await fixture((req, res) => {
        req.resume();
        req.on('end', () => res.writeHead(200, { 'content-type': 'text/event-stream' }).end(tools));
      }),
    );
    server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        configFile: {
          name: 'tools.json',
          text: JSON.stringify({
            defaultCatalogue: false,
            models: [{ id: 'openai/two-calls', context_length: 8192, capabilities: ['streaming', 'function_calling'] }],
            deployments: [{ id: 'u', model: 'openai/two-calls', baseUrl: upstream.url }],
          }),
        },
      }),
    );
  });
  after(() => c.closeAll());

  it('estimates input tokens for an upstream model, and says so', async () => {
    const counted = await http(server.url, 'POST', '/v1/responses/input_tokens', {
      key: server.adminKey,
      body: { model: 'openai/two-calls', input: 'x'.repeat(400) },
    });
    assert.equal(counted.status, 200, counted.text);
    assert.equal(counted.headers['x-switchyard-estimated'], 'true');
    assert.ok((counted.json as unknown as { input_tokens: number }).input_tokens >= 100);
  });

  it('keeps the calls a response returns to max_tool_calls', async () => {
    const tools = ['get_weather', 'get_time'].map((name) => ({ type: 'function', name, parameters: { type: 'object' } }));
    const all = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: { model: 'openai/two-calls', input: 'x', tools },
    });
    assert.equal(all.status, 200, all.text);
    const calls = (r: typeof all) =>
      (r.json as unknown as { output: Array<{ type: string; name?: string }> }).output.filter((o) => o.type === 'function_call');
    assert.deepEqual(
      calls(all).map((o) => o.name),
      ['get_weather', 'get_time'],
    );
    const one = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: { model: 'openai/two-calls', input: 'x', tools, max_tool_calls: 1 },
    });
    assert.deepEqual(
      calls(one).map((o) => o.name),
      ['get_weather'],
    );
    valid(responseResource, one.json, 'response');
    // parallel_tool_calls: false is one call a turn, held to when the upstream makes two anyway.
    const single = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: { model: 'openai/two-calls', input: 'x', tools, parallel_tool_calls: false },
    });
    assert.deepEqual(
      calls(single).map((o) => o.name),
      ['get_weather'],
    );
    assert.equal((single.json as unknown as { parallel_tool_calls: boolean }).parallel_tool_calls, false);
    valid(responseResource, single.json, 'response');

    // The same on chat completions (both lanes: whole and streamed) and on Messages (disable_parallel_tool_use).
    const chatTools = ['get_weather', 'get_time'].map((name) => ({ type: 'function', function: { name, parameters: { type: 'object' } } }));
    const ask = { model: 'openai/two-calls', messages: [{ role: 'user', content: 'x' }], tools: chatTools };
    const whole = await http<{ choices: Array<{ message: { tool_calls: Array<{ function: { name: string } }> }; finish_reason: string }> }>(
      server.url,
      'POST',
      '/v1/chat/completions',
      { key: server.adminKey, body: { ...ask, parallel_tool_calls: false } },
    );
    assert.equal(whole.status, 200, whole.text);
    assert.deepEqual(
      whole.json.choices[0]!.message.tool_calls.map((t) => t.function.name),
      ['get_weather'],
    );
    assert.equal(whole.json.choices[0]!.finish_reason, 'tool_calls');
    const streamed = await readSse(server.url, 'POST', '/v1/chat/completions', {
      key: server.adminKey,
      body: { ...ask, parallel_tool_calls: false, stream: true },
    });
    const names = streamed.events.flatMap((e) =>
      (JSON.parse(e.data) as { choices: Array<{ delta: { tool_calls?: Array<{ function?: { name?: string } }> } }> }).choices.flatMap(
        (c) => c.delta.tool_calls?.flatMap((t) => (t.function?.name ? [t.function.name] : [])) ?? [],
      ),
    );
    assert.deepEqual(names, ['get_weather']);
    const both = await http<{ choices: Array<{ message: { tool_calls: unknown[] } }> }>(server.url, 'POST', '/v1/chat/completions', {
      key: server.adminKey,
      body: ask,
    });
    assert.equal(both.json.choices[0]!.message.tool_calls.length, 2);
    const messages = await http<{ content: Array<{ type: string; name?: string }> }>(server.url, 'POST', '/v1/messages', {
      key: server.adminKey,
      body: {
        model: 'openai/two-calls',
        max_tokens: 100,
        messages: [{ role: 'user', content: 'x' }],
        tools: ['get_weather', 'get_time'].map((name) => ({ name, input_schema: { type: 'object' } })),
        tool_choice: { type: 'auto', disable_parallel_tool_use: true },
      },
    });
    assert.equal(messages.status, 200, messages.text);
    assert.deepEqual(
      messages.json.content.filter((b) => b.type === 'tool_use').map((b) => b.name),
      ['get_weather'],
    );
  });
});

describe('POST /v1/responses/compact', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  before(async () => {
    server = c.keep(await startServer());
    key = (await createKey(server, 'compaction')).key;
  });
  after(() => c.closeAll());

  it("condenses a context into the user's messages and a sealed summary that a later response continues from", async () => {
    const first = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'Once upon a time there was a cat named Tom.', max_output_tokens: 8 },
    });
    assert.equal(first.status, 200, first.text);
    const firstId = (first.json as unknown as { id: string }).id;
    const compacted = await http(server.url, 'POST', '/v1/responses/compact', {
      key,
      body: { model: MODEL, previous_response_id: firstId, input: [{ role: 'user', content: 'Tom liked milk.' }] },
    });
    assert.equal(compacted.status, 200, compacted.text);
    valid(validator('CompactResource'), compacted.json, 'compaction');
    const out = compacted.json as unknown as {
      object: string;
      output: Array<{ type: string; role?: string; encrypted_content?: string; content?: Array<{ text: string }> }>;
      usage: { input_tokens: number; output_tokens: number };
    };
    assert.equal(out.object, 'response.compaction');
    assert.deepEqual(
      out.output.map((i) => `${i.type}:${i.role ?? ''}`),
      ['message:user', 'message:user', 'compaction:'],
      "both user messages verbatim, then the summary of everything (the model's answer included)",
    );
    assert.equal(out.output[1]!.content![0]!.text, 'Tom liked milk.');
    assert.ok(out.usage.input_tokens > 0 && out.usage.output_tokens > 0, 'the summary is a real generation');
    const compaction = out.output[2]!;

    // A new chain starts from the compacted window plus the next message (no previous_response_id).
    const next = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: [...out.output, { role: 'user', content: 'What did Tom like?' }], max_output_tokens: 4 },
    });
    assert.equal(next.status, 200, next.text);
    valid(responseResource, next.json, 'response after compaction');
    const read = (next.json as unknown as { usage: { input_tokens: number } }).usage.input_tokens;
    const withoutSummary = await http(server.url, 'POST', '/v1/responses/input_tokens', {
      key,
      body: { model: MODEL, input: [...out.output.slice(0, 2), { role: 'user', content: 'What did Tom like?' }] },
    });
    assert.ok(read > (withoutSummary.json as unknown as { input_tokens: number }).input_tokens, 'the model read the summary');

    // The summary is sealed: altered, or sent by another organization, it is refused.
    const tampered = { ...compaction, encrypted_content: `${compaction.encrypted_content!.slice(0, -4)}AAAA` };
    const bad = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: [tampered], max_output_tokens: 2 } });
    assert.equal(bad.status, 400);
    const { key: other } = await createKey(server, 'other-org');
    const foreign = await http(server.url, 'POST', '/v1/responses', {
      key: other,
      body: { model: MODEL, input: [compaction], max_output_tokens: 2 },
    });
    assert.equal(foreign.status, 400);
    assert.match(foreign.json.error.message, /could not be verified/);
    // Nor can it stand in for sealed reasoning.
    const asReasoning = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: {
        model: MODEL,
        input: [
          { type: 'reasoning', summary: [], encrypted_content: compaction.encrypted_content },
          { role: 'user', content: 'x' },
        ],
        max_output_tokens: 2,
      },
    });
    assert.equal(asReasoning.status, 400);

    // Over a WebSocket too: the compacted window as the base input of a new chain.
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/responses`, { headers: { 'x-api-key': key } });
    const ended = new Promise<{ type: string }>((resolve) =>
      ws.on('message', (data) => {
        const e = JSON.parse(String(data)) as { type: string };
        if (['response.completed', 'response.incomplete', 'response.failed', 'error'].includes(e.type)) resolve(e);
      }),
    );
    await once(ws, 'open');
    ws.send(
      JSON.stringify({
        type: 'response.create',
        model: MODEL,
        store: false,
        input: [...out.output, { role: 'user', content: 'And then?' }],
        max_output_tokens: 4,
      }),
    );
    assert.equal((await ended).type, 'response.incomplete');
    ws.close();
  });

  it('answers what the specification requires of its body, and unknown ids, like a response would', async () => {
    const noModel = await http(server.url, 'POST', '/v1/responses/compact', { key, body: { input: 'x' } });
    assert.equal(noModel.status, 400);
    assert.equal(noModel.json.error.param, 'model');
    const lost = await http(server.url, 'POST', '/v1/responses/compact', {
      key,
      body: { model: MODEL, previous_response_id: 'resp_nope' },
    });
    assert.equal(lost.status, 400);
    assert.equal(lost.json.error.code, 'previous_response_not_found');
    const unauth = await http(server.url, 'POST', '/v1/responses/compact', { body: { model: MODEL, input: 'x' } });
    assert.equal(unauth.status, 401);
  });
});

describe('Open Responses: a refusal is the message’s refusal part, never an empty success', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  const REFUSAL = 'I cannot help with that.';
  before(async () => {
    // An upstream that refuses, as OpenAI's models do: chat completions (a stream's `refusal`
    // deltas, or a message with `refusal` and no content) and the Responses API's own events. A
    // request saying "preamble" gets text first, then the refusal.
    const upstream = c.keep(
      await jsonFixture<{ stream?: boolean; input?: unknown; messages?: Array<{ content: unknown }> }>((body, res, req) => {
        const preamble = JSON.stringify(body.messages ?? body.input).includes('preamble');
        if (req.url?.endsWith('/responses')) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          const item = { id: 'msg_u', type: 'message', role: 'assistant', status: 'in_progress', content: [] };
          const send = (e: object) => res.write(`data: ${JSON.stringify(e)}\n\n`);
          send({ type: 'response.output_item.added', output_index: 0, item });
          for (const delta of ['I cannot ', 'help with that.'])
            send({ type: 'response.refusal.delta', item_id: 'msg_u', output_index: 0, content_index: 0, delta });
          send({ type: 'response.refusal.done', item_id: 'msg_u', output_index: 0, content_index: 0, refusal: REFUSAL });
          const usage = {
            input_tokens: 4,
            output_tokens: 5,
            input_tokens_details: { cached_tokens: 0 },
            output_tokens_details: { reasoning_tokens: 0 },
          };
          send({ type: 'response.completed', response: { status: 'completed', usage } });
          res.end('data: [DONE]\n\n');
          return;
        }
        const usage = { prompt_tokens: 4, completion_tokens: 5, total_tokens: 9 };
        if (!body.stream) {
          const message = { role: 'assistant', content: preamble ? 'Well. ' : null, refusal: REFUSAL };
          res.writeHead(200, { 'content-type': 'application/json' }).end(completionJson(message, 'stop', usage));
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: '' }));
        if (preamble) res.write(chunkFrame({ content: 'Well. ' }));
        for (const refusal of ['I cannot ', 'help with that.']) res.write(chunkFrame({ refusal }));
        res.write(chunkFrame({}, 'stop'));
        res.end(
          `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage })}\n\ndata: [DONE]\n\n`,
        );
      }),
    );
    const models = ['openai/refuser', 'openai/refuser-native'].map((id) => ({ id, context_length: 8192, capabilities: ['streaming'] }));
    server = c.keep(
      await startCatalogueGateway(models, [
        { id: 'chat', model: 'openai/refuser', baseUrl: upstream.url },
        { id: 'native', model: 'openai/refuser-native', baseUrl: upstream.url, api: 'responses' },
      ]),
    );
    key = (await createKey(server, 'refusals')).key;
  });
  after(() => c.closeAll());

  type Part = { type: string; text?: string; refusal?: string };
  const contentOf = (r: { output: Array<{ type: string; content?: Part[] }> }) => r.output.find((o) => o.type === 'message')?.content;

  for (const model of ['openai/refuser', 'openai/refuser-native']) {
    it(`gives ${model}'s refusal as a refusal part, whole and streamed, in the specification's shapes`, async () => {
      const whole = await http(server.url, 'POST', '/v1/responses', { key, body: { model, input: 'do something bad' } });
      assert.equal(whole.status, 200, whole.text);
      valid(responseResource, whole.json, 'response');
      const r = whole.json as unknown as { status: string; output: Array<{ type: string; content?: Part[] }> };
      assert.equal(r.status, 'completed');
      assert.deepEqual(contentOf(r), [{ type: 'refusal', refusal: REFUSAL }]);

      const { events } = await readSse(server.url, 'POST', '/v1/responses', {
        key,
        body: { model, input: 'do something bad', stream: true },
      });
      const parsed = checkStream(events);
      for (const e of parsed) valid(eventSchemas.get(e.type)!, e, e.type);
      const types = parsed.map((e) => e.type);
      assert.deepEqual(types.slice(2), [
        'response.output_item.added',
        'response.content_part.added',
        'response.refusal.delta',
        'response.refusal.delta',
        'response.refusal.done',
        'response.content_part.done',
        'response.output_item.done',
        'response.completed',
      ]);
      const byType = (t: string) => parsed.filter((e) => e.type === t) as unknown as Array<Record<string, unknown>>;
      assert.deepEqual(byType('response.content_part.added')[0]!['part'], { type: 'refusal', refusal: '' });
      assert.equal(
        byType('response.refusal.delta')
          .map((e) => e['delta'])
          .join(''),
        REFUSAL,
      );
      assert.equal(byType('response.refusal.done')[0]!['refusal'], REFUSAL);
      assert.deepEqual(contentOf(parsed.at(-1)!.response as never), [{ type: 'refusal', refusal: REFUSAL }]);
    });
  }

  it('keeps text before a refusal as a part of its own, stored and replayed as it streamed', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: `${server.url}/v1`, maxRetries: 0 });
    const stream = client.responses.stream({ model: 'openai/refuser', input: 'a preamble, then do something bad' });
    const refusalDeltas: string[] = [];
    stream.on('response.refusal.delta', (e) => refusalDeltas.push(e.delta));
    const final = await stream.finalResponse();
    assert.equal(refusalDeltas.join(''), REFUSAL);
    const message = final.output[0]!;
    assert.ok(message.type === 'message');
    assert.deepEqual(
      message.content.map((p) => [p.type, p.type === 'refusal' ? p.refusal : p.text]),
      [
        ['output_text', 'Well. '],
        ['refusal', REFUSAL],
      ],
    );
    assert.equal(final.output_text, 'Well. ', 'output_text is the text alone');

    const { events } = await readSse(server.url, 'GET', `/v1/responses/${final.id}?stream=true`, { key });
    const replayed = checkStream(events) as unknown as Array<Record<string, unknown>>;
    for (const e of replayed) valid(eventSchemas.get(e['type'] as string)!, e, e['type'] as string);
    assert.deepEqual(
      replayed.filter((e) => e['type'] === 'response.content_part.added').map((e) => [e['content_index'], (e['part'] as Part).type]),
      [
        [0, 'output_text'],
        [1, 'refusal'],
      ],
    );
    assert.deepEqual(contentOf(replayed.at(-1)!['response'] as never), [
      { type: 'output_text', text: 'Well. ', annotations: [] },
      { type: 'refusal', refusal: REFUSAL },
    ]);
  });

  it('gives it on chat completions in the canonical lane (refusal, content null) and as Messages text ending in `refusal`', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: `${server.url}/v1`, maxRetries: 0 });
    // `store: true` folds the answer from canonical events (the fast lane passes the upstream's own).
    const whole = await client.chat.completions.create({
      model: 'openai/refuser',
      messages: [{ role: 'user', content: 'x' }],
      store: true,
    });
    assert.deepEqual([whole.choices[0]!.message.content, whole.choices[0]!.message.refusal], [null, REFUSAL]);
    const stream = await client.chat.completions.create({
      model: 'openai/refuser',
      messages: [{ role: 'user', content: 'x' }],
      store: true,
      stream: true,
    });
    let refusal = '';
    for await (const chunk of stream) refusal += chunk.choices[0]?.delta.refusal ?? '';
    assert.equal(refusal, REFUSAL);

    const anthropic = new Anthropic({ apiKey: key, baseURL: server.url, maxRetries: 0 });
    for (const model of ['openai/refuser', 'openai/refuser-native']) {
      const m = await anthropic.messages.create({ model, max_tokens: 64, messages: [{ role: 'user', content: 'x' }] });
      assert.equal(m.stop_reason, 'refusal', model);
      assert.deepEqual(
        m.content.map((b) => [b.type, b.type === 'text' ? b.text : '']),
        [['text', REFUSAL]],
      );
      const final = await anthropic.messages.stream({ model, max_tokens: 64, messages: [{ role: 'user', content: 'x' }] }).finalMessage();
      assert.equal(final.stop_reason, 'refusal', model);
      assert.equal(final.content.map((b) => (b.type === 'text' ? b.text : '')).join(''), REFUSAL);
    }
    // Text that stop strings held back (its end could start one: more than a chat upstream takes,
    // so Switchyard applies them) comes before the refusal that followed it, not after.
    const held = await anthropic.messages.create({
      model: 'openai/refuser',
      max_tokens: 64,
      stop_sequences: ['. x', 'one', 'two', 'three', 'four'],
      messages: [{ role: 'user', content: 'a preamble, then do something bad' }],
    });
    assert.equal(held.content.map((b) => (b.type === 'text' ? b.text : '')).join(''), `Well. ${REFUSAL}`);
  });
});
