import { render, type JSX } from 'preact';
import { useCallback, useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { Api, ApiFailure, readStoredKey, readStoredRole, signIn, writeStoredKey, type Session } from './api.js';
import { errorText, NeedsAdmin, type PageProps } from './components.js';
import { Login } from './pages/login.js';
import { Catalogue } from './pages/catalogue.js';
import { Playground } from './pages/playground.js';
import { Stored } from './pages/stored.js';
import { Usage } from './pages/usage.js';
import { Keys } from './pages/keys.js';
import { Deployments } from './pages/deployments.js';
import './styles.css';

const BASE = '/console';

interface Route {
  path: string;
  label: string;
  admin: boolean;
  page: (p: PageProps) => JSX.Element;
}

const ROUTES: readonly Route[] = [
  { path: 'catalogue', label: 'Catalogue', admin: false, page: Catalogue },
  { path: 'playground', label: 'Playground', admin: false, page: Playground },
  { path: 'stored', label: 'Stored', admin: false, page: Stored },
  { path: 'usage', label: 'Usage', admin: false, page: Usage },
  { path: 'keys', label: 'Keys & orgs', admin: true, page: Keys },
  { path: 'deployments', label: 'Deployments', admin: true, page: Deployments },
];

function currentRoute(): { route: Route | undefined; params: URLSearchParams } {
  const rest = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length).replace(/^\/+|\/+$/g, '') : '';
  const route = rest === '' ? ROUTES[0] : ROUTES.find((r) => r.path === rest);
  return { route, params: new URLSearchParams(location.search) };
}

function App() {
  const [session, setSession] = useState<Session | null>(null);
  const [checking, setChecking] = useState(readStoredKey() !== null);
  const [notice, setNotice] = useState<string | null>(null);
  const [location_, setLocation] = useState(() => currentRoute());
  const main = useRef<HTMLElement>(null);

  const signOut = useCallback((why: string | null = null) => {
    writeStoredKey(null);
    setSession(null);
    setNotice(why);
  }, []);

  // A key kept from earlier in this tab's session is checked again (it may have been revoked).
  useEffect(() => {
    const key = readStoredKey();
    if (key === null) return;
    signIn(key, readStoredRole()).then(
      (s) => {
        setSession(s);
        setChecking(false);
      },
      (err: unknown) => {
        if (err instanceof ApiFailure && err.status === 401) writeStoredKey(null);
        setNotice(errorText(err));
        setChecking(false);
      },
    );
  }, []);

  useEffect(() => {
    const onPop = () => setLocation(currentRoute());
    addEventListener('popstate', onPop);
    return () => removeEventListener('popstate', onPop);
  }, []);

  const navigate = useCallback((path: string) => {
    history.pushState(null, '', path.startsWith('/') ? path : `${BASE}/${path}`);
    setLocation(currentRoute());
    // The new page's heading is where keyboard and screen-reader users continue.
    requestAnimationFrame(() => main.current?.querySelector<HTMLElement>('h1')?.focus());
  }, []);

  const api = useMemo(
    () => (session ? new Api(session.key, () => signOut('The key is no longer accepted (revoked?); sign in again.')) : null),
    [session, signOut],
  );

  useEffect(() => {
    const label = location_.route?.label ?? 'Not found';
    document.title = session ? `${label} · Switchyard console` : 'Sign in · Switchyard console';
  }, [location_, session]);

  if (checking) return <p class="loading-screen">Checking the saved key…</p>;
  if (!session || !api) {
    return (
      <Login
        notice={notice}
        onSignedIn={(s) => {
          writeStoredKey(s);
          setNotice(null);
          setSession(s);
        }}
      />
    );
  }

  const { route, params } = location_;
  const visible = ROUTES.filter((r) => !r.admin || session.role === 'admin');
  const Page = route?.page;
  return (
    <>
      <a class="skip-link" href="#main">
        Skip to content
      </a>
      <header class="topbar">
        <a
          class="brand"
          href={`${BASE}/`}
          onClick={(e) => {
            e.preventDefault();
            navigate(`${BASE}/`);
          }}
        >
          Switchyard
        </a>
        <nav aria-label="Console pages">
          <ul>
            {visible.map((r) => (
              <li key={r.path}>
                <a
                  href={`${BASE}/${r.path}`}
                  aria-current={route === r ? 'page' : undefined}
                  data-testid={`nav-${r.path}`}
                  onClick={(e) => {
                    if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
                    e.preventDefault();
                    navigate(`${BASE}/${r.path}`);
                  }}
                >
                  {r.label}
                </a>
              </li>
            ))}
          </ul>
        </nav>
        <div class="who">
          <span class={`badge ${session.role === 'admin' ? 'badge-info' : 'badge-muted'}`} data-testid="session-role">
            {session.role} key
          </span>
          <button type="button" class="secondary" onClick={() => signOut(null)} data-testid="sign-out">
            Sign out
          </button>
        </div>
      </header>
      <main id="main" ref={main} tabIndex={-1}>
        {!Page ? (
          <section>
            <h1 tabIndex={-1}>Page not found</h1>
            <p>
              <a href={`${BASE}/`}>Go to the catalogue</a>
            </p>
          </section>
        ) : route.admin && session.role !== 'admin' ? (
          <NeedsAdmin />
        ) : (
          <Page key={route.path} api={api} session={session} params={params} navigate={navigate} />
        )}
      </main>
    </>
  );
}

const root = document.getElementById('app');
if (root) render(<App />, root);
