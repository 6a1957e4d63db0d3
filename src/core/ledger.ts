import { orderedId } from './ids.js';
import type { Logger } from 'pino';
import type { Store, UsageRecord } from '../store/store.js';
import type { Usage } from './canonical.js';
import type { Model } from './model-spec.js';

/**
 * Cost of one request from the model's pricing: rates are US dollars per million tokens. Cached
 * input tokens use `cached_input_tokens` when the model prices them, else the input rate. A metric
 * the request used that the model has no price for makes the cost unknown (null), never $0; a free
 * model states a rate of 0.
 */
export function costOf(model: Model, u: Usage): { cost: number | null; missing: string[] } {
  const rate = (metric: string) => model.pricing.find((p) => p.metric === metric)?.rate;
  const missing: string[] = [];
  const input = rate('input_tokens');
  const output = rate('output_tokens');
  const cachedRate = rate('cached_input_tokens') ?? input;
  if (input === undefined && u.input > 0) missing.push('input_tokens');
  if (output === undefined && u.output > 0) missing.push('output_tokens');
  if (missing.length) return { cost: null, missing };
  const uncached = Math.max(0, u.input - u.cached);
  const dollars = (uncached * (input ?? 0) + u.cached * (cachedRate ?? 0) + u.output * (output ?? 0)) / 1_000_000;
  return { cost: Math.round(dollars * 1e10) / 1e10, missing };
}

export const newUsageId = (): string => orderedId('usage');

/**
 * The usage ledger. Records are written in group commits: everything recorded during one turn of
 * the event loop goes into one transaction on the next turn, and `record()` resolves once its
 * record is in the database. The API answers a request only after that, so a crash never loses the
 * record of a request whose client got a complete answer. A failed write keeps its records queued
 * and is retried every `retryMs` (their requests wait for it); `close()` writes everything queued.
 */
export class Ledger {
  private queue: UsageRecord[] = [];
  private waiters: Array<() => void> = [];
  private scheduled = false;
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();

  constructor(private readonly store: Store, private readonly log: Logger, private readonly retryMs = 1000) {}

  start(): void {
    this.timer = setInterval(() => {
      if (this.queue.length) void this.flush();
    }, this.retryMs);
    this.timer.unref();
  }

  /** Queues a record; resolves once it is stored. */
  record(r: UsageRecord): Promise<void> {
    this.queue.push(r);
    const written = new Promise<void>((resolve) => this.waiters.push(resolve));
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => {
        this.scheduled = false;
        void this.flush();
      });
    }
    return written;
  }

  /** Writes what is queued; a failed batch is put back and retried. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(async () => {
      if (this.queue.length === 0) return;
      const batch = this.queue;
      const waiters = this.waiters;
      this.queue = [];
      this.waiters = [];
      try {
        await this.store.insertUsage(batch);
        for (const w of waiters) w();
      } catch (err) {
        this.queue = batch.concat(this.queue);
        this.waiters = waiters.concat(this.waiters);
        this.log.error({ err, records: batch.length }, 'usage ledger write failed; will retry');
      }
    });
    return this.flushing;
  }

  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.flush();
  }
}
