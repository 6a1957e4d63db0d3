import { EventEmitter } from 'node:events';

/**
 * What stops a generation: an AbortSignal, or a Cancellation. Engines use only `aborted` and the
 * 'abort' listener (undici takes either as a request's `signal`).
 */
export type CancelSignal = AbortSignal | Cancellation;

/**
 * A one-shot 'abort' signal for the request path. Node's AbortController is an EventTarget: making
 * one and adding a listener costs about 3.4 µs on this project's 2-core machine, against 0.1 µs for
 * this, and every generation request makes one (for a client that goes away). Listeners added
 * through `addEventListener` run once, as with `{ once: true }` on an AbortSignal.
 */
export class Cancellation extends EventEmitter {
  aborted = false;

  addEventListener(type: 'abort', listener: () => void): void {
    this.once(type, listener);
  }

  removeEventListener(type: 'abort', listener: () => void): void {
    this.off(type, listener);
  }

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.emit('abort');
  }
}

/** Calls `listener` once when `signal` aborts; returns what removes it. */
export function onAbort(signal: CancelSignal, listener: () => void): () => void {
  if (signal instanceof Cancellation) {
    signal.addEventListener('abort', listener);
    return () => signal.removeEventListener('abort', listener);
  }
  signal.addEventListener('abort', listener, { once: true });
  return () => signal.removeEventListener('abort', listener);
}

/**
 * `work`, or a rejection with `onAborted()` as soon as `signal` aborts, whichever comes first. For
 * waits a request cannot stop but need not sit out (a model loading for everyone): the work goes on
 * for whoever else wants it, the cancelled request ends (and is billed) now.
 */
export function unlessAborted<T>(work: Promise<T>, signal: CancelSignal, onAborted: () => Error): Promise<T> {
  if (signal.aborted) return Promise.reject(onAborted());
  return new Promise<T>((resolve, reject) => {
    const forget = onAbort(signal, () => reject(onAborted()));
    work.then(
      (v) => {
        forget();
        resolve(v);
      },
      (err: unknown) => {
        forget();
        reject(err);
      },
    );
  });
}
