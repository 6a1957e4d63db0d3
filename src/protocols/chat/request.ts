import Type, { type Static } from 'typebox';
import { ApiError } from '../../core/errors.js';
import { allowTools, refuseChoiceWithoutTools } from '../validation.js';
import type { CancelSignal } from '../../core/cancellation.js';
import {
  newTally,
  type ContentPart,
  type GenerationRequest,
  type Message,
  type ResponseFormat,
  type ToolChoice,
} from '../../core/canonical.js';
import {
  MAX_INPUT_ITEMS,
  MAX_TOOLS,
  MaxOutputTokens,
  Metadata,
  ModelField,
  NullableBoolean,
  Penalty,
  Seed,
  Stop,
  Temperature,
  TopLogprobs,
  TopP,
  nullable,
} from '../fields.js';

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
  messages: Type.Array(ChatMessage, { minItems: 1, maxItems: MAX_INPUT_ITEMS }),
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
  // OpenAI's bound: each tool's schema is compiled to a grammar for the local engine, so a thousand
  // trivial tools were seconds of CPU.
  // A tool of another type (openai v6's `custom` tools) matches the second branch, and decoding
  // refuses it by its type: its missing `function` is not what is wrong with it.
  tools: nullable(
    Type.Array(
      Type.Union([
        Type.Object({ type: Type.Literal('function'), function: FunctionDef }),
        Type.Object({ type: Type.String({ pattern: '^(?!function$)' }) }),
      ]),
      { maxItems: MAX_TOOLS },
    ),
  ),
  tool_choice: nullable(
    Type.Union([
      Type.Enum(['none', 'auto', 'required']),
      Type.Object({ type: Type.Literal('function'), function: Type.Object({ name: Type.String() }) }),
      Type.Object({
        type: Type.Literal('allowed_tools'),
        allowed_tools: Type.Object({
          mode: Type.Enum(['auto', 'required']),
          tools: Type.Array(Type.Object({ type: Type.Literal('function'), function: Type.Object({ name: Type.String() }) }), {
            minItems: 1,
            maxItems: 128,
          }),
        }),
      }),
    ]),
  ),
  parallel_tool_calls: NullableBoolean,
  // A string, as OpenAI's (and passed on to nobody): another type is a client's mistake.
  user: nullable(Type.String()),
  logprobs: NullableBoolean,
  top_logprobs: TopLogprobs,
  response_format: nullable(
    Type.Union([
      Type.Object({ type: Type.Enum(['text', 'json_object']) }),
      Type.Object({
        type: Type.Literal('json_schema'),
        // Required (decodeChatRequest says so), but optional here: ajv checks a branch's required
        // properties before its type, and a wrong type should be told the three it may be.
        json_schema: Type.Optional(Type.Object({ name: Type.String(), schema: Type.Optional(Type.Object({})), strict: NullableBoolean })),
      }),
    ]),
  ),
  reasoning_effort: nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high'])),
  // Keep the completion for later reads (GET /v1/chat/completions/{id}); false unless asked, as at OpenAI.
  store: NullableBoolean,
  metadata: nullable(Metadata),
});
export type ChatRequest = Static<typeof ChatRequest>;
type ChatTool = Extract<NonNullable<ChatRequest['tools']>[number], { function: unknown }>;

/**
 * Members of a chat-completions request that would change the answer and that no engine here
 * applies: a 400 naming each, never an answer that looks as if it honoured them.
 */
function refuseUnapplied(body: Record<string, unknown>): void {
  // Not applied by any engine here: a 400 rather than an answer that silently ignores the bias.
  const bias = body['logit_bias'];
  if (bias != null && (typeof bias !== 'object' || Object.keys(bias).length > 0)) {
    throw new ApiError('unsupported_parameter', 'logit_bias is not supported here; send null or leave it out.', { param: 'logit_bias' });
  }
  // The legacy function-calling fields (before `tools`): ignored, a client that sent functions got
  // an answer that never called one, with no word why (an outside pass). `function_call` "none" or
  // "auto" asks for nothing a request without functions does not do already.
  const functions = body['functions'];
  const functionCall = body['function_call'];
  const legacy =
    Array.isArray(functions) && functions.length > 0
      ? 'functions'
      : functionCall != null && typeof functionCall === 'object'
        ? 'function_call'
        : undefined;
  if (legacy !== undefined) {
    throw new ApiError(
      'unsupported_parameter',
      `${legacy} (legacy function calling) is not supported here; send tools and tool_choice instead.`,
      {
        param: legacy,
      },
    );
  }
  const modalities = body['modalities'];
  if (Array.isArray(modalities) && modalities.some((m) => m !== 'text')) {
    throw new ApiError('unsupported_parameter', "Only text output is supported here; send modalities ['text'] or leave it out.", {
      param: 'modalities',
    });
  }
  if (body['audio'] != null) {
    throw new ApiError('unsupported_parameter', 'Audio output is not supported here; leave out audio.', { param: 'audio' });
  }
  if (body['web_search_options'] != null) {
    throw new ApiError('unsupported_parameter', 'Web search is not supported here; leave out web_search_options.', {
      param: 'web_search_options',
    });
  }
}

function toParts(parts: ReadonlyArray<{ type: string } & Record<string, unknown>>, where: string, role: string): ContentPart[] {
  return parts.map((p, j) => {
    // An assistant turn may carry the refusal the model gave (OpenAI's assistant content parts): the
    // model reads it back as what it said.
    if (p.type === 'refusal' && role === 'assistant') {
      if (typeof p['refusal'] !== 'string')
        throw new ApiError('invalid_value', `${where}[${j}].refusal must be a string.`, { param: `${where}[${j}].refusal` });
      return { type: 'text', text: p['refusal'] };
    }
    if (p.type === 'text') {
      if (typeof p['text'] !== 'string')
        throw new ApiError(
          p['text'] === undefined ? 'missing_required_parameter' : 'invalid_value',
          `${where}[${j}].text must be a string: a text part carries its text.`,
          { param: `${where}[${j}].text` },
        );
      return { type: 'text', text: p['text'] };
    }
    if (p.type === 'image_url') {
      const img = p['image_url'] as { url?: unknown; detail?: unknown } | undefined;
      if (typeof img?.url !== 'string')
        throw new ApiError('invalid_value', `${where}[${j}].image_url.url must be a string.`, { param: `${where}[${j}].image_url` });
      return { type: 'image', url: img.url, ...(typeof img.detail === 'string' && { detail: img.detail }) };
    }
    throw new ApiError('unsupported_content', `Content part type '${p.type}' is not supported here.`, { param: `${where}[${j}].type` });
  });
}

/**
 * The messages as canonical ones. A `tool` message must carry a `tool_call_id` that an earlier
 * assistant message's `tool_calls` made, as OpenAI requires (openai-wire.md: "tool (with
 * tool_call_id)"): a result for no call is a 400 rather than text the model reads out of context.
 */
export function toMessages(body: ChatRequest): Message[] {
  const calls = new Set<string>();
  return body.messages.map((m, i) => {
    if (m.role === 'tool') {
      const param = `messages[${i}].tool_call_id`;
      if (m.tool_call_id === undefined)
        throw new ApiError('missing_required_parameter', `Missing required parameter: '${param}'.`, { param });
      if (!calls.has(m.tool_call_id)) {
        throw new ApiError(
          'invalid_value',
          `messages[${i}] has role 'tool', so it must answer a tool call of an earlier assistant message; no tool call has the id '${m.tool_call_id}'.`,
          { param },
        );
      }
    }
    for (const c of m.role === 'assistant' ? (m.tool_calls ?? []) : []) calls.add(c.id);
    const content =
      m.content === undefined || m.content === null
        ? null
        : typeof m.content === 'string'
          ? m.content
          : toParts(m.content as ReadonlyArray<{ type: string } & Record<string, unknown>>, `messages[${i}].content`, m.role);
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

/**
 * A validated chat-completions body as the canonical request. Checks what the schema cannot: `n`,
 * content parts, and that a named `tool_choice` names one of the tools.
 */
export function decodeChatRequest(body: ChatRequest, signal: CancelSignal): GenerationRequest {
  // Neither engine returns token log probabilities: a 400 naming the parameter, never a silent null.
  if (body.logprobs === true || (body.top_logprobs != null && body.top_logprobs > 0)) {
    const param = body.logprobs === true ? 'logprobs' : 'top_logprobs';
    throw new ApiError('unsupported_parameter', `${param} is not supported: no model here returns log probabilities.`, { param });
  }
  refuseUnapplied(body as Record<string, unknown>);
  body.tools?.forEach((t, i) => {
    if (t.type !== 'function') {
      throw new ApiError('unsupported_parameter', `Tool type '${t.type}' is not supported here; only function tools.`, {
        param: `tools[${i}].type`,
      });
    }
  });
  if (body.n != null && body.n > 1) {
    throw new ApiError('unsupported_parameter', 'Only n=1 is supported; send several requests for several choices.', { param: 'n' });
  }
  // An option of streams on a request that does not stream: OpenAI refuses it, naming it, and a
  // client that sends it expects usage chunks that a single answer never has.
  if (body.stream_options != null && body.stream !== true) {
    throw new ApiError('invalid_value', "The 'stream_options' parameter is only allowed when 'stream' is enabled.", {
      param: 'stream_options',
    });
  }
  const req: GenerationRequest = {
    model: body.model,
    messages: toMessages(body),
    sampling: {},
    stream: body.stream === true,
    signal,
    tally: newTally(),
  };
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
    const tools = body.tools as ChatTool[];
    req.tools = tools.map((t, i) => ({
      position: i,
      name: t.function.name,
      ...(t.function.description !== undefined && { description: t.function.description }),
      ...(t.function.parameters !== undefined && { parameters: t.function.parameters as Record<string, unknown> }),
      ...(t.function.strict != null && { strict: t.function.strict }),
    }));
    const choice = body.tool_choice;
    if (choice != null && typeof choice !== 'string' && choice.type === 'allowed_tools') {
      const { mode, tools } = choice.allowed_tools;
      const allowed = allowTools(
        req.tools,
        tools.map((t) => t.function.name),
        mode,
        (i) => `tool_choice.allowed_tools.tools[${i}].function.name`,
      );
      req.tools = allowed.tools;
      req.toolChoice = allowed.toolChoice;
    } else if (choice != null) {
      if (typeof choice !== 'string' && !tools.some((t) => t.function.name === choice.function.name)) {
        throw new ApiError('invalid_value', `tool_choice names '${choice.function.name}', which is not one of the tools.`, {
          param: 'tool_choice',
        });
      }
      req.toolChoice = typeof choice === 'string' ? choice : ({ name: choice.function.name } satisfies ToolChoice);
    }
    if (body.parallel_tool_calls != null) req.parallelToolCalls = body.parallel_tool_calls;
  } else if (body.tool_choice != null) {
    const choice = body.tool_choice;
    refuseChoiceWithoutTools(
      typeof choice === 'string' ? choice : choice.type === 'function' ? choice.function : choice.allowed_tools.tools[0]!.function,
    );
  }
  const rf = body.response_format;
  if (rf?.type === 'json_schema') {
    const js = rf.json_schema;
    if (!js)
      throw new ApiError('missing_required_parameter', "Missing required parameter: 'response_format.json_schema'.", {
        param: 'response_format.json_schema',
      });
    req.responseFormat = {
      type: 'json_schema',
      name: js.name,
      schema: (js.schema ?? {}) as Record<string, unknown>,
      ...(js.strict != null && { strict: js.strict }),
    };
  } else if (rf != null) req.responseFormat = { type: rf.type } as ResponseFormat;
  if (body.reasoning_effort != null) req.reasoningEffort = body.reasoning_effort;
  return req;
}
