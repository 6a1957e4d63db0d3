import { ApiError, CancelledError } from './errors.js';
import { Cancellation, type CancelSignal } from './cancellation.js';
import type { Principal } from './principal.js';
import { tallyUsage, type GenerationEvent, type GenerationRequest, type Usage, type UsageTally } from './canonical.js';
import { costOf, newUsageId, type Ledger, type OpenMeter } from './ledger.js';
import type { Metrics } from './metrics.js';
import type { Model } from './model-spec.js';
import type { UsageRecord } from '../store/store.js';

/** One generation request, as metering records it. */
export interface GenerationStart {
  model: Model;
  who: Principal;
  endpoint: UsageRecord['endpoint'];
  requestId: string;
  stream: boolean;
  /** When the request arrived (performance.now()). */
  started: number;
}

export interface MeterContext extends GenerationStart {
  /** Filled by the router with the deployment that served the request. */
  trace: { deployment?: string };
  /** Told what the request used once it ended (rate limits and budgets count it); called once. */
  settle?: (tokens: number, cost: number | null) => void;
}

/** YYYY-MM-DD (UTC) of a time, computed once per day rather than per request. */
let dayCache = { from: 0, to: 0, day: '' };
function dayOf(ms: number): string {
  if (ms < dayCache.from || ms >= dayCache.to) {
    const from = ms - (ms % 86_400_000);
    dayCache = { from, to: from + 86_400_000, day: new Date(from).toISOString().slice(0, 10) };
  }
  return dayCache.day;
}

const ENDED: Promise<void> = Promise.resolve();
/** The events of an answer that is finishing: let through a shutdown (see `step`). */
const FINISHING: ReadonlySet<GenerationEvent['type']> = new Set(['usage', 'finish', 'wire.object']);
const NOTHING = (): void => undefined;
/** What a generation stopped by a shutdown ends with (its status is what its record says). */
const stoppedError = (): ApiError =>
  new ApiError('service_unavailable', 'The server is shutting down; this generation was stopped before it finished.');

/** Where a metered generation's events come from: the router's open stream. */
export interface EventSource {
  open(
    req: GenerationRequest,
    model: Model,
    trace: { deployment?: string },
  ): Promise<{ first: GenerationEvent | undefined; rest: AsyncIterator<GenerationEvent> }>;
}

/**
 * A generation in progress. Events pass through unchanged but for the usage event, which gets its
 * cost; one ledger record is written when the generation ends, whether it succeeded, failed or was
 * cancelled (closed before its end). The API layer reads it with `next()` until it returns undefined.
 */
export class MeteredStream implements OpenMeter {
  private ttft: number | null = null;
  private status = 499;
  private errorCode: string | null = 'cancelled';
  /** The engine's usage event, when one came; otherwise the request's tally is what it used. */
  private usage: Usage | undefined;
  private ended = false;
  private first: GenerationEvent | undefined;
  private rest: AsyncIterator<GenerationEvent> | undefined;
  private written: Promise<void> | undefined;
  /** Stopped by a shutdown rather than by its client: an unfinished generation is recorded as the server's failure. */
  private serverStopped = false;
  /** The id its record gets: the same in a snapshot (a heartbeat's) as at its end, so it is billed once. */
  private readonly recordId = newUsageId();

  private constructor(
    private readonly c: MeterContext,
    private readonly tally: UsageTally,
    private readonly ledger: Ledger,
    private readonly metrics: Metrics,
    /** The request's own signal: a shutdown stops through it what has no next step to take. */
    private readonly signal: CancelSignal,
  ) {}

  /** Starts the generation: problems before its first event (overflow, overload, upstream down) are thrown here. */
  static async open(
    source: EventSource,
    req: GenerationRequest,
    c: MeterContext,
    ledger: Ledger,
    metrics: Metrics,
  ): Promise<MeteredStream> {
    const s = new MeteredStream(c, req.tally, ledger, metrics, req.signal);
    ledger.begin(s);
    try {
      const { first, rest } = await source.open(req, c.model, c.trace);
      s.rest = rest;
      // An engine stopped by a shutdown before its first event ends without one: not an empty answer.
      if (first === undefined && s.serverStopped) throw stoppedError();
      if (first === undefined) s.end();
      else s.first = s.see(first);
    } catch (err) {
      // Stopped by a shutdown before its first event (an upstream that has not answered, which the
      // engine or the router reads as cancelled): its client is answered with the reason, as an HTTP error.
      const why = s.serverStopped && err instanceof CancelledError ? stoppedError() : err;
      // The router has counted this one against its deployment already.
      s.fail(why, false);
      throw why;
    }
    return s;
  }

  /**
   * The next event, or undefined once the generation ended; a failure is thrown (and recorded).
   * Not an async function: that would add a promise and a turn of the microtask queue to every
   * event on top of the engine's own.
   */
  next(): Promise<GenerationEvent | undefined> {
    const first = this.first;
    if (first !== undefined) {
      this.first = undefined;
      return Promise.resolve(first);
    }
    if (this.ended) return Promise.resolve(undefined);
    try {
      // Promise.resolve hands a native promise back as it is: no extra promise for a generator's step.
      return Promise.resolve(this.rest!.next()).then(this.step, this.stepFailed);
    } catch (err) {
      return Promise.reject(this.failedMidStream(err));
    }
  }

  /** One engine step, seen: bound once per generation, not made per event. */
  private readonly step = (r: IteratorResult<GenerationEvent>): GenerationEvent | undefined => {
    if (r.done) {
      // Ended by a shutdown without its finish (its engine was stopped while it waited): the
      // route answers the reason in its protocol.
      if (this.serverStopped && this.status !== 200) throw this.stopForServer();
      this.end();
      return undefined;
    }
    // A stream stopped by a shutdown: the route answers this error in its protocol (an error
    // event), where closing the connection under it would leave the client a cut-off transfer. An
    // answer already finishing (its usage, its finish, the fast lane's closing object) goes on. A
    // non-stream request is stopped through its signal (stoppedByServer), and its engine's end
    // without a finish is the error (below).
    if (this.serverStopped && this.c.stream && !FINISHING.has(r.value.type)) throw this.stopForServer();
    return this.see(r.value);
  };

  private stopForServer(): ApiError {
    const err = stoppedError();
    this.fail(err, true);
    try {
      void this.rest?.return?.(undefined)?.then(NOTHING, NOTHING);
    } catch {
      // The engine's generator is running or gone: it stops at its next step either way.
    }
    return err;
  }

  private readonly stepFailed = (err: unknown): never => {
    throw this.failedMidStream(err);
  };

  private failedMidStream(err: unknown): unknown {
    this.fail(err, true);
    return err;
  }

  /**
   * Stops the generation if it is still going (recorded as cancelled). Safe to call more than once.
   * Every route calls it when it is done; for a generation that ended it costs no promise.
   */
  close(): Promise<void> {
    if (this.ended) return ENDED;
    this.end();
    try {
      const stopped = this.rest?.return?.(undefined);
      return stopped ? stopped.then(NOTHING, NOTHING) : ENDED;
    } catch {
      return ENDED;
    }
  }

  /**
   * The shutdown timeout passed. A generation that takes its next step is stopped there (`step`);
   * one with no step coming (an upstream that has not sent its head, or has gone quiet) is stopped
   * through its signal now, so its client is answered rather than cut off when the connections close.
   */
  stoppedByServer(): void {
    this.serverStopped = true;
    if (!this.ended && this.signal instanceof Cancellation) this.signal.abort();
  }

  /** A forced exit: what this generation used so far is recorded now. */
  recordNow(): void {
    this.serverStopped = true;
    this.end();
  }

  /** Resolves once the ledger record of this (ended) generation is stored: answer only after it. */
  persisted(): Promise<void> {
    return this.written ?? Promise.resolve();
  }

  private see(ev: GenerationEvent): GenerationEvent {
    if (this.ttft === null) {
      this.ttft = performance.now() - this.c.started;
      this.metrics.observeTtft(this.c.endpoint, this.metrics.modelLabel(this.c.model), this.ttft / 1000);
    }
    if (ev.type === 'usage') {
      // Copied field by field: a spread here gave every usage a hidden class of its own (bench/README.md,
      // "Hidden classes made per request").
      const u = ev.usage;
      const usage: Usage = { input: u.input, cached: u.cached, output: u.output, reasoning: u.reasoning, cost: costOf(this.c.model, u) };
      if (u.cacheWrite !== undefined) usage.cacheWrite = u.cacheWrite;
      if (u.estimated !== undefined) usage.estimated = u.estimated;
      this.usage = usage;
      return { type: 'usage', usage: this.usage };
    }
    if (ev.type === 'finish') {
      this.status = 200;
      this.errorCode = null;
    }
    return ev;
  }

  /** `midStream`: after the first event, where only this sees the failure (the router saw the earlier ones). */
  private fail(err: unknown, midStream: boolean): void {
    this.status = err instanceof ApiError ? err.status : 500;
    this.errorCode = err instanceof ApiError ? err.code : 'internal_error';
    if (midStream && err instanceof ApiError && err.code.startsWith('upstream_')) {
      this.metrics.upstreamErrors.inc({ deployment: this.c.trace.deployment ?? 'unknown', code: err.code });
    }
    this.end();
  }

  private end(): void {
    if (this.ended) return;
    this.ended = true;
    if (this.serverStopped && this.status !== 200) {
      this.status = 503;
      this.errorCode = 'service_unavailable';
    }
    const { c, metrics, tally } = this;
    // No usage event (cancelled, failed mid-way): bill what the engine counted so far.
    const usage: Usage = this.usage ?? tallyUsage(tally);
    const cost = this.usage ? (this.usage.cost ?? null) : costOf(c.model, usage);
    const missing = cost === null;
    const now = Date.now();
    const m = metrics.modelLabel(c.model);
    if (usage.input) metrics.countTokens(m, 'input', usage.input);
    if (usage.cached) metrics.countTokens(m, 'cached', usage.cached);
    if (usage.output) metrics.countTokens(m, 'output', usage.output);
    if (usage.reasoning) metrics.countTokens(m, 'reasoning', usage.reasoning);
    c.settle?.(usage.input + usage.output, cost);
    if (missing) metrics.countPriceMissing(m);
    else if (cost) metrics.countCost(m, cost);
    this.written = this.ledger.record(this.recordOf(usage, cost, now, this.status, this.errorCode));
    this.ledger.end(this);
  }

  /**
   * The record this generation would write if its process stopped now (the server's failure, its
   * counts so far as an estimate); undefined once it has ended. A running stored response keeps it
   * with its heartbeat, for a process that dies (see failAbandonedResponses).
   */
  snapshot(): UsageRecord | undefined {
    if (this.ended) return undefined;
    const usage = this.usage ?? tallyUsage(this.tally);
    const cost = this.usage ? (this.usage.cost ?? null) : costOf(this.c.model, usage);
    const r = this.recordOf(usage, cost, Date.now(), 500, 'server_error');
    r.estimated = true;
    return r;
  }

  private recordOf(usage: Usage, cost: number | null, now: number, status: number, errorCode: string | null): UsageRecord {
    const c = this.c;
    return {
      id: this.recordId,
      at: now,
      day: dayOf(now),
      request_id: c.requestId,
      key_id: c.who.keyId,
      org_id: c.who.orgId,
      model: c.model.id,
      deployment: c.trace.deployment ?? null,
      endpoint: c.endpoint,
      stream: c.stream,
      input_tokens: usage.input,
      cached_tokens: usage.cached,
      output_tokens: usage.output,
      reasoning_tokens: usage.reasoning,
      cost,
      price_missing: cost === null,
      estimated: usage.estimated === true,
      latency_ms: Math.round(performance.now() - c.started),
      ttft_ms: this.ttft === null ? null : Math.round(this.ttft),
      status,
      error_code: errorCode,
    };
  }
}
