import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { rmSync, writeFileSync } from 'node:fs';
import { request } from 'undici';
import Database from 'better-sqlite3';
import { tempDir } from './helpers/server.js';
import { startProcess, type Running } from './helpers/process.js';
import { eventually } from './helpers/wait.js';
import { chunkFrame, closers, fixture } from './helpers/fixtures.js';

const MODEL = 'local/stories260k';
const ADMIN = 'sk-test-admin-crash-0123456789abcdef';

interface Acknowledged {
  /** x-request-id of every request whose client got a complete 2xx answer. */
  requests: Set<string>;
  /** Stored responses among them. */
  responses: Set<string>;
}

/** One request of a mixed load; records it only once the client has the whole answer. */
async function one(url: string, i: number, ack: Acknowledged): Promise<void> {
  const kind = i % 4;
  const path = kind < 2 ? '/v1/chat/completions' : '/v1/responses';
  const stream = kind % 2 === 1;
  const body =
    kind < 2
      ? { model: MODEL, messages: [{ role: 'user', content: `Once upon a time ${i}` }], max_tokens: 12, stream }
      : { model: MODEL, input: `Once upon a time ${i}`, max_output_tokens: 12, stream };
  const res = await request(`${url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) return;
  const id = String(res.headers['x-request-id']);
  if (kind === 0) {
    JSON.parse(text);
    ack.requests.add(id);
  } else if (kind === 1) {
    if (text.includes('data: [DONE]')) ack.requests.add(id);
  } else if (kind === 2) {
    ack.requests.add(id);
    ack.responses.add((JSON.parse(text) as { id: string }).id);
  } else {
    const done = /event: response\.completed\ndata: (.*)\n/.exec(text);
    if (done) {
      ack.requests.add(id);
      ack.responses.add((JSON.parse(done[1]!) as { response: { id: string } }).response.id);
    }
  }
}

describe('kill -9 under load', () => {
  const dataDir = tempDir();
  let proc: Running | undefined;
  after(() => {
    proc?.child.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
  });
  const env = { SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_ADMIN_KEY: ADMIN, SWITCHYARD_WORKERS: '1', SWITCHYARD_LOG_LEVEL: 'info' };

  it('keeps the usage record and stored response of every acknowledged request, five times over', async () => {
    const ack: Acknowledged = { requests: new Set(), responses: new Set() };
    const interrupted: string[] = [];
    for (let cycle = 0; cycle < 5; cycle++) {
      proc = await startProcess(env);
      const url = proc.url;
      let n = cycle * 10_000;
      let stop = false;
      const workers = Array.from({ length: 6 }, async () => {
        while (!stop) await one(url, n++, ack).catch(() => undefined);
      });
      // Load until this cycle has had some requests acknowledged (not for a fixed time).
      const before = ack.requests.size;
      await eventually(
        () => assert.ok(ack.requests.size >= before + 20, `cycle ${cycle}: ${ack.requests.size - before} acknowledged`),
        60_000,
      );
      // A long background response is certainly in progress when the process dies.
      const bg = await request(`${url}/v1/responses`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, input: 'Once upon a time', background: true, max_output_tokens: 400 }),
      });
      interrupted.push(((await bg.body.json()) as { id: string }).id);
      proc.child.kill('SIGKILL');
      await proc.exited;
      stop = true;
      await Promise.all(workers);
    }
    // A restart marks what was running as failed; then every acknowledged request must be on record.
    proc = await startProcess(env);
    const db = new Database(join(dataDir, 'switchyard.db'), { readonly: true });
    try {
      assert.equal(db.pragma('integrity_check', { simple: true }), 'ok');
      const recorded = new Map(
        (db.prepare('select request_id, status from usage_records').all() as Array<{ request_id: string; status: number }>).map((r) => [
          r.request_id,
          r.status,
        ]),
      );
      const missing = [...ack.requests].filter((id) => recorded.get(id) !== 200);
      assert.ok(ack.requests.size > 50, `load ran (${ack.requests.size} acknowledged)`);
      assert.deepEqual(missing, [], `${missing.length} of ${ack.requests.size} acknowledged requests have no 200 usage record`);
      const dupes = db.prepare('select request_id from usage_records group by request_id having count(*) > 1').all();
      assert.deepEqual(dupes, []);

      const responses = new Map(
        (db.prepare('select id, status, body from responses').all() as Array<{ id: string; status: string; body: string }>).map((r) => [
          r.id,
          r,
        ]),
      );
      const lost = [...ack.responses].filter(
        (id) => responses.get(id)?.status !== 'completed' && responses.get(id)?.status !== 'incomplete',
      );
      assert.deepEqual(lost, [], 'every acknowledged response is stored as finished');
      const running = [...responses.values()].filter((r) => r.status === 'queued' || r.status === 'in_progress');
      assert.deepEqual(running, [], 'nothing is left in progress');
      for (const id of interrupted) {
        const r = responses.get(id);
        assert.equal(r?.status, 'failed', id);
        const error = (JSON.parse(r.body) as { error: { code: string; message: string } }).error;
        assert.ok(error.code && error.message.length > 10, JSON.stringify(error));
      }
      console.log(
        `# crash: 5 × kill -9; ${ack.requests.size} acknowledged requests all recorded, ${ack.responses.size} stored responses all finished, ${interrupted.length} running ones failed on restart`,
      );
    } finally {
      db.close();
    }
  });
});

/**
 * A background response whose process dies mid-run is failed by the next process to look (here the
 * restart), and billed for what it had used at its last heartbeat (an operator pass found such
 * responses, 113 of them, with no usage record at all).
 */
describe('kill -9 during a background response', () => {
  const c = closers();
  after(() => c.closeAll());

  it('fails it at the restart and bills what its last heartbeat saw, or quarantines a record the database refuses', async () => {
    // An upstream that streams a word every 50 ms until its client goes.
    const upstream = c.keep(
      await fixture((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
        const timer = setInterval(() => res.write(chunkFrame({ content: ' upon' })), 50);
        res.on('close', () => clearInterval(timer));
      }),
    );
    const dir = tempDir();
    c.add(async () => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({
        models: [
          {
            id: 'qwen/slow-stream',
            context_length: 100_000,
            pricing: [
              { metric: 'input_tokens', rate: 1 },
              { metric: 'output_tokens', rate: 2 },
            ],
          },
        ],
        deployments: [{ model: 'qwen/slow-stream', baseUrl: upstream.url }],
      }),
    );
    const env = {
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_CONFIG: join(dir, 'config.json'),
      // A heartbeat every second.
      SWITCHYARD_RESPONSE_STALE_MS: '3000',
    };
    let proc = await startProcess(env);
    c.add(async () => {
      proc.child.kill('SIGKILL');
    });
    const created = await request(`${proc.url}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'qwen/slow-stream', input: 'Tell a long story.', background: true, max_output_tokens: 50_000 }),
    });
    const { id } = (await created.body.json()) as { id: string };
    const requestId = String(created.headers['x-request-id']);
    const db = () => new Database(join(dir, 'switchyard.db'), { readonly: true });
    // Its heartbeat has kept what it used, with some output.
    const kept = await eventually(() => {
      const d = db();
      try {
        const row = d.prepare('select pending_usage from responses where id = ?').get(id) as { pending_usage: string | null };
        assert.ok(row.pending_usage, 'no usage kept yet');
        const record = JSON.parse(row.pending_usage) as { output_tokens: number; request_id: string };
        assert.ok(record.output_tokens > 0);
        return record;
      } finally {
        d.close();
      }
    });
    assert.equal(kept.request_id, requestId);
    proc.child.kill('SIGKILL');
    await proc.exited;

    proc = await startProcess(env);
    const res = await request(`${proc.url}/v1/responses/${id}`, { headers: { authorization: `Bearer ${ADMIN}` } });
    const body = (await res.body.json()) as {
      status: string;
      error: { code: string } | null;
      usage: { output_tokens: number; estimated?: boolean } | null;
    };
    assert.equal(body.status, 'failed');
    assert.equal(body.error?.code, 'server_error');
    const d = db();
    try {
      const rows = d.prepare('select * from usage_records where request_id = ?').all(requestId) as Array<{
        output_tokens: number;
        input_tokens: number;
        cost: number;
        estimated: number;
        status: number;
        endpoint: string;
      }>;
      assert.equal(rows.length, 1, JSON.stringify(rows));
      const r = rows[0]!;
      assert.ok(r.output_tokens >= kept.output_tokens && r.input_tokens > 0, JSON.stringify(r));
      assert.ok(r.cost > 0);
      assert.deepEqual([r.estimated, r.status, r.endpoint], [1, 500, 'responses']);
      // The response reports the usage it is billed for, as every failed response does.
      assert.equal(body.usage?.output_tokens, r.output_tokens);
      assert.equal(body.usage?.estimated, true);
    } finally {
      d.close();
    }

    // A kept record the database refuses (here made negative after the kill) is quarantined, and the
    // response is failed all the same: it was retried on every sweep and never marked.
    const second = await request(`${proc.url}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'qwen/slow-stream', input: 'Another long story.', background: true, max_output_tokens: 50_000 }),
    });
    const secondId = ((await second.body.json()) as { id: string }).id;
    const secondRequest = String(second.headers['x-request-id']);
    await eventually(() => {
      const dd = db();
      try {
        const row = dd.prepare('select pending_usage from responses where id = ?').get(secondId) as { pending_usage: string | null };
        assert.ok(row.pending_usage, 'no usage kept yet');
      } finally {
        dd.close();
      }
    });
    proc.child.kill('SIGKILL');
    await proc.exited;
    const w = new Database(join(dir, 'switchyard.db'));
    try {
      w.prepare(`update responses set pending_usage = json_set(pending_usage, '$.output_tokens', -5) where id = ?`).run(secondId);
    } finally {
      w.close();
    }
    proc = await startProcess(env);
    const failed = (await (
      await request(`${proc.url}/v1/responses/${secondId}`, { headers: { authorization: `Bearer ${ADMIN}` } })
    ).body.json()) as { status: string; usage: unknown };
    assert.equal(failed.status, 'failed');
    assert.equal(failed.usage, null);
    const dq = db();
    try {
      assert.equal((dq.prepare('select count(*) as n from usage_records where request_id = ?').get(secondRequest) as { n: number }).n, 0);
      const q = dq.prepare('select record, error from usage_quarantine').all() as Array<{ record: string; error: string }>;
      const mine = q.filter((row) => row.record.includes(secondRequest));
      assert.equal(mine.length, 1, JSON.stringify(q));
      assert.match(mine[0]!.error, /output_tokens is -5/);
    } finally {
      dq.close();
    }
  });
});
