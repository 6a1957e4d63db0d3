import type { IncomingHttpHeaders } from 'node:http';
import { errors as undiciErrors, type Dispatcher } from 'undici';
import { onAbort, type CancelSignal } from '../../core/cancellation.js';

/** A body past the bound the reader gave: the call is aborted (its connection is not reused). */
export class TooLarge extends Error {}

/** Bytes of a streamed body held for a reader that has not taken them before the upstream is paused (undici's own default). */
const HIGH_WATER_MARK = 64 * 1024;

const NO_LISTENER = (): void => undefined;

/**
 * The reason a call is aborted with (cancelled, or released before its end). It reaches only this
 * call's own failure, which the engine takes as "nothing to report", so one instance serves every
 * call: making an error captures a stack trace, and thousands of streams can be cancelled at once.
 */
const ABORTED = new undiciErrors.RequestAbortedError();

/**
 * One request to an upstream through undici's `dispatch`, read as its head, then its body as whole
 * or chunk by chunk. `Pool.request` wraps every answer in a Readable stream (and an AsyncResource)
 * that the engine only ever drained: about a quarter of a non-stream call's CPU on the calling side
 * (bench/README.md, "The upstream call and content-chunk templates"). Here the chunks go straight from undici's
 * parser to the reader, with the same bounds: the reader's byte limit, undici's headers and body
 * timeouts, back-pressure (the upstream is paused while HIGH_WATER_MARK bytes wait), and the
 * cancel signal, which aborts the call before or after its head.
 *
 * A body not read to its end must be `release()`d: that aborts the call, so its connection is closed
 * rather than handed to the next request mid-answer.
 */
export class UpstreamCall implements Dispatcher.DispatchHandler {
  statusCode = 0;
  headers: IncomingHttpHeaders = {};
  private controller: Dispatcher.DispatchController | undefined;
  private chunks: Buffer[] = [];
  private queued = 0;
  private started = false;
  private ended = false;
  private failure: Error | undefined;
  /** Wakes the reader waiting for the head, the next chunk, the end or a failure (it looks which). */
  private waiting: (() => void) | undefined;
  private readonly forget: () => void;

  private constructor(signal: CancelSignal) {
    this.forget = signal.aborted ? NO_LISTENER : onAbort(signal, () => this.abort(ABORTED));
  }

  /** Sends the request; resolves once the response head is in (rejects as `Pool.request` would: timeouts, refused connections, an abort). */
  static async start(dispatcher: Dispatcher, opts: Dispatcher.DispatchOptions, signal: CancelSignal): Promise<UpstreamCall> {
    if (signal.aborted) throw new undiciErrors.RequestAbortedError();
    const call = new UpstreamCall(signal);
    dispatcher.dispatch(opts, call);
    if (!call.started && !call.failure) await call.wait();
    // A failure after the head is the body's: its reader gets it.
    if (!call.started) {
      call.forget();
      throw call.failure ?? new undiciErrors.RequestAbortedError();
    }
    return call;
  }

  /** Bytes of the body that came and are not read yet. */
  get buffered(): number {
    return this.queued;
  }

  /** The body was read to its end (the connection goes back to the pool). */
  get complete(): boolean {
    return this.ended && this.failure === undefined;
  }

  /** The whole body, up to `limit` bytes (TooLarge past it). */
  async whole(limit: number): Promise<Buffer> {
    while (!this.ended && !this.failure && this.queued <= limit) {
      // Taken in one piece at the end: a whole-body read below the limit is never held back. The
      // reader waits before resuming, since resuming may hand over the next chunk at once.
      const next = this.wait();
      if (this.controller?.paused) this.controller.resume();
      await next;
    }
    if (this.queued > limit) {
      this.release();
      throw new TooLarge();
    }
    if (this.failure) throw this.failure;
    const chunks = this.chunks;
    this.chunks = [];
    const size = this.queued;
    this.queued = 0;
    return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size);
  }

  /**
   * The body's next bytes (everything that came since the last call), or null at its end. A failure
   * (a cancel, a timeout, a broken connection) is thrown at once, with whatever was still unread
   * dropped, as `Pool.request`'s destroyed body did.
   */
  async read(): Promise<Buffer | null> {
    while (this.queued === 0 && !this.ended && !this.failure) await this.wait();
    if (this.failure) throw this.failure;
    if (this.queued > 0) {
      const chunks = this.chunks;
      const size = this.queued;
      this.chunks = [];
      this.queued = 0;
      if (this.controller?.paused) this.controller.resume();
      return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size);
    }
    return null;
  }

  /** Done with the call: one not read to its end is aborted. Safe to call more than once. */
  release(): void {
    this.forget();
    if (!this.ended && !this.failure) this.abort(ABORTED);
  }

  private abort(reason: Error): void {
    if (this.controller) return this.controller.abort(reason);
    // Still waiting for a connection: refused at once (as Pool.request was), and dropped by
    // onRequestStart when undici gets to it.
    if (!this.failure) {
      this.failure = reason;
      this.wakeReader();
    }
  }

  private wait(): Promise<void> {
    return new Promise<void>((resolve) => {
      this.waiting = resolve;
    });
  }

  private wakeReader(): void {
    const w = this.waiting;
    this.waiting = undefined;
    w?.();
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    // A failure before the start can only be an abort (undici ends a call it failed itself).
    // Thrown, not controller.abort(): undici then fails the call before writing it and keeps the
    // connection, where abort() would close a connection that never carried it.
    if (this.failure) throw this.failure;
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    // An interim answer (102 Processing, 103 Early Hints) is not the response: its head comes later.
    if (statusCode < 200) return;
    this.statusCode = statusCode;
    this.headers = headers;
    this.started = true;
    this.wakeReader();
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.chunks.push(chunk);
    this.queued += chunk.length;
    if (this.waiting) this.wakeReader();
    else if (this.queued >= HIGH_WATER_MARK) controller.pause();
  }

  onResponseEnd(): void {
    this.ended = true;
    this.forget();
    this.wakeReader();
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    this.failure = err;
    this.chunks = [];
    this.queued = 0;
    this.forget();
    this.wakeReader();
  }
}
