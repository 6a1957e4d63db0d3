/**
 * `node dist/bench/metrics-record.js [--requests N]`: what recording one generation's metrics costs
 * on the event loop: the six samples a chat completion records (time to first token, input and
 * output tokens, cost, then the request's count and duration), through `Metrics` as the server does,
 * against the same samples given straight to prom-client's children bound once per label set (what
 * `Metrics` did before it kept its own series: prom-client still validates and hashes the labels on
 * every call of a bound child; the old code's key and Map lookup are left out, so the old cost is
 * if anything understated). Also times one scrape of the server's registry (mostly the process
 * metrics). Prints µs per request, medians of five rounds that alternate which goes first.
 * Asserts nothing.
 */
import { parseArgs } from 'node:util';
import { Counter, Histogram, Registry } from 'prom-client';
import { Metrics } from '../src/core/metrics.js';
import { median } from './lib.js';

const { values } = parseArgs({ options: { requests: { type: 'string', default: '200000' } } });
const requests = Number(values.requests);
const MODEL = 'openai/bench-fake';
const ROUTE = '/v1/chat/completions';

const metrics = new Metrics(() => ({ models: [], schemaViolations: 0, schemaOutcomes: { resampled: 0, failed: 0, returnedInvalid: 0 } }));

const registry = new Registry();
const registers = [registry];
const labels = { route: ROUTE, model: MODEL, status: '200' };
const bound = {
  requests: new Counter({ name: 'r', help: 'r', labelNames: ['route', 'model', 'status'], registers }).labels(labels),
  duration: new Histogram({
    name: 'd',
    help: 'd',
    labelNames: ['route', 'model', 'status'],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers,
  }).labels(labels),
  ttft: new Histogram({
    name: 't',
    help: 't',
    labelNames: ['route', 'model'],
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers,
  }).labels({ route: 'chat.completions', model: MODEL }),
  input: undefined as { inc(n: number): void } | undefined,
  output: undefined as { inc(n: number): void } | undefined,
  cost: new Counter({ name: 'c', help: 'c', labelNames: ['model'], registers }).labels({ model: MODEL }),
};
const tokens = new Counter({ name: 'k', help: 'k', labelNames: ['model', 'kind'], registers });
bound.input = tokens.labels({ model: MODEL, kind: 'input' });
bound.output = tokens.labels({ model: MODEL, kind: 'output' });

// Varying values, so every bucket search does not end at the same bound.
const seconds = (i: number) => 0.0008 + (i % 11) * 0.003;

function viaMetrics(i: number): void {
  metrics.observeTtft('chat.completions', MODEL, seconds(i));
  metrics.countTokens(MODEL, 'input', 23);
  metrics.countTokens(MODEL, 'output', 10);
  metrics.countCost(MODEL, 0.0000094);
  metrics.countRequest(ROUTE, MODEL, 200, seconds(i) * 2);
}

function viaPromClient(i: number): void {
  bound.ttft.observe(seconds(i));
  bound.input!.inc(23);
  bound.output!.inc(10);
  bound.cost.inc(0.0000094);
  bound.requests.inc();
  bound.duration.observe(seconds(i) * 2);
}

function time(f: (i: number) => void): number {
  const t = process.hrtime.bigint();
  for (let i = 0; i < requests; i++) f(i);
  return Number(process.hrtime.bigint() - t) / requests / 1000;
}

const subjects = { 'Metrics (own series)': viaMetrics, 'prom-client bound children': viaPromClient };
const results = new Map<string, number[]>();
for (let round = 0; round < 5; round++) {
  const order = round % 2 === 0 ? Object.entries(subjects) : Object.entries(subjects).reverse();
  for (const [name, f] of order) results.set(name, [...(results.get(name) ?? []), time(f)]);
}
for (const [name, us] of results)
  console.log(`${name}: ${median(us).toFixed(3)} µs per request (${us.map((u) => u.toFixed(3)).join(', ')})`);

const scrapes: number[] = [];
for (let i = 0; i < 20; i++) {
  const t = process.hrtime.bigint();
  await metrics.registry.metrics();
  scrapes.push(Number(process.hrtime.bigint() - t) / 1e6);
}
console.log(`one scrape of the server's registry: ${median(scrapes).toFixed(2)} ms`);
