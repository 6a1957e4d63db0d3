import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Ajv } from 'ajv';
import { Ajv2019 } from 'ajv/dist/2019.js';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { z } from 'zod';
import { zodResponseFormat } from 'openai/helpers/zod';
import addFormatsModule from 'ajv-formats';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import OpenAI from 'openai';
import { createKey, http, startServer, tempDir, type TestServer } from './helpers/server.js';
import { GATEWAY_MODEL, chatFixture, chunkFrame, completionJson, fixture, startGateway } from './helpers/fixtures.js';
import Anthropic from '@anthropic-ai/sdk';

const STORIES = 'local/stories260k';
const ajv = new Ajv({ strict: false });
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (a: Ajv) => Ajv;

const weatherParams = {
  type: 'object',
  properties: {
    city: { type: 'string', description: 'City name', maxLength: 40 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    days: { type: 'integer' },
    alerts: { type: 'boolean' },
  },
  required: ['city', 'unit', 'days', 'alerts'],
  additionalProperties: false,
} as const;
const validWeather = ajv.compile(weatherParams);
const weatherTool: OpenAI.Chat.ChatCompletionTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'Weather forecast', parameters: weatherParams, strict: true },
};

const personSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 40 },
    age: { type: 'integer' },
    mood: { type: 'string', enum: ['happy', 'sad', 'sleepy'] },
    friends: { type: 'array', items: { type: 'string', maxLength: 20 }, maxItems: 3 },
  },
  required: ['name', 'age', 'mood', 'friends'],
  additionalProperties: false,
} as const;
const validPerson = ajv.compile(personSchema);

describe('function calling and structured output on the local engine (stories260K)', () => {
  let server: TestServer;
  let client: OpenAI;

  before(async () => {
    server = await startServer();
    client = new OpenAI({ apiKey: (await createKey(server, 'acme')).key, baseURL: server.baseURL, maxRetries: 0 });
  });
  after(() => server.close());
  /** `n` documents the local model writes under `schema` (strict json_schema, temperature 1), as text. */
  const documents = async (schema: Record<string, unknown>, n: number, maxTokens?: number): Promise<string[]> => {
    const out: string[] = [];
    for (let i = 0; i < n; i++) {
      const c = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        temperature: 1,
        ...(maxTokens !== undefined && { max_tokens: maxTokens }),
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } },
      });
      out.push(c.choices[0]!.message.content!);
    }
    return out;
  };

  /**
   * `n` answers of chat.completions.parse() under a zod schema (temperature 1), each held to zod's
   * own parse and to the JSON schema the SDK sent, compiled by `ajv` (formats by ajv-formats).
   */
  const parsedValid = async (shape: z.ZodType, name: string, n: number, ajv: Ajv): Promise<void> => {
    const check = ajv.compile(zodResponseFormat(shape, name).json_schema.schema!);
    for (let i = 0; i < n; i++) {
      const parsed = await client.chat.completions.parse({
        model: STORIES,
        temperature: 1,
        messages: [{ role: 'user', content: 'x' }],
        response_format: zodResponseFormat(shape, name),
      });
      const value = parsed.choices[0]!.message.parsed;
      assert.ok(shape.safeParse(value).success, JSON.stringify(value));
      assert.ok(check(value), `${JSON.stringify(value)}: ${JSON.stringify(check.errors)}`);
    }
  };

  /** Outputs the local engine sampled again after they failed their schema check, so far. */
  const resampled = async (): Promise<number> =>
    (
      (await http(server.url, 'GET', '/admin/local/loaded', { key: server.adminKey })).json as unknown as {
        schema_checks: { resampled: number };
      }
    ).schema_checks.resampled;

  /** `n` documents under `schema`, each valid for `ajv`'s compile of it, with nothing sampled again: the grammar was exact. */
  const exactDocuments = async (schema: Record<string, unknown>, n: number, ajv = new Ajv({ strict: false })): Promise<void> => {
    const before = await resampled();
    const check = ajv.compile(schema);
    for (const text of await documents(schema, n)) assert.ok(check(JSON.parse(text)), `${text}: ${JSON.stringify(check.errors)}`);
    assert.equal(await resampled(), before, 'exact: nothing sampled again');
  };

  it('advertises function_calling and structured_output for local models', async () => {
    const m = (await client.models.retrieve(STORIES)) as unknown as { capabilities: string[] };
    assert.ok(m.capabilities.includes('function_calling'));
    assert.ok(m.capabilities.includes('structured_output'));
  });

  it('tool_choice "required": 50 of 50 calls at temperature 1 parse and validate', async () => {
    const runs = await Promise.all(
      Array.from({ length: 50 }, () =>
        client.chat.completions.create({
          model: STORIES,
          temperature: 1,
          messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
          tools: [weatherTool],
          tool_choice: 'required',
        }),
      ),
    );
    for (const r of runs) {
      const choice = r.choices[0]!;
      assert.equal(choice.finish_reason, 'tool_calls');
      assert.equal(choice.message.content, null);
      const call = choice.message.tool_calls![0]!;
      assert.ok(call.type === 'function');
      assert.equal(call.function.name, 'get_weather');
      assert.match(call.id, /^call_/);
      const args: unknown = JSON.parse(call.function.arguments);
      assert.ok(validWeather(args), `${call.function.arguments}: ${JSON.stringify(validWeather.errors)}`);
    }
  });

  it('json_schema structured output: 50 of 50 validate', async () => {
    const runs = await Promise.all(
      Array.from({ length: 50 }, () =>
        client.chat.completions.create({
          model: STORIES,
          temperature: 1,
          messages: [{ role: 'user', content: 'Describe a person.' }],
          response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema, strict: true } },
        }),
      ),
    );
    for (const r of runs) {
      assert.equal(r.choices[0]!.finish_reason, 'stop');
      const value: unknown = JSON.parse(r.choices[0]!.message.content!);
      assert.ok(validPerson(value), `${r.choices[0]!.message.content}: ${JSON.stringify(validPerson.errors)}`);
    }
  });

  it('chat.completions.parse() returns the parsed object', async () => {
    const r = await client.chat.completions.parse({
      model: STORIES,
      messages: [{ role: 'user', content: 'Describe a person.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema, strict: true } },
    });
    const parsed = r.choices[0]!.message.parsed;
    assert.ok(parsed && validPerson(parsed));
  });

  it('picks among several tools under "required", and honours a named tool_choice', async () => {
    const tools: OpenAI.Chat.ChatCompletionTool[] = [
      weatherTool,
      {
        type: 'function',
        function: {
          name: 'get_time',
          parameters: {
            type: 'object',
            properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
            required: ['zone'],
            additionalProperties: false,
          },
        },
      },
    ];
    for (let i = 0; i < 10; i++) {
      const r = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Help me.' }],
        tools,
        tool_choice: 'required',
      });
      const call = r.choices[0]!.message.tool_calls![0]!;
      assert.ok(call.type === 'function' && ['get_weather', 'get_time'].includes(call.function.name));
      const args: unknown = JSON.parse(call.function.arguments);
      if (call.function.name === 'get_weather') assert.ok(validWeather(args));
      else assert.ok(['UTC', 'CET'].includes((args as { zone: string }).zone));
    }
    const named = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Help me.' }],
      tools,
      tool_choice: { type: 'function', function: { name: 'get_time' } },
    });
    assert.equal(
      named.choices[0]!.message.tool_calls![0]!.type === 'function' && named.choices[0]!.message.tool_calls![0]!.function.name,
      'get_time',
    );
  });

  it('a call among several tools cut by the output limit is an incomplete call with its name, once the name is whole (Open Responses)', async () => {
    // An outside compliance pass: with two tools or more, a cut call vanished (output []), while
    // with one it was an incomplete function_call. The spec: an item cut by the token budget is
    // `incomplete`, and its first event carries at least the name.
    const tools: OpenAI.Responses.FunctionTool[] = ['get_weather', 'get_time'].map((name) => ({
      type: 'function',
      name,
      strict: true,
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
    }));
    const ask = { model: STORIES, input: 'Weather?', temperature: 0, tool_choice: 'required' as const, tools };
    const whole = await client.responses.create(ask);
    const call = whole.output[0]!;
    assert.ok(call.type === 'function_call' && call.status === 'completed', JSON.stringify(whole.output));
    const used = whole.usage!.output_tokens;
    // Two tokens short of the whole call: its name is long written, its arguments are not closed.
    const cut = await client.responses.create({ ...ask, max_output_tokens: used - 2 });
    assert.equal(cut.status, 'incomplete');
    assert.equal(cut.incomplete_details?.reason, 'max_output_tokens');
    assert.equal(cut.output.length, 1, JSON.stringify(cut.output));
    const part = cut.output[0]!;
    assert.ok(part.type === 'function_call', JSON.stringify(part));
    assert.equal(part.name, call.name);
    assert.equal(part.status, 'incomplete');
    assert.ok(part.arguments.length > 0 && part.arguments !== call.arguments, part.arguments);
    assert.throws(() => JSON.parse(part.arguments) as unknown, 'arguments cut short do not parse');
    // Streamed: the item is added (with the name), its arguments streamed, and it ends incomplete.
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of await client.responses.create({ ...ask, max_output_tokens: used - 2, stream: true })) events.push(ev);
    const added = events.find((e) => e.type === 'response.output_item.added');
    assert.ok(added?.type === 'response.output_item.added' && added.item.type === 'function_call' && added.item.name === call.name);
    const done = events.find((e) => e.type === 'response.output_item.done');
    assert.ok(done?.type === 'response.output_item.done' && done.item.type === 'function_call' && done.item.status === 'incomplete');
    assert.equal(events.at(-1)!.type, 'response.incomplete');
    // Chat completions: the call as far as it came, finish_reason length.
    const chat = await client.chat.completions.create({
      model: STORIES,
      messages: [{ role: 'user', content: 'Weather?' }],
      temperature: 0,
      tool_choice: 'required',
      tools: tools.map((t) => ({ type: 'function' as const, function: { name: t.name, parameters: t.parameters!, strict: true } })),
      max_tokens: used - 2,
    });
    assert.equal(chat.choices[0]!.finish_reason, 'length');
    const chatCall = chat.choices[0]!.message.tool_calls?.[0];
    assert.ok(chatCall?.type === 'function' && chatCall.function.name === call.name, JSON.stringify(chat.choices[0]));
    // Cut exactly where the call ends, or one token before: the whole call, or a prefix of its
    // arguments (never the outer object's closing brace, which made them invalid JSON).
    const exact = await client.responses.create({ ...ask, max_output_tokens: used });
    const exactCall = exact.output[0]!;
    assert.ok(exactCall.type === 'function_call' && exactCall.status === 'completed', JSON.stringify(exact.output));
    assert.equal(exactCall.arguments, call.arguments);
    const oneShort = await client.responses.create({ ...ask, max_output_tokens: used - 1 });
    const shortCall = oneShort.output[0]!;
    assert.ok(shortCall.type === 'function_call' && shortCall.status === 'incomplete', JSON.stringify(oneShort.output));
    assert.ok(!shortCall.arguments.endsWith('}}'), shortCall.arguments);
    assert.equal(JSON.stringify(JSON.parse(shortCall.arguments)), call.arguments, 'one token short of the call is the outer brace');
    // Cut inside the name: no call at all (nothing nameable was written).
    const early = await client.responses.create({ ...ask, max_output_tokens: 5 });
    assert.equal(early.status, 'incomplete');
    assert.deepEqual(early.output, []);
  });

  it('calls only the allowed tools (tool_choice allowed_tools), on chat completions and Responses', async () => {
    const timeParams = {
      type: 'object',
      properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
      required: ['zone'],
      additionalProperties: false,
    };
    const tools: OpenAI.Chat.ChatCompletionTool[] = [
      weatherTool,
      { type: 'function', function: { name: 'get_time', parameters: timeParams } },
    ];
    // Required among one allowed tool of two: every call is to that tool, at temperature 1.
    for (let i = 0; i < 8; i++) {
      const r = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Help me.' }],
        tools,
        tool_choice: {
          type: 'allowed_tools',
          allowed_tools: { mode: 'required', tools: [{ type: 'function', function: { name: 'get_time' } }] },
        },
      });
      const calls = r.choices[0]!.message.tool_calls ?? [];
      assert.ok(calls.length > 0);
      for (const c of calls) assert.equal(c.type === 'function' && c.function.name, 'get_time');
    }
    const responsesTools: OpenAI.Responses.FunctionTool[] = [
      { type: 'function', name: 'get_weather', parameters: weatherParams, strict: true },
      { type: 'function', name: 'get_time', parameters: timeParams, strict: true },
    ];
    for (let i = 0; i < 8; i++) {
      const r = await client.responses.create({
        model: STORIES,
        input: 'Help me.',
        tools: responsesTools,
        tool_choice: { type: 'allowed_tools', mode: 'required', tools: [{ type: 'function', name: 'get_weather' }] },
        store: false,
      });
      const calls = r.output.filter((o) => o.type === 'function_call');
      assert.ok(calls.length > 0);
      for (const c of calls) {
        assert.equal(c.name, 'get_weather');
        assert.ok(validWeather(JSON.parse(c.arguments)));
      }
      // The request's tools and choice are echoed as sent (the mode the client left out, as its default).
      assert.equal(r.tools.length, 2);
      assert.deepEqual(r.tool_choice, { type: 'allowed_tools', mode: 'required', tools: [{ type: 'function', name: 'get_weather' }] });
    }
    // A name that is not one of the tools is refused, naming where it is.
    const bad = await http(server.url, 'POST', '/v1/responses', {
      key: client.apiKey!,
      body: {
        model: STORIES,
        input: 'x',
        tools: responsesTools,
        tool_choice: { type: 'allowed_tools', tools: [{ type: 'function', name: 'nope' }] },
      },
    });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, 'tool_choice.tools[0].name');
    const badChat = await http(server.url, 'POST', '/v1/chat/completions', {
      key: client.apiKey!,
      body: {
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        tools,
        tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'auto', tools: [{ type: 'function', function: { name: 'nope' } }] } },
      },
    });
    assert.equal(badChat.status, 400, badChat.text);
    assert.equal(badChat.json.error.param, 'tool_choice.allowed_tools.tools[0].function.name');

    // A malformed tool_choice is refused naming what is wrong with it, not a field of another shape.
    for (const [choice, param, message] of [
      [{ type: 'bogus' }, 'tool_choice.type', /must be one of 'function', 'allowed_tools'/],
      [
        { type: 'allowed_tools', mode: 'bogus', tools: [{ type: 'function', name: 'get_weather' }] },
        'tool_choice.mode',
        /'none', 'auto', 'required'/,
      ],
      [{ type: 'allowed_tools', mode: 'required', tools: [] }, 'tool_choice.tools', /fewer than 1/],
      [{ type: 'function' }, 'tool_choice.name', /Missing required parameter/],
    ] as const) {
      const res = await http(server.url, 'POST', '/v1/responses', {
        key: client.apiKey!,
        body: { model: STORIES, input: 'x', tools: responsesTools, tool_choice: choice },
      });
      assert.equal(res.status, 400, res.text);
      assert.equal(res.json.error.param, param, res.text);
      assert.match(res.json.error.message, message);
    }
  });

  it('lets the model answer in text under "auto" (it never opens a tool call)', async () => {
    const r = await client.chat.completions.create({
      model: STORIES,
      temperature: 0,
      max_tokens: 20,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      tools: [weatherTool],
    });
    assert.equal(r.choices[0]!.finish_reason, 'length');
    assert.ok(r.choices[0]!.message.content!.length > 0);
    const none = await client.chat.completions.create({
      model: STORIES,
      temperature: 0,
      max_tokens: 5,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      tools: [weatherTool],
      tool_choice: 'none',
    });
    assert.equal(none.choices[0]!.message.tool_calls, undefined);
  });

  it('streams tool-call deltas that chat.completions.stream() reassembles', async () => {
    const stream = client.chat.completions.stream({
      model: STORIES,
      messages: [{ role: 'user', content: 'Weather?' }],
      tools: [weatherTool],
      tool_choice: 'required',
    });
    const fragments: string[] = [];
    stream.on('tool_calls.function.arguments.delta', (e) => {
      fragments.push(e.arguments_delta);
    });
    const final = await stream.finalChatCompletion();
    const call = final.choices[0]!.message.tool_calls![0]!;
    assert.ok(call.type === 'function');
    assert.ok(fragments.length > 3, 'arguments arrived in pieces');
    assert.equal(fragments.join(''), call.function.arguments);
    assert.ok(validWeather(JSON.parse(call.function.arguments)));
    assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
  });

  it('completes a runTools loop with a real local function, then a follow-up turn', async () => {
    const calls: unknown[] = [];
    const runner = client.chat.completions.runTools({
      model: STORIES,
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      tools: [
        {
          type: 'function',
          function: {
            name: 'get_weather',
            description: 'Weather forecast',
            parameters: structuredClone(weatherParams) as unknown as Record<string, unknown>,
            parse: (s: string) => JSON.parse(s) as Record<string, unknown>,
            function: (args: Record<string, unknown>) => {
              calls.push(args);
              return { forecast: 'sunny', temperature: 21 };
            },
          },
        },
      ],
    });
    const messages = await runner.done().then(() => runner.messages);
    assert.equal(calls.length, 1);
    assert.ok(validWeather(calls[0]));
    const toolMsg = messages.find((m) => m.role === 'tool');
    assert.match(String(toolMsg?.content), /sunny/);
    // The transcript (assistant with tool_calls and null content, then the tool message) is valid input.
    const next = await client.chat.completions.create({
      model: STORIES,
      max_tokens: 10,
      messages: messages as OpenAI.Chat.ChatCompletionMessageParam[],
    });
    assert.ok(next.choices[0]!.message.content!.length > 0);
  });

  // Zod's .int().min(1).max(14), a pattern, formats and an exclusive bound: all enforced by the grammar.
  const bookingParams = {
    type: 'object',
    properties: {
      nights: { type: 'integer', minimum: 1, maximum: 14 },
      score: { type: 'number', exclusiveMinimum: 0, maximum: 1 },
      code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2,4}$' },
      email: { type: 'string', format: 'email' },
      when: { type: 'string', format: 'date-time' },
      id: { type: 'string', format: 'uuid' },
      tags: { type: 'array', items: { type: 'string', enum: ['sea', 'city', 'hills'] }, uniqueItems: true },
    },
    required: ['nights', 'score', 'code', 'email', 'when', 'id', 'tags'],
    additionalProperties: false,
  } as const;
  const validBooking = new Ajv({ strict: false });
  addFormats(validBooking);
  const checkBooking = validBooking.compile(bookingParams);

  it('ranges, patterns and formats: 50 of 50 tool calls and 50 of 50 json_schema documents valid at temperature 1', async () => {
    // Two at a time: the local model's queue is bounded (SWITCHYARD_LOCAL_QUEUE).
    const results: unknown[][] = [];
    for (let i = 0; i < 50; i++) {
      results.push(
        await (async () => {
          const [call, doc] = await Promise.all([
            client.chat.completions.create({
              model: STORIES,
              messages: [{ role: 'user', content: 'Book a stay.' }],
              temperature: 1,
              tools: [{ type: 'function', function: { name: 'book', parameters: bookingParams, strict: true } }],
              tool_choice: 'required',
            }),
            client.chat.completions.create({
              model: STORIES,
              messages: [{ role: 'user', content: 'Book a stay.' }],
              temperature: 1,
              response_format: { type: 'json_schema', json_schema: { name: 'booking', schema: bookingParams, strict: true } },
            }),
          ]);
          const tc = call.choices[0]!.message.tool_calls![0]!;
          assert.equal(tc.type, 'function');
          return [JSON.parse(tc.function.arguments) as unknown, JSON.parse(doc.choices[0]!.message.content!) as unknown];
        })(),
      );
    }
    for (const pair of results)
      for (const v of pair) assert.ok(checkBooking(v), `${JSON.stringify(v)}: ${JSON.stringify(checkBooking.errors)}`);
  });

  it("zod's formats, which it writes with a pattern beside: 20 of 20 documents valid at temperature 1", async () => {
    // z.uuid() narrows the version and variant digits, z.iso.datetime() wants `Z` and allows any
    // number of fraction digits: the format's grammar alone missed the pattern on nearly every try.
    const Booking = z.object({ id: z.uuid(), at: z.iso.datetime(), day: z.iso.date(), mail: z.email(), ip: z.ipv4() });
    await parsedValid(Booking, 'booking', 20, validBooking);
  });

  it('ranges between whole numbers, integers past 2^53 and minContains: valid at the first sample, resampled never', async () => {
    const before = await resampled();
    // The openai SDK's zod helper, as its docs show it: a confidence between 0.1 and 0.9.
    const Score = z.object({ confidence: z.number().min(0.1).max(0.9), temp: z.number().gt(37.2).lt(37.9) });
    for (let seed = 0; seed < 6; seed++) {
      const parsed = await client.chat.completions.parse({
        model: STORIES,
        seed,
        temperature: 1,
        messages: [{ role: 'user', content: 'Score it.' }],
        response_format: zodResponseFormat(Score, 'score'),
      });
      const score = parsed.choices[0]!.message.parsed!;
      assert.ok(score.confidence >= 0.1 && score.confidence <= 0.9 && score.temp > 37.2 && score.temp < 37.9, JSON.stringify(score));
    }
    const schemas: Array<[string, Record<string, unknown>]> = [
      ['a range inside one whole part', { type: 'number', minimum: 0.5, maximum: 0.6 }],
      [
        'coordinates',
        {
          type: 'object',
          properties: { lat: { type: 'number', minimum: 51.28, maximum: 51.69 }, lon: { type: 'number', minimum: -0.51, maximum: 0.33 } },
          required: ['lat', 'lon'],
          additionalProperties: false,
        },
      ],
      ['a negative range', { type: 'number', exclusiveMinimum: -0.6, exclusiveMaximum: -0.5 }],
      ['integers from 10^15', { type: 'integer', minimum: 1e15 }],
      ['nanosecond timestamps', { type: 'integer', minimum: 1_700_000_000_000_000_000, maximum: 1_800_000_000_000_000_000 }],
      ['past an exclusive 10^17', { type: 'integer', exclusiveMinimum: 1e17 }],
      [
        'two items that contain x (2020-12)',
        { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'array', contains: { const: 'x' }, minContains: 2 },
      ],
      [
        'contains: true, three items (2020-12)',
        { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'array', contains: true, minContains: 3, maxItems: 4 },
      ],
      [
        'contains evaluates its items, unevaluatedItems the others (2020-12)',
        {
          $schema: 'https://json-schema.org/draft/2020-12/schema',
          type: 'array',
          unevaluatedItems: { type: 'integer', minimum: 1, maximum: 3 },
          contains: { type: 'string', maxLength: 3 },
          minItems: 2,
        },
      ],
      [
        'an integer past the largest double, or a string',
        {
          anyOf: [
            { type: 'integer', exclusiveMinimum: Number.MAX_VALUE },
            { type: 'string', maxLength: 8 },
          ],
        },
      ],
      [
        'exactly three fives (2019-09)',
        { $schema: 'https://json-schema.org/draft/2019-09/schema', contains: { const: 5 }, minContains: 3, maxContains: 3, maxItems: 3 },
      ],
    ];
    for (const [name, schema] of schemas) {
      const uri = String(schema['$schema'] ?? '');
      const validator = uri.includes('2020-12')
        ? new Ajv2020({ strict: false })
        : uri.includes('2019-09')
          ? new Ajv2019({ strict: false })
          : new Ajv({ strict: false });
      const check = validator.compile(schema);
      for (let seed = 0; seed < 3; seed++) {
        const c = await client.chat.completions.create({
          model: STORIES,
          seed,
          temperature: 1,
          max_tokens: 100,
          messages: [{ role: 'user', content: 'x' }],
          response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema } },
        });
        const value: unknown = JSON.parse(c.choices[0]!.message.content!);
        assert.ok(check(value), `${name}, seed ${seed}: ${c.choices[0]!.message.content} ${JSON.stringify(check.errors)}`);
      }
    }
    assert.equal(await resampled(), before, 'the grammar alone kept every document valid');
    // Schemas no value satisfies (as Ajv agrees): a 400 at admission, not four samples and a 500.
    const impossible = [
      { $schema: 'https://json-schema.org/draft/2020-12/schema', contains: { const: 'x' }, minContains: 3, maxItems: 2 },
      { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'array', items: false, contains: { type: 'integer' } },
      { type: 'number', minimum: 0.6, maximum: 0.5 },
      { type: 'number', exclusiveMinimum: 0.5, exclusiveMaximum: 0.5 },
    ];
    for (const schema of impossible) {
      const res = await http(server.url, 'POST', '/v1/chat/completions', {
        key: client.apiKey!,
        body: {
          model: STORIES,
          max_tokens: 30,
          messages: [{ role: 'user', content: 'x' }],
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
        },
      });
      assert.equal(res.status, 400, `${JSON.stringify(schema)}: ${res.text}`);
      assert.equal(res.json.error.code, 'invalid_value');
    }
  });

  it('Responses: a function tool that leaves out strict is held to its schema where it can be, best effort where not (the default OpenAI documents)', async () => {
    const parameters = {
      type: 'object',
      properties: { t: { type: 'number', minimum: 0.5, maximum: 0.6 }, unit: { type: 'string', enum: ['c', 'f'] } },
      required: ['t', 'unit'],
      additionalProperties: false,
    };
    const check = new Ajv({ strict: false }).compile(parameters);
    for (let seed = 0; seed < 3; seed++) {
      const r = await client.responses.create({
        model: STORIES,
        input: 'Set it.',
        temperature: 1,
        max_output_tokens: 100,
        tool_choice: 'required',
        tools: [{ type: 'function', name: 'set_temp', parameters } as unknown as OpenAI.Responses.FunctionTool],
      });
      assert.equal(r.status, 'completed');
      assert.equal(r.tools[0]!.type === 'function' && r.tools[0]!.strict, true, 'echoed as strict');
      const call = r.output.find((o) => o.type === 'function_call');
      assert.ok(call && call.type === 'function_call', JSON.stringify(r.output));
      const args: unknown = JSON.parse(call.arguments);
      assert.ok(check(args), `seed ${seed}: ${call.arguments}`);
    }
    // Where the schema cannot be held (it cannot be compiled), the default falls back to best effort,
    // as strict: false does; only strict: true refuses it.
    const broken = { type: 'object', properties: { a: { $ref: '#/$defs/missing' } }, required: ['a'] };
    const ask = (strict: boolean | undefined) =>
      http(server.url, 'POST', '/v1/responses', {
        key: client.apiKey!,
        body: {
          model: STORIES,
          input: 'x',
          max_output_tokens: 40,
          tool_choice: 'required',
          tools: [{ type: 'function', name: 'f', parameters: broken, ...(strict !== undefined && { strict }) }],
        },
      });
    const tools = (res: { json: unknown }) => (res.json as { tools: Array<{ strict: boolean }> }).tools;
    const unsaid = await ask(undefined);
    assert.equal(unsaid.status, 200, unsaid.text);
    assert.equal(tools(unsaid)[0]!.strict, true, 'the default, echoed as Open Responses states it');
    const strict = await ask(true);
    assert.equal(strict.status, 400, strict.text);
    const lenient = await ask(false);
    assert.equal(lenient.status, 200, lenient.text);
    assert.equal(tools(lenient)[0]!.strict, false);
  });

  it('a strict: false tool with a schema the grammar cannot hold whole is never refused (tool_choice auto and required)', async () => {
    const zodTool = {
      type: 'function' as const,
      function: {
        name: 'plan',
        strict: false,
        parameters: {
          type: 'object',
          properties: { days: { type: 'integer', minimum: 1, maximum: 14 }, not_this: { not: { const: 3 } } },
          required: ['days'],
        },
      },
    };
    for (const tool_choice of ['auto', 'required'] as const) {
      const c = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Plan a trip.' }],
        tools: [zodTool],
        tool_choice,
      });
      assert.ok(['stop', 'tool_calls', 'length'].includes(c.choices[0]!.finish_reason), c.choices[0]!.finish_reason);
    }
  });

  it('keywords the grammar cannot hold (oneOf overlap, uniqueItems) are checked and sampled again: never an invalid document', async () => {
    const schema = {
      type: 'object',
      properties: {
        n: {
          oneOf: [
            { type: 'integer', minimum: 0, maximum: 9 },
            { type: 'integer', minimum: 5, maximum: 20 },
          ],
        },
        picks: { type: 'array', items: { enum: ['a', 'b', 'c'] }, uniqueItems: true, minItems: 2, maxItems: 2 },
      },
      required: ['n', 'picks'],
      additionalProperties: false,
    };
    const check = new Ajv({ strict: false }).compile(schema);
    const before = await resampled();
    let valid = 0;
    for (let i = 0; i < 20; i++) {
      for (const stream of [false, true]) {
        try {
          let text = '';
          if (stream) {
            const s = await client.chat.completions.create({
              model: STORIES,
              messages: [{ role: 'user', content: 'x' }],
              temperature: 1,
              stream: true,
              response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
            });
            for await (const chunk of s) text += chunk.choices[0]?.delta.content ?? '';
          } else {
            const c = await client.chat.completions.create({
              model: STORIES,
              messages: [{ role: 'user', content: 'x' }],
              temperature: 1,
              response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
            });
            text = c.choices[0]!.message.content!;
          }
          assert.ok(check(JSON.parse(text)), `${text}: ${JSON.stringify(check.errors)}`);
          valid++;
        } catch (err) {
          // The only other outcome allowed: every attempt failed the check, and the request says so.
          if (!(err instanceof OpenAI.APIError) || err.code !== 'structured_output_failed') throw err;
        }
      }
    }
    assert.ok(valid >= 30, `${valid} of 40 valid`);
    assert.ok((await resampled()) > before, 'some outputs failed the check and were sampled again');
  });

  it('minProperties past the declared properties: members under names of their own, every document valid', async () => {
    const schemas = [
      { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], minProperties: 2 },
      { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'string' } }, minProperties: 3 },
      // A map: keys the model makes up could repeat, and JSON counts a repeated key once.
      { type: 'object', additionalProperties: { type: 'integer' }, minProperties: 4, maxProperties: 6 },
      // A name the schema forbids is never one of the names made up.
      { type: 'object', properties: { a: { type: 'integer' }, key1: false }, required: ['a'], minProperties: 2 },
    ];
    // The grammar holds these exactly: nothing is sampled again (a stream could not be).
    const before = await resampled();
    for (const schema of schemas) {
      const check = new Ajv({ strict: false }).compile(schema);
      for (const text of await documents(schema, 5)) assert.ok(check(JSON.parse(text)), `${text}: ${JSON.stringify(check.errors)}`);
    }
    assert.equal(await resampled(), before);
    // Anthropic's strict tool use, which Messages took without `strict` (a lenient tool, returned invalid).
    const anthropic = new Anthropic({ apiKey: server.adminKey, baseURL: server.url, maxRetries: 0 });
    const tool = {
      name: 't',
      strict: true,
      input_schema: { type: 'object' as const, additionalProperties: { type: 'integer' }, minProperties: 4 },
    };
    const check = new Ajv({ strict: false }).compile(tool.input_schema);
    for (let i = 0; i < 5; i++) {
      const m = await anthropic.messages.create({
        model: STORIES,
        max_tokens: 120,
        tools: [tool],
        tool_choice: { type: 'tool', name: 't' },
        messages: [{ role: 'user', content: 'x' }],
      });
      const use = m.content.find((b) => b.type === 'tool_use');
      assert.ok(use && check(use.input), JSON.stringify(m.content));
    }
  });

  it('writes no key twice in an object whose keys the model makes up (json_object, maps): 0 of 60 documents', async () => {
    // JSON.parse keeps the last of a repeated key, so the repeat must be found in the text itself.
    const repeatedKeys = (text: string): string[] => {
      const repeated: string[] = [];
      const open: Array<Set<string> | undefined> = [];
      let expectKey = false;
      for (let i = 0; i < text.length; i++) {
        const c = text[i];
        if (c === '"') {
          let end = i + 1;
          while (end < text.length && text[end] !== '"') end += text[end] === '\\' ? 2 : 1;
          const keys = open.at(-1);
          if (keys && expectKey) {
            const key = text.slice(i + 1, end);
            if (keys.has(key)) repeated.push(key);
            keys.add(key);
          }
          expectKey = false;
          i = end;
        } else if (c === '{' || c === '[') {
          open.push(c === '{' ? new Set() : undefined);
          expectKey = c === '{';
        } else if (c === '}' || c === ']') open.pop();
        else if (c === ',') expectKey = open.at(-1) !== undefined;
      }
      return repeated;
    };
    assert.deepEqual(repeatedKeys('{"a":1,"b":{"a":2},"a":3}'), ['a'], 'the scanner finds a repeat, and only in the same object');
    const formats = [
      { type: 'json_object' as const },
      { type: 'json_schema' as const, json_schema: { name: 'map', schema: { type: 'object', additionalProperties: { type: 'integer' } } } },
    ];
    for (const response_format of formats) {
      for (let i = 0; i < 30; i++) {
        const c = await client.chat.completions.create({
          model: STORIES,
          messages: [{ role: 'user', content: 'x' }],
          temperature: 1,
          max_tokens: 200,
          response_format,
        });
        const text = c.choices[0]!.message.content!;
        assert.deepEqual(repeatedKeys(text), [], text);
      }
    }
    // Keys from propertyNames or patternProperties, where the grammar used to force one key again
    // and again (`{"only":1,"only":2}`); and minProperties met through patternProperties.
    const keyed = [
      { type: 'object', propertyNames: { const: 'only' }, additionalProperties: { type: 'integer' } },
      { type: 'object', propertyNames: { enum: ['x', 'y', 'z'] }, additionalProperties: { type: 'integer' }, minProperties: 2 },
      { type: 'object', patternProperties: { '^k[0-9]$': { type: 'integer' } }, additionalProperties: false, minProperties: 2 },
      { type: 'object', patternProperties: { '^k': { type: 'integer' } }, additionalProperties: false, minProperties: 2 },
      {
        type: 'object',
        properties: { a: { type: 'integer' } },
        patternProperties: { '^x[0-9]$': { type: 'integer' } },
        additionalProperties: false,
        minProperties: 3,
      },
    ];
    for (const schema of keyed) {
      const check = new Ajv({ strict: false }).compile(schema);
      for (const text of await documents(schema, 6, 200)) {
        assert.deepEqual(repeatedKeys(text), [], text);
        assert.ok(check(JSON.parse(text)), `${text}: ${JSON.stringify(check.errors)}`);
      }
    }
  });

  it('a pattern of one repeated character with length bounds: the bounds go into the repetition, every string valid', async () => {
    // zod's z.string().regex(/^[a-z]*$/).min(4).max(4): 0 of 20 valid before, the lengths left to the check.
    const before = await resampled();
    for (const [pattern, minLength, maxLength] of [
      ['^[a-z]*$', 4, 4],
      ['^[0-9]+$', 3, 6],
    ] as const) {
      const schema = {
        type: 'object',
        properties: { s: { type: 'string', pattern, minLength, maxLength } },
        required: ['s'],
        additionalProperties: false,
      };
      for (const text of await documents(schema, 5)) {
        const s = (JSON.parse(text) as { s: string }).s;
        assert.ok(new RegExp(pattern).test(s) && s.length >= minLength && s.length <= maxLength, JSON.stringify(s));
      }
    }
    assert.equal(await resampled(), before, 'exact: nothing sampled again');
  });

  it("lookaround, \\b and Unicode properties (zod's z.emoji(), a password rule, a length lookahead): every document valid, nothing sampled again", async () => {
    // These were left to the check: an unconstrained string, and a 500 after four samples for the
    // emoji and the password (stories260K writes neither a pictograph nor a digit of its own).
    const before = await resampled();
    const Account = z.object({
      badge: z.emoji(),
      password: z.string().regex(/^(?=.*[A-Z])(?=.*\d).{8,}$/),
      handle: z.string().regex(/^(?=.{3,12}$)(?!admin$)[a-z]+(?:-[a-z]+)*$/),
      word: z.string().regex(/\bcat\b/),
      name: z.string().regex(/^\p{Lu}\p{Ll}+$/u),
    });
    await parsedValid(Account, 'account', 8, addFormats(new Ajv({ strict: false })));
    // Several patterns (zod writes `.endsWith()` and `.startsWith()` beside a format's pattern as an
    // allOf of the two; the second was left to the check and failed every sample), and a pattern
    // open at its end with a minLength ("sk-" on every try, the lengths left to the check).
    const Signup = z.object({
      mail: z.email().endsWith('@example.com'),
      day: z.iso.date().startsWith('2024-'),
      key: z.string().startsWith('sk-').min(10),
      tag: z
        .string()
        .regex(/^[a-z]+$/)
        .regex(/x/),
    });
    const signupSchema = z.toJSONSchema(Signup);
    const checkSignup = addFormats(new Ajv2020({ strict: false })).compile(signupSchema);
    for (const text of await documents(signupSchema, 6)) {
      const signup = JSON.parse(text) as unknown;
      assert.ok(Signup.safeParse(signup).success, text);
      assert.ok(checkSignup(signup), `${text}: ${JSON.stringify(checkSignup.errors)}`);
    }
    // The web's common password rule (four lookaheads over `.{8,64}`: past the automaton's state limit,
    // so the pattern was checked, and failed every sample), and a pattern whose letters run open
    // before a `/` (the model wrote letters to the end of its context).
    const Login = z.object({
      password: z
        .string()
        .min(8)
        .max(64)
        .regex(/^(?=.*[A-Z])(?=.*[a-z])(?=.*\d)(?=.*[^A-Za-z0-9]).{8,64}$/),
      timezone: z.string().regex(/^[A-Za-z]+\/[A-Za-z_]+$/),
    });
    await parsedValid(Login, 'login', 6, new Ajv({ strict: false }));
    // A pattern for part of the string beside a format, as schemas are written by hand: the format's
    // grammar with the pattern checked failed every sample for the email.
    const contact = {
      type: 'object',
      properties: {
        mail: { type: 'string', format: 'email', pattern: '@example\\.com$' },
        site: { type: 'string', format: 'uri', pattern: '^https://' },
        since: { type: 'string', format: 'date', pattern: '^2024-' },
      },
      required: ['mail', 'site', 'since'],
      additionalProperties: false,
    };
    const checkContact = addFormats(new Ajv({ strict: false })).compile(contact);
    for (const text of await documents(contact, 6))
      assert.ok(checkContact(JSON.parse(text)), `${text}: ${JSON.stringify(checkContact.errors)}`);
    assert.equal(await resampled(), before, 'exact: nothing sampled again');
    // A lookahead no string can meet (a digit among letters only), anchored: refused, not sampled.
    const res = await http(server.url, 'POST', '/v1/chat/completions', {
      key: server.adminKey,
      body: {
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        response_format: {
          type: 'json_schema',
          json_schema: {
            name: 'x',
            schema: { type: 'object', properties: { s: { type: 'string', pattern: '^(?=.*\\d)[a-z]+$' } }, required: ['s'] },
          },
        },
      },
    });
    assert.equal(res.status, 400, JSON.stringify(res.json));
    assert.equal(res.json.error.code, 'invalid_value');
    assert.match(res.json.error.message, /pattern at '\/properties\/s' matches no string/);
  });

  it('keywords beside a $ref apply in draft-07, as the validator applies them: every document valid, nothing sampled again', async () => {
    // JSON Schema Store's github-funding.json: a nullable string by reference, with a pattern or a
    // minLength beside it. The grammar ignored them (as drafts before 2019-09 say) and Ajv did not.
    const schema = {
      $schema: 'http://json-schema.org/draft-07/schema#',
      definitions: { nullable_string: { type: ['string', 'null'] } },
      type: 'object',
      properties: {
        tidelift: { $ref: '#/definitions/nullable_string', pattern: '^(npm|pypi)/.+$' },
        ko_fi: { $ref: '#/definitions/nullable_string', minLength: 3 },
      },
      required: ['tidelift', 'ko_fi'],
      additionalProperties: false,
    };
    await exactDocuments(schema, 10);
  });

  it('patterns are read with the flag the validator compiled them with, and a control token is its text under a grammar', async () => {
    // Ajv drops the `u` flag for every pattern of a schema where one needs it dropped (`\-`): the
    // grammar read `\p{Lu}` as a letter class where Ajv read a `p` and braces, and every document
    // failed the check ("despite the grammar (bug)"). And stories260K's `<s>` token is "<s>" to the
    // grammar, but was decoded without special tokens: `const: "<s>"` came back as "".
    const schema = {
      type: 'object',
      properties: {
        a: { type: 'string', pattern: '^\\p{Lu}{2}$' },
        b: { type: 'string', pattern: '^a\\-b$' },
        c: { const: '<s>' },
        d: { type: 'string', pattern: '^(?=.*<)[<s>]{3}$' },
      },
      required: ['a', 'b', 'c', 'd'],
      additionalProperties: false,
    };
    // Compiled as the server does: with `u`, and without once a pattern refuses it.
    await exactDocuments(schema, 6, new Ajv({ strict: false, unicodeRegExp: false }));
  });

  it('an enum beside a pattern or lengths offers only the values they allow; none is a 400', async () => {
    const schema = {
      type: 'object',
      properties: { v: { enum: ['alpha', 'beta', 'gamma'], pattern: '^(?!b)' }, w: { enum: ['a', 'bb', 'ccc'], minLength: 3 } },
      required: ['v', 'w'],
      additionalProperties: false,
    };
    await exactDocuments(schema, 6);
    const res = await http(server.url, 'POST', '/v1/chat/completions', {
      key: server.adminKey,
      body: {
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { const: 'beta', pattern: '^(?!b)' } } },
      },
    });
    assert.equal(res.status, 400, JSON.stringify(res.json));
    assert.equal(res.json.error.code, 'invalid_value');
  });

  it("a format named like an object's built-in property (constructor, toString) is an unknown format, an annotation", async () => {
    // The format tables were read as plain objects: `format: "constructor"` wrote Object's source
    // into the grammar (a 400 unsupported_schema for a valid schema), and on a number it was a 500.
    const schema = {
      type: 'object',
      properties: {
        a: { type: 'string', format: 'constructor' },
        b: { type: 'integer', format: 'toString' },
        c: { type: 'string', format: '__proto__' },
      },
      required: ['a', 'b', 'c'],
      additionalProperties: false,
    };
    const check = new Ajv({ strict: false }).compile(schema);
    for (const text of await documents(schema, 3)) assert.ok(check(JSON.parse(text)), text);
  });

  it('refuses a schema that accepts no value (400 invalid_value) and one with an unresolvable reference', async () => {
    const res = await http(server.url, 'POST', '/v1/responses', {
      key: server.adminKey,
      body: {
        model: STORIES,
        input: 'x',
        text: {
          format: {
            type: 'json_schema',
            name: 'x',
            schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['b'], additionalProperties: false },
          },
        },
      },
    });
    assert.equal(res.status, 400);
    assert.equal(res.json.error.code, 'invalid_value');
    assert.match(res.json.error.message, /accepts no value/);
    // More unique items than the items have values (it was sampled four times, then a 500), and
    // more properties than an object may have.
    const noValue: Array<[object, RegExp]> = [
      ...[{ type: 'boolean' }, { enum: ['a', 'b'] }, { const: 1 }].map((items): [object, RegExp] => [
        { type: 'array', minItems: 3, uniqueItems: true, items },
        /accepts no value.*uniqueItems/,
      ]),
      [
        { type: 'object', properties: { a: {} }, additionalProperties: false, minProperties: 2 },
        /accepts no value.*1 property at most but needs 2/,
      ],
    ];
    for (const [schema, message] of noValue) {
      const unique = await http(server.url, 'POST', '/v1/chat/completions', {
        key: server.adminKey,
        body: {
          model: STORIES,
          messages: [{ role: 'user', content: 'x' }],
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
        },
      });
      assert.equal(unique.status, 400, JSON.stringify(schema));
      assert.match(unique.json.error.message, message);
    }
    await assert.rejects(
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: 'https://example.com/elsewhere.json' } } },
      }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.code === 'invalid_value',
    );
  });

  it('refuses a tool whose parameters are not an object schema (400 invalid_function_parameters), and takes one without a type', async () => {
    // A call's arguments are a JSON object: the SDKs parse them into one, and Anthropic's tool_use.input must be one.
    await assert.rejects(
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        tool_choice: 'required',
        tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'string' } } }],
      }),
      (e: unknown) =>
        e instanceof OpenAI.BadRequestError &&
        e.code === 'invalid_function_parameters' &&
        e.param === 'tools[0].function.parameters' &&
        /type: "object"/.test(e.message),
    );
    await assert.rejects(
      client.responses.create({
        model: STORIES,
        input: 'x',
        tool_choice: 'required',
        tools: [
          { type: 'function', name: 'ok', parameters: { type: 'object', properties: {} }, strict: false },
          { type: 'function', name: 'n', parameters: { type: 'integer' }, strict: false },
        ],
      }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.code === 'invalid_function_parameters' && e.param === 'tools[1].parameters',
    );
    // Two tools of one name: a call to it would be ambiguous.
    await assert.rejects(
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        tools: [
          { type: 'function', function: { name: 'f', parameters: { type: 'object' } } },
          { type: 'function', function: { name: 'f', parameters: { type: 'object' } } },
        ],
      }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && e.param === 'tools[1].function.name' && /must be unique/.test(e.message),
    );
    // No type at all (only properties, or nothing): an object's schema, as the clients that send it mean.
    for (const parameters of [{}, { properties: { city: { type: 'string', maxLength: 10 } } }]) {
      const r = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'x' }],
        tool_choice: 'required',
        max_tokens: 60,
        tools: [{ type: 'function', function: { name: 'f', parameters } }],
      });
      const call = r.choices[0]!.message.tool_calls?.[0];
      assert.ok(call?.type === 'function', JSON.stringify(r.choices[0]));
      const args: unknown = JSON.parse(call.function.arguments);
      assert.ok(typeof args === 'object' && args !== null && !Array.isArray(args), call.function.arguments);
    }
  });

  it('structured output through the Responses API (text.format)', async () => {
    const r = await client.responses.create({
      model: STORIES,
      input: 'Describe a person.',
      text: { format: { type: 'json_schema', name: 'person', schema: personSchema, strict: true } },
    });
    assert.equal(r.status, 'completed');
    assert.ok(validPerson(JSON.parse(r.output_text)));
  });
});

describe('Responses function calls, local and through chat-only and Responses-speaking upstreams', () => {
  let a: TestServer;
  let b: TestServer;
  let c: TestServer;
  let proxy: Server;
  const proxied: string[] = [];
  before(async () => {
    a = await startServer();
    // Records which API the downstream instance calls, and forwards to the real upstream instance.
    proxy = createServer((req, res) => {
      proxied.push(`${req.method} ${req.url}`);
      void request(`${a.url}${req.url}`, { method: req.method as 'POST', headers: req.headers, body: req }).then(
        (up) => {
          res.writeHead(up.statusCode, up.headers as Record<string, string>);
          up.body.pipe(res);
        },
        () => res.destroy(),
      );
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', () => r()));
    const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/v1`;
    const upstreamKey = (await createKey(a, 'downstream')).key;
    // The same remote model, served through a chat-only upstream (b) or a Responses-speaking one (c).
    const remote = (baseUrl: string, api: 'chat' | 'responses') =>
      startServer({
        modelsDir: tempDir(),
        env: { UPSTREAM_KEY: upstreamKey },
        configFile: {
          name: `${api}.json`,
          text: JSON.stringify({
            defaultCatalogue: false,
            models: [
              {
                id: 'meta-llama/stories-remote',
                context_length: 512,
                capabilities: ['streaming', 'function_calling', 'structured_output'],
              },
            ],
            deployments: [{ model: 'meta-llama/stories-remote', baseUrl, apiKeyEnv: 'UPSTREAM_KEY', upstreamModel: STORIES, api }],
          }),
        },
      });
    b = await remote(a.baseURL, 'chat');
    c = await remote(proxyUrl, 'responses');
  });
  after(async () => {
    await c.close();
    await b.close();
    await new Promise((r) => proxy.close(r));
    await a.close();
  });

  const tools: OpenAI.Responses.Tool[] = [
    { type: 'function', name: 'get_weather', description: 'Weather forecast', parameters: weatherParams, strict: true },
  ];

  for (const [label, pick] of [
    ['local engine', () => ({ s: a, model: STORIES })],
    ['chat-only upstream', () => ({ s: b, model: 'meta-llama/stories-remote' })],
    ['Responses-speaking upstream', () => ({ s: c, model: 'meta-llama/stories-remote' })],
  ] as const) {
    it(`function_call, then function_call_output, then the answer (${label})`, async () => {
      const { s, model } = pick();
      const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 });
      const first = await client.responses.create({ model, input: 'What is the weather in Paris?', tools, tool_choice: 'required' });
      assert.equal(first.status, 'completed');
      const call = first.output.find((o) => o.type === 'function_call');
      assert.ok(call && call.type === 'function_call');
      assert.equal(call.name, 'get_weather');
      assert.match(call.call_id, /^call_/);
      assert.ok(validWeather(JSON.parse(call.arguments)), call.arguments);

      const second = await client.responses.create({
        model,
        previous_response_id: first.id,
        tools,
        max_output_tokens: 12,
        input: [{ type: 'function_call_output', call_id: call.call_id, output: JSON.stringify({ forecast: 'sunny' }) }],
      });
      assert.ok(second.output_text.length > 0, 'a text answer follows the tool result');
      assert.ok(second.usage!.input_tokens > first.usage!.input_tokens, 'the call and its output are in the prompt');

      const streamed = await client.responses
        .stream({ model, input: 'Weather?', tools, tool_choice: { type: 'function', name: 'get_weather' } })
        .finalResponse();
      const sc = streamed.output[0]!;
      assert.ok(sc.type === 'function_call' && validWeather(JSON.parse(sc.arguments)));
    });
  }

  it('sends Responses natively to a Responses-speaking upstream, and chat completions translated', async () => {
    proxied.length = 0;
    const client = new OpenAI({ apiKey: c.adminKey, baseURL: c.baseURL, maxRetries: 0 });
    const viaChat = await client.chat.completions.create({
      model: 'meta-llama/stories-remote',
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 10,
      temperature: 0,
    });
    assert.match(viaChat.choices[0]!.message.content ?? '', /little girl/);
    assert.equal(viaChat.usage!.completion_tokens, 10);
    const viaResponses = await client.responses.create({
      model: 'meta-llama/stories-remote',
      input: 'Once upon a time',
      max_output_tokens: 10,
      temperature: 0,
    });
    assert.equal(viaResponses.status, 'incomplete');
    assert.equal(viaResponses.output_text, viaChat.choices[0]!.message.content);
    assert.deepEqual(proxied, ['POST /v1/responses', 'POST /v1/responses']);
  });
});

describe('calls an upstream makes to tools the request does not allow are suppressed', () => {
  // An upstream that ignores tool_choice and calls tool `a` whatever it is told (as some servers
  // do): a failure mode no real engine here produces on demand, hence a fixture.
  const callA = (i: number) => ({ index: i, id: `call_${i}`, type: 'function', function: { name: 'a', arguments: '{"x":1}' } });
  let upstream: { url: string; close(): Promise<void> };
  let gw: TestServer;
  before(async () => {
    upstream = await chatFixture((stream, res) => {
      if (!stream) {
        const message = { role: 'assistant', content: null, tool_calls: [callA(0), callA(1)] };
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(completionJson(message, 'tool_calls', { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(
        chunkFrame({ role: 'assistant', tool_calls: [callA(0)] }) +
          chunkFrame({ tool_calls: [callA(1)] }) +
          chunkFrame({}, 'tool_calls') +
          'data: [DONE]\n\n',
      );
    });
    const url = upstream.url;
    gw = await startGateway(
      [{ baseUrl: url }],
      { SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1' },
      { capabilities: ['streaming', 'function_calling'] },
    );
  });
  after(async () => {
    await gw.close();
    await upstream.close();
  });

  const tools = (...names: string[]) =>
    names.map((name) => ({ type: 'function' as const, function: { name, parameters: { type: 'object' } } }));

  it('on chat completions: none under tool_choice "none" or a named other tool, streamed or not; the allowed ones pass', async () => {
    const client = new OpenAI({ baseURL: gw.baseURL, apiKey: gw.adminKey, maxRetries: 0 });
    for (const tool_choice of ['none', { type: 'function', function: { name: 'b' } }] as const) {
      const r = await client.chat.completions.create({
        model: GATEWAY_MODEL,
        messages: [{ role: 'user', content: 'hi' }],
        tools: tools('a', 'b'),
        tool_choice,
      });
      assert.equal(r.choices[0]?.message.tool_calls, undefined, JSON.stringify(r));
      assert.equal(r.choices[0]?.finish_reason, 'stop');
      const stream = await client.chat.completions.create({
        model: GATEWAY_MODEL,
        messages: [{ role: 'user', content: 'hi' }],
        tools: tools('a', 'b'),
        tool_choice,
        stream: true,
      });
      const finishes: string[] = [];
      for await (const chunk of stream) {
        assert.equal(chunk.choices[0]?.delta.tool_calls, undefined, JSON.stringify(chunk));
        if (chunk.choices[0]?.finish_reason) finishes.push(chunk.choices[0].finish_reason);
      }
      assert.deepEqual(finishes, ['stop']);
    }
    // Without tools the upstream's calls go nowhere either; with `a` offered they are the answer.
    const none = await client.chat.completions.create({
      model: GATEWAY_MODEL,
      messages: [{ role: 'user', content: 'hi' }],
      tool_choice: 'none',
      tools: tools('b'),
    });
    assert.equal(none.choices[0]?.message.tool_calls, undefined);
    const allowed = await client.chat.completions.create({
      model: GATEWAY_MODEL,
      messages: [{ role: 'user', content: 'hi' }],
      tools: tools('a', 'b'),
    });
    assert.deepEqual(
      allowed.choices[0]?.message.tool_calls?.map((c) => c.type === 'function' && c.function.name),
      ['a', 'a'],
    );
    assert.equal(allowed.choices[0]?.finish_reason, 'tool_calls');
  });

  it('on Responses: allowed_tools, tool_choice "none" and no tools at all leave no call to `a` in the output', async () => {
    const client = new OpenAI({ baseURL: gw.baseURL, apiKey: gw.adminKey, maxRetries: 0 });
    const fn = (name: string) => ({ type: 'function' as const, name, parameters: { type: 'object' }, strict: false });
    const cases = [
      {
        tools: [fn('a'), fn('b')],
        tool_choice: { type: 'allowed_tools' as const, mode: 'auto' as const, tools: [{ type: 'function', name: 'b' }] },
      },
      { tools: [fn('a')], tool_choice: 'none' as const },
      {},
    ];
    for (const c of cases) {
      const r = await client.responses.create({ model: GATEWAY_MODEL, input: 'hi', ...c });
      assert.equal(r.status, 'completed', JSON.stringify(r));
      assert.deepEqual(
        r.output.filter((i) => i.type === 'function_call'),
        [],
        JSON.stringify(c),
      );
    }
    const allowed = await client.responses.create({ model: GATEWAY_MODEL, input: 'hi', tools: [fn('a')] });
    assert.deepEqual(
      allowed.output.filter((i) => i.type === 'function_call').map((i) => i.type === 'function_call' && i.name),
      ['a', 'a'],
    );
  });
});

describe('parallel calls from an upstream whose deltas interleave, or name no index', () => {
  // Legal chat-completions streams that no engine here produces on demand, hence a fixture: the
  // deltas of two calls interleaved by `index`, and the same calls with no `index` at all (each
  // call's first delta brings its id).
  const call = (index: number | undefined, fields: object) => ({ ...(index !== undefined && { index }), ...fields });
  const frames = (indexed: boolean, finish: string) => {
    const i = (n: number) => (indexed ? n : undefined);
    const a = (args: string, start = false) =>
      call(
        i(0),
        start ? { id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: args } } : { function: { arguments: args } },
      );
    const b = (args: string, start = false) =>
      call(
        i(1),
        // An id as Kimi's servers write them, which Anthropic's pattern for tool_use ids refuses.
        start
          ? { id: 'functions.get_time:1', type: 'function', function: { name: 'get_time', arguments: args } }
          : { function: { arguments: args } },
      );
    const order = indexed
      ? [a('', true), a('{"ci'), b('{"tz":', true), a('ty":"Par'), a('is"}'), b('"UTC"}')]
      : [a('', true), a('{"ci'), a('ty":"Par'), a('is"}'), b('{"tz":', true), b('"UTC"}')];
    return (
      chunkFrame({ role: 'assistant', content: null }) +
      order.map((c) => chunkFrame({ tool_calls: [c] })).join('') +
      chunkFrame({}, finish) +
      `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 9, completion_tokens: 12, total_tokens: 21 } })}\n\n` +
      'data: [DONE]\n\n'
    );
  };
  let upstream: { url: string; close(): Promise<void> };
  let gw: TestServer;
  before(async () => {
    upstream = await fixture((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        res
          .writeHead(200, { 'content-type': 'text/event-stream' })
          .end(frames(!body.includes('unindexed'), body.includes('finish-stop') ? 'stop' : 'tool_calls'));
      });
    });
    gw = await startGateway(
      [{ baseUrl: upstream.url }],
      { SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1' },
      { capabilities: ['streaming', 'function_calling'] },
    );
  });
  after(async () => {
    await gw.close();
    await upstream.close();
  });
  const expected = [
    ['get_weather', { city: 'Paris' }],
    ['get_time', { tz: 'UTC' }],
  ];

  it('on Messages and Responses, streamed: each call gets its own arguments, whole', async () => {
    const anthropic = new Anthropic({ apiKey: gw.adminKey, baseURL: gw.url, maxRetries: 0 });
    const openai = new OpenAI({ baseURL: gw.baseURL, apiKey: gw.adminKey, maxRetries: 0 });
    // `finish-stop`: a server that finishes a turn of tool calls with `stop` (it is still one for tool_use).
    for (const mode of ['interleaved', 'unindexed', 'interleaved finish-stop']) {
      const message = await anthropic.messages
        .stream({
          model: GATEWAY_MODEL,
          max_tokens: 100,
          messages: [{ role: 'user', content: mode }],
          tools: [
            { name: 'get_weather', input_schema: { type: 'object' } },
            { name: 'get_time', input_schema: { type: 'object' } },
          ],
        })
        .finalMessage();
      assert.deepEqual(
        message.content.map((b) => (b.type === 'tool_use' ? [b.name, b.input] : b.type)),
        expected,
        `${mode}: ${JSON.stringify(message.content)}`,
      );
      assert.equal(message.stop_reason, 'tool_use');
      // Ids as Anthropic writes them (a client may send the conversation on to Anthropic), and
      // stop_details as a non-stream message has it (the SDK's helper copies it from message_delta).
      const ids = message.content.map((b) => (b.type === 'tool_use' ? b.id : ''));
      assert.deepEqual(ids, ['call_a', 'functions_get_time_1']);
      assert.equal(message.stop_details, null);
      const response = await openai.responses
        .stream({
          model: GATEWAY_MODEL,
          input: mode,
          tools: ['get_weather', 'get_time'].map((name) => ({
            type: 'function' as const,
            name,
            parameters: { type: 'object' },
            strict: false,
          })),
        })
        .finalResponse();
      assert.deepEqual(
        response.output
          .filter((i) => i.type === 'function_call')
          .map((i) => i.type === 'function_call' && [i.name, JSON.parse(i.arguments)]),
        expected,
        `${mode}: ${JSON.stringify(response.output)}`,
      );
      // Chat completions pass the upstream's frames on; the SDK puts them together by index.
      const chat = await openai.chat.completions
        .stream({
          model: GATEWAY_MODEL,
          messages: [{ role: 'user', content: mode }],
          tools: ['get_weather', 'get_time'].map((name) => ({
            type: 'function' as const,
            function: { name, parameters: { type: 'object' } },
          })),
        })
        .finalChatCompletion();
      if (mode !== 'unindexed')
        assert.deepEqual(
          chat.choices[0]!.message.tool_calls!.map((c) => c.type === 'function' && [c.function.name, JSON.parse(c.function.arguments)]),
          expected,
        );
    }
  });
});
