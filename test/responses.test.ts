import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'node:http';
import { request as undiciRequest } from 'undici';
import { createKey, http, readSse, startWithClient, type TestServer } from './helpers/server.js';
import { checkStream, type Ev, type WireResponse } from './helpers/responses.js';
import { eventually } from './helpers/wait.js';

const STORIES = 'local/stories260k';
const roleOf = (i: { type: string; role?: unknown }): string => (i.type === 'message' ? String(i.role) : i.type);
const RANDOM = 'local/llama-2-tiny-random';

describe('POST /v1/responses with TinyStories', () => {
  let server: TestServer;
  let client: OpenAI;
  let key: string;

  before(async () => {
    ({ server, client, key } = await startWithClient());
  });
  after(() => server.close());

  it('takes a string input and gives output_text, usage and the echoed defaults', async () => {
    const r = await client.responses.create({ model: STORIES, input: 'Once upon a time', max_output_tokens: 30, temperature: 0 });
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, 'response');
    assert.match(r.output_text, /^, there was a little girl/);
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details?.reason, 'max_output_tokens');
    // Only a completed response has completed_at.
    assert.equal(r.completed_at, null);
    assert.equal(r.usage?.output_tokens, 30);
    assert.equal(r.usage?.input_tokens, 5);
    assert.equal(r.usage?.total_tokens, 35);
    assert.equal(typeof r.usage?.input_tokens_details.cached_tokens, 'number');
    assert.equal(r.usage?.output_tokens_details.reasoning_tokens, 0);
    assert.equal(r.top_p, 1);
    assert.equal(r.tool_choice, 'auto');
    assert.equal(r.parallel_tool_calls, true);
    assert.deepEqual(r.tools, []);
    assert.equal((r as unknown as { store: boolean }).store, true);
    assert.equal(r.background, false);
    assert.deepEqual(r.text, { format: { type: 'text' } });
    assert.equal(r.output[0]!.type, 'message');
  });

  it('takes items: easy messages, typed messages with parts, and instructions', async () => {
    const r = await client.responses.create({
      model: STORIES,
      temperature: 0,
      max_output_tokens: 10,
      instructions: 'Once upon a time,',
      input: [
        { role: 'user', content: 'there was a dog.' },
        { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'The dog liked to run.' }] },
      ],
    });
    assert.ok(r.output_text.length > 0);
    assert.equal(r.instructions, 'Once upon a time,');
    assert.ok(r.usage!.input_tokens > 12);
  });

  it("takes a function call's output as a string or as content parts, and keeps the parts", async () => {
    const call = { type: 'function_call' as const, call_id: 'c1', name: 'weather', arguments: '{}' };
    const asText = await client.responses.create({
      model: STORIES,
      max_output_tokens: 2,
      input: [call, { type: 'function_call_output', call_id: 'c1', output: 'sunny' }],
    });
    const parts = [{ type: 'input_text' as const, text: 'sunny' }];
    const asParts = await client.responses.create({
      model: STORIES,
      max_output_tokens: 2,
      input: [call, { type: 'function_call_output', call_id: 'c1', output: parts }],
    });
    // The model reads the parts' text, not their JSON.
    assert.equal(asParts.usage?.input_tokens, asText.usage?.input_tokens);
    const items = (await client.responses.inputItems.list(asParts.id)).data;
    const output = items.find((i) => i.type === 'function_call_output');
    assert.deepEqual(output && 'output' in output ? output.output : undefined, parts);

    // `output` is required, and is a string or an array of parts.
    for (const [value, code] of [
      [undefined, 'missing_required_parameter'],
      [null, 'missing_required_parameter'],
      [{ a: 1 }, 'invalid_value'],
      [[{ type: 'output_text', text: 'x' }], 'unsupported_content'],
    ] as const) {
      const res = await http(server.url, 'POST', '/v1/responses', {
        key,
        body: { model: STORIES, max_output_tokens: 2, input: [call, { type: 'function_call_output', call_id: 'c1', output: value }] },
      });
      assert.equal(res.status, 400, res.text);
      assert.equal(res.json.error.code, code, res.text);
      assert.match(String(res.json.error.param), /^input\[1\]\.output/);
    }

    // An output answers a call made before it: in this input, or in what it continues from.
    const orphan = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, max_output_tokens: 2, input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }] },
    });
    assert.equal(orphan.status, 400, orphan.text);
    assert.equal(orphan.json.error.param, 'input[0].call_id');
    assert.match(orphan.json.error.message, /No function call found .*'nope'/);
    const onlyCall = await client.responses.create({
      model: STORIES,
      max_output_tokens: 2,
      input: [{ role: 'user', content: 'Hi' }, call],
    });
    const answered = await client.responses.create({
      model: STORIES,
      max_output_tokens: 2,
      previous_response_id: onlyCall.id,
      input: [{ type: 'function_call_output', call_id: 'c1', output: 'sunny' }],
    });
    assert.equal(answered.status, 'incomplete');
  });

  it('is completed when the output ends within max_output_tokens, and incomplete when the limit cuts it', async () => {
    // A schema-constrained answer ends where its JSON does, well inside the limit.
    const ended = await client.responses.create({
      model: STORIES,
      input: 'Once upon a time',
      temperature: 0,
      max_output_tokens: 60,
      text: {
        format: {
          type: 'json_schema',
          name: 'flag',
          strict: true,
          schema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false },
        },
      },
    });
    assert.equal(ended.status, 'completed', JSON.stringify(ended.incomplete_details));
    assert.equal(ended.incomplete_details, null);
    assert.equal(typeof (JSON.parse(ended.output_text) as { ok: unknown }).ok, 'boolean');
    assert.ok(ended.usage!.output_tokens < 60);

    const r = await client.responses.create({
      model: STORIES,
      input: 'Once upon a time',
      temperature: 0,
      max_output_tokens: 60,
      text: { format: { type: 'text' } },
    });
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details?.reason, 'max_output_tokens');
    // Only a completed response has completed_at.
    assert.equal(r.completed_at, null);
    assert.equal(r.usage!.output_tokens, 60);
    const stopped = await http<WireResponse>(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'Once upon a time', temperature: 0 },
    });
    assert.equal(stopped.json.status, 'incomplete', 'TinyStories fills its context: incomplete, not completed');
  });

  it('streams the documented events, and the stream() helper gives finalResponse()', async () => {
    const { status, events, done } = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'Once upon a time', max_output_tokens: 8, temperature: 0, stream: true },
    });
    assert.equal(status, 200);
    assert.ok(done, 'the stream ends with data: [DONE], after the terminal event');
    const parsed = checkStream(events);
    const types = parsed.map((d) => d.type);
    const deltas = types.filter((t) => t === 'response.output_text.delta').length;
    assert.deepEqual(types, [
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      ...Array<string>(deltas).fill('response.output_text.delta'),
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.incomplete',
    ]);
    assert.ok(deltas >= 5);

    const stream = client.responses.stream({ model: STORIES, input: 'Once upon a time', max_output_tokens: 12, temperature: 0 });
    let text = '';
    stream.on('response.output_text.delta', (e) => {
      text += e.delta;
    });
    const final = await stream.finalResponse();
    assert.equal(final.output_text, text);
    assert.match(text, /little girl/);
    assert.equal(final.usage?.output_tokens, 12);
    const stored = await client.responses.retrieve(final.id);
    assert.equal(stored.output_text, text);
  });

  it('chains previous_response_id without carrying instructions', async () => {
    const first = await client.responses.create({
      model: STORIES,
      input: 'Once upon a time',
      instructions: 'A story:',
      max_output_tokens: 10,
      temperature: 0,
    });
    const second = await client.responses.create({
      model: STORIES,
      previous_response_id: first.id,
      input: 'The end.',
      max_output_tokens: 5,
      temperature: 0,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.equal(second.instructions, null);
    // The prior input and output are in the prompt; the prior instructions are not.
    assert.ok(
      second.usage!.input_tokens >= first.usage!.input_tokens + first.usage!.output_tokens - 3,
      `${second.usage!.input_tokens} vs ${first.usage!.input_tokens}+${first.usage!.output_tokens}`,
    );
    assert.ok(second.usage!.input_tokens_details.cached_tokens > 0, 'the chained prefix came from the KV cache');
  });

  it('runs three turns through a conversation and lists its items in order', async () => {
    const conv = await client.conversations.create({ metadata: { topic: 'dogs' } });
    assert.match(conv.id, /^conv_/);
    const turns = ['Once upon a time, there was a dog.', 'The dog saw a cat.', 'They became friends.'];
    const outputs: string[] = [];
    for (const t of turns) {
      const r = await client.responses.create({ model: STORIES, conversation: conv.id, input: t, max_output_tokens: 6, temperature: 0 });
      assert.equal(r.conversation?.id, conv.id);
      outputs.push(r.output_text);
    }
    const items = [];
    for await (const item of client.conversations.items.list(conv.id, { order: 'asc', limit: 2 })) items.push(item);
    assert.equal(items.length, 6);
    assert.deepEqual(
      items.map((i) => (i.type === 'message' ? i.role : i.type)),
      ['user', 'assistant', 'user', 'assistant', 'user', 'assistant'],
    );
    const texts = items.map((i) => (i.type === 'message' ? i.content.map((c) => ('text' in c ? c.text : '')).join('') : ''));
    assert.deepEqual(texts, [turns[0], outputs[0], turns[1], outputs[1], turns[2], outputs[2]]);

    const one = await client.conversations.items.retrieve(items[1]!.id!, { conversation_id: conv.id });
    assert.equal(one.id, items[1]!.id);
    await client.conversations.items.delete(items[0]!.id!, { conversation_id: conv.id });
    const after = await client.conversations.items.list(conv.id);
    assert.equal(after.data.length, 5);
    assert.equal(((await client.conversations.retrieve(conv.id)).metadata as Record<string, string>)['topic'], 'dogs');
    const added = await client.conversations.items.create(conv.id, { items: [{ type: 'message', role: 'user', content: 'More.' }] });
    assert.equal(added.data.length, 1);
    // A client's own item id may be 256 characters long, and is read and deleted by it like any other.
    const longId = `msg_${'a'.repeat(252)}`;
    await client.conversations.items.create(conv.id, { items: [{ type: 'message', role: 'user', content: 'Long.', id: longId } as never] });
    assert.equal((await client.conversations.items.retrieve(longId, { conversation_id: conv.id })).id, longId);
    await client.conversations.items.delete(longId, { conversation_id: conv.id });
    await assert.rejects(
      client.conversations.items.retrieve(longId, { conversation_id: conv.id }),
      (e: unknown) => e instanceof OpenAI.NotFoundError,
    );
    await client.conversations.delete(conv.id);
    await assert.rejects(client.conversations.retrieve(conv.id), (e: unknown) => e instanceof OpenAI.NotFoundError);
  });

  it('keeps concurrent responses on one conversation in contiguous blocks', async () => {
    const conv = await client.conversations.create({});
    await Promise.all(
      ['A dog.', 'A cat.', 'A bird.'].map((t) =>
        client.responses.create({ model: STORIES, conversation: conv.id, input: t, max_output_tokens: 4, temperature: 0 }),
      ),
    );
    const items = (await client.conversations.items.list(conv.id, { order: 'asc', limit: 100 })).data;
    assert.equal(items.length, 6);
    for (let i = 0; i < 6; i += 2) {
      assert.equal(roleOf(items[i]!), 'user');
      assert.equal(roleOf(items[i + 1]!), 'assistant', 'each input is followed by its own output');
    }
  });

  it('reads, pages the input items of, and deletes a stored response', async () => {
    const r = await client.responses.create({
      model: STORIES,
      max_output_tokens: 3,
      input: [
        { role: 'user', content: 'One.' },
        { role: 'assistant', content: 'Two.' },
        { role: 'user', content: 'Three.' },
      ],
    });
    const got = await client.responses.retrieve(r.id);
    assert.equal(got.id, r.id);
    assert.deepEqual(got.output, r.output);
    const page1 = await client.responses.inputItems.list(r.id, { limit: 2, order: 'asc' });
    assert.equal(page1.data.length, 2);
    assert.equal(page1.has_more, true);
    const all = [];
    for await (const item of client.responses.inputItems.list(r.id, { limit: 1, order: 'asc' })) all.push(item);
    assert.deepEqual(
      all.map((i) => (i.type === 'message' ? i.role : i.type)),
      ['user', 'assistant', 'user'],
    );
    const desc = await client.responses.inputItems.list(r.id);
    assert.equal(desc.data[0]!.id, all[2]!.id, 'newest first by default');
    await client.responses.delete(r.id);
    await assert.rejects(client.responses.retrieve(r.id), (e: unknown) => e instanceof OpenAI.NotFoundError);
  });

  it('deletes a running background response once: concurrent deletes, one success and the rest 404', async () => {
    // Several at once, so that the last may still be queued behind the others when it is deleted.
    const started = [];
    for (let i = 0; i < 4; i++)
      started.push(await client.responses.create({ model: STORIES, input: 'Once upon a time', background: true, max_output_tokens: 400 }));
    const bg = started.at(-1)!;
    const deletes = await Promise.all(Array.from({ length: 6 }, () => http(server.url, 'DELETE', `/v1/responses/${bg.id}`, { key })));
    assert.deepEqual(deletes.map((d) => d.status).sort(), [200, 404, 404, 404, 404, 404], JSON.stringify(deletes.map((d) => d.json)));
    for (const d of deletes.filter((x) => x.status === 404)) assert.equal(d.json.error.code, 'not_found');
    await assert.rejects(client.responses.retrieve(bg.id), (e: unknown) => e instanceof OpenAI.NotFoundError);
    for (const r of started.slice(0, -1)) await client.responses.cancel(r.id);
  });

  it('replays a stored response as the same event sequence', async () => {
    const live = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'Once upon a time', max_output_tokens: 6, temperature: 0, stream: true },
    });
    const liveEvents = checkStream(live.events);
    const id = liveEvents[0]!.response!.id;
    const replay = await readSse(server.url, 'GET', `/v1/responses/${id}?stream=true`, { key });
    const replayed = checkStream(replay.events);
    assert.ok(live.done && replay.done, 'both end with data: [DONE]');
    // Resumed after a sequence number (OpenAI's starting_after) once it has finished: the replay is
    // not numbered as the live stream was, so what follows is its end, the whole response.
    const resumed = await readSse(server.url, 'GET', `/v1/responses/${id}?stream=true&starting_after=3`, { key });
    const rest = resumed.events.map((e) => JSON.parse(e.data) as Ev);
    assert.deepEqual(
      rest.map((e) => [e.type, e.sequence_number]),
      [[liveEvents.at(-1)!.type, 4]],
    );
    assert.deepEqual(rest[0]!.response, liveEvents.at(-1)!.response);
    assert.ok(resumed.done);
    const shape = (evs: Ev[]) => evs.filter((e) => e.type !== 'response.output_text.delta').map((e) => e.type);
    assert.deepEqual(shape(replayed), shape(liveEvents));
    assert.deepEqual(replayed.at(-1)!.response, liveEvents.at(-1)!.response, 'the final response is identical');
  });

  it('reads several input_text parts as lines of text, not run together', async () => {
    const count = async (content: unknown) =>
      (
        await http<{ input_tokens: number }>(server.url, 'POST', '/v1/responses/input_tokens', {
          key,
          body: { model: STORIES, input: [{ role: 'user', content }] },
        })
      ).json.input_tokens;
    const parts = await count([
      { type: 'input_text', text: 'Once upon' },
      { type: 'input_text', text: 'a time' },
    ]);
    assert.equal(parts, await count('Once upon\na time'));
    assert.notEqual(parts, await count('Once upona time'));
  });

  it('does not store a response with store: false', async () => {
    const r = await client.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2, store: false });
    assert.equal((r as unknown as { store: boolean }).store, false);
    await assert.rejects(client.responses.retrieve(r.id), (e: unknown) => e instanceof OpenAI.NotFoundError);
  });

  it('runs in the background: returns at once, can be polled, streamed and cancelled', async () => {
    const r = await client.responses.create({ model: RANDOM, input: 'hello', max_output_tokens: 4000, background: true });
    // Answered at once, before any engine took it.
    assert.equal(r.status, 'queued');
    assert.equal(r.background, true);
    // Queued until the engine takes it, then in progress.
    await eventually(async () => assert.equal((await client.responses.retrieve(r.id)).status, 'in_progress'));
    // Nothing continues from a response whose output is not all there yet.
    await assert.rejects(
      client.responses.create({ model: RANDOM, input: 'and?', previous_response_id: r.id }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && /still in progress/.test(e.message),
    );
    const cancelled = await client.responses.cancel(r.id);
    assert.equal(cancelled.status, 'cancelled');
    // Its usage has a cost, as a finished response's (null: this model has no price).
    assert.ok(cancelled.usage && 'cost' in cancelled.usage, JSON.stringify(cancelled.usage));
    assert.equal(cancelled.completed_at ?? null, null);
    assert.equal((await client.responses.retrieve(r.id)).status, 'cancelled');
    assert.equal((await client.responses.cancel(r.id)).status, 'cancelled', 'cancelling twice is harmless');
    // Replayed, it begins queued as its live stream did, and ends with the response GET serves (its
    // usage with the cost included).
    const replay = (await readSse(server.url, 'GET', `/v1/responses/${r.id}?stream=true`, { key })).events.map(
      (e) => JSON.parse(e.data) as Ev,
    );
    assert.deepEqual(
      replay.slice(0, 3).map((e) => [e.type, (e as { response?: { status?: string } }).response?.status]),
      [
        ['response.created', 'queued'],
        ['response.queued', 'queued'],
        ['response.in_progress', 'in_progress'],
      ],
    );
    assert.equal(replay.at(-1)!.type, 'response.incomplete');
    const got = await http<Record<string, unknown>>(server.url, 'GET', `/v1/responses/${r.id}`, { key });
    assert.deepEqual(replay.at(-1)!.response, got.json);
    // Read as it was written: `id` first, as in a created response (not the defaults of older rows).
    assert.deepEqual(Object.keys(got.json).slice(0, 3), ['id', 'object', 'created_at']);

    const quick = await client.responses.create({
      model: STORIES,
      input: 'Once upon a time',
      max_output_tokens: 5,
      background: true,
      temperature: 0,
    });
    const done = await eventually(async () => {
      const d = await client.responses.retrieve(quick.id);
      assert.equal(d.status, 'incomplete');
      return d;
    });
    assert.match(done.output_text, /there/);
    await assert.rejects(
      client.responses.cancel(quick.id),
      (e: unknown) => e instanceof OpenAI.BadRequestError,
      'a finished response cannot be cancelled',
    );
    const foreground = await client.responses.create({ model: STORIES, input: 'x', max_output_tokens: 1 });
    await assert.rejects(client.responses.cancel(foreground.id), (e: unknown) => e instanceof OpenAI.BadRequestError);

    // Background + stream: events arrive live; a GET stream follows the same run.
    const bg = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'Once upon a time', max_output_tokens: 5, background: true, stream: true },
    });
    const evs = bg.events.map((e) => JSON.parse(e.data) as Ev);
    // Every stream begins with response.created; a background one's is queued, then in progress.
    assert.deepEqual(
      evs.slice(0, 3).map((e) => [e.type, (e as { response?: { status?: string } }).response?.status]),
      [
        ['response.created', 'queued'],
        ['response.queued', 'queued'],
        ['response.in_progress', 'in_progress'],
      ],
    );
    checkStream(bg.events);
    assert.ok(bg.done);
    // A running response resumed after a sequence number: the rest of the live stream, numbered as it was.
    const running = await client.responses.create({ model: RANDOM, input: 'hello', max_output_tokens: 60, background: true });
    const resumedLive = await readSse(server.url, 'GET', `/v1/responses/${running.id}?stream=true&starting_after=2`, { key });
    const liveRest = resumedLive.events.map((e) => JSON.parse(e.data) as Ev);
    assert.equal(liveRest[0]!.sequence_number, 3);
    liveRest.forEach((e, i) => assert.equal(e.sequence_number, 3 + i));
    assert.equal(liveRest.at(-1)!.type, 'response.incomplete');
    assert.ok(resumedLive.done);
    // Resumed after more events than it comes to have: it ends with its terminal event all the same,
    // as a finished response's replay does.
    // (Still running when the resume starts, so the live log is what is followed; it ends by a cancel.)
    const long = await client.responses.create({ model: RANDOM, input: 'hello', max_output_tokens: 4000, background: true });
    await eventually(async () => assert.equal((await client.responses.retrieve(long.id)).status, 'in_progress'));
    // Its head has come once the server follows the run's live log; then it is cancelled.
    const following = await undiciRequest(`${server.url}/v1/responses/${long.id}?stream=true&starting_after=100000`, {
      headers: { authorization: `Bearer ${key}` },
    });
    assert.equal(following.statusCode, 200);
    await client.responses.cancel(long.id);
    const body = await following.body.text();
    const pastEvents = [...body.matchAll(/^data: (\{.*\})$/gm)].map((m) => JSON.parse(m[1]!) as Ev);
    assert.deepEqual(
      pastEvents.map((e) => [e.type, e.sequence_number, (e as { response?: { status?: string } }).response?.status]),
      [['response.incomplete', 100001, 'cancelled']],
    );
    assert.match(body, /data: \[DONE\]\n\n$/);
    // So the openai SDK's stream helper follows a background response, live and resumed by id.
    const live = await client.responses
      .stream({ model: STORIES, input: 'Once upon a time', max_output_tokens: 5, background: true })
      .finalResponse();
    assert.equal(live.status, 'incomplete');
    const resumed = await client.responses.stream({ response_id: live.id }).finalResponse();
    assert.equal(resumed.output_text, live.output_text);
    assert.equal(evs.at(-1)!.type, 'response.incomplete');
  });

  it('names both ids when a chain runs through a deleted response', async () => {
    const r1 = await client.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2 });
    const r2 = await client.responses.create({ model: STORIES, input: 'upon', previous_response_id: r1.id, max_output_tokens: 2 });
    await client.responses.delete(r1.id);
    await assert.rejects(
      client.responses.create({ model: STORIES, input: 'a time', previous_response_id: r2.id, max_output_tokens: 2 }),
      (e: unknown) =>
        e instanceof OpenAI.BadRequestError &&
        e.code === 'previous_response_not_found' &&
        e.param === 'previous_response_id' &&
        e.message.includes(`'${r2.id}' cannot be continued: response '${r1.id}', earlier in its chain, was deleted`),
    );
    assert.equal((await client.responses.retrieve(r2.id)).id, r2.id);
  });

  it('hides responses and conversations from other organizations', async () => {
    const other = new OpenAI({ apiKey: (await createKey(server, 'globex')).key, baseURL: server.baseURL, maxRetries: 0 });
    const mine = await client.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2 });
    const conv = await client.conversations.create({});
    const nf = (e: unknown) => e instanceof OpenAI.NotFoundError;
    await assert.rejects(other.responses.retrieve(mine.id), nf);
    await assert.rejects(other.responses.delete(mine.id), nf);
    await assert.rejects(other.responses.inputItems.list(mine.id), nf);
    await assert.rejects(other.responses.cancel(mine.id), nf);
    // Continuing from another organization's response reads exactly like continuing from a missing one.
    await assert.rejects(
      other.responses.create({ model: STORIES, input: 'x', previous_response_id: mine.id }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.code === 'previous_response_not_found',
    );
    await assert.rejects(other.conversations.retrieve(conv.id), nf);
    await assert.rejects(other.conversations.items.list(conv.id), nf);
    await assert.rejects(other.responses.create({ model: STORIES, input: 'x', conversation: conv.id }), nf);
    assert.equal((await client.responses.retrieve(mine.id)).id, mine.id);
  });

  it('enforces the request limits', async () => {
    const base = { model: STORIES, input: 'hi' };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ ...base, model: '' }, 'model'],
      [{ ...base, model: 'm'.repeat(256) }, 'model'],
      [{ ...base, instructions: 'x'.repeat(32001) }, 'instructions'],
      [{ ...base, max_output_tokens: 0 }, 'max_output_tokens'],
      [{ ...base, temperature: 2.01 }, 'temperature'],
      [{ ...base, top_p: -0.5 }, 'top_p'],
      [{ ...base, tool_choice: 'sometimes' }, 'tool_choice'],
      [{ ...base, tool_choice: 'required' }, 'tool_choice'],
      [{ ...base, tool_choice: { type: 'function', name: 'f' } }, 'tool_choice'],
      [{ ...base, metadata: { ['k'.repeat(65)]: 'v' } }, 'metadata'],
      // A built-in tool is refused by its type, not for the name it does not have.
      [{ ...base, tools: [{ type: 'web_search' }] }, 'tools[0].type'],
      [{ ...base, tools: [{ type: 'function' }] }, 'tools[0].name'],
      [{ ...base, tools: Array.from({ length: 129 }, (_, i) => ({ type: 'function', name: `f${i}` })) }, 'tools'],
      // Ten thousand input items at most (MAX_INPUT_ITEMS: each is decoded on the event loop).
      [{ ...base, input: Array.from({ length: 10_001 }, () => ({ role: 'user', content: 'hi' })) }, 'input'],
      // A schema that accepts no value, named by where the Responses API puts it.
      [{ ...base, text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', not: {} } } } }, 'text.format'],
      [{ model: STORIES }, 'input'],
      [{ ...base, input: [{ type: 'bogus' }] }, 'input[0].type'],
      // Open Responses: a call's id and name are not empty.
      [{ ...base, input: [{ type: 'function_call', call_id: '', name: 'f', arguments: '{}' }] }, 'input[0].call_id'],
      [{ ...base, input: [{ type: 'function_call', call_id: 'c', name: '', arguments: '{}' }] }, 'input[0].name'],
      [{ ...base, input: [{ type: 'function_call_output', call_id: '', output: 'x' }] }, 'input[0].call_id'],
      [{ ...base, previous_response_id: 'resp_1', conversation: 'conv_1' }, 'conversation'],
      [{ ...base, background: true, store: false }, 'background'],
    ];
    for (const [body, param] of cases) {
      const res = await http(server.url, 'POST', '/v1/responses', { key, body });
      assert.equal(res.status, 400, `${JSON.stringify(body).slice(0, 100)} → ${res.text}`);
      assert.equal(res.json.error.param, param, res.text);
    }
    // A reference to an item nobody stored is a 404, as one to another organization's item is.
    const unknown = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { ...base, input: [{ type: 'item_reference', id: 'msg_nope' }] },
    });
    assert.equal(unknown.status, 404, unknown.text);
    assert.equal(unknown.json.error.param, 'input[0].id');
    const ok = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { ...base, instructions: 'x'.repeat(100), max_output_tokens: 1 },
    });
    assert.equal(ok.status, 200);
  });

  it('leaves the oldest turns out of what the model reads under truncation auto, and refuses without it', async () => {
    // About 1,000 tokens of turns against stories260K's 512-token context.
    const turn = 'Once upon a time there was a little girl who liked to play in the park with her dog every day.';
    const input = [
      { type: 'message', role: 'developer', content: 'Tell short stories.' },
      ...Array.from({ length: 24 }, (_, i) => ({ type: 'message', role: i % 2 === 0 ? 'user' : 'assistant', content: turn })),
    ];
    const refused = await http(server.url, 'POST', '/v1/responses', { key, body: { model: STORIES, input, max_output_tokens: 16 } });
    assert.equal(refused.status, 400, refused.text);
    assert.equal(refused.json.error.code, 'context_length_exceeded');
    assert.equal(refused.json.error.param, 'input', 'named as a Responses request names its prompt');
    assert.doesNotMatch(refused.json.error.message, /messages/);
    const r = await client.responses.create({
      model: STORIES,
      input: input as OpenAI.Responses.ResponseInput,
      max_output_tokens: 16,
      truncation: 'auto',
    });
    assert.equal(r.truncation, 'auto');
    assert.ok(r.usage!.input_tokens + 16 <= 512, `input ${r.usage!.input_tokens}`);
    assert.ok(r.usage!.input_tokens > 256, 'as many recent turns as fit, not just the last');
    // What was sent is stored whole; only what the model read was shortened.
    const items = await client.responses.inputItems.list(r.id, { limit: 100 });
    assert.equal(items.data.length, input.length);
    // Without max_output_tokens a quarter of the context is left to answer in.
    const open = await client.responses.create({ model: STORIES, input: input as OpenAI.Responses.ResponseInput, truncation: 'auto' });
    assert.ok(open.usage!.input_tokens <= 512 - 128, `input ${open.usage!.input_tokens}`);
  });

  it('stops a response whose client left while it was being set up, streamed or not', async () => {
    // The client sends its request and goes within milliseconds: often before the route had
    // anything to listen on. The run must still stop and be stored as cancelled, not run to its limit.
    const listed = async () =>
      (await http<{ data: Array<{ id: string; status: string }> }>(server.url, 'GET', '/v1/responses?order=desc&limit=100', { key })).json
        .data;
    const before = new Set((await listed()).map((r) => r.id));
    for (const stream of [false, true, false, true]) {
      await new Promise<void>((resolve) => {
        const req = request(`${server.url}/v1/responses`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        });
        req.on('error', () => resolve());
        req.on('close', () => resolve());
        req.end(JSON.stringify({ model: RANDOM, input: 'Once upon a time', max_output_tokens: 4000, stream }), () =>
          setTimeout(() => req.destroy(), 5),
        );
      });
    }
    // Nothing generates any more (a request whose body had not been read when its client left
    // never became a response, so not all four may be listed), and what was created was cancelled.
    await eventually(async () => {
      const loaded = await http<{ data: Array<{ model: string; active: number; queued: number }> }>(
        server.url,
        'GET',
        '/admin/local/loaded',
        {
          key: server.adminKey,
        },
      );
      const random = loaded.json.data.find((m) => m.model === RANDOM);
      assert.deepEqual([random?.active, random?.queued], [0, 0]);
      const mine = (await listed()).filter((r) => !before.has(r.id));
      assert.ok(mine.length > 0, 'at least one response was created');
      assert.deepEqual(new Set(mine.map((r) => r.status)), new Set(['cancelled']));
    });
  });

  it("names each request's own field when chat and Responses send the same refused schema at once", async () => {
    // One compile serves both while it runs; its refusal must not carry the first caller's field name.
    const schema = { type: 'object', properties: { n: { type: 'integer' } }, not: {} };
    const [chatRes, responsesRes] = await Promise.all([
      http(server.url, 'POST', '/v1/chat/completions', {
        key,
        body: {
          model: STORIES,
          messages: [{ role: 'user', content: 'hi' }],
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
        },
      }),
      http(server.url, 'POST', '/v1/responses', {
        key,
        body: { model: STORIES, input: 'hi', text: { format: { type: 'json_schema', name: 'x', schema } } },
      }),
    ]);
    assert.equal(chatRes.status, 400, chatRes.text);
    assert.equal(responsesRes.status, 400, responsesRes.text);
    assert.equal(chatRes.json.error.param, 'response_format');
    assert.equal(responsesRes.json.error.param, 'text.format');
    assert.equal(chatRes.json.error.message, responsesRes.json.error.message);
  });

  it('refuses conversation items whose parts are not objects with a 400 naming them, never a 500', async () => {
    const conv = await client.conversations.create({});
    const cases: Array<[Record<string, unknown>, string]> = [
      // Named where a conversation request holds them: `items`.
      [{ type: 'message', role: 'user', content: [null, 'text'] }, 'items[0].content[0]'],
      [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'ok' }, 7] }, 'items[0].content[1]'],
      [{ type: 'reasoning', summary: [null] }, 'items[0].summary[0]'],
      [{ type: 'reasoning', summary: [], content: [[]] }, 'items[0].content[0]'],
      // Open Responses' ReasoningItemParam: summary an array of summary_text parts (content, null
      // there, may hold a response's reasoning text as clients send it back).
      [{ type: 'reasoning', summary: 'x' }, 'items[0].summary'],
      [{ type: 'reasoning', summary: [], content: 5 }, 'items[0].content'],
      [{ type: 'reasoning', summary: [{ type: 'summary_text', text: 3 }] }, 'items[0].summary[0].text'],
      // Each role's parts: the model's own only in an assistant turn, images only in a user turn.
      [{ type: 'message', role: 'user', content: [{ type: 'output_text', text: 'x' }] }, 'items[0].content[0].type'],
      [{ type: 'message', role: 'user', content: [{ type: 'refusal', refusal: 'no' }] }, 'items[0].content[0].type'],
      [
        { type: 'message', role: 'system', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] },
        'items[0].content[0].type',
      ],
      [
        { type: 'message', role: 'assistant', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] },
        'items[0].content[0].type',
      ],
    ];
    for (const [item, param] of cases) {
      for (const path of ['/v1/conversations', `/v1/conversations/${conv.id}/items`, '/v1/conversations/conv_unknown/items']) {
        const res = await http(server.url, 'POST', path, { key, body: { items: [item] } });
        assert.equal(res.status, 400, `${path} ${JSON.stringify(item)} → ${res.text}`);
        assert.equal(res.json.error.code, 'invalid_value');
        assert.equal(res.json.error.param, param, res.text);
      }
    }
  });

  it('refuses a reasoning item without its summary, and an empty list of items to add', async () => {
    const conv = await client.conversations.create({});
    const missing = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, { key, body: { items: [{ type: 'reasoning' }] } });
    assert.equal(missing.status, 400, missing.text);
    assert.equal(missing.json.error.code, 'missing_required_parameter');
    assert.equal(missing.json.error.param, 'items[0].summary');
    const empty = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, { key, body: { items: [] } });
    assert.equal(empty.status, 400, empty.text);
    assert.equal(empty.json.error.param, 'items');
  });

  it('refuses stream_options without stream, as chat completions does', async () => {
    const res = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'hi', stream_options: { include_obfuscation: false }, max_output_tokens: 2 },
    });
    assert.equal(res.status, 400, res.text);
    assert.equal(res.json.error.param, 'stream_options');
    const streamed = await readSse(server.url, 'POST', '/v1/responses', {
      key,
      body: { model: STORIES, input: 'hi', stream: true, stream_options: { include_obfuscation: false }, max_output_tokens: 2 },
    });
    assert.equal(streamed.status, 200);
    assert.match(streamed.events.at(-1)?.event ?? '', /^response\.(completed|incomplete)$/);
  });

  it("refuses a conversation item that answers no call, as a response's input does: it would fail every later turn", async () => {
    const orphan = { type: 'function_call_output', call_id: 'call_orphan', output: 'x' };
    const created = await http(server.url, 'POST', '/v1/conversations', { key, body: { items: [orphan] } });
    assert.equal(created.status, 400, created.text);
    assert.equal(created.json.error.param, 'items[0].call_id');
    assert.match(created.json.error.message, /No function call found .*'call_orphan'/);

    // A call and its output together, or an output for a call the conversation holds: accepted.
    const call = { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' };
    const conv = await client.conversations.create({ items: [call as never, { ...orphan, call_id: 'call_1' } as never] });
    const added = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, {
      key,
      body: { items: [{ ...call, call_id: 'call_2' }] },
    });
    assert.equal(added.status, 200, added.text);
    const answered = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, {
      key,
      body: { items: [{ ...orphan, call_id: 'call_2' }] },
    });
    assert.equal(answered.status, 200, answered.text);
    const refused = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, {
      key,
      body: { items: [{ type: 'message', role: 'user', content: 'hi' }, orphan] },
    });
    assert.equal(refused.status, 400, refused.text);
    assert.equal(refused.json.error.param, 'items[1].call_id');
    // Nothing of the refused request was added, and a turn on the conversation still runs.
    const items = await client.conversations.items.list(conv.id, { order: 'asc' });
    assert.equal(items.data.length, 4);
    const turn = await client.responses.create({ model: STORIES, conversation: conv.id, input: 'Once upon a time', max_output_tokens: 4 });
    assert.ok(turn.output.length > 0);
    // Sealed content that does not open (altered, or another organization's) would fail every turn too.
    for (const item of [
      { type: 'reasoning', summary: [], encrypted_content: 'zzz' },
      { type: 'compaction', encrypted_content: 'zzz' },
    ]) {
      const poisoned = await http(server.url, 'POST', `/v1/conversations/${conv.id}/items`, { key, body: { items: [item] } });
      assert.equal(poisoned.status, 400, poisoned.text);
      assert.equal(poisoned.json.error.param, 'items[0].encrypted_content');
      const created = await http(server.url, 'POST', '/v1/conversations', { key, body: { items: [item] } });
      assert.equal(created.status, 400, created.text);
    }
    assert.ok(
      (await client.responses.create({ model: STORIES, conversation: conv.id, input: 'And?', max_output_tokens: 4 })).output.length > 0,
    );
  });

  it('refuses two input items with one id, sent twice or referenced twice, naming the second (as OpenAI does)', async () => {
    const item = { type: 'message' as const, id: 'msg_dup_0001', role: 'user' as const, content: 'Once upon a time' };
    await assert.rejects(
      client.responses.create({ model: STORIES, input: [item, { ...item, content: 'again' }], max_output_tokens: 5 }),
      (e: unknown) =>
        e instanceof OpenAI.BadRequestError && e.param === 'input[1]' && /Duplicate item found with id msg_dup_0001\./.test(e.message),
    );
    // Nothing was stored under that id by the refused request; one use of it is fine.
    const first = await client.responses.create({ model: STORIES, input: [item], max_output_tokens: 5 });
    assert.equal(first.status === 'completed' || first.status === 'incomplete', true);
    await assert.rejects(
      client.responses.create({
        model: STORIES,
        input: [
          { type: 'item_reference', id: 'msg_dup_0001' },
          { type: 'item_reference', id: 'msg_dup_0001' },
        ],
        max_output_tokens: 5,
      }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.param === 'input[1]',
    );
  });
});
