import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { rmSync, statSync } from 'node:fs';
import Database from 'better-sqlite3';
import { Kysely, Migrator, PostgresDialect, SqliteDialect, sql } from 'kysely';
import pg from 'pg';
import { KyselyStore } from '../src/store/kysely-store.js';
import { migrationProvider } from '../src/store/migrations.js';
import { withStatementCache } from '../src/store/sqlite-dialect.js';
import type { Store, UsageRecord } from '../src/store/store.js';
import { resolveModelSpec, type Model } from '../src/core/model-spec.js';
import { createKey, ensureAdminKey, parseKey, secretMatches } from '../src/core/keys.js';
import { pgSchema, tempDir } from './helpers/server.js';
import { eventually } from './helpers/wait.js';
import { usageRecord } from './helpers/usage.js';

function model(id: string, extra: Record<string, unknown> = {}): Model {
  const m = resolveModelSpec({ id, context_length: 4096, ...extra }, 'admin', 1_700_000_000);
  if (typeof m === 'string') throw new Error(m);
  return m;
}

/** One suite, run against every dialect. */
function storeSuite(name: string, open: () => Promise<{ store: Store; cleanup(): Promise<void> }>): void {
  describe(`store: ${name}`, () => {
    let store: Store;
    let cleanup: () => Promise<void>;

    before(async () => {
      ({ store, cleanup } = await open());
      await store.migrate();
    });
    after(async () => {
      await store.close();
      await cleanup();
    });

    it('migrates idempotently and answers ping', async () => {
      await store.migrate();
      await store.ping();
    });

    it("finds stored items by organization, from responses and conversations, and forgets a deleted response's", async () => {
      const find = async (org: string, ids: string[]) => (await store.findItems(org, ids, 1e9))!;
      await store.createResponse(responseRow('resp_items', 'org_a', 'completed'));
      await store.saveResponseItems(
        'org_a',
        'resp_items',
        [item({ id: 'msg_1', v: 1 }), item({ id: 'msg_2', v: 2 }), item({ id: 'msg_1', v: 3 })],
        1,
      );
      await store.saveResponseItems('org_b', 'resp_other', [item({ id: 'msg_2', b: true })], 1);
      await store.createConversation({ id: 'conv_items', org_id: 'org_a', created_at: 1, created_ms: 1000, metadata: '{}' });
      assert.equal(await store.appendConversationItems('conv_items', [{ id: 'msg_c', json: '{"c":1}' }], 2), true);
      // A conversation deleted (or never there) takes nothing, and says so instead of failing a foreign key.
      assert.equal(await store.appendConversationItems('conv_gone', [{ id: 'msg_g', json: '{}' }], 2), false);
      // More items than one statement may bind (5 parameters each), appended as one block in order.
      await store.createConversation({ id: 'conv_many', org_id: 'org_a', created_at: 1, created_ms: 1001, metadata: '{}' });
      const many = Array.from({ length: 7_000 }, (_, i) => ({ id: `msg_m${i}`, json: `{"i":${i}}` }));
      assert.equal(await store.appendConversationItems('conv_many', many, 3), true);
      const list = (opts: { after?: string; limit: number; order: 'asc' | 'desc'; maxBytes?: number }) =>
        store.listConversationItems('conv_many', { maxBytes: 1e9, ...opts });
      const last = await list({ limit: 1, order: 'desc' });
      assert.deepEqual(last?.items, ['{"i":6999}']);
      // A cursor that names no item of the conversation is not a page from the start.
      assert.equal(await list({ after: 'msg_none', limit: 1, order: 'asc' }), undefined);
      assert.deepEqual((await list({ after: 'msg_m0', limit: 1, order: 'asc' }))?.items, ['{"i":1}']);
      // A page stops before the item that would take it past maxBytes (each item here is 7 bytes),
      // and holds one item however large it is.
      assert.deepEqual(await list({ after: 'msg_m9', limit: 20, order: 'asc', maxBytes: 22 }), {
        items: ['{"i":10}', '{"i":11}'],
        hasMore: true,
      });
      assert.deepEqual(await list({ after: 'msg_m9', limit: 20, order: 'desc', maxBytes: 1 }), { items: ['{"i":8}'], hasMore: true });
      assert.deepEqual(await list({ after: 'msg_m6997', limit: 5, order: 'asc', maxBytes: 100 }), {
        items: ['{"i":6998}', '{"i":6999}'],
        hasMore: false,
      });
      // A turn reads the newest items within a byte budget, oldest first, in pages of sizes.
      const recent = (id: string, bytes: number) => store.recentConversationItems(id, bytes, true);
      assert.deepEqual(await recent('conv_many', 30), { items: ['{"i":6997}', '{"i":6998}', '{"i":6999}'], complete: false });
      // Unless a part will do, nothing is read of a conversation that does not fit.
      assert.deepEqual(await store.recentConversationItems('conv_many', 30, false), { items: [], complete: false });
      assert.equal((await store.recentConversationItems('conv_many', 1e9, false)).items.length, 7_000);
      const whole = await recent('conv_many', 1e9);
      assert.equal(whole.items.length, 7_000);
      assert.equal(whole.items[0], '{"i":0}');
      assert.equal(whole.complete, true);
      assert.deepEqual(await recent('conv_items', 7), { items: ['{"c":1}'], complete: true });
      assert.deepEqual(await recent('conv_items', 6), { items: [], complete: false });
      assert.deepEqual(await recent('conv_none', 6), { items: [], complete: true });
      // Its first items within a count and a byte budget (each of these is 7 to 10 bytes).
      assert.deepEqual(await store.openingConversationItems('conv_many', 3, 1e9), ['{"i":0}', '{"i":1}', '{"i":2}']);
      assert.deepEqual(await store.openingConversationItems('conv_many', 3, 15), ['{"i":0}', '{"i":1}']);
      assert.deepEqual(await store.openingConversationItems('conv_many', 3, 6), []);
      // Read a megabyte or so a statement, in order across statements.
      await store.createConversation({ id: 'conv_pages', org_id: 'org_a', created_at: 1, created_ms: 1003, metadata: '{}' });
      const pages = Array.from({ length: 5 }, (_, i) => ({ id: `msg_p${i}`, json: JSON.stringify(`${i}${'p'.repeat(400_000)}`) }));
      await store.appendConversationItems('conv_pages', pages, 3);
      assert.deepEqual(
        (await recent('conv_pages', 1e9)).items,
        pages.map((p) => p.json),
      );
      assert.deepEqual(
        (await recent('conv_pages', 1_300_000)).items,
        pages.slice(2).map((p) => p.json),
      );
      // Sizes are bytes of UTF-8, not characters.
      await store.createConversation({ id: 'conv_utf8', org_id: 'org_a', created_at: 1, created_ms: 1002, metadata: '{}' });
      await store.appendConversationItems(
        'conv_utf8',
        [
          { id: 'msg_u1', json: '"é"' },
          { id: 'msg_u2', json: '"ü"' },
        ],
        3,
      );
      assert.deepEqual(await recent('conv_utf8', 7), { items: ['"ü"'], complete: false });
      assert.deepEqual(await recent('conv_utf8', 8), { items: ['"é"', '"ü"'], complete: true });
      // Items of a response deleted while they were written in slices are not left behind.
      const orphans = Array.from({ length: 1_200 }, (_, i) => ({ id: `msg_o${i}` }));
      await store.saveResponseItems('org_a', 'resp_deleted_meanwhile', orphans, 5);
      assert.equal((await find('org_a', ['msg_o0', 'msg_o1199'])).size, 0);
      assert.deepEqual(Object.fromEntries(await find('org_a', ['msg_1', 'msg_2', 'msg_c', 'msg_none'])), {
        msg_1: '{"id":"msg_1","v":1}',
        msg_2: '{"id":"msg_2","v":2}',
        msg_c: '{"c":1}',
      });
      assert.deepEqual(Object.fromEntries(await find('org_c', ['msg_1', 'msg_c'])), {});
      // Past a byte budget, nothing is read: msg_1 and msg_c take 20 and 7 bytes.
      assert.equal(await store.findItems('org_a', ['msg_1', 'msg_c'], 26), undefined);
      assert.equal((await store.findItems('org_a', ['msg_1', 'msg_c'], 27))?.size, 2);
      // An id stored before keeps its first item and response: a later save does not move it.
      await store.saveResponseItems('org_a', 'resp_later', [item({ id: 'msg_2', v: 4 })], 2);
      assert.equal((await find('org_a', ['msg_2'])).get('msg_2'), '{"id":"msg_2","v":2}');
      assert.ok(await store.deleteResponse('resp_items'));
      assert.deepEqual([...(await find('org_a', ['msg_1', 'msg_2', 'msg_c'])).keys()], ['msg_c']);
      assert.equal((await find('org_b', ['msg_2'])).get('msg_2'), '{"id":"msg_2","b":true}');
      // An id a conversation holds names its own item there, before a stored response's or another
      // conversation's with the same id (ids are unique per conversation only).
      await store.createConversation({ id: 'conv_dup', org_id: 'org_a', created_at: 1, created_ms: 1004, metadata: '{}' });
      await store.appendConversationItems('conv_dup', [{ id: 'msg_c', json: '{"dup":1}' }], 1);
      await store.saveResponseItems('org_a', 'resp_dup', [item({ id: 'msg_d', v: 5 })], 1);
      await store.appendConversationItems('conv_dup', [{ id: 'msg_d', json: '{"dup":2}' }], 1);
      assert.deepEqual(Object.fromEntries(await find('org_a', ['msg_c', 'msg_d'])), { msg_c: '{"c":1}', msg_d: '{"id":"msg_d","v":5}' });
      assert.deepEqual(Object.fromEntries((await store.findItems('org_a', ['msg_c', 'msg_d', 'msg_none'], 1e9, 'conv_dup'))!), {
        msg_c: '{"dup":1}',
        msg_d: '{"dup":2}',
      });
      assert.deepEqual(Object.fromEntries((await store.findItems('org_a', ['msg_c'], 1e9, 'conv_items'))!), { msg_c: '{"c":1}' });
    });

    it("replaces an abandoned response's snapshot with its run's own record, and keeps any other record under the same id", async () => {
      const totals = async (org: string) => (await store.usageTotals('org', { org }))[0];
      const snapshot = usageRecord('usage_snap', {
        org_id: 'org_snap',
        output_tokens: 200,
        estimated: true,
        status: 500,
        error_code: 'server_error',
      });
      await store.insertUsage([snapshot]);
      assert.deepEqual([(await totals('org_snap'))?.output_tokens, (await totals('org_snap'))?.estimated_requests], [200, 1]);
      // The run was only slow: its own record, when it ends, takes the snapshot's place.
      await store.insertUsage([usageRecord('usage_snap', { org_id: 'org_snap', output_tokens: 5000 })]);
      const t = await totals('org_snap');
      assert.deepEqual([t?.requests, t?.output_tokens, t?.estimated_requests, t?.errors], [1, 5000, 0, 0]);
      // A snapshot (or a batch written again) never replaces a run's own record.
      await store.insertUsage([snapshot]);
      await store.insertUsage([usageRecord('usage_snap', { org_id: 'org_snap', output_tokens: 1 })]);
      assert.equal((await totals('org_snap'))?.output_tokens, 5000);
    });

    it("keeps each running response's heartbeat: its time, and its own usage record, across statements", async () => {
      const running = Array.from({ length: 450 }, (_, i) => `resp_beat${i}`);
      for (const id of running) await store.createResponse({ ...responseRow(id, 'org_beat', 'in_progress'), background: true });
      // Every other one has a record (more than one statement's slice of them); the rest are touched only.
      const usage = new Map(running.filter((_, i) => i % 2 === 0).map((id) => [id, JSON.stringify({ id: `usage_${id}`, n: id.length })]));
      await store.touchResponses(running, 5_000, usage);
      for (const id of running) assert.equal(await store.pendingUsage(id), usage.get(id) ?? null, id);
      const stale = await store.staleResponses(['in_progress'], 4_000);
      assert.equal(stale.filter((r) => r.org_id === 'org_beat').length, 0, 'every one was touched');
      assert.equal((await store.staleResponses(['in_progress'], 6_000)).filter((r) => r.org_id === 'org_beat').length, 450);
    });

    it('stores chat completions per organization: metadata filters, update, cursor order with equal times, delete', async () => {
      const cc = (id: string, org: string, stored_at: number, metadata: Record<string, string>, model = 'm/a') => ({
        id,
        org_id: org,
        model,
        created_at: 1_700_000_000,
        stored_at,
        metadata,
        body: JSON.stringify({ id }),
      });
      // cc_b and cc_c share a time: the id decides between them, in both orders.
      await store.createChatCompletion(cc('cc_c', 'org_a', 20, { k: 'v', n: '3' }), '[{"id":"cc_c-0"}]');
      await store.createChatCompletion(cc('cc_a', 'org_a', 10, { k: 'v', n: '1' }, 'm/b'), '[]');
      await store.createChatCompletion(cc('cc_b', 'org_a', 20, { k: 'w' }), '[]');
      await store.createChatCompletion(cc('cc_x', 'org_b', 15, { k: 'v' }), '[]');
      const ids = async (q: Partial<Parameters<Store['listChatCompletions']>[1]>, org = 'org_a') =>
        (await store.listChatCompletions(org, { metadata: {}, limit: 10, order: 'asc', ...q })).records.map((r) => r.id);

      assert.deepEqual(await ids({}), ['cc_a', 'cc_b', 'cc_c']);
      assert.deepEqual(await ids({ order: 'desc' }), ['cc_c', 'cc_b', 'cc_a']);
      assert.deepEqual(await ids({ after: { id: 'cc_b', stored_at: 20 } }), ['cc_c']);
      assert.deepEqual(await ids({ after: { id: 'cc_c', stored_at: 20 }, order: 'desc' }), ['cc_b', 'cc_a']);
      assert.deepEqual(await ids({ metadata: { k: 'v' } }), ['cc_a', 'cc_c']);
      assert.deepEqual(await ids({ metadata: { k: 'v', n: '3' } }), ['cc_c']);
      assert.deepEqual(await ids({ model: 'm/b' }), ['cc_a']);
      assert.deepEqual(await ids({ metadata: { k: 'v' } }, 'org_b'), ['cc_x']);
      const page = await store.listChatCompletions('org_a', { metadata: {}, limit: 2, order: 'asc' });
      assert.deepEqual([page.records.length, page.hasMore], [2, true]);
      // A page within a byte bound (each body here is 13 bytes): the order and the filters as before.
      const bounded = await store.listChatCompletions('org_a', { metadata: {}, limit: 10, order: 'desc', maxBytes: 26 });
      assert.deepEqual([bounded.records.map((r) => r.id), bounded.hasMore], [['cc_c', 'cc_b'], true]);
      assert.deepEqual(bounded.records[0], cc('cc_c', 'org_a', 20, { k: 'v', n: '3' }), 'whole records');
      const one = await store.listChatCompletions('org_a', { metadata: { k: 'v' }, limit: 10, order: 'asc', maxBytes: 1 });
      assert.deepEqual([one.records.map((r) => r.id), one.hasMore], [['cc_a'], true]);
      const all = await store.listChatCompletions('org_a', { metadata: {}, limit: 10, order: 'asc', maxBytes: 1e6 });
      assert.deepEqual([all.records.map((r) => r.id), all.hasMore], [['cc_a', 'cc_b', 'cc_c'], false]);

      assert.deepEqual(await store.getChatCompletion('org_a', 'cc_c'), cc('cc_c', 'org_a', 20, { k: 'v', n: '3' }));
      assert.equal(await store.getChatCompletion('org_b', 'cc_c'), undefined, "another organization's id is not found");
      assert.equal(await store.getChatCompletionMessages('org_a', 'cc_c'), '[{"id":"cc_c-0"}]');
      assert.equal(await store.getChatCompletionMessages('org_b', 'cc_c'), undefined);

      assert.equal(await store.updateChatCompletionMetadata('org_b', 'cc_c', { k: 'stolen' }), false);
      assert.equal(await store.updateChatCompletionMetadata('org_a', 'cc_c', { k: 'z' }), true);
      assert.deepEqual((await store.getChatCompletion('org_a', 'cc_c'))!.metadata, { k: 'z' });
      assert.deepEqual(await ids({ metadata: { n: '3' } }), [], 'update replaces every pair');
      assert.deepEqual(await ids({ metadata: { k: 'z' } }), ['cc_c']);

      assert.equal(await store.deleteChatCompletion('org_b', 'cc_c'), false);
      assert.equal(await store.deleteChatCompletion('org_a', 'cc_c'), true);
      assert.equal(await store.deleteChatCompletion('org_a', 'cc_c'), false);
      assert.deepEqual(await ids({ metadata: { k: 'z' } }), []);
      // Its metadata rows went with it: the id can be stored again.
      await store.createChatCompletion(cc('cc_c', 'org_a', 30, { k: 'z' }), '[]');
      assert.deepEqual(await ids({ metadata: { k: 'z' } }), ['cc_c']);
    });

    it("lists an organization's responses and conversations in creation order, paging with equal times by id", async () => {
      const resp = (id: string, org: string, created_ms: number) => ({
        id,
        org_id: org,
        status: 'completed',
        background: false,
        conversation_id: null,
        previous_response_id: null,
        created_at: Math.floor(created_ms / 1000),
        created_ms,
        updated_at: created_ms,
        body: JSON.stringify({ id }),
        input_items: '[]',
      });
      // rl_b and rl_c share a time: the id decides between them, in both orders.
      await store.createResponse(resp('rl_c', 'org_l', 2000));
      await store.createResponse(resp('rl_a', 'org_l', 1000));
      await store.createResponse(resp('rl_b', 'org_l', 2000));
      await store.createResponse(resp('rl_x', 'org_m', 1500));
      const responses = async (q: Partial<Parameters<Store['listResponses']>[1]>, org = 'org_l') =>
        (await store.listResponses(org, { limit: 10, order: 'asc', ...q })).records.map((r) => r.id);
      assert.deepEqual(await responses({}), ['rl_a', 'rl_b', 'rl_c']);
      assert.deepEqual(await responses({ order: 'desc' }), ['rl_c', 'rl_b', 'rl_a']);
      assert.deepEqual(await responses({ after: { id: 'rl_b', created_ms: 2000 } }), ['rl_c']);
      assert.deepEqual(await responses({ after: { id: 'rl_c', created_ms: 2000 }, order: 'desc' }), ['rl_b', 'rl_a']);
      assert.deepEqual(await responses({}, 'org_m'), ['rl_x']);
      assert.deepEqual(await responses({}, 'org_none'), []);
      const page = await store.listResponses('org_l', { limit: 2, order: 'asc' });
      assert.deepEqual([page.records.map((r) => r.id), page.hasMore], [['rl_a', 'rl_b'], true]);
      const { input_items: _items, ...listed } = resp('rl_a', 'org_l', 1000);
      assert.deepEqual(page.records[0], listed, 'every field but the input items comes back');
      // A page within a byte bound (each body here is 13 bytes), in either order, whole records.
      const bounded = await store.listResponses('org_l', { limit: 10, order: 'asc', maxBytes: 26 });
      assert.deepEqual([bounded.records.map((r) => r.id), bounded.hasMore], [['rl_a', 'rl_b'], true]);
      assert.deepEqual(bounded.records[0], listed);
      const desc = await store.listResponses('org_l', { limit: 10, order: 'desc', maxBytes: 1, after: { id: 'rl_c', created_ms: 2000 } });
      assert.deepEqual([desc.records.map((r) => r.id), desc.hasMore], [['rl_b'], true]);
      const last = await store.listResponses('org_l', { limit: 10, order: 'asc', maxBytes: 1e6, after: { id: 'rl_b', created_ms: 2000 } });
      assert.deepEqual([last.records.map((r) => r.id), last.hasMore], [['rl_c'], false]);
      assert.deepEqual(await store.getResponse('rl_a'), listed);
      // The input is kept apart: a change of status leaves it, deleting the response takes it.
      await store.createResponse({ ...resp('rl_in', 'org_l', 3000), status: 'in_progress', input_items: '[{"id":"msg_in"}]' });
      assert.equal(await store.updateResponse('rl_in', ['in_progress'], { status: 'completed', body: '{"done":true}' }), true);
      assert.equal(await store.getResponseInput('rl_in'), '[{"id":"msg_in"}]');
      assert.equal(await store.deleteResponse('rl_in'), true);
      assert.equal(await store.getResponseInput('rl_in'), undefined);
      assert.equal((await store.listResponses('org_l', { limit: 3, order: 'asc' })).hasMore, false);

      const conv = (id: string, org: string, created_ms: number) => ({
        id,
        org_id: org,
        created_at: Math.floor(created_ms / 1000),
        created_ms,
        metadata: '{}',
      });
      await store.createConversation(conv('cl_b', 'org_l', 3000));
      await store.createConversation(conv('cl_a', 'org_l', 3000));
      await store.createConversation(conv('cl_x', 'org_m', 3000));
      const conversations = async (q: Partial<Parameters<Store['listConversations']>[1]>, org = 'org_l') =>
        (await store.listConversations(org, { limit: 10, order: 'asc', ...q })).records.map((r) => r.id);
      assert.deepEqual(await conversations({}), ['cl_a', 'cl_b']);
      assert.deepEqual(await conversations({ order: 'desc', limit: 1 }), ['cl_b']);
      assert.deepEqual(await conversations({ after: { id: 'cl_a', created_ms: 3000 } }), ['cl_b']);
      assert.deepEqual(await conversations({}, 'org_m'), ['cl_x']);
      assert.deepEqual(await store.getConversation('cl_a'), conv('cl_a', 'org_l', 3000));
    });

    it('creates, reads and lists organizations', async () => {
      await store.createOrg({ id: 'acme', name: 'Acme Inc', created_at: 1_700_000_001 });
      await store.createOrg({ id: 'beta', name: 'Beta', created_at: 1_700_000_002 });
      assert.deepEqual(await store.getOrg('acme'), { id: 'acme', name: 'Acme Inc', created_at: 1_700_000_001, limits: null });
      assert.equal(await store.getOrg('nobody'), undefined);
      assert.deepEqual(
        (await store.listOrgs()).map((o) => o.id),
        ['acme', 'beta'],
      );
      await assert.rejects(store.createOrg({ id: 'acme', name: 'again', created_at: 1 }));
    });

    it('stores keys hashed, lists them and revokes once', async () => {
      const created = await createKey(store, { org: 'acme', name: 'ci', role: 'inference' });
      const parsed = parseKey(created.key)!;
      const record = (await store.getKey(parsed.id))!;
      assert.equal(record.org_id, 'acme');
      assert.equal(record.role, 'inference');
      assert.equal(record.revoked_at, null);
      assert.ok(!record.hash.includes(parsed.secret), 'the secret is not stored');
      assert.ok(secretMatches(parsed.secret, record.hash));
      assert.ok(!secretMatches(`${parsed.secret}x`, record.hash));
      // A hash that differs in its last digit only, or is cut short, does not match.
      const last = record.hash.at(-1) === '0' ? '1' : '0';
      assert.ok(!secretMatches(parsed.secret, record.hash.slice(0, -1) + last));
      assert.ok(!secretMatches(parsed.secret, record.hash.slice(0, -1)));
      assert.equal(typeof record.created_at, 'number');

      const other = await createKey(store, { org: 'newco', name: 'x', role: 'inference' });
      assert.equal(other.orgCreated, true, 'a key for a new org creates the org');
      assert.ok(await store.getOrg('newco'));
      assert.deepEqual(
        (await store.listKeys('acme')).map((k) => k.id),
        [record.id],
      );

      assert.equal(await store.revokeKey(record.id, 1_800_000_000), true);
      assert.equal(await store.revokeKey(record.id, 1_900_000_000), true);
      assert.equal((await store.getKey(record.id))!.revoked_at, 1_800_000_000, 'the first revocation time stays');
      assert.equal(await store.revokeKey('key_nope', 1), false);
    });

    it('bootstraps one admin key, and rotates a configured one', async () => {
      const first = await ensureAdminKey(store, undefined);
      assert.ok(first.generated?.startsWith('sk-sy-'));
      assert.equal(await store.countActiveAdminKeys(), 1);
      assert.deepEqual(await ensureAdminKey(store, undefined), {}, 'a second start generates nothing');

      const configured = 'operator-chosen-admin-key-0001';
      await ensureAdminKey(store, configured);
      const id = parseKey(configured)!.id;
      assert.equal((await store.getKey(id))!.role, 'admin');
      await ensureAdminKey(store, 'operator-chosen-admin-key-0002');
      assert.notEqual((await store.getKey(id))!.revoked_at, null, 'the previous configured key is revoked on rotation');
    });

    it('never revokes the last admin key, even with two revocations at once', async () => {
      await createKey(store, { org: 'ops', name: 'admin a', role: 'admin' });
      await createKey(store, { org: 'ops', name: 'admin b', role: 'admin' });
      const active = async () => (await store.listKeys()).filter((k) => k.role === 'admin' && k.revoked_at === null).map((k) => k.id);
      const ids = await active();
      assert.ok(ids.length >= 2);
      for (const id of ids.slice(2)) assert.equal(await store.revokeKey(id, 1), true);
      // The last two at once: one is revoked, the other is kept as the last.
      const both = await Promise.all(ids.slice(0, 2).map((id) => store.revokeKey(id, 1)));
      assert.deepEqual(both.slice().sort(), [true, 'last_admin'].sort());
      assert.equal((await active()).length, 1);
      assert.equal(await store.countActiveAdminKeys(), 1);
      assert.equal(await store.revokeKey((await active())[0]!, 1), 'last_admin');
    });

    it('upserts models, keeping created, and round-trips every field', async () => {
      const m = model('meta-llama/test-a', { pricing: [{ metric: 'input_tokens', rate: 0.15 }], capabilities: ['streaming', 'vision'] });
      await store.upsertModel(m);
      assert.deepEqual(await store.getModel('meta-llama/test-a'), m);
      await store.upsertModel({ ...m, name: 'Renamed', created: 42 });
      const again = (await store.getModel('meta-llama/test-a'))!;
      assert.equal(again.name, 'Renamed');
      assert.equal(again.created, m.created);

      const img = model('black-forest-labs/img', { model_type: 'image_generation', context_length: undefined, output_size: '512x512' });
      assert.equal(await store.insertModel(img), true);
      assert.equal(await store.insertModel(img), false, 'insert does not overwrite');
      const back = (await store.getModel(img.id))!;
      assert.equal(back.context_length, null);
      assert.equal(back.output_size, '512x512');
      assert.deepEqual(
        (await store.listModels()).map((x) => x.id),
        ['black-forest-labs/img', 'meta-llama/test-a'],
      );
      assert.equal(await store.getModel('x/none'), undefined);
    });
  });
}

/**
 * Responses and conversations stored before the list order existed (migration 0010) list by the
 * second they were created in.
 */
function creationOrderMigration(name: string, open: () => Promise<{ store: KyselyStore; url: string; cleanup(): Promise<void> }>): void {
  it(`gives rows stored before migration 0010 their creation second as list order (${name})`, async () => {
    const { store, url, cleanup } = await open();
    const db = new Kysely<unknown>({
      dialect: url.startsWith('postgres')
        ? new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 1 }) })
        : new SqliteDialect({ database: new Database(url) }),
    });
    try {
      const schema = url.startsWith('postgres')
        ? (await sql<{ schema: string }>`select current_schema() as schema`.execute(db)).rows[0]?.schema
        : undefined;
      const migrator = new Migrator({ db, provider: migrationProvider, ...(schema && { migrationTableSchema: schema }) });
      const to = await migrator.migrateTo('0009_stored_chat_completions');
      assert.equal(to.error, undefined);
      await sql`insert into responses (id, org_id, status, background, conversation_id, previous_response_id, created_at, updated_at, body, input_items)
        values ('resp_old2', 'acme', 'completed', 0, null, null, 1700000002, 1, '{}', '[{"id":"msg_old2"}]'),
               ('resp_old1', 'acme', 'completed', 0, null, null, 1700000001, 1, '{}', '[]')`.execute(db);
      await sql`insert into conversations (id, org_id, created_at, metadata) values ('conv_old', 'acme', 1700000003, '{}')`.execute(db);
      await store.migrate();
      const listed = await store.listResponses('acme', { limit: 10, order: 'asc' });
      assert.deepEqual(
        listed.records.map((r) => [r.id, r.created_ms]),
        [
          ['resp_old1', 1_700_000_001_000],
          ['resp_old2', 1_700_000_002_000],
        ],
      );
      assert.equal((await store.getConversation('conv_old'))?.created_ms, 1_700_000_003_000);
      // 0011 moved each response's input out of its row, unchanged.
      assert.equal(await store.getResponseInput('resp_old2'), '[{"id":"msg_old2"}]');
      assert.equal(await store.getResponseInput('resp_old1'), '[]');
      assert.equal('input_items' in (await store.getResponse('resp_old2'))!, false);
    } finally {
      await db.destroy();
      await store.close();
      await cleanup();
    }
  });
}

/** An item as the store keeps it: its id and whatever else it holds. */
const item = (o: { id: string } & Record<string, unknown>): { id: string } => o;

/** A stored response's row with nothing in it but its id, organization and status. */
const responseRow = (id: string, org: string, status: string) => ({
  id,
  org_id: org,
  status,
  background: false,
  conversation_id: null,
  previous_response_id: null,
  created_at: 1,
  created_ms: 1000,
  updated_at: 1,
  body: '{}',
  input_items: '[]',
});
describe('store: migration 0010 (creation order)', () => {
  creationOrderMigration('sqlite', async () => {
    const dir = tempDir();
    const file = join(dir, 'old.db');
    return { store: new KyselyStore({ sqlitePath: file }), url: file, cleanup: async () => rmSync(dir, { recursive: true, force: true }) };
  });
  creationOrderMigration('postgres', async () => {
    const schema = await pgSchema();
    return { store: new KyselyStore({ databaseUrl: schema.url, sqlitePath: '' }), url: schema.url, cleanup: () => schema.drop() };
  });
});

describe('store: SQLite usage insert', () => {
  it('stores every field of a record in its own column, alone and in a batch, and ignores an id it has', async () => {
    const dir = tempDir();
    const file = join(dir, 'usage.db');
    const store = new KyselyStore({ sqlitePath: file });
    try {
      await store.migrate();
      // Every field distinct from every other, so that two columns swapped cannot go unseen.
      const record = (i: number, flags: boolean): UsageRecord => ({
        id: `usage_cols_${i}`,
        at: 1_700_000_000_000 + i,
        day: `2023-11-1${i}`,
        request_id: `req_cols_${i}`,
        key_id: `key_cols_${i}`,
        org_id: `org_cols_${i}`,
        model: `m/cols-${i}`,
        deployment: `dep_cols_${i}`,
        endpoint: (['chat.completions', 'responses', 'messages'] as const)[i - 1]!,
        stream: flags,
        input_tokens: 100 + i,
        cached_tokens: 200 + i,
        output_tokens: 300 + i,
        reasoning_tokens: 400 + i,
        cost: 0.5 + i,
        price_missing: !flags,
        estimated: i === 2,
        latency_ms: 500 + i,
        ttft_ms: 600 + i,
        status: 201 + i,
        error_code: `error_${i}`,
      });
      const records = [record(1, true), record(2, false), record(3, true)];
      await store.insertUsage([records[0]!]);
      await store.insertUsage([records[1]!, records[2]!]);
      await store.insertUsage([{ ...records[0]!, input_tokens: 9 }]);
      await store.insertUsage([
        { ...records[1]!, input_tokens: 9 },
        { ...records[2]!, input_tokens: 9 },
      ]);
      const db = new Database(file, { readonly: true });
      try {
        const rows = db.prepare('select * from usage_records order by id').all();
        assert.deepEqual(
          rows,
          records.map((r) => ({ ...r, stream: r.stream ? 1 : 0, price_missing: r.price_missing ? 1 : 0, estimated: r.estimated ? 1 : 0 })),
        );
      } finally {
        db.close();
      }
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('store: SQLite prepared statements kept by their text', () => {
  it('hands the same statement out again, never one still being iterated, keeps only the most recently used, and not those with many values', () => {
    const raw = new Database(':memory:');
    const db = withStatementCache(raw);
    try {
      raw.exec('create table t (n integer); insert into t values (1), (2), (3)');
      const sql = 'select n from t order by n';
      const first = db.prepare(sql);
      assert.equal(db.prepare(sql), first, 'the same text gets the same statement');
      const rows = first.iterate([]);
      assert.deepEqual(rows.next().value, { n: 1 });
      const second = db.prepare(sql);
      assert.notEqual(second, first, 'a statement being iterated is not handed out');
      assert.deepEqual(second.all([]), [{ n: 1 }, { n: 2 }, { n: 3 }]);
      rows.return?.();
      assert.equal(db.prepare(sql), first, 'once iterated to its end it is handed out again');
      for (let i = 0; i < 300; i++) db.prepare(`select ${i} as n`);
      assert.notEqual(db.prepare(sql), first, 'the least recently used went past the limit');
      const many = `select 1 as n where 1 in (${Array.from({ length: 40 }, () => '?').join(', ')})`;
      assert.notEqual(db.prepare(many), db.prepare(many), 'SQL with many bound values is not kept');
    } finally {
      raw.close();
    }
  });
});

/**
 * Another process (a cluster's other worker) holds the SQLite file's write lock; here a second
 * connection in this process holds it (BEGIN IMMEDIATE). The store must not wait for it in SQLite's
 * busy handler, which sleeps on the event loop (and here never lets the holder go): its writes wait
 * on later turns, its reads go on, and the writes land once the lock is free.
 */
describe('store: SQLite with another writer holding the lock', () => {
  it(
    'waits for the lock off the event loop: reads on other connections go on, writes and transactions land after it is freed',
    { timeout: 4000 },
    async () => {
      const dir = tempDir();
      const file = join(dir, 'busy.db');
      const store = new KyselyStore({ sqlitePath: file });
      const other = new Database(file);
      try {
        await store.migrate();
        await store.createOrg({ id: 'org_before', name: 'before', created_at: 1 });
        other.exec('BEGIN IMMEDIATE');
        let landed = 0;
        const writes = [
          store.createOrg({ id: 'org_busy', name: 'busy', created_at: 2 }).then(() => landed++),
          // A transaction of two inserts (BEGIN IMMEDIATE on the store's side too).
          store
            .createResponse({
              id: 'resp_busy',
              org_id: 'org_busy',
              status: 'completed',
              background: false,
              conversation_id: null,
              previous_response_id: null,
              created_at: 2,
              created_ms: 2000,
              updated_at: 2000,
              body: '{}',
              input_items: '[]',
            })
            .then(() => landed++),
        ];
        // The ledger's insert fails at once as busy; the ledger tries it again itself.
        const usage = await store.insertUsage([usageRecord('usage_busy')]).then(
          () => 'written',
          (err: unknown) => (store.isBusyError(err) ? 'busy' : String(err)),
        );
        assert.equal(usage, 'busy');
        // Many turns of the event loop go by while the writes wait.
        for (let i = 0; i < 200; i++) await new Promise((resolve) => setImmediate(resolve));
        assert.equal(landed, 0, 'nothing is written while another connection holds the lock');
        // Reads are not held up by a writer (WAL): the store's mutex is held by the waiting write,
        // so this read comes from a second store on the same file.
        const reader = new KyselyStore({ sqlitePath: file });
        try {
          assert.equal((await reader.getOrg('org_before'))?.name, 'before');
        } finally {
          await reader.close();
        }
        other.exec('COMMIT');
        await Promise.all(writes);
        assert.equal(landed, 2);
        assert.equal((await store.getOrg('org_busy'))?.name, 'busy');
        assert.equal((await store.getResponse('resp_busy'))?.org_id, 'org_busy');
        assert.equal(await store.getResponseInput('resp_busy'), '[]');
      } finally {
        other.close();
        await store.close();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});

describe('store: SQLite WAL checkpoints', () => {
  it('are made off the event loop, and still happen: the database file takes the records while the store is open, and a grown WAL is cut back', async () => {
    const dir = tempDir();
    const file = join(dir, 'wal.db');
    const store = new KyselyStore({ sqlitePath: file });
    try {
      await store.migrate();
      const before = statSync(file).size;
      // One record per transaction, as the ledger commits at one connection: ~18 KB of WAL each.
      const record = (i: number): UsageRecord => ({
        id: `usage_wal_${i}`,
        at: 1_700_000_000_000 + i,
        day: '2023-11-14',
        request_id: `req_${i}`,
        key_id: 'key_wal',
        org_id: 'org_wal',
        model: 'm/a',
        deployment: null,
        endpoint: 'chat.completions',
        stream: false,
        input_tokens: 10,
        cached_tokens: 0,
        output_tokens: 5,
        reasoning_tokens: 0,
        cost: null,
        price_missing: true,
        estimated: false,
        latency_ms: 1,
        ttft_ms: null,
        status: 200,
        error_code: null,
      });
      for (let i = 0; i < 3000; i++) await store.insertUsage([record(i)]);
      // Commits do not checkpoint (the store turns that off); the worker's checkpoints still bring the
      // records into the database file, and the WAL that grew meanwhile is cut back to its limit
      // when the next commit starts it over.
      await eventually(() => assert.ok(statSync(file).size > before + 256 * 1024, `database file ${statSync(file).size} bytes`));
      let next = 3000;
      await eventually(async () => {
        await store.insertUsage([record(next++)]);
        assert.ok(statSync(`${file}-wal`).size <= 40 * 1024 * 1024, `WAL ${statSync(`${file}-wal`).size} bytes`);
      });
      assert.equal((await store.usageTotals('key', { key: 'key_wal' })).find((t) => t.group === 'key_wal')?.requests, next);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('store: the configured admin key rotated when it is the only admin key', () => {
  it('revokes the previous configured key once the new one exists', async () => {
    const dir = tempDir();
    const store = new KyselyStore({ sqlitePath: join(dir, 'test.db') });
    try {
      await store.migrate();
      await ensureAdminKey(store, 'operator-chosen-admin-key-0001');
      assert.equal(await store.countActiveAdminKeys(), 1);
      await ensureAdminKey(store, 'operator-chosen-admin-key-0002');
      assert.notEqual((await store.getKey(parseKey('operator-chosen-admin-key-0001')!.id))!.revoked_at, null);
      assert.equal((await store.getKey(parseKey('operator-chosen-admin-key-0002')!.id))!.revoked_at, null);
      assert.equal(await store.countActiveAdminKeys(), 1);
      // Back to the revoked value: refused, and the key in use stays.
      await assert.rejects(ensureAdminKey(store, 'operator-chosen-admin-key-0001'), /revoked/);
      assert.equal((await store.getKey(parseKey('operator-chosen-admin-key-0002')!.id))!.revoked_at, null);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

storeSuite('sqlite', async () => {
  const dir = tempDir();
  return {
    store: new KyselyStore({ sqlitePath: join(dir, 'test.db') }),
    cleanup: async () => rmSync(dir, { recursive: true, force: true }),
  };
});

storeSuite('postgres', async () => {
  const schema = await pgSchema();
  return { store: new KyselyStore({ databaseUrl: schema.url, sqlitePath: '' }), cleanup: () => schema.drop() };
});
