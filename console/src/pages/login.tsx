import { useState } from 'preact/hooks';
import { signIn, type Session } from '../api.js';
import { errorText } from '../components.js';

export function Login({ notice, onSignedIn }: { notice: string | null; onSignedIn: (s: Session) => void }) {
  const [key, setKey] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(notice);

  const submit = (e: Event) => {
    e.preventDefault();
    // A copy and paste can bring white space and invisible characters along (a zero-width space, a
    // byte-order mark), which no key has; anything else outside printable ASCII cannot be in a key,
    // and the browser would refuse to send it in a header with an error of its own.
    const trimmed = key.replace(/[\s\u200b-\u200d\u2060\ufeff]/g, '');
    if (trimmed === '') {
      setError('Enter an API key.');
      return;
    }
    if (/[^\x21-\x7e]/.test(trimmed)) {
      setError('That is not an API key: keys have only letters, digits and ASCII punctuation. Copy it again.');
      return;
    }
    setBusy(true);
    setError(null);
    signIn(trimmed).then(
      (s) => {
        setKey('');
        onSignedIn(s);
      },
      (err: unknown) => {
        setBusy(false);
        setError(errorText(err));
      },
    );
  };

  return (
    <main id="main" class="login">
      <form class="card login-card" method="post" onSubmit={submit} aria-describedby="login-help">
        <h1>Switchyard console</h1>
        <p id="login-help">
          Sign in with an API key: the admin key printed at the first start, or a key an administrator gave you. It stays in this tab's
          session storage and is sent only to this server.
        </p>
        <label for="login-key">API key</label>
        <input
          id="login-key"
          type="password"
          autocomplete="off"
          spellcheck={false}
          required
          value={key}
          placeholder="sk-sy-…"
          aria-invalid={error !== null}
          aria-describedby={error !== null ? 'login-error' : undefined}
          onInput={(e) => setKey(e.currentTarget.value)}
          data-testid="login-key"
        />
        {error !== null && (
          <p id="login-error" class="error" role="alert">
            {error}
          </p>
        )}
        <button type="submit" disabled={busy} data-testid="login-submit">
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </main>
  );
}
