import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createKey, http, startServer, tempDir, type TestServer, type WireList } from './helpers/server.js';
import { closers, completionBody, fixture } from './helpers/fixtures.js';

const STORIES = 'local/stories260k';

describe('everyday correctness a new user runs into', () => {
  const open = closers();
  let server: TestServer;
  let client: OpenAI;
  after(() => open.closeAll());

  it('samples afresh for every request without a seed, and repeats with one', async () => {
    server = open.keep(await startServer());
    client = new OpenAI({ apiKey: server.adminKey, baseURL: server.baseURL, maxRetries: 0 });
    const ask = (seed?: number) =>
      client.chat.completions.create({
        model: STORIES,
        temperature: 1,
        max_tokens: 24,
        messages: [{ role: 'user', content: 'Once upon a time' }],
        ...(seed !== undefined && { seed }),
      });
    const texts = (await Promise.all(Array.from({ length: 8 }, () => ask()))).map((r) => r.choices[0]!.message.content);
    assert.equal(new Set(texts).size, 8, `8 requests, ${new Set(texts).size} different texts`);
    const [a, b] = await Promise.all([ask(42), ask(42)]);
    assert.equal(a.choices[0]!.message.content, b.choices[0]!.message.content, 'the same seed gives the same text');
    for (const seed of [-1, 2 ** 32, 1e300, 4_294_967_295]) {
      const r = await http(server.url, 'POST', '/v1/chat/completions', {
        key: server.adminKey,
        body: { model: STORIES, messages: [{ role: 'user', content: 'x' }], seed },
      });
      assert.equal(r.status, 400, `seed ${seed}: ${r.text}`);
      assert.equal(r.json.error.param, 'seed');
    }
  });

  it('says which listed models this server can generate with (available)', async () => {
    const up = open.keep(
      await fixture((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'application/json' }).end(completionBody('ok'));
      }),
    );
    const s = open.keep(
      await startServer({
        configFile: { name: 'a.json', text: JSON.stringify({ deployments: [{ model: 'qwen/qwen3-8b', baseUrl: up.url }] }) },
      }),
    );
    const list = await http<WireList<{ id: string; available: boolean; status: string }>>(s.url, 'GET', '/v1/models', { key: s.adminKey });
    const byId = new Map(list.json.data.map((m) => [m.id, m]));
    assert.equal(byId.get(STORIES)?.available, true, 'a local file');
    assert.equal(byId.get('qwen/qwen3-8b')?.available, true, 'an upstream deployment');
    const idle = list.json.data.filter((m) => !m.available);
    assert.equal(idle.length, 9, 'the shipped text models without a deployment');
    for (const m of idle) {
      const r = await http(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model: m.id, messages: [{ role: 'user', content: 'x' }] },
      });
      assert.equal(r.status, 503, `${m.id} is listed as not available, and indeed cannot generate`);
      assert.equal(r.json.error.code, 'no_deployment');
    }
    for (const m of list.json.data.filter((x) => x.available)) {
      const r = await http(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model: m.id, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 },
      });
      assert.equal(r.status, 200, `${m.id} is available and generates`);
    }
    const one = await http<{ available: boolean }>(s.url, 'GET', '/v1/models/openai/gpt-oss-20b', { key: s.adminKey });
    assert.equal(one.json.available, false);
  });

  it("scopes conversation item ids to their conversation: a reused id is a 400, another organization's id is no conflict", async () => {
    const a = await createKey(server, 'org-a');
    const b = await createKey(server, 'org-b');
    const ca = new OpenAI({ apiKey: a.key, baseURL: server.baseURL, maxRetries: 0 });
    const cb = new OpenAI({ apiKey: b.key, baseURL: server.baseURL, maxRetries: 0 });
    const item = { type: 'message' as const, role: 'user' as const, content: 'hello', id: 'msg_chosen_by_client' };
    const convA = await ca.conversations.create({ items: [item] });
    // Another organization may use the same id in its own conversation.
    const convB = await cb.conversations.create({ items: [item] });
    assert.equal((await cb.conversations.items.retrieve('msg_chosen_by_client', { conversation_id: convB.id })).id, 'msg_chosen_by_client');
    // The same id again in the same conversation: a 400 naming it, nothing lost or half-added.
    const again = await http(server.url, 'POST', `/v1/conversations/${convA.id}/items`, {
      key: a.key,
      body: { items: [{ ...item, content: 'again' }] },
    });
    assert.equal(again.status, 400, again.text);
    assert.equal(again.json.error.param, 'items[0].id');
    const twice = await http(server.url, 'POST', `/v1/conversations/${convA.id}/items`, {
      key: a.key,
      body: {
        items: [
          { ...item, id: 'msg_x' },
          { ...item, id: 'msg_x' },
        ],
      },
    });
    assert.equal(twice.status, 400);
    assert.equal((await ca.conversations.items.list(convA.id)).data.length, 1);
    // A response in the conversation that reuses an id is refused before it generates.
    const reuse = await http(server.url, 'POST', '/v1/responses', {
      key: a.key,
      body: { model: STORIES, conversation: convA.id, input: [{ ...item, content: 'once more' }], max_output_tokens: 4 },
    });
    assert.equal(reuse.status, 400, reuse.text);
    // A reference to an item of the conversation is not a new item.
    const ref = await ca.responses.create({
      model: STORIES,
      conversation: convA.id,
      input: [{ type: 'item_reference', id: 'msg_chosen_by_client' }],
      max_output_tokens: 4,
    });
    assert.equal(ref.status, 'incomplete');
    const items = (await ca.conversations.items.list(convA.id, { order: 'asc' })).data;
    assert.deepEqual(
      items.map((i) => i.id).filter((id) => id === 'msg_chosen_by_client'),
      ['msg_chosen_by_client'],
    );
    assert.equal(items.length, 2, 'the original item and the answer');
  });

  it('accepts an empty body sent as JSON on cancel and delete, as the OpenAI API does', async () => {
    const bg = await client.responses.create({ model: STORIES, input: 'Once upon a time', background: true, max_output_tokens: 400 });
    const json = { 'content-type': 'application/json' };
    const cancel = await http<{ status: string }>(server.url, 'POST', `/v1/responses/${bg.id}/cancel`, {
      key: server.adminKey,
      headers: json,
      body: '',
    });
    assert.equal(cancel.status, 200, cancel.text);
    const del = await http<{ deleted: boolean }>(server.url, 'DELETE', `/v1/responses/${bg.id}`, {
      key: server.adminKey,
      headers: json,
      body: '',
    });
    assert.equal(del.status, 200, del.text);
    assert.equal(del.json.deleted, true);
    const conv = await client.conversations.create({});
    assert.equal(
      (await http(server.url, 'DELETE', `/v1/conversations/${conv.id}`, { key: server.adminKey, headers: json, body: '' })).status,
      200,
    );
    // A route that needs a body still says so.
    const empty = await http(server.url, 'POST', '/v1/chat/completions', { key: server.adminKey, headers: json, body: '' });
    assert.equal(empty.status, 400);
    assert.equal(empty.json.error.code, 'invalid_json');
    void tempDir;
  });
});
