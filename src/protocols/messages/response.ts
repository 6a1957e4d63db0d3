import { newId } from '../../core/ids.js';
import type { ApiError } from '../../core/errors.js';
import type { FinishReason, GenerationEvent, Usage } from '../../core/canonical.js';
import { nestsDeeper, obj } from '../reader.js';

/**
 * Anthropic's Messages API, server side: canonical events as one `message` object, or as the named
 * events of a Messages stream (message_start, content_block_start/delta/stop, message_delta,
 * message_stop), and errors in Anthropic's envelope with its status codes.
 */

export const newMessageId = (): string => newId('msg');

/**
 * A call's id as a Messages `tool_use` id: Anthropic's match `^[a-zA-Z0-9_-]+$`, and a client that
 * later sends the conversation to Anthropic gets a 400 for any other. Some upstreams write others
 * (Kimi's `functions.get_weather:0`): each other character becomes `_`. The client sends the id back
 * with the result, and the upstream then reads this one in both places, which is all it needs.
 */
export function toolUseId(id: string): string {
  if (TOOL_USE_ID.test(id)) return id;
  const clean = id.replace(/[^a-zA-Z0-9_-]/g, '_');
  return clean === '' ? newId('toolu') : clean;
}
const TOOL_USE_ID = /^[a-zA-Z0-9_-]+$/;

/**
 * toolUseId, unique among the ids of one message (`used`): two upstream ids may map to one (`x.1`
 * and `x_1`), and a message with a repeated id is refused when it comes back as history.
 */
function uniqueToolUseId(id: string, used: Set<string>): string {
  const base = toolUseId(id);
  let out = base;
  for (let n = 2; used.has(out); n++) out = `${base}_${n}`;
  used.add(out);
  return out;
}

export type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use' | 'refusal';

/**
 * Anthropic's stop reason. `refused`: the answer holds a refusal (an upstream's `refusal` text),
 * which Messages gives as text, so an answer that otherwise ended normally stops with `refusal`:
 * the one place a client can tell it from an answer.
 */
function stopReason(reason: FinishReason, stopSequence: string | undefined, refused: boolean): StopReason {
  if (refused && reason === 'stop' && stopSequence === undefined) return 'refusal';
  switch (reason) {
    case 'length':
      return 'max_tokens';
    case 'tool_calls':
      return 'tool_use';
    case 'content_filter':
      return 'refusal';
    case 'stop':
      return stopSequence !== undefined ? 'stop_sequence' : 'end_turn';
  }
}

/**
 * Anthropic's usage: input excludes what was read from and written to the cache. The split of a
 * write by TTL is not kept, so `cache_creation` is null when there was one.
 */
export function renderUsage(u: Usage): Record<string, unknown> {
  const written = u.cacheWrite ?? 0;
  const out: Record<string, unknown> = {
    input_tokens: Math.max(0, u.input - u.cached - written),
    cache_creation_input_tokens: written,
    cache_read_input_tokens: u.cached,
    cache_creation: written ? null : { ephemeral_5m_input_tokens: 0, ephemeral_1h_input_tokens: 0 },
    output_tokens: u.output,
    output_tokens_details: { thinking_tokens: u.reasoning },
    server_tool_use: null,
    service_tier: 'standard',
  };
  // Extensions, as on the other endpoints: US dollars (null without a price), and estimated counts.
  if (u.cost !== undefined) out['cost'] = u.cost;
  if (u.estimated) out['estimated'] = true;
  return out;
}

/**
 * A tool call's arguments as the `input` object; text that is not a JSON object (a `strict: false`
 * slip) becomes `{}`, and so does one nested past MAX_JSON_DEPTH, which the answer could not be
 * serialized with (a stream passes the text on as it came).
 */
export function toolInput(args: string): Record<string, unknown> {
  try {
    const input = obj(JSON.parse(args || '{}'));
    return input === undefined || nestsDeeper(input) ? {} : input;
  } catch {
    return {};
  }
}

/**
 * Whether an answer gives thinking blocks: as Anthropic's API, only where the request asked for
 * thinking. A model that reasons anyway (an upstream reasoning model) has its reasoning billed but
 * not shown; clients read `content[0].text` and would find a thinking block there.
 */
export const showsThinking = (thinking: { type: string } | undefined): boolean => thinking !== undefined && thinking.type !== 'disabled';

/** Our signature for thinking, carrying the upstream's own where it signed it. */
export type Sign = (thinking: string, upstream: string | undefined) => string;

type Block =
  | { type: 'thinking'; thinking: string; upstream: string | undefined }
  | { type: 'text'; text: string }
  | { type: 'tool_use'; id: string; name: string; input: Record<string, unknown>; args: string };

/** Folds the event stream into one `message` object. */
export class MessageFold {
  private readonly blocks: Block[] = [];
  private readonly calls = new Map<number, Extract<Block, { type: 'tool_use' }>>();
  /** The tool_use ids given so far in this message. */
  private readonly toolUseIds = new Set<string>();
  private usage: Usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
  private stop: StopReason | null = null;
  private stopSequence: string | null = null;
  private refused = false;
  finished = false;

  constructor(
    private readonly sign: Sign,
    /** Thinking blocks are given (the request asked for thinking: see `showsThinking`). */
    private readonly showThinking = true,
  ) {}

  apply(ev: GenerationEvent): void {
    const last = this.blocks.at(-1);
    switch (ev.type) {
      case 'text.delta':
      case 'refusal.delta':
        // Messages has no refusal block: its refusals are text (and the stop reason says so).
        if (ev.type === 'refusal.delta') this.refused = true;
        if (last?.type === 'text') last.text += ev.text;
        else this.blocks.push({ type: 'text', text: ev.text });
        break;
      case 'reasoning.delta':
        if (!this.showThinking) break;
        if (last?.type === 'thinking') last.thinking += ev.text;
        else this.blocks.push({ type: 'thinking', thinking: ev.text, upstream: undefined });
        break;
      case 'reasoning.signature':
        if (last?.type === 'thinking') last.upstream = ev.signature;
        break;
      case 'tool_call.start': {
        const block = { type: 'tool_use' as const, id: uniqueToolUseId(ev.id, this.toolUseIds), name: ev.name, input: {}, args: '' };
        this.calls.set(ev.index, block);
        this.blocks.push(block);
        break;
      }
      case 'tool_call.delta': {
        const call = this.calls.get(ev.index);
        if (call) call.args += ev.arguments;
        break;
      }
      case 'usage':
        this.usage = ev.usage;
        break;
      case 'finish':
        this.stop = stopReason(ev.reason, ev.stopSequence, this.refused);
        this.stopSequence = ev.stopSequence ?? null;
        this.finished = true;
        break;
      case 'message.phase':
        break;
    }
  }

  result(model: string): Record<string, unknown> {
    const content = this.blocks.map((b) => {
      if (b.type === 'thinking') return { type: 'thinking', thinking: b.thinking, signature: this.sign(b.thinking, b.upstream) };
      if (b.type === 'tool_use') return { type: 'tool_use', id: b.id, name: b.name, input: toolInput(b.args) };
      return { type: 'text', text: b.text };
    });
    return {
      id: newMessageId(),
      type: 'message',
      role: 'assistant',
      model,
      content,
      stop_reason: this.stop,
      stop_sequence: this.stopSequence,
      stop_details: null,
      container: null,
      usage: renderUsage(this.usage),
    };
  }
}

/** One server-sent event as the Anthropic SDKs read it: an `event:` name and its JSON. */
const frame = (name: string, data: string): string => `event: ${name}\ndata: ${data}\n\n`;

/**
 * Renders the event stream as a Messages stream. A content block opens on the first event of its
 * kind and closes when another kind starts (a thinking block ends with its signature); usage comes
 * in message_start (input) and message_delta (the final counts).
 */
export class MessageStreamRenderer {
  readonly id = newMessageId();
  private open: { kind: 'text' | 'thinking' | 'tool_use'; index: number; toolIndex?: number } | undefined;
  /** The tool_use ids given so far in this message. */
  private readonly toolUseIds = new Set<string>();
  private next = 0;
  private thinking = '';
  private upstreamSignature: string | undefined;
  private usage: Usage | undefined;
  private stop: StopReason = 'end_turn';
  private stopSequence: string | null = null;
  private refused = false;

  constructor(
    private readonly model: string,
    private readonly sign: Sign,
    /** Thinking blocks are given (the request asked for thinking: see `showsThinking`). */
    private readonly showThinking = true,
  ) {}

  /**
   * message_start (with the input tokens known so far, the cached ones apart as in message_delta)
   * and a ping, as Anthropic opens a stream.
   */
  start(inputTokens: number, cachedTokens = 0, cacheWrite = 0): string {
    const message = {
      id: this.id,
      type: 'message',
      role: 'assistant',
      model: this.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      stop_details: null,
      container: null,
      // The cache write apart, as message_delta has it (it was counted as input here, and 0 written).
      usage: renderUsage({
        input: inputTokens,
        cached: Math.min(cachedTokens, inputTokens),
        output: 0,
        reasoning: 0,
        ...(cacheWrite > 0 && { cacheWrite: Math.min(cacheWrite, inputTokens - Math.min(cachedTokens, inputTokens)) }),
      }),
    };
    return frame('message_start', JSON.stringify({ type: 'message_start', message })) + frame('ping', '{"type":"ping"}');
  }

  private close(): string {
    const open = this.open;
    if (!open) return '';
    this.open = undefined;
    let out = '';
    if (open.kind === 'thinking') {
      const delta = {
        type: 'content_block_delta',
        index: open.index,
        delta: { type: 'signature_delta', signature: this.sign(this.thinking, this.upstreamSignature) },
      };
      out += frame('content_block_delta', JSON.stringify(delta));
      this.thinking = '';
      this.upstreamSignature = undefined;
    }
    return out + frame('content_block_stop', `{"type":"content_block_stop","index":${open.index}}`);
  }

  private begin(kind: 'text' | 'thinking' | 'tool_use', block: Record<string, unknown>, toolIndex?: number): string {
    const out = this.close();
    const index = this.next++;
    this.open = { kind, index, ...(toolIndex !== undefined && { toolIndex }) };
    return out + frame('content_block_start', JSON.stringify({ type: 'content_block_start', index, content_block: block }));
  }

  private delta(delta: string): string {
    return frame('content_block_delta', `{"type":"content_block_delta","index":${this.open!.index},"delta":${delta}}`);
  }

  /** The frames for one event ('' when it adds nothing the client sees yet). */
  event(ev: GenerationEvent): string {
    switch (ev.type) {
      case 'text.delta':
      case 'refusal.delta': {
        // As in MessageFold.
        if (ev.type === 'refusal.delta') this.refused = true;
        const head = this.open?.kind === 'text' ? '' : this.begin('text', { type: 'text', text: '' });
        return head + this.delta(`{"type":"text_delta","text":${JSON.stringify(ev.text)}}`);
      }
      case 'reasoning.delta': {
        if (!this.showThinking) return '';
        const head = this.open?.kind === 'thinking' ? '' : this.begin('thinking', { type: 'thinking', thinking: '', signature: '' });
        this.thinking += ev.text;
        return head + this.delta(`{"type":"thinking_delta","thinking":${JSON.stringify(ev.text)}}`);
      }
      case 'reasoning.signature':
        if (this.open?.kind === 'thinking') this.upstreamSignature = ev.signature;
        return '';
      case 'tool_call.start':
        return this.begin(
          'tool_use',
          { type: 'tool_use', id: uniqueToolUseId(ev.id, this.toolUseIds), name: ev.name, input: {} },
          ev.index,
        );
      case 'tool_call.delta':
        if (this.open?.kind !== 'tool_use' || this.open.toolIndex !== ev.index) return '';
        return this.delta(`{"type":"input_json_delta","partial_json":${JSON.stringify(ev.arguments)}}`);
      case 'usage':
        this.usage = ev.usage;
        return '';
      case 'finish':
        this.stop = stopReason(ev.reason, ev.stopSequence, this.refused);
        this.stopSequence = ev.stopSequence ?? null;
        return '';
      case 'message.phase':
      case 'wire.frames':
      case 'wire.object':
        // No phase in Messages; the chat fast lane's events never reach this protocol.
        return '';
    }
  }

  /** What ends a complete stream: the open block's stop, message_delta with the final usage, message_stop. */
  end(): string {
    const usage = this.usage ? renderUsage(this.usage) : { output_tokens: 0 };
    // `stop_details` as the answer has it (null): the SDK's stream helper copies it from here, and
    // read undefined where a non-stream answer has null (an outside pass).
    const delta = { type: 'message_delta', delta: { stop_reason: this.stop, stop_sequence: this.stopSequence, stop_details: null }, usage };
    return this.close() + frame('message_delta', JSON.stringify(delta)) + frame('message_stop', '{"type":"message_stop"}');
  }

  /** A failure mid-stream: Anthropic's `error` event; the SDKs throw it as an APIError. */
  static error(e: ApiError): string {
    return frame('error', JSON.stringify(anthropicError(e).body));
  }
}

const ERROR_TYPES: Readonly<Record<number, string>> = {
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  408: 'timeout_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  504: 'timeout_error',
  529: 'overloaded_error',
};

/**
 * `error.details` where Anthropic defines them for an error. The SDK's message threads and tool
 * runner read `thread_unsupported_request` to go on without a thread (sending the whole history); an
 * `unsupported` value they do not know ("thread" itself) tells them to.
 */
const DETAILS: Partial<Record<ApiError['code'], Record<string, unknown>>> = {
  thread_unsupported_request: { error_code: 'thread_unsupported_request', unsupported: ['thread'] },
};

/** Anthropic's envelope and status for an error; its overloaded answer is 529. */
export function anthropicError(e: ApiError, requestId?: string): { status: number; body: Record<string, unknown> } {
  const status = e.code === 'overloaded' ? 529 : e.status;
  const type = ERROR_TYPES[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error');
  const details = DETAILS[e.code];
  return {
    status,
    body: {
      type: 'error',
      error: { type, message: e.message, ...(details && { details }) },
      ...(requestId !== undefined && { request_id: requestId }),
    },
  };
}
