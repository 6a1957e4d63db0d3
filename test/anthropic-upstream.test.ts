/**
 * Deployments with `api: anthropic`: chat completions, Responses and Messages clients (the official
 * `openai` and `@anthropic-ai/sdk` packages) reaching an upstream that speaks Anthropic's Messages
 * API. The upstream is a fixture replaying the Messages wire as Anthropic documents it (streamed
 * text, tool use, thinking with signature deltas, a stop sequence, an overloaded error), since no
 * Anthropic server is reachable here. It also checks what Switchyard sends: the key in `x-api-key`
 * (never a Bearer token), `anthropic-version`, and a translated body.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { chatFixture, closers, completionBody, fixture } from './helpers/fixtures.js';
import { createKey, startServer, tempDir } from './helpers/server.js';

const SECRET = 'sk-ant-api03-fixture-secret-0123456789abcdef';
const MODEL = 'anthropic/claude-fixture';
/** Served by an Anthropic deployment and a chat-completions one. */
const MIXED = 'anthropic/claude-mixed';
const UPSTREAM_SIGNATURE = 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds';

interface SeenRequest {
  headers: IncomingMessage['headers'];
  body: {
    model: string;
    max_tokens: number;
    stream: boolean;
    system?: string | Array<Record<string, unknown>>;
    messages: Array<{ role: string; content: Array<Record<string, unknown>> }>;
    tools?: Array<{ name: string; input_schema: unknown; cache_control?: unknown }>;
    tool_choice?: Record<string, unknown>;
    thinking?: { type: string; budget_tokens: number };
    stop_sequences?: string[];
    temperature?: number;
  };
}

const sse = (res: ServerResponse, type: string, data: Record<string, unknown>) =>
  res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);

/** One recorded Messages stream, chosen by what the request asks for. */
function anthropicFixture(seen: SeenRequest[]) {
  return (req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as SeenRequest['body'];
      seen.push({ headers: req.headers, body });
      if (req.url !== '/v1/messages' || req.headers['x-api-key'] !== SECRET) {
        res.writeHead(401, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } }));
        return;
      }
      const last = body.messages.at(-1)!;
      const lastText = last.content.map((b) => (b['type'] === 'text' ? String(b['text']) : '')).join('');
      if (lastText.includes('overload')) {
        res.writeHead(529, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // A request with cache breakpoints writes 30 tokens to the cache, as Anthropic reports it.
      const usage = {
        input_tokens: 20,
        cache_creation_input_tokens: raw.includes('"cache_control"') ? 30 : 0,
        cache_read_input_tokens: 6,
        output_tokens: 1,
      };
      sse(res, 'message_start', {
        message: {
          id: 'msg_01Fx',
          type: 'message',
          role: 'assistant',
          model: body.model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage,
        },
      });
      sse(res, 'ping', {});
      let stop = 'end_turn';
      let stopSequence: string | null = null;
      let index = 0;
      if (body.thinking) {
        sse(res, 'content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'thinking_delta', thinking: 'Let me think. ' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'thinking_delta', thinking: 'Done.' } });
        sse(res, 'content_block_delta', {
          index,
          delta: { type: 'signature_delta', signature: UPSTREAM_SIGNATURE },
        });
        sse(res, 'content_block_stop', { index });
        index++;
      }
      if (lastText.includes('whole input')) {
        // Arguments given whole in the block's start, and a call with none at all.
        sse(res, 'content_block_start', {
          index,
          content_block: { type: 'tool_use', id: 'toolu_whole', name: 'get_weather', input: { city: 'Paris' } },
        });
        sse(res, 'content_block_stop', { index });
        index++;
        sse(res, 'content_block_start', { index, content_block: { type: 'tool_use', id: 'toolu_none', name: 'get_time', input: {} } });
        sse(res, 'content_block_stop', { index });
        stop = 'tool_use';
      } else if (lastText.includes('own stop')) {
        // A stop_sequence the request never gave (the upstream's own text, here its key).
        sse(res, 'content_block_start', { index, content_block: { type: 'text', text: '' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'text_delta', text: 'Stopped.' } });
        sse(res, 'content_block_stop', { index });
        stop = 'stop_sequence';
        stopSequence = SECRET;
      } else if (body.tools?.length && last.content.every((b) => b['type'] !== 'tool_result')) {
        sse(res, 'content_block_start', { index, content_block: { type: 'text', text: '' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'text_delta', text: 'Checking.' } });
        sse(res, 'content_block_stop', { index });
        index++;
        sse(res, 'content_block_start', {
          index,
          content_block: { type: 'tool_use', id: 'toolu_01A09q90qw90lq917835lq9', name: 'get_weather', input: {} },
        });
        sse(res, 'content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: '' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: '{"city": "Par' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: 'is"}' } });
        sse(res, 'content_block_stop', { index });
        stop = 'tool_use';
      } else {
        const text = last.content.some((b) => b['type'] === 'tool_result') ? 'It is sunny in Paris.' : 'Hello from the fixture.';
        sse(res, 'content_block_start', { index, content_block: { type: 'text', text: '' } });
        sse(res, 'content_block_delta', { index, delta: { type: 'text_delta', text: text.slice(0, 6) } });
        sse(res, 'content_block_delta', { index, delta: { type: 'text_delta', text: text.slice(6) } });
        sse(res, 'content_block_stop', { index });
        if (body.stop_sequences?.includes('END')) {
          stop = 'stop_sequence';
          stopSequence = 'END';
        }
      }
      sse(res, 'message_delta', { delta: { stop_reason: stop, stop_sequence: stopSequence }, usage: { output_tokens: 15 } });
      sse(res, 'message_stop', {});
      res.end();
    });
  };
}

describe('Anthropic upstreams (api: anthropic) for chat completions, Responses and Messages clients', () => {
  const c = closers();
  const seen: SeenRequest[] = [];
  let openai: OpenAI;
  let anthropic: Anthropic;

  before(async () => {
    const upstream = c.keep(await fixture(anthropicFixture(seen)));
    // A chat-completions upstream beside it for MIXED, which both serve.
    const chat = c.keep(
      await chatFixture((_stream, res) => {
        res.writeHead(200, { 'content-type': 'application/json' }).end(completionBody('{"from":"chat"}'));
      }),
    );
    const server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        env: { FIXTURE_ANTHROPIC_KEY: SECRET },
        configFile: {
          name: 'a.json',
          text: JSON.stringify({
            models: [
              { id: MODEL, context_length: 200000, capabilities: ['streaming', 'function_calling', 'reasoning', 'structured_output'] },
              { id: MIXED, context_length: 200000, capabilities: ['streaming', 'structured_output'] },
            ],
            deployments: [
              {
                model: MODEL,
                baseUrl: upstream.url,
                upstreamModel: 'claude-fixture-1',
                apiKeyEnv: 'FIXTURE_ANTHROPIC_KEY',
                api: 'anthropic',
              },
              {
                model: MIXED,
                baseUrl: upstream.url,
                upstreamModel: 'claude-fixture-1',
                apiKeyEnv: 'FIXTURE_ANTHROPIC_KEY',
                api: 'anthropic',
              },
              { model: MIXED, baseUrl: chat.url, upstreamModel: 'chat-fixture' },
            ],
          }),
        },
      }),
    );
    const { key } = await createKey(server, 'claude-users');
    openai = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
    anthropic = new Anthropic({ apiKey: key, baseURL: server.url, maxRetries: 0 });
  });
  after(() => c.closeAll());

  it('sends the key as x-api-key with anthropic-version, and a Messages body', async () => {
    const r = await openai.chat.completions.create({
      model: MODEL,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hi' },
      ],
      temperature: 1.5,
      stop: ['END'],
    });
    const sent = seen.at(-1)!;
    assert.equal(sent.headers['x-api-key'], SECRET);
    assert.equal(sent.headers['authorization'], undefined);
    assert.equal(sent.headers['anthropic-version'], '2023-06-01');
    assert.equal(sent.body.model, 'claude-fixture-1');
    assert.equal(sent.body.system, 'Be brief.');
    assert.equal(sent.body.max_tokens, 4096);
    assert.equal(sent.body.temperature, 1, 'clamped to Anthropic’s range');
    assert.deepEqual(sent.body.stop_sequences, ['END']);
    assert.deepEqual(sent.body.messages, [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }]);
    assert.equal(r.choices[0]!.message.content, 'Hello from the fixture.');
    assert.equal(r.choices[0]!.finish_reason, 'stop');
    // Anthropic's input excludes cache reads; the canonical count includes them.
    assert.equal(r.usage?.prompt_tokens, 26);
    assert.equal(r.usage?.prompt_tokens_details?.cached_tokens, 6);
    assert.equal(r.usage?.completion_tokens, 15);
    assert.ok(!JSON.stringify(r).includes(SECRET));
  });

  it('refuses a json_object format (Anthropic has no JSON mode) instead of answering in prose', async () => {
    // An outside pass: it was dropped, and JSON.parse of the answer failed.
    const before = seen.length;
    await assert.rejects(
      openai.chat.completions.create({
        model: MODEL,
        messages: [{ role: 'user', content: 'JSON' }],
        response_format: { type: 'json_object' },
      }),
      (err: unknown) =>
        err instanceof OpenAI.BadRequestError &&
        err.code === 'unsupported_parameter' &&
        err.param === 'response_format' &&
        /json_schema/.test(err.message),
    );
    await assert.rejects(
      openai.responses.create({ model: MODEL, input: 'JSON', text: { format: { type: 'json_object' } } }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && err.code === 'unsupported_parameter' && err.param === 'text.format',
    );
    assert.equal(seen.length, before, 'nothing was sent to the upstream');
    // A model served by an Anthropic deployment and another: json_object goes to the other, every
    // time (it was a 400 by the weighted pick on some requests).
    for (let i = 0; i < 8; i++) {
      const r = await openai.chat.completions.create({
        model: MIXED,
        messages: [{ role: 'user', content: 'JSON' }],
        response_format: { type: 'json_object' },
      });
      assert.deepEqual(JSON.parse(r.choices[0]!.message.content!), { from: 'chat' });
    }
    assert.equal(seen.length, before, 'nothing was sent to the Anthropic upstream');
    // A schema is sent as Anthropic's output_config.format.
    await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'JSON' }],
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string' } } } },
      },
    });
    assert.deepEqual((seen.at(-1)!.body as Record<string, unknown>)['output_config'], {
      format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'string' } } } },
    });
  });

  it('streams chat completions, tool calls included, and takes the tool result back', async () => {
    const tools: OpenAI.ChatCompletionTool[] = [
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
    ];
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools,
      tool_choice: 'required',
      parallel_tool_calls: false,
      stream: true,
    });
    let args = '';
    let id = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      const call = chunk.choices[0]?.delta.tool_calls?.[0];
      if (call?.id) id = call.id;
      args += call?.function?.arguments ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(id, 'toolu_01A09q90qw90lq917835lq9');
    assert.deepEqual(JSON.parse(args), { city: 'Paris' });
    assert.equal(finish, 'tool_calls');
    assert.deepEqual(seen.at(-1)!.body.tool_choice, { type: 'any', disable_parallel_tool_use: true });
    assert.deepEqual(seen.at(-1)!.body.tools?.[0]?.name, 'get_weather');

    const r = await openai.chat.completions.create({
      model: MODEL,
      tools,
      reasoning_effort: 'low',
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'get_weather', arguments: args } }] },
        { role: 'tool', tool_call_id: id, content: 'sunny' },
      ],
    });
    assert.equal(r.choices[0]!.message.content, 'It is sunny in Paris.');
    // The tool-use turn has no Anthropic-signed thinking to send back, so this request goes without
    // thinking (Anthropic would refuse the turn with it).
    assert.equal(seen.at(-1)!.body.thinking, undefined);
    const sent = seen.at(-1)!.body.messages;
    assert.deepEqual(sent[1], { role: 'assistant', content: [{ type: 'tool_use', id, name: 'get_weather', input: { city: 'Paris' } }] });
    assert.deepEqual(sent[2], {
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: id, content: [{ type: 'text', text: 'sunny' }] }],
    });
  });

  it('serves Responses clients, with reasoning from thinking blocks', async () => {
    const r = await openai.responses.create({ model: MODEL, input: 'Think, then greet.', reasoning: { effort: 'medium' }, store: false });
    assert.equal(r.status, 'completed');
    assert.deepEqual(
      r.output.map((o) => o.type),
      ['reasoning', 'message'],
    );
    assert.equal(r.output_text, 'Hello from the fixture.');
    assert.deepEqual(seen.at(-1)!.body.thinking, { type: 'enabled', budget_tokens: 4096 });
    // An effort's budget that does not fit under the output limit takes half of it, not all or none.
    await openai.responses.create({ model: MODEL, input: 'Think.', reasoning: { effort: 'high' }, max_output_tokens: 3000, store: false });
    assert.deepEqual(seen.at(-1)!.body.thinking, { type: 'enabled', budget_tokens: 1500 });
  });

  it('serves Messages clients: stream, tools, stop sequence, thinking', async () => {
    const stream = anthropic.messages.stream({
      model: MODEL,
      max_tokens: 8000,
      thinking: { type: 'enabled', budget_tokens: 2048 },
      messages: [{ role: 'user', content: 'Hello' }],
    });
    const final = await stream.finalMessage();
    assert.deepEqual(
      final.content.map((b) => b.type),
      ['thinking', 'text'],
    );
    const thinking = final.content[0]!;
    assert.ok(thinking.type === 'thinking' && thinking.thinking === 'Let me think. Done.' && thinking.signature.length > 20);
    // The client's own budget, as it gave it (not its effort's bucket), whatever effort it names.
    assert.deepEqual(seen.at(-1)!.body.thinking, { type: 'enabled', budget_tokens: 2048 });
    await anthropic.messages.create({
      model: MODEL,
      max_tokens: 8000,
      thinking: { type: 'enabled', budget_tokens: 3000 },
      output_config: { effort: 'high' },
      messages: [{ role: 'user', content: 'Hello' }],
    } as Anthropic.MessageCreateParamsNonStreaming);
    assert.deepEqual(seen.at(-1)!.body.thinking, { type: 'enabled', budget_tokens: 3000 });
    assert.equal(final.usage.input_tokens, 20);
    assert.equal(final.usage.cache_read_input_tokens, 6);
    // message_start already has the upstream's count of the prompt (its own message_start gave it), not an estimate.
    const again = anthropic.messages.stream({ model: MODEL, max_tokens: 8000, messages: [{ role: 'user', content: 'Hello' }] });
    let started: Anthropic.Usage | undefined;
    for await (const ev of again) if (ev.type === 'message_start') started = ev.message.usage;
    assert.deepEqual([started?.input_tokens, started?.cache_read_input_tokens], [20, 6]);

    const tool = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      tools: [{ name: 'get_weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
      messages: [{ role: 'user', content: 'Weather?' }],
    });
    assert.equal(tool.stop_reason, 'tool_use');
    assert.deepEqual(
      tool.content.map((b) => b.type),
      ['text', 'tool_use'],
    );
    const use = tool.content[1]!;
    assert.ok(use.type === 'tool_use');
    assert.deepEqual(use.input, { city: 'Paris' });

    const stopped = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      stop_sequences: ['END'],
      messages: [{ role: 'user', content: 'Hi' }],
    });
    assert.equal(stopped.stop_reason, 'stop_sequence');
    assert.equal(stopped.stop_sequence, 'END');
  });

  it('passes cache_control through to Anthropic where the client put it, and reports the cache write', async () => {
    const ephemeral = { type: 'ephemeral' } as const;
    const r = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      system: [
        { type: 'text', text: 'A long, stable preamble.', cache_control: ephemeral },
        { type: 'text', text: 'Today is Tuesday.' },
      ],
      tools: [
        {
          name: 'get_weather',
          input_schema: { type: 'object', properties: { city: { type: 'string' } } },
          cache_control: { type: 'ephemeral', ttl: '1h' },
        },
      ],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        {
          role: 'assistant',
          content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' }, cache_control: ephemeral }],
        },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny', cache_control: ephemeral },
            { type: 'text', text: 'Thanks.', cache_control: ephemeral },
          ],
        },
      ],
    });
    const sent = seen.at(-1)!.body;
    assert.deepEqual(sent.system, [
      { type: 'text', text: 'A long, stable preamble.', cache_control: ephemeral },
      { type: 'text', text: 'Today is Tuesday.' },
    ]);
    assert.deepEqual(sent.tools?.[0]?.cache_control, { type: 'ephemeral', ttl: '1h' });
    assert.deepEqual(sent.messages[1], {
      role: 'assistant',
      content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' }, cache_control: ephemeral }],
    });
    assert.deepEqual(sent.messages[2], {
      role: 'user',
      content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'sunny' }], cache_control: ephemeral },
        { type: 'text', text: 'Thanks.', cache_control: ephemeral },
      ],
    });
    // Anthropic's input_tokens leaves out cache reads and writes, as the upstream reported them.
    assert.equal(r.usage.input_tokens, 20);
    assert.equal(r.usage.cache_creation_input_tokens, 30);
    assert.equal(r.usage.cache_read_input_tokens, 6);

    await assert.rejects(
      anthropic.messages.create({
        model: MODEL,
        max_tokens: 10,
        messages: [
          { role: 'user', content: [{ type: 'text', text: 'x', cache_control: { type: 'forever' } as unknown as typeof ephemeral }] },
        ],
      }),
      (err: unknown) => err instanceof Anthropic.BadRequestError && /cache_control/.test(err.message),
    );

    // Streamed, message_start says what message_delta says of the prompt: the cache write apart from the input.
    const streamed = anthropic.messages.stream({
      model: MODEL,
      max_tokens: 100,
      system: [{ type: 'text', text: 'A long, stable preamble.', cache_control: ephemeral }],
      messages: [{ role: 'user', content: 'Hi' }],
    });
    let atStart: Anthropic.Usage | undefined;
    // A copy: the SDK updates the message it started with as the stream goes on.
    for await (const ev of streamed) if (ev.type === 'message_start') atStart = { ...ev.message.usage };
    const atEnd = (await streamed.finalMessage()).usage;
    const prompt = (u: Anthropic.Usage | undefined) => [u?.input_tokens, u?.cache_creation_input_tokens, u?.cache_read_input_tokens];
    assert.deepEqual(prompt(atStart), prompt(atEnd));
    assert.deepEqual(prompt(atEnd), [20, 30, 6]);

    // Automatic caching: a top-level cache_control is a breakpoint on the last block (checked as a block's is).
    await anthropic.messages.create({
      model: MODEL,
      max_tokens: 10,
      cache_control: ephemeral,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    } as Anthropic.MessageCreateParamsNonStreaming);
    assert.deepEqual(seen.at(-1)!.body.messages.at(-1), {
      role: 'user',
      content: [{ type: 'text', text: 'Weather in Paris?', cache_control: ephemeral }],
    });
    // Several text blocks reach Anthropic as blocks, not run together ("Helloworld").
    await anthropic.messages.create({
      model: MODEL,
      max_tokens: 10,
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Hello' },
            { type: 'text', text: 'world' },
          ],
        },
      ],
    });
    assert.deepEqual(seen.at(-1)!.body.messages.at(-1)!.content, [
      { type: 'text', text: 'Hello' },
      { type: 'text', text: 'world' },
    ]);
    await assert.rejects(
      anthropic.messages.create({
        model: MODEL,
        max_tokens: 10,
        cache_control: { type: 'bogus' },
        messages: [{ role: 'user', content: 'x' }],
      } as unknown as Anthropic.MessageCreateParamsNonStreaming),
      (err: unknown) => err instanceof Anthropic.BadRequestError && /cache_control/.test(err.message),
    );
  });

  it('replays thinking to Anthropic with Anthropic’s own signature in a tool-use loop', async () => {
    const tools: Anthropic.Tool[] = [{ name: 'get_weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
    const first = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 8000,
      thinking: { type: 'enabled', budget_tokens: 2048 },
      tools,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    });
    assert.deepEqual(
      first.content.map((b) => b.type),
      ['thinking', 'text', 'tool_use'],
    );
    const thinking = first.content[0]!;
    assert.ok(thinking.type === 'thinking');
    // The client sees our signature, not the upstream's.
    assert.notEqual(thinking.signature, UPSTREAM_SIGNATURE);
    const use = first.content[2]!;
    assert.ok(use.type === 'tool_use');
    const next = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 8000,
      thinking: { type: 'enabled', budget_tokens: 2048 },
      tools,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] },
      ],
    });
    const sent = seen.at(-1)!.body.messages[1]!;
    assert.equal(sent.role, 'assistant');
    assert.deepEqual(sent.content[0], { type: 'thinking', thinking: 'Let me think. Done.', signature: UPSTREAM_SIGNATURE });
    assert.deepEqual(
      sent.content.slice(1).map((b) => b['type']),
      ['text', 'tool_use'],
    );
    const text = next.content.find((b) => b.type === 'text');
    assert.ok(text?.type === 'text' && text.text === 'It is sunny in Paris.');
  });

  it('a tool_use with its input whole in its start, or with none, gives JSON arguments; an unasked stop_sequence is not reported', async () => {
    const parameters = { type: 'object', properties: { city: { type: 'string' } } };
    const names = ['get_weather', 'get_time'];
    const tools: OpenAI.Chat.ChatCompletionFunctionTool[] = names.map((name) => ({ type: 'function', function: { name, parameters } }));
    const chat = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'whole input' }], tools });
    const calls = chat.choices[0]!.message.tool_calls!.map((t) => (t.type === 'function' ? t.function.arguments : ''));
    assert.deepEqual(
      calls.map((a) => JSON.parse(a) as unknown),
      [{ city: 'Paris' }, {}],
    );
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'whole input' }],
      tools,
      stream: true,
    });
    const args = ['', ''];
    for await (const chunk of stream)
      for (const t of chunk.choices[0]?.delta.tool_calls ?? []) args[t.index] += t.function?.arguments ?? '';
    assert.deepEqual(args, ['{"city":"Paris"}', '{}']);
    const response = await openai.responses.create({
      model: MODEL,
      input: 'whole input',
      tools: names.map((name) => ({ type: 'function' as const, name, parameters, strict: false })),
    });
    assert.deepEqual(
      response.output.flatMap((o) => (o.type === 'function_call' ? [o.arguments] : [])),
      ['{"city":"Paris"}', '{}'],
    );
    const message = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      messages: [{ role: 'user', content: 'whole input' }],
      tools: names.map((name) => ({ name, input_schema: { type: 'object' as const, properties: { city: { type: 'string' } } } })),
    });
    assert.deepEqual(
      message.content.flatMap((b) => (b.type === 'tool_use' ? [b.input] : [])),
      [{ city: 'Paris' }, {}],
    );

    const stopped = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      stop_sequences: ['END'],
      messages: [{ role: 'user', content: 'own stop' }],
    });
    assert.equal(stopped.stop_sequence, null);
    assert.ok(!JSON.stringify(stopped).includes(SECRET));
    const events: string[] = [];
    for await (const ev of anthropic.messages.stream({
      model: MODEL,
      max_tokens: 100,
      stop_sequences: ['END'],
      messages: [{ role: 'user', content: 'own stop' }],
    }))
      events.push(JSON.stringify(ev));
    assert.ok(events.length > 0 && events.every((e) => !e.includes(SECRET)));
  });

  it('an overloaded upstream (529) is an error in each client’s own envelope, and the key never leaks', async () => {
    await assert.rejects(
      anthropic.messages.create({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: 'overload' }] }),
      // Anthropic's own signal, kept: clients back off on overloaded_error as they do on no other.
      (err: unknown) =>
        err instanceof Anthropic.APIError &&
        err.status === 529 &&
        (err.error as { error?: { type?: string } }).error?.type === 'overloaded_error' &&
        !err.message.includes(SECRET),
    );
    await assert.rejects(
      openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'overload' }] }),
      // OpenAI's convention for an overloaded engine: 503.
      (err: unknown) => err instanceof OpenAI.APIError && err.status === 503 && /Overloaded/.test(err.message),
    );
  });
});
