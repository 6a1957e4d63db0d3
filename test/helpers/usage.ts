import type { UsageRecord } from '../../src/store/store.js';

/**
 * A well-formed usage record with `over` applied; `over` may hold values of any type, so tests can
 * build the malformed records an upstream's nonsense would have produced.
 */
export function usageRecord(id: string, over: Partial<Record<keyof UsageRecord, unknown>> = {}): UsageRecord {
  return {
    id,
    at: Date.now(),
    day: '2026-11-24',
    request_id: `req_${id}`,
    key_id: 'key_x',
    org_id: 'acme',
    model: 'meta-llama/tiny-stories',
    deployment: 'd0',
    endpoint: 'chat.completions',
    stream: false,
    input_tokens: 5,
    cached_tokens: 0,
    output_tokens: 3,
    reasoning_tokens: 0,
    cost: 0.001,
    price_missing: false,
    estimated: false,
    latency_ms: 4,
    ttft_ms: 2,
    status: 200,
    error_code: null,
    ...over,
  } as UsageRecord;
}
