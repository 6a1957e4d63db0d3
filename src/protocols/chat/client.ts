import { ApiError } from '../../core/errors.js';
import type { FinishReason, GenerationEvent, GenerationRequest, Message } from '../../core/canonical.js';
import {
  MAX_TOOL_CALLS,
  obj,
  reported,
  str,
  upstreamFailure,
  wireTool,
  type Clean,
  type ReportedUsage,
  type StreamReader,
} from '../reader.js';

/**
 * The client side of chat completions, for upstream engines: a canonical request as the body an
 * OpenAI-compatible server takes, and its answer (a stream of chunks, or one completion) read back
 * into canonical events.
 */

/** The OpenAI chat-completions body an OpenAI-compatible server takes. */
function wireMessages(messages: readonly Message[]): Record<string, unknown>[] {
  return messages.map((m) => {
    const out: Record<string, unknown> = { role: m.role };
    out['content'] =
      typeof m.content === 'string' || m.content === null
        ? m.content
        : m.content.map((p) =>
            p.type === 'text'
              ? { type: 'text', text: p.text }
              : { type: 'image_url', image_url: { url: p.url, ...(p.detail && { detail: p.detail }) } },
          );
    if (m.name !== undefined) out['name'] = m.name;
    if (m.toolCallId !== undefined) out['tool_call_id'] = m.toolCallId;
    if (m.reasoning) out['reasoning_content'] = m.reasoning;
    if (m.toolCalls?.length) {
      out['tool_calls'] = m.toolCalls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
    }
    return out;
  });
}

/** Stop strings a chat-completions upstream is sent at most (OpenAI's bound). */
export const MAX_UPSTREAM_STOPS = 4;

export function encodeChatRequest(req: GenerationRequest, upstreamModel: string): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = { model: upstreamModel, messages: wireMessages(req.messages), stream: req.stream };
  if (req.stream) body['stream_options'] = { include_usage: true };
  if (s.temperature !== undefined) body['temperature'] = s.temperature;
  if (s.topP !== undefined) body['top_p'] = s.topP;
  if (s.seed !== undefined) body['seed'] = s.seed;
  if (s.presencePenalty !== undefined) body['presence_penalty'] = s.presencePenalty;
  if (s.frequencyPenalty !== undefined) body['frequency_penalty'] = s.frequencyPenalty;
  // OpenAI takes at most four; the engine matches the rest itself (a Messages request may send 16).
  if (s.stop?.length) body['stop'] = s.stop.length > MAX_UPSTREAM_STOPS ? s.stop.slice(0, MAX_UPSTREAM_STOPS) : s.stop;
  if (req.maxOutputTokens !== undefined) body['max_tokens'] = req.maxOutputTokens;
  if (req.tools?.length) {
    body['tools'] = req.tools.map((t) => ({ type: 'function', function: wireTool(t) }));
    if (req.toolChoice !== undefined) {
      body['tool_choice'] =
        typeof req.toolChoice === 'string' ? req.toolChoice : { type: 'function', function: { name: req.toolChoice.name } };
    }
    if (req.parallelToolCalls !== undefined) body['parallel_tool_calls'] = req.parallelToolCalls;
  }
  if (req.responseFormat && req.responseFormat.type !== 'text') {
    const f = req.responseFormat;
    body['response_format'] =
      f.type === 'json_schema'
        ? // A name is required upstream; a Responses client may leave it out (echoed to it as "").
          {
            type: 'json_schema',
            json_schema: { name: f.name || 'response', schema: f.schema, ...(f.strict !== undefined && { strict: f.strict }) },
          }
        : { type: 'json_object' };
  }
  if (req.reasoningEffort !== undefined) body['reasoning_effort'] = req.reasoningEffort;
  return body;
}

export const FINISH: Readonly<Record<string, FinishReason>> = {
  stop: 'stop',
  length: 'length',
  tool_calls: 'tool_calls',
  function_call: 'tool_calls',
  content_filter: 'content_filter',
};

/**
 * What every chat-completions chunk (or whole answer) is read for first: an error it carries is
 * thrown, its usage as reported, and its first choice.
 */
export function readChunk(
  chunk: Record<string, unknown>,
  clean: Clean,
): { usage: ReportedUsage | undefined; choice: Record<string, unknown> | undefined } {
  const error = chunk['error'];
  if (error !== undefined && error !== null) throw upstreamFailure(obj(error)?.['message'] ?? error, clean);
  const u = obj(chunk['usage']);
  const choices = chunk['choices'];
  return {
    usage: u
      ? reported(
          u['prompt_tokens'],
          obj(u['prompt_tokens_details'])?.['cached_tokens'],
          u['completion_tokens'],
          obj(u['completion_tokens_details'])?.['reasoning_tokens'],
        )
      : undefined,
    choice: Array.isArray(choices) ? obj(choices[0]) : undefined,
  };
}

/**
 * Why a whole (non-stream) answer is not a chat completion a client could read, or undefined when
 * it is one. Stream chunks may lack a choice (the usage chunk); a whole answer may not: without one
 * there is nothing to answer with, and a field of the wrong type breaks the client's own parser.
 * An answer carrying `error` is the upstream's failure, reported as such by the readers.
 */
export function answerProblem(answer: unknown): string | undefined {
  const a = obj(answer);
  if (!a) return 'it is not a JSON object';
  if (a['error'] !== undefined && a['error'] !== null) return undefined;
  const choices = a['choices'];
  if (!Array.isArray(choices) || choices.length === 0) return 'it has no choices';
  const choice = obj(choices[0]);
  const message = obj(choice?.['message']);
  if (!choice || !message) return 'its choice has no message';
  const content = message['content'];
  if (content !== undefined && content !== null && typeof content !== 'string' && !Array.isArray(content))
    return 'its content is neither text nor null';
  const refusal = message['refusal'];
  if (refusal !== undefined && refusal !== null && typeof refusal !== 'string') return 'its refusal is not text';
  const calls = message['tool_calls'];
  if (calls !== undefined && calls !== null && (!Array.isArray(calls) || !calls.every((c) => obj(obj(c)?.['function']))))
    return 'its tool calls are malformed';
  const finish = choice['finish_reason'];
  if (finish !== undefined && finish !== null && typeof finish !== 'string') return 'its finish reason is not text';
  return undefined;
}

/** Chat completions chunks (or a whole non-stream reply); tracks tool-call starts. Reads every field defensively. */
export class ChatReader implements StreamReader {
  finish: FinishReason = 'stop';
  /** A finish reason came: a stream that ends without [DONE] after it is complete all the same. */
  finished = false;
  usage: ReportedUsage | undefined;
  private readonly calls = new CallIndexes();

  constructor(private readonly clean: Clean) {}

  read(data: unknown, out: GenerationEvent[]): boolean {
    const chunk = obj(data);
    if (!chunk) throw new ApiError('upstream_error', 'The upstream sent a chunk that is not a JSON object.');
    const { usage, choice } = readChunk(chunk, this.clean);
    if (usage) this.usage = usage;
    if (!choice) return false;
    const delta = obj(choice['delta']);
    const d = delta ?? obj(choice['message']);
    if (d) {
      const reasoning = str(d['reasoning_content']) ?? str(d['reasoning']);
      if (reasoning) out.push({ type: 'reasoning.delta', text: reasoning });
      const content = str(d['content']);
      if (content) out.push({ type: 'text.delta', text: content });
      const refusal = str(d['refusal']);
      if (refusal) out.push({ type: 'refusal.delta', text: refusal });
      const calls = Array.isArray(d['tool_calls']) ? (d['tool_calls'] as unknown[]) : [];
      calls.forEach((raw, i) => {
        const c = obj(raw);
        if (!c) return;
        const index = c['index'] === undefined && !delta ? i : this.calls.of(c, i);
        if (typeof index !== 'number' || !Number.isInteger(index) || index < 0 || index >= MAX_TOOL_CALLS) {
          throw new ApiError('upstream_error', 'The upstream sent a malformed tool call.');
        }
        const fn = obj(c['function']);
        if (this.calls.start(index, str(c['id']))) {
          out.push({
            type: 'tool_call.start',
            index,
            id: this.clean(str(c['id']) || `call_${index}`),
            name: this.clean(str(fn?.['name']) ?? ''),
          });
        }
        const args = str(fn?.['arguments']);
        if (args) out.push({ type: 'tool_call.delta', index, arguments: args });
      });
    }
    const finish = str(choice['finish_reason']);
    if (finish) {
      this.finish = FINISH[finish] ?? 'stop';
      this.finished = true;
    }
    return false;
  }
}

/**
 * Which call each tool-call entry of a stream belongs to, for both lanes (the canonical lane's
 * reader above, and the fast lane's relay, which must take out exactly the calls the canonical lane
 * suppresses). An entry names its call by `index`; some OpenAI-compatible servers leave it out, and
 * then it is the call with its id where it names one already seen, a new call where it brings a new
 * id or a function name or is not the first entry of its delta (entries of one delta are different
 * calls), else the call started last.
 */
export class CallIndexes {
  private readonly started = new Set<number>();
  /** Each call's id, for deltas that name their call by id alone; and the call started last. */
  private readonly byId = new Map<string, number>();
  private last: number | undefined;

  /** The call of the `position`-th entry of a delta: its `index` as written where it has one. */
  of(c: Record<string, unknown>, position: number): unknown {
    if (c['index'] !== undefined) return c['index'];
    const id = str(c['id']);
    if (id) {
      const known = this.byId.get(id);
      if (known !== undefined) return known;
    }
    if (!id && !str(obj(c['function'])?.['name']) && position === 0 && this.last !== undefined) return this.last;
    let index = 0;
    while (this.started.has(index)) index++;
    return index;
  }

  /** Records an entry of call `index` (and its id); true where it starts the call. */
  start(index: number, id: string | undefined): boolean {
    if (id) this.byId.set(id, index);
    if (this.started.has(index)) return false;
    this.started.add(index);
    this.last = index;
    return true;
  }
}
