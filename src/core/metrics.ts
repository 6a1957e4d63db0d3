import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Model } from './model-spec.js';

export interface LocalModelGauge {
  model: string;
  active: number;
  queued: number;
}

/**
 * Prometheus metrics, on a registry of this service's own (several servers can share a process in
 * tests). Counters are plain in-memory increments: nothing here waits on I/O.
 */
/** What became of outputs that failed their schema check (see the local engine). */
export interface SchemaOutcomes {
  resampled: number;
  failed: number;
  returnedInvalid: number;
}

export class Metrics {
  readonly registry = new Registry();

  /** The `model` label for a catalogue model (see the constructor). */
  modelLabel(model: Pick<Model, 'id' | 'visibility'>): string {
    return model.visibility === 'private' && !this.revealPrivate ? 'private' : model.id;
  }

  readonly requests: Counter<'route' | 'model' | 'status'>;
  readonly duration: Histogram<'route' | 'model' | 'status'>;
  readonly ttft: Histogram<'route' | 'model'>;
  readonly tokens: Counter<'model' | 'kind'>;
  readonly cost: Counter<'model'>;
  readonly priceMissing: Counter<'model'>;
  readonly rateLimited: Counter<'limit'>;
  readonly upstreamErrors: Counter<'deployment' | 'code'>;
  readonly retries: Counter;
  readonly deploymentUp: Gauge<'deployment'>;
  readonly shed: Counter<'reason'>;
  readonly upstreamUsageInvalid: Counter<'deployment'>;
  readonly ledgerQuarantined: Counter;
  readonly ledgerWritable: Gauge;

  /**
   * `revealPrivate`: the metrics endpoint needs a token, so private model ids may appear in labels.
   * Without one, anybody who can reach /metrics can read it, and private models are labelled
   * `private`: their ids are visible only to their owners.
   */
  constructor(
    local: () => { models: LocalModelGauge[]; schemaViolations: number; schemaOutcomes: SchemaOutcomes },
    private readonly revealPrivate = false,
  ) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: 'switchyard_process_' });
    this.requests = new Counter({
      name: 'switchyard_requests_total',
      help: 'HTTP requests by route, model and status',
      labelNames: ['route', 'model', 'status'],
      registers,
    });
    this.duration = new Histogram({
      name: 'switchyard_request_duration_seconds',
      help: 'HTTP request duration (for streams, until the last event)',
      labelNames: ['route', 'model', 'status'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.ttft = new Histogram({
      name: 'switchyard_time_to_first_token_seconds',
      help: 'Time from request to the first generated event',
      labelNames: ['route', 'model'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.tokens = new Counter({
      name: 'switchyard_tokens_total',
      help: 'Tokens by model and kind (input, cached, output, reasoning)',
      labelNames: ['model', 'kind'],
      registers,
    });
    this.cost = new Counter({
      name: 'switchyard_cost_usd_total',
      help: 'Cost in US dollars of priced requests',
      labelNames: ['model'],
      registers,
    });
    this.priceMissing = new Counter({
      name: 'switchyard_price_missing_total',
      help: 'Requests whose cost is unknown because the model lacks a price',
      labelNames: ['model'],
      registers,
    });
    this.rateLimited = new Counter({
      name: 'switchyard_rate_limited_total',
      help: 'Requests refused by a limit',
      labelNames: ['limit'],
      registers,
    });
    this.upstreamErrors = new Counter({
      name: 'switchyard_upstream_errors_total',
      help: 'Upstream failures by deployment and error code',
      labelNames: ['deployment', 'code'],
      registers,
    });
    this.retries = new Counter({
      name: 'switchyard_upstream_retries_total',
      help: 'Requests retried on another (or the same) deployment',
      registers,
    });
    this.deploymentUp = new Gauge({
      name: 'switchyard_deployment_up',
      help: '0 while a deployment is ejected by the circuit breaker, else 1',
      labelNames: ['deployment'],
      registers,
    });
    this.shed = new Counter({
      name: 'switchyard_shed_total',
      help: 'Requests refused with 503 because the process was overloaded',
      labelNames: ['reason'],
      registers,
    });
    this.upstreamUsageInvalid = new Counter({
      name: 'switchyard_upstream_usage_invalid_total',
      help: 'Upstream answers whose usage was not a count of tokens (billed by estimate instead)',
      labelNames: ['deployment'],
      registers,
    });
    this.ledgerQuarantined = new Counter({
      name: 'switchyard_ledger_quarantined_total',
      help: 'Usage records the database refused, kept in usage_quarantine',
      registers,
    });
    this.ledgerWritable = new Gauge({
      name: 'switchyard_ledger_writable',
      help: '1 while the usage ledger can write to the database, else 0',
      registers,
    });
    this.ledgerWritable.set(1);
    new Gauge({
      name: 'switchyard_local_active_sequences',
      help: 'Requests generating on a local model',
      labelNames: ['model'],
      registers,
      collect() {
        this.reset();
        for (const m of local().models) this.set({ model: m.model }, m.active);
      },
    });
    new Gauge({
      name: 'switchyard_local_queue_depth',
      help: 'Requests waiting for a sequence of a local model',
      labelNames: ['model'],
      registers,
      collect() {
        this.reset();
        for (const m of local().models) this.set({ model: m.model }, m.queued);
      },
    });
    new Gauge({
      name: 'switchyard_schema_violations',
      help: 'Grammar-constrained outputs that failed the JSON-schema check (a bug if not 0)',
      registers,
      collect() {
        this.set(local().schemaViolations);
      },
    });
    new Gauge({
      name: 'switchyard_schema_checks',
      help: 'Schema-checked outputs that failed since start, by what followed: resampled, failed (the request got structured_output_failed), returned_invalid (strict: false tools)',
      labelNames: ['outcome'],
      registers,
      collect() {
        const o = local().schemaOutcomes;
        this.set({ outcome: 'resampled' }, o.resampled);
        this.set({ outcome: 'failed' }, o.failed);
        this.set({ outcome: 'returned_invalid' }, o.returnedInvalid);
      },
    });
  }

  /**
   * Label sets bound once: prom-client hashes the labels on every call (sorting their names), and
   * a request records five to eight samples. A bound child costs one Map lookup. There are as many
   * entries as series prom-client keeps anyway (routes × catalogue models × statuses).
   */
  private readonly requestSeries = new Map<string, { count: { inc(): void }; duration: { observe(v: number): void } }>();
  private readonly ttftSeries = new Map<string, { observe(v: number): void }>();
  private readonly tokenSeries = new Map<string, { inc(n: number): void }>();

  /** One answered HTTP request: its count and duration. */
  countRequest(route: string, model: string, status: number, seconds: number): void {
    const key = `${route}\0${model}\0${status}`;
    let series = this.requestSeries.get(key);
    if (series === undefined) {
      const labels = { route, model, status: String(status) };
      series = { count: this.requests.labels(labels), duration: this.duration.labels(labels) };
      this.requestSeries.set(key, series);
    }
    series.count.inc();
    series.duration.observe(seconds);
  }

  /** A generation's time to its first event. */
  observeTtft(route: string, model: string, seconds: number): void {
    const key = `${route}\0${model}`;
    let series = this.ttftSeries.get(key);
    if (series === undefined) {
      series = this.ttft.labels({ route, model });
      this.ttftSeries.set(key, series);
    }
    series.observe(seconds);
  }

  /** Tokens a generation used, by kind. */
  countTokens(model: string, kind: 'input' | 'cached' | 'output' | 'reasoning', n: number): void {
    const key = `${model}\0${kind}`;
    let series = this.tokenSeries.get(key);
    if (series === undefined) {
      series = this.tokens.labels({ model, kind });
      this.tokenSeries.set(key, series);
    }
    series.inc(n);
  }

  /** Reads the number of API requests in progress (probes and metrics are not counted) at each scrape. */
  trackInFlight(read: () => number): void {
    new Gauge({
      name: 'switchyard_in_flight_requests',
      help: 'API requests in progress (SWITCHYARD_MAX_IN_FLIGHT bounds it)',
      registers: [this.registry],
      collect() {
        this.set(read());
      },
    });
  }
}
