import { Fragment } from 'preact';
import { useRef, useState } from 'preact/hooks';
import type { ApiKey, Limits, List, Org } from '../api.js';
import { Badge, CopyButton, ErrorBanner, PageHeader, RefreshButton, errorText, useLoad, type PageProps } from '../components.js';
import { formatLimits, formatTime } from '../util.js';

interface LimitsDraft {
  rpm: string;
  tpm: string;
  budget: string;
  period: 'day' | 'month';
  models: string;
}

function draftOf(l: Limits | null): LimitsDraft {
  return {
    rpm: l?.rpm !== undefined ? String(l.rpm) : '',
    tpm: l?.tpm !== undefined ? String(l.tpm) : '',
    budget: l?.budget !== undefined ? String(l.budget) : '',
    period: l?.budget_period ?? 'month',
    models: l?.models?.join(', ') ?? '',
  };
}

/** The limits as the API takes them; null when none is set. */
function limitsOf(d: LimitsDraft): Limits | null {
  const out: Limits = {};
  if (d.rpm.trim() !== '') out.rpm = Number(d.rpm);
  if (d.tpm.trim() !== '') out.tpm = Number(d.tpm);
  if (d.budget.trim() !== '') {
    out.budget = Number(d.budget);
    out.budget_period = d.period;
  }
  const models = d.models
    .split(/[\s,]+/)
    .map((m) => m.trim())
    .filter((m) => m !== '');
  if (models.length > 0) out.models = [...new Set(models)];
  return Object.keys(out).length > 0 ? out : null;
}

function LimitsFields({ prefix, draft, onChange }: { prefix: string; draft: LimitsDraft; onChange: (d: LimitsDraft) => void }) {
  const set = (patch: Partial<LimitsDraft>) => onChange({ ...draft, ...patch });
  return (
    <fieldset class="limits">
      <legend>Limits (empty: none)</legend>
      <div class="param-row">
        <div class="field">
          <label for={`${prefix}-rpm`}>Requests / min</label>
          <input
            id={`${prefix}-rpm`}
            type="number"
            min="1"
            step="1"
            value={draft.rpm}
            onInput={(e) => set({ rpm: e.currentTarget.value })}
          />
        </div>
        <div class="field">
          <label for={`${prefix}-tpm`}>Tokens / min</label>
          <input
            id={`${prefix}-tpm`}
            type="number"
            min="1"
            step="1"
            value={draft.tpm}
            onInput={(e) => set({ tpm: e.currentTarget.value })}
          />
        </div>
        <div class="field">
          <label for={`${prefix}-budget`}>Budget (USD)</label>
          <input
            id={`${prefix}-budget`}
            type="number"
            min="0"
            step="0.01"
            value={draft.budget}
            onInput={(e) => set({ budget: e.currentTarget.value })}
          />
        </div>
        <div class="field">
          <label for={`${prefix}-period`}>per</label>
          <select
            id={`${prefix}-period`}
            value={draft.period}
            onChange={(e) => set({ period: e.currentTarget.value === 'day' ? 'day' : 'month' })}
          >
            <option value="day">day</option>
            <option value="month">month</option>
          </select>
        </div>
      </div>
      <div class="field">
        <label for={`${prefix}-models`}>Allowed models (comma-separated ids; empty: all)</label>
        <input
          id={`${prefix}-models`}
          value={draft.models}
          placeholder="local/stories260k, openai/gpt-4o"
          onInput={(e) => set({ models: e.currentTarget.value })}
        />
      </div>
    </fieldset>
  );
}

function LimitsEditor({
  initial,
  onSave,
  onCancel,
}: {
  initial: Limits | null;
  onSave: (l: Limits | null) => Promise<void>;
  onCancel: () => void;
}) {
  const [draft, setDraft] = useState(() => draftOf(initial));
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const save = (limits: Limits | null) => {
    setBusy(true);
    setError(null);
    onSave(limits).catch((err: unknown) => {
      setError(err);
      setBusy(false);
    });
  };
  const prefix = useRef(`lim-${Math.random().toString(36).slice(2, 8)}`).current;
  return (
    <form
      class="limits-editor"
      onSubmit={(e) => {
        e.preventDefault();
        save(limitsOf(draft));
      }}
    >
      <LimitsFields prefix={prefix} draft={draft} onChange={setDraft} />
      <ErrorBanner error={error} />
      <div class="button-row">
        <button type="submit" disabled={busy}>
          Save limits
        </button>
        <button type="button" class="secondary" disabled={busy} onClick={() => save(null)}>
          Remove all limits
        </button>
        <button type="button" class="secondary" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}

const EMPTY_DRAFT: LimitsDraft = { rpm: '', tpm: '', budget: '', period: 'month', models: '' };

function CreateKey({ api, orgs, onCreated }: Pick<PageProps, 'api'> & { orgs: Org[]; onCreated: () => void }) {
  const [org, setOrg] = useState('');
  const [name, setName] = useState('');
  const [role, setRole] = useState<'inference' | 'admin'>('inference');
  const [limits, setLimits] = useState<LimitsDraft>(EMPTY_DRAFT);
  const [withLimits, setWithLimits] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<ApiKey | null>(null);
  const secret = useRef<HTMLInputElement>(null);

  const submit = (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    const body: Record<string, unknown> = { org: org.trim(), name: name.trim(), role };
    const l = withLimits ? limitsOf(limits) : null;
    if (l) body['limits'] = l;
    api.request<ApiKey>('POST', '/admin/keys', body).then(
      (k) => {
        setCreated(k);
        setBusy(false);
        setName('');
        setLimits(EMPTY_DRAFT);
        onCreated();
        requestAnimationFrame(() => secret.current?.select());
      },
      (err: unknown) => {
        setError(err);
        setBusy(false);
      },
    );
  };

  return (
    <section class="card" aria-labelledby="create-key-title">
      <h2 id="create-key-title" class="h3">
        Create a key
      </h2>
      {created?.key !== undefined && (
        <div class="secret" role="status" data-testid="key-created">
          <p>
            <strong>Key created for {created.org}.</strong> Copy it now: this is the only time it is shown (only its hash is stored).
          </p>
          <label for="new-key-secret">Secret of {created.name}</label>
          <div class="row">
            <input
              id="new-key-secret"
              ref={secret}
              class="mono grow"
              readOnly
              value={created.key}
              data-testid="key-secret"
              onFocus={(e) => e.currentTarget.select()}
            />
            <CopyButton text={created.key} testid="key-copy" />
            <button type="button" class="secondary" onClick={() => setCreated(null)}>
              Done
            </button>
          </div>
        </div>
      )}
      <form onSubmit={submit}>
        <div class="param-row">
          <div class="field">
            <label for="key-org">Organization</label>
            <input
              id="key-org"
              list="key-org-list"
              required
              pattern="[a-z0-9][a-z0-9_\-]{0,62}"
              title="Lower-case letters, digits, - and _"
              value={org}
              onInput={(e) => setOrg(e.currentTarget.value)}
              data-testid="key-create-org"
              aria-describedby="key-org-help"
            />
            <datalist id="key-org-list">
              {orgs.map((o) => (
                <option key={o.id} value={o.id} />
              ))}
            </datalist>
            <p id="key-org-help" class="small muted">
              A new organization is created if needed.
            </p>
          </div>
          <div class="field">
            <label for="key-name">Name</label>
            <input
              id="key-name"
              required
              maxLength={200}
              value={name}
              onInput={(e) => setName(e.currentTarget.value)}
              data-testid="key-create-name"
            />
          </div>
          <div class="field">
            <label for="key-role">Role</label>
            <select id="key-role" value={role} onChange={(e) => setRole(e.currentTarget.value === 'admin' ? 'admin' : 'inference')}>
              <option value="inference">inference</option>
              <option value="admin">admin</option>
            </select>
          </div>
        </div>
        <div class="field checkbox">
          <input id="key-with-limits" type="checkbox" checked={withLimits} onChange={(e) => setWithLimits(e.currentTarget.checked)} />
          <label for="key-with-limits">Set limits</label>
        </div>
        {withLimits && <LimitsFields prefix="new-key" draft={limits} onChange={setLimits} />}
        <ErrorBanner error={error} />
        <button type="submit" disabled={busy} data-testid="key-create-submit">
          {busy ? 'Creating…' : 'Create key'}
        </button>
      </form>
    </section>
  );
}

function KeyRow({ k, api, onChanged }: Pick<PageProps, 'api'> & { k: ApiKey; onChanged: () => void }) {
  const [editing, setEditing] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const revoke = () => {
    setError(null);
    api.request('DELETE', `/admin/keys/${encodeURIComponent(k.id)}`).then(
      () => {
        setConfirming(false);
        onChanged();
      },
      (err: unknown) => setError(errorText(err)),
    );
  };
  return (
    <Fragment>
      <tr data-testid="key-row" data-key-id={k.id} data-revoked={k.revoked_at !== null ? 'true' : 'false'}>
        <th scope="row">
          {k.name}
          <div class="muted small">
            <code>{k.id}</code>
          </div>
        </th>
        <td>{k.org}</td>
        <td>{k.role === 'admin' ? <Badge tone="info">admin</Badge> : 'inference'}</td>
        <td class="nowrap">{formatTime(k.created_at)}</td>
        <td>{k.revoked_at !== null ? <Badge tone="bad">revoked {formatTime(k.revoked_at)}</Badge> : <Badge tone="good">active</Badge>}</td>
        <td class="small">{formatLimits(k.limits)}</td>
        <td class="actions">
          {k.revoked_at === null && (
            <>
              <button type="button" class="secondary small" aria-expanded={editing} onClick={() => setEditing(!editing)}>
                Limits<span class="sr-only"> of {k.name}</span>
              </button>
              {confirming ? (
                <span class="confirm" role="group" aria-label={`Confirm revoking ${k.name}`}>
                  <button type="button" class="danger small" onClick={revoke} data-testid="key-revoke-confirm">
                    Revoke
                  </button>
                  <button type="button" class="secondary small" onClick={() => setConfirming(false)}>
                    Cancel
                  </button>
                </span>
              ) : (
                <button type="button" class="danger-outline small" onClick={() => setConfirming(true)} data-testid="key-revoke">
                  Revoke<span class="sr-only"> {k.name}</span>
                </button>
              )}
            </>
          )}
          {error && (
            <p class="error small" role="alert">
              {error}
            </p>
          )}
        </td>
      </tr>
      {editing && (
        <LimitsRow
          api={api}
          path={`/admin/keys/${encodeURIComponent(k.id)}`}
          initial={k.limits}
          colSpan={7}
          onDone={(saved) => {
            setEditing(false);
            if (saved) onChanged();
          }}
        />
      )}
    </Fragment>
  );
}

/** The limits editor under a key's or an organization's row; saving PATCHes `path` with the new limits. */
function LimitsRow({
  api,
  path,
  initial,
  colSpan,
  onDone,
}: Pick<PageProps, 'api'> & { path: string; initial: Limits | null; colSpan: number; onDone: (saved: boolean) => void }) {
  return (
    <tr class="details-row">
      <td colSpan={colSpan}>
        <LimitsEditor
          initial={initial}
          onCancel={() => onDone(false)}
          onSave={async (limits) => {
            await api.request('PATCH', path, { limits });
            onDone(true);
          }}
        />
      </td>
    </tr>
  );
}

function OrgRow({ o, api, keys, onChanged }: Pick<PageProps, 'api'> & { o: Org; keys: number; onChanged: () => void }) {
  const [editing, setEditing] = useState(false);
  return (
    <Fragment>
      <tr data-testid="org-row" data-org-id={o.id}>
        <th scope="row">
          <code>{o.id}</code>
        </th>
        <td>{o.name}</td>
        <td>{formatTime(o.created_at)}</td>
        <td class="num">{keys}</td>
        <td class="small">{formatLimits(o.limits)}</td>
        <td class="actions">
          <button type="button" class="secondary small" aria-expanded={editing} onClick={() => setEditing(!editing)}>
            Limits<span class="sr-only"> of {o.id}</span>
          </button>
        </td>
      </tr>
      {editing && (
        <LimitsRow
          api={api}
          path={`/admin/orgs/${encodeURIComponent(o.id)}`}
          initial={o.limits}
          colSpan={6}
          onDone={(saved) => {
            setEditing(false);
            if (saved) onChanged();
          }}
        />
      )}
    </Fragment>
  );
}

function CreateOrg({ api, onCreated }: Pick<PageProps, 'api'> & { onCreated: () => void }) {
  const [id, setId] = useState('');
  const [name, setName] = useState('');
  const [error, setError] = useState<unknown>(null);
  return (
    <form
      class="filters"
      aria-label="Create an organization"
      onSubmit={(e) => {
        e.preventDefault();
        setError(null);
        const body: Record<string, unknown> = { id: id.trim() };
        if (name.trim() !== '') body['name'] = name.trim();
        api.request('POST', '/admin/orgs', body).then(
          () => {
            setId('');
            setName('');
            onCreated();
          },
          (err: unknown) => setError(err),
        );
      }}
    >
      <div class="field">
        <label for="org-id">New organization id</label>
        <input id="org-id" required pattern="[a-z0-9][a-z0-9_\-]{0,62}" value={id} onInput={(e) => setId(e.currentTarget.value)} />
      </div>
      <div class="field">
        <label for="org-name">Name</label>
        <input id="org-name" maxLength={200} value={name} onInput={(e) => setName(e.currentTarget.value)} />
      </div>
      <div class="field">
        <button type="submit">Create organization</button>
      </div>
      <ErrorBanner error={error} />
    </form>
  );
}

export function Keys({ api }: PageProps) {
  const [org, setOrg] = useState('');
  const [showRevoked, setShowRevoked] = useState(false);
  const data = useLoad(async (signal) => {
    const [keys, orgs] = await Promise.all([api.get<List<ApiKey>>('/admin/keys', signal), api.get<List<Org>>('/admin/orgs', signal)]);
    return { keys: keys.data, orgs: orgs.data };
  }, []);
  const keys = (data.data?.keys ?? []).filter((k) => (org === '' || k.org === org) && (showRevoked || k.revoked_at === null));
  const orgs = data.data?.orgs ?? [];

  return (
    <section>
      <PageHeader title="Keys and organizations">
        <RefreshButton onClick={data.reload} />
      </PageHeader>
      <CreateKey api={api} orgs={orgs} onCreated={data.reload} />
      <ErrorBanner error={data.error} />
      <h2>Keys</h2>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filter keys">
        <div class="field">
          <label for="keys-org">Organization</label>
          <select id="keys-org" value={org} onChange={(e) => setOrg(e.currentTarget.value)}>
            <option value="">All</option>
            {orgs.map((o) => (
              <option key={o.id} value={o.id}>
                {o.id}
              </option>
            ))}
          </select>
        </div>
        <div class="field checkbox">
          <input
            id="keys-revoked"
            type="checkbox"
            checked={showRevoked}
            onChange={(e) => setShowRevoked(e.currentTarget.checked)}
            data-testid="keys-show-revoked"
          />
          <label for="keys-revoked">Show revoked keys</label>
        </div>
      </form>
      <div class="table-wrap">
        <table data-testid="keys-table" aria-busy={data.loading}>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Organization</th>
              <th scope="col">Role</th>
              <th scope="col">Created</th>
              <th scope="col">Status</th>
              <th scope="col">Limits</th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {keys.length === 0 && (
              <tr>
                <td colSpan={7} class="muted">
                  {data.loading ? 'Loading…' : 'No keys.'}
                </td>
              </tr>
            )}
            {keys.map((k) => (
              <KeyRow key={k.id} k={k} api={api} onChanged={data.reload} />
            ))}
          </tbody>
        </table>
      </div>
      <h2>Organizations</h2>
      <CreateOrg api={api} onCreated={data.reload} />
      <div class="table-wrap">
        <table data-testid="orgs-table">
          <thead>
            <tr>
              <th scope="col">Id</th>
              <th scope="col">Name</th>
              <th scope="col">Created</th>
              <th scope="col" class="num">
                Active keys
              </th>
              <th scope="col">Limits</th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {orgs.map((o) => (
              <OrgRow
                key={o.id}
                o={o}
                api={api}
                onChanged={data.reload}
                keys={(data.data?.keys ?? []).filter((k) => k.org === o.id && k.revoked_at === null).length}
              />
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}
