import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import OpenAI from 'openai';
import { createKey, startServer, type TestServer } from './helpers/server.js';
import { closers, completionJson, fixture, GATEWAY_MODEL, jsonFixture, startGateway } from './helpers/fixtures.js';

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

  it('lists large items a few megabytes a page, and the SDK pages through them all', async () => {
    // An outside pass listed 100 items of 14 MB in one 42 MB reply that held the event loop for
    // seconds; a page now stops before the item that would take it past 4 MB.
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const conversation = await client.conversations.create({});
    const big = (i: number) => ({ type: 'message' as const, role: 'user' as const, content: `${i}:${'w'.repeat(1_500_000)}` });
    await client.conversations.items.create(conversation.id, { items: [big(0), big(1), big(2)] });
    await client.conversations.items.create(conversation.id, {
      items: [big(3), big(4), { type: 'message', role: 'user', content: 'small' }],
    });
    const first = await client.conversations.items.list(conversation.id, { limit: 20, order: 'asc' });
    assert.equal(first.data.length, 2, 'two items of 1.5 MB fit in 4 MB, a third does not');
    assert.equal(first.has_more, true);
    const seen: string[] = [];
    for await (const item of client.conversations.items.list(conversation.id, { limit: 20, order: 'asc' })) {
      const text = (item as { content?: Array<{ text?: string }> }).content?.[0]?.text ?? '';
      seen.push(text.slice(0, text.indexOf(':') >= 0 ? text.indexOf(':') : text.length));
    }
    assert.deepEqual(seen, ['0', '1', '2', '3', '4', 'small']);
  });
});

/**
 * A turn reads its stored history newest first, within SWITCHYARD_HISTORY_MAX_BYTES (here 4 KB):
 * a conversation or chain of previous responses larger than that is a 400 naming it, or with
 * `truncation: "auto"` its newest turns from a user message on. Read whole, a 150 MB conversation
 * held the event loop 1.5 s on every turn.
 */
describe('stored history past the byte budget', () => {
  const c = closers();
  let gateway: TestServer;
  let local: TestServer;
  let key: string;
  let localKey: string;
  /** The messages each upstream request carried. */
  const seen: Array<Array<{ role: string; content: unknown }>> = [];
  const env = { SWITCHYARD_HISTORY_MAX_BYTES: '4096' };
  const filler = (i: number) => `turn ${i}: ${'x'.repeat(600)}`;

  before(async () => {
    const up = c.keep(
      await jsonFixture<{ messages: Array<{ role: string; content: unknown }> }>((body, res) => {
        seen.push(body.messages);
        res.writeHead(200, { 'content-type': 'application/json' });
        const usage = { prompt_tokens: 100, completion_tokens: 2, total_tokens: 102 };
        // Asked to, it calls a tool (call_2); otherwise it answers.
        if (String(body.messages.at(-1)?.content).endsWith('call a tool'))
          res.end(
            completionJson(
              {
                role: 'assistant',
                content: null,
                tool_calls: [{ id: 'call_2', type: 'function', function: { name: 'lookup', arguments: '{}' } }],
              },
              'tool_calls',
              usage,
            ),
          );
        else res.end(completionJson({ role: 'assistant', content: 'Noted.' }, 'stop', usage));
      }),
    );
    gateway = c.keep(
      await startGateway([{ baseUrl: up.url }], env, { context_length: 1_000_000, capabilities: ['streaming', 'function_calling'] }),
    );
    key = (await createKey(gateway, 'acme')).key;
    local = c.keep(await startServer({ env }));
    localKey = (await createKey(local, 'acme')).key;
  });
  after(() => c.closeAll());

  it('a conversation: 400 without truncation, its newest turns with truncation auto, and ids of older items still its own', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    // Ten turns of about 650 bytes each (user, then assistant): more than 4 KB in all.
    const items = Array.from({ length: 10 }, (_, i) => [
      { type: 'message' as const, role: 'user' as const, content: filler(i) },
      { type: 'message' as const, role: 'assistant' as const, content: `answer ${i}` },
    ]).flat();
    const conversation = await client.conversations.create({ items });
    const first = await client.conversations.items.list(conversation.id, { limit: 1, order: 'asc' });
    const oldest = first.data[0]!.id!;

    const refused = await client.responses.create({ model: GATEWAY_MODEL, conversation: conversation.id, input: 'And now?' }).then(
      () => assert.fail('a conversation past the budget was read'),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof OpenAI.BadRequestError);
    assert.equal(refused.code, 'context_length_exceeded');
    assert.equal(refused.param, 'conversation');
    assert.match(refused.message, /more than 4096 bytes/);
    assert.match(refused.message, /truncation/);
    assert.equal(seen.length, 0);

    const r = await client.responses.create({ model: GATEWAY_MODEL, conversation: conversation.id, input: 'And now?', truncation: 'auto' });
    assert.equal(r.status, 'completed');
    assert.equal(r.truncation, 'auto');
    const sent = seen.at(-1)!;
    // The newest turns, starting at a user message, then the new input; the oldest left out.
    assert.equal(sent[0]?.role, 'user');
    assert.match(String(sent[0]?.content), /^turn \d: /);
    assert.ok(!sent.some((m) => String(m.content).startsWith('turn 0:')));
    assert.ok(sent.some((m) => String(m.content).startsWith('turn 9:')));
    assert.equal(sent.at(-1)?.content, 'And now?');
    const readTurns = sent.filter((m) => String(m.content).startsWith('turn ')).length;
    assert.ok(readTurns >= 4 && readTurns < 10, `${readTurns} turns read`);

    // The oldest item is outside what a turn reads, and still the conversation's: referenced, it is
    // read again and not added a second time; a new item with its id is refused.
    const before = (await client.conversations.items.list(conversation.id, { limit: 100 })).data.length;
    const again = await client.responses.create({
      model: GATEWAY_MODEL,
      conversation: conversation.id,
      input: [
        { type: 'item_reference', id: oldest },
        { type: 'message', role: 'user', content: 'Remember the first turn?' },
      ],
      truncation: 'auto',
    });
    assert.equal(again.status, 'completed');
    assert.ok(seen.at(-1)!.some((m) => String(m.content).startsWith('turn 0:')));
    const after = (await client.conversations.items.list(conversation.id, { limit: 100 })).data;
    assert.equal(after.length, before + 2, 'the new message and the answer, not the referenced item');
    assert.equal(after.filter((i) => i.id === oldest).length, 1);
    const reused = await client.responses
      .create({
        model: GATEWAY_MODEL,
        conversation: conversation.id,
        input: [{ type: 'message', id: oldest, role: 'user', content: 'same id' } as unknown as OpenAI.Responses.ResponseInputItem],
        truncation: 'auto',
      })
      .then(
        () => assert.fail('an older item id was reused'),
        (e: unknown) => e,
      );
    assert.ok(reused instanceof OpenAI.BadRequestError);
    assert.match(reused.message, /already in this conversation/);
  });

  it("a cut keeps the conversation's developer prompt, and an older item's id names this conversation's item", async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    // Item ids are unique within a conversation only: another one holds the same id.
    const other = await client.conversations.create({
      items: [{ type: 'message', id: 'msg_shared', role: 'user', content: 'CONTENT-OF-OTHER' } as OpenAI.Responses.ResponseInputItem],
    });
    const items: OpenAI.Responses.ResponseInputItem[] = [
      { type: 'message', role: 'developer', content: 'Always answer in French.' },
      { type: 'message', id: 'msg_shared', role: 'user', content: 'CONTENT-OF-THIS' } as OpenAI.Responses.ResponseInputItem,
      { type: 'message', role: 'assistant', content: 'Noted.' },
    ];
    // Eight turns more (a conversation is created with at most 20 items): past the 4 KB budget.
    for (let i = 0; i < 8; i++)
      items.push({ type: 'message', role: 'user', content: filler(i) }, { type: 'message', role: 'assistant', content: `answer ${i}` });
    const conversation = await client.conversations.create({ items });

    const r = await client.responses.create({ model: GATEWAY_MODEL, conversation: conversation.id, input: 'And now?', truncation: 'auto' });
    assert.equal(r.status, 'completed');
    let sent = seen.at(-1)!;
    assert.ok(!sent.some((m) => String(m.content).startsWith('turn 0:')), 'the oldest turns are left out');
    assert.equal(sent.filter((m) => m.content === 'Always answer in French.').length, 1, JSON.stringify(sent.map((m) => m.role)));
    assert.ok(!sent.some((m) => m.content === 'CONTENT-OF-THIS'));

    const again = await client.responses.create({
      model: GATEWAY_MODEL,
      conversation: conversation.id,
      input: [{ type: 'item_reference', id: 'msg_shared' }],
      truncation: 'auto',
    });
    assert.equal(again.status, 'completed');
    sent = seen.at(-1)!;
    assert.ok(
      sent.some((m) => m.content === 'CONTENT-OF-THIS'),
      JSON.stringify(sent.map((m) => m.content)),
    );
    assert.ok(!sent.some((m) => m.content === 'CONTENT-OF-OTHER'));
    const inputs = await client.responses.inputItems.list(again.id);
    assert.deepEqual(
      inputs.data.map((i) => (i as { content?: Array<{ text?: string }> }).content?.[0]?.text),
      ['CONTENT-OF-THIS'],
    );
    // Outside any conversation, the id still names an item the organization stored.
    const elsewhere = await client.responses.create({ model: GATEWAY_MODEL, input: [{ type: 'item_reference', id: 'msg_shared' }] });
    assert.equal(elsewhere.status, 'completed');
    assert.ok(other.id);
  });

  it('a chain of previous responses: 400 naming previous_response_id, or its newest responses with truncation auto', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    let previous: string | null = null;
    for (let i = 0; i < 10; i++) {
      const r: OpenAI.Responses.Response = await client.responses.create({
        model: GATEWAY_MODEL,
        input: filler(i),
        previous_response_id: previous,
        truncation: 'auto',
      });
      previous = r.id;
    }
    const refused = await client.responses.create({ model: GATEWAY_MODEL, input: 'And now?', previous_response_id: previous }).then(
      () => assert.fail('a chain past the budget was read'),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof OpenAI.BadRequestError);
    assert.equal(refused.code, 'context_length_exceeded');
    assert.equal(refused.param, 'previous_response_id');

    const r = await client.responses.create({
      model: GATEWAY_MODEL,
      input: 'And now?',
      previous_response_id: previous,
      truncation: 'auto',
    });
    assert.equal(r.status, 'completed');
    const sent = seen.at(-1)!;
    assert.equal(sent[0]?.role, 'user');
    assert.ok(!sent.some((m) => String(m.content).startsWith('turn 0:')));
    assert.ok(sent.some((m) => String(m.content).startsWith('turn 9:')));
    assert.equal(sent.at(-1)?.content, 'And now?');
  });

  it('a tool loop past the budget goes on with truncation auto, and a compaction condenses what fits', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    // One user message, then a long tool loop: the part that fits holds no user message.
    const items: OpenAI.Responses.ResponseInputItem[] = [{ type: 'message', role: 'user', content: 'Look it all up.' }];
    for (let i = 0; i < 10; i++) {
      items.push({ type: 'function_call', call_id: `c${i}`, name: 'lookup', arguments: JSON.stringify({ q: filler(i) }) });
      if (i < 9) items.push({ type: 'function_call_output', call_id: `c${i}`, output: `result ${i}` });
    }
    const conversation = await client.conversations.create({ items });
    const tools: OpenAI.Responses.Tool[] = [{ type: 'function', name: 'lookup', parameters: { type: 'object' }, strict: false }];
    const r = await client.responses.create({
      model: GATEWAY_MODEL,
      conversation: conversation.id,
      input: [{ type: 'function_call_output', call_id: 'c9', output: 'result 9' }],
      tools,
      truncation: 'auto',
    });
    assert.equal(r.status, 'completed');
    const sent = seen.at(-1)! as Array<{ role: string; tool_calls?: Array<{ id: string }>; tool_call_id?: string }>;
    // It starts at a call, never at an output without one, and the last call is there for the new output.
    assert.equal(sent[0]?.role, 'assistant');
    assert.ok(sent.some((m) => m.tool_calls?.some((t) => t.id === 'c9')));
    assert.equal(sent.at(-1)?.tool_call_id, 'c9');

    // The chain of the budget test above cannot be continued without truncation; compacted, it can.
    let previous: string | null = null;
    for (let i = 0; i < 10; i++)
      previous = (
        await client.responses.create({ model: GATEWAY_MODEL, input: filler(i), previous_response_id: previous, truncation: 'auto' })
      ).id;
    const compacted = await client.responses.compact({ model: GATEWAY_MODEL, previous_response_id: previous });
    assert.ok(compacted.output.some((o) => o.type === 'compaction'));
  });

  it('a cut never keeps a call output without its call: parallel calls in a conversation, a chain between responses', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const tools: OpenAI.Responses.Tool[] = [{ type: 'function', name: 'lookup', parameters: { type: 'object' }, strict: false }];
    type Sent = Array<{ role: string; tool_calls?: Array<{ id: string }>; tool_call_id?: string }>;
    const orphans = (sent: Sent) => {
      const calls = new Set<string>();
      return sent.filter((m) => {
        for (const t of m.tool_calls ?? []) calls.add(t.id);
        return m.role === 'tool' && !calls.has(m.tool_call_id ?? '');
      });
    };
    // Two parallel calls, the first with large arguments: the part that fits starts between them.
    const conversation = await client.conversations.create({
      items: [
        { type: 'message', role: 'user', content: 'go' },
        { type: 'function_call', call_id: 'cA', name: 'lookup', arguments: JSON.stringify({ q: 'a'.repeat(700) }) },
        { type: 'function_call', call_id: 'cB', name: 'lookup', arguments: '{}' },
        { type: 'function_call_output', call_id: 'cA', output: 'b'.repeat(1600) },
        { type: 'function_call_output', call_id: 'cB', output: 'b'.repeat(1600) },
      ],
    });
    await client.responses.create({ model: GATEWAY_MODEL, conversation: conversation.id, input: 'next', tools, truncation: 'auto' });
    const fromConversation = seen.at(-1)! as Sent;
    assert.deepEqual(orphans(fromConversation), [], JSON.stringify(fromConversation).slice(0, 500));
    assert.ok(fromConversation.some((m) => m.tool_call_id === 'cB'));
    assert.ok(!fromConversation.some((m) => m.tool_call_id === 'cA'));

    // A chain: the call in one response's output, its output in the next one's input.
    const r2 = await client.responses.create({ model: GATEWAY_MODEL, input: `${'x'.repeat(2500)} call a tool`, tools });
    assert.equal(r2.output[0]?.type, 'function_call');
    const r3 = await client.responses.create({
      model: GATEWAY_MODEL,
      previous_response_id: r2.id,
      input: [{ type: 'function_call_output', call_id: 'call_2', output: 'y'.repeat(1500) }],
      tools,
      truncation: 'auto',
    });
    await client.responses.create({ model: GATEWAY_MODEL, previous_response_id: r3.id, input: 'next', tools, truncation: 'auto' });
    const fromChain = seen.at(-1)! as Sent;
    assert.deepEqual(orphans(fromChain), [], JSON.stringify(fromChain).slice(0, 500));
    assert.equal((fromChain.at(-1) as { content?: unknown }).content, 'next');
  });

  it('items named by reference count against the budget too', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: gateway.baseURL, maxRetries: 0 });
    const items = Array.from({ length: 10 }, (_, i) => ({ type: 'message' as const, role: 'user' as const, content: filler(i) }));
    const conversation = await client.conversations.create({ items });
    const ids = (await client.conversations.items.list(conversation.id, { limit: 100, order: 'asc' })).data.map((i) => i.id!);
    const refer = (n: number) => ids.slice(0, n).map((id) => ({ type: 'item_reference' as const, id }));
    const refused = await client.responses.create({ model: GATEWAY_MODEL, input: refer(10) }).then(
      () => assert.fail('10 items of 650 bytes were read for a 4 KB budget'),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof OpenAI.BadRequestError);
    assert.equal(refused.code, 'context_length_exceeded');
    assert.equal(refused.param, 'input');
    const r = await client.responses.create({ model: GATEWAY_MODEL, input: refer(3) });
    assert.equal(r.status, 'completed');
    assert.ok(seen.at(-1)!.some((m) => String(m.content).startsWith('turn 2:')));
  });

  it('the local model answers a turn on a conversation past the budget with truncation auto', async () => {
    const client = new OpenAI({ apiKey: localKey, baseURL: local.baseURL, maxRetries: 0 });
    const items = Array.from({ length: 10 }, (_, i) => ({ type: 'message' as const, role: 'user' as const, content: filler(i) }));
    const conversation = await client.conversations.create({ items });
    const refused = await client.responses
      .create({ model: 'local/stories260k', conversation: conversation.id, input: 'Once upon a time', max_output_tokens: 8 })
      .then(
        () => assert.fail('a conversation past the budget was read'),
        (e: unknown) => e,
      );
    assert.ok(refused instanceof OpenAI.BadRequestError);
    assert.equal(refused.code, 'context_length_exceeded');
    const r = await client.responses.create({
      model: 'local/stories260k',
      conversation: conversation.id,
      input: 'Once upon a time',
      max_output_tokens: 8,
      truncation: 'auto',
    });
    // Eight tokens of a story: cut at max_output_tokens unless the story ends sooner.
    assert.ok(r.status === 'completed' || r.incomplete_details?.reason === 'max_output_tokens', r.status);
    assert.ok(r.output_text.length > 0);
    assert.ok((r.usage?.input_tokens ?? 0) > 0);
  });
});
