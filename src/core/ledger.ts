import { orderedId } from './ids.js';
import type { Logger } from 'pino';
import { BUSY_LIMIT_MS, busyWait, type QuarantinedUsage, type Store, type UsageRecord } from '../store/store.js';
import type { Usage } from './canonical.js';
import type { Model } from './model-spec.js';

/**
 * Cost of one request from the model's pricing: rates are US dollars per million tokens. Cached
 * input tokens use `cached_input_tokens` when the model prices them, else the input rate. A metric
 * the request used that the model has no price for makes the cost unknown (null), never $0; a free
 * model states a rate of 0.
 */
export function costOf(model: Model, u: Pick<Usage, 'input' | 'cached' | 'output'>): number | null {
  const rate = (metric: string) => model.pricing.find((p) => p.metric === metric)?.rate;
  const input = rate('input_tokens');
  const output = rate('output_tokens');
  const cachedRate = rate('cached_input_tokens') ?? input;
  if ((input === undefined && u.input > 0) || (output === undefined && u.output > 0)) return null;
  const uncached = Math.max(0, u.input - u.cached);
  const dollars = (uncached * (input ?? 0) + u.cached * (cachedRate ?? 0) + u.output * (output ?? 0)) / 1_000_000;
  return Math.round(dollars * 1e10) / 1e10;
}

export const newUsageId = (): string => orderedId('usage');

/** Refused records held in memory while the quarantine table cannot be written; past this they go to the log. */
const MAX_SET_ASIDE = 10_000;

const INTEGER_FIELDS = ['at', 'input_tokens', 'cached_tokens', 'output_tokens', 'reasoning_tokens', 'latency_ms', 'status'] as const;
const TEXT_FIELDS = ['id', 'day', 'request_id', 'key_id', 'org_id', 'model', 'endpoint'] as const;
const NULLABLE_TEXT_FIELDS = ['deployment', 'error_code'] as const;

const isCount = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isTextOrNull = (v: unknown): boolean => v === null || typeof v === 'string';

/**
 * Why a record cannot be stored as it is, or undefined. Checked before the database sees it. The
 * well-formed case reads each field by name (one inline cache per field); the loops in `why`, which
 * read `r[f]` for a varying `f`, made a megamorphic lookup per field on every record.
 */
function malformed(r: UsageRecord): string | undefined {
  const ok =
    isCount(r.at) &&
    isCount(r.input_tokens) &&
    isCount(r.cached_tokens) &&
    isCount(r.output_tokens) &&
    isCount(r.reasoning_tokens) &&
    isCount(r.latency_ms) &&
    isCount(r.status) &&
    (r.cost === null || (typeof r.cost === 'number' && Number.isFinite(r.cost) && r.cost >= 0)) &&
    (r.ttft_ms === null || (typeof r.ttft_ms === 'number' && Number.isSafeInteger(r.ttft_ms))) &&
    typeof r.id === 'string' &&
    typeof r.day === 'string' &&
    typeof r.request_id === 'string' &&
    typeof r.key_id === 'string' &&
    typeof r.org_id === 'string' &&
    typeof r.model === 'string' &&
    typeof r.endpoint === 'string' &&
    isTextOrNull(r.deployment) &&
    isTextOrNull(r.error_code);
  return ok ? undefined : why(r);
}

/** What malformed found wrong, field by field (the lists above, which the fast check must match). */
function why(r: UsageRecord): string | undefined {
  for (const f of INTEGER_FIELDS) {
    const v: unknown = r[f];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) return `${f} is ${JSON.stringify(v)}`;
  }
  if (r.cost !== null && (typeof r.cost !== 'number' || !Number.isFinite(r.cost) || r.cost < 0)) return `cost is ${JSON.stringify(r.cost)}`;
  if (r.ttft_ms !== null && (typeof r.ttft_ms !== 'number' || !Number.isSafeInteger(r.ttft_ms)))
    return `ttft_ms is ${JSON.stringify(r.ttft_ms)}`;
  // The SQLite insert takes each field as an argument, where better-sqlite3 would spread an array
  // over the next columns: a field that is not text is refused here, never bound.
  for (const f of TEXT_FIELDS) if (typeof r[f] !== 'string') return `${f} is ${JSON.stringify(r[f])}`;
  for (const f of NULLABLE_TEXT_FIELDS) if (r[f] !== null && typeof r[f] !== 'string') return `${f} is ${JSON.stringify(r[f])}`;
  return undefined;
}

function quarantined(r: UsageRecord, error: string): QuarantinedUsage {
  let record: string;
  try {
    record = JSON.stringify(r);
  } catch {
    record = String(r.id);
  }
  return { id: String(r.id), at: Date.now(), record, error: error.slice(0, 2000) };
}

/**
 * Writes one record outside the ledger's queue (an abandoned response's, billed by whoever finds
 * it): a record the database refuses for what it holds is set aside in the quarantine, as the
 * ledger does, rather than refused on every try: false. Other failures (busy, down) are thrown, to
 * be tried again. `raw` is the record as it was kept (what is quarantined when it is not a record).
 */
export async function writeOrQuarantine(store: Store, r: UsageRecord | undefined, id: string, raw: string): Promise<boolean> {
  const setAside = async (error: string): Promise<false> => {
    await store.quarantineUsage([{ id, at: Date.now(), record: raw.slice(0, 100_000), error }]);
    return false;
  };
  if (typeof r !== 'object' || r === null) return setAside('not a usage record');
  const bad = malformed(r);
  if (bad !== undefined) return setAside(bad);
  try {
    await store.insertUsage([r]);
    return true;
  } catch (err) {
    if (!store.isDataError(err)) throw err;
    await store.quarantineUsage([quarantined(r, (err as Error).message)]);
    return false;
  }
}

/** A generation being metered, as the ledger sees it. */
export interface OpenMeter {
  /** The server is stopping it (a shutdown timeout): whatever ends it, its record says so. */
  stoppedByServer(): void;
  /** Ends its metering now and queues its record (a forced exit). */
  recordNow(): void;
}

export interface LedgerHooks {
  /** A record the database refused was set aside. */
  onQuarantine?: () => void;
  /** The ledger could (true) or could not (false) write; /readyz follows it. */
  onWritable?: (writable: boolean) => void;
  /** How long the database may stay busy before it counts as not writable (BUSY_LIMIT_MS, 5 s). */
  busyLimitMs?: number;
}

/**
 * The usage ledger. Records are written in group commits: everything recorded during one turn of
 * the event loop goes into one transaction on the next turn, and `record()` resolves once its
 * record is in the database. The API answers a request only after that, so a crash never loses the
 * record of a request whose client got a complete answer.
 *
 * Three kinds of failure, told apart by the store:
 * - the database is busy (SQLite: another worker holds the write lock; the store does not wait for
 *   it): the batch stays queued and is tried again on the next turns, then every few milliseconds,
 *   with what was recorded meanwhile; the event loop serves requests between tries. Busy for longer
 *   than `busyLimitMs`, it counts as the next kind;
 * - the database cannot be written (down, full): the batch stays queued and is retried every
 *   `retryMs`; its requests wait, and `writable` is false (readiness turns 503) until a write works;
 * - the database refuses a record for what it holds: the batch is written record by record and each
 *   refused one is quarantined (kept as JSON in its own table, logged, counted), so one bad record
 *   never holds up the others.
 */
export class Ledger {
  private queue: UsageRecord[] = [];
  private waiters: Array<() => void> = [];
  /** Refused records not yet stored in the quarantine table (it could not be written either). */
  private setAside: QuarantinedUsage[] = [];
  private scheduled = false;
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();
  private canWrite = true;
  /** When (performance.now()) the database was first found busy in the current run of busy tries. */
  private busySince: number | undefined;
  private busyTries = 0;
  private busyRetryScheduled = false;
  private closed = false;
  /** Generations being metered whose record is not queued yet; `close` waits for them. */
  private readonly metering = new Set<OpenMeter>();
  private meteringEnded: (() => void) | undefined;

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly retryMs = 1000,
    private readonly hooks: LedgerHooks = {},
  ) {}

  /** False while the last write failed because the database could not be written. */
  get writable(): boolean {
    return this.canWrite;
  }

  start(): void {
    this.timer = setInterval(() => {
      if (this.queue.length || this.setAside.length) void this.flush();
    }, this.retryMs);
    this.timer.unref();
  }

  /**
   * A generation began (`begin`) or has queued its record (`end`): a shutdown closes the ledger only
   * once every generation it stopped has recorded what it used (a stream whose connection was closed
   * under it records at its engine's next step, after the server has stopped listening).
   */
  begin(meter: OpenMeter): void {
    this.metering.add(meter);
  }

  end(meter: OpenMeter): void {
    if (this.metering.delete(meter) && this.metering.size === 0) this.meteringEnded?.();
  }

  /** A shutdown timeout: every generation still open is about to be stopped by the server, not by its client. */
  stoppingOpen(): void {
    for (const meter of this.metering) meter.stoppedByServer();
  }

  /**
   * The last resort of a stop that could not finish (a generation that did not end when told to):
   * every generation still open records what it used so far, and the queue is written, before the
   * process exits.
   */
  recordOpen(): Promise<void> {
    for (const meter of [...this.metering]) meter.recordNow();
    return this.flushOut();
  }

  /** Queues a record; resolves once it is stored (or quarantined). */
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

  /** Writes what is queued. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(() => this.writeQueued());
    return this.flushing;
  }

  /** Writes what is queued, waiting out a busy database (within the busy limit): for a stop. */
  private async flushOut(): Promise<void> {
    await this.flush();
    while (this.queue.length > 0 && this.busySince !== undefined && this.canWrite) {
      await new Promise((resolve) => setTimeout(resolve, 2));
      await this.flush();
    }
  }

  private get busyLimitMs(): number {
    return this.hooks.busyLimitMs ?? BUSY_LIMIT_MS;
  }

  /** The batch found the database busy and is queued again: try again soon, unless busy too long. */
  private busy(err: unknown): void {
    const now = performance.now();
    this.busySince ??= now;
    if (now - this.busySince > this.busyLimitMs) {
      // Busy this long is a writer holding the lock (or a stuck one): the periodic retry takes over.
      if (this.canWrite) this.log.error({ err, records: this.queue.length }, 'usage ledger: database busy too long; will retry');
      this.setWritable(false);
      return;
    }
    if (this.busyRetryScheduled) return;
    this.busyRetryScheduled = true;
    void busyWait(this.busyTries++).then(() => {
      this.busyRetryScheduled = false;
      // After close() the store is closed: what is still queued was logged there.
      if (!this.closed) void this.flush();
    });
  }

  private setWritable(ok: boolean): void {
    if (ok === this.canWrite) return;
    this.canWrite = ok;
    this.hooks.onWritable?.(ok);
    if (ok) this.log.info('usage ledger writes again');
  }

  private async writeQueued(): Promise<void> {
    if (this.setAside.length) await this.storeQuarantine();
    if (this.queue.length === 0) return;
    const batch = this.queue;
    const waiters = this.waiters;
    this.queue = [];
    this.waiters = [];
    const good: UsageRecord[] = [];
    for (const r of batch) {
      const why = malformed(r);
      if (why) this.quarantine(r, why);
      else good.push(r);
    }
    let done = 0;
    try {
      try {
        await this.store.insertUsage(good);
        done = good.length;
      } catch (err) {
        if (!this.store.isDataError(err)) throw err;
        // Something in the batch was refused: find it by writing one record at a time.
        for (const r of good) {
          try {
            await this.store.insertUsage([r]);
          } catch (one) {
            if (!this.store.isDataError(one)) throw one;
            this.quarantine(r, (one as Error).message);
          }
          done++;
        }
      }
      this.busySince = undefined;
      this.busyTries = 0;
      this.setWritable(true);
      if (this.setAside.length) await this.storeQuarantine();
      for (const w of waiters) w();
    } catch (err) {
      // The database cannot be written: what was not written waits at the head of the queue.
      this.queue = good.slice(done).concat(this.queue);
      this.waiters = waiters.concat(this.waiters);
      if (this.store.isBusyError(err)) return this.busy(err);
      this.setWritable(false);
      this.log.error({ err, records: good.length - done }, 'usage ledger cannot write; will retry');
    }
  }

  private quarantine(r: UsageRecord, error: string): void {
    this.setAside.push(quarantined(r, error));
    this.hooks.onQuarantine?.();
    this.log.error({ usage_id: r.id, request_id: r.request_id, error }, 'usage record refused by the database; kept in usage_quarantine');
  }

  /** Stores set-aside records; false when the database cannot take them now (they stay in memory). */
  private async storeQuarantine(): Promise<boolean> {
    const list = this.setAside;
    this.setAside = [];
    try {
      await this.store.quarantineUsage(list);
      return true;
    } catch (err) {
      this.setAside = list.concat(this.setAside);
      if (this.setAside.length > MAX_SET_ASIDE) {
        const lost = this.setAside.splice(0, this.setAside.length - MAX_SET_ASIDE);
        this.log.error(
          { records: lost.map((q) => q.record) },
          'quarantined usage records dropped from memory (the quarantine table cannot be written)',
        );
      }
      this.log.error({ err, records: list.length }, 'cannot store quarantined usage records; will retry');
      return false;
    }
  }

  async close(): Promise<void> {
    if (this.metering.size > 0)
      await new Promise<void>((resolve) => {
        this.meteringEnded = resolve;
      });
    if (this.timer) clearInterval(this.timer);
    await this.flushOut();
    this.closed = true;
  }
}
