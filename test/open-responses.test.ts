import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { PACKAGE_ROOT } from '../src/config.js';
import { closers, fixture } from './helpers/fixtures.js';
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
      body: { model: MODEL, messages: [{ role: 'user', content: 'x' }], logit_bias: {}, max_tokens: 1 },
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
