import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import OpenAI from 'openai';
import { createKey, type TestServer } from './helpers/server.js';
import { closers, fixture, GATEWAY_MODEL, startGateway } from './helpers/fixtures.js';

/**
 * Requests with thousands of input items, stored: every item reaches the response's store and the
 * conversation, however many bound parameters one statement would need (SQLite allows 32,766,
 * PostgreSQL 65,535; an item row binds 5).
 */
describe('a response with 7,000 input items on a conversation', () => {
  const c = closers();
  let gateway: TestServer;
  let key: string;

  before(async () => {
    const up = c.keep(
      await fixture((req, res) => {
        req.resume();
        req.on('end', () => {
          const chunk = (delta: object, finish: string | null) =>
            `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.end(`${chunk({ role: 'assistant', content: 'The end.' }, 'stop')}data: [DONE]\n\n`);
        });
      }),
    );
    gateway = c.keep(await startGateway([{ baseUrl: up.url }], {}, { context_length: 1_000_000 }));
    key = (await createKey(gateway, 'acme')).key;
  });
  after(() => c.closeAll());

  it('stores every item in the conversation and with the response', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const conversation = await client.conversations.create({});
    const input = Array.from({ length: 7_000 }, (_, i) => ({ role: 'user' as const, content: `line ${i}` }));
    const r = await client.responses.create({ model: GATEWAY_MODEL, input, conversation: conversation.id, max_output_tokens: 16 });
    assert.equal(r.status, 'completed');
    assert.equal(r.output_text, 'The end.');
    const db = new SqliteDatabase(join(gateway.dataDir, 'switchyard.db'), { readonly: true });
    try {
      const count = (sql: string, id: string) => (db.prepare(sql).get(id) as { n: number }).n;
      assert.equal(count('select count(*) as n from conversation_items where conversation_id = ?', conversation.id), 7_001);
      assert.equal(count('select count(*) as n from stored_items where response_id = ?', r.id), 7_001);
    } finally {
      db.close();
    }
    // The newest item is the answer, the oldest the first line.
    const newest = await client.conversations.items.list(conversation.id, { limit: 1, order: 'desc' });
    assert.equal(newest.data[0]?.type, 'message');
    assert.equal((newest.data[0] as { role?: string }).role, 'assistant');
    const oldest = await client.conversations.items.list(conversation.id, { limit: 1, order: 'asc' });
    assert.deepEqual((oldest.data[0] as { content?: Array<{ text?: string }> }).content?.[0]?.text, 'line 0');
  });
});
