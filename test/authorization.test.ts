import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createKey, http, startServer, type TestServer } from './helpers/server.js';

type Who = 'none' | 'malformed' | 'revoked' | 'otherOrg' | 'inference' | 'admin';
const WHO: Who[] = ['none', 'malformed', 'revoked', 'otherOrg', 'inference', 'admin'];

const LOCAL = 'local/stories260k';
const PRIVATE = 'meta-llama/acme-secret';

interface Cell {
  method: string;
  /** The path, built per call so that destructive requests get a fresh resource each. */
  path: () => Promise<string> | string;
  body?: object;
  /** Expected status for an inference key of another org, of the owner org, and for the admin key. */
  expect: [otherOrg: number, inference: number, admin: number];
}

describe('authorization matrix: every endpoint × every kind of caller', () => {
  let s: TestServer;
  const keys = {} as Record<Exclude<Who, 'none'>, string>;
  let acmeKeyId = '';
  let responseId = '';
  let conversationId = '';
  let itemId = '';
  let storedChatId = '';
  let n = 0;

  const as = (who: Who, method: string, path: string, body?: object) => {
    const headers: Record<string, string> = {};
    if (who === 'malformed') headers['authorization'] = 'Bearer not a key';
    else if (who !== 'none') headers['authorization'] = `Bearer ${keys[who]}`;
    return http(s.url, method, path, { headers, ...(body !== undefined && { body }) });
  };
  const ok = async <T>(method: string, path: string, body?: object): Promise<T> => {
    const r = await as('inference', method, path, body);
    assert.ok(r.status < 300, `${method} ${path}: ${r.status} ${r.text}`);
    return r.json as T;
  };
  const freshResponse = async () =>
    (await ok<{ id: string }>('POST', '/v1/responses', { model: LOCAL, input: 'Once', max_output_tokens: 2 })).id;
  const freshConversation = async () =>
    (await ok<{ id: string }>('POST', '/v1/conversations', { items: [{ type: 'message', role: 'user', content: 'hi' }] })).id;
  const freshStoredChat = async () =>
    (
      await ok<{ id: string }>('POST', '/v1/chat/completions', {
        model: LOCAL,
        messages: [{ role: 'user', content: 'Once' }],
        max_tokens: 2,
        store: true,
      })
    ).id;
  const adminPost = async <T>(path: string, body: object): Promise<T> => {
    const r = await http<T>(s.url, 'POST', path, { key: s.adminKey, body });
    assert.equal(r.status, 201, r.text);
    return r.json;
  };

  before(async () => {
    s = await startServer({ env: { SWITCHYARD_KEY_CACHE_TTL_MS: '0' } });
    keys.admin = s.adminKey;
    const acme = await createKey(s, 'acme');
    keys.inference = acme.key;
    acmeKeyId = acme.id;
    keys.otherOrg = (await createKey(s, 'globex')).key;
    const revoked = await createKey(s, 'acme', 'old');
    keys.revoked = revoked.key;
    assert.equal((await http(s.url, 'DELETE', `/admin/keys/${revoked.id}`, { key: s.adminKey })).status, 200);
    keys.malformed = 'not a key';
    await adminPost('/admin/models', { id: PRIVATE, context_length: 512, visibility: 'private', owned_by: 'acme' });
    responseId = await freshResponse();
    conversationId = await freshConversation();
    storedChatId = await freshStoredChat();
    itemId = (await ok<{ data: Array<{ id: string }> }>('GET', `/v1/conversations/${conversationId}/items`)).data[0]!.id;
  });
  after(async () => {
    await s.close();
  });

  const ISOLATED: [number, number, number] = [404, 200, 404];
  const ADMIN_ONLY = (status = 200): [number, number, number] => [403, 403, status];
  const CELLS: Cell[] = [
    { method: 'GET', path: () => '/v1/models', expect: [200, 200, 200] },
    { method: 'GET', path: () => `/v1/models/${LOCAL}`, expect: [200, 200, 200] },
    { method: 'GET', path: () => `/v1/models/${PRIVATE}`, expect: [404, 200, 200] },
    {
      method: 'POST',
      path: () => '/v1/chat/completions',
      body: { model: LOCAL, messages: [{ role: 'user', content: 'Once' }], max_tokens: 2 },
      expect: [200, 200, 200],
    },
    {
      method: 'POST',
      path: () => '/v1/chat/completions',
      body: { model: PRIVATE, messages: [{ role: 'user', content: 'Once' }] },
      expect: [404, 503, 503],
    },
    { method: 'GET', path: () => '/v1/chat/completions', expect: [200, 200, 200] },
    { method: 'GET', path: () => `/v1/chat/completions/${storedChatId}`, expect: ISOLATED },
    { method: 'POST', path: () => `/v1/chat/completions/${storedChatId}`, body: { metadata: { topic: 'x' } }, expect: ISOLATED },
    { method: 'GET', path: () => `/v1/chat/completions/${storedChatId}/messages`, expect: ISOLATED },
    { method: 'DELETE', path: async () => `/v1/chat/completions/${await freshStoredChat()}`, expect: ISOLATED },
    {
      method: 'POST',
      path: () => '/v1/responses',
      body: { model: LOCAL, input: 'Once', max_output_tokens: 2, store: false },
      expect: [200, 200, 200],
    },
    { method: 'POST', path: () => '/v1/responses', body: { model: PRIVATE, input: 'Once' }, expect: [404, 503, 503] },
    {
      method: 'POST',
      path: () => '/v1/responses',
      body: {
        get previous_response_id() {
          return responseId;
        },
        model: LOCAL,
        input: 'and',
        max_output_tokens: 2,
        store: false,
      },
      // previous_response_not_found, the same for a missing response and another organization's.
      expect: [400, 200, 400],
    },
    { method: 'GET', path: () => `/v1/responses/${responseId}`, expect: ISOLATED },
    { method: 'GET', path: () => `/v1/responses/${responseId}/input_items`, expect: ISOLATED },
    { method: 'POST', path: () => `/v1/responses/${responseId}/cancel`, expect: [404, 400, 404] },
    { method: 'DELETE', path: async () => `/v1/responses/${await freshResponse()}`, expect: ISOLATED },
    { method: 'POST', path: () => '/v1/conversations', body: { metadata: { a: 'b' } }, expect: [200, 200, 200] },
    { method: 'GET', path: () => `/v1/conversations/${conversationId}`, expect: ISOLATED },
    { method: 'POST', path: () => `/v1/conversations/${conversationId}`, body: { metadata: { topic: 'x' } }, expect: ISOLATED },
    { method: 'DELETE', path: async () => `/v1/conversations/${await freshConversation()}`, expect: ISOLATED },
    { method: 'GET', path: () => `/v1/conversations/${conversationId}/items`, expect: ISOLATED },
    {
      method: 'POST',
      path: () => `/v1/conversations/${conversationId}/items`,
      body: { items: [{ type: 'message', role: 'user', content: 'more' }] },
      expect: ISOLATED,
    },
    { method: 'GET', path: () => `/v1/conversations/${conversationId}/items/${itemId}`, expect: ISOLATED },
    {
      method: 'DELETE',
      expect: ISOLATED,
      path: async () => {
        const c = await freshConversation();
        const item = (await ok<{ data: Array<{ id: string }> }>('GET', `/v1/conversations/${c}/items`)).data[0]!.id;
        return `/v1/conversations/${c}/items/${item}`;
      },
    },
    { method: 'GET', path: () => '/admin/keys', expect: ADMIN_ONLY() },
    { method: 'POST', path: () => '/admin/keys', body: { org: 'initech', name: 'k' }, expect: ADMIN_ONLY(201) },
    { method: 'PATCH', path: () => `/admin/keys/${acmeKeyId}`, body: { limits: { rpm: 1000 } }, expect: ADMIN_ONLY() },
    { method: 'DELETE', path: async () => `/admin/keys/${(await createKey(s, 'initech')).id}`, expect: ADMIN_ONLY() },
    { method: 'GET', path: () => '/admin/orgs', expect: ADMIN_ONLY() },
    {
      method: 'POST',
      path: () => '/admin/orgs',
      get body() {
        return { id: `org-${++n}`, name: 'New' };
      },
      expect: ADMIN_ONLY(201),
    },
    { method: 'GET', path: () => '/admin/orgs/acme', expect: ADMIN_ONLY() },
    { method: 'PATCH', path: () => '/admin/orgs/acme', body: { limits: null }, expect: ADMIN_ONLY() },
    { method: 'GET', path: () => '/admin/models', expect: ADMIN_ONLY() },
    {
      method: 'POST',
      path: () => '/admin/models',
      get body() {
        return { id: `meta-llama/new-${++n}`, context_length: 64 };
      },
      expect: ADMIN_ONLY(201),
    },
    { method: 'GET', path: () => `/admin/models/${PRIVATE}`, expect: ADMIN_ONLY() },
    { method: 'PATCH', path: () => `/admin/models/${PRIVATE}`, body: { description: 'secret' }, expect: ADMIN_ONLY() },
    {
      method: 'DELETE',
      expect: ADMIN_ONLY(),
      path: async () =>
        `/admin/models/${(await adminPost<{ id: string }>('/admin/models', { id: `meta-llama/gone-${++n}`, context_length: 64 })).id}`,
    },
    { method: 'GET', path: () => '/admin/deployments', expect: ADMIN_ONLY() },
    {
      method: 'POST',
      path: () => '/admin/deployments',
      body: { model: 'meta-llama/llama-3.1-8b-instruct', base_url: 'http://203.0.113.10/v1' },
      expect: ADMIN_ONLY(201),
    },
    {
      method: 'DELETE',
      expect: ADMIN_ONLY(),
      path: async () =>
        `/admin/deployments/${(await adminPost<{ id: string }>('/admin/deployments', { model: 'meta-llama/llama-3.1-8b-instruct', base_url: 'http://203.0.113.11/v1' })).id}`,
    },
    { method: 'GET', path: () => '/admin/usage', expect: ADMIN_ONLY() },
    { method: 'GET', path: () => '/admin/local/loaded', expect: ADMIN_ONLY() },
  ];

  it('answers every cell with exactly the expected status, in the envelope when refused', async () => {
    const wrong: string[] = [];
    let cells = 0;
    for (const c of CELLS) {
      for (const who of WHO) {
        const path = await c.path();
        const want =
          who === 'none' || who === 'malformed' || who === 'revoked' ? 401 : c.expect[who === 'otherOrg' ? 0 : who === 'inference' ? 1 : 2];
        const r = await as(who, c.method, path, c.body);
        cells += 1;
        if (r.status !== want) wrong.push(`${c.method} ${path} as ${who}: ${r.status}, expected ${want} (${r.text.slice(0, 160)})`);
        else if (r.status >= 400 && (typeof r.json?.error?.message !== 'string' || !r.headers['x-request-id']))
          wrong.push(`${c.method} ${path} as ${who}: not the envelope`);
      }
    }
    assert.deepEqual(wrong, []);
    assert.equal(cells, CELLS.length * WHO.length);
  });

  it('serves the unauthenticated endpoints to anyone', async () => {
    for (const path of ['/healthz', '/readyz', '/metrics', '/openapi.json']) {
      for (const who of WHO) assert.equal((await as(who, 'GET', path)).status, 200, `${path} as ${who}`);
    }
  });

  it('tells a missing key from a malformed, an unknown and a revoked one', async () => {
    assert.equal((await as('none', 'GET', '/v1/models')).json.error.code, 'missing_api_key');
    assert.equal((await as('malformed', 'GET', '/v1/models')).json.error.code, 'invalid_api_key');
    const revoked = await as('revoked', 'GET', '/v1/models');
    assert.equal(revoked.json.error.code, 'invalid_api_key');
    assert.ok(!revoked.text.includes(keys.revoked), 'the key is not echoed');
  });

  it('refuses to revoke the last admin key (409), which would lock every operator out', async () => {
    const second = await http<{ id: string }>(s.url, 'POST', '/admin/keys', {
      key: s.adminKey,
      body: { org: 'ops', name: 'b', role: 'admin' },
    });
    assert.equal(second.status, 201, second.text);
    assert.equal((await http(s.url, 'DELETE', `/admin/keys/${second.json.id}`, { key: s.adminKey })).status, 200);
    const listed = await http<{ data: Array<{ id: string; role: string; revoked_at: number | null }> }>(s.url, 'GET', '/admin/keys', {
      key: s.adminKey,
    });
    const last = listed.json.data.filter((k) => k.role === 'admin' && k.revoked_at === null);
    assert.equal(last.length, 1);
    const refused = await http(s.url, 'DELETE', `/admin/keys/${last[0]!.id}`, { key: s.adminKey });
    assert.equal(refused.status, 409, refused.text);
    assert.equal(refused.json.error.code, 'conflict');
    assert.match(refused.json.error.message, /last admin key/);
    assert.equal((await as('admin', 'GET', '/admin/keys')).status, 200, 'the admin key still works');
  });
});

describe("one organization's prompt cache never serves another's", () => {
  let s: TestServer;
  before(async () => {
    s = await startServer();
  });
  after(() => s.close());

  it("reports another organization's prompt as not cached, and the organization's own as cached", async () => {
    const a = await createKey(s, 'cache-a');
    const b = await createKey(s, 'cache-b');
    // A prompt nobody has sent: what one organization asked must not be found in the cache by another
    // (cached_tokens, and the time to the first token, would tell it what the other sent).
    const prompt = `Acme merger memo ${Date.now()}: we will acquire Globex for 42 dollars per share on Friday`;
    const cached = async (key: string) => {
      const r = await http<{ usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } }>(
        s.url,
        'POST',
        '/v1/chat/completions',
        { key, body: { model: LOCAL, messages: [{ role: 'user', content: prompt }], max_tokens: 2, temperature: 0 } },
      );
      assert.equal(r.status, 200, r.text);
      return r.json.usage;
    };
    const first = await cached(a.key);
    assert.equal(first.prompt_tokens_details.cached_tokens, 0);
    const again = await cached(a.key);
    assert.ok(again.prompt_tokens_details.cached_tokens >= again.prompt_tokens - 1, JSON.stringify(again));
    assert.equal((await cached(b.key)).prompt_tokens_details.cached_tokens, 0);
    // And back: b's turn on the sequence did not hand a's cache to b, nor b's to a.
    assert.equal((await cached(b.key)).prompt_tokens_details.cached_tokens > 0, true);
  });
});
