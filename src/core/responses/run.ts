import type { ResponseEvent, ResponseFold } from './format.js';

/** Events of a response that any number of followers read from the first, each as it comes. */
export class EventLog {
  protected readonly events: ResponseEvent[] = [];
  private ended = false;
  private wake: (() => void) | undefined;
  private woken: Promise<void> | undefined;

  get finished(): boolean {
    return this.ended;
  }

  protected push(events: readonly ResponseEvent[]): void {
    this.events.push(...events);
    this.notify();
  }

  /** No more events will come. */
  finish(): void {
    this.ended = true;
    this.notify();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    this.woken = undefined;
    w?.();
  }

  /**
   * Every event from the first, then each as it comes, until the log finishes or `stop` fires;
   * with its index in the stream (its sequence number).
   */
  async *follow(stop?: AbortSignal): AsyncGenerator<{ event: ResponseEvent; index: number }> {
    let next = 0;
    const onStop = () => this.notify();
    stop?.addEventListener('abort', onStop, { once: true });
    try {
      for (;;) {
        while (next < this.events.length) {
          const event = this.events[next]!;
          yield { event, index: next++ };
        }
        if (this.ended || stop?.aborted) return;
        this.woken ??= new Promise<void>((resolve) => {
          this.wake = resolve;
        });
        await this.woken;
      }
    } finally {
      stop?.removeEventListener('abort', onStop);
    }
  }

  /** A finished log of events that already happened (a stored response, replayed). */
  static of(events: readonly ResponseEvent[], finished: boolean): EventLog {
    const log = new EventLog();
    log.push(events);
    if (finished) log.finish();
    return log;
  }
}

/**
 * A response being generated on this process: its fold, its events so far, and a way to stop it.
 * Terminal events are held back until the response and its usage record are stored
 * (`holdTerminal` / `release`), so a follower that sees the end can rely on both.
 */
export class Run extends EventLog {
  private held: ResponseEvent[] | undefined;
  readonly abort = new AbortController();
  done: Promise<void> = Promise.resolve();

  constructor(
    readonly fold: ResponseFold,
    readonly orgId: string,
    readonly background: boolean,
    private readonly isTerminal: (ev: ResponseEvent) => boolean,
  ) {
    super();
  }

  /** The response object as served now (a copy). */
  resource(): Record<string, unknown> {
    return structuredClone(this.fold.resource) as Record<string, unknown>;
  }

  /** From now on terminal events wait until `release()`. */
  holdTerminal(): void {
    this.held = [];
  }

  release(): void {
    const held = this.held;
    this.held = undefined;
    if (held?.length) this.emit(held);
  }

  emit(events: readonly ResponseEvent[]): void {
    const now = this.held ? events.filter((e) => !this.isTerminal(e)) : events;
    if (this.held && now.length < events.length) this.held.push(...events.filter((e) => this.isTerminal(e)));
    this.push(now);
  }
}
