/** The results' shape, the targets (issue 7) and the Markdown table written to bench/README.md. */
import type { IdleStreams, Latency, Throughput } from './gateway.js';
import type { LocalResult } from './local.js';
import type { SchemaBench } from './schemas.js';
import type { ProfileSummary } from './profile.js';

type Name = 'direct' | 'reference' | 'switchyard';

export interface Results {
  date: string;
  quick: boolean;
  machine: { cpus: number; cpu: string; memory_gb: number; node: string };
  targets: typeof TARGETS;
  gateway: {
    throughput: { non_stream: Partial<Record<Name, Throughput>>; stream: Partial<Record<Name, Throughput>> };
    one_connection: { non_stream: Partial<Record<Name, Latency>>; first_chunk: Partial<Record<Name, Latency>> };
    workers: Partial<Record<'workers_1' | 'workers_2', { non_stream: Throughput; stream: Throughput }>>;
    idle_streams?: IdleStreams & { workers: number };
    profile?: ProfileSummary;
  };
  local: LocalResult[];
  schemas?: SchemaBench;
}

/** Issue 19's targets: within 15% of the minimal pass-through, and at most 150 µs added. */
export const TARGETS = {
  non_stream_vs_reference: 0.85,
  stream_vs_reference: 0.85,
  added_p50_ms: 0.15,
  added_first_chunk_ms: 0.15,
  local_vs_raw: 0.95,
  idle_streams_rss_mb: 1024,
};

const f = (n: number | undefined, digits = 0): string =>
  n === undefined || Number.isNaN(n) ? '–' : n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
const ratio = (a: number | undefined, b: number | undefined): number | undefined =>
  a === undefined || b === undefined || b === 0 ? undefined : a / b;
const x = (r: number | undefined): string => (r === undefined ? '–' : `${r.toFixed(2)}×`);
const met = (ok: boolean | undefined): string => (ok === undefined ? '–' : ok ? 'met' : '**missed**');

export function renderTable(r: Results): string {
  const out: string[] = [];
  const g = r.gateway;
  const t = TARGETS;
  const ns = g.throughput.non_stream;
  const st = g.throughput.stream;
  const one = g.one_connection;
  const added = (l: Partial<Record<Name, Latency>>, n: Name) => (l[n] && l.direct ? l[n]!.p50_ms - l.direct.p50_ms : undefined);
  out.push(
    `Run ${r.date}${r.quick ? ' (--quick: short runs, figures not meaningful)' : ''} on ${r.machine.cpus} × ${r.machine.cpu}, ${r.machine.memory_gb} GB, Node ${r.machine.node}.`,
    '',
  );

  out.push('**Targets** (every ratio from this run)', '', '| target | measured | required | |', '|---|---|---|---|');
  if (ns.switchyard) {
    const a = ratio(ns.switchyard.rps, ns.reference?.rps);
    out.push(
      `| non-stream throughput, 1 worker, vs the minimal pass-through | ${x(a)} | ≥ ${t.non_stream_vs_reference}× | ${met(a === undefined ? undefined : a >= t.non_stream_vs_reference)} |`,
    );
    const b = ratio(st.switchyard?.rps, st.reference?.rps);
    out.push(
      `| stream throughput, 1 worker, vs the minimal pass-through | ${x(b)} | ≥ ${t.stream_vs_reference}× | ${met(b === undefined ? undefined : b >= t.stream_vs_reference)} |`,
    );
    const c = added(one.non_stream, 'switchyard');
    out.push(
      `| added p50 at one connection, non-stream | ${f(c === undefined ? undefined : c * 1000)} µs | ≤ ${t.added_p50_ms * 1000} µs | ${met(c === undefined ? undefined : c <= t.added_p50_ms)} |`,
    );
    const d = added(one.first_chunk, 'switchyard');
    out.push(
      `| added before the first chunk, one connection | ${f(d === undefined ? undefined : d * 1000)} µs | ≤ ${t.added_first_chunk_ms * 1000} µs | ${met(d === undefined ? undefined : d <= t.added_first_chunk_ms)} |`,
    );
  }
  for (const l of r.local) {
    for (const run of [l.single, l.four]) {
      out.push(
        `| local engine, ${l.model}, ${run.streams} concurrent request${run.streams > 1 ? 's' : ''} (non-stream), vs raw node-llama-cpp | ${x(run.ratio)} | ≥ ${t.local_vs_raw}× | ${met(run.ratio >= t.local_vs_raw)} |`,
      );
    }
  }
  if (g.idle_streams) {
    const m = g.idle_streams;
    out.push(
      `| RSS with ${f(m.streams)} idle streams (${m.workers} workers, all processes) | ${f(m.rss_mb)} MB | < ${t.idle_streams_rss_mb} MB | ${met(m.rss_mb < t.idle_streams_rss_mb)} |`,
    );
  }

  if (ns.direct || ns.switchyard) {
    out.push(
      '',
      "**Throughput**, 64 connections (autocannon; the direct, reference and 1-worker subjects take turns in bursts of a few seconds, totals over their bursts; latency in ms, the median burst's; 2 workers measured after)",
      '',
      '| | subject | req/s | CPU µs/request | p50 | p90 | p99 | vs reference | vs direct | errors |',
      '|---|---|---|---|---|---|---|---|---|---|',
    );
    for (const [label, set, w] of [
      ['non-stream', ns, 'non_stream'],
      ['stream (20 chunks)', st, 'stream'],
    ] as const) {
      const rows: Array<[string, Throughput | undefined]> = [
        ['direct (fake upstream)', set.direct],
        ['reference pass-through', set.reference],
        ['Switchyard, 1 worker', set.switchyard],
        ['Switchyard, 2 workers', g.workers.workers_2?.[w]],
      ];
      for (const [name, v] of rows) {
        if (!v) continue;
        out.push(
          `| ${label} | ${name} | ${f(v.rps)} | ${f(v.cpu_us_per_request)} | ${f(v.p50_ms, 1)} | ${f(v.p90_ms, 1)} | ${f(v.p99_ms, 1)} | ${x(ratio(v.rps, set.reference?.rps))} | ${x(ratio(v.rps, set.direct?.rps))} | ${v.errors + v.non2xx} |`,
        );
      }
    }
    out.push(
      '',
      '**One connection**, one request at a time, the subjects taking turns in rounds (ms; added = p50 minus direct p50)',
      '',
      '| subject | non-stream p50 | p90 | p99 | added p50 | first chunk p50 | p90 | p99 | added p50 |',
      '|---|---|---|---|---|---|---|---|---|',
    );
    for (const n of ['direct', 'reference', 'switchyard'] as const) {
      const a = one.non_stream[n];
      const b = one.first_chunk[n];
      if (!a || !b) continue;
      out.push(
        `| ${n} | ${f(a.p50_ms, 3)} | ${f(a.p90_ms, 3)} | ${f(a.p99_ms, 3)} | ${f(added(one.non_stream, n), 3)} | ${f(b.p50_ms, 3)} | ${f(b.p90_ms, 3)} | ${f(b.p99_ms, 3)} | ${f(added(one.first_chunk, n), 3)} |`,
      );
    }
  }
  if (r.local.length) {
    out.push(
      '',
      '**Local engine** (tokens/s summed over concurrent requests; time to first token in ms, median, streamed)',
      '',
      '| model | threads | requests | raw tok/s | API tok/s | ratio | API stream tok/s | ratio | raw TTFT | API TTFT |',
      '|---|---|---|---|---|---|---|---|---|---|',
    );
    for (const l of r.local) {
      for (const run of [l.single, l.four]) {
        out.push(
          `| ${l.model} (${l.shape}) | ${l.threads} | ${run.streams} | ${f(run.raw_tps)} | ${f(run.api_tps)} | ${x(run.ratio)} | ${f(run.api_stream_tps)} | ${x(run.stream_ratio)} | ${f(run.raw_ttft_ms, 1)} | ${f(run.api_ttft_ms, 1)} |`,
        );
      }
    }
  }
  if (g.idle_streams) {
    const m = g.idle_streams;
    out.push(
      '',
      `**Idle streams**: ${f(m.streams)} open streams, each with its upstream stream held open: RSS ${f(m.rss_before_mb)} MB before, ${f(m.rss_mb)} MB with them open (${f(m.per_stream_kb, 1)} KB per stream), ${m.workers} workers. All closed at once by their clients: ${f(m.close_cpu_us_per_stream)} µs of CPU per stream, and /healthz answered within ${f(m.close_worst_probe_ms)} ms meanwhile.`,
    );
  }
  if (g.profile) {
    const p = g.profile;
    out.push(
      '',
      `**Where Switchyard's time goes** (1 worker, V8 CPU profile of ${f(p.sampled_ms)} ms under the non-stream then the stream load; self time; the whole profile is written to \`results/<date>.cpuprofile\`, not committed)`,
      '',
      '| package or file | share | function | share |',
      '|---|---|---|---|',
    );
    for (let i = 0; i < Math.max(p.by_package.length, p.by_function.length); i++) {
      const a = p.by_package[i];
      const b = p.by_function[i];
      out.push(`| ${a ? `\`${a.name}\`` : ''} | ${a ? `${a.percent}%` : ''} | ${b ? `\`${b.name}\`` : ''} | ${b ? `${b.percent}%` : ''} |`);
    }
  }
  return out.join('\n');
}
