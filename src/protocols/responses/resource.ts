import rfdc from 'rfdc';
import type { GenerationEvent, MessagePhase, Usage } from '../../core/canonical.js';
import { newId, nowSeconds } from '../../core/ids.js';
import type { Item, ReasoningItem } from '../../core/items.js';
import {
  TERMINAL,
  type Compaction,
  type NewResponse,
  type ResponseEvent,
  type ResponseFold,
  type ResponsesFormat,
  type ResponseStatus,
  type StoredResponse,
} from '../../core/responses/format.js';
import type { ResponsesRequest } from './request.js';
import { ApiError, isErrorCode } from '../../core/errors.js';

/**
 * The Responses API's response object and stream events: how canonical events become the object a
 * client reads and the `response.*` events it streams, in the documented order. The stored response
 * and the streamed one are the same fold, and replay re-renders the stored one through it, so they
 * cannot disagree.
 */

/** The Response object as served (wire doc, Responses section). */
export interface ResponseObject {
  id: string;
  object: 'response';
  created_at: number;
  status: ResponseStatus;
  completed_at: number | null;
  background: boolean;
  error: { code: string; message: string } | null;
  incomplete_details: { reason: string } | null;
  instructions: string | null;
  max_output_tokens: number | null;
  model: string;
  output: Item[];
  parallel_tool_calls: boolean;
  previous_response_id: string | null;
  conversation: { id: string } | null;
  reasoning: { effort: string | null; summary: string | null };
  store: boolean;
  temperature: number;
  text: { format: Record<string, unknown>; verbosity?: string };
  tool_choice: unknown;
  tools: unknown[];
  top_p: number;
  truncation: string;
  usage: Record<string, unknown> | null;
  user: string | null;
  metadata: Record<string, string>;
  // Open Responses (2026-04-24) requires these on every response object and event.
  presence_penalty: number;
  frequency_penalty: number;
  top_logprobs: number;
  max_tool_calls: number | null;
  service_tier: string;
  safety_identifier: string | null;
  prompt_cache_key: string | null;
}

/** What a response stored before the Open Responses fields existed reads as. */
const OPEN_RESPONSES_DEFAULTS = {
  presence_penalty: 0,
  frequency_penalty: 0,
  top_logprobs: 0,
  max_tool_calls: null,
  service_tier: 'default',
  safety_identifier: null,
  prompt_cache_key: null,
} satisfies Partial<ResponseObject>;

const parseStored = (stored: string): ResponseObject => {
  const r = JSON.parse(stored) as Record<string, unknown>;
  // Missing fields (a row stored before they were added) go at the end: spread first, they put
  // `presence_penalty` ahead of `id` in every stored response a client read.
  for (const [k, v] of Object.entries(OPEN_RESPONSES_DEFAULTS)) if (!Object.hasOwn(r, k)) r[k] = v;
  return r as unknown as ResponseObject;
};

/** One server-sent event, before its sequence number is given. */
export type WireEvent = { type: string } & Record<string, unknown>;

export interface BuilderOptions {
  /** `reasoning.summary` of the request: null means no summary. */
  summary: string | null;
  /** Seals reasoning into `encrypted_content`, when the request included it. */
  seal?: ((text: string) => string) | undefined;
  /** `max_tool_calls`: calls past it are left out of the response. */
  maxToolCalls?: number | null | undefined;
  /** Ids for the output items in order; replay passes the stored ones. */
  idFor?: (kind: 'msg' | 'rs' | 'fc', index: number) => string;
  /** `completed_at` of a replayed response (its stored time); a live one finishes now. */
  completedAt?: number;
}

/**
 * How the summary is produced: there is no separate summarising model, so `auto` and `detailed`
 * give the reasoning text itself, and `concise` its first sentence (at most 200 characters).
 */
export function summarise(text: string, mode: string): string {
  if (mode !== 'concise') return text;
  const first = /^[\s\S]*?[.!?](\s|$)/.exec(text)?.[0] ?? text;
  return first.length > 200 ? `${first.slice(0, 199)}…` : first.trim();
}

export function renderResponseUsage(u: Usage): Record<string, unknown> {
  const out: Record<string, unknown> = {
    input_tokens: u.input,
    input_tokens_details: { cached_tokens: u.cached },
    output_tokens: u.output,
    output_tokens_details: { reasoning_tokens: u.reasoning },
    total_tokens: u.input + u.output,
  };
  if (u.cost !== undefined) out['cost'] = u.cost;
  // Also an extension: the counts are Switchyard's estimate (the engine reported none, or nonsense).
  if (u.estimated) out['estimated'] = true;
  return out;
}

/** An assistant message's content part: its text, or the model's refusal. */
type MessagePart = { type: 'output_text'; text: string; annotations: [] } | { type: 'refusal'; refusal: string };

type Open =
  /** `text` is the open part's (of type `part`); `parts` are those before it, done. */
  | { kind: 'message'; index: number; id: string; text: string; part: MessagePart['type']; parts: MessagePart[]; phase?: MessagePhase }
  | { kind: 'reasoning'; index: number; id: string; text: string }
  | { kind: 'function_call'; index: number; id: string; callId: string; name: string; args: string };

/**
 * A deep copy of response data (plain objects, arrays, primitives; no cycles). rfdc rather than
 * `structuredClone`, which serializes and deserializes through V8's message format: about 14 µs
 * for a response object against rfdc's 3, and a stored response copies several (bench/README.md,
 * "Instructions by function").
 */
const copy: <T>(v: T) => T = rfdc();

/** Folds canonical events into a Response and renders the Responses stream events on the way. */
export class ResponseBuilder implements ResponseFold {
  private open: Open | undefined;
  private usage: Usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
  private ids = 0;
  private toolCalls = 0;
  /** The label the model gave its next (or current) message. */
  private phase: MessagePhase | undefined;
  /** `response.created` has been rendered. */
  private created = false;

  constructor(
    readonly response: ResponseObject,
    private readonly opts: BuilderOptions,
  ) {}

  get resource(): Readonly<Record<string, unknown>> {
    return this.response as unknown as Record<string, unknown>;
  }

  get status(): ResponseStatus {
    return this.response.status;
  }

  get output(): readonly Item[] {
    return this.response.output;
  }

  /**
   * A background response waiting to start: `response.created` (status `queued`; every stream
   * begins with it, and the openai SDK's stream helper takes its snapshot from it), then
   * `response.queued`.
   */
  queued(): WireEvent[] {
    this.response.status = 'queued';
    this.created = true;
    // One snapshot for both: events are never changed once made (they are rendered as they are).
    const snapshot = copy(this.response);
    return [
      { type: 'response.created', response: snapshot },
      { type: 'response.queued', response: snapshot },
    ];
  }

  private id(kind: 'msg' | 'rs' | 'fc'): string {
    return this.opts.idFor ? this.opts.idFor(kind, this.ids++) : newId(kind);
  }

  /** `response.created` (unless `queued` sent it) and `response.in_progress`. */
  start(): WireEvent[] {
    this.response.status = 'in_progress';
    const snapshot = copy(this.response);
    const progress: WireEvent = { type: 'response.in_progress', response: snapshot };
    if (this.created) return [progress];
    this.created = true;
    return [{ type: 'response.created', response: snapshot }, progress];
  }

  apply(ev: GenerationEvent): WireEvent[] {
    const out: WireEvent[] = [];
    switch (ev.type) {
      case 'reasoning.delta': {
        const o = this.ensure('reasoning', out);
        o.text += ev.text;
        // OpenAI's name: Open Responses says `response.reasoning.delta`, which the openai SDK's stream
        // helper rejects as an unknown event (docs/decisions.md, "Reasoning stream events").
        out.push({ type: 'response.reasoning_text.delta', item_id: o.id, output_index: o.index, content_index: 0, delta: ev.text });
        break;
      }
      case 'text.delta': {
        const o = this.message('output_text', out);
        o.text += ev.text;
        out.push({
          type: 'response.output_text.delta',
          item_id: o.id,
          output_index: o.index,
          content_index: o.parts.length,
          delta: ev.text,
          logprobs: [],
        });
        break;
      }
      case 'refusal.delta': {
        const o = this.message('refusal', out);
        o.text += ev.text;
        out.push({ type: 'response.refusal.delta', item_id: o.id, output_index: o.index, content_index: o.parts.length, delta: ev.text });
        break;
      }
      case 'tool_call.start': {
        this.close(out, 'completed');
        // Over max_tool_calls: the call and its arguments (which find no open call) are dropped.
        if (this.opts.maxToolCalls != null && this.toolCalls >= this.opts.maxToolCalls) break;
        this.toolCalls++;
        const index = this.response.output.length;
        const id = this.id('fc');
        const item: Item = { id, type: 'function_call', status: 'in_progress', arguments: '', call_id: ev.id, name: ev.name };
        this.response.output.push(item);
        this.open = { kind: 'function_call', index, id, callId: ev.id, name: ev.name, args: '' };
        out.push({ type: 'response.output_item.added', output_index: index, item: copy(item) });
        break;
      }
      case 'tool_call.delta': {
        if (this.open?.kind !== 'function_call') break;
        this.open.args += ev.arguments;
        out.push({
          type: 'response.function_call_arguments.delta',
          item_id: this.open.id,
          output_index: this.open.index,
          delta: ev.arguments,
        });
        break;
      }
      case 'usage':
        this.usage = ev.usage;
        break;
      case 'reasoning.signature':
        // Only the Messages API carries an upstream's signature back to the client.
        break;
      case 'message.phase':
        // A label starts the next message; one that already has text is finished (it had its own).
        if (this.open?.kind === 'message' && this.open.text === '' && this.open.parts.length === 0) this.open.phase = ev.phase;
        else {
          if (this.open?.kind === 'message') this.close(out, 'completed');
          this.phase = ev.phase;
        }
        break;
      case 'finish': {
        const incomplete = ev.reason === 'length' || ev.reason === 'content_filter';
        this.close(out, incomplete ? 'incomplete' : 'completed');
        const r = this.response;
        r.usage = renderResponseUsage(this.usage);
        // Only a completed response has completed_at (Open Responses: "if it was completed"; openai's
        // types: "only present when the status is completed"): an incomplete one has null, as a failed one.
        if (!incomplete) r.completed_at = this.opts.completedAt ?? nowSeconds();
        if (incomplete) {
          r.status = 'incomplete';
          r.incomplete_details = { reason: ev.reason === 'length' ? 'max_output_tokens' : 'content_filter' };
          out.push({ type: 'response.incomplete', response: copy(r) });
        } else {
          r.status = 'completed';
          out.push({ type: 'response.completed', response: copy(r) });
        }
        break;
      }
    }
    return out;
  }

  /**
   * The engine failed: an `error` event, then `response.failed` with `error: {code, message}`
   * (Open Responses: "Any error incurred while streaming will be followed by a response.failed
   * event"; docs/decisions.md, "A stream that fails"). Clients that stop at the error (the openai
   * SDK throws there, the AI SDK reports it) and clients that read the terminal event both see it.
   */
  fail(code: string, message: string): WireEvent[] {
    const out: WireEvent[] = [];
    this.close(out, 'incomplete');
    const r = this.response;
    r.status = 'failed';
    r.error = { code, message };
    r.usage = renderResponseUsage(this.usage);
    const type = isErrorCode(code) ? new ApiError(code, message).type : 'server_error';
    out.push({ type: 'error', error: { type, code, message, param: null } });
    out.push({ type: 'response.failed', response: copy(r) });
    return out;
  }

  /**
   * Cancelled: the terminal event is `response.incomplete` carrying status `cancelled` (the stream
   * has no event of its own for a cancellation; this one means "ended before the model finished").
   */
  cancel(): WireEvent[] {
    const out: WireEvent[] = [];
    this.close(out, 'incomplete');
    const r = this.response;
    r.status = 'cancelled';
    r.usage = renderResponseUsage(this.usage);
    out.push({ type: 'response.incomplete', response: copy(r) });
    return out;
  }

  /** The open reasoning item, opened (after closing whatever else was open) where there is none. */
  private ensure(kind: 'reasoning', out: WireEvent[]): Extract<Open, { kind: 'reasoning' }> {
    if (this.open?.kind === kind) return this.open;
    this.close(out, 'completed');
    const index = this.response.output.length;
    const id = this.id('rs');
    // Every item has its status from the first event that shows it (Open Responses, "Items").
    const item: Item = { id, type: 'reasoning', summary: [], content: [], status: 'in_progress' };
    this.response.output.push(item);
    out.push({ type: 'response.output_item.added', output_index: index, item: copy(item) });
    const part = { type: 'reasoning_text', text: '' };
    out.push({ type: 'response.content_part.added', item_id: id, output_index: index, content_index: 0, part });
    const open: Extract<Open, { kind: 'reasoning' }> = { kind, index, id, text: '' };
    this.open = open;
    return open;
  }

  /**
   * The open message with an open part of type `type`: a message is opened where none is, and a
   * part of the other type is done first (text and a refusal are parts of one message, as OpenAI's).
   */
  private message(type: MessagePart['type'], out: WireEvent[]): Extract<Open, { kind: 'message' }> {
    let o = this.open;
    if (o?.kind !== 'message') {
      this.close(out, 'completed');
      const index = this.response.output.length;
      const id = this.id('msg');
      const phase = this.phase;
      this.phase = undefined;
      const item: Item = { id, type: 'message', status: 'in_progress', role: 'assistant', content: [], ...(phase && { phase }) };
      this.response.output.push(item);
      out.push({ type: 'response.output_item.added', output_index: index, item: copy(item) });
      o = { kind: 'message', index, id, text: '', part: type, parts: [], ...(phase && { phase }) };
      this.open = o;
    } else if (o.part === type) return o;
    else {
      o.parts.push(this.partDone(o, out));
      o.part = type;
      o.text = '';
    }
    const part = type === 'output_text' ? { type, text: '', annotations: [] } : { type, refusal: '' };
    out.push({ type: 'response.content_part.added', item_id: o.id, output_index: o.index, content_index: o.parts.length, part });
    return o;
  }

  /** The done events of a message's open part, and the part. */
  private partDone(o: Extract<Open, { kind: 'message' }>, out: WireEvent[]): MessagePart {
    const base = { item_id: o.id, output_index: o.index, content_index: o.parts.length };
    let part: MessagePart;
    if (o.part === 'output_text') {
      part = { type: 'output_text', text: o.text, annotations: [] };
      out.push({ type: 'response.output_text.done', ...base, text: o.text, logprobs: [] });
    } else {
      part = { type: 'refusal', refusal: o.text };
      out.push({ type: 'response.refusal.done', ...base, refusal: o.text });
    }
    out.push({ type: 'response.content_part.done', ...base, part });
    return part;
  }

  private close(out: WireEvent[], status: 'completed' | 'incomplete'): void {
    const o = this.open;
    if (!o) return;
    this.open = undefined;
    const base = { item_id: o.id, output_index: o.index };
    let item: Item;
    if (o.kind === 'message') {
      const content = [...o.parts, this.partDone(o, out)];
      item = { id: o.id, type: 'message', status, role: 'assistant', content, ...(o.phase && { phase: o.phase }) };
    } else if (o.kind === 'reasoning') {
      const part = { type: 'reasoning_text' as const, text: o.text };
      out.push({ type: 'response.reasoning_text.done', ...base, content_index: 0, text: o.text });
      out.push({ type: 'response.content_part.done', ...base, content_index: 0, part });
      const summary: Array<{ type: 'summary_text'; text: string }> = [];
      if (this.opts.summary) {
        const text = summarise(o.text, this.opts.summary);
        out.push({ type: 'response.reasoning_summary_part.added', ...base, summary_index: 0, part: { type: 'summary_text', text: '' } });
        out.push({ type: 'response.reasoning_summary_text.delta', ...base, summary_index: 0, delta: text });
        out.push({ type: 'response.reasoning_summary_text.done', ...base, summary_index: 0, text });
        out.push({ type: 'response.reasoning_summary_part.done', ...base, summary_index: 0, part: { type: 'summary_text', text } });
        summary.push({ type: 'summary_text', text });
      }
      item = { id: o.id, type: 'reasoning', summary, content: [part], status };
      if (this.opts.seal) item.encrypted_content = this.opts.seal(o.text);
    } else {
      out.push({ type: 'response.function_call_arguments.done', ...base, name: o.name, arguments: o.args });
      item = { id: o.id, type: 'function_call', status, arguments: o.args, call_id: o.callId, name: o.name };
    }
    this.response.output[o.index] = item;
    out.push({ type: 'response.output_item.done', output_index: o.index, item: copy(item) });
  }
}

/** Canonical events that re-create a stored response's output, for replay. */
export function eventsOf(r: ResponseObject): GenerationEvent[] {
  const events: GenerationEvent[] = [];
  let call = 0;
  for (const item of r.output) {
    if (item.type === 'reasoning') events.push({ type: 'reasoning.delta', text: (item.content ?? []).map((c) => c.text).join('') });
    else if (item.type === 'message') {
      if (item.phase) events.push({ type: 'message.phase', phase: item.phase });
      // Each part as it came: text and refusal parts alternate as the events that made them did.
      for (const c of item.content) {
        if (c.type === 'refusal') events.push({ type: 'refusal.delta', text: c.refusal });
        else if (c.type === 'output_text' || c.type === 'input_text') events.push({ type: 'text.delta', text: c.text });
      }
      if (item.content.length === 0) events.push({ type: 'text.delta', text: '' });
    } else if (item.type === 'function_call') {
      events.push({ type: 'tool_call.start', index: call, id: item.call_id, name: item.name });
      events.push({ type: 'tool_call.delta', index: call++, arguments: item.arguments });
    }
  }
  const u = r.usage as {
    input_tokens?: number;
    input_tokens_details?: { cached_tokens?: number };
    output_tokens?: number;
    output_tokens_details?: { reasoning_tokens?: number };
    cost?: number | null;
  } | null;
  events.push({
    type: 'usage',
    usage: {
      input: u?.input_tokens ?? 0,
      cached: u?.input_tokens_details?.cached_tokens ?? 0,
      output: u?.output_tokens ?? 0,
      reasoning: u?.output_tokens_details?.reasoning_tokens ?? 0,
      ...(u && 'cost' in u && { cost: u.cost ?? null }),
    },
  });
  return events;
}

const TERMINAL_EVENTS = new Set(['response.completed', 'response.incomplete', 'response.failed']);

/** The response object for a new request: what core decided, and the request's own fields echoed. */
/**
 * `text.format` as the response object carries it: Open Responses' JsonSchemaResponseFormat has
 * `description` and `strict` always present and `schema` null (the schema is not echoed back).
 */
function echoFormat(f: NonNullable<ResponsesRequest['text']>['format']): Record<string, unknown> {
  if (!f || f.type === 'text') return { type: 'text' };
  if (f.type === 'json_object') return { type: 'json_object' };
  return { type: 'json_schema', name: f.name ?? '', description: f.description ?? null, schema: null, strict: f.strict ?? false };
}

function newResource(r: NewResponse<ResponsesRequest>): ResponseObject {
  const body = r.echo;
  return {
    id: r.id,
    object: 'response',
    created_at: r.createdAt,
    status: r.background ? 'queued' : 'in_progress',
    completed_at: null,
    background: r.background,
    error: null,
    incomplete_details: null,
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    model: r.model,
    output: [],
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    previous_response_id: r.previousResponseId,
    conversation: r.conversationId === null ? null : { id: r.conversationId },
    reasoning: { effort: body.reasoning?.effort ?? null, summary: body.reasoning?.summary ?? null },
    store: r.store,
    temperature: body.temperature ?? 1,
    text: { format: echoFormat(body.text?.format), ...(body.text?.verbosity != null && { verbosity: body.text.verbosity }) },
    // AllowedToolChoice requires its mode: the default one the request left out is echoed.
    tool_choice:
      typeof body.tool_choice === 'object' && body.tool_choice?.type === 'allowed_tools'
        ? { mode: 'auto', ...body.tool_choice }
        : (body.tool_choice ?? 'auto'),
    tools: (body.tools ?? []).map((t) => ({
      type: 'function',
      name: t.name,
      description: t.description ?? null,
      parameters: t.parameters ?? null,
      strict: t.strict ?? true,
    })),
    top_p: body.top_p ?? 1,
    truncation: body.truncation ?? 'disabled',
    usage: null,
    user: body.user ?? null,
    metadata: body.metadata ?? {},
    presence_penalty: body.presence_penalty ?? 0,
    frequency_penalty: body.frequency_penalty ?? 0,
    top_logprobs: body.top_logprobs ?? 0,
    max_tool_calls: body.max_tool_calls ?? null,
    // One tier here, whatever was asked for: the answer says which was used.
    service_tier: 'default',
    safety_identifier: body.safety_identifier ?? null,
    prompt_cache_key: body.prompt_cache_key ?? null,
  };
}

/** The answer of `POST /v1/responses/input_tokens`. */
export const inputTokensObject = (tokens: number): Record<string, unknown> => ({ object: 'response.input_tokens', input_tokens: tokens });

/** The Responses wire format, as core's lifecycle uses it (see core/responses/format.ts). */
export const responsesFormat: ResponsesFormat<ResponsesRequest> = {
  open(r) {
    // `parallel_tool_calls: false` is one call a turn, and a response is one turn: calls past the
    // first that an upstream makes anyway are left out as those past `max_tool_calls` are.
    const max = r.echo.max_tool_calls;
    const maxToolCalls = r.echo.parallel_tool_calls === false ? Math.min(1, max ?? 1) : max;
    return new ResponseBuilder(newResource(r), { summary: r.summary, seal: r.seal, maxToolCalls });
  },

  read(stored): StoredResponse {
    const resource = parseStored(stored);
    return { resource: resource as unknown as Record<string, unknown>, status: resource.status, output: resource.output };
  },

  serialize(fold) {
    return JSON.stringify(fold.resource);
  },

  replay(stored) {
    const r = parseStored(stored);
    const ids = r.output.map((o) => o.id);
    const sealed = r.output.filter((o): o is ReasoningItem => o.type === 'reasoning').map((o) => o.encrypted_content);
    let sealIndex = 0;
    const base: ResponseObject = {
      ...copy(r),
      status: 'in_progress',
      output: [],
      usage: null,
      completed_at: null,
      error: null,
      incomplete_details: null,
    };
    const builder = new ResponseBuilder(base, {
      summary: r.reasoning.summary,
      idFor: (_kind, i) => ids[i] ?? newId('item'),
      // A replay says when the response finished, not when it is replayed.
      ...(r.completed_at !== null && { completedAt: r.completed_at }),
      ...(sealed.some(Boolean) && { seal: () => sealed[sealIndex++] ?? '' }),
    });
    // A background response's stream began queued, as its live one did, and went on to
    // `response.in_progress` only once its engine's first event came. One cancelled or failed while
    // it waited (or left queued by a crash) has no output and no tokens counted, since engines count
    // the prompt once they take a request; one whose upstream took it and failed before any output
    // (a timeout, a stream cut short) has input counted but failed with no output. Read from what
    // is stored, so a run a crash cut off after it started, stored without usage, replays without it.
    const count = (k: string) => (r.usage === null ? 0 : Number(r.usage[k] ?? 0));
    const started =
      !r.background || r.output.length > 0 || count('output_tokens') > 0 || (r.status !== 'failed' && count('input_tokens') > 0);
    const events: WireEvent[] = [...(r.background ? builder.queued() : []), ...(started ? builder.start() : [])];
    for (const ev of eventsOf(r)) events.push(...builder.apply(ev));
    if (r.status === 'failed') events.push(...builder.fail(r.error?.code ?? 'server_error', r.error?.message ?? ''));
    else if (r.status === 'cancelled') events.push(...builder.cancel());
    else if (r.status === 'incomplete')
      events.push(
        ...builder.apply({ type: 'finish', reason: r.incomplete_details?.reason === 'content_filter' ? 'content_filter' : 'length' }),
      );
    else if (r.status === 'completed') events.push(...builder.apply({ type: 'finish', reason: 'stop' }));
    const finished = TERMINAL.includes(r.status);
    // The terminal event carries the response exactly as stored (and as GET serves it): its usage
    // with cost and the estimate flag, or null where a restart failed it before any was counted.
    const last = events.at(-1);
    if (finished && last !== undefined && TERMINAL_EVENTS.has(last.type)) events[events.length - 1] = { ...last, response: copy(r) };
    return { events, finished };
  },

  end(stored, status, error, usage) {
    const r = parseStored(stored);
    r.status = status;
    // Only a completed response has completed_at (a run that finished is then stored cancelled: see ResponseService).
    r.completed_at = null;
    if (error) r.error = error;
    // The figures the ledger bills, as a failed or cancelled response's usage always is.
    if (usage && (r.usage === null || r.usage === undefined)) r.usage = renderResponseUsage(usage) as ResponseObject['usage'];
    return JSON.stringify(r);
  },

  isTerminal(ev: ResponseEvent) {
    // The error event before response.failed is where the openai SDK and the AI SDK stop: a client
    // that then retrieves the response must find it failed and billed, as after the terminal event.
    return TERMINAL_EVENTS.has(ev.type) || ev.type === 'error';
  },
};

/** The answer of `POST /v1/responses/compact` (Open Responses' CompactResource). */
export const compactionObject = (c: Compaction): Record<string, unknown> => ({
  id: c.id,
  object: 'response.compaction',
  created_at: c.createdAt,
  output: c.output,
  usage: renderResponseUsage(c.usage),
});
