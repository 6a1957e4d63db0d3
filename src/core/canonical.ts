/**
 * The canonical request and event vocabulary. Both API families (chat completions, responses) turn
 * their wire shape into a GenerationRequest and render the same GenerationEvent stream back; every
 * engine consumes and produces only these.
 */

import type { CancelSignal } from './cancellation.js';

export type Role = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

/**
 * A prompt-cache breakpoint a client placed (Anthropic's `cache_control`): the prefix up to and
 * including what carries it may be cached. Engines without explicit caching ignore it; an Anthropic
 * upstream receives it where the client put it.
 */
export interface CacheMark {
  type: 'ephemeral';
  ttl?: '5m' | '1h';
}

export type ContentPart =
  { type: 'text'; text: string; cache?: CacheMark } | { type: 'image'; url: string; detail?: string; cache?: CacheMark };

export interface ToolCall {
  id: string;
  name: string;
  /** JSON text, as the model wrote it. */
  arguments: string;
  cache?: CacheMark;
}

export interface Message {
  role: Role;
  content: string | ContentPart[] | null;
  name?: string;
  toolCalls?: ToolCall[];
  toolCallId?: string;
  /** Reasoning an assistant turn was produced with, when a client sends it back. */
  reasoning?: string;
  /** The upstream's own signature over that reasoning (Anthropic accepts thinking back only with it). */
  reasoningSignature?: string;
  /** An assistant message's place in its turn, as the model labelled it (sent back to models that label). */
  phase?: MessagePhase;
  /** A breakpoint on a tool message as a whole (Anthropic's cache_control on a tool_result block). */
  cache?: CacheMark;
}

/** Open Responses' label of an assistant message: intermediate commentary, or the final answer. */
export type MessagePhase = 'commentary' | 'final_answer';

export interface FunctionTool {
  name: string;
  description?: string;
  parameters?: Record<string, unknown>;
  strict?: boolean;
  cache?: CacheMark;
  /** Its index in the request's own list, where `allowed_tools` narrowed the list: errors name it there. */
  position?: number;
}

export type ToolChoice = 'auto' | 'none' | 'required' | { name: string };

export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | {
      type: 'json_schema';
      name: string;
      schema: Record<string, unknown>;
      strict?: boolean;
      /** The request's name for where the schema came (for errors naming it); `response_format` (chat) when unset. */
      param?: 'text.format' | 'output_config.format';
    };

export interface Sampling {
  temperature?: number;
  topP?: number;
  /** Sample among the k likeliest tokens only (Messages' `top_k`); applied by the local engine. */
  topK?: number;
  seed?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  /** Up to four strings; generation ends before the first one the text would contain. */
  stop?: string[];
}

export interface GenerationRequest {
  /** Catalogue id the client asked for. */
  model: string;
  messages: Message[];
  sampling: Sampling;
  /** Upper bound on generated tokens; undefined means whatever the context leaves. */
  maxOutputTokens?: number;
  tools?: FunctionTool[];
  toolChoice?: ToolChoice;
  parallelToolCalls?: boolean;
  responseFormat?: ResponseFormat;
  reasoningEffort?: string;
  /**
   * The client's own thinking budget in tokens (Anthropic's `budget_tokens`), for an upstream that
   * takes one: the effort above is only its bucket.
   */
  reasoningBudget?: number;
  /** Whether the client reads a stream; engines may use it to pick their own transport. */
  stream: boolean;
  /**
   * The client's wire protocol, when it may be answered in that wire directly (the same-protocol
   * fast lane, docs/decisions.md): an engine whose upstream speaks it may pass the upstream's own
   * frames on as `wire.*` events instead of canonical deltas. Unset, engines emit canonical events only.
   */
  wire?: 'chat';
  /**
   * The client reads its stream's usage in a chunk of its own and `usage: null` in every chunk
   * before it (chat completions' `stream_options.include_usage`): what the fast lane's relayed
   * chunks must then carry, whatever the upstream wrote.
   */
  streamUsage?: boolean;
  /** Aborted when the client goes away (or the run is cancelled): the engine stops and frees what it held. */
  signal: CancelSignal;
  /**
   * Who may reuse what this request leaves in an engine's prompt cache: its organization (set at
   * admission). A cached prefix shows in `cached_tokens` and in the time to the first token, so one
   * organization's must never serve another's request.
   */
  cacheScope?: string;
  /**
   * A background response's: nobody waits on its answer, and it was acknowledged as queued. An
   * engine with a queue of its own keeps it waiting for room however long that queue is, behind the
   * requests clients wait on, rather than refusing it as busy (which would fail a response the
   * client was told would run).
   */
  background?: boolean;
  /** Kept current by the engine serving the request (reset by the router for each attempt). */
  tally: UsageTally;
}

/** What an API decodes of a generation before its context is known (the Responses API's `generation`). */
export type GenerationFields = Pick<
  GenerationRequest,
  'sampling' | 'maxOutputTokens' | 'tools' | 'toolChoice' | 'parallelToolCalls' | 'responseFormat' | 'reasoningEffort'
>;

/**
 * A canonical request from decoded generation fields and its context, written field by field: an
 * object spread followed by new properties gave every request's object a hidden class of its own in
 * Node 20's V8, so each read of it down the pipeline missed V8's inline caches (bench/README.md,
 * "Hidden classes made per request").
 */
export function generationRequest(
  f: GenerationFields,
  c: Pick<GenerationRequest, 'model' | 'messages' | 'stream' | 'signal' | 'tally'>,
): GenerationRequest {
  const req: GenerationRequest = {
    model: c.model,
    messages: c.messages,
    sampling: f.sampling,
    stream: c.stream,
    signal: c.signal,
    tally: c.tally,
  };
  if (f.maxOutputTokens !== undefined) req.maxOutputTokens = f.maxOutputTokens;
  if (f.tools !== undefined) req.tools = f.tools;
  if (f.toolChoice !== undefined) req.toolChoice = f.toolChoice;
  if (f.parallelToolCalls !== undefined) req.parallelToolCalls = f.parallelToolCalls;
  if (f.responseFormat !== undefined) req.responseFormat = f.responseFormat;
  if (f.reasoningEffort !== undefined) req.reasoningEffort = f.reasoningEffort;
  return req;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter';

export interface Usage {
  input: number;
  cached: number;
  /** Of `input`, what the upstream wrote to its prompt cache, where it reports it (Anthropic does). */
  cacheWrite?: number;
  output: number;
  reasoning: number;
  /** US dollars, added by metering; null when the model lacks a price. */
  cost?: number | null;
  /** The counts are Switchyard's estimate (the upstream reported none, or nonsense), not the engine's own. */
  estimated?: boolean;
}

/**
 * What a generation has used so far. Engines keep it current as they go, so a generation that
 * stops before its usage event (the client left, the upstream broke off) is still billed for what
 * it produced. `exact` is false while the counts are estimates (see engines/upstream).
 */
export interface UsageTally {
  input: number;
  cached: number;
  /** Of the input, what the upstream wrote to its prompt cache, where it says so before its output (Anthropic). */
  cacheWrite?: number;
  output: number;
  reasoning: number;
  exact: boolean;
}

const NO_TOOLS: ReadonlySet<string> = new Set();

/**
 * The names of the tools a request lets the model call: none under `tool_choice: "none"` or without
 * tools, the named one under a named choice, else the tools offered (already narrowed to the
 * allowed ones by `allowed_tools`). A call to any other is suppressed, whatever an upstream sends.
 */
export function callableTools(req: Pick<GenerationRequest, 'tools' | 'toolChoice'>): ReadonlySet<string> {
  const choice = req.toolChoice;
  if (choice === 'none' || !req.tools?.length) return NO_TOOLS;
  if (typeof choice === 'object') return new Set([choice.name]);
  return new Set(req.tools.map((t) => t.name));
}

export const newTally = (): UsageTally => ({ input: 0, cached: 0, cacheWrite: 0, output: 0, reasoning: 0, exact: true });

/** What a generation that ended before its usage event used: the tally, flagged when it is an estimate. */
export const tallyUsage = (t: UsageTally): Usage => ({
  input: t.input,
  cached: t.cached,
  output: t.output,
  reasoning: t.reasoning,
  ...(t.cacheWrite ? { cacheWrite: t.cacheWrite } : {}),
  ...(!t.exact && { estimated: true }),
});

export type GenerationEvent =
  | { type: 'text.delta'; text: string }
  /**
   * The model declined, in words (an upstream's `refusal`): the answer's text for a refusal, which
   * the client must be able to tell from an empty success. Counted as output as text is.
   */
  | { type: 'refusal.delta'; text: string }
  /** The model labelled the message its text belongs to (Responses-speaking upstreams do). */
  | { type: 'message.phase'; phase: MessagePhase }
  | { type: 'reasoning.delta'; text: string }
  /** The upstream signed the reasoning so far (Anthropic's signature_delta): kept for the next turn. */
  | { type: 'reasoning.signature'; signature: string }
  | { type: 'tool_call.start'; index: number; id: string; name: string }
  | { type: 'tool_call.delta'; index: number; arguments: string }
  | { type: 'usage'; usage: Usage }
  /** `stopSequence`: which of the request's stop strings ended the text, where the engine knows it. */
  | { type: 'finish'; reason: FinishReason; stopSequence?: string }
  /**
   * The fast lane (only for a request with `wire` set): server-sent-event frames in the client's
   * protocol, complete and ready to write (model name set, secrets scrubbed). They carry the content;
   * the usage and finish events that follow still come, for metering.
   */
  | { type: 'wire.frames'; frames: string }
  /**
   * The fast lane's object in the client's protocol: a whole non-stream answer, or in a stream the
   * chunk its usage goes out in (the protocol module sets the usage, with its cost, once metered).
   * `text`, where the protocol module could give it exactly: the answer as the client gets it is
   * `text.before`, the metered usage serialized, then `text.after` (the upstream's own JSON text,
   * not serialized again).
   */
  | { type: 'wire.object'; object: Record<string, unknown>; text?: WireText | undefined };

/** A fast-lane object's own JSON text around its usage: the client gets `before`, the usage, then `after`. */
export interface WireText {
  before: string;
  after: string;
}
