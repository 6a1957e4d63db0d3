import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'undici';
import OpenAI from 'openai';
import { createKey, http, startServer, startWithClient, type TestServer } from './helpers/server.js';
import { eventually } from './helpers/wait.js';
import { GrammarTextDecoder } from '../src/engines/local/grammar-text.js';

const STORIES = 'local/stories260k';
const RANDOM = 'local/llama-2-tiny-random';

describe('POST /v1/chat/completions with the real TinyStories model', () => {
  let server: TestServer;
  let client: OpenAI;
  let key: string;

  before(async () => {
    ({ server, client, key } = await startWithClient());
  });
  after(() => server.close());

  it('answers non-stream with a TinyStories continuation and exact usage', async () => {
    const { data: res, request_id } = await client.chat.completions
      .create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 40,
        temperature: 0,
      })
      .withResponse();
    assert.match(request_id ?? '', /^req_/);
    assert.equal(res.object, 'chat.completion');
    assert.match(res.id, /^chatcmpl-/);
    assert.equal(res.model, STORIES);
    const choice = res.choices[0]!;
    assert.equal(choice.message.role, 'assistant');
    assert.match(choice.message.content ?? '', /there was a little girl named Lily/);
    assert.equal(choice.finish_reason, 'length');
    const u = res.usage!;
    assert.equal(u.completion_tokens, 40);
    assert.equal(u.prompt_tokens, 5, 'BOS + 4 tokens of "Once upon a time"');
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    assert.equal(typeof u.prompt_tokens_details?.cached_tokens, 'number');
  });

  it('streams token by token: role first, finish_reason last, then [DONE]', async () => {
    const stream = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 30,
      temperature: 0,
      stream: true,
    });
    const chunks: OpenAI.Chat.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    assert.ok(chunks.length > 10, `one chunk per token or so, got ${chunks.length}`);
    assert.equal(chunks[0]!.choices[0]!.delta.role, 'assistant');
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    assert.match(text, /^, there was a little girl/);
    assert.equal(chunks.at(-1)!.choices[0]!.finish_reason, 'length');
    assert.ok(chunks.slice(0, -1).every((c) => c.choices[0]!.finish_reason === null));
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0]!.id));
  });

  it('works with the chat.completions.stream() helper and finalChatCompletion()', async () => {
    const runner = client.chat.completions.stream({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 20,
      temperature: 0,
    });
    let deltas = '';
    runner.on('content', (d) => {
      deltas += d;
    });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0]!.message.content, deltas);
    assert.match(deltas, /little girl/);
    assert.equal(final.choices[0]!.finish_reason, 'length');
  });

  it('sends a usage chunk before [DONE] with include_usage', async () => {
    const stream = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 12,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.Chat.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    const last = chunks.at(-1)!;
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage?.completion_tokens, 12);
    assert.equal(last.usage?.prompt_tokens, 5);
    assert.ok(chunks.slice(0, -1).every((c) => c.usage === null));
  });

  it('stops before a stop sequence, with finish_reason stop', async () => {
    const res = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 100,
      temperature: 0,
      stop: ['Lily'],
    });
    assert.equal(res.choices[0]!.message.content, ', there was a little girl named ');
    assert.equal(res.choices[0]!.finish_reason, 'stop');
    const streamed = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 100,
      temperature: 0,
      stop: ['park', 'Lily'],
      stream: true,
    });
    let text = '';
    let finish: string | null = null;
    for await (const c of streamed) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, ', there was a little girl named ');
    assert.equal(finish, 'stop');
  });

  it('max_tokens 5 gives finish_reason length and at most 5 completion tokens', async () => {
    const res = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 5,
    });
    assert.equal(res.choices[0]!.finish_reason, 'length');
    assert.ok(res.usage!.completion_tokens <= 5);
    const viaNewName = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_completion_tokens: 3,
    });
    assert.equal(viaNewName.usage!.completion_tokens, 3);
  });

  it('caps the output at the space the context leaves when no limit is given', async () => {
    const res = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      temperature: 0,
    });
    // TinyStories separates stories with BOS rather than ending them, so greedy decoding fills the context.
    assert.equal(res.choices[0]!.finish_reason, 'length');
    assert.equal(res.usage!.prompt_tokens + res.usage!.completion_tokens, 512);
  });

  it('takes a multi-turn conversation, and reuses the cached prefix', async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'Once upon a time, there was a little dog named Max.' },
      { role: 'user', content: 'Max liked to run in the park.' },
    ];
    const first = await client.chat.completions.create({ model: STORIES, messages, max_tokens: 20, temperature: 0 });
    const reply = first.choices[0]!.message.content!;
    assert.ok(reply.length > 0);
    const second = await client.chat.completions.create({
      model: STORIES,
      max_tokens: 20,
      temperature: 0,
      messages: [...messages, { role: 'assistant', content: reply }, { role: 'user', content: 'One day, Max saw a cat.' }],
    });
    assert.ok(second.choices[0]!.message.content!.length > 0);
    assert.ok(second.usage!.prompt_tokens > first.usage!.prompt_tokens);
    assert.ok(
      second.usage!.prompt_tokens_details!.cached_tokens! >= first.usage!.prompt_tokens - 1,
      `the earlier turns came from the KV cache (${second.usage!.prompt_tokens_details!.cached_tokens} cached)`,
    );
    // An assistant turn given as content parts, a refusal among them (OpenAI's shape), reads as the same text.
    const parts = await client.chat.completions.create({
      model: STORIES,
      max_tokens: 20,
      temperature: 0,
      messages: [
        ...messages,
        { role: 'assistant', content: [{ type: 'refusal', refusal: reply }] },
        { role: 'user', content: 'One day, Max saw a cat.' },
      ],
    });
    assert.equal(parts.usage!.prompt_tokens, second.usage!.prompt_tokens);
    assert.equal(parts.choices[0]!.message.content, second.choices[0]!.message.content);
  });

  it('gives identical text twice at temperature 0', async () => {
    const ask = () =>
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'The cat sat' }],
        max_tokens: 60,
        temperature: 0,
      });
    const [a, b] = [await ask(), await ask()];
    assert.equal(a.choices[0]!.message.content, b.choices[0]!.message.content);
    assert.ok(a.choices[0]!.message.content!.length > 20);
  });

  it('answers a context overflow with 400 context_length_exceeded giving the numbers', async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 600,
      }),
      (err: unknown) => {
        assert.ok(err instanceof OpenAI.BadRequestError);
        assert.equal(err.code, 'context_length_exceeded');
        assert.match(err.message, /512/);
        assert.match(err.message, /605/);
        return true;
      },
    );
    await assert.rejects(
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'word '.repeat(600) }],
      }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && err.code === 'context_length_exceeded',
    );
  });

  it('answers an unknown model with 404 and a catalogue model without deployment with 503', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'meta-llama/nope', messages: [{ role: 'user', content: 'hi' }] }),
      (err: unknown) => err instanceof OpenAI.NotFoundError && err.code === 'model_not_found',
    );
    // The file's own casing: a 404 that names the id to use (a newcomer's first try).
    await assert.rejects(
      client.chat.completions.create({ model: 'local/stories260K', messages: [{ role: 'user', content: 'hi' }] }),
      (err: unknown) => err instanceof OpenAI.NotFoundError && /Did you mean 'local\/stories260k'\?/.test(err.message),
    );
    // Without its author, as other services spell ids: the one model with that slug.
    await assert.rejects(
      client.chat.completions.create({ model: 'Stories260K', messages: [{ role: 'user', content: 'hi' }] }),
      (err: unknown) => err instanceof OpenAI.NotFoundError && /Did you mean 'local\/stories260k'\?/.test(err.message),
    );
    // A base URL without /v1, and one with /v1 where the SDK adds it again: the 404 says which to give.
    const bare = await http(server.url, 'POST', '/chat/completions', { key, body: {} });
    assert.equal(bare.status, 404);
    assert.match(bare.json.error.message, /base URL ending in \/v1/);
    const twice = await http(server.url, 'POST', '/v1/v1/messages', { key, body: {} });
    assert.equal(twice.status, 404);
    assert.match(twice.json.error.message, /\/v1 twice/);
    const res = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: 'qwen/qwen3-8b', messages: [{ role: 'user', content: 'hi' }] },
    });
    assert.equal(res.status, 503);
    assert.equal(res.headers['retry-after'], '60', 'every 503 says when to come back');
    assert.equal(res.json.error.code, 'no_deployment');
    assert.equal(res.headers['x-should-retry'], 'false');
    const image = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: 'black-forest-labs/flux.1-schnell', messages: [{ role: 'user', content: 'hi' }] },
    });
    assert.equal(image.status, 400);
  });

  it('enforces the request limits by schema', async () => {
    const base = { model: STORIES, messages: [{ role: 'user', content: 'hi' }] };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ ...base, model: '' }, 'model'],
      [{ ...base, model: 'x'.repeat(256) }, 'model'],
      [{ ...base, temperature: 2.5 }, 'temperature'],
      [{ ...base, temperature: -0.1 }, 'temperature'],
      [{ ...base, temperature: 'hot' }, 'temperature'],
      [{ ...base, top_p: 1.5 }, 'top_p'],
      [{ ...base, max_tokens: 0 }, 'max_tokens'],
      [{ ...base, max_tokens: 2.5 }, 'max_tokens'],
      [{ ...base, n: 2 }, 'n'],
      // Stream options on a request that does not stream (OpenAI refuses them too).
      [{ ...base, stream_options: { include_usage: true } }, 'stream_options'],
      [{ ...base, stream: false, stream_options: { include_usage: true } }, 'stream_options'],
      [{ ...base, stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
      [{ ...base, presence_penalty: 3 }, 'presence_penalty'],
      [{ model: STORIES }, 'messages'],
      [{ ...base, messages: [] }, 'messages'],
      [{ ...base, messages: [{ role: 'wizard', content: 'hi' }] }, 'messages[0].role'],
      [
        { ...base, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] },
        'messages[0].content[0]',
      ],
      [{ ...base, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: {} }] }] }, 'messages[0].content[0].type'],
      [{ ...base, messages: [{ role: 'user', content: [{ type: 'text' }] }] }, 'messages[0].content[0].text'],
      [
        { ...base, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } },
        'tool_choice',
      ],
      // A tool_choice that cannot be honoured without tools ('auto' and 'none' can: below).
      [{ ...base, tool_choice: 'required' }, 'tool_choice'],
      [{ ...base, tools: [], tool_choice: 'required' }, 'tool_choice'],
      [{ ...base, tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice'],
      // A refusal part is an assistant's: a user's is refused by its type.
      [{ ...base, messages: [{ role: 'user', content: [{ type: 'refusal', refusal: 'no' }] }] }, 'messages[0].content[0].type'],
      [{ ...base, tools: Array.from({ length: 129 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })) }, 'tools'],
      // An outside SDK pass: a custom tool (openai v6) was told its `function` was missing, and
      // audio output and web search were accepted and not applied.
      [{ ...base, tools: [{ type: 'custom', custom: { name: 'code_exec' } }] }, 'tools[0].type'],
      [{ ...base, tools: [{ type: 'function' }] }, 'tools[0].function'],
      [{ ...base, modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'mp3' } }, 'modalities'],
      [{ ...base, audio: { voice: 'alloy', format: 'mp3' } }, 'audio'],
      [{ ...base, web_search_options: { search_context_size: 'high' } }, 'web_search_options'],
      // Ten thousand messages at most (MAX_INPUT_ITEMS: each is decoded on the event loop).
      [{ ...base, messages: Array.from({ length: 10_001 }, () => ({ role: 'user', content: 'hi' })) }, 'messages'],
      // A tool message answers a tool call an earlier assistant message made (OpenAI's rule).
      [{ ...base, messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].tool_call_id'],
      [{ ...base, messages: [{ role: 'tool', tool_call_id: 'call_zzz', content: 'x' }] }, 'messages[0].tool_call_id'],
      [
        {
          ...base,
          messages: [
            { role: 'user', content: 'Weather?' },
            {
              role: 'assistant',
              content: null,
              tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } }],
            },
            { role: 'tool', tool_call_id: 'call_2', content: 'x' },
          ],
        },
        'messages[2].tool_call_id',
      ],
      [{ ...base, response_format: { type: 'xml' } }, 'response_format.type'],
      [{ ...base, response_format: { type: 'json_schema' } }, 'response_format.json_schema'],
      // Metadata keys of at most 64 characters (values 512, 16 pairs).
      [{ ...base, store: true, metadata: { ['k'.repeat(65)]: 'v' } }, 'metadata'],
      [
        // A schema that accepts no value (issue 16: patterns compile now; this cannot).
        {
          ...base,
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', minLength: 5, maxLength: 2 } } },
        },
        'response_format',
      ],
      [
        { ...base, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } } },
        'response_format',
      ],
      // A pattern anchored at both ends whose matches are all shorter than minLength, or one whose
      // matches are all longer than maxLength: no string satisfies either.
      [
        {
          ...base,
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a$', minLength: 2 } } },
        },
        'response_format',
      ],
      [
        {
          ...base,
          response_format: {
            type: 'json_schema',
            json_schema: { name: 'x', schema: { type: 'string', pattern: '[0-9]{5}', maxLength: 3 } },
          },
        },
        'response_format',
      ],
    ];
    for (const [body, param] of cases) {
      const res = await http(server.url, 'POST', '/v1/chat/completions', { key, body });
      assert.equal(res.status, 400, `${JSON.stringify(body).slice(0, 120)} → ${res.text}`);
      assert.equal(res.json.error.param, param, res.text);
      if (param === 'metadata') assert.match(res.json.error.message, /keys are at most 64 characters/);
      if (param === 'response_format.type') assert.match(res.json.error.message, /'text', 'json_object', 'json_schema'/);
    }
    // Unknown fields are ignored; text parts are accepted.
    const ok = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: {
        ...base,
        max_tokens: 2,
        some_future_field: true,
        user: 'u1',
        tool_choice: 'none',
        metadata: { ['k'.repeat(64)]: 'v' },
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Once' }] }],
      },
    });
    assert.equal(ok.status, 200, ok.text);
  });

  it('meets minLength with a pattern that matches shorter strings but leaves an end open', async () => {
    // '^[a-z]' matches any string that starts with a letter; the letter alone is 1 character.
    for (const [pattern, test] of [
      ['^[a-z]', /^[a-z]/],
      ['[0-9]$', /[0-9]$/],
    ] as const) {
      const res = await client.chat.completions.create({
        model: STORIES,
        max_tokens: 40,
        messages: [{ role: 'user', content: 'Name it.' }],
        response_format: {
          type: 'json_schema',
          json_schema: { name: 'x', strict: true, schema: { type: 'string', pattern, minLength: 6, maxLength: 12 } },
        },
      });
      const value: unknown = JSON.parse(res.choices[0]!.message.content!);
      assert.equal(typeof value, 'string', res.choices[0]!.message.content!);
      const text = value as string;
      assert.ok([...text].length >= 6 && [...text].length <= 12, `length of ${JSON.stringify(text)}`);
      assert.match(text, test);
    }
  });

  it('writes non-ASCII enum values whole, streamed and not, without resampling (byte tokens read as the grammar reads them)', async () => {
    // stories260K writes these characters as byte tokens, and llama.cpp's grammar also admits
    // overlong byte sequences for them (F0 86 97 A5 for 日): seeds 1, 3 and 6 did so before.
    const values = ['日本語テキスト', '𝕏𝕐ℤ'];
    const resampled = async (): Promise<number> =>
      (
        (await http(server.url, 'GET', '/admin/local/loaded', { key: server.adminKey })).json as unknown as {
          schema_checks: { resampled: number };
        }
      ).schema_checks.resampled;
    const before = await resampled();
    const response_format = {
      type: 'json_schema' as const,
      json_schema: {
        name: 'o',
        strict: true,
        schema: { type: 'object', properties: { v: { type: 'string', enum: values } }, required: ['v'], additionalProperties: false },
      },
    };
    for (let seed = 0; seed < 8; seed++) {
      const messages = [{ role: 'user' as const, content: 'x' }];
      let streamed = '';
      for await (const chunk of await client.chat.completions.create({
        model: STORIES,
        seed,
        max_tokens: 100,
        messages,
        response_format,
        stream: true,
      }))
        streamed += chunk.choices[0]?.delta.content ?? '';
      const whole = await client.chat.completions.create({ model: STORIES, seed, max_tokens: 100, messages, response_format });
      for (const text of [streamed, whole.choices[0]!.message.content!]) {
        assert.ok(!text.includes('\uFFFD'), `seed ${seed}: ${text}`);
        assert.ok(values.includes((JSON.parse(text) as { v: string }).v), `seed ${seed}: ${text}`);
      }
    }
    assert.equal(await resampled(), before, 'no output needed a second sample');
  });

  it('an output cut by max_tokens in the middle of a character ends before it, never with U+FFFD', async () => {
    const messages = [{ role: 'user' as const, content: 'x' }];
    const read = async (body: OpenAI.ChatCompletionCreateParamsNonStreaming): Promise<string[]> => {
      let streamed = '';
      for await (const chunk of await client.chat.completions.create({ ...body, stream: true }))
        streamed += chunk.choices[0]?.delta.content ?? '';
      const whole = await client.chat.completions.create(body);
      assert.equal(whole.choices[0]!.finish_reason, 'length');
      return [streamed, whole.choices[0]!.message.content!];
    };
    // Under a grammar: each emoji is four byte tokens, so most cuts fall inside one.
    const document = '"😀😀😀😀"';
    const response_format = { type: 'json_schema' as const, json_schema: { name: 'x', schema: { const: '😀😀😀😀' } } };
    for (let max = 2; max <= 9; max++) {
      for (const text of await read({ model: STORIES, max_tokens: max, messages, response_format })) {
        assert.ok(!text.includes('\uFFFD') && document.startsWith(text), `max_tokens ${max}: ${JSON.stringify(text)}`);
        assert.ok(
          text.length >= 1 + 2 * Math.floor((max - 1) / 4),
          `max_tokens ${max}: every whole emoji is kept: ${JSON.stringify(text)}`,
        );
      }
    }
    // Without one: this model and seed cut a Cyrillic character at 47 tokens (a U+FFFD at the end before).
    for (let max = 44; max <= 50; max++) {
      const texts = await read({ model: RANDOM, seed: 14, max_tokens: max, messages: [{ role: 'user', content: 'hello 14' }] });
      for (const text of texts) assert.ok(!text.endsWith('\uFFFD'), `max_tokens ${max}: ${JSON.stringify(text.slice(-20))}`);
      assert.equal(texts[0], texts[1], 'streamed as answered whole');
    }
  });
});

describe('structured output that cannot be met', () => {
  let server: TestServer;
  let key: string;
  before(async () => {
    ({ server, key } = await startWithClient());
  });
  after(() => server.close());

  it('tells clients not to retry a schema the server already retried (no value satisfies it: two distinct strings of one)', async () => {
    // Only "a" matches the pattern, so no two items differ; the checks at admission cannot tell
    // (three distinct booleans they can, and refuse with a 400: tools.test.ts).
    const schema = { type: 'array', items: { type: 'string', pattern: '^a$' }, minItems: 2, uniqueItems: true };
    const res = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: {
        model: STORIES,
        max_tokens: 200,
        messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
      },
    });
    assert.equal(res.status, 500, res.text);
    assert.equal(res.json.error.code, 'structured_output_failed');
    assert.equal(res.headers['x-should-retry'], 'false', 'the openai SDKs would otherwise run it three times');
    // Its attempts share max_tokens: what they generated (billed) is no more than it allowed, which
    // is what admission reserved against a budget or tpm.
    const usage = await http<{ data: Array<{ output_tokens: number; requests: number }> }>(server.url, 'GET', '/v1/usage?group_by=model', {
      key,
    });
    const mine = usage.json.data.find((u) => u.requests >= 1);
    assert.ok(mine && mine.output_tokens <= 200, JSON.stringify(usage.json));
    // With little room, the attempts end at max_tokens in all: a 200 cut at the limit or the 500,
    // never four attempts' worth billed (a hostile pass overshot a budget so).
    const small = (await createKey(server, 'small-room')).key;
    for (let i = 0; i < 3; i++) {
      const r = await http(server.url, 'POST', '/v1/chat/completions', {
        key: small,
        body: {
          model: STORIES,
          max_tokens: 12,
          messages: [{ role: 'user', content: 'x' }],
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
        },
      });
      assert.ok(r.status === 200 || r.status === 500, r.text);
    }
    const billed = await http<{ data: Array<{ output_tokens: number; requests: number }> }>(server.url, 'GET', '/v1/usage', { key: small });
    assert.equal(billed.json.data[0]?.requests, 3, billed.text);
    assert.ok(billed.json.data[0]!.output_tokens <= 36, billed.text);
    // The same on the Responses API, whose failure is answered from the stored failed response.
    const responses = await http(server.url, 'POST', '/v1/responses', {
      key,
      body: {
        model: STORIES,
        max_output_tokens: 200,
        input: 'x',
        text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { a: schema }, required: ['a'] } } },
      },
    });
    assert.equal(responses.status, 500, responses.text);
    assert.equal(responses.json.error.code, 'structured_output_failed');
    assert.equal(responses.headers['x-should-retry'], 'false');
  });
});

describe('grammar text decoding (llama.cpp decode_utf8)', () => {
  it('reads overlong and split sequences as the grammar does, and what it would refuse as U+FFFD', () => {
    const text = (...tokens: number[][]) => {
      const d = new GrammarTextDecoder();
      return tokens.map((t) => d.push(Uint8Array.from(t))).join('') + d.end();
    };
    assert.equal(text([0xe6], [0x97], [0xa5]), '日');
    assert.equal(text([0xf0], [0x86], [0x97], [0xa5]), '日', 'the overlong form the grammar accepts');
    assert.equal(text([0xf0, 0x9d], [0x95, 0x8f]), '𝕏');
    assert.equal(text([0xc3, 0xa9, 0xe6]), 'é\uFFFD', 'a sequence still open at the end');
    assert.equal(text([0xe6], [0x41]), '\uFFFDA', 'a byte that does not continue the sequence');
    assert.equal(text([0x80]), '\uFFFD', 'a continuation byte cannot lead');
    assert.equal(text([0xed, 0xa0, 0x80]), '\uFFFD', 'a surrogate');
  });
});

describe('local engine concurrency', () => {
  let server: TestServer;
  let key: string;

  before(async () => {
    server = await startServer({ env: { SWITCHYARD_LOCAL_PARALLEL: '1', SWITCHYARD_LOCAL_QUEUE_SIZE: '0' } });
    key = (await createKey(server, 'acme')).key;
  });
  after(() => server.close());

  /** Opens a long stream on the random-weight model and returns once its first token has arrived. */
  async function openLongStream() {
    const res = await request(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: RANDOM, messages: [{ role: 'user', content: 'hello' }], max_tokens: 4000, stream: true }),
    });
    assert.equal(res.statusCode, 200);
    const it = res.body[Symbol.asyncIterator]();
    await it.next();
    return res;
  }

  it('answers 503 with retry-after when the queue is full', async () => {
    const long = await openLongStream();
    const busy = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: RANDOM, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
    assert.equal(busy.status, 503, busy.text);
    assert.equal(busy.json.error.code, 'overloaded');
    assert.equal(busy.headers['retry-after'], '1');
    long.body.destroy();
    // Leave the sequence free for the next test.
    await eventually(async () =>
      assert.equal(
        (
          await http(server.url, 'POST', '/v1/chat/completions', {
            key,
            body: { model: RANDOM, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 },
          })
        ).status,
        200,
      ),
    );
  });

  it('keeps background responses waiting for the sequence, however full the queue, and runs each', async () => {
    // The queue (size 0 here) bounds the requests clients wait on; a background response was
    // acknowledged as queued, and failing it as busy would lose it (a hostile pass saw 32 of 100 fail so).
    const long = await openLongStream();
    const c = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
    const queued = await Promise.all(
      Array.from({ length: 3 }, () =>
        c.responses.create({ model: RANDOM, input: 'Once upon a time', max_output_tokens: 5, background: true }),
      ),
    );
    assert.deepEqual(
      queued.map((r) => r.status),
      ['queued', 'queued', 'queued'],
    );
    // Requests a client waits on are still refused at once while the sequence is held.
    const busy = await http(server.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: RANDOM, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
    assert.equal(busy.status, 503, busy.text);
    assert.equal((await c.responses.retrieve(queued[0]!.id)).status, 'queued');
    long.body.destroy();
    await eventually(async () => {
      const now = await Promise.all(queued.map((r) => c.responses.retrieve(r.id)));
      assert.deepEqual(
        now.map((r) => [r.status, r.error]),
        now.map(() => ['incomplete', null]),
      );
    }, 30_000);
  });

  it('stops generating when the client disconnects and frees the slot', async () => {
    const long = await openLongStream();
    long.body.destroy();
    // One sequence and no queue: a request is served only once the abandoned generation has let go
    // of it, long before the thousands of tokens it asked for would have been generated.
    const next = await eventually(async () => {
      const r = await http<{ choices: Array<{ finish_reason: string }> }>(server.url, 'POST', '/v1/chat/completions', {
        key,
        body: { model: RANDOM, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
      });
      assert.equal(r.status, 200, r.text);
      return r;
    });
    assert.equal(next.json.choices[0]?.finish_reason, 'length');
  });

  it('serves concurrent requests one after another when the queue allows', async () => {
    const queued = await startServer({ env: { SWITCHYARD_LOCAL_PARALLEL: '2', SWITCHYARD_LOCAL_QUEUE_SIZE: '8' } });
    try {
      const k = (await createKey(queued, 'acme')).key;
      const c = new OpenAI({ apiKey: k, baseURL: queued.baseURL, maxRetries: 0 });
      const results = await Promise.all(
        Array.from({ length: 6 }, () =>
          c.chat.completions.create({
            model: STORIES,
            messages: [{ role: 'user', content: 'Once upon a time' }],
            max_tokens: 30,
            temperature: 0,
          }),
        ),
      );
      const texts = new Set(results.map((r) => r.choices[0]!.message.content));
      assert.equal(texts.size, 1, 'batched sequences give the same greedy text');
      assert.ok(results.every((r) => r.usage!.completion_tokens === 30));
    } finally {
      await queued.close();
    }
  });
});
