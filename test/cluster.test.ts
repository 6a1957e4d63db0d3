import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, statSync } from 'node:fs';
import { Client } from 'undici';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { http, SHARED_MODELS, tempDir, type WireKey } from './helpers/server.js';
import { MAIN, startProcess } from './helpers/process.js';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { once } from 'node:events';
import { PACKAGE_ROOT } from '../src/config.js';
import { eventually, withinOneMinute } from './helpers/wait.js';
import { chunkFrame, fixture } from './helpers/fixtures.js';
import { freePort, processTree } from '../bench/lib.js';

const ADMIN = 'sk-test-cluster-admin-0123456789';

interface UsageRow {
  group: string;
  requests: number;
  output_tokens: number;
}

describe('SWITCHYARD_WORKERS: several worker processes on one port', () => {
  const dataDir = tempDir();
  after(() => rmSync(dataDir, { recursive: true, force: true }));

  it('shares rate limits across workers and records every request once', async () => {
    const p = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '2',
      SWITCHYARD_LEDGER_FLUSH_MS: '20',
    });
    try {
      // The primary announces the service once both workers listen.
      assert.match(p.stdout(), /"workers":2,"msg":"switchyard listening"/);
      // Each worker's own line may reach stdout just after the primary's (two processes writing).
      await eventually(() => assert.equal(p.stdout().match(/"worker":\d,"address".*"msg":"switchyard listening"/g)?.length, 2, p.stdout()));
      // A local model is the same entry whichever worker answers: its file's time, not each worker's start.
      const createdTimes = new Set<number>();
      for (let i = 0; i < 6; i++) {
        const client = new Client(p.url);
        const res = await client.request({
          path: '/v1/models/local/stories260k',
          method: 'GET',
          headers: { authorization: `Bearer ${ADMIN}` },
        });
        createdTimes.add(((await res.body.json()) as { created: number }).created);
        await client.close();
      }
      assert.deepEqual([...createdTimes], [Math.floor(statSync(join(SHARED_MODELS, 'stories260K.gguf')).mtimeMs / 1000)]);
      // rpm counts in fixed one-minute windows: eight requests that straddle a minute's end could
      // rightly be allowed five, so such a run is repeated with a fresh key.
      // Every attempt's requests are counted in the metrics below, a repeated one's too.
      const sent: number[] = [];
      const { created, statuses } = await withinOneMinute(async () => {
        const created = await http<WireKey>(p.url, 'POST', '/admin/keys', {
          key: ADMIN,
          body: { org: 'acme', name: 'limited', limits: { rpm: 4 } },
        });
        assert.equal(created.status, 201, created.text);
        // Each request on a new connection: the primary hands connections to the workers in turn,
        // so without shared counters each worker would allow 4.
        const statuses: number[] = [];
        for (let i = 0; i < 8; i++) {
          const client = new Client(p.url);
          const res = await client.request({
            path: '/v1/chat/completions',
            method: 'POST',
            headers: { authorization: `Bearer ${created.json.key!}`, 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'local/stories260k', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 3 }),
          });
          await res.body.text();
          statuses.push(res.statusCode);
          sent.push(res.statusCode);
          await client.close();
        }
        return { created, statuses };
      });
      assert.deepEqual(statuses.filter((s) => s === 200).length, 4, `statuses ${statuses.join(',')}`);
      assert.deepEqual(statuses.filter((s) => s === 429).length, 4, `statuses ${statuses.join(',')}`);

      // Every worker writes its own usage records to the shared database.
      const usage = await eventually(async () => {
        const u = await http<{ data: UsageRow[] }>(p.url, 'GET', `/admin/usage?group_by=key&key=${created.json.id}`, { key: ADMIN });
        assert.equal(u.status, 200, u.text);
        assert.equal(u.json.data[0]?.requests, 4);
        return u;
      });
      assert.equal(usage.json.data[0]?.output_tokens, 12);

      // A scrape answers for both workers, whichever it reaches: the counters are the cluster's sums,
      // the same on every scrape (read from one worker, then the other, they went backwards).
      const series = (status: number) =>
        new RegExp(`^switchyard_requests_total\\{route="/v1/chat/completions",model="[^"]*",status="${status}"\\} (\\d+)$`, 'm');
      for (let i = 0; i < 4; i++) {
        const client = new Client(p.url);
        const res = await client.request({ path: '/metrics', method: 'GET' });
        const text = await res.body.text();
        await client.close();
        assert.equal(series(200).exec(text)?.[1], String(sent.filter((x) => x === 200).length), text.slice(0, 2000));
        assert.equal(series(429).exec(text)?.[1], String(sent.filter((x) => x === 429).length));
        assert.match(text, /^switchyard_ledger_writable 1$/m, 'a gauge of each worker, not their sum');
      }

      // At once, on both workers: their counter operations reach the primary in batches (one IPC
      // message per worker and event-loop turn), applied in order, so the limit is still exact.
      const burst = await withinOneMinute(async () => {
        const key = await http<WireKey>(p.url, 'POST', '/admin/keys', {
          key: ADMIN,
          body: { org: 'acme', name: 'burst', limits: { rpm: 5, tpm: 1_000_000 } },
        });
        assert.equal(key.status, 201, key.text);
        return Promise.all(
          Array.from({ length: 16 }, () =>
            fresh(p.url, '/v1/chat/completions', 'POST', key.json.key!, {
              model: 'local/stories260k',
              messages: [{ role: 'user', content: 'Once upon a time' }],
              max_tokens: 2,
            }),
          ),
        );
      });
      const at = burst.map((r) => r.status).sort();
      assert.equal(at.filter((s) => s === 200).length, 5, `statuses ${at.join(',')}`);
      assert.equal(at.filter((s) => s === 429).length, 11, `statuses ${at.join(',')}`);
    } finally {
      p.child.kill('SIGTERM');
    }
    assert.equal(await p.exited, 0, p.stdout());
    assert.match(p.stdout(), /"msg":"shut down cleanly"}\s*$/);
  });
});

/** One request on a connection of its own, so that the primary hands it to the next worker. */
async function fresh(url: string, path: string, method: 'GET' | 'POST' | 'DELETE', key: string, body?: unknown) {
  const client = new Client(url);
  try {
    const res = await client.request({
      path,
      method,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
    const text = await res.body.text();
    return { status: res.statusCode, json: (text ? JSON.parse(text) : undefined) as Record<string, unknown> };
  } finally {
    await client.close();
  }
}

/** Reads an SSE stream to its end (or until `ms`), returning the event types and data. */
async function follow(url: string, path: string, key: string, ms: number): Promise<Array<{ type: string; sequence_number: number }>> {
  const client = new Client(url);
  const events: Array<{ type: string; sequence_number: number }> = [];
  const timer = setTimeout(() => void client.destroy(), ms);
  try {
    const res = await client.request({ path, method: 'GET', headers: { authorization: `Bearer ${key}` } });
    let buf = '';
    for await (const chunk of res.body) {
      buf += (chunk as Buffer).toString();
      for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
        const data = /^data: (.*)$/m.exec(buf.slice(0, i))?.[1];
        buf = buf.slice(i + 2);
        // Open Responses ends the stream with [DONE], which is not an event.
        if (data && data !== '[DONE]') events.push(JSON.parse(data) as { type: string; sequence_number: number });
      }
    }
  } catch {
    // Cut off at `ms`: the caller sees a stream without its end.
  } finally {
    clearTimeout(timer);
    await client.close().catch(() => undefined);
  }
  return events;
}

describe('SWITCHYARD_WORKERS on SQLite: the workers behave as one (cluster bus over IPC)', () => {
  const dataDir = tempDir();
  after(() => rmSync(dataDir, { recursive: true, force: true }));

  it('starts new workers when every worker dies at once, and still stops cleanly', async () => {
    // A port of its own: new workers listening on port 0 after every worker is gone would get a new one.
    const port = await freePort();
    const p = await startProcess({ SWITCHYARD_DATA_DIR: tempDir(), SWITCHYARD_ADMIN_KEY: ADMIN, SWITCHYARD_WORKERS: '2' }, { port });
    try {
      const workers = processTree(p.child.pid!).slice(1);
      assert.equal(workers.length, 2, `worker processes: ${workers.join(', ')}`);
      // Both at once (an OOM kill, or one bad input that crashes each): the restart timer is then
      // all that keeps the primary running, and an unref()'d one let it exit with code 0.
      for (const pid of workers) process.kill(pid, 'SIGKILL');
      await eventually(async () => {
        assert.equal(p.child.exitCode, null, `the primary exited:\n${p.stdout()}`);
        // Refused until new workers listen. A connection the primary accepted as the workers died
        // is handed to a dead one and never answered (node:cluster's round robin): hence the
        // client's own short timeout, as any client would have.
        const client = new Client(p.url, { headersTimeout: 2_000, bodyTimeout: 2_000 });
        try {
          const r = await client.request({ path: '/v1/models', method: 'GET', headers: { authorization: `Bearer ${ADMIN}` } });
          await r.body.text();
          assert.equal(r.statusCode, 200);
        } finally {
          await client.close();
        }
      }, 20_000);
      const replaced = processTree(p.child.pid!).slice(1);
      assert.equal(replaced.length, 2);
      assert.ok(replaced.every((pid) => !workers.includes(pid)));
      assert.equal(p.stdout().match(/"msg":"worker exited; starting another"/g)?.length, 2);
    } finally {
      p.child.kill('SIGTERM');
    }
    assert.equal(await p.exited, 0, p.stdout());
    assert.match(p.stdout(), /"msg":"shut down cleanly"}\s*$/);
  });

  it('stops with one line and no restarts when the port is taken, with one worker and with two', async () => {
    const blocker = createServer();
    blocker.listen(0, '127.0.0.1');
    await once(blocker, 'listening');
    const port = (blocker.address() as AddressInfo).port;
    try {
      for (const workers of ['1', '2']) {
        const child = spawn(process.execPath, [MAIN, '--port', String(port)], {
          env: {
            PATH: process.env['PATH'] ?? '',
            SWITCHYARD_DATA_DIR: tempDir(),
            SWITCHYARD_ADMIN_KEY: ADMIN,
            SWITCHYARD_WORKERS: workers,
          },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        child.stderr.on('data', (d: Buffer) => (out += d.toString()));
        const [code] = (await once(child, 'exit')) as [number | null];
        // The start-up failure's own code (sysexits' EX_CONFIG), from the process or from the primary.
        assert.equal(code, 78, out);
        assert.match(
          out,
          new RegExp(`switchyard: cannot listen on 127\\.0\\.0\\.1:${port} \\(taken: choose another with PORT or --port\\): .*EADDRINUSE`),
          out,
        );
        assert.doesNotMatch(out, /starting another/, out);
      }
    } finally {
      blocker.close();
    }
  });

  it('answers --help with its usage, and a bad option with exit code 2, before starting anything', async () => {
    const run = async (args: string[]) => {
      const child = spawn(process.execPath, [MAIN, ...args], {
        env: { PATH: process.env['PATH'] ?? '' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      const [code] = (await once(child, 'exit')) as [number | null];
      return { code, out };
    };
    const help = await run(['--help']);
    assert.equal(help.code, 0, help.out);
    assert.match(help.out, /^Usage: npm start/);
    const bad = await run(['--port', '70000']);
    assert.equal(bad.code, 2, bad.out);
    assert.match(bad.out, /--port must be an integer/);
  });

  it('stops cleanly on SIGTERM when started as `switchyard serve` with two workers', async () => {
    const child = spawn(process.execPath, [join(PACKAGE_ROOT, 'bin', 'switchyard.js'), 'serve', '--port', String(await freePort())], {
      env: { PATH: process.env['PATH'] ?? '', SWITCHYARD_DATA_DIR: tempDir(), SWITCHYARD_ADMIN_KEY: ADMIN, SWITCHYARD_WORKERS: '2' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exit = once(child, 'exit');
    await new Promise<void>((resolve) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        if (/"workers":2,"msg":"switchyard listening"/.test(out)) resolve();
      });
    });
    child.kill('SIGTERM');
    const [code] = (await exit) as [number | null];
    assert.equal(code, 0, out);
    assert.doesNotMatch(out, /did not stop/, out);
  });

  it('follows, reads and cancels a background response from any worker, and revokes a key everywhere at once', async () => {
    // A slow upstream: one word every 20 ms, for up to 10 s; it notes when Switchyard hangs up.
    let closedAt = 0;
    const upstream = await fixture((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        let n = 0;
        const timer = setInterval(() => {
          res.write(chunkFrame({ content: `w${n} ` }));
          if (++n === 500) {
            clearInterval(timer);
            res.end(chunkFrame({}, 'stop') + 'data: [DONE]\n\n');
          }
        }, 20);
        res.on('close', () => {
          clearInterval(timer);
          closedAt = Date.now();
        });
      });
    });
    const config = join(dataDir, 'slow.json');
    writeFileSync(
      config,
      JSON.stringify({
        models: [{ id: 'openai/slow', context_length: 100000, capabilities: ['streaming'] }],
        deployments: [{ model: 'openai/slow', baseUrl: upstream.url, upstreamModel: 'slow' }],
      }),
    );
    const p = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '2',
      SWITCHYARD_CONFIG: config,
      SWITCHYARD_LEDGER_FLUSH_MS: '20',
    });
    try {
      const created = await fresh(p.url, '/v1/responses', 'POST', ADMIN, {
        model: 'openai/slow',
        input: 'Talk for a while.',
        background: true,
      });
      assert.equal(created.status, 200, JSON.stringify(created.json));
      const id = String(created.json['id']);
      // Followers on four connections: the primary deals them out in turn, so both workers have some.
      const followers = Array.from({ length: 4 }, () => follow(p.url, `/v1/responses/${id}?stream=true`, ADMIN, 15_000));
      await eventually(async () => {
        const r = await fresh(p.url, `/v1/responses/${id}`, 'GET', ADMIN);
        assert.equal(r.status, 200);
        assert.equal(r.json['status'], 'in_progress');
      });
      await new Promise((r) => setTimeout(r, 300));
      const cancel = await fresh(p.url, `/v1/responses/${id}/cancel`, 'POST', ADMIN);
      const answered = Date.now();
      assert.equal(cancel.json['status'], 'cancelled', JSON.stringify(cancel.json));
      // The owner stopped generating before the cancel answered (or within 100 ms of it).
      await eventually(() => assert.ok(closedAt > 0), 2000);
      assert.ok(closedAt - answered <= 100, `upstream closed ${closedAt - answered} ms after the cancel answered`);
      const usage = cancel.json['usage'] as { output_tokens: number } | null;
      assert.ok(usage && usage.output_tokens > 0, 'a cancelled response reports what it generated');
      for (const events of await Promise.all(followers)) {
        assert.equal(events.at(-1)?.type, 'response.incomplete', 'every follower sees the end');
        const seq = events.map((e) => e.sequence_number);
        assert.deepEqual(
          seq,
          seq.map((_, i) => i),
          'from the first event, in order',
        );
      }
      // Read-your-writes: every worker answers cancelled from now on.
      for (let i = 0; i < 10; i++) {
        const r = await fresh(p.url, `/v1/responses/${id}`, 'GET', ADMIN);
        assert.equal(r.json['status'], 'cancelled');
      }

      const key = await http<WireKey>(p.url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'acme', name: 'soon revoked' } });
      for (let i = 0; i < 4; i++) assert.equal((await fresh(p.url, '/v1/models', 'GET', key.json.key!)).status, 200);
      assert.equal((await fresh(p.url, `/admin/keys/${key.json.id}`, 'DELETE', ADMIN)).status, 200);
      await new Promise((r) => setTimeout(r, 100));
      // The key cache lives 1 s; the bus makes the revocation take effect in both workers at once.
      const after = await Promise.all(Array.from({ length: 10 }, () => fresh(p.url, '/v1/models', 'GET', key.json.key!)));
      assert.deepEqual(
        after.map((r) => r.status),
        Array(10).fill(401),
      );
    } finally {
      p.child.kill('SIGTERM');
      await upstream.close();
    }
    assert.equal(await p.exited, 0, p.stdout());
  });
});
