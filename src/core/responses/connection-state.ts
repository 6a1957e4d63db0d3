import type { Item } from '../items.js';

/** How many of its latest responses a connection keeps; continuing from older ones reads the store. */
const KEPT = 8;
/**
 * Characters of context a connection keeps in all. Each response keeps its whole context, earlier
 * turns included, so a chain of large inputs grew a connection by its inputs' size every turn (11 MB
 * a turn in a hostile pass, released only when the socket closed). Far more than any model's context
 * (a million tokens is about 4 million characters); responses are counted whole, shared turns once
 * per response that holds them, so a long chain keeps fewer than KEPT.
 */
const KEPT_CHARS = 32 * 1024 * 1024;

interface Entry {
  /** The whole context through this response: its history, its input, its output. */
  items: readonly Item[];
  /** Whether the response is also in the store (so it may be read from there once evicted). */
  stored: boolean;
  /** The characters of its strings (see textChars). */
  chars: number;
}

/** The characters of every string in a value: what it holds, counted without copying it. */
function textChars(v: unknown): number {
  if (typeof v === 'string') return v.length;
  if (typeof v !== 'object' || v === null) return 0;
  let n = 0;
  if (Array.isArray(v)) for (const x of v) n += textChars(x);
  else for (const x of Object.values(v)) n += textChars(x);
  return n;
}

/**
 * The responses one WebSocket connection made, in its memory (Open Responses' connection-local
 * state): a `store: false` response can be continued on the same connection without being written
 * anywhere, and any recent one without a database read. Lost with the connection, by design.
 */
export class ConnectionResponses {
  private readonly entries = new Map<string, Entry>();
  private chars = 0;

  constructor(private readonly keptChars = KEPT_CHARS) {}

  get(id: string): Entry | undefined {
    return this.entries.get(id);
  }

  /**
   * Keeps a response's context, the oldest ones going first past KEPT responses or KEPT_CHARS. A
   * context past KEPT_CHARS on its own is not kept: continuing it reads the store (a `store: false`
   * one is then not found, as after any eviction).
   */
  remember(id: string, items: readonly Item[], stored: boolean): void {
    const chars = textChars(items);
    this.evict(id);
    if (chars > this.keptChars) return;
    this.entries.set(id, { items, stored, chars });
    this.chars += chars;
    for (const [oldest, entry] of this.entries) {
      if (this.entries.size <= KEPT && this.chars <= this.keptChars) break;
      this.entries.delete(oldest);
      this.chars -= entry.chars;
    }
  }

  /** A continuation from `id` failed: it is forgotten (a `store: false` one can no longer be continued). */
  evict(id: string): void {
    const entry = this.entries.get(id);
    if (!entry) return;
    this.entries.delete(id);
    this.chars -= entry.chars;
  }
}
