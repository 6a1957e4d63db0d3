import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { MetricObjectWithValues, MetricType, MetricValueWithName } from 'prom-client';
import type { Model } from './model-spec.js';

/**
 * The per-request metrics, kept as plain numbers and handed to prom-client only when scraped.
 * prom-client validates and hashes the label set on every call, bound children included (about
 * 5 µs per request for the six samples a generation records; `bench/metrics-record.ts`). Here a
 * series is bound once per label set and a sample is an addition (a bucket search for a histogram).
 */
class CounterSeries {
  total = 0;
  constructor(readonly labels: Readonly<Record<string, string>>) {}
  /** Not a finite count of zero or more: dropped (prom-client threw; a scrape must never fail over one sample). */
  inc(n = 1): void {
    if (n >= 0 && n < Infinity) this.total += n;
  }
}

/** A series' labels as a scrape shows them (see Metrics.exported). */
type Relabel = (labels: Readonly<Record<string, string>>) => Readonly<Record<string, string>>;

/**
 * A counter whose series are CounterSeries; prom-client's own state is rebuilt from them at each
 * scrape (series that a scrape shows under the same labels are added up).
 */
function seriesCounter(
  o: { name: string; help: string; labelNames: readonly string[]; registers: Registry[] },
  series: () => Iterable<CounterSeries>,
  relabel: Relabel,
): Counter {
  return new Counter({
    ...o,
    collect() {
      this.reset();
      for (const s of series()) if (s.total > 0) this.inc(relabel(s.labels), s.total);
    },
  });
}

class HistogramSeries {
  /** Observations per bucket (not cumulative): counts[i] is (bounds[i-1], bounds[i]], the last one above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  constructor(
    readonly labels: Readonly<Record<string, string>>,
    private readonly bounds: readonly number[],
  ) {
    this.counts = new Float64Array(bounds.length + 1);
  }
  observe(v: number): void {
    if (!Number.isFinite(v)) return;
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && v > bounds[i]!) i++;
    this.counts[i]! += 1;
    this.sum += v;
    this.count += 1;
  }
}

/**
 * A histogram whose series are HistogramSeries, exported in prom-client's own shape (buckets, +Inf,
 * _sum, _count). Only `bind` feeds it: the inherited observe/labels/zero change nothing it exports,
 * and `registry.resetMetrics()` does not clear these series (nothing here calls it).
 */
class SeriesHistogram extends Histogram {
  private readonly bounds: readonly number[];
  private readonly series = new Map<string, HistogramSeries>();
  private readonly metricName: string;
  private readonly metricHelp: string;
  private readonly relabel: Relabel;

  constructor(
    o: { name: string; help: string; labelNames: readonly string[]; buckets: number[]; registers: Registry[] },
    relabel: Relabel,
  ) {
    super(o);
    this.metricName = o.name;
    this.metricHelp = o.help;
    this.bounds = [...o.buckets].sort((a, b) => a - b);
    this.relabel = relabel;
  }

  /** A new series for a label set not seen before. */
  add(key: string, labels: Readonly<Record<string, string>>): HistogramSeries {
    const s = new HistogramSeries(labels, this.bounds);
    this.series.set(key, s);
    return s;
  }

  override async get(): Promise<MetricObjectWithValues<MetricValueWithName<string>>> {
    const name = this.metricName;
    const values: Array<MetricValueWithName<string>> = [];
    const bucket = `${name}_bucket`;
    // Series a scrape shows under the same labels are added up into one (into a copy: a scrape
    // never changes a series' own counts).
    const shown = new Map<string, { labels: Readonly<Record<string, string>>; counts: Float64Array; sum: number; count: number }>();
    for (const series of this.series.values()) {
      const labels = this.relabel(series.labels);
      const key = JSON.stringify(labels);
      const into = shown.get(key);
      if (into === undefined) {
        shown.set(key, { labels, counts: series.counts, sum: series.sum, count: series.count });
        continue;
      }
      const counts = Float64Array.from(into.counts);
      series.counts.forEach((n, i) => (counts[i]! += n));
      shown.set(key, { labels, counts, sum: into.sum + series.sum, count: into.count + series.count });
    }
    for (const s of shown.values()) {
      let acc = 0;
      this.bounds.forEach((le, i) => {
        acc += s.counts[i]!;
        values.push({ metricName: bucket, labels: { le, ...s.labels }, value: acc });
      });
      values.push({ metricName: bucket, labels: { le: '+Inf', ...s.labels }, value: s.count });
      values.push({ metricName: `${name}_sum`, labels: { ...s.labels }, value: s.sum });
      values.push({ metricName: `${name}_count`, labels: { ...s.labels }, value: s.count });
    }
    // prom-client's typings declare `type` as a numeric enum that its runtime never uses: the
    // registry writes this field into the exposition as it is, so it is the text `histogram`.
    const type = 'histogram' as unknown as MetricType;
    return { name, help: this.metricHelp, type, aggregator: 'sum', values, collect: () => undefined };
  }

  /** The registry's text exposition reads this when present (prom-client's own reads its internal map). */
  getForPromString(): Promise<MetricObjectWithValues<MetricValueWithName<string>>> {
    return this.get();
  }
}

type TokenKind = 'input' | 'cached' | 'output' | 'reasoning';

/** A local-model gauge's values added up per label: several private models share `private`. */
function perModel(models: readonly LocalModelGauge[], key: 'active' | 'queued'): Map<string, number> {
  const by = new Map<string, number>();
  for (const m of models) by.set(m.model, (by.get(m.model) ?? 0) + m[key]);
  return by;
}

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
  /** The exposition a scrape answers: this registry's, or (in a worker of several) the whole cluster's. */
  text: () => Promise<string> = () => this.registry.metrics();

  /** The `model` label for a catalogue model (see the constructor). */
  modelLabel(model: Pick<Model, 'id' | 'visibility'>): string {
    return model.visibility === 'private' && !this.revealPrivate ? 'private' : model.id;
  }

  /**
   * Whether a model id is private now (the catalogue's answer, set by the app). A series is labelled
   * when its first request is counted; a model made private since then must not go on being named
   * by an open scrape (an outside pass found it there), so a scrape shows such series as `private`.
   */
  isPrivate: (id: string) => boolean = () => false;

  /** A series' labels as a scrape shows them: a model that is private now is `private` (unless the endpoint needs a token). */
  private readonly exported: Relabel = (labels) => {
    const model = labels['model'];
    if (this.revealPrivate || model === undefined || model === 'private' || !this.isPrivate(model)) return labels;
    return { ...labels, model: 'private' };
  };

  private readonly duration: SeriesHistogram;
  private readonly ttft: SeriesHistogram;
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
    collectDefaultMetrics({ register: this.registry, prefix: 'switchyard_' });
    seriesCounter(
      {
        name: 'switchyard_requests_total',
        help: 'HTTP requests by route, model and status',
        labelNames: ['route', 'model', 'status'],
        registers,
      },
      () => this.requestCounts(),
      this.exported,
    );
    this.duration = new SeriesHistogram(
      {
        name: 'switchyard_request_duration_seconds',
        help: 'HTTP request duration (for streams, until the last event)',
        labelNames: ['route', 'model', 'status'],
        buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
        registers,
      },
      this.exported,
    );
    this.ttft = new SeriesHistogram(
      {
        name: 'switchyard_time_to_first_token_seconds',
        help: 'Time from request to the first generated event',
        labelNames: ['route', 'model'],
        buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        registers,
      },
      this.exported,
    );
    seriesCounter(
      {
        name: 'switchyard_tokens_total',
        help: 'Tokens by model and kind (input, cached, output, reasoning)',
        labelNames: ['model', 'kind'],
        registers,
      },
      () => this.tokenCounts(),
      this.exported,
    );
    seriesCounter(
      { name: 'switchyard_cost_usd_total', help: 'Cost in US dollars of priced requests', labelNames: ['model'], registers },
      () => this.costSeries.values(),
      this.exported,
    );
    seriesCounter(
      {
        name: 'switchyard_price_missing_total',
        help: 'Requests whose cost is unknown because the model lacks a price',
        labelNames: ['model'],
        registers,
      },
      () => this.priceMissingSeries.values(),
      this.exported,
    );
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
      // Across workers (a cluster's scrape): 0 if any worker has it ejected.
      aggregator: 'min',
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
      aggregator: 'min',
    });
    this.ledgerWritable.set(1);
    new Gauge({
      name: 'switchyard_local_active_sequences',
      help: 'Requests generating on a local model',
      labelNames: ['model'],
      registers,
      collect() {
        this.reset();
        for (const [model, n] of perModel(local().models, 'active')) this.set({ model }, n);
      },
    });
    new Gauge({
      name: 'switchyard_local_queue_depth',
      help: 'Requests waiting for a sequence of a local model',
      labelNames: ['model'],
      registers,
      collect() {
        this.reset();
        for (const [model, n] of perModel(local().models, 'queued')) this.set({ model }, n);
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
   * The series of each label set, one Map level per label. Each lookup hashes a value its caller
   * already holds (the route's and the model's own strings, whose hash V8 keeps, and a status
   * number): a key built from the labels was a new string on every request, hashed each time, and
   * those hashes were a few percent of a request's instructions (bench/README.md).
   */
  private readonly requestSeries = new Map<string, Map<string, Map<number, { count: CounterSeries; duration: HistogramSeries }>>>();
  private readonly ttftSeries = new Map<string, Map<string, HistogramSeries>>();
  private readonly tokenSeries = new Map<string, Record<TokenKind, CounterSeries>>();
  private readonly costSeries = new Map<string, CounterSeries>();
  private readonly priceMissingSeries = new Map<string, CounterSeries>();

  /** One answered HTTP request: its count and duration. */
  countRequest(route: string, model: string, status: number, seconds: number): void {
    let byModel = this.requestSeries.get(route);
    if (byModel === undefined) this.requestSeries.set(route, (byModel = new Map()));
    let byStatus = byModel.get(model);
    if (byStatus === undefined) byModel.set(model, (byStatus = new Map()));
    let series = byStatus.get(status);
    if (series === undefined) {
      const labels = { route, model, status: String(status) };
      series = { count: new CounterSeries(labels), duration: this.duration.add(`${route}\0${model}\0${status}`, labels) };
      byStatus.set(status, series);
    }
    series.count.inc();
    series.duration.observe(seconds);
  }

  /** The request counters, read at scrape. */
  private *requestCounts(): Iterable<CounterSeries> {
    for (const byModel of this.requestSeries.values())
      for (const byStatus of byModel.values()) for (const s of byStatus.values()) yield s.count;
  }

  /** A generation's time to its first event. */
  observeTtft(route: string, model: string, seconds: number): void {
    let byModel = this.ttftSeries.get(route);
    if (byModel === undefined) this.ttftSeries.set(route, (byModel = new Map()));
    let series = byModel.get(model);
    if (series === undefined) byModel.set(model, (series = this.ttft.add(`${route}\0${model}`, { route, model })));
    series.observe(seconds);
  }

  /** Tokens a generation used, by kind. */
  countTokens(model: string, kind: TokenKind, n: number): void {
    let series = this.tokenSeries.get(model);
    if (series === undefined) {
      series = {
        input: new CounterSeries({ model, kind: 'input' }),
        cached: new CounterSeries({ model, kind: 'cached' }),
        output: new CounterSeries({ model, kind: 'output' }),
        reasoning: new CounterSeries({ model, kind: 'reasoning' }),
      };
      this.tokenSeries.set(model, series);
    }
    series[kind].inc(n);
  }

  /** The token counters, read at scrape. */
  private *tokenCounts(): Iterable<CounterSeries> {
    for (const s of this.tokenSeries.values()) yield* [s.input, s.cached, s.output, s.reasoning];
  }

  /** The cost of a priced request, in US dollars. */
  countCost(model: string, dollars: number): void {
    let series = this.costSeries.get(model);
    if (series === undefined) {
      series = new CounterSeries({ model });
      this.costSeries.set(model, series);
    }
    series.inc(dollars);
  }

  /** A request whose cost is unknown: its model lacks a price. */
  countPriceMissing(model: string): void {
    let series = this.priceMissingSeries.get(model);
    if (series === undefined) {
      series = new CounterSeries({ model });
      this.priceMissingSeries.set(model, series);
    }
    series.inc();
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
