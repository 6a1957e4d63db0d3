import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { createKey, http, pgSchema, readSse, startServer, type Envelope, type HttpResult, type TestServer } from './helpers/server.js';

const STORIES = 'local/stories260k';

interface WireCompletion {
  id: string;
  object: string;
  created: number;
  model: string;
  choices: Array<{ message: { content: string | null }; finish_reason: string }>;
  metadata: Record<string, string>;
}
interface WirePage<T> {
  object: string;
  data: T[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}

/** What retrieve answers: the SDK's type lacks `metadata`, which stored completions carry. */
const metadataOf = (c: OpenAI.Chat.ChatCompletion): unknown => (c as unknown as { metadata?: unknown }).metadata;

/** The same suite on each database the store supports. */
for (const dialect of ['sqlite', 'postgres'] as const) {
  describe(`stored chat completions (${dialect}) through the openai SDK and plain HTTP`, () => {
    let server: TestServer;
    let client: OpenAI;
    let key: string;
    let otherKey: string;
    let schema: { url: string; drop(): Promise<void> } | undefined;

    before(async () => {
      if (dialect === 'postgres') schema = await pgSchema();
      server = await startServer(schema ? { env: { DATABASE_URL: schema.url } } : {});
      ({ key } = await createKey(server, 'acme'));
      ({ key: otherKey } = await createKey(server, 'rival'));
      client = new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 });
    });
    after(async () => {
      await server.close();
      await schema?.drop();
    });

    const create = (metadata: Record<string, string>, extra: Partial<OpenAI.Chat.ChatCompletionCreateParamsNonStreaming> = {}) =>
      client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 4,
        temperature: 0,
        store: true,
        metadata,
        ...extra,
      });

    it('does not store unless asked (store defaults to false)', async () => {
      const plain = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 4,
      });
      await assert.rejects(client.chat.completions.retrieve(plain.id), OpenAI.NotFoundError);
      const off = await create({}, { store: false });
      await assert.rejects(client.chat.completions.retrieve(off.id), OpenAI.NotFoundError);
    });

    it('stores a completion with its metadata and request messages, readable as soon as the reply arrives', async () => {
      const created = await client.chat.completions.create({
        model: STORIES,
        messages: [
          { role: 'system', content: 'Tell a story.' },
          {
            role: 'user',
            content: [
              { type: 'text', text: 'Once upon ' },
              { type: 'text', text: 'a time' },
            ],
          },
        ],
        max_tokens: 6,
        temperature: 0,
        store: true,
        metadata: { topic: 'stories', run: '1' },
      });
      assert.equal(created.object, 'chat.completion');
      assert.equal(metadataOf(created), undefined, 'creation answers the usual object');
      const got = await client.chat.completions.retrieve(created.id);
      assert.deepEqual(got, { ...created, metadata: { topic: 'stories', run: '1' } });

      const messages: OpenAI.Chat.Completions.ChatCompletionStoreMessage[] = [];
      for await (const m of client.chat.completions.messages.list(created.id)) messages.push(m);
      assert.deepEqual(messages, [
        { id: `${created.id}-0`, role: 'system', content: 'Tell a story.', refusal: null, name: null, content_parts: null },
        {
          id: `${created.id}-1`,
          role: 'user',
          content: 'Once upon a time',
          refusal: null,
          name: null,
          content_parts: [
            { type: 'text', text: 'Once upon ' },
            { type: 'text', text: 'a time' },
          ],
        },
      ]);
    });

    it('pages messages with limit, after and order', async () => {
      const created = await create(
        {},
        {
          messages: [
            { role: 'user', content: 'one' },
            { role: 'assistant', content: 'two' },
            { role: 'user', content: 'three' },
          ],
        },
      );
      const first = await client.chat.completions.messages.list(created.id, { limit: 2 });
      assert.deepEqual(
        first.data.map((m) => m.content),
        ['one', 'two'],
      );
      assert.equal(first.has_more, true);
      assert.ok(first.hasNextPage());
      const second = await first.getNextPage();
      assert.deepEqual(
        second.data.map((m) => m.content),
        ['three'],
      );
      assert.equal(second.has_more, false);
      const desc: string[] = [];
      for await (const m of client.chat.completions.messages.list(created.id, { order: 'desc', limit: 1 })) desc.push(m.content ?? '');
      assert.deepEqual(desc, ['three', 'two', 'one']);
      const res = await http<Envelope>(server.url, 'GET', `/v1/chat/completions/${created.id}/messages?limit=0`, { key });
      assert.equal(res.status, 400);
      assert.equal(res.json.error.param, 'limit');
    });

    it('replaces metadata on update, and list filters follow the change', async () => {
      const tag = randomBytes(4).toString('hex');
      const created = await create({ tag, stage: 'draft' });
      const updated = await client.chat.completions.update(created.id, { metadata: { tag, stage: 'final' } });
      assert.deepEqual(metadataOf(updated), { tag, stage: 'final' });
      assert.equal(updated.id, created.id);
      assert.deepEqual(updated.choices, created.choices, 'only the metadata changes');
      assert.deepEqual(metadataOf(await client.chat.completions.retrieve(created.id)), { tag, stage: 'final' });
      const draft = await client.chat.completions.list({ metadata: { tag, stage: 'draft' } });
      assert.deepEqual(draft.data, []);
      const final = await client.chat.completions.list({ metadata: { tag, stage: 'final' } });
      assert.deepEqual(
        final.data.map((c) => c.id),
        [created.id],
      );
      const cleared = await client.chat.completions.update(created.id, { metadata: null });
      assert.deepEqual(metadataOf(cleared), {});
    });

    it('lists in creation order with model and metadata filters, pages by has_more/after, and auto-paginates', async () => {
      const batch = randomBytes(4).toString('hex');
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push((await create({ batch, parity: i % 2 === 0 ? 'even' : 'odd' })).id);

      const page1 = await client.chat.completions.list({ metadata: { batch }, limit: 2 });
      assert.deepEqual(
        page1.data.map((c) => c.id),
        ids.slice(0, 2),
      );
      assert.equal(page1.has_more, true);
      const raw = await http<WirePage<WireCompletion>>(
        server.url,
        'GET',
        `/v1/chat/completions?limit=2&after=${ids[1]}&metadata%5Bbatch%5D=${batch}`,
        { key },
      );
      assert.equal(raw.status, 200);
      assert.deepEqual(
        raw.json.data.map((c) => c.id),
        ids.slice(2, 4),
      );
      assert.equal(raw.json.object, 'list');
      assert.equal(raw.json.first_id, ids[2]);
      assert.equal(raw.json.last_id, ids[3]);
      assert.equal(raw.json.has_more, true);
      assert.deepEqual(raw.json.data[0]!.metadata, { batch, parity: 'even' });
      // Keys an object's prototype has are filters like any other: they match nothing stored.
      for (const key_ of ['__proto__', 'constructor']) {
        const none = await http<WirePage<WireCompletion>>(server.url, 'GET', `/v1/chat/completions?metadata%5B${key_}%5D=x`, { key });
        assert.equal(none.status, 200, none.text);
        assert.deepEqual(none.json.data, [], key_);
      }

      const all: string[] = [];
      for await (const c of client.chat.completions.list({ metadata: { batch }, limit: 2 })) all.push(c.id);
      assert.deepEqual(all, ids, 'auto-pagination walks every page in ascending order');
      const desc: string[] = [];
      for await (const c of client.chat.completions.list({ metadata: { batch }, order: 'desc', limit: 3 })) desc.push(c.id);
      assert.deepEqual(desc, [...ids].reverse());

      const odd = await client.chat.completions.list({ metadata: { batch, parity: 'odd' } });
      assert.deepEqual(
        odd.data.map((c) => c.id),
        [ids[1], ids[3]],
      );
      const byModel = await client.chat.completions.list({ model: STORIES, metadata: { batch } });
      assert.equal(byModel.data.length, 5);
      const otherModel = await client.chat.completions.list({ model: 'local/llama-2-tiny-random', metadata: { batch } });
      assert.deepEqual(otherModel.data, []);
    });

    it('deletes, after which the completion and its messages are gone', async () => {
      const created = await create({});
      const deleted = await client.chat.completions.delete(created.id);
      assert.deepEqual(deleted, { id: created.id, object: 'chat.completion.deleted', deleted: true });
      await assert.rejects(client.chat.completions.retrieve(created.id), OpenAI.NotFoundError);
      await assert.rejects(client.chat.completions.messages.list(created.id), OpenAI.NotFoundError);
      await assert.rejects(client.chat.completions.delete(created.id), OpenAI.NotFoundError);
    });

    it("answers another organization's id exactly as an unknown one, on every route", async () => {
      const tag = randomBytes(4).toString('hex');
      const created = await create({ tag });
      const routes: Array<[string, string, object | undefined]> = [
        ['GET', `/v1/chat/completions/${created.id}`, undefined],
        ['POST', `/v1/chat/completions/${created.id}`, { metadata: { stolen: 'yes' } }],
        ['GET', `/v1/chat/completions/${created.id}/messages`, undefined],
        ['DELETE', `/v1/chat/completions/${created.id}`, undefined],
      ];
      const asRival: HttpResult<Envelope>[] = [];
      for (const [method, path, body] of routes)
        asRival.push(await http(server.url, method, path, { key: otherKey, ...(body && { body }) }));
      const rivalList = await http<WirePage<WireCompletion>>(server.url, 'GET', `/v1/chat/completions?metadata%5Btag%5D=${tag}`, {
        key: otherKey,
      });
      assert.deepEqual(rivalList.json.data, [], "another organization's list does not show it");

      // Untouched by the other organization's attempts.
      const kept = await client.chat.completions.retrieve(created.id);
      assert.deepEqual(metadataOf(kept), { tag });

      // Once deleted, the same id is unknown to everyone: the answers must not differ.
      await client.chat.completions.delete(created.id);
      for (const [i, [method, path, body]] of routes.entries()) {
        const unknown = await http(server.url, method, path, { key, ...(body && { body }) });
        const rival = asRival[i]!;
        assert.equal(rival.status, 404, `${method} ${path}`);
        assert.equal(rival.json.error.code, 'not_found');
        assert.equal(rival.json.error.type, 'not_found_error');
        assert.deepEqual({ status: rival.status, body: rival.json }, { status: unknown.status, body: unknown.json }, `${method} ${path}`);
      }
    });

    it('refuses bad query values with a 400 naming the parameter', async () => {
      const cases: Array<[string, string]> = [
        ['limit=0', 'limit'],
        ['limit=101', 'limit'],
        ['limit=abc', 'limit'],
        ['order=sideways', 'order'],
        ['after=chatcmpl-nonexistent', 'after'],
        ['metadata%5Bk%5D=a&metadata%5Bk%5D=b', 'metadata[k]'],
      ];
      for (const [query, param] of cases) {
        const res = await http<Envelope>(server.url, 'GET', `/v1/chat/completions?${query}`, { key });
        assert.equal(res.status, 400, query);
        assert.equal(res.json.error.type, 'invalid_request_error', query);
        assert.equal(res.json.error.param, param, query);
      }
      const tooMuch = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v']));
      await assert.rejects(create(tooMuch), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'metadata');
    });

    it('stores a streamed completion under the id its chunks carried', async () => {
      const { status, events, done } = await readSse(server.url, 'POST', '/v1/chat/completions', {
        key,
        body: {
          model: STORIES,
          messages: [{ role: 'user', content: 'Once upon a time' }],
          max_tokens: 8,
          temperature: 0,
          stream: true,
          store: true,
          metadata: { via: 'stream' },
        },
      });
      assert.equal(status, 200);
      assert.ok(done, 'the stream ends with [DONE]');
      const chunks = events.map((e) => JSON.parse(e.data) as OpenAI.Chat.ChatCompletionChunk);
      const id = chunks[0]!.id;
      const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
      const finish = chunks.at(-1)!.choices[0]!.finish_reason;
      const res = await http<WireCompletion>(server.url, 'GET', `/v1/chat/completions/${id}`, { key });
      assert.equal(res.status, 200);
      assert.equal(res.json.id, id);
      assert.equal(res.json.object, 'chat.completion');
      assert.equal(res.json.created, chunks[0]!.created);
      assert.equal(res.json.choices[0]!.message.content, text);
      assert.equal(res.json.choices[0]!.finish_reason, finish);
      assert.deepEqual(res.json.metadata, { via: 'stream' });

      // The SDK's stream, too.
      const stream = await client.chat.completions.create({
        model: STORIES,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 4,
        stream: true,
        store: true,
      });
      let sdkId = '';
      for await (const c of stream) sdkId = c.id;
      assert.equal((await client.chat.completions.retrieve(sdkId)).id, sdkId);
    });

    it('routes GET and POST on /v1/chat/completions apart, and answers other methods and paths plainly', async () => {
      const list = await http<WirePage<WireCompletion>>(server.url, 'GET', '/v1/chat/completions?limit=1', { key });
      assert.equal(list.status, 200);
      assert.equal(list.json.object, 'list');
      const put = await http<Envelope>(server.url, 'PUT', '/v1/chat/completions', { key, body: {} });
      assert.equal(put.status, 405);
      assert.equal(put.headers['allow'], 'GET, HEAD, POST');
      // A path with an id has no 405: the server cannot tell a resource from a path it lacks.
      const patch = await http<Envelope>(server.url, 'PATCH', '/v1/chat/completions/chatcmpl-x', { key, body: {} });
      assert.equal(patch.status, 404);
      const unknownPath = await http<Envelope>(server.url, 'GET', '/v1/chat/completions/chatcmpl-x/nothing', { key });
      assert.equal(unknownPath.status, 404);
      assert.match(unknownPath.json.error.message, /Unknown request URL/);
      const noKey = await http<Envelope>(server.url, 'GET', '/v1/chat/completions');
      assert.equal(noKey.status, 401);
      const noBody = await http<Envelope>(server.url, 'POST', '/v1/chat/completions/chatcmpl-x', { key, body: {} });
      assert.equal(noBody.status, 400);
      assert.equal(noBody.json.error.param, 'metadata');
    });
  });
}

describe('stored chat completions when the store cannot be written', () => {
  let server: TestServer;
  let key: string;

  before(async () => {
    server = await startServer();
    ({ key } = await createKey(server, 'acme'));
    // Another connection to the server's own SQLite file takes the table away.
    const db = new Database(join(server.dataDir, 'switchyard.db'));
    db.exec('alter table chat_completions rename to chat_completions_gone');
    db.close();
  });
  after(() => server.close());

  const body = { model: STORIES, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 4, store: true };

  it('fails the request rather than acknowledge a completion it did not keep', async () => {
    const res = await http<Envelope>(server.url, 'POST', '/v1/chat/completions', { key, body });
    assert.equal(res.status, 500);
    assert.equal(res.json.error.code, 'internal_error');
    assert.match(res.json.error.message, /could not be stored/);
    const plain = await http(server.url, 'POST', '/v1/chat/completions', { key, body: { ...body, store: false } });
    assert.equal(plain.status, 200, 'requests that store nothing are unaffected');
  });

  it('ends a stream with an error event instead of [DONE]', async () => {
    const { status, events, done } = await readSse(server.url, 'POST', '/v1/chat/completions', { key, body: { ...body, stream: true } });
    assert.equal(status, 200);
    assert.equal(done, false);
    assert.equal((JSON.parse(events.at(-1)!.data) as Envelope).error.code, 'internal_error');
  });
});
