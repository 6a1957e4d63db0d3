import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { GenerationEvent } from '../src/core/canonical.js';
import { decodeChatRequest, type ChatRequest } from '../src/protocols/chat/request.js';
import { encodeChatRequest, ChatReader } from '../src/protocols/chat/client.js';
import { ChunkRenderer, CompletionFold, renderUsage, usageJson } from '../src/protocols/chat/response.js';
import { encodeResponsesRequest, ResponsesReader } from '../src/protocols/responses/client.js';
import { responsesFormat } from '../src/protocols/responses/resource.js';
import type { ResponsesRequest } from '../src/protocols/responses/request.js';
import type { ResponseEvent } from '../src/core/responses/format.js';
import { MessageFold, MessageStreamRenderer, toolUseId } from '../src/protocols/messages/response.js';

/**
 * Each wire protocol round trip, without a model or a server: what one side of a protocol module
 * writes, its other side reads back to the same canonical request or events. (Bugs that are the
 * same on both sides cancel out here; test/recorded-upstreams.test.ts reads other servers' streams.)
 */

const identity = (s: string) => s;

/** A generation with everything the canonical stream can carry. */
const EVENTS: GenerationEvent[] = [
  { type: 'reasoning.delta', text: 'Think' },
  { type: 'reasoning.delta', text: ' first.' },
  { type: 'text.delta', text: 'Héllo "world"\n' },
  { type: 'text.delta', text: '✓ done' },
  { type: 'tool_call.start', index: 0, id: 'call_a', name: 'get_weather' },
  { type: 'tool_call.delta', index: 0, arguments: '{"city":' },
  { type: 'tool_call.delta', index: 0, arguments: '"Oslo"}' },
  { type: 'tool_call.start', index: 1, id: 'call_b', name: 'get_time' },
  { type: 'tool_call.delta', index: 1, arguments: '{}' },
  { type: 'usage', usage: { input: 40, cached: 8, output: 25, reasoning: 6 } },
  { type: 'finish', reason: 'tool_calls' },
];

/** Runs a reader over payloads, returning the events and, as events, the usage and finish it ended with. */
function readAll(reader: ChatReader | ResponsesReader, payloads: unknown[]): GenerationEvent[] {
  const out: GenerationEvent[] = [];
  for (const p of payloads) if (reader.read(p, out)) break;
  const u = reader.usage;
  if (u)
    out.push({
      type: 'usage',
      usage: { input: u.input ?? -1, cached: u.cached ?? 0, output: u.output ?? -1, reasoning: u.reasoning ?? 0 },
    });
  out.push({ type: 'finish', reason: reader.finish });
  return out;
}

/** Consecutive deltas of one kind merged, since a protocol may split or join them. */
function merged(events: GenerationEvent[]): GenerationEvent[] {
  const out: GenerationEvent[] = [];
  for (const e of events) {
    const last = out.at(-1);
    if (last && e.type === last.type && (e.type === 'text.delta' || e.type === 'reasoning.delta'))
      (last as { text: string }).text += e.text;
    else if (last?.type === 'tool_call.delta' && e.type === 'tool_call.delta' && last.index === e.index) last.arguments += e.arguments;
    else out.push({ ...e });
  }
  return out;
}

describe('protocols/chat', () => {
  it('decodes a chat-completions body and encodes it for an upstream with the same meaning', () => {
    const body: ChatRequest = {
      model: 'openai/gpt-x',
      messages: [
        { role: 'system', content: 'Be brief.' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Weather?' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA', detail: 'low' } },
          ],
        },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }],
        },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp":3}' },
      ],
      temperature: 0.5,
      top_p: 0.9,
      seed: 7,
      stop: ['\n\n'],
      max_completion_tokens: 100,
      stream: true,
      presence_penalty: 0.1,
      frequency_penalty: 0.2,
      parallel_tool_calls: false,
      reasoning_effort: 'low',
      tools: [
        {
          type: 'function',
          function: {
            name: 'get_weather',
            description: 'Weather now',
            parameters: { type: 'object', properties: { city: { type: 'string' } } },
            strict: true,
          },
        },
      ],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      response_format: { type: 'json_schema', json_schema: { name: 'w', schema: { type: 'object' }, strict: true } },
    } as ChatRequest;
    const req = decodeChatRequest(body, new AbortController().signal);
    const wire = encodeChatRequest(req, 'their-name');
    assert.equal(wire['model'], 'their-name');
    assert.deepEqual(wire['stream_options'], { include_usage: true });
    for (const k of [
      'temperature',
      'top_p',
      'seed',
      'stop',
      'presence_penalty',
      'frequency_penalty',
      'parallel_tool_calls',
      'reasoning_effort',
      'tools',
      'response_format',
      'stream',
    ] as const) {
      assert.deepEqual(wire[k], (body as Record<string, unknown>)[k], k);
    }
    assert.equal(wire['max_completion_tokens'] ?? wire['max_tokens'], 100);
    assert.deepEqual(wire['tool_choice'], body.tool_choice);
    const messages = wire['messages'] as Array<Record<string, unknown>>;
    assert.equal(messages.length, 4);
    assert.deepEqual(messages[1]!['content'], body.messages[1]!.content);
    assert.deepEqual(messages[2]!['tool_calls'], [
      { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } },
    ]);
    assert.equal(messages[3]!['tool_call_id'], 'call_1');
  });

  it('refuses a tool_choice naming no tool, and n > 1, with the parameter named', () => {
    const base = { model: 'm', messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: 'a' } }] };
    assert.throws(
      () =>
        decodeChatRequest(
          { ...base, tool_choice: { type: 'function', function: { name: 'b' } } } as ChatRequest,
          new AbortController().signal,
        ),
      (e: unknown) => (e as { param?: string }).param === 'tool_choice',
    );
    assert.throws(
      () => decodeChatRequest({ ...base, n: 2 } as ChatRequest, new AbortController().signal),
      (e: unknown) => (e as { param?: string }).param === 'n',
    );
  });

  it('streams events as chunks that its reader turns back into the same events', () => {
    const r = new ChunkRenderer('m', true);
    let sse = '';
    for (const e of EVENTS) sse += r.frames(e);
    sse += r.last();
    assert.ok(sse.endsWith('\n\n'), 'every frame ends with a blank line');
    const payloads = sse
      .split('\n\n')
      .filter((f) => f !== '')
      .map((f) => {
        assert.ok(f.startsWith('data: '), f);
        return f.slice(6);
      });
    const first = JSON.parse(payloads[0]!) as { choices: Array<{ delta: { role?: string } }> };
    assert.equal(first.choices[0]!.delta.role, 'assistant', 'the role chunk comes first');
    assert.equal(payloads.at(-1), '[DONE]');
    const parsed = payloads.slice(0, -1).map((p) => JSON.parse(p) as unknown);
    assert.deepEqual(merged(readAll(new ChatReader(identity), parsed)), merged(EVENTS));
  });

  it('folds events into a completion that its reader reads back to the same result', () => {
    const fold = new CompletionFold();
    for (const e of EVENTS) fold.apply(e);
    const completion = JSON.parse(JSON.stringify(fold.result('m'))) as unknown;
    const back = readAll(new ChatReader(identity), [completion]);
    // A whole message has one delta of each kind.
    assert.deepEqual(merged(back), merged(EVENTS));
  });

  it('assigns streamed tool-call deltas without an index to their calls (by id, name, position, else the last)', () => {
    const chunk = (...calls: object[]) => ({ choices: [{ index: 0, delta: { tool_calls: calls }, finish_reason: null }] });
    const fn = (name: string | undefined, args: string) => ({ function: { ...(name !== undefined && { name }), arguments: args } });
    const calls = (payloads: unknown[]) => {
      const byIndex = new Map<number, { name: string; args: string }>();
      for (const ev of readAll(new ChatReader(identity), payloads)) {
        if (ev.type === 'tool_call.start') byIndex.set(ev.index, { name: ev.name, args: '' });
        if (ev.type === 'tool_call.delta') byIndex.get(ev.index)!.args += ev.arguments;
      }
      return [...byIndex.values()].map((c) => [c.name, c.args]);
    };
    const two = [
      ['a', '{"x":1}'],
      ['b', '{"y":2}'],
    ];
    // A new id starts a call; continuations without one go to the last.
    assert.deepEqual(
      calls([chunk({ id: 'c1', ...fn('a', '{"x":') }), chunk(fn(undefined, '1}')), chunk({ id: 'c2', ...fn('b', '{"y":2}') })]),
      two,
    );
    // Two whole calls in one delta, without ids.
    assert.deepEqual(calls([chunk(fn('a', '{"x":1}'), fn('b', '{"y":2}'))]), two);
    // Empty ids: the name starts a call.
    assert.deepEqual(calls([chunk({ id: '', ...fn('a', '{"x":1}') }), chunk({ id: '', ...fn('b', '{"y":2}') })]), two);
    // Interleaved, each delta repeating its call's id.
    assert.deepEqual(
      calls([
        chunk({ id: 'c1', ...fn('a', '{"x"') }),
        chunk({ id: 'c2', ...fn('b', '{"y"') }),
        chunk({ id: 'c1', ...fn(undefined, ':1}') }),
        chunk({ id: 'c2', ...fn(undefined, ':2}') }),
      ]),
      two,
    );
    // An index on the first delta only.
    assert.deepEqual(calls([chunk({ index: 0, id: 'c1', ...fn('a', '{"x":') }), chunk(fn(undefined, '1}'))]), [['a', '{"x":1}']]);
  });

  it("turns an error payload mid-stream into an upstream error, with the reader's cleaning applied", () => {
    const reader = new ChatReader((s) => s.replaceAll('sk-secret', '[key]'));
    assert.throws(
      () => reader.read({ error: { message: 'bad key sk-secret' } }, []),
      (e: unknown) => /\[key\]/.test((e as Error).message) && !/sk-secret/.test((e as Error).message),
    );
  });
});

describe('protocols/chat usage', () => {
  it('writes the usage object exactly as JSON.stringify writes it', () => {
    const count = fc.oneof(fc.nat(), fc.constantFrom(0, 2 ** 53 - 1, 1e21));
    fc.assert(
      fc.property(
        fc.record(
          {
            input: count,
            cached: count,
            output: count,
            reasoning: count,
            cost: fc.oneof(fc.constant(null), fc.double({ min: 0, max: 1e6, noNaN: true }), fc.constantFrom(1e-7, 0.1 + 0.2, 123456789.5)),
            estimated: fc.boolean(),
          },
          { requiredKeys: ['input', 'cached', 'output', 'reasoning'] },
        ),
        (u) => assert.equal(usageJson(u), JSON.stringify(renderUsage(u))),
      ),
      { numRuns: 2000 },
    );
  });
});

describe('protocols/responses', () => {
  const open = () =>
    responsesFormat.open({
      id: 'resp_1',
      createdAt: 1,
      model: 'm',
      background: false,
      store: true,
      previousResponseId: null,
      conversationId: null,
      echo: { model: 'm', input: 'hi', reasoning: { summary: 'auto' } } as ResponsesRequest,
      summary: 'auto',
      seal: undefined,
    });

  it('renders events as the documented stream that its reader turns back into the same events', () => {
    const fold = open();
    const wire: ResponseEvent[] = [...fold.start()];
    for (const e of EVENTS) wire.push(...fold.apply(e));
    assert.equal(wire.at(-1)?.type, 'response.completed');
    assert.ok(responsesFormat.isTerminal(wire.at(-1)!));
    assert.deepEqual(merged(readAll(new ResponsesReader(identity), JSON.parse(JSON.stringify(wire)) as unknown[])), merged(EVENTS));

    const resource = fold.resource as { status: string; output: Array<{ type: string }>; usage: Record<string, unknown> };
    assert.equal(resource.status, 'completed');
    assert.deepEqual(
      resource.output.map((o) => o.type),
      ['reasoning', 'message', 'function_call', 'function_call'],
    );
    assert.deepEqual(resource.usage, {
      input_tokens: 40,
      input_tokens_details: { cached_tokens: 8 },
      output_tokens: 25,
      output_tokens_details: { reasoning_tokens: 6 },
      total_tokens: 65,
    });
  });

  it('replays a stored response as the same events it streamed, ids included', (t) => {
    // Replayed a minute after it finished: the replay still says when it finished.
    t.mock.timers.enable({ apis: ['Date'], now: 1_764_115_200_000 });
    const fold = open();
    const live: ResponseEvent[] = [...fold.start()];
    for (const e of EVENTS) live.push(...fold.apply(e));
    t.mock.timers.tick(60_000);
    const { events, finished } = responsesFormat.replay(responsesFormat.serialize(fold));
    assert.ok(finished);
    assert.equal((events.at(-1) as unknown as { response: { completed_at: number } }).response.completed_at, 1_764_115_200);
    // Replay renders each item's text as one delta where the live stream had several.
    const squash = (evs: ResponseEvent[]) => {
      const out: Array<Record<string, unknown>> = [];
      for (const e of JSON.parse(JSON.stringify(evs)) as Array<Record<string, unknown>>) {
        const last = out.at(-1);
        if (last && String(e['type']).endsWith('.delta') && last['type'] === e['type'] && last['item_id'] === e['item_id'])
          last['delta'] = String(last['delta']) + String(e['delta']);
        else out.push(e);
      }
      return out;
    };
    assert.deepEqual(squash(events), squash(live));
  });

  it('ends as incomplete at the output limit and as failed on an error, each with one terminal event', () => {
    const cut = open();
    cut.start();
    cut.apply({ type: 'text.delta', text: 'Once' });
    cut.apply({ type: 'usage', usage: { input: 1, cached: 0, output: 1, reasoning: 0 } });
    const end = cut.apply({ type: 'finish', reason: 'length' });
    assert.deepEqual(
      end.filter((e) => responsesFormat.isTerminal(e)).map((e) => e.type),
      ['response.incomplete'],
    );
    assert.deepEqual((cut.resource as { incomplete_details: unknown }).incomplete_details, { reason: 'max_output_tokens' });

    const broken = open();
    broken.start();
    const failed = broken.fail('upstream_error', 'it broke');
    // The error event comes just before the terminal event and is held with it (clients stop there).
    assert.deepEqual(
      failed.filter((e) => responsesFormat.isTerminal(e)).map((e) => e.type),
      ['error', 'response.failed'],
    );
    assert.deepEqual(
      failed.slice(-2).map((e) => e.type),
      ['error', 'response.failed'],
    );
    assert.equal(broken.status, 'failed');
  });

  it('encodes a canonical request as a streamed, unstored Responses request', () => {
    const req = decodeChatRequest(
      {
        model: 'm',
        messages: [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: 'Hi' },
        ],
        max_tokens: 9,
        temperature: 0,
      } as ChatRequest,
      new AbortController().signal,
    );
    const wire = encodeResponsesRequest(req, 'their-name');
    assert.equal(wire['model'], 'their-name');
    assert.equal(wire['stream'], true);
    assert.equal(wire['store'], false);
    assert.equal(wire['max_output_tokens'], 9);
    assert.equal(wire['temperature'], 0);
  });
});

describe('protocols/messages tool_use ids', () => {
  it("writes ids in Anthropic's pattern, unique within a message, the same streamed or whole", () => {
    // An upstream's ids that Anthropic would refuse, two of which map to one id.
    const events: GenerationEvent[] = [
      { type: 'tool_call.start', index: 0, id: 'x.1', name: 'f' },
      { type: 'tool_call.delta', index: 0, arguments: '{}' },
      { type: 'tool_call.start', index: 1, id: 'x_1', name: 'f' },
      { type: 'tool_call.delta', index: 1, arguments: '{}' },
      { type: 'tool_call.start', index: 2, id: 'call_ok-2', name: 'f' },
      { type: 'tool_call.delta', index: 2, arguments: '{}' },
      { type: 'finish', reason: 'tool_calls' },
    ];
    const sign = (t: string) => t;
    const fold = new MessageFold(sign);
    for (const ev of events) fold.apply(ev);
    const whole = (fold.result('m')['content'] as Array<{ id: string }>).map((b) => b.id);
    assert.deepEqual(whole, ['x_1', 'x_1_2', 'call_ok-2']);
    const stream = new MessageStreamRenderer('m', sign);
    const text = events.map((ev) => stream.event(ev)).join('');
    const streamed = [...text.matchAll(/"content_block":\{"type":"tool_use","id":"([^"]+)"/g)].map((m) => m[1]);
    assert.deepEqual(streamed, whole);
    assert.equal(toolUseId('functions.get_weather:0'), 'functions_get_weather_0');
  });
});
