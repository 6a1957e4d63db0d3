import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import Database from 'better-sqlite3';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { connect } from 'node:net';
import { request } from 'undici';
import { PACKAGE_ROOT } from '../src/config.js';
import { SHARED_MODELS, http, tempDir, type WireKey, type WireList, type WireModel } from './helpers/server.js';
import { MAIN, startProcess } from './helpers/process.js';
import { eventually } from './helpers/wait.js';
import { SERVER_NODE_FLAGS, withServerFlags } from '../src/runtime-flags.js';

const CLI = join(PACKAGE_ROOT, 'bin', 'switchyard.js');
const run = promisify(execFile);

interface Proc {
  pid: number;
  ppid: number;
  argv: string[];
  nodeOptions: string;
}

/** A start expected to fail: its exit code and what it wrote on stderr. */
async function failedStart(env: Record<string, string>, args = ['--port', '0']): Promise<{ code: number | null; err: string }> {
  const child = spawn(process.execPath, [MAIN, ...args], {
    env: { PATH: process.env['PATH'] ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    // A start that hangs fails the test (exit code null) rather than the run.
    timeout: 60_000,
    killSignal: 'SIGKILL',
  });
  let err = '';
  child.stderr.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const code = await new Promise<number | null>((res) => child.on('exit', res));
  return { code, err };
}

/** `pid` and its descendants, with their command lines and NODE_OPTIONS, from /proc (Linux). */
function processTree(pid: number): Proc[] {
  const all = readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .flatMap((d) => {
      try {
        // The parent's pid is the 4th field of stat, after the command name in parentheses.
        const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
        const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
        const argv = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').filter(Boolean);
        const env = readFileSync(`/proc/${d}/environ`, 'utf8').split('\0');
        const nodeOptions = env.find((e) => e.startsWith('NODE_OPTIONS='))?.slice('NODE_OPTIONS='.length) ?? '';
        return [{ pid: Number(d), ppid, argv, nodeOptions }];
      } catch {
        return []; // gone since the listing
      }
    });
  const tree = all.filter((p) => p.pid === pid);
  for (let i = 0; i < tree.length; i++) tree.push(...all.filter((p) => p.ppid === tree[i]!.pid));
  return tree;
}

/**
 * The semi-space size V8 takes for a Node process: the last `--max-semi-space-size` among its own
 * options on the command line (before the script), else the last in its NODE_OPTIONS (the command
 * line wins over NODE_OPTIONS); undefined for V8's default.
 */
function semiSpaceOf(p: Proc): string | undefined {
  const last = (args: string[]) =>
    args
      .map((a) => /^--?max[-_]semi[-_]space[-_]size=(\d+)$/.exec(a.replaceAll('"', ''))?.[1])
      .filter((v) => v !== undefined)
      .at(-1);
  const script = p.argv.findIndex((a, i) => i > 0 && !a.startsWith('-'));
  return last(p.argv.slice(1, script < 0 ? undefined : script)) ?? last(p.nodeOptions.split(/\s+/));
}

describe('the server process', () => {
  const dataDir = tempDir();
  after(() => rmSync(dataDir, { recursive: true, force: true }));
  let adminKey = '';

  it('generates and prints an admin key once on first start, then drains in-flight requests on SIGTERM', async () => {
    const p = await startProcess({ SWITCHYARD_DATA_DIR: dataDir });
    const m = /^\s+(sk-sy-\S+)$/m.exec(p.stdout());
    assert.ok(m, `admin key printed:\n${p.stdout()}`);
    adminKey = m[1]!;
    const models = await http<WireList<WireModel>>(p.url, 'GET', '/v1/models', { key: adminKey });
    assert.equal(models.status, 200);
    assert.ok(models.json.data.some((x) => x.id === 'local/stories260k'));
    assert.equal((await http(p.url, 'GET', '/readyz')).status, 200);

    // An in-flight request: headers and half the body are sent before SIGTERM, the rest after.
    const { port } = new URL(p.url);
    const socket = connect(Number(port), '127.0.0.1');
    await new Promise<void>((res) => socket.once('connect', () => res()));
    const body = JSON.stringify({ id: 'drained-org' });
    let response = '';
    socket.on('data', (d: Buffer) => {
      response += d.toString();
    });
    socket.write(
      `POST /admin/orgs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body.slice(0, 5)}`,
    );
    // Nothing to observe for "the server has read the partial body": give it a moment (were it not
    // read yet, the request would still be in flight, which is what this test needs anyway).
    await new Promise((r) => setTimeout(r, 100));
    p.child.kill('SIGTERM');
    await eventually(() => assert.match(p.stdout(), /shutting down/));
    socket.write(body.slice(5));
    await new Promise<void>((res) => socket.once('close', () => res()));
    assert.match(response, /^HTTP\/1\.1 201/, response);
    assert.equal(await p.exited, 0, p.stdout());
    assert.match(p.stdout(), /shut down cleanly/);
  });

  it('writes its access log in blocks: a quiet server still writes a line within a fraction of a second, and every line is out on exit', async () => {
    const p = await startProcess({ SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_WORKERS: '1' });
    const lines = () => p.stdout().split('\n');
    // One request and then nothing: the line does not wait for a block to fill.
    const one = await http(p.url, 'GET', '/v1/models', { key: adminKey });
    const id = one.headers['x-request-id'];
    const started = Date.now();
    await eventually(() => assert.ok(lines().some((l) => l.includes(`"request_id":"${id}"`) && l.includes('"msg":"request"'))), 2000);
    assert.ok(Date.now() - started < 1000, `the access line took ${Date.now() - started} ms`);
    // A burst: every line is there once the process has exited, none lost or cut.
    const ids: string[] = [];
    for (let i = 0; i < 200; i++)
      ids.push(String((await http(p.url, 'GET', '/v1/models?author=local', { key: adminKey })).headers['x-request-id']));
    // Health checks that pass are debug lines, not info ones (a load balancer's would fill the log).
    const probes = [await http(p.url, 'GET', '/readyz'), await http(p.url, 'GET', '/healthz')].map((r) =>
      String(r.headers['x-request-id']),
    );
    p.child.kill('SIGTERM');
    assert.equal(await p.exited, 0);
    assert.deepEqual(
      probes.filter((i) => p.stdout().includes(`"request_id":"${i}"`)),
      [],
    );
    const logged = new Set(
      lines()
        .filter((l) => l.includes('"msg":"request"'))
        .map((l) => (JSON.parse(l) as { request_id: string }).request_id),
    );
    assert.deepEqual(
      ids.filter((i) => !logged.has(i)),
      [],
      'every request has its line',
    );
  });

  // The young generation's size each serving process gets (see src/runtime-flags.ts): npm start's
  // own, the one a primary started without it passes to its workers, and one the starter sets.
  const SEMI = SERVER_NODE_FLAGS[0]!.split('=')[1]!;
  for (const [label, command, args, env, semi] of [
    ["npm start (the README's command)", 'npm', ['start', '--', '--port', '0'], {}, SEMI],
    ['node dist/src/main.js (what a service manager or container runs)', process.execPath, [MAIN, '--port', '0'], {}, SEMI],
    ['npm start with a NODE_OPTIONS of its own', 'npm', ['start', '--', '--port', '0'], { NODE_OPTIONS: '--max_semi_space_size=16' }, '16'],
  ] as const) {
    it(`stops every process of ${label} on SIGTERM to the one it started`, async () => {
      const dir = tempDir();
      const child = spawn(command, args, {
        cwd: PACKAGE_ROOT,
        env: {
          PATH: process.env['PATH'] ?? '',
          HOME: process.env['HOME'] ?? dir,
          SWITCHYARD_DATA_DIR: dir,
          SWITCHYARD_WORKERS: '2',
          SWITCHYARD_ADMIN_KEY: 'sk-test-admin-npm-start-0123456789',
          ...env,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
        // Its own process group, so that a failing test can kill every process it started (npm's
        // server and workers would otherwise outlive npm and keep this file's pipes open).
        detached: true,
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
      });
      child.stderr.on('data', (d: Buffer) => {
        out += d.toString();
      });
      const exited = new Promise<number | null>((res) => child.on('exit', (code) => res(code)));
      try {
        const url = await new Promise<string>((res, rej) => {
          const timer = setTimeout(() => rej(new Error(`did not start:\n${out}`)), 90_000);
          child.stdout.on('data', () => {
            const m = /"address":"(http:\/\/[^"]+)","database":"[^"]*","workers"/.exec(out);
            if (m) {
              clearTimeout(timer);
              res(m[1]!);
            }
          });
        });
        // Both workers answer before the stop.
        assert.equal((await http(url, 'GET', '/healthz')).status, 200);
        // Every process that serves runs with the young generation it should (Linux: read from /proc).
        if (process.platform === 'linux') {
          const tree = processTree(child.pid!);
          const isMain = (p: Proc | undefined) => p?.argv.some((a) => resolve(PACKAGE_ROOT, a) === MAIN) === true;
          const primary = tree.find((p) => isMain(p) && !isMain(tree.find((q) => q.pid === p.ppid)));
          const workers = tree.filter((p) => p.ppid === primary?.pid && isMain(p));
          assert.equal(workers.length, 2, JSON.stringify(tree));
          for (const w of workers) assert.equal(semiSpaceOf(w), semi, `worker: ${JSON.stringify(w)}`);
          if (command === 'npm') assert.equal(semiSpaceOf(primary!), semi, `primary: ${JSON.stringify(primary)}`);
        }
        child.kill('SIGTERM');
        assert.equal(await exited, 0, out);
        // Nothing is left serving the port (a worker orphaned by its parent would still answer).
        const refused = await new Promise<boolean>((res) => {
          const socket = connect(Number(new URL(url).port), '127.0.0.1');
          socket.once('connect', () => {
            socket.destroy();
            res(false);
          });
          socket.once('error', () => res(true));
        });
        assert.ok(refused, `the port still answers after SIGTERM:\n${out}`);
        assert.match(out, /shut down cleanly/);
      } finally {
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          // the group is gone: everything stopped
        }
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }

  it('stops what still runs at the shutdown timeout and bills it: the stream ends, a background response fails', async () => {
    const dir = tempDir();
    const admin = 'sk-sy-shutdown-timeout-test-key-0001';
    const env = { SWITCHYARD_DATA_DIR: dir, SWITCHYARD_ADMIN_KEY: admin, SWITCHYARD_SHUTDOWN_TIMEOUT_MS: '1000' };
    try {
      const p = await startProcess(env);
      const model = 'local/llama-2-tiny-random';
      // A stream that would run for many seconds, read to its first chunk.
      const stream = await request(`${p.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hello' }], max_tokens: 4000, stream: true }),
      });
      const chunks = stream.body[Symbol.asyncIterator]();
      await chunks.next();
      // The stream is told why it ends (an error event in its protocol), and its transfer is complete.
      const rest = (async () => {
        let tail = '';
        for (let c = await chunks.next(); !c.done; c = await chunks.next()) tail = (tail + String(c.value)).slice(-2000);
        return tail;
      })();
      const bg = await http<{ id: string }>(p.url, 'POST', '/v1/responses', {
        key: admin,
        body: { model, input: 'hello', max_output_tokens: 4000, background: true },
      });
      await eventually(async () =>
        assert.equal(
          (await http<{ status: string }>(p.url, 'GET', `/v1/responses/${bg.json.id}`, { key: admin })).json.status,
          'in_progress',
        ),
      );
      p.child.kill('SIGTERM');
      assert.equal(await p.exited, 1, p.stdout());
      const tail = await rest;
      assert.match(
        tail,
        /data: \{"error":\{"message":"The server is shutting down[^"]*","type":"server_error","param":null,"code":"service_unavailable"\}\}\n\n$/,
      );
      assert.match(p.stdout(), /stopped what was still running; its usage is recorded/);

      const q = await startProcess(env);
      try {
        const usage = await http<{ data: Array<{ requests: number; errors: number; output_tokens: number }> }>(
          q.url,
          'GET',
          '/admin/usage?group_by=model',
          { key: admin },
        );
        const total = usage.json.data.find((d) => (d as unknown as { group: string }).group === model);
        assert.equal(total?.requests, 2, usage.text);
        assert.equal(total?.errors, 2, usage.text);
        assert.ok((total?.output_tokens ?? 0) > 0, 'what the stopped requests generated is billed');
        // Stopped by the server, which the records say (not cancelled by their clients).
        const db = new Database(join(dir, 'switchyard.db'), { readonly: true });
        try {
          assert.deepEqual(db.prepare('select endpoint, status, error_code from usage_records order by endpoint').all(), [
            { endpoint: 'chat.completions', status: 503, error_code: 'service_unavailable' },
            { endpoint: 'responses', status: 503, error_code: 'service_unavailable' },
          ]);
        } finally {
          db.close();
        }
        const stored = await http<{ status: string; error: { code: string; message: string } | null }>(
          q.url,
          'GET',
          `/v1/responses/${bg.json.id}`,
          { key: admin },
        );
        assert.equal(stored.json.status, 'failed');
        assert.equal(stored.json.error?.code, 'server_error');
        assert.match(stored.json.error?.message ?? '', /shut down/);
      } finally {
        q.child.kill('SIGTERM');
        await q.exited;
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('answers requests still waiting on a silent upstream at the shutdown timeout with a 503, and bills them', async () => {
    const dir = tempDir();
    const admin = 'sk-sy-shutdown-silent-upstream-key-0001';
    // An upstream that takes every request and never answers: not even its head, or (asked for
    // 'head') its head and the start of its answer, then nothing more.
    const held: ServerResponse[] = [];
    const upstream = createServer((req, res) => {
      let raw = '';
      req.on('data', (d: Buffer) => (raw += d.toString()));
      req.on('end', () => {
        held.push(res);
        if (!raw.includes('head')) return;
        const body = JSON.parse(raw) as { stream?: boolean };
        if (body.stream) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(
            `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] })}\n\n`,
          );
        } else {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.write('{"id":"c",');
        }
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
    const port = (upstream.address() as AddressInfo).port;
    const model = 'mistralai/silent';
    const configFile = join(dir, 'config.json');
    writeFileSync(
      configFile,
      JSON.stringify({
        models: [{ id: model, context_length: 8192, capabilities: ['streaming'] }],
        deployments: [{ model, baseUrl: `http://127.0.0.1:${port}/v1`, upstreamModel: 'm' }],
      }),
    );
    const env = {
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ADMIN_KEY: admin,
      SWITCHYARD_SHUTDOWN_TIMEOUT_MS: '1000',
      SWITCHYARD_CONFIG: configFile,
      SWITCHYARD_WORKERS: '1',
    };
    try {
      const p = await startProcess(env);
      const post = (path: string, body: object) =>
        http(p.url, 'POST', path, { key: admin, body }).catch((err: unknown) => ({ status: 0, text: String(err), json: undefined }));
      const messages = [{ role: 'user', content: 'hello' }];
      const head = [{ role: 'user', content: 'head' }];
      const waiting = [
        post('/v1/chat/completions', { model, messages }),
        post('/v1/chat/completions', { model, messages, stream: true }),
        post('/v1/responses', { model, input: 'hello' }),
        post('/v1/responses', { model, input: 'hello', stream: true }),
        // The upstream has answered its head (and a first piece, which carries no output).
        post('/v1/chat/completions', { model, messages: head }),
        post('/v1/chat/completions', { model, messages: head, stream: true }),
        post('/v1/chat/completions', { model, messages: head, stream: true, store: true }),
      ];
      await eventually(() => assert.equal(held.length, 7));
      p.child.kill('SIGTERM');
      const answers = await Promise.all(waiting);
      assert.equal(await p.exited, 1, p.stdout());
      for (const a of answers) {
        // An answer, not a closed connection: the generation had not begun, so the error is the HTTP status.
        assert.equal(a.status, 503, a.text);
        assert.equal((a.json as { error?: { code?: string } } | undefined)?.error?.code, 'service_unavailable', a.text);
        assert.match(a.text, /shutting down|shut down/);
      }
      const db = new Database(join(dir, 'switchyard.db'), { readonly: true });
      try {
        const rows = db.prepare('select endpoint, status, error_code from usage_records order by endpoint').all();
        assert.equal(rows.length, 7, JSON.stringify(rows));
        for (const r of rows)
          assert.deepEqual(
            { ...(r as object), endpoint: undefined },
            { endpoint: undefined, status: 503, error_code: 'service_unavailable' },
          );
      } finally {
        db.close();
      }
    } finally {
      for (const res of held) res.destroy();
      await new Promise((r) => upstream.close(r));
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('keeps keys and data across a restart and prints no new key', async () => {
    const p = await startProcess({ SWITCHYARD_DATA_DIR: dataDir });
    try {
      assert.doesNotMatch(p.stdout(), /sk-sy-/);
      const org = await http(p.url, 'GET', '/admin/orgs/drained-org', { key: adminKey });
      assert.equal(org.status, 200, 'the request acknowledged during shutdown was kept');
    } finally {
      p.child.kill('SIGTERM');
      await p.exited;
    }
  });

  it('manages keys with the CLI against the same database as a running server', async () => {
    // The CLI with the server's settings: it reads the same catalogue (its local files included).
    const env = { ...process.env, SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_MODELS_DIR: SHARED_MODELS, SWITCHYARD_LOG_LEVEL: 'silent' };
    const p = await startProcess({ SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_KEY_CACHE_TTL_MS: '0', SWITCHYARD_LEDGER_FLUSH_MS: '20' });
    try {
      const created = await run(
        process.execPath,
        [CLI, 'keys', 'create', '--org', 'acme', '--name', 'ci', '--rpm', '100', '--models', 'local/stories260k'],
        { env },
      );
      assert.match(created.stdout, /Limits: rpm=100 models=local\/stories260k/);
      assert.doesNotMatch(created.stderr, /Warning/);
      assert.match(created.stdout, /Created organization acme\./);
      const key = /^\s+(sk-sy-\S+)$/m.exec(created.stdout)?.[1];
      assert.ok(key, created.stdout);
      const id = /key (key_[0-9a-f]{16})/.exec(created.stdout)?.[1];
      assert.ok(id);
      assert.equal((await http(p.url, 'GET', '/v1/models', { key })).status, 200);

      const listed = await run(process.execPath, [CLI, 'keys', 'list', '--org', 'acme'], { env });
      assert.match(listed.stdout, new RegExp(`${id}\\s+acme\\s+ci\\s+inference.*rpm=100`));
      const chat = await http(p.url, 'POST', '/v1/chat/completions', {
        key,
        body: { model: 'local/stories260k', messages: [{ role: 'user', content: 'Once' }], max_tokens: 4 },
      });
      assert.equal(chat.status, 200);
      assert.equal(chat.headers['x-ratelimit-limit-requests'], '100');
      // The usage record is written by the ledger's next flush.
      await eventually(async () => {
        const usage = await run(process.execPath, [CLI, 'usage', '--by', 'key', '--key', id], { env });
        assert.match(usage.stdout, new RegExp(`${id}\\s+1\\s+0\\s+\\d+\\s+\\d+\\s+4\\s`), usage.stdout);
      });
      // Changing one limit keeps the others (the allowed models here); --unset removes one.
      const limited = await run(process.execPath, [CLI, 'keys', 'limits', id, '--rpm', '1', '--tpm', '5000'], { env });
      assert.match(limited.stdout, /rpm=1 tpm=5000 models=local\/stories260k/);
      const typo = await run(process.execPath, [CLI, 'keys', 'limits', id, '--models', 'local/stories260'], { env });
      assert.match(typo.stderr, /Warning: limits\.models names no model in the catalogue: 'local\/stories260'; /);
      await run(process.execPath, [CLI, 'keys', 'limits', id, '--models', 'local/stories260k'], { env });
      const unset = await run(process.execPath, [CLI, 'keys', 'limits', id, '--unset', 'tpm'], { env });
      assert.match(unset.stdout, /rpm=1 models=local\/stories260k$/m);
      const viaKey = await http<WireKey & { limits: Record<string, unknown> }>(p.url, 'GET', `/admin/keys/${id}`, { key: adminKey });
      assert.deepEqual(viaKey.json.limits, { rpm: 1, models: ['local/stories260k'] }, viaKey.text);
      assert.doesNotMatch(listed.stdout, /sk-sy-/, 'secrets are never listed');

      const viaApi = await http<WireList<WireKey>>(p.url, 'GET', '/admin/keys?org=acme', { key: adminKey });
      assert.ok(viaApi.json.data.some((k) => k.id === id));

      const revoked = await run(process.execPath, [CLI, 'keys', 'revoke', id], { env });
      assert.match(revoked.stdout, /Revoked/);
      assert.equal((await http(p.url, 'GET', '/v1/models', { key })).status, 401);

      await assert.rejects(
        run(process.execPath, [CLI, 'keys', 'create', '--org', 'acme'], { env }),
        (err: { code?: number; stderr?: string }) => {
          assert.equal(err.code, 2);
          assert.match(err.stderr ?? '', /--name/);
          return true;
        },
      );
    } finally {
      p.child.kill('SIGTERM');
      await p.exited;
    }
  });

  it('manages the catalogue and deployments with the CLI', async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_LOG_LEVEL: 'silent' };
    const cli = (...args: string[]) => run(process.execPath, [CLI, ...args], { env });
    const listed = await cli('models', 'list');
    assert.match(listed.stdout, /meta-llama\/llama-3\.1-8b-instruct\s+text_generation\s+active\s+public/);
    assert.match((await cli('models', 'status', 'qwen/qwen3-8b', 'inactive')).stdout, /now inactive/);
    await assert.rejects(cli('models', 'status', 'qwen/qwen3-8b', 'pending'), (err: { code?: number; stderr?: string }) => {
      assert.equal(err.code, 1);
      assert.match(err.stderr ?? '', /cannot move from inactive to pending/);
      return true;
    });
    assert.match(
      (await cli('models', 'create', 'qwen/house-model', '--context-length', '8192', '--input-price', '0.1', '--output-price', '0.3'))
        .stdout,
      /Created/,
    );
    await cli('models', 'set', 'qwen/house-model', '--visibility', 'private', '--owner', 'acme', '--output-price', '0.4');
    assert.match(
      (await cli('models', 'list')).stdout,
      /qwen\/house-model\s+text_generation\s+active\s+private\s+acme\s+8192\s+input_tokens=0\.1 output_tokens=0\.4/,
    );
    await assert.rejects(cli('models', 'create', 'qwen/no-context'), (err: { code?: number; stderr?: string }) =>
      /context_length is required/.test(err.stderr ?? ''),
    );
    const add = [
      'deployments',
      'add',
      '--model',
      'qwen/qwen3-8b',
      '--base-url',
      'http://127.0.0.1:8000/v1',
      '--key-env',
      'UPSTREAM_KEY_VLLM',
      '--api',
      'responses',
    ];
    await assert.rejects(cli(...add), (err: { stderr?: string }) =>
      /refused: .*internal address 127\.0\.0\.1.*SWITCHYARD_UPSTREAM_ALLOW/.test(err.stderr ?? ''),
    );
    env['SWITCHYARD_UPSTREAM_ALLOW'] = '127.0.0.0/8';
    const added = await cli(...add);
    const id = /deployment (dep_[0-9a-f]+)/.exec(added.stdout)?.[1];
    assert.ok(id, added.stdout);
    assert.match(
      (await cli('deployments', 'list')).stdout,
      new RegExp(`${id}\\s+qwen/qwen3-8b\\s+http://127\\.0\\.0\\.1:8000/v1.*responses\\s+UPSTREAM_KEY_VLLM`),
    );
    assert.match((await cli('deployments', 'remove', id)).stdout, /Removed/);
  });

  it('stops cleanly (exit 0) on a SIGTERM that arrives while its workers are still starting', async () => {
    const dir = tempDir();
    const child = spawn(process.execPath, [MAIN, '--port', '0'], {
      env: {
        PATH: process.env['PATH'] ?? '',
        SWITCHYARD_DATA_DIR: dir,
        SWITCHYARD_WORKERS: '2',
        SWITCHYARD_MODELS_DIR: join(dir, 'none'),
        SWITCHYARD_ADMIN_KEY: 'sk-test-admin-early-stop-0123456789',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stderr.on('data', (d: Buffer) => {
      out += d.toString();
    });
    const exited = new Promise<number | null>((res) => child.on('exit', (code) => res(code)));
    try {
      // The first line any worker logs comes before it listens: stop the service right then.
      child.stdout.on('data', (d: Buffer) => {
        const first = out.length === 0 || !/"worker":/.test(out);
        out += d.toString();
        if (first && /"worker":/.test(out)) child.kill('SIGTERM');
      });
      assert.equal(await exited, 0, out);
      assert.match(out, /shut down cleanly/);
      assert.doesNotMatch(out, /did not stop cleanly/);
    } finally {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("refuses a second instance on the same data directory and leaves the first one's running response alone", async () => {
    const dir = tempDir();
    const admin = 'sk-sy-second-instance-test-key-0001';
    // An upstream that starts an answer and never ends it: the response runs until cancelled,
    // however fast this machine is (a local model's 4,000 tokens sometimes ended first).
    const upstream = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(
          `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { role: 'assistant', content: 'Once' }, finish_reason: null }] })}\n\n`,
        );
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
    const configFile = join(dir, 'config.json');
    writeFileSync(
      configFile,
      JSON.stringify({
        models: [{ id: 'mistralai/endless', context_length: 8192, capabilities: ['streaming'] }],
        deployments: [
          { model: 'mistralai/endless', baseUrl: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`, upstreamModel: 'm' },
        ],
      }),
    );
    const env = { SWITCHYARD_DATA_DIR: dir, SWITCHYARD_ADMIN_KEY: admin, SWITCHYARD_CONFIG: configFile };
    const p = await startProcess(env);
    try {
      const bg = await http<{ id: string }>(p.url, 'POST', '/v1/responses', {
        key: admin,
        body: { model: 'mistralai/endless', input: 'hello', background: true },
      });
      const status = async () => (await http<{ status: string }>(p.url, 'GET', `/v1/responses/${bg.json.id}`, { key: admin })).json.status;
      await eventually(async () => assert.equal(await status(), 'in_progress'));
      // A second start on the same directory: its port is free (0), with workers and without.
      for (const workers of ['2', '1']) {
        const { code, err } = await failedStart({ SWITCHYARD_MODELS_DIR: join(dir, 'none'), SWITCHYARD_WORKERS: workers, ...env });
        assert.equal(code, 78, err);
        assert.match(err, /another Switchyard instance is serving the SQLite database/);
      }
      // Untouched: still running, and what ends it is its own cancel, not an orphan sweep's failure.
      assert.equal(await status(), 'in_progress');
      const cancelled = await http<{ status: string }>(p.url, 'POST', `/v1/responses/${bg.json.id}/cancel`, { key: admin });
      assert.equal(cancelled.json.status, 'cancelled', cancelled.text);
      await eventually(async () => assert.equal(await status(), 'cancelled'));
    } finally {
      p.child.kill('SIGTERM');
      await p.exited;
      upstream.closeAllConnections();
      upstream.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('says which setting a start that cannot reach its Redis or open its data directory failed on', async () => {
    const cases: Array<[Record<string, string>, RegExp]> = [
      [{ REDIS_URL: 'redis://:hunter2@127.0.0.1:1/0' }, /cannot reach Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:1\/0 \(REDIS_URL\)/],
      [{ REDIS_URL: 'redis://127.0.0.1:1/0?password=hunter2' }, /cannot reach Redis at redis:\/\/127\.0\.0\.1:1\/0 \(REDIS_URL\)/],
      [
        { SWITCHYARD_DATA_DIR: '/etc/passwd/sub' },
        /cannot open the SQLite database \/etc\/passwd\/sub\/switchyard\.db \(set by SWITCHYARD_DATA_DIR/,
      ],
      // Node's recursive mkdir loops forever on a directory that cannot be made under one that exists.
      [
        { SWITCHYARD_DATA_DIR: '/proc/switchyard/data' },
        /cannot open the SQLite database \/proc\/switchyard\/data\/switchyard\.db .*mkdir '\/proc\/switchyard'/,
      ],
    ];
    for (const [env, pattern] of cases) {
      const { code, err } = await failedStart({ SWITCHYARD_WORKERS: '1', SWITCHYARD_DATA_DIR: tempDir(), ...env });
      assert.equal(code, 78, err);
      assert.match(err, pattern);
      assert.doesNotMatch(err, /hunter2/);
    }
  });

  it('refuses to start on a bad setting, naming it', async () => {
    const { code, err } = await failedStart({ PORT: 'eighty' }, []);
    assert.equal(code, 2);
    assert.match(err, /PORT/);
  });
});

describe("the server's Node options", () => {
  it('are set by npm start and the systemd unit, before any NODE_OPTIONS of their own', () => {
    const start = (JSON.parse(readFileSync(join(PACKAGE_ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts[
      'start'
    ];
    const unit = readFileSync(join(PACKAGE_ROOT, 'deploy', 'switchyard.service'), 'utf8');
    const options = SERVER_NODE_FLAGS.join(' ');
    assert.ok(start?.startsWith(`NODE_OPTIONS="${options} $NODE_OPTIONS" exec node `), start);
    // systemd reads the EnvironmentFile after Environment=, so a NODE_OPTIONS there replaces this one.
    assert.match(unit, new RegExp(`^Environment=NODE_OPTIONS=${options}\\n(.*\\n)*EnvironmentFile=`, 'm'));
  });

  it('are added to a worker only where whoever started the server did not set them', () => {
    const flag = SERVER_NODE_FLAGS[0]!;
    assert.deepEqual(withServerFlags([], ''), [...SERVER_NODE_FLAGS]);
    assert.deepEqual(withServerFlags(['--inspect'], ''), ['--inspect', ...SERVER_NODE_FLAGS]);
    assert.deepEqual(withServerFlags([flag], ''), [flag]);
    // Either spelling, any value, on the command line or in NODE_OPTIONS: the given one wins.
    assert.deepEqual(withServerFlags(['--max_semi_space_size=8'], ''), ['--max_semi_space_size=8']);
    assert.deepEqual(withServerFlags([], '--max-old-space-size=512 --max-semi-space-size=64'), []);
    assert.deepEqual(withServerFlags([], '"--max-semi-space-size=8"'), []);
    assert.deepEqual(withServerFlags(['-max-semi-space-size=8'], ''), ['-max-semi-space-size=8']);
    // A name that only begins like it is another option.
    assert.deepEqual(withServerFlags(['--max-semi-space-size-x=1'], ''), ['--max-semi-space-size-x=1', ...SERVER_NODE_FLAGS]);
  });
});
