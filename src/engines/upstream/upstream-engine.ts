import { StringDecoder } from 'node:string_decoder';
import { Pool, buildConnector, errors as undiciErrors } from 'undici';
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import type { Logger } from 'pino';
import { ApiError, CancelledError, ERRORS, isErrorCode } from '../../core/errors.js';
import {
  callableTools,
  type FinishReason,
  type GenerationEvent,
  type GenerationRequest,
  type Usage,
  type UsageTally,
} from '../../core/canonical.js';
import { MAX_JSON_DEPTH, obj, str, textNestsDeeper, type ReportedUsage, type StreamReader } from '../../protocols/reader.js';
import { ChatReader, MAX_UPSTREAM_STOPS, answerProblem, encodeChatRequest } from '../../protocols/chat/client.js';
import { ChatRelay } from '../../protocols/chat/relay.js';
import { SseInput } from '../../protocols/sse-input.js';
import { ResponsesReader, encodeResponsesRequest } from '../../protocols/responses/client.js';
import { MessagesReader, encodeMessagesRequest } from '../../protocols/messages/client.js';
import { estimateInputTokens, OutputLimit } from '../../core/estimate.js';
import { Scrubber, type StreamScrubber } from './scrubber.js';
import type { Attempt, DeploymentTarget, Engine } from '../engine.js';
import { StopMatcher } from '../../core/stop-matcher.js';
import { Cancellation, onAbort, type CancelSignal } from '../../core/cancellation.js';
import { AddressPolicy } from './address-policy.js';
import { TooLarge, UpstreamCall } from './upstream-call.js';
import { withoutReconnectAfterAbort } from './connector.js';
import { CallOrder } from './call-order.js';

type UpstreamTarget = Extract<DeploymentTarget, { engine: 'upstream' }>;

/** A request the upstream took: its answer (head read, body not yet), and what reading it needs. */
interface Sent {
  res: UpstreamCall;
  headersTimeout: number;
  /** Removes the cancel listener of a timed call; called once the answer is read. */
  forget: () => void;
  /** The answer is a stream (asked for, the upstream's API always streams, or it streamed unasked). */
  stream: boolean;
}

const isEventStream = (type: string | string[] | undefined): boolean =>
  typeof type === 'string' && type.trimStart().toLowerCase().startsWith('text/event-stream');

/** A generation that fails at its first step, as the async generators fail. */
async function* refuse(err: Error): AsyncGenerator<GenerationEvent> {
  throw err;
}

/** Anthropic's API version header: the Messages wire this client speaks. */
const ANTHROPIC_VERSION = '2023-06-01';

/** How a deployment's key is sent: `x-api-key` and a version for Anthropic, a Bearer token for the rest (written into `headers`). */
function addAuth(headers: Record<string, string>, target: UpstreamTarget): Record<string, string> {
  if (target.api === 'anthropic') {
    headers['anthropic-version'] = ANTHROPIC_VERSION;
    if (target.apiKey) headers['x-api-key'] = target.apiKey;
  } else if (target.apiKey) headers['authorization'] = `Bearer ${target.apiKey}`;
  return headers;
}

/** retry-after as seconds or an HTTP date; capped at a minute so one answer cannot park a deployment. */
export function retryAfterMs(value: string | undefined): number {
  if (!value) return 1000;
  const seconds = Number(value);
  const ms = Number.isFinite(seconds) ? seconds * 1000 : Date.parse(value) - Date.now();
  return Math.min(60_000, Math.max(0, Number.isFinite(ms) ? ms : 1000));
}

/** Maps an upstream error reply into our registry; 5xx may fail over to another deployment. */
function upstreamError(status: number, text: string, retryAfter: string | undefined, scrub: Scrubber): ApiError {
  let message = text;
  let code: unknown;
  try {
    const parsed = obj(JSON.parse(text));
    const error = parsed?.['error'];
    if (obj(error)) {
      message = str(obj(error)!['message']) ?? message;
      code = obj(error)!['code'];
    } else if (typeof error === 'string') {
      message = error;
    } else if (typeof parsed?.['message'] === 'string') {
      message = parsed['message'];
    }
  } catch {
    // not JSON: keep the text
  }
  // Some upstreams quote the key they were sent ("Incorrect API key provided: sk-…"), possibly escaped: never pass it on.
  // Scrubbed whole, then shortened (shortened first, a key cut at the end was no longer matched).
  message = scrub.text(message).slice(0, 500);
  // Another deployment may have room; this one is cooled for retry-after by the router.
  if (status === 429) return new ApiError('rate_limited', message, { retryAfterMs: retryAfterMs(retryAfter), failover: true });
  if (status === 413) return new ApiError('request_too_large', message);
  // Anthropic's overloaded answer (529): another deployment may have room, and the client is told
  // "overloaded" (Messages: 529 overloaded_error), not a generic upstream failure.
  if (status === 529) return new ApiError('overloaded', message, { retryAfterMs: retryAfterMs(retryAfter), failover: true });
  if (status === 400 || status === 422) {
    return isErrorCode(code) && ERRORS[code].status === 400 ? new ApiError(code, message) : new ApiError('invalid_request', message);
  }
  // The deployment's own key was refused: the upstream's words ("You didn't provide an API key")
  // would read as if the client's key were at fault. Another deployment may have a working key.
  if (status === 401 || status === 403)
    return new ApiError(
      'upstream_error',
      `The upstream refused this gateway's credentials for the model (${status}); an operator must fix the deployment's key.`,
      { failover: true },
    );
  // Not naming the deployment: its id is internal topology (the router's log names it).
  return new ApiError('upstream_error', `The upstream answered ${status}: ${message}`, { failover: status >= 500 });
}

export interface UpstreamOptions {
  connectTimeoutMs: number;
  /** Until the response head arrives (for a non-stream upstream: the whole generation). */
  firstByteTimeoutMs: number;
  /** Longest silence between two body chunks. */
  idleTimeoutMs: number;
  /** Applied to deployments stored in the database (`guarded` targets). */
  policy: AddressPolicy;
  /** Largest non-stream answer, stream line (or event), and error body read from an upstream; 502 beyond. */
  maxBodyBytes: number;
  maxLineBytes: number;
  maxErrorBytes: number;
  /**
   * Connections per origin; null (the default) is no cap: over HTTP/1.1 each open stream holds a
   * connection, and a cap would queue streams behind long generations.
   */
  connectionsPerOrigin?: number | null;
}

/** Every string in a parsed answer, scrubbed in place. */
function scrubStrings(value: unknown, clean: (text: string) => string): unknown {
  if (typeof value === 'string') return clean(value);
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) value[i] = scrubStrings(value[i], clean);
  } else if (typeof value === 'object' && value !== null) {
    const o = value as Record<string, unknown>;
    for (const k of Object.keys(o)) {
      const v = scrubStrings(o[k], clean);
      // Member names too: an upstream can put the key in one (a hostile pass did).
      const name = clean(k);
      if (name !== k) delete o[k];
      o[name] = v;
    }
  }
  return value;
}

/** An upstream's answer nested deeper than Switchyard serializes (the stack would overflow): a 502. */
function checkDepth(text: string): void {
  if (textNestsDeeper(text))
    throw new ApiError('upstream_error', `The upstream sent JSON nested deeper than ${MAX_JSON_DEPTH} levels.`, { failover: true });
}

/** A chat-completions upstream's non-stream answer, parsed (a SyntaxError where it is not JSON), or its problem thrown. */
function chatAnswer(text: string): unknown {
  checkDepth(text);
  const answer: unknown = JSON.parse(text);
  const problem = answerProblem(answer);
  if (problem)
    throw new ApiError('upstream_error', `The upstream sent a reply that is not a chat completion: ${problem}.`, {
      failover: true,
    });
  return answer;
}

/**
 * A turn's finish given the calls passed on and suppressed: a turn for tool calls none of which
 * passed is a stop; and some servers finish a turn that called tools with `stop`, which is a turn
 * for tool calls all the same (Messages clients loop on `tool_use`).
 */
function callsFinish(finish: FinishReason, passed: number, suppressed: number): FinishReason {
  if (finish === 'tool_calls' && passed === 0 && suppressed > 0) return 'stop';
  return finish === 'stop' && passed > 0 ? 'tool_calls' : finish;
}

const NOTHING_TO_FORGET = (): void => undefined;

/**
 * `parallel_tool_calls: false` (Messages: `disable_parallel_tool_use`): one call a turn. Calls an
 * upstream makes past the first are suppressed as calls to tools not offered are.
 */
const oneCallOnly = (req: GenerationRequest): boolean => req.parallelToolCalls === false && (req.tools?.length ?? 0) > 0;

/**
 * Why an upstream's usage report cannot be right, if it cannot: more output than it was allowed,
 * more input than the model's context, or none of either where there was some. An upstream's counts
 * are billed as they come otherwise, so a report of a billion tokens for "hi" drained a budget, and
 * one of zero made an answer free (an outside hostile pass). The estimate is billed instead, and
 * flagged. Fewer tokens than deltas is not held against it: some servers split a token's text.
 */
function implausible(
  r: ReportedUsage,
  tally: UsageTally,
  outputCap: number | undefined,
  context: number | undefined,
  capped: boolean,
): string | undefined {
  const input = implausibleInput(r.input, context);
  if (input !== undefined) return input;
  // Cut at the limit by Switchyard, the upstream's output count is past what was passed on anyway.
  if (capped) return undefined;
  if (r.output !== undefined && outputCap !== undefined && r.output > outputCap) return `output past the request's ${outputCap}`;
  if (r.output === 0 && tally.output > 0) return 'no output for an answer that had some';
  return undefined;
}

/** Why a reported count of the prompt cannot be right, if it cannot (also checked as it arrives mid-stream). */
function implausibleInput(input: number | undefined, context: number | undefined): string | undefined {
  if (input !== undefined && context !== undefined && input > context) return `input past the model's context of ${context}`;
  if (input === 0) return 'no input for a prompt';
  return undefined;
}

/**
 * Time without output in a stream. undici's body timeout sees only silence in bytes: an upstream
 * that sent keep-alive comments, pings or empty chunks and nothing else held its request, with its
 * slot and its reservation, for as long as it kept sending them (an outside hostile pass). The time
 * allowed between outputs is the first-byte timeout's (before the first output, what is left of it
 * for this try), not the idle timeout's: keep-alives are what an upstream sends while it thinks
 * without showing it, or writes a large tool argument, and those may take minutes. Checked as
 * chunks arrive: silence in bytes is still the body timeout's.
 */
class OutputWatch {
  private last = Date.now();

  constructor(
    private readonly firstMs: number,
    private readonly laterMs: number,
  ) {}

  /** `output`: this chunk carried some (or ended the answer). Throws once the allowed time is past. */
  check(output: boolean, early: boolean): void {
    const now = Date.now();
    if (output) {
      this.last = now;
      return;
    }
    const allowed = early ? this.firstMs : this.laterMs;
    if (now - this.last > allowed)
      throw new ApiError('upstream_timeout', `The upstream sent no output for ${allowed} ms.`, { failover: early });
  }
}

/** A transport failure as one of our errors; `early` (nothing sent to the client yet) may fail over. */
function transportError(err: unknown, o: UpstreamOptions, early: boolean, headersTimeoutMs: number): ApiError {
  const code = (err as { code?: string }).code;
  if (code === 'UND_ERR_CONNECT_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream did not accept a connection within ${o.connectTimeoutMs} ms.`, {
      failover: early,
    });
  }
  if (code === 'UND_ERR_HEADERS_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream sent nothing within ${headersTimeoutMs} ms.`, { failover: early });
  }
  if (code === 'UND_ERR_BODY_TIMEOUT') {
    return new ApiError('upstream_timeout', `The upstream went silent for ${o.idleTimeoutMs} ms mid-answer.`, {
      failover: early,
    });
  }
  if (code === 'EADDRNOTPERMITTED') {
    // Said so, since the fix is the operator's (a deployment added where the allowance was set, on
    // a server started without it); the address itself is not named to the client.
    return new ApiError(
      'upstream_unreachable',
      'The upstream could not be reached: its address is internal, and this server is not started with SWITCHYARD_UPSTREAM_ALLOW permitting it.',
      { failover: early },
    );
  }
  return new ApiError(
    early ? 'upstream_unreachable' : 'upstream_error',
    early ? `The upstream could not be reached.` : `The upstream broke off mid-answer.`,
    { failover: early },
  );
}

/** Waits shorter than this are timed by Switchyard itself (see send). */
const EXACT_TIMEOUT_BELOW_MS = 10_000;

/**
 * Any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, Ollama, LM Studio, hosted APIs, or
 * another Switchyard). One undici Pool per origin; streams are parsed as SSE and re-emitted as
 * canonical events chunk by chunk, with nothing held back. Everything read from an upstream is
 * bounded: the answer, each stream line, the error body, and the output (at the request's limit).
 */
export class UpstreamEngine implements Engine {
  readonly kind = 'upstream';
  private readonly pools = new Map<string, Pool>();
  private readonly guardedPools = new Map<string, Pool>();
  private readonly scrubbers = new Map<string, Scrubber>();

  constructor(
    private readonly log: Logger,
    private readonly o: UpstreamOptions,
    private readonly hooks: { onInvalidUsage?: (deployment: string) => void } = {},
  ) {}

  /**
   * By deployment URL, then route. Looked up by the strings themselves (the deployment's and a
   * literal, whose hashes V8 keeps): a key built from both was a new string to hash per request.
   */
  private readonly endpoints = new Map<string, Map<string, { origin: string; path: string }>>();

  /** Origin and path of an upstream endpoint, parsed once per deployment URL. */
  private endpoint(baseUrl: string, route: string): { origin: string; path: string } {
    let routes = this.endpoints.get(baseUrl);
    if (!routes) this.endpoints.set(baseUrl, (routes = new Map()));
    let e = routes.get(route);
    if (!e) {
      const url = new URL(`${baseUrl.replace(/\/+$/, '')}/${route}`);
      e = { origin: url.origin, path: url.pathname + url.search };
      routes.set(route, e);
    }
    return e;
  }

  private scrubber(secret: string | undefined): Scrubber {
    const key = secret ?? '';
    let s = this.scrubbers.get(key);
    if (!s) {
      s = new Scrubber(secret);
      this.scrubbers.set(key, s);
    }
    return s;
  }

  /** Guarded targets get pools of their own whose every connection passes the address policy. */
  private pool(origin: string, guarded: boolean): Pool {
    // Guarded pools apart, so the lookup is by the origin's own string (see `endpoints`).
    const pools = guarded ? this.guardedPools : this.pools;
    let p = pools.get(origin);
    if (!p) {
      const timeout = this.o.connectTimeoutMs;
      const connect = withoutReconnectAfterAbort(guarded ? this.o.policy.connector(timeout) : buildConnector({ timeout }));
      p = new Pool(origin, { connections: this.o.connectionsPerOrigin ?? null, keepAliveTimeout: 30_000, connect });
      pools.set(origin, p);
    }
    return p;
  }

  /** Health check: GET {baseUrl}/models. Any answer below 500 means the server is up. */
  async probe(target: DeploymentTarget): Promise<boolean> {
    if (target.engine !== 'upstream') return true;
    const url = this.endpoint(target.baseUrl, 'models');
    const headers = addAuth({ accept: 'application/json' }, target);
    try {
      const res = await this.pool(url.origin, target.guarded).request({
        path: url.path,
        method: 'GET',
        headers,
        headersTimeout: 5_000,
        bodyTimeout: 5_000,
      });
      await res.body.dump({ limit: 64 * 1024 });
      return res.statusCode < 500;
    } catch {
      return false;
    }
  }

  /**
   * The same-protocol fast lane (relay) where it applies, the canonical lane otherwise. The lane is
   * chosen before the call rather than inside one generator that delegates to the other: a
   * delegating async generator adds a generator step (and its promises) to every event.
   */
  generate(req: GenerationRequest, target: DeploymentTarget, attempt?: Attempt): AsyncIterable<GenerationEvent> {
    if (target.engine !== 'upstream') return refuse(new Error('upstream engine given a non-upstream target'));
    // A stream from a deployment with a key stays on the canonical lane: only there is the key
    // found when the model writes it across several deltas (the fast lane scrubs frame by frame).
    const scrub = this.scrubber(target.apiKey);
    // A request that restricts the calls (tool_choice none or a named tool) stays on the canonical
    // lane, where calls are seen one by one; the relay takes out calls to tools never offered
    // (auto, required, or no tools at all) from the upstream's own chunks.
    // So does `parallel_tool_calls: false`, one call a turn.
    const restricted = req.toolChoice === 'none' || typeof req.toolChoice === 'object' || oneCallOnly(req);
    const fast = req.wire === 'chat' && target.api === 'chat' && !(req.stream && scrub.active) && !restricted;
    return fast ? this.relay(req, target, scrub, attempt) : this.canonical(req, target, scrub, attempt);
  }

  /**
   * Sends the request and waits for the answer's head: an error status or a transport failure is
   * thrown here (the router may fail over), and an accepted request is billed from here on.
   */
  private async send(req: GenerationRequest, target: UpstreamTarget, scrub: Scrubber, attempt: Attempt | undefined): Promise<Sent> {
    // A deployment that speaks the Responses API or Anthropic's Messages gets it natively (always
    // streamed); others get chat completions.
    const api = target.api;
    const native = api !== 'chat';
    const stream = native || req.stream;
    const url = this.endpoint(target.baseUrl, api === 'responses' ? 'responses' : api === 'anthropic' ? 'messages' : 'chat/completions');
    const headers = addAuth({ 'content-type': 'application/json', accept: stream ? 'text/event-stream' : 'application/json' }, target);
    const body =
      api === 'responses'
        ? encodeResponsesRequest(req, target.upstreamModel)
        : api === 'anthropic'
          ? encodeMessagesRequest(req, target.upstreamModel)
          : encodeChatRequest(req, target.upstreamModel);
    const tally = req.tally;
    const headersTimeout = Math.max(1, Math.min(this.o.firstByteTimeoutMs, (attempt?.deadline ?? Infinity) - Date.now()));
    // undici checks its timeouts on a coarse clock (up to a second late). Where that second matters
    // (a short wait, a deadline near), the wait is timed here and the request aborted on time;
    // otherwise undici's own timeout is used, at no extra cost per request.
    const exact = headersTimeout < EXACT_TIMEOUT_BELOW_MS;
    let signal: CancelSignal = req.signal;
    /** Removes the listener that passes the client's cancel on to the timed signal (nothing to remove without one). */
    let forget = NOTHING_TO_FORGET;
    let timer: NodeJS.Timeout | undefined;
    let timedOut = false;
    if (exact) {
      const abort = new Cancellation();
      forget = onAbort(req.signal, () => abort.abort());
      timer = setTimeout(() => {
        timedOut = true;
        abort.abort();
      }, headersTimeout);
      signal = abort;
    }
    let res: UpstreamCall;
    try {
      res = await UpstreamCall.start(
        this.pool(url.origin, target.guarded),
        {
          path: url.path,
          method: 'POST',
          headers,
          body: JSON.stringify(body),
          headersTimeout: exact ? headersTimeout + 2_000 : headersTimeout,
          bodyTimeout: this.o.idleTimeoutMs,
        },
        signal,
      );
    } catch (err) {
      forget();
      if (req.signal.aborted) throw new CancelledError();
      this.log.warn({ deployment: target.id, err: (err as Error).message }, 'upstream unreachable');
      throw transportError(timedOut ? { code: 'UND_ERR_HEADERS_TIMEOUT' } : err, this.o, true, headersTimeout);
    } finally {
      if (timer) clearTimeout(timer);
    }
    if (res.statusCode >= 400) {
      forget();
      let text: string;
      try {
        text = (await res.whole(this.o.maxErrorBytes)).toString('utf8');
      } catch (err) {
        text = err instanceof TooLarge ? `(an error body over ${this.o.maxErrorBytes} bytes, not read)` : '';
      } finally {
        res.release();
      }
      const retryAfter = res.headers['retry-after'];
      // The client is told only that the credentials were refused; the operator reads the upstream's reason.
      if (res.statusCode === 401 || res.statusCode === 403)
        this.log.warn(
          { deployment: target.id, status: res.statusCode, upstream_error: scrub.text(text).slice(0, 500) },
          'upstream refused the deployment key',
        );
      throw upstreamError(res.statusCode, text, typeof retryAfter === 'string' ? retryAfter : undefined, scrub);
    }

    // The upstream took the request: from here it is billed, by estimate until the upstream reports usage.
    tally.input = estimateInputTokens(req);
    tally.exact = false;
    // Some servers stream whatever they are asked: a stream that came for a whole answer is read as one.
    return { res, headersTimeout, forget, stream: stream || isEventStream(res.headers['content-type']) };
  }

  /** Any protocol to canonical events: the upstream's answer or stream read, limited, stop strings applied, scrubbed. */
  private async *canonical(
    req: GenerationRequest,
    target: UpstreamTarget,
    scrub: Scrubber,
    attempt: Attempt | undefined,
    sent?: Sent,
  ): AsyncGenerator<GenerationEvent> {
    const { res, headersTimeout, forget, stream } = sent ?? (await this.send(req, target, scrub, attempt));
    const api = target.api;
    const tally = req.tally;
    const clean = (text: string): string => scrub.text(text);
    const messages = api === 'anthropic' ? new MessagesReader(clean) : undefined;
    const chat = messages || api === 'responses' ? undefined : new ChatReader(clean);
    const reader: StreamReader = messages ?? chat ?? new ResponsesReader(clean);
    const out: GenerationEvent[] = [];
    // The Responses API has no `stop`, and a chat-completions upstream takes four: they are applied
    // here. The upstream is read to its end anyway, so the usage it reports (and bills) stays exact.
    const stop = req.sampling.stop ?? [];
    const stops =
      (api === 'responses' && stop.length > 0) || (chat && stop.length > MAX_UPSTREAM_STOPS) ? new StopMatcher(stop) : undefined;
    let stopped = false;
    const guard = new OutputLimit(attempt?.outputCap ?? req.maxOutputTokens ?? Number.MAX_SAFE_INTEGER);
    // One scrubber per text channel (a key split across deltas is still found); none without a key.
    const textScrub = scrub.active ? scrub.stream() : undefined;
    const reasoningScrub = scrub.active ? scrub.stream() : undefined;
    // Made with the first refusal: few answers have one.
    let refusalScrub: StreamScrubber | undefined;
    const argScrubs = scrub.active ? new Map<number, StreamScrubber>() : undefined;
    // Until an event has gone out, a failure may still move to another deployment.
    let early = true;
    // Calls to tools the request does not let the model call are suppressed (Open Responses: "MUST be
    // rejected or suppressed"), with their arguments; a finish for tool calls none of which passed is a stop.
    const callable = callableTools(req);
    const single = oneCallOnly(req);
    const suppressed = new Set<number>();
    let callsPassed = 0;
    // Calls passed on whose arguments have not come (yet): given `{}` at the end, as OpenAI writes a
    // call without arguments; "" is no JSON document, and the SDKs' tool helpers threw parsing it.
    const argless = new Set<number>();
    // Interleaved parallel calls are put one after another (call-order.ts).
    const calls = new CallOrder();
    /**
     * Applies the output limit, stop strings and scrubbing to a batch of events, in place (an event
     * whose text is unchanged is passed on as it is), and keeps the usage tally current.
     */
    const see = (events: GenerationEvent[]): GenerationEvent[] => {
      let n = 0;
      for (let i = 0; i < events.length; i++) {
        const ev = events[i]!;
        switch (ev.type) {
          case 'text.delta': {
            // Counted even after a stop string, so an upstream that goes on is still cut at the limit.
            let text = guard.clip(ev.text, false);
            if (stopped) continue;
            if (stops && text) {
              const r = stops.push(text);
              text = r.emit;
              stopped ||= r.stopped;
            }
            if (textScrub) text = textScrub.push(text);
            if (text) events[n++] = text === ev.text ? ev : { type: 'text.delta', text };
            continue;
          }
          case 'reasoning.delta': {
            let text = guard.clip(ev.text, true);
            if (reasoningScrub) text = reasoningScrub.push(text);
            if (text) events[n++] = text === ev.text ? ev : { type: 'reasoning.delta', text };
            continue;
          }
          case 'refusal.delta': {
            let text = guard.clip(ev.text, false);
            if (stopped) continue;
            if (scrub.active) text = (refusalScrub ??= scrub.stream()).push(text);
            if (!text) continue;
            const refusal: GenerationEvent = text === ev.text ? ev : { type: 'refusal.delta', text };
            // Text held back (a stop string's or a key's possible start) came before the refusal, and
            // goes out before it. Rare: the batch is then rebuilt, the events not yet seen after them.
            let held = stops && !stopped ? stops.flush() : '';
            if (textScrub) held = textScrub.push(held) + textScrub.flush();
            if (!held) {
              events[n++] = refusal;
              continue;
            }
            const rest = events.slice(i + 1);
            events.length = n;
            events.push({ type: 'text.delta', text: held }, refusal);
            n = events.length;
            i = n - 1;
            events.push(...rest);
            continue;
          }
          case 'tool_call.start':
            if (!callable.has(ev.name) || (single && callsPassed > 0)) {
              if (suppressed.size === 0)
                this.log.warn({ deployment: target.id, tool: ev.name }, 'upstream called a tool the request does not allow; suppressed');
              suppressed.add(ev.index);
              continue;
            }
            if (!stopped && !guard.capped) {
              events[n++] = ev;
              callsPassed++;
              argless.add(ev.index);
            }
            continue;
          case 'tool_call.delta': {
            if (stopped || suppressed.has(ev.index)) continue;
            let text = guard.clip(ev.arguments, false);
            if (argScrubs) {
              let sc = argScrubs.get(ev.index);
              if (!sc) argScrubs.set(ev.index, (sc = scrub.stream()));
              text = sc.push(text);
            }
            if (text) {
              events[n++] = text === ev.arguments ? ev : { type: 'tool_call.delta', index: ev.index, arguments: text };
              argless.delete(ev.index);
            }
            continue;
          }
          default:
            events[n++] = ev;
        }
      }
      events.length = n;
      tally.output = guard.outputTokens;
      tally.reasoning = guard.reasoningTokens;
      if (n) early = false;
      return events;
    };
    /** `[DONE]` came, or the reader's end of the answer. */
    let done = false;
    try {
      if (!stream) {
        const answer: unknown = await this.readAnswer(res, reader === chat);
        reader.read(answer, out);
        yield* calls.order(see(out));
      } else {
        let failure: unknown;
        let sinceEvent = 0;
        const parser = createParser({
          onEvent: (ev: EventSourceMessage) => {
            sinceEvent = -1;
            if (done) return;
            if (ev.data === '[DONE]') {
              done = true;
              return;
            }
            try {
              checkDepth(ev.data);
              done = reader.read(JSON.parse(ev.data), out);
            } catch (err) {
              failure = err instanceof ApiError ? err : new ApiError('upstream_error', 'The upstream sent a malformed stream event.');
              done = true;
            }
          },
        });
        // A UTF-8 character may be split across network chunks.
        const decoder = new StringDecoder('utf8');
        const input = new SseInput();
        const quiet = new OutputWatch(headersTimeout, this.o.firstByteTimeoutMs);
        for (let chunk = await res.read(); chunk !== null; chunk = await res.read()) {
          const before = sinceEvent;
          sinceEvent = 0;
          parser.feed(input.push(decoder.write(chunk)));
          quiet.check(out.length > 0 || done, early);
          // An upstream that reports the prompt's count before its output (Anthropic's message_start):
          // the tally has it at once, so what reads it mid-stream (the Messages endpoint's own
          // message_start, a stop's bill) is not an estimate.
          const reported = reader.usage;
          if (
            reported !== undefined &&
            reported.input !== undefined &&
            !reported.invalid &&
            implausibleInput(reported.input, attempt?.contextLength) === undefined
          ) {
            tally.input = reported.input;
            tally.cached = Math.min(reported.input, reported.cached ?? 0);
            if (reported.cacheWrite) tally.cacheWrite = Math.min(reported.input, reported.cacheWrite);
          }
          // Bytes held for an event not yet complete: what came after the last line end (LF or CR)
          // of this chunk if an event ended in it, else everything since the last event.
          sinceEvent =
            sinceEvent === -1 ? chunk.length - Math.max(chunk.lastIndexOf(10), chunk.lastIndexOf(13)) - 1 : before + chunk.length;
          if (sinceEvent > this.o.maxLineBytes) {
            throw new ApiError('upstream_error', `The upstream sent a stream event larger than ${this.o.maxLineBytes} bytes.`, {
              failover: early,
            });
          }
          if (out.length) {
            yield* calls.order(see(out));
            out.length = 0;
          }
          if (failure) throw failure;
          // At the request's output limit: stop reading (the upstream is told by the connection closing).
          if (guard.capped) break;
        }
        if (failure) throw failure;
        // A chat stream closed after its finish reason but without [DONE] is complete.
        if (!done && !guard.capped && !stopped && !chat?.finished)
          throw new ApiError('upstream_error', `The upstream ended its stream before it was complete.`, { failover: early });
      }
    } catch (err) {
      const failure = this.readFailure(err, req, target.id, early, headersTimeout);
      if (failure) throw failure;
      // Stopped (its client left, or a shutdown) once the answer was complete, while the rest of the
      // body was read: it ends as a whole answer (below), not as a stopped one.
      if (!stream || !(done || chat?.finished) || guard.capped) return;
    } finally {
      forget();
      // A body read to its end leaves the connection reusable; anything else must not.
      res.release();
    }
    const rest = stops && !stopped ? stops.flush() : '';
    const tailText = textScrub ? textScrub.push(rest) + textScrub.flush() : rest;
    if (tailText) yield { type: 'text.delta', text: tailText };
    const tailReasoning = reasoningScrub?.flush();
    if (tailReasoning) yield { type: 'reasoning.delta', text: tailReasoning };
    const tailRefusal = refusalScrub?.flush();
    if (tailRefusal) yield { type: 'refusal.delta', text: tailRefusal };
    const tails: GenerationEvent[] = [];
    for (const [index, sc] of argScrubs ?? []) {
      const tail = sc.flush();
      if (tail) {
        tails.push({ type: 'tool_call.delta', index, arguments: tail });
        argless.delete(index);
      }
    }
    if (!guard.capped) for (const index of argless) tails.push({ type: 'tool_call.delta', index, arguments: '{}' });
    yield* calls.order(tails);
    yield* calls.flush();
    yield { type: 'usage', usage: this.usage(reader.usage, tally, guard.capped, target.id, req, attempt) };
    // An Anthropic upstream's stop_sequence is reported only when it is one the request gave, and any
    // other value is the upstream's own text (a hostile pass's upstream put the key there).
    const reportedStop = messages?.stopSequence;
    const matched = guard.capped
      ? undefined
      : stopped
        ? stops?.matched
        : reportedStop !== undefined && req.sampling.stop?.includes(reportedStop)
          ? reportedStop
          : undefined;
    yield {
      type: 'finish',
      reason: guard.capped ? 'length' : stopped ? 'stop' : callsFinish(reader.finish, callsPassed, suppressed.size),
      ...(matched !== undefined && { stopSequence: matched }),
    };
  }

  /**
   * The same-protocol fast lane (chat completions in, a chat-completions upstream): the upstream's
   * frames go on as they came, read by protocols/chat/relay.ts for what metering and the output
   * limit need, with the same bounds, timeouts, scrubbing and failover rule as the canonical lane
   * (above). A non-stream answer past the output limit is cut the canonical way.
   */
  private async *relay(
    req: GenerationRequest,
    target: UpstreamTarget,
    scrub: Scrubber,
    attempt: Attempt | undefined,
  ): AsyncGenerator<GenerationEvent> {
    const sent = await this.send(req, target, scrub, attempt);
    // A stream that came for a whole answer (some servers stream whatever they are asked) is read on
    // the canonical lane, which puts the answer together from its events; the relay passes a
    // non-stream answer on as the upstream wrote it, and there is no such answer here.
    if (!req.stream && sent.stream) {
      yield* this.canonical(req, target, scrub, attempt, sent);
      return;
    }
    const { res, headersTimeout, forget } = sent;
    const tally = req.tally;
    const clean = (text: string): string => scrub.text(text);
    const cap = attempt?.outputCap ?? req.maxOutputTokens ?? Number.MAX_SAFE_INTEGER;
    let early = true;
    const callable = callableTools(req);
    const limit = new OutputLimit(cap);
    const relay = new ChatRelay(
      req.model,
      clean,
      limit,
      this.o.maxLineBytes,
      () =>
        new ApiError('upstream_error', `The upstream sent a stream event larger than ${this.o.maxLineBytes} bytes.`, {
          failover: early,
        }),
      callable,
      req.streamUsage === true,
    );
    const count = () => {
      tally.output = limit.outputTokens;
      tally.reasoning = limit.reasoningTokens;
    };
    // Frames that carry no output yet (the role chunk) wait for the first that does: until then a
    // failure may still move to another deployment, as in the canonical lane.
    let held = '';
    /** Stopped while reading the body to its end after a complete stream: it ends as a whole answer. */
    let stoppedWhole = false;
    try {
      if (!req.stream) {
        const text = await this.readText(res);
        const answer = chatAnswer(text);
        // Scrubbed string by string: scrubbing the JSON text could change what it parses to. The
        // text of a deployment with a key never goes on as it came, even with nothing scrubbed out of
        // the parsed answer: a repeated key's earlier value is in the text but not in the parse.
        if (scrub.active) scrubStrings(answer, clean);
        if (!relay.answer(answer, scrub.active ? undefined : text)) {
          // Past the output limit, or calling a tool the request does not allow: only the canonical
          // lane cuts an answer and suppresses a call (with its arguments, uncounted).
          const out: GenerationEvent[] = [];
          const reader = new ChatReader(clean);
          reader.read(answer, out);
          const guard = new OutputLimit(cap);
          const suppressed = new Set<number>();
          let passed = 0;
          for (const ev of out) {
            if (ev.type === 'text.delta' || ev.type === 'reasoning.delta' || ev.type === 'refusal.delta') {
              const kept = guard.clip(ev.text, ev.type === 'reasoning.delta');
              if (kept) yield { type: ev.type, text: kept };
            } else if (ev.type === 'tool_call.start') {
              if (!callable.has(ev.name)) {
                if (suppressed.size === 0)
                  this.log.warn({ deployment: target.id, tool: ev.name }, 'upstream called a tool the request does not allow; suppressed');
                suppressed.add(ev.index);
              } else if (!guard.capped) {
                passed++;
                yield ev;
              }
            } else if (ev.type === 'tool_call.delta') {
              // As in the canonical lane, a call's arguments are output: counted, and cut at the limit.
              if (suppressed.has(ev.index)) continue;
              const kept = guard.clip(ev.arguments, false);
              if (kept) yield kept === ev.arguments ? ev : { type: 'tool_call.delta', index: ev.index, arguments: kept };
            } else if (!guard.capped) yield ev;
          }
          tally.output = guard.outputTokens;
          tally.reasoning = guard.reasoningTokens;
          yield { type: 'usage', usage: this.usage(reader.usage, tally, guard.capped, target.id, req, attempt) };
          yield { type: 'finish', reason: guard.capped ? 'length' : callsFinish(reader.finish, passed, suppressed.size) };
          return;
        }
        count();
        yield { type: 'wire.object', object: answer as Record<string, unknown>, text: relay.answerText };
      } else {
        const decoder = new StringDecoder('utf8');
        const quiet = new OutputWatch(headersTimeout, this.o.firstByteTimeoutMs);
        let deltas = 0;
        for (let chunk = await res.read(); chunk !== null; chunk = await res.read()) {
          const frames = relay.push(decoder.write(chunk));
          quiet.check(limit.deltas !== deltas || relay.done, early);
          deltas = limit.deltas;
          if (frames !== '') {
            count();
            if (limit.deltas === 0 && !relay.done && !relay.capped) {
              held += frames;
              // Frames without output (empty deltas, say) are held for failover, within the bound of
              // one event: an upstream that sent them without end filled the process's memory.
              if (held.length > this.o.maxLineBytes)
                throw new ApiError('upstream_error', `The upstream sent more than ${this.o.maxLineBytes} bytes without any output.`, {
                  failover: true,
                });
            } else {
              early = false;
              yield { type: 'wire.frames', frames: held + frames };
              held = '';
            }
          }
          if (relay.failure) throw relay.failure;
          // At the output limit: stop reading (the upstream is told by the connection closing). After
          // [DONE] the body is read to its end, which leaves the connection reusable.
          if (relay.capped) break;
        }
        if (!relay.complete && !relay.capped)
          throw new ApiError('upstream_error', `The upstream ended its stream before it was complete.`, { failover: early });
        // Complete without [DONE] and without output: the held role and finish chunks are the answer.
        if (held !== '') {
          early = false;
          yield { type: 'wire.frames', frames: held };
        }
        count();
        yield { type: 'wire.object', object: relay.usageFrame(), text: relay.usageText };
      }
    } catch (err) {
      const failure = this.readFailure(err, req, target.id, early, headersTimeout);
      if (failure) throw failure;
      // Stopped (its client left, or a shutdown) once the stream was complete, while the rest of the
      // body was read: the answer is whole, and ends as one rather than as a stopped stream.
      if (!req.stream || !relay.complete || relay.capped || relay.failure) return;
      stoppedWhole = true;
    } finally {
      forget();
      res.release();
    }
    if (stoppedWhole) {
      if (held !== '') yield { type: 'wire.frames', frames: held };
      count();
      yield { type: 'wire.object', object: relay.usageFrame(), text: relay.usageText };
    }
    yield { type: 'usage', usage: this.usage(relay.usage, tally, relay.capped, target.id, req, attempt) };
    yield { type: 'finish', reason: relay.capped ? 'length' : relay.finish };
  }

  /** What a failure while reading an answer becomes; undefined when the request was cancelled (nothing to report). */
  private readFailure(
    err: unknown,
    req: GenerationRequest,
    deployment: string,
    early: boolean,
    headersTimeout: number,
  ): ApiError | undefined {
    if (req.signal.aborted || err instanceof undiciErrors.RequestAbortedError) return undefined;
    if (err instanceof ApiError) return err;
    if (err instanceof SyntaxError)
      return new ApiError('upstream_error', `The upstream sent a reply that is not JSON.`, { failover: early });
    this.log.warn({ deployment, err: (err as Error).message }, 'upstream broke off');
    return transportError(err, this.o, early, headersTimeout);
  }

  /** A non-stream answer, parsed, read within the size bound (a declared length past it is refused before reading). */
  private async readAnswer(res: UpstreamCall, chat: boolean): Promise<unknown> {
    const text = await this.readText(res);
    if (chat) return chatAnswer(text);
    checkDepth(text);
    return JSON.parse(text);
  }

  /** A non-stream answer's text, read within the size bound. */
  private async readText(res: UpstreamCall): Promise<string> {
    const tooLarge = () =>
      new ApiError('upstream_error', `The upstream sent an answer larger than ${this.o.maxBodyBytes} bytes.`, {
        failover: true,
      });
    if (Number(res.headers['content-length']) > this.o.maxBodyBytes) throw tooLarge();
    let body: Buffer;
    try {
      body = await res.whole(this.o.maxBodyBytes);
    } catch (err) {
      throw err instanceof TooLarge ? tooLarge() : err;
    }
    return body.toString('utf8');
  }

  /**
   * The usage to bill: the upstream's own counts where they are valid, the estimate for the rest
   * (flagged). A capped answer was cut by Switchyard, so the upstream's report (if any) is not it.
   */
  private usage(
    reported: ReportedUsage | undefined,
    tally: UsageTally,
    capped: boolean,
    deployment: string,
    req: GenerationRequest,
    attempt: Attempt | undefined,
  ): Usage {
    let r = reported;
    if (r?.invalid) {
      this.hooks.onInvalidUsage?.(deployment);
      this.log.warn({ deployment }, 'upstream reported usage that is not a count of tokens; using an estimate');
    } else if (r !== undefined) {
      const why = implausible(r, tally, attempt?.outputCap ?? req.maxOutputTokens, attempt?.contextLength, capped);
      if (why !== undefined) {
        this.hooks.onInvalidUsage?.(deployment);
        this.log.warn({ deployment, reported: r, reason: why }, 'upstream reported usage that cannot be right; using an estimate');
        r = { input: undefined, cached: undefined, output: undefined, reasoning: undefined, invalid: true };
        // The estimate of the prompt, not a count the upstream gave mid-stream (Anthropic's
        // message_start): the tally may hold one that passed then, before its output said otherwise.
        tally.input = estimateInputTokens(req);
        tally.cached = 0;
        tally.cacheWrite = 0;
      }
    }
    const use = capped ? undefined : r;
    // Cut at the limit, the upstream's output count is past what was passed on, but its count of
    // the prompt still holds (the estimate billed less than a reported 10 tokens as 4).
    const prompt = capped && r !== undefined && !r.invalid ? r : use;
    const input = prompt?.input ?? tally.input;
    const output = use?.output ?? tally.output;
    const estimated = use === undefined || use.invalid || use.input === undefined || use.output === undefined;
    const usage: Usage = {
      input,
      cached: Math.min(input, prompt?.cached ?? 0),
      output,
      reasoning: Math.min(output, use?.reasoning ?? (use?.output === undefined ? tally.reasoning : 0)),
    };
    if (use?.cacheWrite) usage.cacheWrite = Math.min(input, use.cacheWrite);
    if (estimated) usage.estimated = true;
    tally.input = usage.input;
    tally.cached = usage.cached;
    tally.cacheWrite = usage.cacheWrite ?? 0;
    tally.output = usage.output;
    tally.reasoning = usage.reasoning;
    tally.exact = !estimated;
    return usage;
  }

  async close(): Promise<void> {
    await Promise.all([...this.pools.values(), ...this.guardedPools.values()].map((p) => p.close()));
    this.pools.clear();
    this.guardedPools.clear();
  }
}
