import Type, { type Static } from 'typebox';
import { ApiError } from '../../core/errors.js';
import type { CancelSignal } from '../../core/cancellation.js';
import {
  newTally,
  type CacheMark,
  type ContentPart,
  type FunctionTool,
  type GenerationRequest,
  type Message,
  type ToolCall,
  type ToolChoice,
} from '../../core/canonical.js';
import { COUNT_MAX, MAX_INPUT_ITEMS, MAX_TOOLS, ModelField, nullable } from '../fields.js';
import { MAX_JSON_DEPTH, nestsDeeper, obj, str } from '../reader.js';

/**
 * Anthropic's Messages API, server side: the request body as a schema and its decoding into the
 * canonical request. Blocks are checked here one by one (the schema only says each is an object
 * with a `type`), so an unknown or malformed block is a 400 naming it.
 */

const Block = Type.Object({ type: Type.String() });
const Content = Type.Union([Type.String(), Type.Array(Block)]);
const CacheControl = Type.Optional(Type.Unknown());

const Tool = Type.Object({
  // Required of client tools only, as input_schema (checked in decodeMessagesRequest): some server tools have none.
  name: Type.Optional(Type.String({ pattern: '^[a-zA-Z0-9_-]{1,128}$' })),
  type: Type.Optional(Type.String()),
  description: Type.Optional(Type.String()),
  // Required of client tools only (checked in decodeMessagesRequest): a server tool has none, and is refused by its type.
  input_schema: Type.Optional(Type.Object({})),
  // Anthropic's strict tool use: the call's input must match input_schema (the local engine checks
  // it and samples again, as for chat's `strict` functions).
  strict: Type.Optional(Type.Boolean()),
  cache_control: CacheControl,
});

const ToolChoiceWire = Type.Object({
  type: Type.Enum(['auto', 'any', 'tool', 'none']),
  name: Type.Optional(Type.String()),
  disable_parallel_tool_use: Type.Optional(Type.Boolean()),
});

const Thinking = Type.Object({
  type: Type.Enum(['enabled', 'disabled', 'adaptive', 'between_tools']),
  budget_tokens: Type.Optional(Type.Integer({ minimum: 1, maximum: COUNT_MAX })),
  display: nullable(Type.Enum(['summarized', 'omitted'])),
});

/** The current API's effort and structured output (`output_config.format`, a JSON schema). */
const OutputConfig = Type.Object({
  effort: nullable(Type.Enum(['low', 'medium', 'high', 'xhigh', 'max'])),
  format: nullable(Type.Object({ type: Type.Literal('json_schema'), schema: Type.Object({}) })),
});

const conversation = {
  model: ModelField,
  system: Type.Optional(Type.Union([Type.String(), Type.Array(Block)])),
  // The current API also takes system turns in the list (SystemMessageParam).
  messages: Type.Array(Type.Object({ role: Type.Enum(['user', 'assistant', 'system']), content: Content }), {
    minItems: 1,
    maxItems: MAX_INPUT_ITEMS,
  }),
  tools: Type.Optional(Type.Array(Tool, { maxItems: MAX_TOOLS })),
  tool_choice: Type.Optional(ToolChoiceWire),
  thinking: Type.Optional(Thinking),
  output_config: Type.Optional(OutputConfig),
};

/** `POST /v1/messages`; unknown fields are accepted and ignored, as Anthropic's own beta fields come and go. */
export const MessagesRequest = Type.Object({
  ...conversation,
  max_tokens: Type.Integer({ minimum: 1, maximum: COUNT_MAX }),
  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  top_k: Type.Optional(Type.Integer({ minimum: 0, maximum: COUNT_MAX })),
  stop_sequences: Type.Optional(Type.Array(Type.String(), { maxItems: 16 })),
  stream: Type.Optional(Type.Boolean()),
  metadata: nullable(Type.Object({ user_id: nullable(Type.String({ maxLength: 256 })) })),
});
export type MessagesRequest = Static<typeof MessagesRequest>;

/** `POST /v1/messages/count_tokens`: the conversation without the sampling fields. */
export const CountTokensRequest = Type.Object(conversation);
export type CountTokensRequest = Static<typeof CountTokensRequest>;

/**
 * Checks a thinking signature sent back (see api/messages.ts): undefined when it is not one this
 * server made for this thinking; otherwise the upstream's own signature it carries, if any.
 */
export interface ThinkingSignatures {
  verify(thinking: string, signature: string): { upstream: string | undefined } | undefined;
}

type WireBlock = { type: string } & Record<string, unknown>;

function bad(message: string, param: string): ApiError {
  return new ApiError('invalid_value', message, { param });
}

/** Puts `cache` on the last block of the last message (a string content becomes one text block). */
function markLast(messages: Message[], cache: CacheMark): void {
  const m = messages.at(-1);
  if (!m) return;
  const calls = m.toolCalls;
  if (calls?.length) calls[calls.length - 1]!.cache = cache;
  else if (m.role === 'tool') m.cache = cache;
  else if (typeof m.content === 'string') {
    // An empty prefill has no block to mark.
    if (m.content !== '') m.content = [{ type: 'text', text: m.content, cache }];
  } else if (m.content?.length) m.content[m.content.length - 1]!.cache = cache;
}

/** A block's `cache_control`, kept for an Anthropic upstream (see CacheMark). */
function cacheMark(value: unknown, param: string): CacheMark | undefined {
  if (value === undefined || value === null) return undefined;
  const c = obj(value);
  const ttl = c?.['ttl'];
  if (c?.['type'] !== 'ephemeral' || (ttl !== undefined && ttl !== '5m' && ttl !== '1h'))
    throw bad(
      '`cache_control` must be {type: "ephemeral"} with an optional ttl of "5m" or "1h".',
      param ? `${param}.cache_control` : 'cache_control',
    );
  return ttl === undefined ? { type: 'ephemeral' } : { type: 'ephemeral', ttl };
}

/** Sets `cache` on a canonical part, call or message when the wire block carries cache_control. */
function withCache<T extends { cache?: CacheMark }>(target: T, b: WireBlock | Record<string, unknown>, param: string): T {
  const cache = cacheMark(b['cache_control'], param);
  if (cache) target.cache = cache;
  return target;
}

function image(b: WireBlock, param: string): ContentPart {
  const source = b['source'] as Record<string, unknown> | undefined;
  if (source?.['type'] === 'base64' && typeof source['data'] === 'string' && typeof source['media_type'] === 'string')
    return withCache<ContentPart>({ type: 'image', url: `data:${source['media_type']};base64,${source['data']}` }, b, param);
  if (source?.['type'] === 'url' && typeof source['url'] === 'string')
    return withCache<ContentPart>({ type: 'image', url: source['url'] }, b, param);
  throw bad('An image block needs source {type: "base64", media_type, data} or {type: "url", url}.', `${param}.source`);
}

function text(b: WireBlock, param: string): ContentPart {
  const t = str(b['text']);
  if (t === undefined) throw bad('A text block needs a string `text`.', `${param}.text`);
  // As Anthropic's API: an empty block is refused, not read as a prompt with nothing in it.
  if (t === '') throw bad('text content blocks must be non-empty', `${param}.text`);
  return withCache<ContentPart>({ type: 'text', text: t }, b, param);
}

const unsupported = (b: WireBlock, param: string): ApiError =>
  new ApiError('unsupported_content', `Content block type '${b.type}' is not supported here.`, { param: `${param}.type` });

/** A tool_result's content: a string, or text and image blocks. */
function toolResult(b: WireBlock, param: string): string | ContentPart[] {
  const content = b['content'];
  if (content === undefined) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw bad('tool_result content must be a string or an array of blocks.', `${param}.content`);
  return (content as WireBlock[]).map((c, k) => {
    const where = `${param}.content[${k}]`;
    if (c?.type === 'text') return text(c, where);
    if (c?.type === 'image') return image(c, where);
    throw unsupported(c, where);
  });
}

/**
 * One text block as a string; several blocks stay blocks (an Anthropic upstream gets them as sent,
 * a chat upstream as text parts, and an engine that needs one string joins them by lines). They
 * were joined with nothing between them: "Hello" and "world" reached every engine as "Helloworld".
 */
const joinText = (parts: ContentPart[]): string | ContentPart[] => {
  if (parts.length === 0) return '';
  const only = parts.length === 1 ? parts[0] : undefined;
  return only?.type === 'text' && !only.cache ? only.text : parts;
};

/**
 * One Messages turn as canonical messages. A user turn's tool_result blocks become tool messages
 * (placed first, as chat completions want them right after the assistant's calls); an assistant
 * turn's tool_use blocks become its tool calls and its thinking, once its signature checks, the
 * reasoning it is sent back with.
 */
function toMessages(
  role: 'user' | 'assistant' | 'system',
  content: string | WireBlock[],
  i: number,
  signatures: ThinkingSignatures,
): Message[] {
  if (role === 'system') return [{ role, content: systemText(content, `messages[${i}].content`) ?? '' }];
  if (typeof content === 'string') return [{ role, content }];
  const parts: ContentPart[] = [];
  const out: Message[] = [];
  const assistant: Message = { role: 'assistant', content: null };
  /** The turn's tool_use ids so far: looked up, not searched (a search per block made 30,000 blocks hold the event loop 5 s). */
  const toolIds = new Set<string>();
  content.forEach((b, j) => {
    const param = `messages[${i}].content[${j}]`;
    switch (b.type) {
      case 'text':
        parts.push(text(b, param));
        return;
      case 'image':
        if (role !== 'user') throw bad('Images are only accepted in user turns.', param);
        parts.push(image(b, param));
        return;
      case 'tool_result': {
        if (role !== 'user') throw bad('tool_result blocks belong in user turns.', param);
        const id = str(b['tool_use_id']);
        if (!id) throw bad('A tool_result block needs `tool_use_id`.', `${param}.tool_use_id`);
        if (b['is_error'] !== undefined && typeof b['is_error'] !== 'boolean')
          throw bad('tool_result `is_error` must be a boolean.', `${param}.is_error`);
        const result = toolResult(b, param);
        // An error result is still the tool's answer; the model is told it failed, before its text
        // (blocks stay blocks: their text, not their JSON, as a hostile pass found).
        const body =
          b['is_error'] !== true
            ? result
            : typeof result === 'string'
              ? `Error: ${result}`
              : result[0]?.type === 'text'
                ? [{ ...result[0], text: `Error: ${result[0].text}` }, ...result.slice(1)]
                : [{ type: 'text' as const, text: 'Error:' }, ...result];
        out.push(withCache<Message>({ role: 'tool', toolCallId: id, content: typeof body === 'string' ? body : joinText(body) }, b, param));
        return;
      }
      case 'tool_use': {
        if (role !== 'assistant') throw bad('tool_use blocks belong in assistant turns.', param);
        const id = str(b['id']);
        const name = str(b['name']);
        if (!id || !name) throw bad('A tool_use block needs `id` and `name`.', param);
        const input = b['input'] ?? {};
        if (typeof input !== 'object' || input === null || Array.isArray(input))
          throw bad('tool_use `input` must be an object.', `${param}.input`);
        if (nestsDeeper(input)) throw bad(`tool_use \`input\` nests deeper than ${MAX_JSON_DEPTH} levels.`, `${param}.input`);
        if (toolIds.has(id)) throw bad(`tool_use ids must be unique: '${id}' is used twice.`, `${param}.id`);
        toolIds.add(id);
        (assistant.toolCalls ??= []).push(withCache<ToolCall>({ id, name, arguments: JSON.stringify(input) }, b, param));
        return;
      }
      case 'thinking': {
        if (role !== 'assistant') throw bad('thinking blocks belong in assistant turns.', param);
        const thinking = str(b['thinking']);
        const signature = str(b['signature']);
        if (thinking === undefined || signature === undefined) throw bad('A thinking block needs `thinking` and `signature`.', param);
        const verified = signatures.verify(thinking, signature);
        if (!verified)
          throw bad('Invalid `signature` in thinking block: send thinking back exactly as this server returned it.', `${param}.signature`);
        // One upstream signature covers one block: a turn with several keeps none (it cannot be replayed).
        if (assistant.reasoning === undefined && verified.upstream !== undefined) assistant.reasoningSignature = verified.upstream;
        else delete assistant.reasoningSignature;
        assistant.reasoning = (assistant.reasoning ?? '') + thinking;
        return;
      }
      case 'redacted_thinking':
        // This server never redacts thinking; one from another provider means nothing to these models.
        return;
      default:
        throw unsupported(b, param);
    }
  });
  if (role === 'assistant') {
    if (parts.length) assistant.content = joinText(parts);
    else if (!assistant.toolCalls) assistant.content = '';
    out.push(assistant);
  } else if (parts.length || out.length === 0) out.push({ role: 'user', content: joinText(parts) });
  return out;
}

/** Ids for an error message: the first few, and how many more (20,000 unanswered calls made a reply of hundreds of KB). */
function listed(ids: ReadonlySet<string>, most = 10): string {
  const first = [...ids].slice(0, most).join(', ');
  return ids.size > most ? `${first} and ${ids.size - most} more` : first;
}

/** Content as parts, for joining two turns' content. */
const asParts = (c: string | ContentPart[]): ContentPart[] => (typeof c === 'string' ? (c === '' ? [] : [{ type: 'text', text: c }]) : c);

/** An assistant turn folded into the one before it, as Anthropic reads two in a row: text, calls and thinking in order. */
function mergeAssistant(prev: Message, next: Message): void {
  if (next.content !== null && next.content !== '') {
    const before = prev.content ?? '';
    // Each turn's text stays a part of its own (run together, "Hello" and "world" were one word).
    // Added to the parts already there (this decode's own array): copied for every turn, 10,000
    // assistant turns in a row took a copy each of all before them.
    const parts = Array.isArray(before) ? before : asParts(before);
    for (const p of asParts(next.content)) parts.push(p);
    prev.content = joinText(parts);
  }
  // One at a time: spread into push, a turn of many calls would pass more arguments than the stack holds.
  if (next.toolCalls) {
    const calls = (prev.toolCalls ??= []);
    for (const c of next.toolCalls) calls.push(c);
  }
  if (next.reasoning !== undefined) {
    // One upstream signature covers one block: two turns' thinking joined keeps none.
    if (prev.reasoning !== undefined) delete prev.reasoningSignature;
    else if (next.reasoningSignature !== undefined) prev.reasoningSignature = next.reasoningSignature;
    prev.reasoning = (prev.reasoning ?? '') + next.reasoning;
  }
}

/** System text: one string, or its blocks as parts when one carries a cache breakpoint. */
function systemText(system: string | WireBlock[] | undefined, param = 'system'): string | ContentPart[] | undefined {
  if (system === undefined) return undefined;
  if (typeof system === 'string') return system || undefined;
  const parts = system.map((b, j) => {
    if (b.type !== 'text') throw unsupported(b, `${param}[${j}]`);
    return text(b, `${param}[${j}]`);
  });
  if (parts.some((p) => p.cache)) return parts;
  return parts.map((p) => (p as { text: string }).text).join('\n') || undefined;
}

/**
 * The canonical effort: `output_config.effort` when given (xhigh and max are the canonical high),
 * else from the thinking budget: the larger the budget, the more the model may think.
 */
function effortFor(thinking: Static<typeof Thinking> | undefined, config: Static<typeof OutputConfig> | undefined): string | undefined {
  const effort = config?.effort;
  if (effort != null) return effort === 'xhigh' || effort === 'max' ? 'high' : effort;
  if (!thinking || thinking.type === 'disabled') return thinking ? 'none' : undefined;
  if (thinking.type === 'adaptive' || thinking.budget_tokens === undefined) return 'medium';
  return thinking.budget_tokens < 4096 ? 'low' : thinking.budget_tokens < 16384 ? 'medium' : 'high';
}

/** The conversation part (shared with count_tokens) as a canonical request. */
function decodeConversation(
  body: CountTokensRequest,
  signal: CancelSignal,
  signatures: ThinkingSignatures,
  stream: boolean,
): GenerationRequest {
  const messages: Message[] = [];
  const system = systemText(body.system as string | WireBlock[] | undefined);
  if (system !== undefined) messages.push({ role: 'system', content: system });
  /** The tool_use ids of the message before (a tool_result answers one of them, as Anthropic's API requires). */
  let calls = new Set<string>();
  /** The calls of the assistant turns before the current run of user turns that no tool_result has answered yet. */
  let unanswered = new Set<string>();
  /** The calls answered so far in that run of user turns. */
  let answered = new Set<string>();
  /** Where that run of user turns began. */
  let runStart = 0;
  body.messages.forEach((m, i) => {
    // As Anthropic's API: only a final assistant message (a prefill) may be empty.
    if (m.content.length === 0 && !(m.role === 'assistant' && i === body.messages.length - 1)) {
      throw bad('All messages must have non-empty content except for the optional final assistant message.', `messages[${i}].content`);
    }
    const converted = toMessages(m.role, m.content as string | WireBlock[], i, signatures);
    for (const c of converted) {
      if (c.role === 'tool' && !calls.has(c.toolCallId ?? '')) {
        throw bad(
          `messages.${i}: unexpected tool_use_id '${c.toolCallId ?? ''}' in a tool_result block; each tool_result must answer a tool_use of the previous message.`,
          `messages[${i}].content`,
        );
      }
    }
    // Every call is answered in the user turns right after it, as Anthropic's API requires (a call
    // left unanswered would reach a chat-completions upstream as a turn it refuses, or be read by a
    // local model as a call that never returned).
    if (m.role === 'user') {
      if (i === 0 || body.messages[i - 1]!.role !== 'user') {
        unanswered = new Set(calls);
        answered = new Set();
        runStart = i;
      }
      for (const c of converted) {
        if (c.role !== 'tool') continue;
        const id = c.toolCallId ?? '';
        // As Anthropic's API: one result per call (two would reach the model as two answers).
        if (answered.has(id)) {
          throw bad(
            `messages.${i}: each tool_use must have a single result. Found multiple \`tool_result\` blocks with id: ${id}`,
            `messages[${i}].content`,
          );
        }
        answered.add(id);
        unanswered.delete(id);
      }
      const runEnds = i + 1 === body.messages.length || body.messages[i + 1]!.role !== 'user';
      if (runEnds && unanswered.size > 0) {
        throw bad(
          `messages.${runStart}: tool_use ids were found without tool_result blocks immediately after: ${listed(unanswered)}. ` +
            'Each tool_use block must have a corresponding tool_result block in the next message.',
          `messages[${runStart}].content`,
        );
      }
    }
    // Anthropic merges consecutive turns of one role: an assistant turn after an assistant turn adds
    // its calls, and user turns in a row answer the same ones. Assistant turns are merged here too:
    // two in a row would reach a chat-completions upstream as a call followed by a message rather
    // than by its result, which OpenAI refuses.
    if (m.role === 'assistant') {
      const ids = converted.flatMap((c) => (c.toolCalls ?? []).map((t) => t.id));
      const merged = i > 0 && body.messages[i - 1]!.role === 'assistant';
      const repeated = merged ? ids.find((id) => calls.has(id)) : undefined;
      if (repeated !== undefined) throw bad(`tool_use ids must be unique: '${repeated}' is used twice.`, `messages[${i}].content`);
      if (merged) for (const id of ids) calls.add(id);
      else calls = new Set(ids);
      const prev = messages.at(-1);
      if (merged && prev?.role === 'assistant' && converted.length === 1) {
        mergeAssistant(prev, converted[0]!);
        return;
      }
    }
    // One at a time: a turn of 100,000 tool results spread into push passes more arguments than the stack holds.
    for (const c of converted) messages.push(c);
  });
  const req: GenerationRequest = { model: body.model, messages, sampling: {}, stream, signal, tally: newTally() };
  if (body.tools?.length) {
    req.tools = body.tools.map((t, i) => {
      // Anthropic's server tools (web search, code execution, …) run at Anthropic; here only client tools.
      if (t.type !== undefined && t.type !== 'custom')
        throw new ApiError(
          'unsupported_parameter',
          `Tool type '${t.type}' is not supported here; only client tools (name, input_schema).`,
          {
            param: `tools[${i}].type`,
          },
        );
      // Required of client tools (the schema leaves them optional, so a server tool is refused for its type).
      if (t.name === undefined)
        throw new ApiError('missing_required_parameter', `Missing required parameter: 'tools[${i}].name'.`, { param: `tools[${i}].name` });
      if (t.input_schema === undefined)
        throw new ApiError('missing_required_parameter', `Missing required parameter: 'tools[${i}].input_schema'.`, {
          param: `tools[${i}].input_schema`,
        });
      // As Anthropic's API: a tool's input is an object (a call's `input` is one).
      if ((t.input_schema as Record<string, unknown>)['type'] !== 'object')
        throw bad(`tools.${i}.input_schema.type: Input should be 'object'`, `tools[${i}].input_schema.type`);
      return withCache<FunctionTool>(
        {
          name: t.name,
          ...(t.description !== undefined && { description: t.description }),
          parameters: t.input_schema as Record<string, unknown>,
          ...(t.strict !== undefined && { strict: t.strict }),
        },
        t,
        `tools[${i}]`,
      );
    });
  }
  const choice = body.tool_choice;
  if (choice) {
    if (choice.type === 'tool') {
      if (!choice.name)
        throw new ApiError('missing_required_parameter', "tool_choice of type 'tool' needs `name`.", { param: 'tool_choice.name' });
      if (!body.tools?.some((t) => t.name === choice.name))
        throw bad(`tool_choice names '${choice.name}', which is not one of the tools.`, 'tool_choice.name');
    }
    if (req.tools) {
      const map: Record<string, ToolChoice> = { auto: 'auto', any: 'required', none: 'none' };
      req.toolChoice = choice.type === 'tool' ? { name: choice.name! } : map[choice.type]!;
      if (choice.disable_parallel_tool_use !== undefined) req.parallelToolCalls = !choice.disable_parallel_tool_use;
    } else if (choice.type === 'any') throw bad("tool_choice 'any' needs tools.", 'tool_choice');
  }
  const effort = effortFor(body.thinking, body.output_config);
  if (effort !== undefined) req.reasoningEffort = effort;
  if (body.thinking?.type === 'enabled' && body.thinking.budget_tokens !== undefined) req.reasoningBudget = body.thinking.budget_tokens;
  const format = body.output_config?.format;
  if (format != null)
    req.responseFormat = {
      type: 'json_schema',
      name: 'output',
      schema: format.schema as Record<string, unknown>,
      // Anthropic's structured outputs promise output that matches the schema: an upstream is asked
      // for the same (OpenAI's json_schema is best effort without strict).
      strict: true,
      param: 'output_config.format',
    };
  return req;
}

export function decodeMessagesRequest(body: MessagesRequest, signal: CancelSignal, signatures: ThinkingSignatures): GenerationRequest {
  // MCP servers are Anthropic's connector (a beta): here a 400 rather than an answer without their tools.
  if ((body as Record<string, unknown>)['mcp_servers'] != null)
    throw new ApiError('unsupported_parameter', 'mcp_servers is not supported here; only client tools (name, input_schema).', {
      param: 'mcp_servers',
    });
  // Message threads (the SDK's default for its tool runner and `thread()`): the conversation is held
  // by the server between turns, and each turn sends only what is new. Ignored, a turn that continues
  // one lost everything before it; refused, the SDK sends the whole history without a thread.
  if ((body as Record<string, unknown>)['thread'] != null)
    throw new ApiError(
      'thread_unsupported_request',
      'Message threads are not supported by this server; send the full conversation without `thread`.',
      { param: 'thread' },
    );
  const req = decodeConversation(body, signal, signatures, body.stream === true);
  // Automatic prompt caching: a top-level `cache_control` is a breakpoint on the last block there is.
  const cache = cacheMark((body as Record<string, unknown>)['cache_control'], '');
  if (cache) markLast(req.messages, cache);
  req.maxOutputTokens = body.max_tokens;
  // As Anthropic's API: enabled thinking names its budget, of at least 1,024 tokens and below max_tokens.
  if (body.thinking?.type === 'enabled') {
    const budget = body.thinking.budget_tokens;
    if (budget === undefined) throw bad('thinking.enabled.budget_tokens: Field required', 'thinking.budget_tokens');
    if (budget < 1024) throw bad('thinking.enabled.budget_tokens: Input should be greater than or equal to 1024', 'thinking.budget_tokens');
    if (budget >= body.max_tokens) throw bad('thinking.budget_tokens must be less than max_tokens.', 'thinking.budget_tokens');
  }
  const s = req.sampling;
  if (body.temperature !== undefined) s.temperature = body.temperature;
  if (body.top_p !== undefined) s.topP = body.top_p;
  if (body.top_k !== undefined) s.topK = body.top_k;
  const stops = body.stop_sequences?.filter((x) => x !== '');
  if (stops?.length) s.stop = stops;
  return req;
}

export function decodeCountTokensRequest(
  body: CountTokensRequest,
  signal: CancelSignal,
  signatures: ThinkingSignatures,
): GenerationRequest {
  return decodeConversation(body, signal, signatures, false);
}
