import { ApiError } from '../http/errors.js';
import type { Principal } from '../http/auth.js';
import type { GenerationEvent } from './canonical.js';
import { costOf, newUsageId, type Ledger } from './ledger.js';
import type { Metrics } from './metrics.js';
import type { Model } from './model-spec.js';
import type { UsageRecord } from '../store/store.js';

export interface MeterContext {
  model: Model;
  who: Principal;
  endpoint: UsageRecord['endpoint'];
  requestId: string;
  stream: boolean;
  /** When the request arrived (performance.now()). */
  started: number;
  /** Filled by the router with the deployment that served the request. */
  trace: { deployment?: string };
  /** Told what the request used once it ended (rate limits and budgets count it). */
  settle?: (tokens: number, cost: number | null) => void;
}

const dayOf = (ms: number): string => new Date(ms).toISOString().slice(0, 10);

/**
 * Passes a generation's events through unchanged but for the usage event, which gets its cost, and
 * writes one ledger record when the generation ends, whether it succeeded, failed or was cancelled.
 */
export async function* metered(events: AsyncIterable<GenerationEvent>, c: MeterContext, ledger: Ledger, metrics: Metrics): AsyncGenerator<GenerationEvent> {
  let ttft: number | null = null;
  let status = 499;
  let errorCode: string | null = 'cancelled';
  let usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
  let cost: number | null = 0;
  let missing = false;
  try {
    for await (const ev of events) {
      if (ttft === null) {
        ttft = performance.now() - c.started;
        metrics.ttft.observe({ route: c.endpoint, model: c.model.id }, ttft / 1000);
      }
      if (ev.type === 'usage') {
        usage = ev.usage;
        const priced = costOf(c.model, ev.usage);
        cost = priced.cost;
        missing = priced.cost === null;
        yield { type: 'usage', usage: { ...ev.usage, cost: priced.cost } };
        continue;
      }
      if (ev.type === 'finish') {
        status = 200;
        errorCode = null;
      }
      yield ev;
    }
  } catch (err) {
    status = err instanceof ApiError ? err.status : 500;
    errorCode = err instanceof ApiError ? err.code : 'internal_error';
    if (err instanceof ApiError && err.code.startsWith('upstream_')) {
      metrics.upstreamErrors.inc({ deployment: c.trace.deployment ?? 'unknown', code: err.code });
    }
    throw err;
  } finally {
    const now = Date.now();
    const m = c.model.id;
    metrics.tokens.inc({ model: m, kind: 'input' }, usage.input);
    metrics.tokens.inc({ model: m, kind: 'cached' }, usage.cached);
    metrics.tokens.inc({ model: m, kind: 'output' }, usage.output);
    metrics.tokens.inc({ model: m, kind: 'reasoning' }, usage.reasoning);
    c.settle?.(usage.input + usage.output, cost);
    if (missing) metrics.priceMissing.inc({ model: m });
    else if (cost) metrics.cost.inc({ model: m }, cost);
    ledger.record({
      id: newUsageId(),
      at: now,
      day: dayOf(now),
      request_id: c.requestId,
      key_id: c.who.keyId,
      org_id: c.who.orgId,
      model: m,
      deployment: c.trace.deployment ?? null,
      endpoint: c.endpoint,
      stream: c.stream,
      input_tokens: usage.input,
      cached_tokens: usage.cached,
      output_tokens: usage.output,
      reasoning_tokens: usage.reasoning,
      cost,
      price_missing: missing,
      latency_ms: Math.round(performance.now() - c.started),
      ttft_ms: ttft === null ? null : Math.round(ttft),
      status,
      error_code: errorCode,
    });
  }
}
