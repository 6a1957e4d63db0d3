import cluster, { type Worker } from 'node:cluster';
import type { Logger } from 'pino';
import { databaseLocation, type Config } from './config.js';
import { MemoryCounters, type Counters } from './core/limits.js';
import { relayBus } from './bus.js';
import { withServerFlags } from './runtime-flags.js';
import { AggregatorRegistry, type Registry } from 'prom-client';

/**
 * SWITCHYARD_WORKERS=N: N worker processes serve one port (node:cluster hands connections out). The
 * primary prepares the database once, restarts a worker that dies, relays the cluster bus (src/bus.ts), and, without Redis, holds the
 * rate-limit counters that every worker shares (workers ask it over IPC). Usage and stored responses
 * go to the shared database from each worker.
 */

type CounterOp = 'add' | 'get' | 'init';
/** A worker's counter operations of one event-loop turn, in order: `[id, op, key, value, ttlMs]` each. */
interface CounterCalls {
  sy: 'counters';
  calls: Array<[number, CounterOp, string, number, number]>;
}
/**
 * The primary's answers to one batch: `[id, value, id, value, …]`, null for a counter that does not
 * exist; `failed` lists the ids whose operation failed (their callers get an error, the rest their values).
 */
interface CounterValues {
  sy: 'counters';
  values: Array<number | null>;
  failed?: number[];
}

const isCalls = (m: unknown): m is CounterCalls =>
  typeof m === 'object' && m !== null && (m as { sy?: unknown }).sy === 'counters' && Array.isArray((m as { calls?: unknown }).calls);
const isValues = (m: unknown): m is CounterValues =>
  typeof m === 'object' && m !== null && (m as { sy?: unknown }).sy === 'counters' && Array.isArray((m as { values?: unknown }).values);

/**
 * The exit code of a server that could not start (its database, its port, a model it must load):
 * sysexits' EX_CONFIG. A worker exiting with it before the service first came up is not replaced.
 */
export const START_FAILED = 78;

/**
 * A worker's view of the primary's counters. The operations asked for in one event-loop turn go to
 * the primary in one IPC message, sent once the turn's I/O callbacks have run (`setImmediate`: no
 * wait beyond the turn), and come back in one: under load a turn admits several requests, and one
 * message per operation (three per request with rpm and tpm limits, each serialized, written to the
 * pipe, read and parsed on both sides) cost a cluster of two workers 90-115 µs of CPU per request
 * on a 2-core machine (bench/README.md, "Counters over IPC in batches"). The primary applies each
 * batch in order, as it applied the messages one by one.
 */
export class IpcCounters implements Counters {
  private seq = 0;
  private readonly pending = new Map<number, { resolve: (v: number | undefined) => void; reject: (e: Error) => void }>();
  private queue: CounterCalls['calls'] = [];
  private scheduled = false;
  private readonly onMessage = (m: unknown) => {
    if (!isValues(m)) return;
    for (const id of m.failed ?? []) {
      const p = this.pending.get(id);
      this.pending.delete(id);
      p?.reject(new Error('the counter operation failed in the primary'));
    }
    const v = m.values;
    for (let i = 0; i + 1 < v.length; i += 2) {
      const id = v[i]!;
      const p = this.pending.get(id);
      if (p === undefined) continue;
      this.pending.delete(id);
      p.resolve(v[i + 1] ?? undefined);
    }
  };
  private readonly flush = () => {
    this.scheduled = false;
    const calls = this.queue;
    this.queue = [];
    if (calls.length === 0) return;
    process.send!({ sy: 'counters', calls } satisfies CounterCalls, undefined, {}, (err: Error | null) => {
      if (!err) return;
      for (const [id] of calls) {
        const p = this.pending.get(id);
        this.pending.delete(id);
        p?.reject(err);
      }
    });
  };

  constructor() {
    process.on('message', this.onMessage);
  }

  private call(op: CounterOp, key: string, value: number, ttlMs: number): Promise<number | undefined> {
    const id = ++this.seq;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.queue.push([id, op, key, value, ttlMs]);
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(this.flush);
      }
    });
  }

  async add(key: string, amount: number, ttlMs: number): Promise<number> {
    return (await this.call('add', key, amount, ttlMs)) ?? amount;
  }

  get(key: string): Promise<number | undefined> {
    return this.call('get', key, 0, 0);
  }

  async init(key: string, value: number, ttlMs: number): Promise<number> {
    return (await this.call('init', key, value, ttlMs)) ?? value;
  }

  async close(): Promise<void> {
    process.off('message', this.onMessage);
    this.queue = [];
    for (const p of this.pending.values()) p.reject(new Error('counters closed'));
    this.pending.clear();
  }
}

/**
 * The primary's side: one worker's batch applied in order, answered in one message. An operation
 * that throws or rejects is answered as failed (its caller gets an error), never left unanswered:
 * a worker has no timeout on these, so a lost answer would hold its request for ever.
 */
function answer(counters: Counters, worker: Worker, m: CounterCalls, log: Logger): void {
  const values: Array<number | null> = [];
  const failed: number[] = [];
  let waits: Array<Promise<unknown>> | undefined;
  const fail = (id: number, err: unknown) => {
    failed.push(id);
    log.warn({ err }, 'counter call failed');
  };
  for (const call of m.calls) {
    const [id, op, key, value, ttlMs] = call;
    let v: ReturnType<Counters['get']>;
    try {
      v = op === 'add' ? counters.add(key, value, ttlMs) : op === 'init' ? counters.init(key, value, ttlMs) : counters.get(key);
    } catch (err) {
      fail(id, err);
      continue;
    }
    if (v instanceof Promise) {
      (waits ??= []).push(
        v.then(
          (x) => values.push(id, x ?? null),
          (err: unknown) => fail(id, err),
        ),
      );
    } else values.push(id, v ?? null);
  }
  const send = () => {
    if (worker.isConnected())
      worker.send({ sy: 'counters', values, ...(failed.length > 0 && { failed }) } satisfies CounterValues, undefined, () => undefined);
  };
  if (waits === undefined) send();
  else void Promise.all(waits).then(send);
}

/**
 * Metrics across the workers: a scrape lands on one worker, which asks the primary, which collects
 * every worker's metrics and sums them (prom-client's AggregatorRegistry; gauges as each declares).
 * Each worker alone would answer for itself, and a counter read from one worker and then another
 * goes backwards.
 */
type MetricsMessage =
  | { sy: 'metrics'; op: 'gather'; id: number }
  | { sy: 'metrics'; op: 'collect'; id: number }
  | { sy: 'metrics'; op: 'collected'; id: number; json: unknown[] }
  | { sy: 'metrics'; op: 'text'; id: number; text: string };
const isMetrics = (m: unknown): m is MetricsMessage => typeof m === 'object' && m !== null && (m as { sy?: unknown }).sy === 'metrics';

/** How long a scrape waits for the other workers before answering with what it has. */
const METRICS_WAIT_MS = 3_000;

/** A worker's side: answers the primary's collections, and renders a scrape from the whole cluster. */
export function clusterMetrics(registry: Registry): () => Promise<string> {
  let seq = 0;
  const waiting = new Map<number, (text: string) => void>();
  process.on('message', (m: unknown) => {
    if (!isMetrics(m)) return;
    if (m.op === 'collect') {
      registry.getMetricsAsJSON().then(
        (json) => process.send?.({ sy: 'metrics', op: 'collected', id: m.id, json } satisfies MetricsMessage),
        () => process.send?.({ sy: 'metrics', op: 'collected', id: m.id, json: [] } satisfies MetricsMessage),
      );
    } else if (m.op === 'text') {
      waiting.get(m.id)?.(m.text);
      waiting.delete(m.id);
    }
  });
  return () => {
    const id = ++seq;
    return new Promise<string>((resolve) => {
      const timer = setTimeout(() => {
        waiting.delete(id);
        resolve(registry.metrics());
      }, METRICS_WAIT_MS + 1_000);
      waiting.set(id, (text) => {
        clearTimeout(timer);
        resolve(text);
      });
      process.send?.({ sy: 'metrics', op: 'gather', id } satisfies MetricsMessage);
    });
  };
}

/** Each worker's last metrics, for a scrape that one of them does not answer in time. */
const lastMetrics = new Map<number, unknown[]>();

/** The primary's side: a worker's scrape (its `replyId`), from every live worker's metrics (collected under `id`). */
function gatherMetricsFor(from: Worker, replyId: number, id: number, log: Logger): void {
  const live = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && w.isConnected());
  const collected = new Map<number, unknown[]>();
  let sent = false;
  const send = () => {
    if (sent) return;
    sent = true;
    clearTimeout(timer);
    for (const [w, listener] of listeners) w.off('message', listener);
    // A worker that did not answer in time (busy, starting) counts with what it answered last:
    // leaving it out would make the sums, and so the counters, go down.
    for (const w of live) {
      const last = lastMetrics.get(w.id);
      if (!collected.has(w.id) && last) collected.set(w.id, last);
    }
    let text: Promise<string>;
    try {
      text = AggregatorRegistry.aggregate([...collected.values()] as Parameters<typeof AggregatorRegistry.aggregate>[0]).metrics();
    } catch (err) {
      text = Promise.reject(err as Error);
    }
    text.then(
      (t) =>
        from.isConnected() &&
        from.send({ sy: 'metrics', op: 'text', id: replyId, text: t } satisfies MetricsMessage, undefined, () => undefined),
      (err: unknown) => log.warn({ err }, "aggregating the workers' metrics failed"),
    );
  };
  const listeners: Array<[Worker, (m: unknown) => void]> = [];
  const timer = setTimeout(send, METRICS_WAIT_MS);
  for (const w of live) {
    const onWorker = (m: unknown) => {
      if (!isMetrics(m) || m.op !== 'collected' || m.id !== id) return;
      collected.set(w.id, m.json);
      lastMetrics.set(w.id, m.json);
      if (collected.size === live.length) send();
    };
    listeners.push([w, onWorker]);
    w.on('message', onWorker);
    // A worker that has just gone counts with what it answered last (or not at all).
    w.send({ sy: 'metrics', op: 'collect', id } satisfies MetricsMessage, undefined, () => undefined);
  }
  if (live.length === 0) send();
}

/**
 * Runs the primary until SIGTERM/SIGINT: forks the workers, serves their counters, restarts any that
 * die (after a pause, so a worker that cannot start does not spin), and on a signal passes it on and
 * waits for every worker to drain. Resolves with the exit code.
 */
export async function runPrimary(config: Config, workers: number, log: Logger): Promise<number> {
  // The bus relay is up before any worker, so no worker's message finds no one to pass it on.
  const closeBus = await relayBus(config, log);
  const counters = config.redisUrl ? undefined : new MemoryCounters();
  let stopping = false;
  let failed = false;
  let startFailed = false;
  // Announced once every worker listens, so "listening" means the whole service is up.
  const listening = new Set<number>();
  let announced = false;
  // Workers run with the server's Node options even when the primary was started without them
  // (execArgv set earlier through setupPrimary is kept).
  cluster.setupPrimary({ execArgv: withServerFlags(cluster.settings.execArgv ?? process.execArgv) });
  // A send to a worker that is exiting fails with EPIPE; without a listener that 'error' would end
  // the primary, and with it every healthy worker. The exit handler below deals with the worker.
  const fork = () => cluster.fork().on('error', (err: Error) => log.debug({ err: err.message }, 'message to an exiting worker dropped'));

  let gathers = 0;
  cluster.on('message', (worker, m: unknown) => {
    if (counters && isCalls(m)) answer(counters, worker, m, log);
    // Each gather has an id of the primary's own (workers' ids may collide), answered under the worker's.
    else if (isMetrics(m) && m.op === 'gather') gatherMetricsFor(worker, m.id, ++gathers, log);
  });
  cluster.on('listening', (worker, address) => {
    listening.add(worker.id);
    if (announced || listening.size < workers) return;
    announced = true;
    log.info(
      { address: `http://${address.address ?? config.host}:${address.port}`, database: databaseLocation(config), workers },
      'switchyard listening',
    );
    log.flush();
  });
  cluster.on('exit', (worker, code, signal) => {
    lastMetrics.delete(worker.id);
    if (stopping) return;
    if (code === START_FAILED && !announced) {
      // The service never came up (the error is on stderr): another worker would fail the same
      // way, so it stops instead of starting workers for ever. Once it served, a replacement that
      // cannot start (a database briefly away) is retried like every dead worker: the others serve.
      log.fatal({ worker: worker.id }, 'a worker could not start; stopping');
      startFailed = true;
      stopService?.('SIGTERM');
      return;
    }
    log.error({ worker: worker.id, code, signal }, 'worker exited; starting another');
    // Not unref()'d: when every worker died at once this timer is all that keeps the primary
    // running, and an unref()'d one let it exit with code 0 instead of starting new workers.
    setTimeout(() => {
      if (!stopping) fork();
    }, 1000);
  });
  let stopService: ((signal: NodeJS.Signals) => void) | undefined;
  for (let i = 0; i < workers; i++) fork();

  return new Promise((resolveExit) => {
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) return;
      stopping = true;
      log.info({ signal, workers }, 'shutting down: workers drain their requests');
      const live = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && !w.isDead());
      let left = live.length;
      const done = () => {
        if (--left > 0) return;
        void counters?.close();
        void closeBus();
        log.info(
          startFailed
            ? 'shut down: the service could not start'
            : failed
              ? 'shut down; a worker did not stop cleanly'
              : 'shut down cleanly',
        );
        resolveExit(startFailed ? START_FAILED : failed ? 1 : 0);
      };
      if (left === 0) {
        left = 1;
        done();
      }
      for (const w of live) {
        w.once('exit', (code, exitSignal) => {
          // A worker stopped by this signal before it ever listened had no requests to drain (it may
          // not even have loaded the code that handles the signal): that is a clean stop too.
          const unstarted = exitSignal === signal && !listening.has(w.id);
          if (code !== 0 && !unstarted) failed = true;
          done();
        });
        w.process.kill(signal);
      }
      // A worker drains for shutdownTimeoutMs and then exits on its own; one that cannot (its event
      // loop blocked by something) is killed shortly after, so a stop never waits for ever.
      setTimeout(() => {
        for (const w of live) {
          if (w.isDead()) continue;
          log.error({ worker: w.id }, 'worker did not stop within the shutdown timeout; killing it');
          failed = true;
          w.process.kill('SIGKILL');
        }
      }, config.shutdownTimeoutMs + 2_000).unref();
    };
    stopService = stop;
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
  });
}
