import { newId as makeId } from '../core/ids.js';
import type { ServerResponse } from 'node:http';
import Type, { type Static } from 'typebox';
import type { App, RouteContext } from '../http/server.js';
import { ApiError } from '../http/errors.js';
import type { ContentPart, FinishReason, GenerationRequest, Message, ResponseFormat, ToolChoice, Usage } from '../core/canonical.js';
import type { Model } from '../core/model-spec.js';
import { MaxOutputTokens, ModelField, NullableBoolean, Penalty, Seed, Stop, Temperature, TopP, nullable } from './limits.js';
import { drained, writeSse, openSse } from './sse.js';
import { MeteredStream } from '../core/metering.js';

const Part = Type.Object({ type: Type.String() });
const WireToolCall = Type.Object({
  id: Type.String(),
  type: Type.Optional(Type.String()),
  function: Type.Object({ name: Type.String(), arguments: Type.String() }),
});
const ChatMessage = Type.Object({
  role: Type.Enum(['system', 'developer', 'user', 'assistant', 'tool']),
  content: Type.Optional(Type.Union([Type.String(), Type.Array(Part), Type.Null()])),
  name: Type.Optional(Type.String()),
  tool_calls: nullable(Type.Array(WireToolCall)),
  tool_call_id: Type.Optional(Type.String()),
});
const FunctionDef = Type.Object({
  name: Type.String({ pattern: '^[a-zA-Z0-9_.-]{1,64}$' }),
  description: Type.Optional(Type.String()),
  parameters: Type.Optional(Type.Object({})),
  strict: NullableBoolean,
});

/** Chat completions request (wire doc); unknown fields are accepted and ignored. */
export const ChatRequest = Type.Object({
  model: ModelField,
  messages: Type.Array(ChatMessage, { minItems: 1 }),
  temperature: Temperature,
  top_p: TopP,
  max_tokens: MaxOutputTokens,
  max_completion_tokens: MaxOutputTokens,
  n: nullable(Type.Integer({ minimum: 1, maximum: 128 })),
  stop: Stop,
  seed: Seed,
  presence_penalty: Penalty,
  frequency_penalty: Penalty,
  stream: NullableBoolean,
  stream_options: nullable(Type.Object({ include_usage: Type.Optional(Type.Boolean()) })),
  tools: nullable(Type.Array(Type.Object({ type: Type.Literal('function'), function: FunctionDef }))),
  tool_choice: nullable(Type.Union([
    Type.Enum(['none', 'auto', 'required']),
    Type.Object({ type: Type.Literal('function'), function: Type.Object({ name: Type.String() }) }),
  ])),
  parallel_tool_calls: NullableBoolean,
  response_format: nullable(Type.Union([
    Type.Object({ type: Type.Enum(['text', 'json_object']) }),
    Type.Object({
      type: Type.Literal('json_schema'),
      json_schema: Type.Object({ name: Type.String(), schema: Type.Optional(Type.Object({})), strict: NullableBoolean }),
    }),
  ])),
  reasoning_effort: nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high'])),
});
type ChatRequest = Static<typeof ChatRequest>;

function toParts(parts: ReadonlyArray<{ type: string } & Record<string, unknown>>, where: string, model: Model): ContentPart[] {
  return parts.map((p, j) => {
    if (p.type === 'text' && typeof p['text'] === 'string') return { type: 'text', text: p['text'] };
    if (p.type === 'image_url') {
      const img = p['image_url'] as { url?: unknown; detail?: unknown } | undefined;
      if (typeof img?.url !== 'string') throw new ApiError('invalid_value', `${where}[${j}].image_url.url must be a string.`, { param: `${where}[${j}].image_url` });
      if (!model.capabilities.includes('vision')) {
        throw new ApiError('unsupported_content', `The model '${model.id}' does not accept images (it lacks the vision capability).`, { param: `${where}[${j}]` });
      }
      return { type: 'image', url: img.url, ...(typeof img.detail === 'string' && { detail: img.detail }) };
    }
    throw new ApiError('unsupported_content', `Content part type '${p.type}' is not supported here.`, { param: `${where}[${j}].type` });
  });
}

export function toMessages(body: ChatRequest, model: Model): Message[] {
  return body.messages.map((m, i) => {
    const content = m.content === undefined || m.content === null ? null
      : typeof m.content === 'string' ? m.content
        : toParts(m.content as ReadonlyArray<{ type: string } & Record<string, unknown>>, `messages[${i}].content`, model);
    if (content === null && m.role !== 'assistant') {
      throw new ApiError('invalid_value', `messages[${i}].content is required for role '${m.role}'.`, { param: `messages[${i}].content` });
    }
    const out: Message = { role: m.role, content };
    if (m.name !== undefined) out.name = m.name;
    if (m.tool_call_id !== undefined) out.toolCallId = m.tool_call_id;
    if (m.tool_calls) out.toolCalls = m.tool_calls.map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
    return out;
  });
}

export function toGenerationRequest(body: ChatRequest, model: Model, signal: AbortSignal): GenerationRequest {
  if (body.n != null && body.n > 1) {
    throw new ApiError('unsupported_parameter', 'Only n=1 is supported; send several requests for several choices.', { param: 'n' });
  }
  const req: GenerationRequest = { model: model.id, messages: toMessages(body, model), sampling: {}, stream: body.stream === true, signal };
  const s = req.sampling;
  if (body.temperature != null) s.temperature = body.temperature;
  if (body.top_p != null) s.topP = body.top_p;
  if (body.seed != null) s.seed = body.seed;
  if (body.presence_penalty != null) s.presencePenalty = body.presence_penalty;
  if (body.frequency_penalty != null) s.frequencyPenalty = body.frequency_penalty;
  if (body.stop != null) s.stop = (typeof body.stop === 'string' ? [body.stop] : body.stop).filter((x) => x !== '');
  const max = body.max_completion_tokens ?? body.max_tokens;
  if (max != null) req.maxOutputTokens = max;
  if (body.tools?.length) {
    req.tools = body.tools.map((t) => ({
      name: t.function.name,
      ...(t.function.description !== undefined && { description: t.function.description }),
      ...(t.function.parameters !== undefined && { parameters: t.function.parameters as Record<string, unknown> }),
      ...(t.function.strict != null && { strict: t.function.strict }),
    }));
    if (body.tool_choice != null) {
      req.toolChoice = typeof body.tool_choice === 'string' ? body.tool_choice : { name: body.tool_choice.function.name } satisfies ToolChoice;
    }
    if (body.parallel_tool_calls != null) req.parallelToolCalls = body.parallel_tool_calls;
  }
  const rf = body.response_format;
  if (rf != null) {
    req.responseFormat = rf.type === 'json_schema'
      ? { type: 'json_schema', name: rf.json_schema.name, schema: (rf.json_schema.schema ?? {}) as Record<string, unknown>, ...(rf.json_schema.strict != null && { strict: rf.json_schema.strict }) }
      : { type: rf.type } as ResponseFormat;
  }
  if (body.reasoning_effort != null) req.reasoningEffort = body.reasoning_effort;
  return req;
}

export function renderUsage(u: Usage): Record<string, unknown> {
  const out: Record<string, unknown> = {
    prompt_tokens: u.input,
    completion_tokens: u.output,
    total_tokens: u.input + u.output,
    prompt_tokens_details: { cached_tokens: u.cached },
    completion_tokens_details: { reasoning_tokens: u.reasoning },
  };
  // An extension field standard clients ignore: US dollars, null when the model has no price.
  if (u.cost !== undefined) out['cost'] = u.cost;
  return out;
}

const newId = (): string => makeId('chatcmpl', '-');

/** Folds the event stream into one chat.completion object. */
async function completion(events: MeteredStream, model: Model): Promise<Record<string, unknown>> {
  let text = '';
  let reasoning = '';
  const calls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }> = [];
  let usage: Usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
  let finish: FinishReason = 'stop';
  for (let ev = await events.next(); ev; ev = await events.next()) {
    switch (ev.type) {
      case 'text.delta': text += ev.text; break;
      case 'reasoning.delta': reasoning += ev.text; break;
      case 'tool_call.start': calls[ev.index] = { id: ev.id, type: 'function', function: { name: ev.name, arguments: '' } }; break;
      case 'tool_call.delta': { const c = calls[ev.index]; if (c) c.function.arguments += ev.arguments; break; }
      case 'usage': usage = ev.usage; break;
      case 'finish': finish = ev.reason; break;
    }
  }
  const message: Record<string, unknown> = { role: 'assistant', content: calls.length && !text ? null : text, refusal: null };
  if (reasoning) message['reasoning_content'] = reasoning;
  if (calls.length) message['tool_calls'] = calls.filter(Boolean);
  return {
    id: newId(),
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: model.id,
    choices: [{ index: 0, message, logprobs: null, finish_reason: finish }],
    usage: renderUsage(usage),
  };
}

/** Renders the event stream as chat.completion.chunk SSE, exactly as the wire doc describes. */
async function streamChunks(raw: ServerResponse, events: MeteredStream, model: Model, includeUsage: boolean): Promise<void> {
  const head = `{"id":"${newId()}","object":"chat.completion.chunk","created":${Math.floor(Date.now() / 1000)},"model":${JSON.stringify(model.id)},"choices":[`;
  const tail = includeUsage ? '],"usage":null}' : ']}';
  const choice = (delta: string, finish: string | null = null) =>
    `${head}{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finish === null ? 'null' : `"${finish}"`}}${tail}`;
  let usage: Usage | undefined;
  writeSse(raw, choice('{"role":"assistant","content":""}'));
  for (let ev = await events.next(); ev; ev = await events.next()) {
    let line: string | undefined;
    switch (ev.type) {
      case 'text.delta': line = choice(`{"content":${JSON.stringify(ev.text)}}`); break;
      case 'reasoning.delta': line = choice(`{"reasoning_content":${JSON.stringify(ev.text)}}`); break;
      case 'tool_call.start':
        line = choice(`{"tool_calls":[{"index":${ev.index},"id":${JSON.stringify(ev.id)},"type":"function","function":{"name":${JSON.stringify(ev.name)},"arguments":""}}]}`);
        break;
      case 'tool_call.delta': line = choice(`{"tool_calls":[{"index":${ev.index},"function":{"arguments":${JSON.stringify(ev.arguments)}}}]}`); break;
      case 'usage': usage = ev.usage; break;
      case 'finish': line = choice('{}', ev.reason === 'error' ? 'stop' : ev.reason); break;
    }
    if (line !== undefined && !writeSse(raw, line)) await drained(raw);
    if (raw.destroyed) return;
  }
  // The stream is complete for the client only with [DONE]: its usage record is stored first.
  await events.persisted();
  if (includeUsage && usage) writeSse(raw, `${head}],"usage":${JSON.stringify(renderUsage(usage))}}`);
  writeSse(raw, '[DONE]');
}

export function registerChatRoutes(app: App, ctx: RouteContext): void {
  app.post('/v1/chat/completions', { onRequest: ctx.requireKey, schema: { body: ChatRequest } }, async (req, reply) => {
    const body = req.body;
    const model = ctx.router.resolve(body.model, req.principal!);
    const abort = new AbortController();
    // The client went away before the reply was complete: stop generating and free the slot.
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) abort.abort();
    });
    const canonical = toGenerationRequest(body, model, abort.signal);
    ctx.router.requireCapabilities(model, canonical);
    req.modelId = model.id;
    const admission = await ctx.limiter.admit(req.principal!, model.id);
    reply.headers(admission.headers);
    // Errors before the first event (overflow, overload, upstream down) still get a real status.
    const events = await MeteredStream.open(ctx.router, canonical, {
      model, who: req.principal!, endpoint: 'chat.completions', requestId: req.id, stream: body.stream === true, started: req.startedAt, trace: {},
      settle: admission.settle,
    }, ctx.ledger, ctx.metrics);

    if (body.stream !== true) {
      try {
        const answer = await completion(events, model);
        await events.persisted();
        return answer;
      } finally {
        await events.close();
      }
    }

    openSse(reply);
    try {
      await streamChunks(reply.raw, events, model, body.stream_options?.include_usage === true);
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError('internal_error', 'The stream failed.');
      if (!(err instanceof ApiError)) req.log.error({ err }, 'stream failed');
      // Mid-stream errors: the SDK throws on a data line that carries `error`.
      writeSse(reply.raw, JSON.stringify(e.toBody()));
    } finally {
      await events.close();
      reply.raw.end();
    }
    return reply;
  });
}
