import { useRef, useState } from 'preact/hooks';
import { failureOf, type Deployment, type List, type LocalLoaded } from '../api.js';
import { Badge, ErrorBanner, PageHeader, RefreshButton, useInterval, useLoad, type PageProps } from '../components.js';
import { formatBytes, formatNumber, formatTime } from '../util.js';

/** Upstream failures by deployment and error code, from the Prometheus text of GET /metrics. */
type ErrorCounts = Map<string, Map<string, number>>;

const ERROR_LINE = /^switchyard_upstream_errors_total\{([^}]*)\}\s+([0-9.eE+-]+)$/;
const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

export function parseUpstreamErrors(text: string): ErrorCounts {
  const out: ErrorCounts = new Map();
  for (const line of text.split('\n')) {
    const m = ERROR_LINE.exec(line.trim());
    if (!m) continue;
    const labels = new Map<string, string>();
    for (const l of (m[1] ?? '').matchAll(LABEL)) labels.set(l[1] ?? '', l[2] ?? '');
    const dep = labels.get('deployment') ?? 'unknown';
    const code = labels.get('code') ?? 'unknown';
    const byCode = out.get(dep) ?? new Map<string, number>();
    byCode.set(code, (byCode.get(code) ?? 0) + Number(m[2]));
    out.set(dep, byCode);
  }
  return out;
}

function total(m: Map<string, number> | undefined): number {
  let n = 0;
  for (const v of m?.values() ?? []) n += v;
  return n;
}

function healthTone(h: Deployment['health']): 'good' | 'bad' | 'warn' | 'muted' {
  return h === 'up' ? 'good' : h === 'ejected' ? 'bad' : h === 'cooling' ? 'warn' : 'muted';
}

interface Status {
  live: boolean;
  ready: { ok: boolean; detail: string };
  deployments: Deployment[];
  local: LocalLoaded;
  errors: ErrorCounts | null;
  errorsNote: string | null;
}

export function Deployments({ api }: PageProps) {
  const [auto, setAuto] = useState(true);
  // Error counts when the page opened, to tell recent errors from old ones.
  const baseline = useRef<ErrorCounts | null>(null);
  const status = useLoad(async (signal): Promise<Status> => {
    const [live, ready, deployments, local, metrics] = await Promise.all([
      fetch('/healthz', { signal, cache: 'no-store' }).then((r) => r.ok),
      fetch('/readyz', { signal, cache: 'no-store' }).then(async (r) => {
        if (r.ok) {
          const body = (await r.json()) as { status?: string; database?: string };
          return { ok: true, detail: `${body.status ?? 'ready'} (${body.database ?? 'database'})` };
        }
        return { ok: false, detail: (await failureOf(r)).message };
      }),
      api.get<List<Deployment>>('/admin/deployments', signal),
      api.get<LocalLoaded>('/admin/local/loaded', signal),
      // /metrics takes its own token when SWITCHYARD_METRICS_TOKEN is set, never an API key.
      fetch('/metrics', { signal, cache: 'no-store', credentials: 'omit' }).then(async (r) =>
        r.ok
          ? { text: await r.text(), note: null }
          : {
              text: null,
              note: `The error counts come from /metrics, which answered ${r.status} (it needs its own token when SWITCHYARD_METRICS_TOKEN is set).`,
            },
      ),
    ]);
    const errors = metrics.text !== null ? parseUpstreamErrors(metrics.text) : null;
    if (errors && baseline.current === null) baseline.current = errors;
    return { live, ready, deployments: deployments.data, local, errors, errorsNote: metrics.note };
  }, []);
  useInterval(status.reload, 5000, auto);

  const s = status.data;
  const loadedBytes = (s?.local.data ?? []).reduce((n, m) => n + m.bytes, 0);
  return (
    <section>
      <PageHeader title="Deployments and local models">
        <div class="field checkbox inline-check">
          <input id="dep-auto" type="checkbox" checked={auto} onChange={(e) => setAuto(e.currentTarget.checked)} />
          <label for="dep-auto">Refresh every 5 s</label>
        </div>
        <RefreshButton onClick={status.reload} />
      </PageHeader>
      <ErrorBanner error={status.error} />
      {s && (
        <>
          <div class="stats" data-testid="service-health">
            <div class="stat">
              <span class="stat-label">Process (/healthz)</span>
              <span class="stat-value">{s.live ? <Badge tone="good">alive</Badge> : <Badge tone="bad">down</Badge>}</span>
            </div>
            <div class="stat">
              <span class="stat-label">Readiness (/readyz)</span>
              <span class="stat-value">
                {s.ready.ok ? <Badge tone="good">{s.ready.detail}</Badge> : <Badge tone="bad">{s.ready.detail}</Badge>}
              </span>
            </div>
            <div class="stat">
              <span class="stat-label">Upstream deployments</span>
              <span class="stat-value">
                {s.deployments.filter((d) => d.health === 'up').length} up / {s.deployments.length}
              </span>
            </div>
            <div class="stat">
              <span class="stat-label">Local models loaded</span>
              <span class="stat-value">
                {s.local.data.length} · {formatBytes(loadedBytes)}
              </span>
            </div>
          </div>

          <h2>Upstream deployments</h2>
          {s.errorsNote && <p class="small muted">{s.errorsNote}</p>}
          {s.deployments.length === 0 ? (
            <p class="muted" data-testid="deployments-empty">
              No upstream deployments: add them in the config file, with the CLI, or with POST /admin/deployments.
            </p>
          ) : (
            <div class="table-wrap">
              <table data-testid="deployments-table">
                <thead>
                  <tr>
                    <th scope="col">Deployment</th>
                    <th scope="col">Model</th>
                    <th scope="col">Upstream</th>
                    <th scope="col">API</th>
                    <th scope="col" class="num">
                      Weight
                    </th>
                    <th scope="col">Health</th>
                    <th scope="col">Errors since start</th>
                    <th scope="col" class="num">
                      Since this page opened
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {s.deployments.map((d) => {
                    const errs = s.errors?.get(d.id);
                    const recent = total(errs) - total(baseline.current?.get(d.id));
                    return (
                      <tr key={d.id} data-testid="deployment-row" data-health={d.health ?? 'unknown'}>
                        <th scope="row">
                          <code>{d.id}</code>
                          <div class="muted small">{d.source}</div>
                        </th>
                        <td>{d.model}</td>
                        <td class="small">
                          <code>{d.base_url}</code>
                          {d.upstream_model !== d.model && <div class="muted">as {d.upstream_model}</div>}
                        </td>
                        <td>{d.api}</td>
                        <td class="num">{d.weight}</td>
                        <td>
                          <Badge tone={healthTone(d.health)}>{d.health ?? 'unknown'}</Badge>
                        </td>
                        <td class="small">
                          {errs && errs.size > 0
                            ? [...errs].map(([code, n]) => `${code}: ${formatNumber(n)}`).join(', ')
                            : s.errors
                              ? 'none'
                              : '–'}
                        </td>
                        <td class="num">{s.errors ? recent > 0 ? <Badge tone="bad">+{formatNumber(recent)}</Badge> : '0' : '–'}</td>
                      </tr>
                    );
                  })}
                </tbody>
              </table>
            </div>
          )}

          <h2>Local models (llama.cpp)</h2>
          {s.local.data.length === 0 ? (
            <p class="muted">No local model is loaded now; one loads on its first request (or at start with SWITCHYARD_LOCAL_PRELOAD).</p>
          ) : (
            <div class="table-wrap">
              <table data-testid="local-table">
                <thead>
                  <tr>
                    <th scope="col">Model</th>
                    <th scope="col">File</th>
                    <th scope="col" class="num">
                      Memory
                    </th>
                    <th scope="col" class="num">
                      Active
                    </th>
                    <th scope="col" class="num">
                      Queued
                    </th>
                    <th scope="col" class="num">
                      Sequences
                    </th>
                    <th scope="col">Last used</th>
                  </tr>
                </thead>
                <tbody>
                  {s.local.data.map((m) => (
                    <tr key={m.file} data-testid="local-row">
                      <th scope="row">{m.model ?? <span class="muted">(not in the catalogue)</span>}</th>
                      <td class="small">
                        <code>{m.file.split('/').pop()}</code>
                      </td>
                      <td class="num">{formatBytes(m.bytes)}</td>
                      <td class="num">{m.active}</td>
                      <td class="num">{m.queued > 0 ? <Badge tone="warn">{m.queued}</Badge> : 0}</td>
                      <td class="num">{m.sequences}</td>
                      <td>{formatTime(m.last_used)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <p class="small muted">
            Structured output: {formatNumber(s.local.schema_violations)} schema violations, {formatNumber(s.local.schema_checks.resampled)}{' '}
            resampled, {formatNumber(s.local.schema_checks.failed)} failed, {formatNumber(s.local.cached_schemas)} compiled schemas cached.
          </p>
        </>
      )}
      {!s && status.loading && <p>Loading…</p>}
    </section>
  );
}
