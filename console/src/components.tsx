import type { ComponentChildren } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { ApiFailure, type Api, type List, type Session } from './api.js';
import { copyText } from './util.js';

/** What every page is given. */
export interface PageProps {
  api: Api;
  session: Session;
  params: URLSearchParams;
  navigate: (path: string) => void;
}

export function errorText(err: unknown): string {
  if (err instanceof ApiFailure) return err.code ? `${err.message} (${err.status} ${err.code})` : `${err.message} (${err.status})`;
  if (err instanceof Error) return err.name === 'AbortError' ? 'Stopped.' : err.message;
  return String(err);
}

export function ErrorBanner({ error }: { error: unknown }) {
  if (error === null || error === undefined) return null;
  return (
    <p class="error" role="alert">
      {errorText(error)}
    </p>
  );
}

export interface Loaded<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  reload: () => void;
}

/** Loads something when the page opens (and again on reload or when `deps` change). */
export function useLoad<T>(load: (signal: AbortSignal) => Promise<T>, deps: readonly unknown[]): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const ctrl = new AbortController();
    setLoading(true);
    load(ctrl.signal).then(
      (d) => {
        if (ctrl.signal.aborted) return;
        setData(d);
        setError(null);
        setLoading(false);
      },
      (err: unknown) => {
        if (ctrl.signal.aborted) return;
        setError(err);
        setLoading(false);
      },
    );
    return () => ctrl.abort();
  }, [...deps, tick]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, loading, reload };
}

export interface Paged<T> {
  items: T[];
  hasMore: boolean;
  error: unknown;
  loading: boolean;
  /** Appends the next page (the API's cursor: `after` the last id). */
  more: () => void;
  /** Starts again from the first page. */
  reload: () => void;
}

/**
 * A cursor-paged list of the API (`{data, has_more}`, `after` = the last id, as every OpenAI list):
 * the first page when the page opens, the next one on `more`.
 */
export function usePaged<T extends { id: string }>(api: Api, path: string): Paged<T> {
  const [items, setItems] = useState<T[]>([]);
  const [hasMore, setHasMore] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const [generation, setGeneration] = useState(0);
  const ctrl = useRef<AbortController | null>(null);

  const fetchPage = useCallback(
    (after: string | null) => {
      ctrl.current?.abort();
      const c = new AbortController();
      ctrl.current = c;
      setLoading(true);
      const url = after === null ? path : `${path}${path.includes('?') ? '&' : '?'}after=${encodeURIComponent(after)}`;
      api.get<List<T>>(url, c.signal).then(
        (page) => {
          if (c.signal.aborted) return;
          setItems((prev) => (after === null ? page.data : [...prev, ...page.data]));
          setHasMore(page.has_more === true);
          setError(null);
          setLoading(false);
        },
        (err: unknown) => {
          if (c.signal.aborted) return;
          setError(err);
          setLoading(false);
        },
      );
    },
    [api, path],
  );

  useEffect(() => {
    fetchPage(null);
    return () => ctrl.current?.abort();
  }, [fetchPage, generation]);

  const last = items.at(-1)?.id ?? null;
  const more = useCallback(() => fetchPage(last), [fetchPage, last]);
  const reload = useCallback(() => setGeneration((g) => g + 1), []);
  return { items, hasMore, error, loading, more, reload };
}

/** The "More" button under a paged list, while the API says there is more. */
export function MoreButton({ list, label, testid }: { list: Paged<{ id: string }>; label: string; testid: string }) {
  if (!list.hasMore) return null;
  return (
    <p>
      <button type="button" class="secondary small" onClick={list.more} disabled={list.loading} data-testid={testid}>
        {list.loading ? 'Loading…' : `More ${label}`}
      </button>
    </p>
  );
}

/** Calls `fn` every `ms` while `on`. */
export function useInterval(fn: () => void, ms: number, on: boolean): void {
  const saved = useRef(fn);
  saved.current = fn;
  useEffect(() => {
    if (!on) return undefined;
    const t = setInterval(() => saved.current(), ms);
    return () => clearInterval(t);
  }, [ms, on]);
}

export function Badge({ tone, children }: { tone: 'good' | 'bad' | 'warn' | 'muted' | 'info'; children: ComponentChildren }) {
  return <span class={`badge badge-${tone}`}>{children}</span>;
}

export function CopyButton({ text, label = 'Copy', testid }: { text: string; label?: string; testid?: string }) {
  const [done, setDone] = useState<'' | 'copied' | 'failed'>('');
  return (
    <button
      type="button"
      class="secondary"
      data-testid={testid}
      onClick={() => {
        void copyText(text).then((ok) => {
          setDone(ok ? 'copied' : 'failed');
          setTimeout(() => setDone(''), 2000);
        });
      }}
    >
      {done === 'copied' ? 'Copied' : done === 'failed' ? 'Copy failed: select and copy' : label}
    </button>
  );
}

export function PageHeader({ title, children }: { title: string; children?: ComponentChildren }) {
  return (
    <div class="page-header">
      <h1 tabIndex={-1}>{title}</h1>
      {children !== undefined && <div class="page-actions">{children}</div>}
    </div>
  );
}

/** Reloads what a page shows (every page's header has one). */
export function RefreshButton({ onClick, testId }: { onClick: () => void; testId?: string }) {
  return (
    <button type="button" class="secondary" onClick={onClick} data-testid={testId}>
      Refresh
    </button>
  );
}

/** Shown on admin pages to a key that is not an admin key (the API would answer 403 anyway). */
export function NeedsAdmin() {
  return (
    <section>
      <h1>Admin key needed</h1>
      <p>
        This page uses the admin API; sign in with an admin key to see it. Inference keys see the catalogue, the playground, what they
        stored and their own usage.
      </p>
    </section>
  );
}
