import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Waits for a condition, not for a time: `check` is retried (every 10 ms) until it stops throwing,
 * and its last failure is thrown if it never passes within `timeoutMs` (a bound for a hung test, not
 * a latency target). Used where the thing awaited has no event of its own to listen to, such as a
 * counter in another process or a metric.
 */
export async function eventually<T>(check: () => T | Promise<T>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await sleep(10);
    }
  }
}

/** A promise and the function that settles it, for turning a callback into something to await. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/**
 * Reads until `done` holds or `timeoutMs` passes, and returns the last reading either way (the
 * caller asserts on it). For quantities that drift toward a value, such as memory as V8 collects.
 */
export async function settle<T>(read: () => Promise<T>, done: (v: T) => boolean, timeoutMs: number, everyMs = 500): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = await read();
  while (!done(v) && Date.now() < deadline) {
    await sleep(everyMs);
    v = await read();
  }
  return v;
}

/**
 * Runs `attempt` until one run falls within a single minute of the clock, the window fixed-window
 * rate limits count in (the server shares this machine's clock): a run that straddles a minute's
 * end may rightly be allowed more. `attempt` must start from fresh state (a new key). Twice at most,
 * since a run takes seconds.
 */
export async function withinOneMinute<T>(attempt: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    const minute = Math.floor(Date.now() / 60_000);
    const result = await attempt();
    if (i === 1 || Math.floor(Date.now() / 60_000) === minute) return result;
  }
}
