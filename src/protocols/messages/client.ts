import { ApiError } from '../../core/errors.js';
import type { CacheMark, ContentPart, FinishReason, GenerationEvent, GenerationRequest, Message } from '../../core/canonical.js';
import { toolInput, toolUseId } from './response.js';
import { MAX_TOOL_CALLS, obj, reported, str, upstreamFailure, type Clean, type ReportedUsage, type StreamReader } from '../reader.js';

/**
 * The client side of Anthropic's Messages API, for deployments with `api: anthropic`: a canonical
 * request as a streamed Messages request, and its stream events read back into canonical events.
 */

/** Anthropic requires max_tokens; a request that set none gets this, plus any thinking budget. */
export const DEFAULT_MAX_TOKENS = 4096;
/** Thinking budgets for the canonical efforts (Anthropic's minimum is 1024). */
const BUDGETS: Readonly<Record<string, number>> = { minimal: 1024, low: 1024, medium: 4096, high: 16384 };
const MIN_BUDGET = 1024;

/** A wire block with the client's cache breakpoint, where it set one. */
const cached = (block: Record<string, unknown>, cache: CacheMark | undefined): Record<string, unknown> => {
  if (cache) block['cache_control'] = cache;
  return block;
};

function blocks(content: string | ContentPart[]): Array<Record<string, unknown>> {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  // Anthropic refuses an empty text block: an empty part (kept as a part among others) is left out.
  return content
    .filter((p) => p.type !== 'text' || p.text !== '')
    .map((p) => {
      if (p.type === 'text') return cached({ type: 'text', text: p.text }, p.cache);
      const data = /^data:([^;,]+);base64,(.*)$/s.exec(p.url);
      return cached(
        data
          ? { type: 'image', source: { type: 'base64', media_type: data[1], data: data[2] } }
          : { type: 'image', source: { type: 'url', url: p.url } },
        p.cache,
      );
    });
}

/**
 * Canonical messages as Anthropic's `system` and turns: tool results become tool_result blocks of a
 * user turn, tool calls tool_use blocks, and consecutive turns of one role are merged (Anthropic
 * wants them alternating). Reasoning goes back as a thinking block only with Anthropic's own
 * signature (carried through our signature by the Messages endpoint); otherwise it is left out.
 */
function wireTurns(messages: readonly Message[]): {
  system: string | Array<Record<string, unknown>> | undefined;
  turns: Array<{ role: string; content: unknown[] }>;
} {
  const system: Array<Record<string, unknown>> = [];
  const turns: Array<{ role: string; content: unknown[] }> = [];
  const push = (role: 'user' | 'assistant', content: unknown[]) => {
    if (content.length === 0) return;
    const last = turns.at(-1);
    // Block by block: a turn of many calls spread into push passes more arguments than the stack holds.
    if (last?.role === role) for (const b of content) last.content.push(b);
    else turns.push({ role, content });
  };
  for (const m of messages) {
    if (m.role === 'system' || m.role === 'developer') {
      for (const b of blocks(m.content ?? '')) if (b['type'] === 'text') system.push(b);
    } else if (m.role === 'tool') {
      // Ids in Anthropic's pattern (a conversation begun on another upstream may carry `functions.f:0`),
      // mapped the same way in the call and its result.
      push('user', [
        cached({ type: 'tool_result', tool_use_id: toolUseId(m.toolCallId ?? ''), content: blocks(m.content ?? '') }, m.cache),
      ]);
    } else if (m.role === 'assistant') {
      const content: unknown[] = blocks(m.content ?? '');
      // Thinking goes back only as Anthropic signed it; unsigned reasoning is left out.
      if (m.reasoning && m.reasoningSignature)
        content.unshift({ type: 'thinking', thinking: m.reasoning, signature: m.reasoningSignature });
      for (const c of m.toolCalls ?? [])
        content.push(cached({ type: 'tool_use', id: toolUseId(c.id), name: c.name, input: toolInput(c.arguments) }, c.cache));
      push('assistant', content);
    } else push('user', blocks(m.content ?? ''));
  }
  // Plain system text as one string; as blocks when the client placed a cache breakpoint in it.
  const marked = system.some((b) => b['cache_control'] !== undefined);
  return { system: system.length === 0 ? undefined : marked ? system : system.map((b) => b['text']).join('\n\n'), turns };
}

/**
 * Whether the last assistant turn calls tools without the thinking block it was made with. With
 * thinking enabled Anthropic refuses such a turn (a tool-use loop must carry its thinking), and a
 * chat-completions or Responses client has no Anthropic signature to send; that request then goes
 * without thinking rather than failing.
 */
function unsignedToolTurn(turns: ReadonlyArray<{ role: string; content: unknown[] }>): boolean {
  const last = turns.findLast((t) => t.role === 'assistant');
  if (!last) return false;
  const kind = (b: unknown) => (b as { type?: unknown }).type;
  return last.content.some((b) => kind(b) === 'tool_use') && kind(last.content[0]) !== 'thinking';
}

export function encodeMessagesRequest(req: GenerationRequest, upstreamModel: string): Record<string, unknown> {
  const s = req.sampling;
  const { system, turns } = wireTurns(req.messages);
  // The client's own budget where it gave one (a Messages client), else its effort's.
  const wanted =
    req.reasoningEffort === 'none'
      ? undefined
      : (req.reasoningBudget ?? (req.reasoningEffort !== undefined ? BUDGETS[req.reasoningEffort] : undefined));
  // Without a limit from the client, thinking gets its budget on top of the answer's.
  const maxTokens = req.maxOutputTokens ?? DEFAULT_MAX_TOKENS + (wanted ?? 0);
  // Thinking must leave room for the answer. The client's own budget is below its max_tokens (the
  // Messages decoder checks it, as Anthropic does); an effort's that does not fit takes at most half
  // of max_tokens, so the answer keeps the other half (it used to be left out, turning off thinking a
  // client had enabled; cut to max_tokens - 1, it left the answer one token). Below Anthropic's
  // minimum of 1,024 there is no thinking.
  const budget = wanted === undefined || req.reasoningBudget !== undefined || wanted < maxTokens ? wanted : Math.floor(maxTokens / 2);
  const body: Record<string, unknown> = { model: upstreamModel, max_tokens: maxTokens, messages: turns, stream: true };
  if (system !== undefined) body['system'] = system;
  // Anthropic's temperature range is 0–1; chat completions allow up to 2.
  if (s.temperature !== undefined) body['temperature'] = Math.min(1, s.temperature);
  if (s.topP !== undefined) body['top_p'] = s.topP;
  if (s.topK !== undefined) body['top_k'] = s.topK;
  if (s.stop?.length) body['stop_sequences'] = s.stop;
  if (req.tools?.length) {
    body['tools'] = req.tools.map((t) =>
      cached(
        {
          name: t.name,
          ...(t.description !== undefined && { description: t.description }),
          input_schema: t.parameters ?? { type: 'object' },
          // Only where the client set it: an upstream without strict tool use refuses the field.
          ...(t.strict !== undefined && { strict: t.strict }),
        },
        t.cache,
      ),
    );
    const choice = req.toolChoice;
    const disable = req.parallelToolCalls === false ? { disable_parallel_tool_use: true } : {};
    if (choice !== undefined || req.parallelToolCalls === false)
      body['tool_choice'] =
        choice === undefined || choice === 'auto'
          ? { type: 'auto', ...disable }
          : choice === 'required'
            ? { type: 'any', ...disable }
            : choice === 'none'
              ? { type: 'none' }
              : { type: 'tool', name: choice.name, ...disable };
  }
  const f = req.responseFormat;
  if (f?.type === 'json_schema') body['output_config'] = { format: { type: 'json_schema', schema: f.schema } };
  // Anthropic's API has no JSON mode, and its structured outputs take no schema of an arbitrary
  // object: sent without it, the answer was prose where the client was promised JSON (an outside
  // pass). Refused before anything is sent.
  if (f?.type === 'json_object') {
    throw new ApiError(
      'unsupported_parameter',
      'A json_object format is not supported on this model (its upstream, Anthropic’s API, has no JSON mode); send a json_schema format instead.',
    );
  }
  if (budget !== undefined && budget >= MIN_BUDGET && budget < maxTokens && !unsignedToolTurn(turns))
    body['thinking'] = { type: 'enabled', budget_tokens: budget };
  return body;
}

function finishFor(reason: unknown): FinishReason {
  switch (reason) {
    case 'max_tokens':
    case 'model_context_window_exceeded':
      return 'length';
    case 'tool_use':
      return 'tool_calls';
    case 'refusal':
      return 'content_filter';
    default:
      return 'stop';
  }
}

/** Anthropic's Messages stream events, read into canonical events. */
export class MessagesReader implements StreamReader {
  finish: FinishReason = 'stop';
  usage: ReportedUsage | undefined;
  /** The stop sequence Anthropic says ended the text. */
  stopSequence: string | undefined;
  /** Content block index → tool call index. */
  private readonly calls = new Map<number, number>();
  /**
   * A tool_use block's `input` as its start gave it, until an `input_json_delta` brings the
   * arguments instead: Anthropic streams them as deltas after an empty `input`, but an upstream may
   * give them whole in the start (they were lost).
   */
  private readonly startInput = new Map<number, string>();
  private input: unknown;
  private cacheRead: unknown;
  private cacheWrite: unknown;

  constructor(private readonly clean: Clean) {}

  private usageFrom(u: Record<string, unknown>): void {
    if (u['input_tokens'] !== undefined && u['input_tokens'] !== null) this.input = u['input_tokens'];
    if (u['cache_read_input_tokens'] !== undefined && u['cache_read_input_tokens'] !== null) this.cacheRead = u['cache_read_input_tokens'];
    if (u['cache_creation_input_tokens'] !== undefined && u['cache_creation_input_tokens'] !== null)
      this.cacheWrite = u['cache_creation_input_tokens'];
    const n = (v: unknown): number => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : 0);
    // Anthropic's input_tokens leaves out cached input: the canonical count includes it.
    const input = typeof this.input === 'number' ? this.input + n(this.cacheRead) + n(this.cacheWrite) : this.input;
    this.usage = reported(input, this.cacheRead ?? 0, u['output_tokens'] ?? this.usage?.output, undefined);
    const written = n(this.cacheWrite);
    if (written) this.usage.cacheWrite = written;
  }

  read(data: unknown, out: GenerationEvent[]): boolean {
    const ev = obj(data);
    if (!ev) throw new ApiError('upstream_error', 'The upstream sent an event that is not a JSON object.');
    const index = typeof ev['index'] === 'number' ? ev['index'] : -1;
    switch (ev['type']) {
      case 'message_start': {
        const u = obj(obj(ev['message'])?.['usage']);
        if (u) this.usageFrom(u);
        return false;
      }
      case 'content_block_start': {
        const block = obj(ev['content_block']);
        if (block?.['type'] === 'tool_use') {
          const call = this.calls.size;
          if (call >= MAX_TOOL_CALLS) throw new ApiError('upstream_error', 'The upstream sent too many tool calls.');
          this.calls.set(index, call);
          out.push({
            type: 'tool_call.start',
            index: call,
            id: this.clean(str(block['id']) || `call_${call}`),
            name: this.clean(str(block['name']) ?? ''),
          });
          const input = obj(block['input']);
          if (input && Object.keys(input).length > 0) this.startInput.set(index, JSON.stringify(input));
        } else if (block?.['type'] === 'text' && str(block['text'])) out.push({ type: 'text.delta', text: str(block['text'])! });
        return false;
      }
      case 'content_block_delta': {
        const d = obj(ev['delta']);
        switch (d?.['type']) {
          case 'text_delta': {
            const text = str(d['text']);
            if (text) out.push({ type: 'text.delta', text });
            break;
          }
          case 'thinking_delta': {
            const text = str(d['thinking']);
            if (text) out.push({ type: 'reasoning.delta', text });
            break;
          }
          case 'input_json_delta': {
            const call = this.calls.get(index);
            const partial = str(d['partial_json']);
            if (call !== undefined && partial) {
              this.startInput.delete(index);
              out.push({ type: 'tool_call.delta', index: call, arguments: partial });
            }
            break;
          }
          case 'signature_delta': {
            const signature = str(d['signature']);
            if (signature) out.push({ type: 'reasoning.signature', signature });
            break;
          }
          default:
          // citations_delta: nothing canonical carries it
        }
        return false;
      }
      case 'message_delta': {
        const d = obj(ev['delta']);
        if (d?.['stop_reason'] !== undefined && d['stop_reason'] !== null) this.finish = finishFor(d['stop_reason']);
        this.stopSequence = str(d?.['stop_sequence']);
        const u = obj(ev['usage']);
        if (u) this.usageFrom(u);
        return false;
      }
      case 'message_stop':
        return true;
      case 'error': {
        const error = obj(ev['error']);
        const failure = upstreamFailure(error?.['message'] ?? ev['message'], this.clean);
        // Anthropic's "overloaded" is a signal clients back off on differently: it stays one.
        if (error?.['type'] === 'overloaded_error') throw new ApiError('overloaded', failure.message);
        throw failure;
      }
      case 'content_block_stop': {
        const input = this.startInput.get(index);
        const call = this.calls.get(index);
        if (input !== undefined && call !== undefined) {
          this.startInput.delete(index);
          out.push({ type: 'tool_call.delta', index: call, arguments: input });
        }
        return false;
      }
      default:
        // ping
        return false;
    }
  }
}
