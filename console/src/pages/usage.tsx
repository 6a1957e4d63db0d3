import { useMemo, useState } from 'preact/hooks';
import type { ApiKey, List, Org, UsageRow } from '../api.js';
import { DayChart, seriesColor, type ChartSeries } from '../chart.js';
import { ErrorBanner, PageHeader, RefreshButton, useInterval, useLoad, type PageProps } from '../components.js';
import { addDays, daysBetween, download, formatCost, formatNumber, isoDay, toCsv } from '../util.js';

type Dimension = 'none' | 'model' | 'key' | 'org';
type Metric = 'requests' | 'tokens' | 'input_tokens' | 'output_tokens' | 'cost' | 'errors';

const METRICS: ReadonlyArray<readonly [Metric, string]> = [
  ['requests', 'Requests'],
  ['tokens', 'Tokens (input + output)'],
  ['input_tokens', 'Input tokens'],
  ['output_tokens', 'Output tokens'],
  ['cost', 'Cost (USD)'],
  ['errors', 'Errors'],
];

/** Series drawn at most; the table lists every group. */
const TOP = 6;

function value(row: UsageRow | undefined, metric: Metric): number {
  if (!row) return 0;
  return metric === 'tokens' ? row.input_tokens + row.output_tokens : row[metric];
}

const FIELDS = [
  'requests',
  'errors',
  'input_tokens',
  'cached_tokens',
  'output_tokens',
  'reasoning_tokens',
  'cost',
  'unpriced_requests',
  'estimated_requests',
] as const;

function sum(rows: readonly UsageRow[]): UsageRow {
  const total: UsageRow = {
    group: 'total',
    requests: 0,
    errors: 0,
    input_tokens: 0,
    cached_tokens: 0,
    output_tokens: 0,
    reasoning_tokens: 0,
    cost: 0,
    unpriced_requests: 0,
    estimated_requests: 0,
  };
  for (const r of rows) for (const f of FIELDS) total[f] += r[f];
  return total;
}

/**
 * Usage from the ledger: an admin key reads everyone's through GET /admin/usage, any other key its
 * own through GET /v1/usage (same query, same answer). Days are UTC, as the ledger keeps them.
 */
export function Usage({ api, session }: PageProps) {
  const admin = session.role === 'admin';
  const endpoint = admin ? '/admin/usage' : '/v1/usage';
  const today = isoDay(new Date());
  const [from, setFrom] = useState(addDays(today, -13));
  const [to, setTo] = useState(today);
  const [metric, setMetric] = useState<Metric>('requests');
  const [dimension, setDimension] = useState<Dimension>('model');
  const [org, setOrg] = useState('');
  const [key, setKey] = useState('');
  const [model, setModel] = useState('');
  const [auto, setAuto] = useState(false);

  // Names of organizations and keys, for the filters and labels: the admin API's, so admins only.
  const names = useLoad(
    async (signal) => {
      if (!admin) return { orgs: [], keys: [] };
      const [orgs, keys] = await Promise.all([api.get<List<Org>>('/admin/orgs', signal), api.get<List<ApiKey>>('/admin/keys', signal)]);
      return { orgs: orgs.data, keys: keys.data };
    },
    [admin],
  );

  const usage = useLoad(
    async (signal) => {
      const base = new URLSearchParams({ from, to });
      if (org) base.set('org', org);
      if (key) base.set('key', key);
      if (model) base.set('model', model);
      const query = (extra: Record<string, string>) => {
        const q = new URLSearchParams(base);
        for (const [k, v] of Object.entries(extra)) q.set(k, v);
        return `${endpoint}?${q}`;
      };
      const models = (await api.get<List<UsageRow>>(query({ group_by: 'model' }), signal)).data;
      if (dimension === 'none') {
        const daily = (await api.get<List<UsageRow>>(query({ group_by: 'day' }), signal)).data;
        return { totals: daily, daily: [{ group: 'All', rows: daily }], models };
      }
      const totals = dimension === 'model' ? models : (await api.get<List<UsageRow>>(query({ group_by: dimension }), signal)).data;
      const top = [...totals].sort((a, b) => value(b, metric) - value(a, metric) || b.requests - a.requests).slice(0, TOP);
      const daily = await Promise.all(
        top.map(async (t) => ({
          group: t.group,
          rows: (await api.get<List<UsageRow>>(query({ group_by: 'day', [dimension]: t.group }), signal)).data,
        })),
      );
      return { totals, daily, models };
    },
    [endpoint, from, to, org, key, model, dimension, metric],
  );
  useInterval(usage.reload, 10_000, auto);

  const keyLabel = (id: string) => {
    if (!admin) return `${id} (this key)`;
    const k = names.data?.keys.find((x) => x.id === id);
    return k ? `${k.name} (${k.org}) · ${id}` : id;
  };
  const label = (group: string) => (dimension === 'key' ? keyLabel(group) : group);

  const days = useMemo(() => (from <= to ? daysBetween(from, to) : []), [from, to]);
  const series: ChartSeries[] = useMemo(
    () =>
      (usage.data?.daily ?? []).map((s) => {
        const byDay = new Map(s.rows.map((r) => [r.group, r]));
        return { label: dimension === 'none' ? 'All' : label(s.group), values: days.map((d) => value(byDay.get(d), metric)) };
      }),
    [usage.data, days, metric, names.data],
  );
  const format = useMemo(() => (metric === 'cost' ? formatCost : (n: number) => formatNumber(Math.round(n * 100) / 100)), [metric]);

  const rows = usage.data?.totals ?? [];
  const total = sum(rows);
  const metricLabel = METRICS.find(([m]) => m === metric)?.[1] ?? metric;

  const exportDaily = () => {
    const header = ['day', dimension === 'none' ? 'group' : dimension, ...FIELDS];
    const out: unknown[][] = [];
    for (const s of usage.data?.daily ?? []) {
      const byDay = new Map(s.rows.map((r) => [r.group, r]));
      for (const d of days) {
        const r = byDay.get(d);
        out.push([d, s.group, ...FIELDS.map((f) => (r ? r[f] : 0))]);
      }
    }
    download(`switchyard-usage-daily-${from}-${to}.csv`, toCsv(header, out));
  };
  const exportTotals = () => {
    const header = [dimension === 'none' ? 'day' : dimension, ...FIELDS];
    download(
      `switchyard-usage-by-${dimension === 'none' ? 'day' : dimension}-${from}-${to}.csv`,
      toCsv(
        header,
        rows.map((r) => [r.group, ...FIELDS.map((f) => r[f])]),
      ),
    );
  };

  const preset = (n: number) => {
    setTo(today);
    setFrom(addDays(today, -(n - 1)));
  };

  return (
    <section>
      <PageHeader title={admin ? 'Usage' : "This key's usage"}>
        <RefreshButton onClick={usage.reload} testId="usage-refresh" />
        <button type="button" class="secondary" onClick={exportDaily} disabled={!usage.data} data-testid="usage-export">
          Export daily CSV
        </button>
        <button type="button" class="secondary" onClick={exportTotals} disabled={!usage.data}>
          Export totals CSV
        </button>
      </PageHeader>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Usage filters">
        <div class="field">
          <label for="usage-from">From (UTC)</label>
          <input
            id="usage-from"
            type="date"
            value={from}
            max={to}
            onChange={(e) => e.currentTarget.value && setFrom(e.currentTarget.value)}
            data-testid="usage-from"
          />
        </div>
        <div class="field">
          <label for="usage-to">To (UTC)</label>
          <input
            id="usage-to"
            type="date"
            value={to}
            min={from}
            onChange={(e) => e.currentTarget.value && setTo(e.currentTarget.value)}
            data-testid="usage-to"
          />
        </div>
        <div class="field">
          <span class="label" id="usage-presets">
            Range
          </span>
          <div class="button-row" role="group" aria-labelledby="usage-presets">
            {[7, 30, 90].map((n) => (
              <button key={n} type="button" class="secondary small" onClick={() => preset(n)}>
                {n} days
              </button>
            ))}
          </div>
        </div>
        <div class="field">
          <label for="usage-metric">Metric</label>
          <select id="usage-metric" value={metric} onChange={(e) => setMetric(e.currentTarget.value as Metric)} data-testid="usage-metric">
            {METRICS.map(([m, l]) => (
              <option key={m} value={m}>
                {l}
              </option>
            ))}
          </select>
        </div>
        <div class="field">
          <label for="usage-dim">By</label>
          <select
            id="usage-dim"
            value={dimension}
            onChange={(e) => setDimension(e.currentTarget.value as Dimension)}
            data-testid="usage-dimension"
          >
            <option value="none">Total</option>
            <option value="model">Model</option>
            <option value="key">Key</option>
            <option value="org">Organization</option>
          </select>
        </div>
        {admin && (
          <>
            <div class="field">
              <label for="usage-org">Organization</label>
              <select
                id="usage-org"
                value={org}
                onChange={(e) => {
                  const next = e.currentTarget.value;
                  setOrg(next);
                  // A key of another organization would filter the new one to nothing, unseen (its option is gone).
                  if (next !== '' && key !== '' && (names.data?.keys ?? []).find((k) => k.id === key)?.org !== next) setKey('');
                }}
              >
                <option value="">All</option>
                {(names.data?.orgs ?? []).map((o) => (
                  <option key={o.id} value={o.id}>
                    {o.id}
                  </option>
                ))}
              </select>
            </div>
            <div class="field">
              <label for="usage-key">Key</label>
              <select id="usage-key" value={key} onChange={(e) => setKey(e.currentTarget.value)}>
                <option value="">All</option>
                {(names.data?.keys ?? [])
                  .filter((k) => org === '' || k.org === org)
                  .map((k) => (
                    <option key={k.id} value={k.id}>
                      {k.name} ({k.org})
                    </option>
                  ))}
              </select>
            </div>
          </>
        )}
        <div class="field">
          <label for="usage-model">Model</label>
          <select id="usage-model" value={model} onChange={(e) => setModel(e.currentTarget.value)}>
            <option value="">All</option>
            {[...new Set([...(usage.data?.models ?? []).map((m) => m.group), ...(model ? [model] : [])])].map((m) => (
              <option key={m} value={m}>
                {m}
              </option>
            ))}
          </select>
        </div>
        <div class="field checkbox">
          <input id="usage-auto" type="checkbox" checked={auto} onChange={(e) => setAuto(e.currentTarget.checked)} />
          <label for="usage-auto">Refresh every 10 s</label>
        </div>
      </form>
      {!admin && (
        <p class="small muted" data-testid="usage-own">
          Only the requests made with the key you signed in with; an admin key sees every key and organization.
        </p>
      )}
      <ErrorBanner error={usage.error ?? names.error} />
      <div class="stats" aria-live="polite" data-testid="usage-stats">
        <div class="stat">
          <span class="stat-label">Requests</span>
          <span class="stat-value" data-testid="usage-total-requests">
            {formatNumber(total.requests)}
          </span>
        </div>
        <div class="stat">
          <span class="stat-label">Tokens in / out</span>
          <span class="stat-value">
            {formatNumber(total.input_tokens)} / {formatNumber(total.output_tokens)}
          </span>
        </div>
        <div class="stat">
          <span class="stat-label">Cost</span>
          <span class="stat-value">{formatCost(total.cost)}</span>
        </div>
        <div class="stat">
          <span class="stat-label">Errors</span>
          <span class="stat-value">{formatNumber(total.errors)}</span>
        </div>
      </div>
      <h2 class="h3">
        {metricLabel} per day{dimension !== 'none' ? `, by ${dimension === 'org' ? 'organization' : dimension}` : ''}
        {dimension !== 'none' && rows.length > TOP ? ` (top ${TOP} of ${rows.length})` : ''}
      </h2>
      {days.length === 0 ? (
        <p class="error">The start of the range is after its end.</p>
      ) : (
        <DayChart days={days} series={series} unit={metricLabel} format={format} testid="usage-chart" />
      )}
      <h2 class="h3">{dimension === 'none' ? 'By day' : `By ${dimension === 'org' ? 'organization' : dimension}`}</h2>
      <div class="table-wrap">
        <table data-testid="usage-table" aria-busy={usage.loading}>
          <thead>
            <tr>
              <th scope="col">
                {dimension === 'none' ? 'Day' : dimension === 'org' ? 'Organization' : dimension === 'key' ? 'Key' : 'Model'}
              </th>
              <th scope="col" class="num">
                Requests
              </th>
              <th scope="col" class="num">
                Errors
              </th>
              <th scope="col" class="num">
                Input
              </th>
              <th scope="col" class="num">
                Cached
              </th>
              <th scope="col" class="num">
                Output
              </th>
              <th scope="col" class="num">
                Reasoning
              </th>
              <th scope="col" class="num">
                Cost
              </th>
              <th scope="col" class="num">
                Unpriced
              </th>
            </tr>
          </thead>
          <tbody>
            {rows.length === 0 && (
              <tr>
                <td colSpan={9} class="muted">
                  {usage.loading ? 'Loading…' : 'No requests in this range.'}
                </td>
              </tr>
            )}
            {rows.map((r) => {
              const i = (usage.data?.daily ?? []).findIndex((s) => s.group === r.group);
              return (
                <tr key={r.group}>
                  <th scope="row">
                    {i >= 0 && dimension !== 'none' && <span class="swatch" style={{ background: seriesColor(i) }} aria-hidden="true" />}
                    {label(r.group)}
                  </th>
                  <td class="num">{formatNumber(r.requests)}</td>
                  <td class="num">{formatNumber(r.errors)}</td>
                  <td class="num">{formatNumber(r.input_tokens)}</td>
                  <td class="num">{formatNumber(r.cached_tokens)}</td>
                  <td class="num">{formatNumber(r.output_tokens)}</td>
                  <td class="num">{formatNumber(r.reasoning_tokens)}</td>
                  <td class="num">{formatCost(r.cost)}</td>
                  <td class="num">{formatNumber(r.unpriced_requests)}</td>
                </tr>
              );
            })}
          </tbody>
          {rows.length > 1 && (
            <tfoot>
              <tr>
                <th scope="row">Total</th>
                <td class="num">{formatNumber(total.requests)}</td>
                <td class="num">{formatNumber(total.errors)}</td>
                <td class="num">{formatNumber(total.input_tokens)}</td>
                <td class="num">{formatNumber(total.cached_tokens)}</td>
                <td class="num">{formatNumber(total.output_tokens)}</td>
                <td class="num">{formatNumber(total.reasoning_tokens)}</td>
                <td class="num">{formatCost(total.cost)}</td>
                <td class="num">{formatNumber(total.unpriced_requests)}</td>
              </tr>
            </tfoot>
          )}
        </table>
      </div>
    </section>
  );
}
