/**
 * A bounded async queue between one producer and one consumer. The local engine uses it so the
 * next token is already being computed while the previous one is written to the socket: items are
 * handed over as soon as the consumer asks (no timer, no batching), and a full queue makes the
 * producer wait, so a slow client never makes memory grow.
 */
export class Channel<T> {
  private readonly items: T[] = [];
  private closed = false;
  private failure: unknown = undefined;
  private cancelled = false;
  private wakeConsumer: (() => void) | undefined;
  private wakeProducer: (() => void) | undefined;

  constructor(private readonly capacity = 64) {}

  /** True once the consumer has stopped reading: the producer should stop. */
  get isCancelled(): boolean {
    return this.cancelled;
  }

  /**
   * Adds an item. Returns undefined when it went in at once, so a producer that does not await
   * carries straight on (the local engine asks for its next token before the consumer runs);
   * returns a promise to await only when the queue is full.
   */
  push(item: T): Promise<void> | undefined {
    if (this.cancelled) return undefined;
    if (this.items.length >= this.capacity) return this.waitForRoom().then(() => this.push(item));
    this.items.push(item);
    this.wake();
    return undefined;
  }

  private waitForRoom(): Promise<void> {
    return new Promise<void>((r) => {
      this.wakeProducer = r;
    });
  }

  close(err?: unknown): void {
    this.closed = true;
    if (err !== undefined) this.failure = err;
    this.wake();
  }

  private wake(): void {
    const w = this.wakeConsumer;
    this.wakeConsumer = undefined;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      for (;;) {
        const item = this.items.shift();
        if (item !== undefined) {
          const p = this.wakeProducer;
          this.wakeProducer = undefined;
          p?.();
          yield item;
          continue;
        }
        if (this.closed) {
          if (this.failure !== undefined) throw this.failure;
          return;
        }
        await new Promise<void>((r) => {
          this.wakeConsumer = r;
        });
      }
    } finally {
      this.cancelled = true;
      const p = this.wakeProducer;
      this.wakeProducer = undefined;
      p?.();
    }
  }
}
