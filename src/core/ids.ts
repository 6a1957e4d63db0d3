import { randomBytes, randomUUID } from 'node:crypto';

/** Unix seconds, as API objects carry them (`created`, `created_at`). */
export const nowSeconds = (): number => Math.floor(Date.now() / 1000);

let lastOrderMs = 0;

/**
 * Unix milliseconds, strictly increasing within this process: the sort key of lists in creation
 * order, so that what one client makes one after another lists in that order even within one
 * millisecond (across processes, equal times fall back to the id).
 */
export function orderMs(): number {
  const now = Date.now();
  lastOrderMs = now > lastOrderMs ? now : lastOrderMs + 1;
  return lastOrderMs;
}

/**
 * Random ids for objects (responses, items, completions, usage records). randomUUID draws from a
 * pre-filled entropy cache; randomBytes per call was a measurable share of the request hot path.
 */
export function newId(prefix: string, sep = '_'): string {
  return `${prefix}${sep}${randomUUID().replaceAll('-', '')}`;
}

const PROCESS_TAG = randomBytes(6).toString('hex');
let lastMs = 0;
let counter = 0;

/**
 * An id that sorts by creation time (milliseconds, then a per-process counter, then a random
 * per-process tag, so several processes never collide). Rows keyed by it are appended to the end of
 * the primary-key index: random keys made each usage-record insert several times dearer in SQLite.
 */
export function orderedId(prefix: string): string {
  const now = Date.now();
  if (now !== lastMs) {
    lastMs = now;
    counter = 0;
  }
  return `${prefix}_${now.toString(16).padStart(12, '0')}${(counter++).toString(16).padStart(6, '0')}${PROCESS_TAG}`;
}
