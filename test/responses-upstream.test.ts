import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { createKey, http, readSse, startServer, tempDir, type TestServer } from './helpers/server.js';
import { checkStream, type WireResponse } from './helpers/responses.js';
import { deadUrl } from './helpers/fixtures.js';
import { eventually } from './helpers/wait.js';

/**
 * A fixture upstream for what stories260K cannot do on demand: reasoning deltas, tool calls and a
 * stream that breaks. It speaks the chat-completions stream exactly as vLLM/DeepSeek do.
 */
interface WireMessage {
  role: string;
  content: string | null;
  reasoning_content?: string;
  tool_calls?: unknown[];
  tool_call_id?: string;
}
interface SeenBody {
  messages: WireMessage[];
  tools?: unknown[];
  tool_choice?: unknown;
  reasoning_effort?: string;
  stream?: boolean;
}

function fixtureUpstream(seen: SeenBody[]): Server {
  return createServer((req, res) => {
    let raw = '';
    req.on('data', (d: Buffer) => {
      raw += d.toString();
    });
    req.on('end', () => {
      const body = JSON.parse(raw) as SeenBody;
      seen.push(body);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const send = (delta: object, finish: string | null = null) =>
        res.write(
          `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'fixture', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`,
        );
      const usage = (prompt: number, completion: number, reasoning: number) =>
        res.write(
          `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'fixture', choices: [], usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, completion_tokens_details: { reasoning_tokens: reasoning } } })}\n\n`,
        );
      const last = body.messages.at(-1)!;
      send({ role: 'assistant', content: '' });
      if (last.role === 'tool') {
        send({ content: 'It is sunny in Paris.' });
        send({}, 'stop');
        usage(30, 6, 0);
      } else if (body.tools?.length) {
        send({ tool_calls: [{ index: 0, id: 'call_abc', type: 'function', function: { name: 'get_weather', arguments: '' } }] });
        send({ tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] });
        send({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] });
        send({}, 'tool_calls');
        usage(20, 8, 0);
      } else if (String(last.content).includes('vanish')) {
        // Takes the request, then goes before any output.
        res.end();
        return;
      } else if (String(last.content).includes('break')) {
        send({ reasoning_content: 'Hmm.' });
        send({ content: 'Once' });
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      } else {
        send({ reasoning_content: 'The user wants a story. ' });
        send({ reasoning_content: 'I will write one.' });
        send({ content: 'Once upon ' });
        send({ content: 'a time.' });
        send({}, 'stop');
        usage(12, 9, 5);
      }
      res.end('data: [DONE]\n\n');
    });
  });
}

const MODEL = 'deepseek/fixture-reasoner';

describe('Responses: reasoning, function calls and failures (fixture upstream)', () => {
  const seen: SeenBody[] = [];
  let upstream: Server;
  let server: TestServer;
  let client: OpenAI;
  let key: string;

  before(async () => {
    upstream = fixtureUpstream(seen);
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
    const port = (upstream.address() as AddressInfo).port;
    // An upstream that never takes the request.
    const dead = await deadUrl();
    server = await startServer({
      modelsDir: tempDir(),
      configFile: {
        name: 'r.json',
        text: JSON.stringify({
          models: [
            { id: MODEL, context_length: 8192, capabilities: ['streaming', 'function_calling', 'reasoning'] },
            { id: 'deepseek/plain', context_length: 8192, capabilities: ['streaming'] },
            { id: 'deepseek/unreachable', context_length: 8192, capabilities: ['streaming'] },
          ],
          deployments: [
            { model: MODEL, baseUrl: `http://127.0.0.1:${port}/v1`, upstreamModel: 'fixture' },
            { model: 'deepseek/plain', baseUrl: `http://127.0.0.1:${port}/v1`, upstreamModel: 'fixture' },
            { model: 'deepseek/unreachable', baseUrl: dead, upstreamModel: 'fixture' },
          ],
        }),
      },
    });
    key = (await createKey(server, 'acme')).key;
    client = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
  });
  after(async () => {
    await server.close();
    await new Promise((r) => upstream.close(r));
  });

  it('asks the upstream for a whole answer only when the client did (foreground, not streamed), and reads the stream it gets anyway', async () => {
    const whole = await client.responses.create({ model: MODEL, input: 'Tell me a story.' });
    assert.equal(seen.at(-1)!.stream, false, 'a foreground non-stream response asks for the whole answer');
    // This upstream streams whatever it is asked, as some servers do: the answer is read all the same.
    assert.equal(whole.status, 'completed');
    assert.equal(whole.output_text, 'Once upon a time.');
    assert.equal(whole.usage?.output_tokens, 9);

    const streamed = await client.responses.create({ model: MODEL, input: 'Tell me a story.', stream: true });
    for await (const ev of streamed) void ev;
    assert.equal(seen.at(-1)!.stream, true, 'a streamed response streams from the upstream');

    const background = await client.responses.create({ model: MODEL, input: 'Tell me a story.', background: true });
    await eventually(async () => assert.equal((await client.responses.retrieve(background.id)).status, 'completed'));
    assert.equal(seen.at(-1)!.stream, true, 'a background response streams from the upstream, to read as in progress as it goes');
  });

  it('answers a non-stream chat completion whole when the upstream streams it anyway (text and tool calls), billed from its usage', async () => {
    const { data: chat, response } = await client.chat.completions
      .create({ model: MODEL, messages: [{ role: 'user', content: 'Tell me a story.' }] })
      .withResponse();
    assert.equal(seen.at(-1)!.stream, false, 'a non-stream chat completion asks for the whole answer');
    assert.equal(chat.object, 'chat.completion');
    assert.equal(chat.model, MODEL);
    assert.equal(chat.choices[0]!.message.content, 'Once upon a time.');
    assert.equal(chat.choices[0]!.finish_reason, 'stop');
    assert.equal(chat.usage?.prompt_tokens, 12);
    assert.equal(chat.usage?.completion_tokens, 9);

    const call = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [
        { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
      ],
    });
    assert.equal(call.choices[0]!.finish_reason, 'tool_calls');
    const tc = call.choices[0]!.message.tool_calls?.[0];
    assert.ok(tc && tc.type === 'function');
    assert.equal(tc.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris' });
    assert.equal(call.usage?.completion_tokens, 8);

    // The usage record is the upstream's own count, not an estimate.
    const db = new SqliteDatabase(join(server.dataDir, 'switchyard.db'), { readonly: true });
    try {
      // Committed before the answer went out.
      const row = db.prepare('select * from usage_records where request_id = ?').get(response.headers.get('x-request-id')) as
        Record<string, unknown> | undefined;
      assert.ok(row, 'the usage record is written');
      assert.equal(row['input_tokens'], 12);
      assert.equal(row['output_tokens'], 9);
      assert.equal(row['estimated'], 0);
    } finally {
      db.close();
    }
  });

  it('puts the reasoning item before the message, with content, summary and reasoning_tokens', async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Tell me a story.', reasoning: { effort: 'high', summary: 'auto' } });
    assert.equal(r.status, 'completed');
    assert.deepEqual(
      r.output.map((o) => o.type),
      ['reasoning', 'message'],
    );
    const rs = r.output[0]!;
    assert.ok(rs.type === 'reasoning');
    assert.match(rs.id, /^rs_/);
    assert.deepEqual(rs.content, [{ type: 'reasoning_text', text: 'The user wants a story. I will write one.' }]);
    assert.deepEqual(rs.summary, [{ type: 'summary_text', text: 'The user wants a story. I will write one.' }]);
    assert.equal(r.output_text, 'Once upon a time.');
    assert.equal(r.usage?.output_tokens_details.reasoning_tokens, 5);
    assert.equal(seen.at(-1)!.reasoning_effort, 'high', 'effort is passed to the engine');

    const concise = await client.responses.create({ model: MODEL, input: 'Tell me a story.', reasoning: { summary: 'concise' } });
    assert.ok(concise.output[0]!.type === 'reasoning');
    assert.deepEqual(concise.output[0]!.summary, [{ type: 'summary_text', text: 'The user wants a story.' }]);
    const none = await client.responses.create({ model: MODEL, input: 'Tell me a story.' });
    assert.ok(none.output[0]!.type === 'reasoning');
    assert.deepEqual(none.output[0]!.summary, [], 'no summary unless asked for');
  });

  it('streams reasoning events in the documented order, and the SDK helper accepts them', async () => {
    const { events } = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'Tell me a story.', reasoning: { summary: 'auto' }, stream: true },
    });
    const parsed = checkStream(events);
    // Every item has its status (and every field its zero value) from the event that adds it.
    assert.deepEqual(parsed.find((e) => e.type === 'response.output_item.added')!.item, {
      id: parsed.find((e) => e.type === 'response.output_item.added')!.item!.id,
      type: 'reasoning',
      summary: [],
      content: [],
      status: 'in_progress',
    });
    const types = parsed.map((e) => e.type);
    assert.deepEqual(types, [
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      'response.reasoning_text.delta',
      'response.reasoning_text.delta',
      'response.reasoning_text.done',
      'response.content_part.done',
      'response.reasoning_summary_part.added',
      'response.reasoning_summary_text.delta',
      'response.reasoning_summary_text.done',
      'response.reasoning_summary_part.done',
      'response.output_item.done',
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    const final = await client.responses
      .stream({ model: MODEL, input: 'Tell me a story.', reasoning: { summary: 'auto' } })
      .finalResponse();
    assert.deepEqual(
      final.output.map((o) => o.type),
      ['reasoning', 'message'],
    );
    assert.equal(final.output_text, 'Once upon a time.');
  });

  it('seals reasoning into encrypted_content, opens it on a stateless follow-up, and rejects tampering', async () => {
    const first = await client.responses.create({
      model: MODEL,
      input: 'Tell me a story.',
      store: false,
      include: ['reasoning.encrypted_content'],
    });
    const rs = first.output[0]!;
    assert.ok(rs.type === 'reasoning' && typeof rs.encrypted_content === 'string');
    assert.ok(!rs.encrypted_content!.includes('story'), 'sealed, not readable');

    const replayedItems = [
      { type: 'reasoning' as const, id: rs.id, summary: [], encrypted_content: rs.encrypted_content! },
      ...first.output.slice(1),
      { role: 'user' as const, content: 'Go on.' },
    ];
    const next = await client.responses.create({ model: MODEL, store: false, input: replayedItems as OpenAI.Responses.ResponseInput });
    assert.equal(next.status, 'completed');
    const sentUpstream = seen.at(-1)!.messages;
    const assistant = sentUpstream.find((m) => m.role === 'assistant');
    assert.equal(
      assistant?.reasoning_content,
      'The user wants a story. I will write one.',
      'the decrypted reasoning went back into the prompt',
    );
    assert.equal(assistant?.content, 'Once upon a time.');

    const sealed = rs.encrypted_content!;
    const flipped = sealed.slice(0, 20) + (sealed[20] === 'A' ? 'B' : 'A') + sealed.slice(21);
    const tampered = replayedItems.map((i) => ('encrypted_content' in i ? { ...i, encrypted_content: flipped } : i));
    await assert.rejects(
      client.responses.create({ model: MODEL, store: false, input: tampered as OpenAI.Responses.ResponseInput }),
      (e: unknown) => {
        assert.ok(e instanceof OpenAI.BadRequestError);
        assert.match(e.message, /encrypted_content/);
        assert.equal(e.param, 'input[0].encrypted_content', 'the field of the item that failed');
        return true;
      },
    );
    const other = new OpenAI({ apiKey: (await createKey(server, 'globex')).key, baseURL: server.baseURL, maxRetries: 0 });
    await assert.rejects(
      other.responses.create({ model: MODEL, store: false, input: replayedItems as OpenAI.Responses.ResponseInput }),
      (e: unknown) => e instanceof OpenAI.BadRequestError,
      'sealed for one organization only',
    );
  });

  it("seals a stored response's reasoning when GET includes reasoning.encrypted_content, and refuses an unknown include", async () => {
    const stored = await client.responses.create({ model: MODEL, input: 'Tell me a story.' });
    const plain = await client.responses.retrieve(stored.id);
    assert.ok(plain.output[0]?.type === 'reasoning' && plain.output[0].encrypted_content === undefined);
    const sealed = await client.responses.retrieve(stored.id, { include: ['reasoning.encrypted_content'] });
    const rs = sealed.output[0]!;
    assert.ok(rs.type === 'reasoning' && typeof rs.encrypted_content === 'string', JSON.stringify(rs));
    // It opens as any sealed reasoning does: sent back on a stateless follow-up.
    const next = await client.responses.create({
      model: MODEL,
      store: false,
      input: [
        { type: 'reasoning', id: rs.id, summary: [], encrypted_content: rs.encrypted_content! },
        ...(sealed.output.slice(1) as OpenAI.Responses.ResponseInput),
        { role: 'user', content: 'Go on.' },
      ],
    });
    assert.equal(next.status, 'completed');
    assert.equal(seen.at(-1)!.messages.find((m) => m.role === 'assistant')?.reasoning_content, 'The user wants a story. I will write one.');
    for (const path of [`/v1/responses/${stored.id}?include=bogus`, `/v1/responses/${stored.id}/input_items?include[]=bogus`]) {
      const res = await http(server.url, 'GET', path, { key });
      assert.equal(res.status, 400, `${path}: ${res.text}`);
      assert.equal(res.json.error.param, 'include');
    }
  });

  it('produces function_call items with call_id, and a function_call_output continues the turn', async () => {
    const tools: OpenAI.Responses.Tool[] = [
      {
        type: 'function',
        name: 'get_weather',
        description: 'Weather for a city',
        strict: true,
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
      },
    ];
    const { events } = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'Weather in Paris?', tools, tool_choice: { type: 'function', name: 'get_weather' }, stream: true },
    });
    const parsed = checkStream(events);
    assert.deepEqual(
      parsed.map((e) => e.type),
      [
        'response.created',
        'response.in_progress',
        'response.output_item.added',
        'response.function_call_arguments.delta',
        'response.function_call_arguments.delta',
        'response.function_call_arguments.done',
        'response.output_item.done',
        'response.completed',
      ],
    );
    assert.deepEqual(seen.at(-1)!.tool_choice, { type: 'function', function: { name: 'get_weather' } });
    const done = parsed.at(-1)!.response!;
    const call = done.output[0] as unknown as {
      type: string;
      call_id: string;
      name: string;
      arguments: string;
      status: string;
      id: string;
    };
    assert.equal(call.type, 'function_call');
    assert.equal(call.call_id, 'call_abc');
    assert.equal(call.name, 'get_weather');
    assert.equal(call.arguments, '{"city":"Paris"}');
    assert.equal(call.status, 'completed');
    assert.match(call.id, /^fc_/);

    const next = await client.responses.create({
      model: MODEL,
      previous_response_id: done.id,
      tools,
      input: [{ type: 'function_call_output', call_id: 'call_abc', output: '{"temp":21,"sky":"clear"}' }],
    });
    assert.equal(next.output_text, 'It is sunny in Paris.');
    const msgs = seen.at(-1)!.messages;
    assert.deepEqual(
      msgs.slice(-2).map((m) => m.role),
      ['assistant', 'tool'],
    );
    assert.equal(msgs.at(-1)!.tool_call_id, 'call_abc');
    assert.equal(msgs.at(-1)!.content, '{"temp":21,"sky":"clear"}');
  });

  it('fails with response.failed and error {code, message} when the engine breaks mid-stream', async () => {
    const { events } = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'please break', stream: true },
    });
    const parsed = checkStream(events);
    const last = parsed.at(-1)!;
    assert.equal(last.type, 'response.failed');
    assert.equal(last.response!.status, 'failed');
    assert.equal(typeof last.response!.error?.code, 'string');
    assert.match(last.response!.error?.message ?? '', /upstream/i);
    const stored = await http<WireResponse>(server.url, 'GET', `/v1/responses/${last.response!.id}`, { key });
    assert.equal(stored.json.status, 'failed');
    assert.deepEqual(stored.json.error, last.response!.error);
  });

  it('replays a background response that failed before an engine took it without a response.in_progress it never had', async () => {
    const live = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: 'deepseek/unreachable', input: 'hello', background: true, stream: true },
    });
    const liveEvents = checkStream(live.events);
    const states = (evs: typeof liveEvents) => evs.map((e) => [e.type, e.response?.status]);
    assert.deepEqual(states(liveEvents), [
      ['response.created', 'queued'],
      ['response.queued', 'queued'],
      ['error', undefined],
      ['response.failed', 'failed'],
    ]);
    const replay = await readSse(server.url, 'GET', `/v1/responses/${liveEvents[0]!.response!.id}?stream=true`, { key });
    assert.deepEqual(states(checkStream(replay.events)), states(liveEvents));
    // An upstream that took it (its input is counted) and failed before any output: the same.
    const taken = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: MODEL, input: 'vanish', background: true, stream: true },
    });
    const takenEvents = checkStream(taken.events);
    assert.deepEqual(states(takenEvents), states(liveEvents));
    const again = await readSse(server.url, 'GET', `/v1/responses/${takenEvents[0]!.response!.id}?stream=true`, { key });
    assert.deepEqual(states(checkStream(again.events)), states(liveEvents));
  });

  it('answers a foreground non-stream response that failed with the error it failed with, and stores it as failed', async () => {
    const before = new Set(
      (await http<{ data: Array<{ id: string }> }>(server.url, 'GET', '/v1/responses?limit=100', { key })).json.data.map((r) => r.id),
    );
    const res = await http(server.url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'please break' } });
    assert.equal(res.status, 502, res.text);
    assert.equal(res.json.error.type, 'server_error');
    assert.match(res.json.error.message, /upstream/i);
    // The deployment (config-0 here: internal topology) is in the log, not in the client's error.
    assert.doesNotMatch(res.json.error.message, /config-\d/);
    assert.ok(res.headers['x-request-id']);
    const listed = (await http<{ data: WireResponse[] }>(server.url, 'GET', '/v1/responses?limit=100', { key })).json.data;
    const stored = listed.filter((r) => !before.has(r.id));
    assert.deepEqual(
      stored.map((r) => [r.status, r.error?.code]),
      [['failed', res.json.error.code]],
    );
  });

  it('refuses tools and structured output for a model that does not advertise them, naming the capability', async () => {
    const tools = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: 'deepseek/plain', input: 'x', tools: [{ type: 'function', name: 'f' }] },
    });
    assert.equal(tools.status, 400);
    assert.equal(tools.json.error.code, 'missing_capability');
    assert.match(tools.json.error.message, /function_calling/);
    const format = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: 'deepseek/plain', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_object' } },
    });
    assert.equal(format.status, 400);
    assert.match(format.json.error.message, /structured_output/);
  });
});
