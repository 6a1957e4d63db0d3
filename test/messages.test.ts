/**
 * Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) driven by the official
 * `@anthropic-ai/sdk`, unchanged, with the server's root URL as its base: on the local model
 * (stories260K), and on an OpenAI-compatible upstream for what that model cannot do on demand
 * (thinking). Errors are checked in Anthropic's envelope, as the SDK parses them.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { betaZodTool } from '@anthropic-ai/sdk/helpers/beta/zod';
import { z } from 'zod';
import { closers, jsonFixture, startCatalogueGateway } from './helpers/fixtures.js';
import { createKey, http, readSse, startServer, tempDir, type TestServer, type WireList } from './helpers/server.js';

const STORIES = 'local/stories260k';

describe('Messages API on the local model (@anthropic-ai/sdk)', () => {
  const c = closers();
  let server: TestServer;
  let client: Anthropic;
  let key: string;
  let keyId: string;
  let requests = 0;

  before(async () => {
    server = c.keep(await startServer());
    ({ key, id: keyId } = await createKey(server, 'anthropic-users'));
    client = new Anthropic({ apiKey: key, baseURL: server.url, maxRetries: 0 });
  });
  after(() => c.closeAll());

  it("lists and retrieves models in Anthropic's shape for Anthropic's SDK, paged, errors in its envelope; the OpenAI shape stays", async () => {
    const m = await client.models.retrieve(STORIES);
    assert.equal(m.type, 'model');
    assert.equal(m.id, STORIES);
    assert.equal(typeof m.display_name, 'string');
    assert.ok(!Number.isNaN(Date.parse(m.created_at)) && /Z$/.test(m.created_at), m.created_at);
    assert.equal(m.max_input_tokens, 512);
    assert.ok(m._request_id, 'request-id header');
    // Every page, as the SDK walks them (after_id), and the same list backwards (before_id).
    const all: string[] = [];
    for await (const x of client.models.list({ limit: 3 })) all.push(x.id);
    assert.ok(all.length > 3 && all.includes(STORIES), all.join(' '));
    assert.equal(new Set(all).size, all.length, 'no model twice');
    const first = await client.models.list({ limit: 3 });
    assert.deepEqual([first.has_more, first.first_id, first.last_id], [true, all[0], all[2]]);
    const before = await client.models.list({ limit: 2, before_id: all[3]! });
    assert.deepEqual(
      before.data.map((x) => x.id),
      all.slice(1, 3),
    );
    assert.equal(before.has_more, true);
    // The lifecycle filter (an outside pass found it ignored): every model here is active.
    const active: string[] = [];
    for await (const x of client.models.list({ lifecycle: ['active'], limit: 100 })) active.push(x.id);
    assert.deepEqual(active, all);
    assert.deepEqual((await client.models.list({ lifecycle: ['retired', 'deprecated'] })).data, []);
    // A bad stage is named as a bad value (it read as "given 1 times" before).
    await assert.rejects(
      client.models.list({ lifecycle: ['active', 'gone' as 'retired'] }),
      (err: unknown) => err instanceof Anthropic.BadRequestError && /must be one of 'active', 'deprecated', 'retired'/.test(err.message),
    );
    await assert.rejects(client.models.retrieve('nope/nope'), (err: unknown) => {
      assert.ok(err instanceof Anthropic.NotFoundError);
      assert.equal((err.error as { type: string; error: { type: string } }).error.type, 'not_found_error');
      assert.ok(err.requestID);
      return true;
    });
    // Without anthropic-version (the OpenAI SDKs, curl), the catalogue's own shape.
    const plain = await http(server.url, 'GET', `/v1/models/${STORIES}`, { key });
    assert.equal((plain.json as unknown as { object: string }).object, 'model');
  });

  it('creates a message: text block, stop reason, usage, ids', async () => {
    const m = await client.messages.create({ model: STORIES, max_tokens: 24, messages: [{ role: 'user', content: 'Once upon a time' }] });
    requests++;
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, STORIES);
    assert.match(m.id, /^msg_/);
    assert.equal(m.content.length, 1);
    const block = m.content[0]!;
    assert.ok(block.type === 'text' && block.text.length > 0, JSON.stringify(m.content));
    assert.ok(m.stop_reason === 'end_turn' || m.stop_reason === 'max_tokens', String(m.stop_reason));
    assert.equal(m.stop_sequence, null);
    assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0 && m.usage.output_tokens <= 24, JSON.stringify(m.usage));
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.equal(typeof m.usage.cache_read_input_tokens, 'number');
  });

  it('takes a system prompt (string and blocks) and several turns; max_tokens ends with max_tokens', async () => {
    for (const system of ['You tell stories.', [{ type: 'text' as const, text: 'You tell stories.' }]]) {
      // temperature and top_k are still on the wire; this SDK's types no longer list them.
      const m = await client.messages.create({
        model: STORIES,
        max_tokens: 3,
        ...({ temperature: 1, top_k: 20 } as object),
        system,
        messages: [
          { role: 'user', content: 'Once upon a time' },
          { role: 'assistant', content: [{ type: 'text', text: 'there was a dog.' }] },
          { role: 'user', content: [{ type: 'text', text: 'What happened next?' }] },
        ],
      });
      requests++;
      assert.equal(m.stop_reason, 'max_tokens');
      assert.equal(m.usage.output_tokens, 3);
    }
  });

  it('reports the stop sequence that ended the text', async () => {
    const m = await client.messages.create({
      model: STORIES,
      max_tokens: 60,
      ...({ temperature: 0 } as object),
      stop_sequences: ['zzz', ' girl'],
      messages: [{ role: 'user', content: 'Once upon a time, there was a little' }],
    });
    requests++;
    assert.equal(m.stop_reason, 'stop_sequence', JSON.stringify(m));
    assert.equal(m.stop_sequence, ' girl');
    const block = m.content[0];
    assert.ok(!block || (block.type === 'text' && !block.text.includes(' girl')));
  });

  it('streams with the SDK helpers: text events add up to finalMessage, events in Anthropic order', async () => {
    const stream = client.messages.stream({ model: STORIES, max_tokens: 30, messages: [{ role: 'user', content: 'Once upon a time' }] });
    let text = '';
    const kinds: string[] = [];
    stream.on('text', (delta) => {
      text += delta;
    });
    stream.on('streamEvent', (ev) => {
      if (kinds.at(-1) !== ev.type) kinds.push(ev.type);
    });
    const final = await stream.finalMessage();
    requests++;
    const block = final.content[0];
    assert.ok(block?.type === 'text');
    assert.equal(block.text, text);
    assert.ok(text.length > 0);
    assert.deepEqual(kinds, [
      'message_start',
      'content_block_start',
      'content_block_delta',
      'content_block_stop',
      'message_delta',
      'message_stop',
    ]);
    assert.ok(final.usage.input_tokens > 0 && final.usage.output_tokens > 0, JSON.stringify(final.usage));
    assert.ok(final.stop_reason === 'end_turn' || final.stop_reason === 'max_tokens');
  });

  it('sends the wire events with event names, a ping, and usage in message_start and message_delta', async () => {
    const { status, events } = await readSse(server.url, 'POST', '/v1/messages', {
      key,
      body: { model: STORIES, max_tokens: 8, stream: true, messages: [{ role: 'user', content: 'Once upon a time' }] },
    });
    requests++;
    assert.equal(status, 200);
    for (const e of events) assert.equal(e.event, (JSON.parse(e.data) as { type: string }).type);
    const names = events.map((e) => e.event);
    assert.deepEqual(names.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
    assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
    const start = JSON.parse(events[0]!.data) as { message: { usage: { input_tokens: number } } };
    assert.ok(start.message.usage.input_tokens > 0);
    const delta = JSON.parse(events.at(-2)!.data) as { delta: { stop_reason: string }; usage: { output_tokens: number } };
    assert.equal(delta.delta.stop_reason, 'max_tokens');
    assert.equal(delta.usage.output_tokens, 8);
    // The same prompt again is mostly cached: message_start counts it as message_delta does
    // (cached tokens in cache_read_input_tokens, not in input_tokens).
    type InputUsage = { input_tokens: number; cache_read_input_tokens: number };
    const again = await readSse(server.url, 'POST', '/v1/messages', {
      key,
      body: { model: STORIES, max_tokens: 8, stream: true, messages: [{ role: 'user', content: 'Once upon a time' }] },
    });
    requests++;
    const startUsage = (JSON.parse(again.events[0]!.data) as { message: { usage: InputUsage } }).message.usage;
    const finalUsage = (JSON.parse(again.events.at(-2)!.data) as { usage: InputUsage }).usage;
    assert.ok(finalUsage.cache_read_input_tokens > 0, JSON.stringify(finalUsage));
    assert.deepEqual(
      { input: startUsage.input_tokens, cached: startUsage.cache_read_input_tokens },
      { input: finalUsage.input_tokens, cached: finalUsage.cache_read_input_tokens },
    );
  });

  const weather: Anthropic.Tool = {
    name: 'get_weather',
    description: 'The weather in a city',
    input_schema: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'days'],
      additionalProperties: false,
    },
  };

  it('calls a tool (tool_choice any) and answers after a tool_result turn', async () => {
    const m = await client.messages.create({
      model: STORIES,
      max_tokens: 60,
      tools: [weather],
      tool_choice: { type: 'any' },
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    });
    requests++;
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
    const call = m.content.find((b) => b.type === 'tool_use');
    assert.ok(call?.type === 'tool_use');
    assert.equal(call.name, 'get_weather');
    const input = call.input as { city: unknown; days: unknown };
    assert.equal(typeof input.city, 'string');
    assert.ok(Number.isInteger(input.days) && (input.days as number) >= 1 && (input.days as number) <= 7, JSON.stringify(input));

    const next = await client.messages.create({
      model: STORIES,
      max_tokens: 20,
      tools: [weather],
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny, 24 C' }] },
      ],
    });
    requests++;
    assert.ok(next.content.length > 0);
    assert.ok(next.stop_reason === 'end_turn' || next.stop_reason === 'max_tokens' || next.stop_reason === 'tool_use');
  });

  it("runs the SDK's tool runner, which starts a message thread: refused as the SDK expects, it goes on with the whole history", async () => {
    // A thread is refused with the details the SDK reads (a turn that continued one lost its history).
    const threaded = await http(server.url, 'POST', '/v1/messages', {
      key,
      headers: { 'anthropic-version': '2023-06-01' },
      body: { model: STORIES, max_tokens: 5, thread: { type: 'create' }, messages: [{ role: 'user', content: 'Hi' }] },
    });
    assert.equal(threaded.status, 400, threaded.text);
    assert.deepEqual((threaded.json as unknown as { error: { details: unknown } }).error.details, {
      error_code: 'thread_unsupported_request',
      unsupported: ['thread'],
    });
    const cities: string[] = [];
    const tool = betaZodTool({
      name: 'get_weather',
      description: 'The weather in a city',
      inputSchema: z.object({ city: z.string() }),
      run: ({ city }) => {
        cities.push(city);
        return 'Sunny, 24 C';
      },
    });
    const runner = client.beta.messages.toolRunner({
      model: STORIES,
      max_tokens: 40,
      max_iterations: 2,
      tools: [tool],
      tool_choice: { type: 'any' },
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    });
    const turns: string[] = [];
    for await (const m of runner) turns.push(m.stop_reason ?? '');
    requests += 2;
    // Two turns, the second with the first's call and its result (else a 400: a tool_result for no tool_use).
    assert.deepEqual(turns, ['tool_use', 'tool_use']);
    assert.ok(cities.length >= 1);
  });

  it('streams a named tool call as input_json deltas the SDK assembles', async () => {
    const stream = client.messages.stream({
      model: STORIES,
      max_tokens: 60,
      tools: [weather],
      tool_choice: { type: 'tool', name: 'get_weather' },
      messages: [{ role: 'user', content: 'Weather?' }],
    });
    let json = '';
    stream.on('inputJson', (partial) => {
      json += partial;
    });
    const final = await stream.finalMessage();
    requests++;
    const call = final.content.find((b) => b.type === 'tool_use');
    assert.ok(call?.type === 'tool_use', JSON.stringify(final.content));
    assert.deepEqual(call.input, JSON.parse(json));
    assert.equal(final.stop_reason, 'tool_use');
  });

  it('holds output_config.format (a JSON schema) with the same guarantee as the other endpoints', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 1, maximum: 9 } },
      required: ['name', 'age'],
      additionalProperties: false,
    };
    const m = await client.messages.create({
      model: STORIES,
      max_tokens: 80,
      output_config: { format: { type: 'json_schema', schema } },
      messages: [{ role: 'user', content: 'A child.' }],
    });
    requests++;
    const block = m.content[0];
    assert.ok(block?.type === 'text');
    const doc = JSON.parse(block.text) as { name: string; age: number };
    assert.equal(typeof doc.name, 'string');
    assert.ok(doc.name.length <= 12 && Number.isInteger(doc.age) && doc.age >= 1 && doc.age <= 9, block.text);
    assert.equal(m.stop_reason, 'end_turn');
  });

  it('counts tokens as the model will read them', async () => {
    const params = { model: STORIES, messages: [{ role: 'user' as const, content: 'Once upon a time' }] };
    const { input_tokens } = await client.messages.countTokens(params);
    const m = await client.messages.create({ ...params, max_tokens: 1 });
    requests++;
    assert.ok(input_tokens > 0);
    assert.equal(input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
    // Two text blocks are read as two lines, not run together into one word.
    const count = async (content: Anthropic.MessageParam['content']) =>
      (await client.messages.countTokens({ model: STORIES, messages: [{ role: 'user', content }] })).input_tokens;
    const blocks = await count([
      { type: 'text', text: 'Once upon' },
      { type: 'text', text: 'a time' },
    ]);
    assert.equal(blocks, await count('Once upon\na time'));
    assert.notEqual(blocks, await count('Once upona time'));
  });

  it('answers errors in Anthropic’s envelope and status codes, with a request id', async () => {
    /** A request the API refuses with a 400 whose message matches. */
    const refused = (body: Omit<Anthropic.MessageCreateParamsNonStreaming, 'model' | 'max_tokens'>, message: RegExp) =>
      assert.rejects(
        client.messages.create({ model: STORIES, max_tokens: 5, ...body }),
        (err: unknown) => err instanceof Anthropic.BadRequestError && message.test(err.message),
      );
    await assert.rejects(
      // @ts-expect-error max_tokens is required
      client.messages.create({ model: STORIES, messages: [{ role: 'user', content: 'x' }] }),
      (err: unknown) => {
        assert.ok(err instanceof Anthropic.BadRequestError);
        assert.equal(err.status, 400);
        const body = err.error as { type: string; error: { type: string; message: string } };
        assert.equal(body.type, 'error');
        assert.equal(body.error.type, 'invalid_request_error');
        assert.match(body.error.message, /max_tokens/);
        assert.ok(err.requestID);
        return true;
      },
    );
    await assert.rejects(
      new Anthropic({ apiKey: 'sk-wrong', baseURL: server.url, maxRetries: 0 }).messages.create({
        model: STORIES,
        max_tokens: 5,
        messages: [{ role: 'user', content: 'x' }],
      }),
      (err: unknown) =>
        err instanceof Anthropic.AuthenticationError && (err.error as { error: { type: string } }).error.type === 'authentication_error',
    );
    await assert.rejects(
      client.messages.create({ model: 'nobody/nothing', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
      (err: unknown) =>
        err instanceof Anthropic.NotFoundError && (err.error as { error: { type: string } }).error.type === 'not_found_error',
    );
    // A Messages path this server does not serve (message batches) is a 404 in the same envelope.
    await assert.rejects(
      client.messages.batches.retrieve('msgbatch_1'),
      (err: unknown) =>
        err instanceof Anthropic.NotFoundError &&
        (err.error as { type: string; error: { type: string } }).type === 'error' &&
        (err.error as { error: { type: string } }).error.type === 'not_found_error',
    );
    await refused(
      {
        messages: [
          { role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] },
        ],
      },
      /vision/,
    );
    await refused(
      {
        messages: [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: [{ type: 'thinking', thinking: 'I made this up.', signature: 'Zm9yZ2Vk' }] },
          { role: 'user', content: 'y' },
        ],
      },
      /signature/,
    );
    // A server tool is refused by its type (it has no input_schema, which only client tools need).
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        tools: [{ type: 'web_search_20250305', name: 'web_search', max_uses: 1 }],
      },
      /Tool type 'web_search_20250305' is not supported/,
    );
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        tools: [{ name: 'f' } as Anthropic.Tool],
      },
      /tools\[0\]\.input_schema/,
    );
    // A tool's input is an object, as Anthropic's API requires (a string schema gave `input: {}`).
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        tools: [{ name: 'f', input_schema: { type: 'string' } as unknown as Anthropic.Tool.InputSchema }],
      },
      /input_schema\.type/,
    );
    // MCP servers (Anthropic's connector): refused rather than answered without their tools.
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        ...({ mcp_servers: [{ type: 'url', url: 'https://example.com/mcp', name: 'docs' }] } as object),
      },
      /mcp_servers is not supported/,
    );
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        // A server tool without a name (MCP toolsets name their server instead).
        tools: [{ type: 'mcp_toolset', mcp_server_name: 'docs' } as unknown as Anthropic.Tool],
      },
      /Tool type 'mcp_toolset' is not supported/,
    );
    // A tool_result that answers no tool_use of the message before, as Anthropic's API refuses it.
    await refused(
      {
        messages: [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: 'No tool here.' },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_none', content: '42' }] },
        ],
      },
      /unexpected tool_use_id 'toolu_none'/,
    );
    // And the mirror case: a tool_use no tool_result answers in the turns right after it.
    await refused(
      {
        messages: [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_lone', name: 'f', input: {} }] },
          { role: 'user', content: 'next' },
        ],
      },
      /messages\.2: tool_use ids were found without tool_result blocks immediately after: toolu_lone/,
    );
    // Two results for one call, and an is_error that is not a boolean (an outside pass: both taken).
    const called = [
      { role: 'user' as const, content: 'x' },
      { role: 'assistant' as const, content: [{ type: 'tool_use' as const, id: 'toolu_1', name: 'f', input: {} }] },
    ];
    await refused(
      {
        messages: [
          ...called,
          {
            role: 'user',
            content: [
              { type: 'tool_result', tool_use_id: 'toolu_1', content: 'r' },
              { type: 'tool_result', tool_use_id: 'toolu_1', content: 'r' },
            ],
          },
        ],
      },
      /each tool_use must have a single result\. Found multiple `tool_result` blocks with id: toolu_1/,
    );
    await refused(
      {
        messages: [
          ...called,
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'r', is_error: 'yes' as unknown as boolean }] },
        ],
      },
      /is_error` must be a boolean/,
    );
    // Two tools of one name: a call to it would be ambiguous.
    await refused(
      {
        messages: [{ role: 'user', content: 'x' }],
        tools: [
          { name: 'f', input_schema: { type: 'object', properties: { a: { type: 'integer' } } } },
          { name: 'f', input_schema: { type: 'object', properties: { b: { type: 'boolean' } } } },
        ],
      },
      /Tool names must be unique: 'f'/,
    );
    // Consecutive turns of one role are one turn, as Anthropic merges them: results split over two
    // user turns both answer the assistant's calls.
    const merged = await http(server.url, 'POST', '/v1/messages', {
      headers: { 'x-api-key': key, 'anthropic-version': '2023-06-01' },
      body: {
        model: STORIES,
        max_tokens: 3,
        messages: [
          { role: 'user', content: 'x' },
          {
            role: 'assistant',
            content: [
              { type: 'tool_use', id: 'toolu_a', name: 'f', input: {} },
              { type: 'tool_use', id: 'toolu_b', name: 'f', input: {} },
            ],
          },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_a', content: '1' }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_b', content: '2' }] },
        ],
      },
    });
    assert.equal(merged.status, 200, merged.text);
    requests++;
    // A body that is not JSON, on the raw wire.
    const raw = await http<{ type: string; error: { type: string } }>(server.url, 'POST', '/v1/messages', {
      headers: { 'x-api-key': key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: '{"model":',
    });
    assert.equal(raw.status, 400);
    assert.equal(raw.json.type, 'error');
    assert.equal(raw.json.error.type, 'invalid_request_error');
    assert.ok(raw.headers['x-request-id']);
    // A method the path lacks: 405 with Allow, still in Anthropic's envelope.
    const get = await http<{ type: string; error: { type: string } }>(server.url, 'GET', '/v1/messages', { headers: { 'x-api-key': key } });
    assert.equal(get.status, 405);
    assert.equal(get.headers['allow'], 'POST');
    assert.equal(get.json.type, 'error');
    assert.ok(get.headers['request-id']);
  });

  it('bills every Messages request to the key, like the other endpoints', async () => {
    const read = async () =>
      (
        await http<WireList<{ group: string; requests: number; output_tokens: number }>>(
          server.url,
          'GET',
          `/admin/usage?group_by=key&key=${keyId}`,
          { key: server.adminKey },
        )
      ).json.data[0];
    let row = await read();
    for (let i = 0; i < 50 && (row?.requests ?? 0) < requests; i++) {
      await new Promise((r) => setTimeout(r, 100));
      row = await read();
    }
    assert.equal(row?.requests, requests);
    assert.ok((row?.output_tokens ?? 0) > 0);
  });
});

/**
 * Thinking, which stories260K does not produce: an OpenAI-compatible upstream streaming
 * `reasoning_content` (as vLLM and DeepSeek do) behind a catalogue model with the reasoning capability.
 */
describe('Messages API thinking blocks through an upstream (@anthropic-ai/sdk)', () => {
  const c = closers();
  const seen: Array<{ messages: Array<{ role: string; content: unknown; reasoning_content?: string }>; reasoning_effort?: string }> = [];
  let client: Anthropic;
  let other: Anthropic;
  const MODEL = 'deepseek/thinker';

  before(async () => {
    const upstream = c.keep(
      await jsonFixture<(typeof seen)[number] & { stream?: boolean }>((body, res) => {
        seen.push(body);
        const usage = { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21, completion_tokens_details: { reasoning_tokens: 5 } };
        if (body.stream !== true) {
          res.writeHead(200, { 'content-type': 'application/json' });
          const message = { role: 'assistant', content: 'Once upon a time.', reasoning_content: 'The user wants a story. A short one.' };
          res.end(
            JSON.stringify({
              id: 'c',
              object: 'chat.completion',
              created: 1,
              model: 'f',
              choices: [{ index: 0, message, finish_reason: 'stop' }],
              usage,
            }),
          );
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const send = (delta: object, finish: string | null = null) =>
          res.write(
            `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'f', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`,
          );
        send({ role: 'assistant', content: '' });
        send({ reasoning_content: 'The user wants a story. ' });
        send({ reasoning_content: 'A short one.' });
        send({ content: 'Once upon a time.' });
        send({}, 'stop');
        res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'f', choices: [], usage })}\n\n`);
        res.end('data: [DONE]\n\n');
      }),
    );
    const server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        configFile: {
          name: 'm.json',
          text: JSON.stringify({
            models: [{ id: MODEL, context_length: 8192, capabilities: ['streaming', 'reasoning'] }],
            deployments: [{ model: MODEL, baseUrl: upstream.url, upstreamModel: 'fixture' }],
          }),
        },
      }),
    );
    client = new Anthropic({ apiKey: (await createKey(server, 'thinkers')).key, baseURL: server.url, maxRetries: 0 });
    other = new Anthropic({ apiKey: (await createKey(server, 'others')).key, baseURL: server.url, maxRetries: 0 });
  });
  after(() => c.closeAll());

  it('returns thinking before text, signed, and takes it back in the next turn', async () => {
    const m = await client.messages.create({
      model: MODEL,
      max_tokens: 2048,
      thinking: { type: 'enabled', budget_tokens: 1024 },
      messages: [{ role: 'user', content: 'Tell me a story.' }],
    });
    assert.deepEqual(
      m.content.map((b) => b.type),
      ['thinking', 'text'],
    );
    const thinking = m.content[0]!;
    assert.ok(thinking.type === 'thinking');
    assert.equal(thinking.thinking, 'The user wants a story. A short one.');
    assert.ok(thinking.signature.length > 20);
    assert.equal(m.usage.input_tokens, 12);
    assert.equal(m.usage.output_tokens, 9);
    assert.equal(seen.at(-1)?.reasoning_effort, 'low');

    const turn2 = [
      { role: 'user' as const, content: 'Tell me a story.' },
      { role: 'assistant' as const, content: m.content },
      { role: 'user' as const, content: 'Another.' },
    ];
    await client.messages.create({ model: MODEL, max_tokens: 100, messages: turn2 });
    const sent = seen.at(-1)!.messages.find((x) => x.role === 'assistant');
    assert.equal(sent?.reasoning_content, thinking.thinking);

    // Changed thinking, or thinking signed for another organization, is refused.
    const altered: Anthropic.MessageParam[] = [
      turn2[0]!,
      { role: 'assistant', content: [{ ...thinking, thinking: 'Something else.' }, m.content[1]!] },
      turn2[2]!,
    ];
    await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 100, messages: altered }), Anthropic.BadRequestError);
    await assert.rejects(other.messages.create({ model: MODEL, max_tokens: 100, messages: turn2 }), Anthropic.BadRequestError);
  });

  it('passes a tool_result marked is_error on as the text of its blocks after "Error: ", not their JSON', async () => {
    for (const [content, expected] of [
      [
        [
          { type: 'text' as const, text: 'boom' },
          { type: 'text' as const, text: 'bang' },
        ],
        // Blocks stay blocks (text parts to a chat upstream), not run together.
        [
          { type: 'text', text: 'Error: boom' },
          { type: 'text', text: 'bang' },
        ],
      ],
      ['boom', 'Error: boom'],
    ] as const) {
      await client.messages.create({
        model: MODEL,
        max_tokens: 50,
        messages: [
          { role: 'user', content: 'Weather?' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', is_error: true, content: content as never }] },
        ],
      });
      const tool = seen.at(-1)!.messages.find((m) => m.role === 'tool');
      assert.deepEqual(tool?.content, expected);
    }
  });

  it('streams thinking_delta then signature_delta, and the SDK assembles the block', async () => {
    const stream = client.messages.stream({
      model: MODEL,
      max_tokens: 2048,
      thinking: { type: 'enabled', budget_tokens: 1024 },
      messages: [{ role: 'user', content: 'Tell me a story.' }],
    });
    let thought = '';
    let signature = '';
    stream.on('thinking', (delta) => {
      thought += delta;
    });
    stream.on('signature', (s) => {
      signature = s;
    });
    const final = await stream.finalMessage();
    const block = final.content[0];
    assert.ok(block?.type === 'thinking');
    assert.equal(block.thinking, thought);
    assert.equal(block.signature, signature);
    assert.ok(signature.length > 20);
    const text = final.content[1];
    assert.ok(text?.type === 'text' && text.text === 'Once upon a time.');
    assert.equal(final.usage.output_tokens, 9);
  });

  it('shows no thinking where none was asked for (the upstream reasons anyway): billed, not shown', async () => {
    for (const thinking of [undefined, { type: 'disabled' as const }]) {
      const params = {
        model: MODEL,
        max_tokens: 2048,
        messages: [{ role: 'user' as const, content: 'Tell me a story.' }],
        ...(thinking && { thinking }),
      };
      for (const message of [await client.messages.create(params), await client.messages.stream(params).finalMessage()]) {
        assert.deepEqual(
          message.content.map((b) => b.type),
          ['text'],
          JSON.stringify(message.content),
        );
        assert.equal(message.content[0]?.type === 'text' && message.content[0].text, 'Once upon a time.');
        assert.equal(message.usage.output_tokens, 9, 'the reasoning is billed');
      }
    }
  });
});

describe('Messages stop_sequences on a chat-completions upstream', () => {
  // An upstream that ignores stop strings (as a fixture must, to show who applies them).
  const c = closers();
  let gw: TestServer;
  const sent: Array<{ stop?: string[] }> = [];
  before(async () => {
    const upstream = c.keep(
      await jsonFixture<{ stop?: string[]; stream?: boolean }>((asked, res) => {
        sent.push(asked);
        if (asked.stream !== true) {
          const message = { role: 'assistant', content: 'Once upon a time, a fox.' };
          res.writeHead(200, { 'content-type': 'application/json' }).end(
            JSON.stringify({
              id: 'x',
              object: 'chat.completion',
              created: 1,
              model: 'm',
              choices: [{ index: 0, message, finish_reason: 'stop' }],
            }),
          );
          return;
        }
        const frame = (delta: object, finish: string | null = null) =>
          `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
        res
          .writeHead(200, { 'content-type': 'text/event-stream' })
          .end(
            frame({ role: 'assistant', content: 'Once upon a ' }) +
              frame({ content: 'time, a fox.' }) +
              frame({}, 'stop') +
              'data: [DONE]\n\n',
          );
      }),
    );
    gw = c.keep(
      await startCatalogueGateway(
        [{ id: 'mistralai/stops', context_length: 4096, capabilities: ['streaming'] }],
        [{ model: 'mistralai/stops', baseUrl: upstream.url }],
      ),
    );
  });
  after(() => c.closeAll());

  it('sends the upstream four (OpenAI takes no more) and applies all of them itself', async () => {
    const client = new Anthropic({ apiKey: gw.adminKey, baseURL: gw.url, maxRetries: 0 });
    const stop_sequences = ['a1', 'a2', 'a3', 'a4', 'a5', ', a fox'];
    for (const stream of [false, true]) {
      const params = {
        model: 'mistralai/stops',
        max_tokens: 50,
        stop_sequences,
        messages: [{ role: 'user' as const, content: 'Tell me.' }],
      };
      const message = stream ? await client.messages.stream(params).finalMessage() : await client.messages.create(params);
      assert.deepEqual(sent.at(-1)!.stop, stop_sequences.slice(0, 4));
      assert.equal(message.content.length, 1, JSON.stringify(message.content));
      assert.equal(message.content[0]?.type === 'text' && message.content[0].text, 'Once upon a time');
      assert.equal(message.stop_reason, 'stop_sequence');
      assert.equal(message.stop_sequence, ', a fox');
    }
  });
});

describe('Messages requests checked as Anthropic checks them, and what a chat-completions upstream is sent', () => {
  // An outside tester's pass (2026-11-28): each of these was a 500, a silent acceptance, or a turn
  // an OpenAI upstream refuses.
  const c = closers();
  const MODEL = 'mistralai/tools';
  const OVERLOADED = 'mistralai/overloaded';
  const sent: Array<{
    messages: Array<{ role: string; tool_calls?: Array<{ id: string }>; tool_call_id?: string }>;
    response_format?: unknown;
  }> = [];
  let client: Anthropic;
  let key: string;
  let gw: TestServer;
  const deepText = (levels: number): string => `${'['.repeat(levels)}${']'.repeat(levels)}`;

  before(async () => {
    const upstream = c.keep(
      await jsonFixture<(typeof sent)[number] & { model: string }>((asked, res) => {
        sent.push(asked);
        if (asked.model === 'busy') {
          res.writeHead(529, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }));
          return;
        }
        const last = JSON.stringify(asked.messages.at(-1));
        // Arguments nested 20,000 deep when asked for them: an answer JSON.stringify cannot write.
        const args = last.includes('deep please') ? `{"x":${'['.repeat(20_000)}${']'.repeat(20_000)}}` : '{"city":"Oslo"}';
        const message = {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: args } }],
        };
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            id: 'x',
            object: 'chat.completion',
            created: 1,
            model: 'm',
            choices: [{ index: 0, message, finish_reason: 'tool_calls' }],
          }),
        );
      }),
    );
    gw = c.keep(
      await startCatalogueGateway(
        [
          { id: MODEL, context_length: 8192, capabilities: ['streaming', 'function_calling', 'structured_output', 'reasoning'] },
          { id: OVERLOADED, context_length: 8192, capabilities: ['streaming'] },
        ],
        [
          { model: MODEL, baseUrl: upstream.url, upstreamModel: 'tools' },
          { model: OVERLOADED, baseUrl: upstream.url, upstreamModel: 'busy' },
        ],
      ),
    );
    key = (await createKey(gw, 'acme')).key;
    client = new Anthropic({ apiKey: key, baseURL: gw.url, maxRetries: 0 });
  });
  after(() => c.closeAll());

  const tools = [{ name: 'f', input_schema: { type: 'object' as const } }];

  it('sends two assistant turns in a row as one message, its calls followed by their results', async () => {
    await client.messages.create({
      model: MODEL,
      max_tokens: 50,
      tools,
      messages: [
        { role: 'user', content: 'x' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'f', input: {} }] },
        { role: 'assistant', content: [{ type: 'tool_use', id: 't2', name: 'f', input: { a: 1 } }] },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 't1', content: '1' },
            { type: 'tool_result', tool_use_id: 't2', content: '2' },
          ],
        },
      ],
    });
    const messages = sent.at(-1)!.messages;
    assert.deepEqual(
      messages.map((m) => [m.role, (m.tool_calls ?? []).map((t) => t.id).join(',') || m.tool_call_id || '']),
      [
        ['user', ''],
        ['assistant', 't1,t2'],
        ['tool', 't1'],
        ['tool', 't2'],
      ],
    );
  });

  it('asks the upstream for strict structured output (output_config.format promises it)', async () => {
    await http(gw.url, 'POST', '/v1/messages', {
      headers: { 'x-api-key': key, 'anthropic-version': '2023-06-01' },
      body: {
        model: MODEL,
        max_tokens: 50,
        messages: [{ role: 'user', content: 'x' }],
        output_config: { format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'string' } } } } },
      },
    });
    assert.deepEqual((sent.at(-1)!.response_format as { json_schema: { strict?: boolean } }).json_schema.strict, true);
  });

  it('refuses what Anthropic refuses: deep tool input (not a 500), empty text, repeated tool_use ids, thinking without a budget', async () => {
    const refused = async (body: Record<string, unknown> | string, path = '/v1/messages'): Promise<string> => {
      const res = await http(gw.url, 'POST', path, { headers: { 'x-api-key': key, 'anthropic-version': '2023-06-01' }, body });
      assert.equal(res.status, 400, res.text);
      const e = res.json as unknown as { type: string; error: { type: string; message: string } };
      assert.equal(e.type, 'error');
      assert.equal(e.error.type, 'invalid_request_error');
      assert.ok(res.headers['request-id'], 'request-id header');
      return e.error.message;
    };
    const withCall = (input: unknown, id2 = 't2') => ({
      model: MODEL,
      max_tokens: 10,
      messages: [
        { role: 'user', content: 'x' },
        {
          role: 'assistant',
          content: [
            { type: 'tool_use', id: 't1', name: 'f', input },
            { type: 'tool_use', id: id2, name: 'f', input: {} },
          ],
        },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 't1', content: 'ok' },
            { type: 'tool_result', tool_use_id: id2, content: 'ok' },
          ],
        },
      ],
    });
    // 5,000 levels in 10 KB (written as text: JSON.stringify, here as in the server, overflows the stack on it).
    const deepCall = JSON.stringify(withCall({ x: 'DEEP' })).replace('"DEEP"', deepText(5000));
    assert.match(await refused(deepCall), /nests deeper/);
    assert.match(await refused(deepCall, '/v1/messages/count_tokens'), /nests deeper/);
    assert.match(await refused(withCall({}, 't1')), /unique/);
    assert.match(
      await refused({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'text', text: '' }] }] }),
      /non-empty/,
    );
    const thinking = (t: Record<string, unknown>) => ({
      model: MODEL,
      max_tokens: 4096,
      thinking: t,
      messages: [{ role: 'user', content: 'x' }],
    });
    assert.match(await refused(thinking({ type: 'enabled' })), /budget_tokens/);
    assert.match(await refused(thinking({ type: 'enabled', budget_tokens: 512 })), /1024/);
    // Ten thousand messages at most: each is decoded on the event loop (MAX_INPUT_ITEMS).
    const many = Array.from({ length: 10_001 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'hi' }));
    assert.match(await refused({ model: MODEL, max_tokens: 10, messages: many }), /more than 10000 items/);
    assert.match(await refused({ model: MODEL, messages: many }, '/v1/messages/count_tokens'), /more than 10000 items/);
    // Within the bound, a nested input is taken.
    const ok = await client.messages.create({
      ...(withCall({ x: JSON.parse(deepText(100)) as unknown }) as Anthropic.MessageCreateParamsNonStreaming),
      tools,
    });
    assert.equal(ok.stop_reason, 'tool_use');
  });

  it('answers tool arguments nested past the bound with an empty input, not a 500', async () => {
    const m = await client.messages.create({ model: MODEL, max_tokens: 50, tools, messages: [{ role: 'user', content: 'deep please' }] });
    const call = m.content.find((b) => b.type === 'tool_use');
    assert.ok(call && call.type === 'tool_use');
    assert.deepEqual(call.input, {});
  });

  it("passes on an upstream's overloaded answer as Anthropic's overloaded_error (529), not a generic 502", async () => {
    await assert.rejects(
      client.messages.create({ model: OVERLOADED, max_tokens: 10, messages: [{ role: 'user', content: 'x' }] }),
      (err: unknown) => {
        assert.ok(err instanceof Anthropic.APIError);
        assert.equal(err.status, 529);
        assert.equal((err.error as { error: { type: string } }).error.type, 'overloaded_error');
        return true;
      },
    );
  });
});
