/**
 * `GET /v1/usage`: any key's own usage, with the query and answer of `GET /admin/usage`, and never
 * another key's or organization's records; on SQLite and PostgreSQL.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createKey, http, pgSchema, startServer, type Envelope, type TestServer } from './helpers/server.js';
import { usageRecord } from './helpers/usage.js';

const STORIES = 'local/stories260k';

interface Total {
  group: string;
  requests: number;
  errors: number;
  input_tokens: number;
  output_tokens: number;
  cost: number;
}
interface Totals {
  object: string;
  group_by: string;
  data: Total[];
}

for (const dialect of ['sqlite', 'postgres'] as const) {
  describe(`a key's own usage, GET /v1/usage (${dialect})`, () => {
    let server: TestServer;
    let schema: { url: string; drop(): Promise<void> } | undefined;
    /** Two keys of one organization, and one of another. */
    let mine: { key: string; id: string };
    let colleague: { key: string; id: string };
    let rival: { key: string; id: string };
    const today = new Date().toISOString().slice(0, 10);

    const usage = (query: string, key: string) => http<Totals>(server.url, 'GET', `/v1/usage${query}`, { key });
    const adminUsage = (query: string) => http<Totals>(server.url, 'GET', `/admin/usage${query}`, { key: server.adminKey });
    const chat = (key: string, maxTokens: number) =>
      new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 }).chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: maxTokens,
      });

    before(async () => {
      if (dialect === 'postgres') schema = await pgSchema();
      server = await startServer(schema ? { env: { DATABASE_URL: schema.url } } : {});
      mine = await createKey(server, 'acme', 'mine');
      colleague = await createKey(server, 'acme', 'colleague');
      rival = await createKey(server, 'rival', 'rival');
      // Real requests today, through the ledger.
      await chat(mine.key, 3);
      await chat(mine.key, 4);
      await chat(colleague.key, 5);
      await chat(rival.key, 6);
      // Earlier days, written into the ledger's table the way the ledger writes them.
      const at = (day: string) => Date.parse(`${day}T12:00:00Z`);
      await server.service.store.insertUsage([
        usageRecord('u_mine_1', { key_id: mine.id, org_id: 'acme', day: '2026-01-05', at: at('2026-01-05'), model: 'x/older' }),
        usageRecord('u_mine_2', {
          key_id: mine.id,
          org_id: 'acme',
          day: '2026-01-10',
          at: at('2026-01-10'),
          model: 'x/older',
          status: 500,
          error_code: 'internal_error',
        }),
        usageRecord('u_colleague', { key_id: colleague.id, org_id: 'acme', day: '2026-01-05', at: at('2026-01-05'), model: 'x/older' }),
        usageRecord('u_rival', { key_id: rival.id, org_id: 'rival', day: '2026-01-05', at: at('2026-01-05'), model: 'x/older' }),
      ]);
    });
    after(async () => {
      await server.close();
      await schema?.drop();
    });

    it("answers exactly what /admin/usage answers for the key, and nothing of any other key's", async () => {
      for (const query of [
        '',
        '?group_by=day',
        '?group_by=model',
        '?group_by=key',
        '?group_by=org',
        `?group_by=model&from=${today}`,
        '?group_by=day&model=x/older',
      ]) {
        const own = await usage(query, mine.key);
        assert.equal(own.status, 200, query);
        const sep = query === '' ? '?' : '&';
        assert.deepEqual(own.json, (await adminUsage(`${query}${sep}key=${mine.id}`)).json, query);
      }
      const byDay = await usage('', mine.key);
      assert.equal(byDay.json.object, 'list');
      assert.equal(byDay.json.group_by, 'day');
      assert.deepEqual(
        byDay.json.data.map((d) => [d.group, d.requests, d.errors]),
        [
          ['2026-01-05', 1, 0],
          ['2026-01-10', 1, 1],
          [today, 2, 0],
        ],
      );
      const today_ = byDay.json.data.at(-1)!;
      assert.equal(today_.output_tokens, 7, 'the two requests of today: 3 + 4 tokens');
    });

    it('groups by key or organization into the one key and organization it has', async () => {
      const byKey = await usage('?group_by=key', mine.key);
      assert.deepEqual(
        byKey.json.data.map((d) => [d.group, d.requests]),
        [[mine.id, 4]],
      );
      const byOrg = await usage('?group_by=org', mine.key);
      assert.deepEqual(
        byOrg.json.data.map((d) => [d.group, d.requests]),
        [['acme', 4]],
        "the organization's total is this key's share only, not its colleague's",
      );
      // The organization as a whole has more, which only an admin sees.
      const orgTotal = (await adminUsage('?group_by=org&org=acme')).json.data[0]!;
      assert.equal(orgTotal.requests, 6);
      const byModel = await usage('?group_by=model', mine.key);
      assert.deepEqual(
        byModel.json.data.map((d) => [d.group, d.requests]),
        [
          [STORIES, 2],
          ['x/older', 2],
        ],
      );
    });

    it('narrows by date range and model', async () => {
      const january = await usage('?from=2026-01-01&to=2026-01-07', mine.key);
      assert.deepEqual(
        january.json.data.map((d) => [d.group, d.requests]),
        [['2026-01-05', 1]],
      );
      const fromTen = await usage('?group_by=model&from=2026-01-10&to=2026-01-10', mine.key);
      assert.deepEqual(
        fromTen.json.data.map((d) => [d.group, d.requests, d.errors]),
        [['x/older', 1, 1]],
      );
      const onlyToday = await usage(`?group_by=model&from=${today}&to=${today}`, mine.key);
      assert.deepEqual(
        onlyToday.json.data.map((d) => [d.group, d.requests]),
        [[STORIES, 2]],
      );
      const byModel = await usage(`?model=${encodeURIComponent(STORIES)}`, mine.key);
      assert.deepEqual(
        byModel.json.data.map((d) => [d.group, d.requests]),
        [[today, 2]],
      );
      assert.deepEqual((await usage('?model=x/none', mine.key)).json.data, []);
    });

    it("never shows another key's or organization's records, whatever the query names", async () => {
      for (const query of [
        `?key=${colleague.id}`,
        `?key=${rival.id}`,
        '?org=rival',
        `?org=rival&key=${mine.id}`,
        '?group_by=org&org=rival',
      ]) {
        const res = await usage(query, mine.key);
        assert.equal(res.status, 200, query);
        assert.deepEqual(res.json.data, [], query);
      }
      // Naming itself changes nothing.
      assert.deepEqual((await usage(`?key=${mine.id}&org=acme`, mine.key)).json, (await usage('', mine.key)).json);
      // Each key sees its own.
      const theirs = await usage('?group_by=key', rival.key);
      assert.deepEqual(
        theirs.json.data.map((d) => [d.group, d.requests]),
        [[rival.id, 2]],
      );
      const colleagues = await usage('?group_by=org', colleague.key);
      assert.deepEqual(
        colleagues.json.data.map((d) => [d.group, d.requests]),
        [['acme', 2]],
      );
      // An admin key's own usage is its own too (it made no generation request); /admin/usage has everyone's.
      assert.deepEqual((await usage('', server.adminKey)).json.data, []);
    });

    it('moves with the next request', async () => {
      const before = (await usage('?group_by=key', mine.key)).json.data[0]!.requests;
      await chat(mine.key, 2);
      assert.equal((await usage('?group_by=key', mine.key)).json.data[0]!.requests, before + 1);
    });

    it('refuses a missing or wrong key with 401, and bad query values with a 400 naming the parameter', async () => {
      const none = await http<Envelope>(server.url, 'GET', '/v1/usage');
      assert.equal(none.status, 401);
      assert.equal(none.json.error.code, 'missing_api_key');
      assert.equal(none.json.error.type, 'authentication_error');
      const wrong = await http<Envelope>(server.url, 'GET', '/v1/usage', { key: 'sk-sy-0123456789abcdef_wrong' });
      assert.equal(wrong.status, 401);
      assert.equal(wrong.json.error.code, 'invalid_api_key');
      for (const [query, param] of [
        ['group_by=week', 'group_by'],
        ['from=2026-1-1', 'from'],
        ['to=yesterday', 'to'],
        ['from=2026-13-45', 'from'],
        ['to=2026-02-30', 'to'],
        ['from=2026-02-02&to=2026-02-01', 'from'],
      ] as const) {
        const res = await http<Envelope>(server.url, 'GET', `/v1/usage?${query}`, { key: mine.key });
        assert.equal(res.status, 400, query);
        assert.equal(res.json.error.type, 'invalid_request_error', query);
        assert.equal(res.json.error.param, param, query);
      }
      const post = await http<Envelope>(server.url, 'POST', '/v1/usage', { key: mine.key, body: {} });
      assert.equal(post.status, 405);
      assert.equal(post.headers['allow'], 'GET, HEAD');
    });
  });
}
