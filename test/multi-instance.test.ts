/**
 * Issue 18: several instances as one service. Two instances (A and B), each a node:cluster primary
 * with two workers, share one PostgreSQL schema and Redis and sit behind HAProxy on the documented
 * config (deploy/haproxy.cfg), started with the documented command (docs/deployment.md). Four
 * processes serve; the checks are that a client cannot tell which one it reached: a background
 * response is followed and cancelled from any of them (and generation really stops), a revoked key
 * and a new deployment take effect everywhere at once (through the cluster bus, well inside the key
 * cache's 1 s and the catalogue's 5 s refresh, which stay at their defaults), a limit holds across
 * all of them, and killing an instance under load loses no acknowledged request's usage record.
 *
 * The upstream is a fixture that streams one small text delta every 50 ms and records when Switchyard
 * closed each of its connections: how the test sees that generation stopped.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from 'undici';
import OpenAI from 'openai';
import pg from 'pg';
import { chunkFrame, completionBody, fixture } from './helpers/fixtures.js';
import { pgSchema, SHARED_MODELS, tempDir, type WireKey } from './helpers/server.js';
import { freePort } from '../bench/lib.js';
import { haproxyInstalled, startHaproxy, startInstance, type Haproxy, type Instance } from './helpers/haproxy.js';
import { eventually } from './helpers/wait.js';

const ADMIN = 'sk-test-multi-instance-admin-0123456789';
const REDIS_URL = process.env['SWITCHYARD_TEST_REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const SLOW = 'fixture/slow';
/** The fixture's pace: one text delta every 50 ms. */
const TICK_MS = 50;
/** Target for the upstream connection to close after a cancel returns (100 ms), plus slack for this 2-core VM. */
const CANCEL_CLOSE_MS = 100;
const CANCEL_CLOSE_SLACK_MS = 50;

const piece = (i: number): string => `w${i} `;
const fullText = (n: number): string => Array.from({ length: n }, (_, i) => piece(i)).join('');

// ---- the fixture upstream

interface UpstreamCall {
  tag: string | undefined;
  stream: boolean;
  openedAt: number;
  /** performance.now() when the connection closed (Switchyard went away, or the fixture finished). */
  closedAt: number | undefined;
  sent: number;
  finished: boolean;
}

/**
 * An OpenAI-compatible chat upstream. The prompt steers it: `chunks=N` streams N deltas, one every
 * 50 ms (N = 1200 is a minute), then a usage chunk; `delay=MS` answers after MS; `tag=T` names the
 * call for the test. Without `chunks=` it answers "ok" at once.
 */
function slowUpstream(calls: UpstreamCall[]) {
  return (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'slow', object: 'model' }] }));
      return;
    }
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as { stream?: boolean };
      const chunks = Number(/chunks=(\d+)/.exec(raw)?.[1] ?? 0);
      const delay = Number(/delay=(\d+)/.exec(raw)?.[1] ?? 0);
      const call: UpstreamCall = {
        tag: /tag=([\w-]+)/.exec(raw)?.[1],
        stream: body.stream === true,
        openedAt: performance.now(),
        closedAt: undefined,
        sent: 0,
        finished: false,
      };
      calls.push(call);
      let timer: NodeJS.Timeout | undefined;
      res.on('close', () => {
        call.closedAt ??= performance.now();
        if (timer) clearInterval(timer);
      });
      const usage = (n: number) => ({ prompt_tokens: 5, completion_tokens: Math.max(1, n), total_tokens: 5 + Math.max(1, n) });
      if (!call.stream) {
        setTimeout(() => {
          if (res.destroyed) return;
          call.finished = true;
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(
            chunks > 0 ? JSON.stringify({ ...JSON.parse(completionBody(fullText(chunks))), usage: usage(chunks) }) : completionBody('ok'),
          );
        }, delay);
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(chunkFrame({ role: 'assistant', content: '' }));
      const finish = (n: number) => {
        call.finished = true;
        res.write(chunkFrame({}, 'stop'));
        res.write(
          `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: usage(n) })}\n\n`,
        );
        res.end('data: [DONE]\n\n');
      };
      if (chunks === 0) {
        res.write(chunkFrame({ content: 'ok' }));
        finish(1);
        return;
      }
      timer = setInterval(() => {
        res.write(chunkFrame({ content: piece(call.sent++) }));
        if (call.sent < chunks) return;
        clearInterval(timer);
        finish(chunks);
      }, TICK_MS);
    });
  };
}

// ---- plain HTTP, one new connection per request

interface Reply {
  status: number;
  text: string;
  json: unknown;
}

/** One request on a connection of its own (so HAProxy and each node:cluster primary hand it on afresh). */
async function fresh(
  origin: string,
  method: string,
  path: string,
  opts: { key?: string; body?: object; headers?: Record<string, string>; timeoutMs?: number } = {},
): Promise<Reply> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const client = new Client(origin, { headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
  try {
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.key !== undefined) headers['authorization'] = `Bearer ${opts.key}`;
    if (opts.body !== undefined) headers['content-type'] = 'application/json';
    const res = await client.request({
      path,
      method: method as 'GET',
      headers,
      signal: AbortSignal.timeout(timeoutMs),
      ...(opts.body !== undefined && { body: JSON.stringify(opts.body) }),
    });
    const text = await res.body.text();
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: res.statusCode, text, json };
  } finally {
    await client.destroy();
  }
}

// ---- Responses wire shapes and a streaming follower

interface WireResponse {
  id: string;
  status: string;
  output?: Array<{ type: string; content?: Array<{ type: string; text?: string }> }>;
  usage?: { output_tokens: number } | null;
}
interface Ev {
  type: string;
  sequence_number: number;
  delta?: string;
  response?: WireResponse;
}

const outputText = (r: WireResponse | undefined): string =>
  (r?.output ?? [])
    .flatMap((item) => (item.type === 'message' ? (item.content ?? []) : []))
    .map((c) => (c.type === 'output_text' ? (c.text ?? '') : ''))
    .join('');

const deltas = (events: readonly Ev[]): string =>
  events
    .filter((e) => e.type === 'response.output_text.delta')
    .map((e) => e.delta ?? '')
    .join('');

interface Follower {
  /** The events so far, as they arrive. */
  events: Ev[];
  /** Settles when the stream ends, fails or times out; never rejects. */
  ended: Promise<{ events: Ev[]; status: number | undefined; error: string | undefined; firstAt: number | undefined }>;
  done(): boolean;
}

/** `GET /v1/responses/{id}?stream=true` on a new connection, read event by event. */
function follow(origin: string, id: string, key: string, timeoutMs: number): Follower {
  const events: Ev[] = [];
  let finished = false;
  const client = new Client(origin, { headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
  const ended = (async () => {
    let status: number | undefined;
    let error: string | undefined;
    let firstAt: number | undefined;
    try {
      const res = await client.request({
        path: `/v1/responses/${id}?stream=true`,
        method: 'GET',
        headers: { authorization: `Bearer ${key}` },
        signal: AbortSignal.timeout(timeoutMs),
      });
      status = res.statusCode;
      const decoder = new TextDecoder();
      let buf = '';
      let sawDone = false;
      for await (const chunk of res.body) {
        buf += decoder.decode(chunk as Buffer, { stream: true });
        let cut: number;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block
            .split('\n')
            .filter((l) => l.startsWith('data: '))
            .map((l) => l.slice(6))
            .join('\n');
          if (data === '') continue;
          // Open Responses ends the stream with [DONE], after the terminal event.
          if (data === '[DONE]') {
            sawDone = true;
            continue;
          }
          if (sawDone) throw new Error('an event after [DONE]');
          firstAt ??= performance.now();
          events.push(JSON.parse(data) as Ev);
        }
      }
      if (status !== 200) error = `status ${status}`;
      else if (!sawDone) error = 'no [DONE] at the end';
    } catch (err) {
      error = `${(err as Error).name === 'TimeoutError' || (err as Error).name === 'AbortError' ? `no end within ${timeoutMs} ms` : (err as Error).message}`;
    } finally {
      finished = true;
      await client.destroy();
    }
    if (error !== undefined) error += ` (${events.length} events, last ${events.at(-1)?.type ?? 'none'})`;
    return { events, status, error, firstAt };
  })();
  return { events, ended, done: () => finished };
}

/** Fails with every problem found, on one line (a multi-part check reports all its parts at once). */
function noProblems(problems: readonly string[], context = ''): void {
  if (problems.length > 0) assert.fail(`${context}${problems.join('; ')}`);
}

/** "haproxy 200 ×14, A 200 ×3": how many of each outcome, in order of first appearance. */
function tally(items: readonly string[]): string {
  const counts = new Map<string, number>();
  for (const x of items) counts.set(x, (counts.get(x) ?? 0) + 1);
  return [...counts].map(([x, n]) => `${x} ×${n}`).join(', ');
}

/** The error code of an error envelope, or the start of the body. */
const codeOf = (r: Reply): string => (r.json as { error?: { code?: string } } | undefined)?.error?.code ?? r.text.slice(0, 60);

/** Waits for a condition that something else makes true; throws `what` after `timeoutMs`. */
async function waitFor(cond: () => boolean, timeoutMs: number, what: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(what());
    await sleep(5);
  }
}

interface UsageRow {
  group: string;
  requests: number;
  errors: number;
  output_tokens: number;
}

describe('several instances behind HAProxy (issue 18)', { timeout: 150_000 }, () => {
  const calls: UpstreamCall[] = [];
  const dirs: string[] = [];
  const cleanup: Array<() => Promise<void>> = [];
  let A: Instance;
  let B: Instance;
  let proxy: Haproxy;
  let schemaUrl: string;
  let upstreamUrl: string;

  const describeCall = (tag: string) => JSON.stringify(calls.filter((c) => c.tag === tag));

  async function newKey(name: string, limits?: object): Promise<{ key: string; id: string }> {
    const r = await fresh(A.url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'multi', name, ...(limits && { limits }) } });
    const k = r.json as WireKey;
    assert.equal(r.status, 201, r.text);
    return { key: k.key!, id: k.id };
  }

  async function usageOf(origin: string, keyId: string): Promise<UsageRow | undefined> {
    const r = await fresh(origin, 'GET', `/admin/usage?group_by=key&key=${keyId}`, { key: ADMIN });
    assert.equal(r.status, 200, r.text);
    return (r.json as { data: UsageRow[] }).data[0];
  }

  before(async () => {
    assert.ok(haproxyInstalled(), 'haproxy is not on PATH (apt-get install haproxy; .ci/run installs it)');
    try {
      const upstream = await fixture(slowUpstream(calls));
      cleanup.push(() => upstream.close());
      upstreamUrl = upstream.url;
      const schema = await pgSchema();
      schemaUrl = schema.url;
      cleanup.push(() => schema.drop());
      const dir = tempDir('switchyard-multi-');
      dirs.push(dir);
      const configPath = join(dir, 'switchyard.json');
      writeFileSync(
        configPath,
        JSON.stringify({
          authors: ['fixture', 'meta-llama', 'openai'],
          defaultCatalogue: false,
          models: [
            {
              id: SLOW,
              name: 'Slow fixture',
              context_length: 100_000,
              capabilities: ['streaming'],
              pricing: [
                { metric: 'input_tokens', rate: 1 },
                { metric: 'output_tokens', rate: 2 },
              ],
            },
          ],
          deployments: [{ model: SLOW, baseUrl: upstream.url, upstreamModel: 'slow', apiKeyEnv: 'UPSTREAM_KEY_FIXTURE', api: 'chat' }],
        }),
      );
      // The environment of docs/deployment.md ("Running N instances"), with test values.
      const env = (name: string): Record<string, string> => ({
        HOST: '127.0.0.1',
        DATABASE_URL: schema.url,
        REDIS_URL,
        SWITCHYARD_WORKERS: '2',
        SWITCHYARD_ADMIN_KEY: ADMIN,
        SWITCHYARD_MODELS_DIR: SHARED_MODELS,
        SWITCHYARD_CONFIG: configPath,
        SWITCHYARD_DATA_DIR: join(dir, name),
        SWITCHYARD_LEDGER_FLUSH_MS: '20',
        // Deployments added through the admin API may point at the loopback fixture.
        SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1',
        UPSTREAM_KEY_FIXTURE: 'sk-fixture-upstream-key',
        SWITCHYARD_LOG_LEVEL: 'info',
      });
      // A first (it migrates the schema), then B, as a rolling start would.
      A = await startInstance('A', await freePort(), env('a'));
      cleanup.push(() => A.destroy());
      // B spells the database's URL otherwise (as a host name against an address, or an added
      // parameter, would): it is the same database, so the same bus.
      B = await startInstance('B', await freePort(), { ...env('b'), DATABASE_URL: `${schema.url}&application_name=switchyard-b` });
      cleanup.push(() => B.destroy());
      proxy = await startHaproxy([`127.0.0.1:${A.port}`, `127.0.0.1:${B.port}`], join(dir, 'haproxy.cfg'));
      cleanup.push(() => proxy.destroy());
    } catch (err) {
      await closeAll();
      throw err;
    }
  });

  async function closeAll(): Promise<void> {
    // Processes first (so nothing holds the schema), then the fixture and the schema.
    for (const c of cleanup.splice(0).reverse()) await c().catch((err: unknown) => console.error('cleanup:', err));
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  }
  after(closeAll);

  it('follows a background response from every process: every follower gets every event and the end', async () => {
    const { key } = await newKey('follow');
    const onA = new OpenAI({ apiKey: key, baseURL: `${A.url}/v1`, maxRetries: 0 });
    const tag = `follow-${randomBytes(4).toString('hex')}`;
    const created = await onA.responses.create({ model: SLOW, input: `tag=${tag} chunks=20`, background: true, store: true });
    assert.ok(created.status === 'queued' || created.status === 'in_progress', created.status);

    const where = ['haproxy#1', 'haproxy#2', 'haproxy#3', 'haproxy#4', 'B'];
    const followers = where.map((w) => follow(w === 'B' ? B.url : proxy.url, created.id, key, 15_000));
    const results = await Promise.all(followers.map((f) => f.ended));

    const expected = fullText(20);
    const call = calls.find((c) => c.tag === tag);
    const problems: string[] = [];
    results.forEach((r, i) => {
      const issues: string[] = [];
      if (r.error !== undefined) issues.push(r.error);
      const last = r.events.at(-1);
      if (last?.type !== 'response.completed') issues.push(`last event ${last?.type ?? 'none'}`);
      const seq = r.events.map((e) => e.sequence_number);
      const bad = seq.findIndex((s, j) => j > 0 && !(s > seq[j - 1]!));
      if (bad >= 0) issues.push(`sequence_number not increasing at event ${bad}: ${seq.join(',')}`);
      if (deltas(r.events) !== expected) issues.push(`deltas ${JSON.stringify(deltas(r.events))}`);
      if (last?.type === 'response.completed' && outputText(last.response) !== expected)
        issues.push(`final output text ${JSON.stringify(outputText(last.response))}`);
      // Following a live run is what is tested here, not replaying a finished one.
      if (r.firstAt !== undefined && call?.closedAt !== undefined && r.firstAt > call.closedAt)
        issues.push('first event only after the generation had ended (test too slow to follow it live)');
      if (issues.length > 0) problems.push(`${where[i]!}: ${issues.join(', ')}`);
    });
    noProblems(problems, `expected ${JSON.stringify(expected)}: `);
    assert.equal(calls.filter((c) => c.tag === tag).length, 1, `generated once: ${describeCall(tag)}`);
  });

  it('cancels through another instance: generation stops at once, everyone reads cancelled, the partial output is billed', async (t) => {
    const { key, id: keyId } = await newKey('cancel');
    const onA = new OpenAI({ apiKey: key, baseURL: `${A.url}/v1`, maxRetries: 0 });
    const onB = new OpenAI({ apiKey: key, baseURL: `${B.url}/v1`, maxRetries: 0 });
    const tag = `cancel-${randomBytes(4).toString('hex')}`;
    // A minute of output: only a cancel ends it within this test.
    const created = await onA.responses.create({ model: SLOW, input: `tag=${tag} chunks=1200`, background: true, store: true });
    const follower = follow(B.url, created.id, key, 20_000);
    const problems: string[] = [];
    await waitFor(
      () => (calls.find((c) => c.tag === tag)?.sent ?? 0) >= 3,
      5000,
      () => `the upstream was not streaming 5 s after the response was created: ${describeCall(tag)}`,
    );
    const call = calls.find((c) => c.tag === tag)!;
    // The follower on B sees text as it is generated on A. (If it does not, the rest is still checked.)
    await waitFor(
      () => follower.done() || deltas(follower.events) !== '',
      5000,
      () => `the follower on B saw no text in 5 s while A generated it: ${follower.events.map((e) => e.type).join(',')}`,
    ).catch((err: Error) => problems.push(err.message));
    if (follower.done()) problems.push(`the follower on B ended before the cancel: ${(await follower.ended).error ?? ''}`);

    const cancelled = await onB.responses.cancel(created.id);
    const returnedAt = performance.now();
    if (cancelled.status !== 'cancelled') problems.push(`cancel answered ${cancelled.status}`);

    // The upstream connection (owned by A) closes within 100 ms of the cancel's answer.
    await waitFor(
      () => call.closedAt !== undefined,
      3000,
      () => `the upstream was still streaming 3 s after the cancel returned (${call.sent} deltas sent)`,
    ).catch((err: Error) => problems.push(err.message));
    if (call.closedAt !== undefined) {
      const ms = call.closedAt - returnedAt;
      t.diagnostic(`upstream closed ${ms.toFixed(1)} ms after the cancel returned, after ${call.sent} deltas`);
      if (ms > CANCEL_CLOSE_MS + CANCEL_CLOSE_SLACK_MS)
        problems.push(
          `the upstream closed ${ms.toFixed(0)} ms after the cancel returned (limit ${CANCEL_CLOSE_MS} + ${CANCEL_CLOSE_SLACK_MS} ms)`,
        );
    }
    if (call.finished) problems.push('the fixture finished its minute of output: nothing stopped it');

    const end = await Promise.race([follower.ended, sleep(5000).then(() => undefined)]);
    if (end === undefined) problems.push(`the follower on B had not ended 5 s after the cancel (last ${follower.events.at(-1)?.type})`);
    else {
      // docs/decisions.md ("Cancelled in a stream"): the stream has no event of its own for a
      // cancellation; it ends with response.incomplete carrying status cancelled.
      const last = end.events.at(-1);
      if (!(last?.type === 'response.incomplete' || last?.type === 'response.cancelled') || last.response?.status !== 'cancelled')
        problems.push(
          `the follower on B ended with ${last?.type ?? 'nothing'} (status ${last?.response?.status})${end.error ? ` (${end.error})` : ''}`,
        );
    }

    // Read-your-writes: every process answers cancelled from now on.
    const reads = await Promise.all(
      Array.from({ length: 20 }, () => fresh(proxy.url, 'GET', `/v1/responses/${created.id}`, { key }).catch((e: Error) => e)),
    );
    const seen = reads.map((r) =>
      r instanceof Error ? r.message : r.status === 200 ? (r.json as WireResponse).status : `HTTP ${r.status}`,
    );
    if (seen.some((s) => s !== 'cancelled')) problems.push(`GETs through HAProxy after the cancel: ${seen.join(',')}`);

    // The response keeps what was generated, and it is billed.
    let stored: WireResponse | undefined;
    await eventually(async () => {
      const r = await fresh(A.url, 'GET', `/v1/responses/${created.id}`, { key });
      stored = r.json as WireResponse;
      assert.ok(stored.status === 'cancelled' && outputText(stored) !== '' && (stored.usage?.output_tokens ?? 0) > 0);
    }, 2000).catch(() =>
      problems.push(
        `stored response: status ${stored?.status}, output_text ${JSON.stringify(outputText(stored))}, usage ${JSON.stringify(stored?.usage)}`,
      ),
    );
    let billed: UsageRow | undefined;
    await eventually(async () => {
      billed = await usageOf(B.url, keyId);
      assert.ok(billed !== undefined && billed.requests >= 1 && billed.output_tokens > 0);
    }, 5000).catch(() => problems.push(`ledger for the key: ${JSON.stringify(billed)}`));
    if (call.closedAt === undefined) await onA.responses.cancel(created.id).catch(() => undefined);
    noProblems(problems);
  });

  it('a key revoked through B is refused by every process 100 ms later', async () => {
    const { key, id } = await newKey('revoke');
    // Every process has the key cached as valid (each of these on a new connection).
    const warm = await Promise.all([
      ...Array.from({ length: 8 }, () => fresh(proxy.url, 'GET', '/v1/models', { key })),
      ...Array.from({ length: 4 }, () => fresh(A.url, 'GET', '/v1/models', { key })),
      ...Array.from({ length: 4 }, () => fresh(B.url, 'GET', '/v1/models', { key })),
    ]);
    assert.deepEqual(
      warm.map((r) => r.status),
      Array(16).fill(200),
    );

    const revoked = await fresh(B.url, 'DELETE', `/admin/keys/${id}`, { key: ADMIN });
    assert.equal(revoked.status, 200, revoked.text);
    assert.notEqual((revoked.json as WireKey).revoked_at, null);
    await sleep(100);
    const targets = [
      ...Array.from({ length: 20 }, () => ['haproxy', proxy.url] as const),
      ...Array.from({ length: 10 }, () => ['A', A.url] as const),
      ...Array.from({ length: 10 }, () => ['B', B.url] as const),
    ];
    const replies = await Promise.all(targets.map(([, url]) => fresh(url, 'GET', '/v1/models', { key })));
    const wrong = replies.flatMap((r, i) => (r.status === 401 ? [] : [`${targets[i]![0]} ${r.status}`]));
    if (wrong.length > 0) assert.fail(`${wrong.length} of 40 requests not refused 100 ms after the revocation: ${tally(wrong)}`);
  });

  it('a key limit of 10 requests a minute holds across all four processes', async () => {
    // rpm counts fixed one-minute windows: keep the 30 requests inside one.
    const intoMinute = Date.now() % 60_000;
    if (intoMinute > 55_000) await sleep(60_000 - intoMinute + 50);
    const { key } = await newKey('limited', { rpm: 10 });
    const statuses: number[] = [];
    for (let i = 0; i < 30; i++) {
      const r = await fresh(proxy.url, 'POST', '/v1/chat/completions', {
        key,
        body: { model: SLOW, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
      });
      statuses.push(r.status);
    }
    const count = (s: number) => statuses.filter((x) => x === s).length;
    assert.equal(count(200), 10, `statuses ${statuses.join(',')}`);
    assert.equal(count(429), 20, `statuses ${statuses.join(',')}`);
  });

  it('a model and deployment added through A are usable on every process 100 ms later', async () => {
    const model = `fixture/fresh-${randomBytes(4).toString('hex')}`;
    const { key } = await newKey('catalogue');
    const admin = new Client(A.url);
    const m = await admin.request({
      path: '/admin/models',
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ id: model, name: 'Fresh', context_length: 4096, capabilities: ['streaming'] }),
    });
    const mText = await m.body.text();
    assert.equal(m.statusCode, 201, mText);
    // On the connection the model was added on (one worker of A), so that the deployment is refused by
    // nothing but the check below.
    const d = await admin.request({
      path: '/admin/deployments',
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model, base_url: upstreamUrl, upstream_model: 'fresh', api_key_env: 'UPSTREAM_KEY_FIXTURE' }),
    });
    const dText = await d.body.text();
    await admin.close();
    assert.equal(d.statusCode, 201, dText);
    await sleep(100);
    const body = { model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    const targets = [
      ...Array.from({ length: 8 }, () => ['haproxy', proxy.url] as const),
      ...Array.from({ length: 4 }, () => ['A', A.url] as const),
      ...Array.from({ length: 4 }, () => ['B', B.url] as const),
    ];
    const replies = await Promise.all(targets.map(([, url]) => fresh(url, 'POST', '/v1/chat/completions', { key, body })));
    const wrong = replies.flatMap((r, i) => (r.status === 200 ? [] : [`${targets[i]![0]} ${r.status} ${codeOf(r)}`]));
    if (wrong.length > 0) assert.fail(`${wrong.length} of 16 requests not served 100 ms after the deployment was added: ${tally(wrong)}`);
  });

  it('an instance killed under load: the other keeps serving and every answered request is billed once', async (t) => {
    const run = randomBytes(4).toString('hex');
    const keys = await Promise.all(Array.from({ length: 8 }, (_, i) => newKey(`load-${i}`)));
    interface Outcome {
      client: number;
      rid: string;
      start: number;
      end: number;
      status: number | string;
    }
    const outcomes: Outcome[] = [];
    let stop = false;
    const clients = keys.map(() => new Client(proxy.url, { headersTimeout: 10_000, bodyTimeout: 10_000 }));
    const loops = keys.map(async ({ key }, i) => {
      for (let n = 0; !stop; n++) {
        const rid = `mi6-${run}-${i}-${n}`;
        const start = performance.now();
        try {
          const res = await clients[i]!.request({
            path: '/v1/chat/completions',
            method: 'POST',
            headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-request-id': rid },
            body: JSON.stringify({ model: SLOW, messages: [{ role: 'user', content: 'delay=20' }], max_tokens: 4 }),
            signal: AbortSignal.timeout(10_000),
          });
          await res.body.text();
          outcomes.push({ client: i, rid, start, end: performance.now(), status: res.statusCode });
        } catch (err) {
          outcomes.push({ client: i, rid, start, end: performance.now(), status: (err as Error).message });
          await sleep(10);
        }
      }
    });

    let killedAt = 0;
    let downAt: number | undefined;
    try {
      await sleep(1000);
      killedAt = performance.now();
      A.kill('SIGKILL');
      // When HAProxy's checks take A out.
      const deadline = killedAt + 5000;
      while (performance.now() < deadline) {
        const status = await proxy.serverStatus().catch(() => ({}) as Record<string, string>);
        if (status['sy1']?.startsWith('DOWN')) {
          downAt = performance.now();
          break;
        }
        await sleep(50);
      }
      const left = killedAt + 2000 - performance.now();
      if (left > 0) await sleep(left);
    } finally {
      stop = true;
      await Promise.all(loops);
      await Promise.all(clients.map((c) => c.destroy()));
    }
    await A.exited;

    const problems: string[] = [];
    const before = outcomes.filter((o) => o.end < killedAt);
    const afterDown = downAt === undefined ? [] : outcomes.filter((o) => o.start > downAt!);
    if (before.length === 0 || before.some((o) => o.status !== 200))
      problems.push(`before the kill: ${before.length} requests, not 200: ${before.filter((o) => o.status !== 200).length}`);
    if (downAt === undefined) problems.push('HAProxy did not mark A DOWN within 5 s');
    else {
      const failed = afterDown.filter((o) => o.status !== 200);
      if (afterDown.length === 0 || failed.length > 0)
        problems.push(
          `after A was marked DOWN (${(downAt - killedAt).toFixed(0)} ms after the kill): ${afterDown.length} requests, failed: ${failed
            .slice(0, 5)
            .map((o) => o.status)
            .join(',')}`,
        );
    }

    // Usage: each key's answered requests all have a record (B flushes its ledger before answering
    // /admin/usage; A's records were written before A answered). In-flight requests that failed at
    // the kill may or may not have one.
    for (const [i, { id }] of keys.entries()) {
      const mine = outcomes.filter((o) => o.client === i);
      const ok = mine.filter((o) => o.status === 200).length;
      const failed = mine.length - ok;
      let row: UsageRow | undefined;
      await eventually(async () => {
        row = await usageOf(B.url, id);
        assert.ok((row?.requests ?? 0) >= ok);
      }, 5000).catch(() => undefined);
      const billed = row?.requests ?? 0;
      if (billed < ok || billed > ok + failed) problems.push(`key ${i}: ${ok} answered, ${failed} failed, ${billed} billed`);
    }
    // And exactly one record per answered request, by request id.
    const db = new pg.Client({ connectionString: schemaUrl });
    await db.connect();
    try {
      const { rows } = await db.query<{ request_id: string; n: string }>(
        'select request_id, count(*) as n from usage_records where request_id like $1 group by request_id',
        [`mi6-${run}-%`],
      );
      const records = new Map(rows.map((r) => [r.request_id, Number(r.n)]));
      const missing = outcomes.filter((o) => o.status === 200 && records.get(o.rid) !== 1);
      const doubled = rows.filter((r) => Number(r.n) > 1);
      if (missing.length > 0)
        problems.push(
          `${missing.length} answered requests without exactly one record: ${missing.slice(0, 5).map((o) => `${o.rid}=${records.get(o.rid) ?? 0}`)}`,
        );
      if (doubled.length > 0) problems.push(`request ids recorded twice: ${doubled.slice(0, 5).map((r) => r.request_id)}`);
    } finally {
      await db.end();
    }
    const ok = outcomes.filter((o) => o.status === 200).length;
    t.diagnostic(
      `${outcomes.length} requests, ${ok} answered; A marked DOWN ${downAt === undefined ? 'never' : `${(downAt - killedAt).toFixed(0)} ms`} after the kill; ` +
        `failed: ${outcomes
          .filter((o) => o.status !== 200)
          .map((o) => `${o.status} (started ${(o.start - killedAt).toFixed(0)} ms after the kill)`)
          .join(', ')}`,
    );
    noProblems(problems, `${outcomes.length} requests, ${ok} answered: `);
  });
});

describe('a cancel that the running instance never hears (no shared bus)', { timeout: 90_000 }, () => {
  const calls: UpstreamCall[] = [];
  const cleanup: Array<() => Promise<void>> = [];
  let A: Instance;
  let B: Instance;
  let schemaUrl = '';

  before(async () => {
    const upstream = await fixture(slowUpstream(calls));
    cleanup.push(() => upstream.close());
    const schema = await pgSchema();
    schemaUrl = schema.url;
    cleanup.push(() => schema.drop());
    const dir = tempDir('switchyard-lost-cancel-');
    cleanup.push(async () => rmSync(dir, { recursive: true, force: true }));
    const configPath = join(dir, 'switchyard.json');
    writeFileSync(
      configPath,
      JSON.stringify({
        authors: ['fixture'],
        defaultCatalogue: false,
        models: [{ id: SLOW, name: 'Slow fixture', context_length: 100_000, capabilities: ['streaming'] }],
        deployments: [{ model: SLOW, baseUrl: upstream.url, upstreamModel: 'slow', api: 'chat' }],
      }),
    );
    const env = (name: string): Record<string, string> => ({
      HOST: '127.0.0.1',
      DATABASE_URL: schema.url,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_MODELS_DIR: tempDir(),
      SWITCHYARD_CONFIG: configPath,
      SWITCHYARD_DATA_DIR: join(dir, name),
      SWITCHYARD_LEDGER_FLUSH_MS: '20',
      // A heartbeat a second: the running instance reads the cancellation from the row then.
      SWITCHYARD_RESPONSE_STALE_MS: '3000',
    });
    // A talks over Redis, B over PostgreSQL: one database, two buses, so no message of B reaches A
    // (as when a bus message is lost).
    A = await startInstance('A', await freePort(), { ...env('a'), REDIS_URL });
    cleanup.push(() => A.destroy());
    B = await startInstance('B', await freePort(), env('b'));
    cleanup.push(() => B.destroy());
  });
  after(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch((err: unknown) => console.error('cleanup:', err));
  });

  it('stops the run at its next heartbeat, and the stored response keeps what was made and billed', async () => {
    const made = await fresh(A.url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'lost-cancel', name: 'k' } });
    const { key, id: keyId } = made.json as WireKey & { key: string };
    const tag = `lost-${randomBytes(4).toString('hex')}`;
    const onA = new OpenAI({ apiKey: key, baseURL: `${A.url}/v1`, maxRetries: 0 });
    const onB = new OpenAI({ apiKey: key, baseURL: `${B.url}/v1`, maxRetries: 0 });
    const created = await onA.responses.create({ model: SLOW, input: `tag=${tag} chunks=1200`, background: true });
    await eventually(() => assert.ok((calls.find((c) => c.tag === tag)?.sent ?? 0) >= 5), 5000);
    // Nobody answers B's cancel over its bus: it records the cancellation itself.
    assert.equal((await onB.responses.cancel(created.id)).status, 'cancelled');
    const call = calls.find((c) => c.tag === tag)!;
    await eventually(() => assert.ok(call.closedAt !== undefined, `${call.sent} deltas sent, still streaming`), 5000);
    assert.equal(call.finished, false);
    let stored: WireResponse | undefined;
    await eventually(async () => {
      stored = (await fresh(B.url, 'GET', `/v1/responses/${created.id}`, { key })).json as WireResponse;
      assert.equal(stored.status, 'cancelled');
      assert.notEqual(outputText(stored), '', 'the text made before the run stopped');
      assert.ok((stored.usage?.output_tokens ?? 0) > 0, JSON.stringify(stored.usage));
    }, 5000);
    await eventually(async () => {
      const r = await fresh(B.url, 'GET', `/admin/usage?group_by=key&key=${keyId}`, { key: ADMIN });
      const billed = (r.json as { data: UsageRow[] }).data[0];
      assert.equal(billed?.output_tokens, stored!.usage!.output_tokens, 'billed what the stored response says');
    }, 5000);
  });

  it('a cancel of a response whose instance died bills what its last heartbeat saw', async () => {
    const made = await fresh(B.url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'dead-cancel', name: 'k' } });
    const { key, id: keyId } = made.json as WireKey & { key: string };
    const tag = `dead-${randomBytes(4).toString('hex')}`;
    const onA = new OpenAI({ apiKey: key, baseURL: `${A.url}/v1`, maxRetries: 0 });
    const onB = new OpenAI({ apiKey: key, baseURL: `${B.url}/v1`, maxRetries: 0 });
    const created = await onA.responses.create({ model: SLOW, input: `tag=${tag} chunks=1200`, background: true });
    // A heartbeat has kept what the run used so far.
    await eventually(async () => {
      const db = new pg.Client({ connectionString: schemaUrl });
      await db.connect();
      try {
        const r = await db.query<{ pending_usage: string | null }>('select pending_usage from responses where id = $1', [created.id]);
        assert.ok(r.rows[0]?.pending_usage, 'no heartbeat yet');
      } finally {
        await db.end();
      }
    }, 5000);
    await A.destroy();
    // Nobody answers for it (B waits for an owner, then records the cancellation itself), billed.
    const cancelled = await onB.responses.cancel(created.id);
    assert.equal(cancelled.status, 'cancelled');
    assert.ok((cancelled.usage?.output_tokens ?? 0) > 0, JSON.stringify(cancelled.usage));
    const r = await fresh(B.url, 'GET', `/admin/usage?group_by=key&key=${keyId}`, { key: ADMIN });
    const billed = (r.json as { data: UsageRow[] }).data[0];
    assert.equal(billed?.output_tokens, cancelled.usage!.output_tokens, 'billed what the cancelled response says');
  });
});
