import type { Item } from '../items.js';

/** How many of its latest responses a connection keeps; continuing from older ones reads the store. */
const KEPT = 8;

interface Entry {
  /** The whole context through this response: its history, its input, its output. */
  items: readonly Item[];
  /** Whether the response is also in the store (so it may be read from there once evicted). */
  stored: boolean;
}

/**
 * The responses one WebSocket connection made, in its memory (Open Responses' connection-local
 * state): a `store: false` response can be continued on the same connection without being written
 * anywhere, and any recent one without a database read. Lost with the connection, by design.
 */
export class ConnectionResponses {
  private readonly entries = new Map<string, Entry>();

  get(id: string): Entry | undefined {
    return this.entries.get(id);
  }

  remember(id: string, items: readonly Item[], stored: boolean): void {
    this.entries.set(id, { items, stored });
    for (const oldest of this.entries.keys()) {
      if (this.entries.size <= KEPT) break;
      this.entries.delete(oldest);
    }
  }

  /** A continuation from `id` failed: it is forgotten (a `store: false` one can no longer be continued). */
  evict(id: string): void {
    this.entries.delete(id);
  }
}
