import { randomBytes, randomFillSync } from 'node:crypto';

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

/** Random bytes drawn from the CSPRNG a block at a time: a call per id was a measurable share of the request hot path. */
const RANDOM_BLOCK = 4096;
const randomBlock = Buffer.alloc(RANDOM_BLOCK);
let randomAt = RANDOM_BLOCK;

/**
 * 128 random bits as 32 hex characters, for ids that must be unique and unguessable. As random as
 * a UUID (which has 122 such bits) and about four times cheaper than `randomUUID()` with its dashes
 * removed: the bytes come from a block filled by the CSPRNG (randomFillSync) once per 256 ids.
 */
export function randomHex(): string {
  if (randomAt + 16 > RANDOM_BLOCK) {
    randomFillSync(randomBlock);
    randomAt = 0;
  }
  const hex = randomBlock.toString('hex', randomAt, randomAt + 16);
  randomAt += 16;
  return hex;
}

/** Random ids for objects (responses, items, completions). */
export function newId(prefix: string, sep = '_'): string {
  return `${prefix}${sep}${randomHex()}`;
}

const PROCESS_TAG = randomBytes(6).toString('hex');
let lastMs = 0;
let lastMsHex = '';
let counter = 0;

/**
 * Milliseconds since the epoch as 12 hex digits. Split into two 24-bit halves: `toString(16)` of a
 * number past 2^31 (every timestamp) takes V8's slow path for doubles, a division per digit
 * (several µs of a request's instructions under callgrind); of a small integer, the fast one.
 */
function msHex(ms: number): string {
  const high = Math.floor(ms / 0x1000000);
  return high.toString(16).padStart(6, '0') + (ms - high * 0x1000000).toString(16).padStart(6, '0');
}

/**
 * An id that sorts by creation time (milliseconds, then a per-process counter, then a random
 * per-process tag, so several processes never collide). Rows keyed by it are appended to the end of
 * the primary-key index: random keys made each usage-record insert several times dearer in SQLite.
 */
export function orderedId(prefix: string): string {
  const now = Date.now();
  if (now !== lastMs) {
    lastMs = now;
    lastMsHex = msHex(now);
    counter = 0;
  }
  return `${prefix}_${lastMsHex}${(counter++).toString(16).padStart(6, '0')}${PROCESS_TAG}`;
}
