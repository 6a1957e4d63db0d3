import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';
import { PACKAGE_ROOT } from '../src/config.js';
import { closers, fixture } from './helpers/fixtures.js';
import { createKey, http, startServer, tempDir, type TestServer } from './helpers/server.js';

/**
 * The Vercel AI SDK's `openai.responses()` multi-step tool loop against a reasoning model behind
 * Switchyard: with the default `store: true`, step two sends the first step's reasoning, message and
 * function call back as `item_reference`s (no previous_response_id), which must resolve. The
 * upstream speaks the Responses API from the recorded streams (test/fixtures/upstream): reasoning, a
 * commentary message and a get_weather call; then, once it is given the tool's output, reasoning and
 * a final answer labelled `final_answer`.
 */

const DIR = join(PACKAGE_ROOT, 'test', 'fixtures', 'upstream');
const MODEL = 'openai/reasoner';

describe('Vercel AI SDK: the multi-step tool loop through a reasoning upstream', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  const upstreamInputs: unknown[][] = [];
  before(async () => {
    const upstream = c.keep(
      await fixture((req, res) => {
        let body = '';
        req.on('data', (d: Buffer) => {
          body += d.toString();
        });
        req.on('end', () => {
          const input = (JSON.parse(body) as { input: Array<{ type?: string }> }).input;
          upstreamInputs.push(input);
          const answered = input.some((i) => i.type === 'function_call_output');
          const file = answered ? 'openai-responses-final.sse' : 'openai-responses-tools.sse';
          res.writeHead(200, { 'content-type': 'text/event-stream' }).end(readFileSync(join(DIR, file)));
        });
      }),
    );
    server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        configFile: {
          name: 'reasoner.json',
          text: JSON.stringify({
            defaultCatalogue: false,
            models: [{ id: MODEL, context_length: 32768, capabilities: ['streaming', 'function_calling', 'reasoning'] }],
            deployments: [{ id: 'r', model: MODEL, baseUrl: upstream.url, api: 'responses' }],
          }),
        },
      }),
    );
    key = (await createKey(server, 'ai-sdk')).key;
  });
  after(() => c.closeAll());

  const weather = tool({
    description: 'The weather in a city',
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => ({ city, sky: 'sunny' }),
  });

  for (const mode of ['generateText', 'streamText'] as const) {
    it(`${mode}: calls the tool, sends its result back with item references, and ends with the answer`, async () => {
      upstreamInputs.length = 0;
      // What the SDK sends the gateway, to see the references it makes.
      const sentToGateway: string[] = [];
      const openai = createOpenAI({
        apiKey: key,
        baseURL: `${server.url}/v1`,
        fetch: async (url, init) => {
          if (typeof init?.body === 'string') sentToGateway.push(init.body);
          return fetch(url, init);
        },
      });
      const args = {
        model: openai.responses(MODEL),
        prompt: 'What is the weather in Paris?',
        tools: { get_weather: weather },
        stopWhen: stepCountIs(3),
      };
      const result = mode === 'generateText' ? await generateText(args) : streamText(args);
      const [steps, text] = await Promise.all([result.steps, result.text]);

      assert.equal(text, 'It is sunny in Paris.');
      assert.equal(steps.length, 2);
      const [first, second] = steps;
      assert.deepEqual(
        first!.toolCalls.map((t) => [t.toolName, t.input]),
        [['get_weather', { city: 'Paris' }]],
      );
      assert.deepEqual(
        first!.toolResults.map((t) => t.output),
        [{ city: 'Paris', sky: 'sunny' }],
      );
      assert.ok(
        first!.content.some((p) => p.type === 'reasoning'),
        'the reasoning item reached the SDK',
      );
      assert.equal(second!.finishReason, 'stop');

      // Step two referred to the first step's items instead of sending them (store: true, the default)…
      assert.equal(sentToGateway.length, 2);
      const refs = (JSON.parse(sentToGateway[1]!) as { input: Array<{ type?: string; id?: string }> }).input.filter(
        (i) => i.type === 'item_reference',
      );
      assert.ok(
        refs.some((r) => r.id?.startsWith('rs_')),
        `a reference to the reasoning item: ${sentToGateway[1]}`,
      );
      assert.ok(refs.some((r) => r.id?.startsWith('fc_')));
      // …which the gateway resolved: the model read the whole first step, and the tool's result.
      assert.equal(upstreamInputs.length, 2);
      const sent = JSON.stringify(upstreamInputs[1]);
      assert.match(sent, /Checking now\./, "the first step's message");
      assert.match(sent, /"name":"get_weather"/);
      assert.match(sent, /"output":"\{\\"city\\":\\"Paris\\",\\"sky\\":\\"sunny\\"\}"/);

      // Both steps were stored (store: true), the final answer with the phase the model gave it.
      const stored = await http<{ output: Array<{ type: string; phase?: string }> }>(
        server.url,
        'GET',
        `/v1/responses/${second!.response.id}`,
        { key },
      );
      assert.equal(stored.status, 200);
      assert.equal(stored.json.output.find((o) => o.type === 'message')?.phase, 'final_answer');
    });
  }
});

describe('Vercel AI SDK: the chat provider against the real local model', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  before(async () => {
    server = c.keep(await startServer());
    key = (await createKey(server, 'ai-sdk-local')).key;
  });
  after(() => c.closeAll());

  const weather = tool({
    description: 'The weather in a city',
    // A bounded string: the grammar then ends the arguments well within the output limit.
    inputSchema: z.object({ city: z.string().max(12) }),
    execute: async ({ city }) => ({ city, sky: 'sunny' }),
  });

  it('streamText with a forced tool: a tool call and no empty text part (the first chunk opens the call)', async () => {
    const openai = createOpenAI({ apiKey: key, baseURL: `${server.url}/v1` });
    const result = streamText({
      model: openai.chat('local/stories260k'),
      prompt: 'What is the weather in Paris?',
      tools: { get_weather: weather },
      toolChoice: { type: 'tool', toolName: 'get_weather' },
      temperature: 0,
      maxOutputTokens: 60,
    });
    const parts: string[] = [];
    for await (const part of result.fullStream) parts.push(part.type);
    assert.ok(parts.includes('tool-call'), parts.join(','));
    assert.ok(!parts.includes('text-start'), `no text part: ${parts.join(',')}`);
    const [call] = await result.toolCalls;
    assert.equal(call?.toolName, 'get_weather');
    assert.equal(typeof (call?.input as { city?: unknown }).city, 'string');
    assert.equal(await result.finishReason, 'tool-calls');
  });

  it('generateText and generateObject: text with usage, and an object that fits the schema', async () => {
    const openai = createOpenAI({ apiKey: key, baseURL: `${server.url}/v1` });
    const text = await generateText({
      model: openai.chat('local/stories260k'),
      prompt: 'Once upon a time',
      temperature: 0,
      maxOutputTokens: 12,
    });
    assert.ok(text.text.length > 0);
    assert.equal(text.finishReason, 'length');
    assert.equal(text.usage.outputTokens, 12);
    const person = z.object({ name: z.string().max(20), age: z.number().int().min(0).max(120) });
    for (const model of [openai.chat('local/stories260k'), openai.responses('local/stories260k')]) {
      const { object } = await generateObject({ model, schema: person, prompt: 'A person', maxOutputTokens: 200 });
      assert.equal(person.safeParse(object).success, true, JSON.stringify(object));
    }
  });
  it('the Anthropic provider (@ai-sdk/anthropic) on the Messages endpoint: text, a tool loop, an object', async () => {
    const anthropic = createAnthropic({ apiKey: key, baseURL: `${server.url}/v1` });
    const model = anthropic('local/stories260k');
    const text = await generateText({ model, prompt: 'Once upon a time', temperature: 0, maxOutputTokens: 12 });
    assert.ok(text.text.length > 0);
    assert.equal(text.finishReason, 'length');
    assert.equal(text.usage.outputTokens, 12);
    // Two steps: the forced call, its result sent back as a tool_result, then the answer.
    const result = streamText({
      model,
      prompt: 'What is the weather in Paris?',
      tools: { get_weather: weather },
      toolChoice: { type: 'tool', toolName: 'get_weather' },
      temperature: 0,
      maxOutputTokens: 60,
      stopWhen: stepCountIs(2),
      prepareStep: ({ stepNumber }) => (stepNumber === 1 ? { toolChoice: 'none' } : {}),
    });
    for await (const part of result.fullStream) assert.notEqual(part.type, 'error', JSON.stringify(part));
    const steps = await result.steps;
    assert.equal(steps.length, 2);
    assert.equal(steps[0]!.toolCalls[0]?.toolName, 'get_weather');
    assert.equal(steps[0]!.toolResults.length, 1);
    assert.ok(['stop', 'length'].includes(steps[1]!.finishReason), steps[1]!.finishReason);
    // The provider's JSON mode is a forced tool whose input is the object.
    const reading = z.object({ place: z.string().max(12), confidence: z.number().min(0.1).max(0.9) });
    const { object } = await generateObject({ model, schema: reading, prompt: 'A reading', maxOutputTokens: 80 });
    assert.equal(reading.safeParse(object).success, true, JSON.stringify(object));
  });
});
