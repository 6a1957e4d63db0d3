/**
 * `GET /v1/responses` and `GET /v1/conversations`: an organization's stored responses and
 * conversations, cursor-paged like the list of stored chat completions, with the visibility of a
 * GET of one (the organization), on SQLite and PostgreSQL.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { CursorPage } from 'openai/pagination';
import { createKey, http, pgSchema, startServer, type Envelope, type TestServer } from './helpers/server.js';

const STORIES = 'local/stories260k';

interface WirePage<T> {
  object: string;
  data: T[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}
interface WireObject {
  id: string;
  object: string;
  status?: string;
  metadata?: Record<string, string>;
}

for (const dialect of ['sqlite', 'postgres'] as const) {
  describe(`lists of stored responses and conversations (${dialect})`, () => {
    let server: TestServer;
    let client: OpenAI;
    let key: string;
    /** Another key of the same organization: it sees what the organization stored, as GET of one does. */
    let colleague: string;
    /** A key of another organization. */
    let rival: string;
    let schema: { url: string; drop(): Promise<void> } | undefined;
    const responseIds: string[] = [];
    const conversationIds: string[] = [];

    const list = <T = WireObject>(path: string, as = key) => http<WirePage<T>>(server.url, 'GET', path, { key: as });

    before(async () => {
      if (dialect === 'postgres') schema = await pgSchema();
      server = await startServer(schema ? { env: { DATABASE_URL: schema.url } } : {});
      ({ key } = await createKey(server, 'acme'));
      ({ key: colleague } = await createKey(server, 'acme', 'colleague'));
      ({ key: rival } = await createKey(server, 'rival'));
      client = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
      for (let i = 0; i < 5; i++) {
        const r = await client.responses.create({ model: STORIES, input: `Once upon a time ${i}`, max_output_tokens: 4 });
        responseIds.push(r.id);
      }
      // Not stored: never listed.
      await client.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2, store: false });
      for (let i = 0; i < 3; i++) conversationIds.push((await client.conversations.create({ metadata: { n: String(i) } })).id);
    });
    after(async () => {
      await server.close();
      await schema?.drop();
    });

    it('lists stored responses in creation order, a page at a time, in the OpenAI list shape', async () => {
      const page1 = await list('/v1/responses?limit=2');
      assert.equal(page1.status, 200);
      assert.deepEqual(Object.keys(page1.json).sort(), ['data', 'first_id', 'has_more', 'last_id', 'object']);
      assert.equal(page1.json.object, 'list');
      assert.deepEqual(
        page1.json.data.map((r) => r.id),
        responseIds.slice(0, 2),
      );
      assert.equal(page1.json.first_id, responseIds[0]);
      assert.equal(page1.json.last_id, responseIds[1]);
      assert.equal(page1.json.has_more, true);
      const page2 = await list(`/v1/responses?limit=2&after=${page1.json.last_id}`);
      assert.deepEqual(
        page2.json.data.map((r) => r.id),
        responseIds.slice(2, 4),
      );
      const last = await list(`/v1/responses?limit=2&after=${page2.json.last_id}`);
      assert.deepEqual(
        last.json.data.map((r) => r.id),
        responseIds.slice(4),
      );
      assert.equal(last.json.has_more, false);
      const desc = await list('/v1/responses?order=desc');
      assert.deepEqual(
        desc.json.data.map((r) => r.id),
        [...responseIds].reverse(),
        'the default limit (20) holds them all; store: false left nothing',
      );
      const descAfter = await list(`/v1/responses?order=desc&limit=1&after=${responseIds[2]}`);
      assert.deepEqual(
        descAfter.json.data.map((r) => r.id),
        [responseIds[1]],
      );
      const empty = await list(`/v1/responses?after=${responseIds[4]}`);
      assert.deepEqual(empty.json, { object: 'list', data: [], first_id: null, last_id: null, has_more: false });
    });

    it('serves each listed response exactly as GET of one does, and the SDK pages through them', async () => {
      const listed = await list<Record<string, unknown>>('/v1/responses');
      for (const item of listed.json.data) {
        const one = await http<Record<string, unknown>>(server.url, 'GET', `/v1/responses/${String(item['id'])}`, { key });
        assert.deepEqual(item, one.json);
      }
      assert.equal(listed.json.data[0]!['object'], 'response');
      assert.equal(listed.json.data[0]!['status'], 'incomplete', 'cut at max_output_tokens');

      // The openai SDK's cursor pages (has_more, then after = the last id) walk the whole list.
      const walked: string[] = [];
      for await (const r of client.getAPIList<OpenAI.Responses.Response, CursorPage<OpenAI.Responses.Response>>('/responses', CursorPage, {
        query: { limit: 2 },
      }))
        walked.push(r.id);
      assert.deepEqual(walked, responseIds);
    });

    it('lists conversations in creation order, each as GET of one serves it', async () => {
      const page1 = await list('/v1/conversations?limit=2');
      assert.equal(page1.status, 200);
      assert.deepEqual(
        page1.json.data.map((c) => c.id),
        conversationIds.slice(0, 2),
      );
      assert.equal(page1.json.has_more, true);
      assert.equal(page1.json.last_id, conversationIds[1]);
      for (const c of page1.json.data) assert.deepEqual(c, (await http(server.url, 'GET', `/v1/conversations/${c.id}`, { key })).json);
      assert.equal(page1.json.data[0]!.object, 'conversation');
      assert.deepEqual(page1.json.data[0]!.metadata, { n: '0' });
      const desc: string[] = [];
      for await (const c of client.getAPIList<OpenAI.Conversations.Conversation, CursorPage<OpenAI.Conversations.Conversation>>(
        '/conversations',
        CursorPage,
        {
          query: { order: 'desc', limit: 1 },
        },
      ))
        desc.push(c.id);
      assert.deepEqual(desc, [...conversationIds].reverse());
    });

    it('shows an organization what its keys stored, and another organization nothing of it', async () => {
      assert.deepEqual(
        (await list('/v1/responses', colleague)).json.data.map((r) => r.id),
        responseIds,
        'a key of the same organization sees them, as it may GET each one',
      );
      assert.deepEqual(
        (await list('/v1/conversations', colleague)).json.data.map((c) => c.id),
        conversationIds,
      );
      const rivalClient = new OpenAI({ apiKey: rival, baseURL: server.baseURL, maxRetries: 0 });
      const theirs = await rivalClient.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2 });
      const theirConv = await rivalClient.conversations.create({});
      assert.deepEqual(
        (await list('/v1/responses', rival)).json.data.map((r) => r.id),
        [theirs.id],
      );
      assert.deepEqual(
        (await list('/v1/conversations', rival)).json.data.map((c) => c.id),
        [theirConv.id],
      );
      assert.ok(!(await list('/v1/responses?limit=100')).json.data.some((r) => r.id === theirs.id));
      assert.ok(!(await list('/v1/conversations?limit=100')).json.data.some((c) => c.id === theirConv.id));

      // Another organization's id as a cursor is answered exactly like an unknown id.
      for (const [path, theirsId, unknownId] of [
        ['/v1/responses', responseIds[0]!, 'resp_0000000000000000'],
        ['/v1/conversations', conversationIds[0]!, 'conv_0000000000000000'],
      ] as const) {
        const asRival = await http<Envelope>(server.url, 'GET', `${path}?after=${theirsId}`, { key: rival });
        const unknown = await http<Envelope>(server.url, 'GET', `${path}?after=${unknownId}`, { key: rival });
        assert.equal(asRival.status, 400);
        assert.equal(asRival.json.error.param, 'after');
        assert.equal(asRival.json.error.type, 'invalid_request_error');
        assert.deepEqual(asRival.json.error.message.replace(theirsId, 'ID'), unknown.json.error.message.replace(unknownId, 'ID'));
      }
    });

    it('forgets what was deleted', async () => {
      const r = await client.responses.create({ model: STORIES, input: 'Once', max_output_tokens: 2 });
      const c = await client.conversations.create({});
      assert.equal((await list('/v1/responses?order=desc&limit=1')).json.data[0]?.id, r.id);
      assert.equal((await list('/v1/conversations?order=desc&limit=1')).json.data[0]?.id, c.id);
      await client.responses.delete(r.id);
      await client.conversations.delete(c.id);
      assert.equal((await list('/v1/responses?order=desc&limit=1')).json.data[0]?.id, responseIds.at(-1));
      assert.equal((await list('/v1/conversations?order=desc&limit=1')).json.data[0]?.id, conversationIds.at(-1));
      // A deleted cursor is unknown now.
      assert.equal((await list(`/v1/responses?after=${r.id}`)).status, 400);
    });

    it('refuses bad query values with a 400 naming the parameter, and a missing key with 401', async () => {
      // The item lists (a conversation's, a response's input) answer a cursor that names nothing as the lists do.
      const itemLists = [`/v1/conversations/${conversationIds[0]!}/items`, `/v1/responses/${responseIds[0]!}/input_items`];
      for (const path of ['/v1/responses', '/v1/conversations', ...itemLists]) {
        for (const [query, param] of [
          ['limit=0', 'limit'],
          ['limit=101', 'limit'],
          ['limit=abc', 'limit'],
          ['order=sideways', 'order'],
          ['after=nothing', 'after'],
        ] as const) {
          const res = await http<Envelope>(server.url, 'GET', `${path}?${query}`, { key });
          assert.equal(res.status, 400, `${path}?${query}`);
          assert.equal(res.json.error.type, 'invalid_request_error', `${path}?${query}`);
          assert.equal(res.json.error.param, param, `${path}?${query}`);
        }
        const noKey = await http<Envelope>(server.url, 'GET', path);
        assert.equal(noKey.status, 401);
        assert.equal(noKey.json.error.code, 'missing_api_key');
        assert.equal((await http<Envelope>(server.url, 'GET', path, { key: 'sk-sy-wrong' })).status, 401);
      }
    });

    it('answers the methods the paths lack with 405 and the methods they have', async () => {
      for (const path of ['/v1/responses', '/v1/conversations']) {
        const put = await http<Envelope>(server.url, 'PUT', path, { key, body: {} });
        assert.equal(put.status, 405, path);
        assert.equal(put.json.error.code, 'method_not_allowed');
        assert.equal(put.headers['allow'], 'GET, HEAD, POST', path);
        assert.equal((await http(server.url, 'DELETE', path, { key })).status, 405, path);
      }
    });
  });
}
