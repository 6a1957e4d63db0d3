import { StringDecoder } from 'node:string_decoder';
import { Pool, errors as undiciErrors, type Dispatcher } from 'undici';
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import type { Logger } from 'pino';
import { ApiError, ERRORS, isErrorCode } from '../../http/errors.js';
import type { FinishReason, GenerationEvent, GenerationRequest, Message, Usage } from '../../core/canonical.js';
import type { DeploymentTarget, Engine } from '../engine.js';
import { StopMatcher } from '../../core/stop-matcher.js';
import { AddressPolicy } from './address-policy.js';

/** The OpenAI chat-completions body an OpenAI-compatible server takes. */
function wireMessages(messages: readonly Message[]): Record<string, unknown>[] {
  return messages.map((m) => {
    const out: Record<string, unknown> = { role: m.role };
    out['content'] = typeof m.content === 'string' || m.content === null ? m.content
      : m.content.map((p) => (p.type === 'text' ? { type: 'text', text: p.text } : { type: 'image_url', image_url: { url: p.url, ...(p.detail && { detail: p.detail }) } }));
    if (m.name !== undefined) out['name'] = m.name;
    if (m.toolCallId !== undefined) out['tool_call_id'] = m.toolCallId;
    if (m.reasoning) out['reasoning_content'] = m.reasoning;
    if (m.toolCalls?.length) {
      out['tool_calls'] = m.toolCalls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
    }
    return out;
  });
}

export function wireBody(req: GenerationRequest, upstreamModel: string): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = { model: upstreamModel, messages: wireMessages(req.messages), stream: req.stream };
  if (req.stream) body['stream_options'] = { include_usage: true };
  if (s.temperature !== undefined) body['temperature'] = s.temperature;
  if (s.topP !== undefined) body['top_p'] = s.topP;
  if (s.seed !== undefined) body['seed'] = s.seed;
  if (s.presencePenalty !== undefined) body['presence_penalty'] = s.presencePenalty;
  if (s.frequencyPenalty !== undefined) body['frequency_penalty'] = s.frequencyPenalty;
  if (s.stop?.length) body['stop'] = s.stop;
  if (req.maxOutputTokens !== undefined) body['max_tokens'] = req.maxOutputTokens;
  if (req.tools?.length) {
    body['tools'] = req.tools.map((t) => ({ type: 'function', function: t }));
    if (req.toolChoice !== undefined) {
      body['tool_choice'] = typeof req.toolChoice === 'string' ? req.toolChoice : { type: 'function', function: { name: req.toolChoice.name } };
    }
    if (req.parallelToolCalls !== undefined) body['parallel_tool_calls'] = req.parallelToolCalls;
  }
  if (req.responseFormat && req.responseFormat.type !== 'text') {
    const f = req.responseFormat;
    body['response_format'] = f.type === 'json_schema'
      ? { type: 'json_schema', json_schema: { name: f.name, schema: f.schema, ...(f.strict !== undefined && { strict: f.strict }) } }
      : { type: 'json_object' };
  }
  if (req.reasoningEffort !== undefined) body['reasoning_effort'] = req.reasoningEffort;
  return body;
}

interface WireUsage {
  prompt_tokens?: number;
  completion_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
  completion_tokens_details?: { reasoning_tokens?: number } | null;
}
interface WireToolCallDelta {
  index?: number;
  id?: string;
  function?: { name?: string; arguments?: string };
}
interface WireDelta {
  content?: string | null;
  reasoning_content?: string | null;
  reasoning?: string | null;
  tool_calls?: WireToolCallDelta[];
}
interface WireChoice {
  delta?: WireDelta;
  message?: WireDelta;
  finish_reason?: string | null;
}
interface WireChunk {
  choices?: WireChoice[];
  usage?: WireUsage | null;
  error?: { message?: string; code?: string };
}

const FINISH: Record<string, FinishReason> = { stop: 'stop', length: 'length', tool_calls: 'tool_calls', function_call: 'tool_calls', content_filter: 'content_filter' };

function toUsage(u: WireUsage): Usage {
  return {
    input: u.prompt_tokens ?? 0,
    cached: u.prompt_tokens_details?.cached_tokens ?? 0,
    output: u.completion_tokens ?? 0,
    reasoning: u.completion_tokens_details?.reasoning_tokens ?? 0,
  };
}

/** What a protocol reader does with the upstream's stream: canonical events out, and when it ended. */
interface StreamReader {
  /** One parsed SSE data payload (or a whole non-stream reply). Returns true at the end of the stream. */
  read(data: unknown, out: GenerationEvent[]): boolean;
  readonly usage: Usage | undefined;
  readonly finish: FinishReason;
}

/** Chat completions chunks (or a whole non-stream reply); tracks tool-call starts. */
class ChatReader implements StreamReader {
  finish: FinishReason = 'stop';
  usage: Usage | undefined;
  private readonly started = new Set<number>();

  read(data: unknown, out: GenerationEvent[]): boolean {
    const chunk = data as WireChunk;
    if (chunk.error) throw new ApiError('upstream_error', `Upstream error: ${chunk.error.message ?? 'unknown'}`);
    if (chunk.usage) this.usage = toUsage(chunk.usage);
    const choice = chunk.choices?.[0];
    if (!choice) return false;
    const d = choice.delta ?? choice.message;
    if (d) {
      const reasoning = d.reasoning_content ?? d.reasoning;
      if (reasoning) out.push({ type: 'reasoning.delta', text: reasoning });
      if (d.content) out.push({ type: 'text.delta', text: d.content });
      d.tool_calls?.forEach((c, i) => {
        const index = c.index ?? i;
        if (!this.started.has(index)) {
          this.started.add(index);
          out.push({ type: 'tool_call.start', index, id: c.id ?? `call_${index}`, name: c.function?.name ?? '' });
        }
        if (c.function?.arguments) out.push({ type: 'tool_call.delta', index, arguments: c.function.arguments });
      });
    }
    if (choice.finish_reason) this.finish = FINISH[choice.finish_reason] ?? 'stop';
    return false;
  }
}

interface ResponsesEvent {
  type?: string;
  delta?: string;
  item_id?: string;
  item?: { id?: string; type?: string; call_id?: string; name?: string };
  response?: {
    status?: string;
    incomplete_details?: { reason?: string } | null;
    error?: { message?: string } | null;
    usage?: { input_tokens?: number; output_tokens?: number; input_tokens_details?: { cached_tokens?: number }; output_tokens_details?: { reasoning_tokens?: number } } | null;
  };
  message?: string;
}

/** Responses API stream events, for deployments that speak it natively. */
class ResponsesReader implements StreamReader {
  finish: FinishReason = 'stop';
  usage: Usage | undefined;
  private readonly calls = new Map<string, number>();
  private readonly rawReasoning = new Set<string>();

  read(data: unknown, out: GenerationEvent[]): boolean {
    const ev = data as ResponsesEvent;
    switch (ev.type) {
      case 'response.output_text.delta':
        if (ev.delta) out.push({ type: 'text.delta', text: ev.delta });
        return false;
      case 'response.reasoning_text.delta':
        this.rawReasoning.add(ev.item_id ?? '');
        if (ev.delta) out.push({ type: 'reasoning.delta', text: ev.delta });
        return false;
      case 'response.reasoning_summary_text.delta':
        // A summary only stands in for reasoning the upstream did not send in full.
        if (ev.delta && !this.rawReasoning.has(ev.item_id ?? '')) out.push({ type: 'reasoning.delta', text: ev.delta });
        return false;
      case 'response.output_item.added':
        if (ev.item?.type === 'function_call') {
          const index = this.calls.size;
          this.calls.set(ev.item.id ?? String(index), index);
          out.push({ type: 'tool_call.start', index, id: ev.item.call_id ?? `call_${index}`, name: ev.item.name ?? '' });
        }
        return false;
      case 'response.function_call_arguments.delta': {
        const index = this.calls.get(ev.item_id ?? '');
        if (index !== undefined && ev.delta) out.push({ type: 'tool_call.delta', index, arguments: ev.delta });
        return false;
      }
      case 'response.completed':
      case 'response.incomplete': {
        const r = ev.response ?? {};
        const u = r.usage;
        if (u) {
          this.usage = {
            input: u.input_tokens ?? 0, cached: u.input_tokens_details?.cached_tokens ?? 0,
            output: u.output_tokens ?? 0, reasoning: u.output_tokens_details?.reasoning_tokens ?? 0,
          };
        }
        if (ev.type === 'response.incomplete') this.finish = r.incomplete_details?.reason === 'content_filter' ? 'content_filter' : 'length';
        else this.finish = this.calls.size > 0 ? 'tool_calls' : 'stop';
        return true;
      }
      case 'response.failed':
        throw new ApiError('upstream_error', `Upstream error: ${ev.response?.error?.message ?? 'the response failed'}`);
      case 'error':
        throw new ApiError('upstream_error', `Upstream error: ${ev.message ?? 'unknown'}`);
      default:
        return false;
    }
  }
}

/** Canonical messages as Responses input items. */
function responsesInput(messages: readonly Message[]): Record<string, unknown>[] {
  const items: Record<string, unknown>[] = [];
  for (const m of messages) {
    if (m.role === 'tool') {
      items.push({ type: 'function_call_output', call_id: m.toolCallId ?? '', output: typeof m.content === 'string' ? m.content : '' });
      continue;
    }
    const content = typeof m.content === 'string' || m.content === null ? m.content
      : m.content.map((p) => (p.type === 'text'
        ? { type: m.role === 'assistant' ? 'output_text' : 'input_text', text: p.text }
        : { type: 'input_image', image_url: p.url, ...(p.detail && { detail: p.detail }) }));
    if (content !== null && content !== '') items.push({ role: m.role, content });
    for (const c of m.toolCalls ?? []) items.push({ type: 'function_call', call_id: c.id, name: c.name, arguments: c.arguments });
  }
  return items;
}

export function responsesBody(req: GenerationRequest, upstreamModel: string): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = { model: upstreamModel, input: responsesInput(req.messages), stream: true, store: false };
  if (s.temperature !== undefined) body['temperature'] = s.temperature;
  if (s.topP !== undefined) body['top_p'] = s.topP;
  if (req.maxOutputTokens !== undefined) body['max_output_tokens'] = req.maxOutputTokens;
  if (req.tools?.length) {
    body['tools'] = req.tools.map((t) => ({ type: 'function', ...t }));
    if (req.toolChoice !== undefined) body['tool_choice'] = typeof req.toolChoice === 'string' ? req.toolChoice : { type: 'function', name: req.toolChoice.name };
    if (req.parallelToolCalls !== undefined) body['parallel_tool_calls'] = req.parallelToolCalls;
  }
  const f = req.responseFormat;
  if (f && f.type !== 'text') {
    body['text'] = { format: f.type === 'json_schema' ? { type: 'json_schema', name: f.name, schema: f.schema, ...(f.strict !== undefined && { strict: f.strict }) } : { type: 'json_object' } };
  }
  if (req.reasoningEffort !== undefined) body['reasoning'] = { effort: req.reasoningEffort };
  return body;
}

/** Maps an upstream error reply into our registry; 5xx may fail over to another deployment. */
function upstreamError(status: number, text: string, where: string, retryAfter: string | undefined, secret: string | undefined): ApiError {
  // Some upstreams quote the key they were sent ("Incorrect API key provided: sk-…"): never pass it on.
  if (secret) text = text.replaceAll(secret, '[redacted]');
  let message = text.slice(0, 500);
  let code: unknown;
  try {
    const parsed = JSON.parse(text) as { error?: { message?: string; code?: string } | string; message?: string };
    if (typeof parsed.error === 'object' && parsed.error) {
      message = parsed.error.message ?? message;
      code = parsed.error.code;
    } else if (typeof parsed.error === 'string') {
      message = parsed.error;
    } else if (parsed.message) {
      message = parsed.message;
    }
  } catch {
    // not JSON: keep the text
  }
  // Another deployment may have room; this one is cooled for retry-after by the router.
  if (status === 429) return new ApiError('rate_limited', message, { headers: { 'retry-after': retryAfter ?? '1' }, failover: true });
  if (status === 413) return new ApiError('request_too_large', message);
  if (status === 400 || status === 422) {
    return isErrorCode(code) && ERRORS[code].status === 400 ? new ApiError(code, message) : new ApiError('invalid_request', message);
  }
  return new ApiError('upstream_error', `Upstream ${where} answered ${status}: ${message}`, { failover: status >= 500 });
}

export interface UpstreamOptions {
  connectTimeoutMs: number;
  /** Until the response head arrives (for a non-stream upstream: the whole generation). */
  firstByteTimeoutMs: number;
  /** Longest silence between two body chunks. */
  idleTimeoutMs: number;
  /** Applied to deployments stored in the database (`guarded` targets). */
  policy: AddressPolicy;
  /**
   * Connections per origin; null (the default) is no cap: over HTTP/1.1 each open stream holds a
   * connection, and a cap would queue streams behind long generations.
   */
  connectionsPerOrigin?: number | null;
}

export const UPSTREAM_DEFAULTS: UpstreamOptions = {
  connectTimeoutMs: 5_000, firstByteTimeoutMs: 300_000, idleTimeoutMs: 60_000, policy: new AddressPolicy(['*']),
};

/** A transport failure as one of our errors; `early` (nothing sent to the client yet) may fail over. */
function transportError(err: unknown, target: string, o: UpstreamOptions, early: boolean): ApiError {
  const code = (err as { code?: string }).code;
  if (code === 'UND_ERR_CONNECT_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream ${target} did not accept a connection within ${o.connectTimeoutMs} ms.`, { failover: early });
  }
  if (code === 'UND_ERR_HEADERS_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream ${target} sent nothing within ${o.firstByteTimeoutMs} ms.`, { failover: early });
  }
  if (code === 'UND_ERR_BODY_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream ${target} went silent for ${o.idleTimeoutMs} ms mid-answer.`, { failover: early });
  }
  return new ApiError(early ? 'upstream_unreachable' : 'upstream_error',
    early ? `The upstream ${target} could not be reached.` : `The upstream ${target} broke off mid-answer.`, { failover: early });
}

/**
 * Any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, Ollama, LM Studio, hosted APIs, or
 * another Switchyard). One undici Pool per origin; streams are parsed as SSE and re-emitted as
 * canonical events chunk by chunk, with nothing held back.
 */
export class UpstreamEngine implements Engine {
  readonly kind = 'upstream';
  private readonly pools = new Map<string, Pool>();
  private readonly o: UpstreamOptions;

  constructor(private readonly log: Logger, options: Partial<UpstreamOptions> = {}) {
    this.o = { ...UPSTREAM_DEFAULTS, ...options };
  }

  private readonly endpoints = new Map<string, { origin: string; path: string }>();

  /** Origin and path of an upstream endpoint, parsed once per deployment URL. */
  private endpoint(baseUrl: string, route: string): { origin: string; path: string } {
    const key = `${baseUrl} ${route}`;
    let e = this.endpoints.get(key);
    if (!e) {
      const url = new URL(`${baseUrl.replace(/\/+$/, '')}/${route}`);
      e = { origin: url.origin, path: url.pathname + url.search };
      this.endpoints.set(key, e);
    }
    return e;
  }

  /** Guarded targets get pools of their own whose every connection passes the address policy. */
  private pool(origin: string, guarded: boolean): Pool {
    const key = guarded ? `${origin} guarded` : origin;
    let p = this.pools.get(key);
    if (!p) {
      const connect = guarded ? this.o.policy.connector(this.o.connectTimeoutMs) : { timeout: this.o.connectTimeoutMs };
      p = new Pool(origin, { connections: this.o.connectionsPerOrigin ?? null, keepAliveTimeout: 30_000, connect });
      this.pools.set(key, p);
    }
    return p;
  }

  /** Health check: GET {baseUrl}/models. Any answer below 500 means the server is up. */
  async probe(target: DeploymentTarget): Promise<boolean> {
    if (target.engine !== 'upstream') return true;
    const url = this.endpoint(target.baseUrl, 'models');
    const headers: Record<string, string> = { accept: 'application/json' };
    if (target.apiKey) headers['authorization'] = `Bearer ${target.apiKey}`;
    try {
      const res = await this.pool(url.origin, target.guarded).request({
        path: url.path, method: 'GET', headers, headersTimeout: 5_000, bodyTimeout: 5_000,
      });
      await res.body.dump();
      return res.statusCode < 500;
    } catch {
      return false;
    }
  }

  async *generate(req: GenerationRequest, target: DeploymentTarget): AsyncGenerator<GenerationEvent> {
    if (target.engine !== 'upstream') throw new Error('upstream engine given a non-upstream target');
    // A deployment that speaks the Responses API gets it natively (always streamed); others get chat completions.
    const native = target.api === 'responses';
    const stream = native || req.stream;
    const url = this.endpoint(target.baseUrl, native ? 'responses' : 'chat/completions');
    const headers: Record<string, string> = { 'content-type': 'application/json', accept: stream ? 'text/event-stream' : 'application/json' };
    if (target.apiKey) headers['authorization'] = `Bearer ${target.apiKey}`;
    const body = native ? responsesBody(req, target.upstreamModel) : wireBody(req, target.upstreamModel);
    let res: Dispatcher.ResponseData;
    try {
      res = await this.pool(url.origin, target.guarded).request({
        path: url.path,
        method: 'POST',
        headers,
        body: JSON.stringify(body),
        signal: req.signal,
        headersTimeout: this.o.firstByteTimeoutMs,
        bodyTimeout: this.o.idleTimeoutMs,
      });
    } catch (err) {
      if (req.signal.aborted) throw new ApiError('invalid_request', 'The request was cancelled.');
      this.log.warn({ deployment: target.id, err: (err as Error).message }, 'upstream unreachable');
      throw transportError(err, target.id, this.o, true);
    }
    if (res.statusCode >= 400) {
      const text = await res.body.text().catch(() => '');
      const retryAfter = res.headers['retry-after'];
      throw upstreamError(res.statusCode, text, target.id, typeof retryAfter === 'string' ? retryAfter : undefined, target.apiKey);
    }

    const reader: StreamReader = native ? new ResponsesReader() : new ChatReader();
    const out: GenerationEvent[] = [];
    // The Responses API has no `stop`: it is applied here. The upstream is read to its end anyway,
    // so the usage it reports (and bills) stays exact.
    const stops = native && req.sampling.stop?.length ? new StopMatcher(req.sampling.stop) : undefined;
    let stopped = false;
    // Until an event has gone out, a failure may still move to another deployment.
    let early = true;
    const filter = (events: GenerationEvent[]): GenerationEvent[] => {
      if (events.length) early = false;
      if (!stops) return events;
      const kept: GenerationEvent[] = [];
      for (const ev of events) {
        if (stopped && (ev.type === 'text.delta' || ev.type.startsWith('tool_call'))) continue;
        if (ev.type !== 'text.delta') {
          kept.push(ev);
          continue;
        }
        const r = stops.push(ev.text);
        if (r.emit) kept.push({ type: 'text.delta', text: r.emit });
        stopped ||= r.stopped;
      }
      return kept;
    };
    try {
      if (!stream) {
        reader.read(await res.body.json(), out);
        yield* filter(out);
      } else {
        let done = false;
        let failure: unknown;
        const parser = createParser({
          onEvent: (ev: EventSourceMessage) => {
            if (done) return;
            if (ev.data === '[DONE]') {
              done = true;
              return;
            }
            try {
              done = reader.read(JSON.parse(ev.data), out);
            } catch (err) {
              failure = err instanceof ApiError ? err : new ApiError('upstream_error', 'The upstream sent a malformed stream event.');
              done = true;
            }
          },
        });
        // A UTF-8 character may be split across network chunks.
        const decoder = new StringDecoder('utf8');
        for await (const chunk of res.body as AsyncIterable<Buffer>) {
          parser.feed(decoder.write(chunk));
          if (out.length) {
            yield* filter(out);
            out.length = 0;
          }
          if (failure) throw failure;
        }
        if (failure) throw failure;
        if (!done) throw new ApiError('upstream_error', `The upstream ${target.id} ended its stream before it was complete.`, { failover: early });
      }
    } catch (err) {
      if (req.signal.aborted || err instanceof undiciErrors.RequestAbortedError) return;
      if (err instanceof ApiError) throw err;
      if (err instanceof SyntaxError) throw new ApiError('upstream_error', `The upstream ${target.id} sent a reply that is not JSON.`, { failover: early });
      this.log.warn({ deployment: target.id, err: (err as Error).message }, 'upstream broke off');
      throw transportError(err, target.id, this.o, early);
    } finally {
      // A body read to its end leaves the connection reusable; anything else must not.
      if (!res.body.readableEnded) res.body.destroy();
    }
    const rest = stops && !stopped ? stops.flush() : '';
    if (rest) yield { type: 'text.delta', text: rest };
    yield { type: 'usage', usage: reader.usage ?? { input: 0, cached: 0, output: 0, reasoning: 0 } };
    yield { type: 'finish', reason: stopped ? 'stop' : reader.finish };
  }

  async close(): Promise<void> {
    await Promise.all([...this.pools.values()].map((p) => p.close()));
    this.pools.clear();
  }
}
