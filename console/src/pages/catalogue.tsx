import { Fragment } from 'preact';
import { useMemo, useState } from 'preact/hooks';
import type { List, Model } from '../api.js';
import { Badge, ErrorBanner, PageHeader, RefreshButton, useLoad, type PageProps } from '../components.js';
import { formatNumber, formatPricing } from '../util.js';

export const MODEL_TYPES = [
  ['text_generation', 'Text generation'],
  ['image_generation', 'Image generation'],
  ['speech_to_text', 'Speech to text'],
  ['text_to_speech', 'Text to speech'],
  ['moderation', 'Moderation'],
] as const;

function typeLabel(t: string): string {
  return MODEL_TYPES.find(([v]) => v === t)?.[1] ?? t;
}

function statusTone(s: string): 'good' | 'warn' | 'bad' | 'muted' {
  return s === 'active' ? 'good' : s === 'pending' ? 'warn' : s === 'deleted' ? 'bad' : 'muted';
}

export function Catalogue({ api, session, params, navigate }: PageProps) {
  const [type, setType] = useState(params.get('type') ?? 'text_generation');
  const [author, setAuthor] = useState(params.get('author') ?? '');
  const [search, setSearch] = useState('');
  const [availableOnly, setAvailableOnly] = useState(false);
  const [everything, setEverything] = useState(false);
  const [open, setOpen] = useState<string | null>(null);
  const admin = session.role === 'admin';

  // The filters are the API's own (`type`, `author` on GET /v1/models); admins may also read the
  // admin catalogue, which has every status and visibility, filtered here the same way.
  const models = useLoad(
    async (signal) => {
      if (everything) {
        const all = await api.get<List<Model>>('/admin/models', signal);
        return all.data.filter((m) => m.model_type === type && (author === '' || m.author === author));
      }
      const q = new URLSearchParams({ type });
      if (author !== '') q.set('author', author);
      return (await api.get<List<Model>>(`/v1/models?${q}`, signal)).data;
    },
    [type, author, everything],
  );

  // The authors offered are those with models of this type.
  const authors = useLoad(
    async (signal) => {
      const list = await api.get<List<Model>>(`/v1/models?type=${encodeURIComponent(type)}`, signal);
      return [...new Set(list.data.map((m) => m.author))].sort();
    },
    [type],
  );

  const setFilter = (nextType: string, nextAuthor: string) => {
    setType(nextType);
    setAuthor(nextAuthor);
    const q = new URLSearchParams();
    if (nextType !== 'text_generation') q.set('type', nextType);
    if (nextAuthor !== '') q.set('author', nextAuthor);
    history.replaceState(null, '', `${location.pathname}${q.size ? `?${q}` : ''}`);
  };

  const shown = useMemo(() => {
    const needle = search.trim().toLowerCase();
    return (models.data ?? []).filter(
      (m) =>
        (!availableOnly || m.available) &&
        (needle === '' ||
          m.id.toLowerCase().includes(needle) ||
          m.name.toLowerCase().includes(needle) ||
          m.description.toLowerCase().includes(needle)),
    );
  }, [models.data, search, availableOnly]);

  return (
    <section>
      <PageHeader title="Catalogue">
        <RefreshButton onClick={models.reload} />
      </PageHeader>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filter the catalogue">
        <div class="field">
          <label for="cat-type">Type</label>
          <select id="cat-type" value={type} data-testid="catalogue-type" onChange={(e) => setFilter(e.currentTarget.value, '')}>
            {MODEL_TYPES.map(([v, l]) => (
              <option key={v} value={v}>
                {l}
              </option>
            ))}
          </select>
        </div>
        <div class="field">
          <label for="cat-author">Author</label>
          <select id="cat-author" value={author} data-testid="catalogue-author" onChange={(e) => setFilter(type, e.currentTarget.value)}>
            <option value="">All authors</option>
            {(authors.data ?? (author ? [author] : [])).map((a) => (
              <option key={a} value={a}>
                {a}
              </option>
            ))}
          </select>
        </div>
        <div class="field grow">
          <label for="cat-search">Search</label>
          <input
            id="cat-search"
            type="search"
            value={search}
            placeholder="id, name or description"
            onInput={(e) => setSearch(e.currentTarget.value)}
          />
        </div>
        <div class="field checkbox">
          <input id="cat-available" type="checkbox" checked={availableOnly} onChange={(e) => setAvailableOnly(e.currentTarget.checked)} />
          <label for="cat-available">Only models that can generate now</label>
        </div>
        {admin && (
          <div class="field checkbox">
            <input id="cat-all" type="checkbox" checked={everything} onChange={(e) => setEverything(e.currentTarget.checked)} />
            <label for="cat-all">Every status and visibility (admin catalogue)</label>
          </div>
        )}
      </form>
      <ErrorBanner error={models.error} />
      <p class="muted" aria-live="polite" data-testid="catalogue-count">
        {models.loading ? 'Loading…' : `${shown.length} model${shown.length === 1 ? '' : 's'}`}
      </p>
      <div class="table-wrap">
        <table data-testid="catalogue-table" aria-busy={models.loading}>
          <caption class="sr-only">Models of type {typeLabel(type)}</caption>
          <thead>
            <tr>
              <th scope="col">Model</th>
              <th scope="col">Author</th>
              <th scope="col">Type</th>
              <th scope="col">Status</th>
              <th scope="col">Context</th>
              <th scope="col">Pricing (USD)</th>
              <th scope="col">Capabilities</th>
              <th scope="col">Can generate now</th>
              <th scope="col">
                <span class="sr-only">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {shown.map((m) => (
              <Fragment key={m.id}>
                <tr data-testid="catalogue-row" data-model-id={m.id}>
                  <th scope="row">
                    <code>{m.id}</code>
                    <div class="muted small">{m.name}</div>
                  </th>
                  <td>{m.author}</td>
                  <td>{typeLabel(m.model_type)}</td>
                  <td>
                    <Badge tone={statusTone(m.status)}>{m.status}</Badge>
                    {m.visibility === 'private' && <Badge tone="muted">private</Badge>}
                  </td>
                  <td class="num">{m.context_length !== undefined ? formatNumber(m.context_length) : '–'}</td>
                  <td class="small">{formatPricing(m.pricing)}</td>
                  <td>
                    <ul class="chips" aria-label="Capabilities">
                      {m.capabilities.map((c) => (
                        <li key={c}>{c.replace(/_/g, ' ')}</li>
                      ))}
                    </ul>
                  </td>
                  <td>{m.available ? <Badge tone="good">yes</Badge> : <Badge tone="muted">no deployment</Badge>}</td>
                  <td class="actions">
                    <button
                      type="button"
                      class="secondary small"
                      aria-expanded={open === m.id}
                      aria-controls={`details-${m.id}`}
                      onClick={() => setOpen(open === m.id ? null : m.id)}
                    >
                      Details<span class="sr-only"> of {m.id}</span>
                    </button>
                    {m.model_type === 'text_generation' && (
                      <button
                        type="button"
                        class="small"
                        onClick={() => navigate(`/console/playground?model=${encodeURIComponent(m.id)}`)}
                        disabled={!m.available}
                        title={m.available ? undefined : 'No local file or deployment serves this model yet'}
                      >
                        Try<span class="sr-only"> {m.id}</span>
                      </button>
                    )}
                  </td>
                </tr>
                {open === m.id && (
                  <tr id={`details-${m.id}`} class="details-row">
                    <td colSpan={9}>
                      <p>{m.description || 'No description.'}</p>
                      <dl class="inline">
                        <dt>Owned by</dt>
                        <dd>{m.owned_by}</dd>
                        <dt>Visibility</dt>
                        <dd>{m.visibility}</dd>
                        {m.output_size !== undefined && (
                          <>
                            <dt>Output size</dt>
                            <dd>{m.output_size}</dd>
                          </>
                        )}
                        {m.source !== undefined && (
                          <>
                            <dt>Source</dt>
                            <dd>{m.source}</dd>
                          </>
                        )}
                      </dl>
                    </td>
                  </tr>
                )}
              </Fragment>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}
