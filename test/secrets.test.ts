import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createKey, http, startServer, tempDir, type WireKey } from './helpers/server.js';
import { startProcess, type Running } from './helpers/process.js';
import SqliteDatabase from 'better-sqlite3';
import { chunkFrame, closers, fixture, jsonFixture } from './helpers/fixtures.js';

const ADMIN = 'sk-test-admin-secret-logs-0123456789';
const UPSTREAM_SECRET = 'sk-upstream-credential-5f3a9c1e7b';
const MODEL = 'meta-llama/tiny-stories';

describe('secrets never reach logs or error bodies', () => {
  const dataDir = tempDir();
  let proc: Running | undefined;
  const closers: Array<() => Promise<void>> = [];
  after(async () => {
    proc?.child.kill('SIGKILL');
    for (const c of closers) await c();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('leaves no key or upstream credential in a full run at trace level', async () => {
    // An upstream that quotes the credential it got, as some hosted APIs do in their 401s.
    const upstream = await fixture((req, res) => {
      req.resume();
      res
        .writeHead(401, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { message: `Incorrect API key provided: ${String(req.headers.authorization).slice(7)}` } }));
    });
    closers.push(() => upstream.close());
    const config = join(dataDir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        defaultCatalogue: false,
        models: [{ id: MODEL, name: 'TinyStories via upstream', context_length: 512 }],
        deployments: [{ model: MODEL, baseUrl: upstream.url, apiKeyEnv: 'UPSTREAM_KEY' }],
      }),
    );
    proc = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_LOG_LEVEL: 'trace',
      SWITCHYARD_CONFIG: config,
      UPSTREAM_KEY: UPSTREAM_SECRET,
    });
    const url = proc.url;
    const secrets = [ADMIN, UPSTREAM_SECRET];

    const created = await http<WireKey>(url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'acme', name: 'app' } });
    assert.equal(created.status, 201);
    const key = created.json.key!;
    secrets.push(key);
    const revoked = await http<WireKey>(url, 'POST', '/admin/keys', { key: ADMIN, body: { org: 'acme', name: 'old' } });
    secrets.push(revoked.json.key!);
    await http(url, 'DELETE', `/admin/keys/${revoked.json.id}`, { key: ADMIN });

    const bodies: string[] = [];
    const calls: Array<Parameters<typeof http>> = [
      [url, 'GET', '/v1/models', { key }],
      [url, 'GET', '/v1/models', { headers: { 'x-api-key': key } }],
      [url, 'GET', '/v1/models', { key: revoked.json.key! }],
      [url, 'GET', '/v1/models', { key: `${key}x` }],
      [url, 'GET', `/v1/models?api_key=${key}&type=text_generation`, {}],
      [url, 'GET', '/admin/keys', { key }],
      [url, 'POST', '/v1/chat/completions', { key, body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }] } }],
      [url, 'POST', '/v1/chat/completions', { key, body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }], stream: true } }],
      [url, 'POST', '/v1/responses', { key, body: { model: MODEL, input: 'hi' } }],
      [url, 'POST', '/v1/chat/completions', { key, body: '{"broken' }],
    ];
    for (const c of calls) bodies.push((await http(...c)).text);
    // The client learns that the deployment's credentials were refused (not that its own key is
    // wrong); the operator's log has the upstream's words, without the credential.
    const upstreamAnswer = JSON.parse(bodies[6]!) as { error: { message: string } };
    assert.match(upstreamAnswer.error.message, /refused this gateway's credentials/);

    proc.child.kill('SIGTERM');
    await proc.exited;
    const logs = proc.stdout();
    assert.ok(logs.split('\n').filter((l) => l.includes('"msg":"request"')).length >= calls.length, 'the access log ran');
    for (const secret of secrets) {
      assert.ok(!logs.includes(secret), `a secret (${secret.slice(0, 12)}…) is in the logs`);
      for (const b of bodies)
        assert.ok(!b.includes(secret) || b === created.text, `a secret (${secret.slice(0, 12)}…) is in an answer: ${b.slice(0, 200)}`);
    }
    assert.match(logs, /api_key=\[redacted\]&type=text_generation/);
    assert.match(logs, /"upstream_error":"\{\\"error\\":\{\\"message\\":\\"Incorrect API key provided: \[redacted\]/);
  });

  it('scrubs an upstream key it is sent back in any form, restricts key variables, and keeps private ids off /metrics', async () => {
    const KEY = 'sk-upstream-quoted-9d8c7b6a5f4e3d2c1b0a';
    const escaped = [...KEY].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('');
    const basic = Buffer.from(`user:${KEY}`).toString('base64');
    let lastAuthorization: string | undefined;
    // Each upstream model quotes the key it was sent in another way.
    const upstream = await fixture((req, res) => {
      let raw = '';
      req.on('data', (c: Buffer) => {
        raw += c.toString();
      });
      req.on('end', () => {
        lastAuthorization = req.headers.authorization;
        const sent = String(req.headers.authorization ?? '').slice(7);
        const { model, stream } = JSON.parse(raw) as { model: string; stream?: boolean };
        const sse = () => res.writeHead(200, { 'content-type': 'text/event-stream' });
        switch (model) {
          case 'err200':
            res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: `bad key ${sent}` } }));
            break;
          case 'errframe':
            sse();
            res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
            res.end(`data: ${JSON.stringify({ error: { message: `stream failed for ${sent}` } })}\n\n`);
            break;
          case 'escaped401':
            res
              .writeHead(401, { 'content-type': 'application/json' })
              .end(`{"error":{"message":"Incorrect API key provided: ${escaped}"}}`);
            break;
          case 'percent':
            res.writeHead(401, { 'content-type': 'text/plain' }).end(`denied: ${encodeURIComponent(sent).replace(/-/g, '%2D')}`);
            break;
          case 'echo': {
            // The key split across deltas, and base64 as Basic auth would carry it.
            sse();
            const cut = [sent.slice(0, 7), sent.slice(7, 19), sent.slice(19)];
            res.write(chunkFrame({ role: 'assistant', content: 'your key is ' }));
            for (const part of cut) res.write(chunkFrame({ content: part }));
            res.write(chunkFrame({ content: ` and Basic ${basic} bye` }, 'stop'));
            res.end('data: [DONE]\n\n');
            break;
          }
          case 'dupkey':
            // A repeated key: JSON.parse keeps the last value, so the key in the first one is in the
            // text only (the fast lane must not pass the upstream's text on for a keyed deployment).
            res
              .writeHead(200, { 'content-type': 'application/json' })
              .end(
                `{"model":"dupkey","choices":[{"index":0,"message":{"role":"assistant","content":"${sent}","content":"fine"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
              );
            break;
          default:
            if (stream) {
              sse();
              res.end(`${chunkFrame({ role: 'assistant', content: 'fine' }, 'stop')}data: [DONE]\n\n`);
            } else {
              res.writeHead(200, { 'content-type': 'application/json' }).end(
                JSON.stringify({
                  choices: [{ index: 0, message: { role: 'assistant', content: 'fine' }, finish_reason: 'stop' }],
                  usage: { prompt_tokens: 1, completion_tokens: 1 },
                }),
              );
            }
        }
      });
    });
    closers.push(() => upstream.close());
    const dir = tempDir();
    closers.push(async () => rmSync(dir, { recursive: true, force: true }));
    const kinds = ['err200', 'errframe', 'escaped401', 'percent', 'echo', 'plain', 'dupkey'];
    const config = join(dir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        defaultCatalogue: false,
        models: [
          ...kinds.map((k) => ({ id: `meta-llama/${k}`, context_length: 512 })),
          { id: 'meta-llama/acme-secret-finetune', context_length: 512, visibility: 'private', owned_by: 'acme' },
        ],
        deployments: [
          ...kinds.map((k) => ({ model: `meta-llama/${k}`, baseUrl: upstream.url, apiKeyEnv: 'UPSTREAM_KEY', upstreamModel: k })),
          { model: 'meta-llama/acme-secret-finetune', baseUrl: upstream.url, upstreamModel: 'plain' },
        ],
      }),
    );
    const admin = 'sk-test-admin-scrub-logs-0123456789';
    const p = await startProcess({
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ADMIN_KEY: admin,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_LOG_LEVEL: 'trace',
      SWITCHYARD_CONFIG: config,
      UPSTREAM_KEY: KEY,
      SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1',
      SWITCHYARD_CATALOGUE_REFRESH_MS: '200',
      SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1',
    });
    closers.push(async () => {
      p.child.kill('SIGKILL');
    });
    const ask = (k: string, stream = false) =>
      http(p.url, 'POST', '/v1/chat/completions', {
        key: admin,
        body: { model: `meta-llama/${k}`, messages: [{ role: 'user', content: 'hi' }], stream },
      });
    const bodies: string[] = [];
    for (const k of ['err200', 'escaped401', 'percent']) {
      const r = await ask(k);
      assert.ok(r.status >= 400, `${k}: ${r.text}`);
      // A 401 is not passed on at all (the deployment's credentials were refused); the others redacted.
      assert.match(r.text, k === 'err200' ? /\[redacted\]/ : /refused this gateway's credentials/, k);
      bodies.push(r.text);
    }
    for (const k of ['errframe', 'echo']) {
      const r = await ask(k, true);
      bodies.push(r.text);
    }
    assert.match(bodies[4]!, /your key is /);
    assert.match(bodies[4]!, /\[redacted\]/);
    assert.match(bodies[4]!, / bye/);
    const dup = await ask('dupkey');
    assert.equal(dup.status, 200, dup.text);
    assert.equal((JSON.parse(dup.text) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, 'fine');
    bodies.push(dup.text);
    // Stored with a background response, and read back.
    const bg = await http<{ id: string }>(p.url, 'POST', '/v1/responses', {
      key: admin,
      body: { model: 'meta-llama/errframe', input: 'hi', background: true },
    });
    let stored = await http<{ status: string }>(p.url, 'GET', `/v1/responses/${bg.json.id}`, { key: admin });
    for (const deadline = Date.now() + 5000; stored.json.status !== 'failed' && Date.now() < deadline;)
      stored = await http(p.url, 'GET', `/v1/responses/${bg.json.id}`, { key: admin });
    assert.equal(stored.json.status, 'failed');
    bodies.push(stored.text);
    for (const b of bodies) {
      assert.ok(!b.includes(KEY), `the upstream key reached a client: ${b.slice(0, 300)}`);
      assert.ok(!b.includes(basic.slice(4, -4)), 'the key reached a client in base64');
      assert.ok(
        !b.includes(escaped.slice(0, 30)) && !b.includes(encodeURIComponent(KEY).replace(/-/g, '%2D')),
        'the key reached a client escaped',
      );
    }
    const sqlite = new SqliteDatabase(join(dir, 'switchyard.db'), { readonly: true });
    const rows = sqlite.prepare('select body from responses').all() as Array<{ body: string }>;
    sqlite.close();
    assert.ok(rows.length > 0 && rows.every((r) => !r.body.includes(KEY)), 'the key is not in the database');

    // api_key_env may only name variables meant for upstream keys.
    for (const name of ['SWITCHYARD_ADMIN_KEY', 'DATABASE_URL', 'PATH', 'UPSTREAM_KEY']) {
      const r = await http(p.url, 'POST', '/admin/deployments', {
        key: admin,
        body: { model: 'meta-llama/plain', base_url: upstream.url, api_key_env: name },
      });
      assert.equal(r.status, 400, `${name}: ${r.text}`);
      assert.equal(r.json.error.param, 'api_key_env');
    }
    const okDep = await http(p.url, 'POST', '/admin/deployments', {
      key: admin,
      body: { model: 'meta-llama/plain', base_url: upstream.url, api_key_env: 'UPSTREAM_KEY_PLAIN' },
    });
    assert.equal(okDep.status, 201, okDep.text);
    // A row written some other way that names the admin key gets no key at all.
    const rw = new SqliteDatabase(join(dir, 'switchyard.db'));
    rw.prepare(
      "insert into deployments (id, model, base_url, api_key_env, upstream_model, weight, api, created_at) values ('dep_sneaky', 'meta-llama/err200', ?, 'SWITCHYARD_ADMIN_KEY', 'plain', 1000000, 'chat', 1)",
    ).run(upstream.url);
    rw.close();
    const deadline = Date.now() + 5000;
    let sawSneaky = false;
    while (!sawSneaky && Date.now() < deadline) {
      const list = await http<{ data: Array<{ id: string }> }>(p.url, 'GET', '/admin/deployments', { key: admin });
      sawSneaky = list.json.data.some((d) => d.id === 'dep_sneaky');
    }
    assert.ok(sawSneaky);
    lastAuthorization = 'unset';
    for (let i = 0; i < 5 && lastAuthorization !== undefined; i++) await ask('err200');
    assert.equal(lastAuthorization, undefined, 'no authorization header: the admin key was not sent');

    // Credential-shaped values in URLs, wherever they are.
    const created = await http<WireKey>(p.url, 'POST', '/admin/keys', { key: admin, body: { org: 'acme', name: 'urls' } });
    const userKey = created.json.key!;
    for (const path of [
      `/v1/models?k=${userKey}`,
      `/v1/models?${userKey}`,
      `/v1/models/${userKey}`,
      `/v1/models?q=${encodeURIComponent(userKey)}`,
    ]) {
      await http(p.url, 'GET', path, { key: userKey });
    }

    // Private models: the owner uses it, an unauthenticated scrape never sees its id.
    const own = await http(p.url, 'POST', '/v1/chat/completions', {
      key: userKey,
      body: { model: 'meta-llama/acme-secret-finetune', messages: [{ role: 'user', content: 'hi' }] },
    });
    assert.equal(own.status, 200, own.text);
    const scrape = (await http(p.url, 'GET', '/metrics')).text;
    assert.ok(!scrape.includes('acme-secret-finetune'), 'a private model id is on the open /metrics');
    assert.match(scrape, /switchyard_requests_total\{route="\/v1\/chat\/completions",model="private",status="200"\}/);

    p.child.kill('SIGTERM');
    await p.exited;
    const logs = p.stdout();
    for (const secret of [KEY, userKey, admin]) assert.ok(!logs.includes(secret), `a secret (${secret.slice(0, 12)}…) is in the logs`);
    assert.ok(!logs.includes(encodeURIComponent(userKey)) || !userKey.includes('-'), 'escaped key in the logs');
    assert.ok(!logs.includes(userKey.slice(6, 30)), 'part of a key is in the logs');
  });
});

/**
 * A hostile pass's ways to get a deployment's key out of Switchyard: a stream the client cuts short
 * mid-key (max_tokens, a stop string), the key as a member name, an error message longer than what
 * is passed on, and an answer nested past what can be serialized.
 */
describe('an upstream key stays out of answers cut short, member names, long errors', () => {
  const c = closers();
  const KEY = 'sk-upstream-walked-0a1b2c3d4e5f6a7b';
  let url: string;
  let key: string;

  before(async () => {
    const upstream = c.keep(
      await jsonFixture<{ messages: Array<{ content: string }>; stream?: boolean }>((body, res, req) => {
        const sent = String(req.headers.authorization ?? '').slice(7);
        const mode = body.messages.at(-1)!.content;
        const json = (status: number, text: string) => res.writeHead(status, { 'content-type': 'application/json' }).end(text);
        if (mode === 'echo') {
          // The key one character per delta: a client choosing max_tokens chooses where it is cut.
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(chunkFrame({ role: 'assistant', content: 'your key is ' }));
          for (const ch of sent) res.write(chunkFrame({ content: ch }));
          res.end(`${chunkFrame({ content: ' ok' }, 'stop')}data: [DONE]\n\n`);
        } else if (mode === 'name') {
          json(
            200,
            `{"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1},"extra":{"${sent}":"${sent}"}}`,
          );
        } else if (mode === 'long') {
          json(400, JSON.stringify({ error: { message: `${'x'.repeat(480)}${sent}` } }));
        } else if (mode === 'deep') {
          json(
            200,
            `{"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}],"x":${'['.repeat(5000)}${']'.repeat(5000)}}`,
          );
        }
      }),
    );
    const server = c.keep(
      await startServer({
        modelsDir: tempDir(),
        env: { WALKED_KEY: KEY, SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1' },
        configFile: {
          name: 'k.json',
          text: JSON.stringify({
            models: [
              { id: 'qwen/keyed', context_length: 4096 },
              { id: 'qwen/keyless', context_length: 4096 },
            ],
            deployments: [
              { model: 'qwen/keyed', baseUrl: upstream.url, apiKeyEnv: 'WALKED_KEY' },
              { model: 'qwen/keyless', baseUrl: upstream.url },
            ],
          }),
        },
      }),
    );
    url = server.url;
    key = (await createKey(server, 'walkers')).key;
  });
  after(() => c.closeAll());

  it('a stream cut at any max_tokens or by a stop string ends without the start of the key', async () => {
    const texts: string[] = [];
    for (let max = 4; max <= 16; max++) {
      const r = await http(url, 'POST', '/v1/chat/completions', {
        key,
        body: { model: 'qwen/keyed', stream: true, max_tokens: max, messages: [{ role: 'user', content: 'echo' }] },
      });
      assert.equal(r.status, 200);
      texts.push(
        r.text
          .split('\n')
          .filter((l) => l.startsWith('data: {'))
          .map((l) => (JSON.parse(l.slice(6)) as { choices: Array<{ delta?: { content?: string } }> }).choices[0]?.delta?.content ?? '')
          .join(''),
      );
    }
    // More than four stop strings: applied by Switchyard, here one that cuts the key in the middle.
    const stopped = await http(url, 'POST', '/v1/messages', {
      key,
      body: {
        model: 'qwen/keyed',
        max_tokens: 200,
        stop_sequences: ['a1', 'a2', 'a3', 'a4', KEY.slice(12)],
        messages: [{ role: 'user', content: 'echo' }],
      },
    });
    assert.equal(stopped.status, 200, stopped.text);
    texts.push(stopped.text);
    for (const t of texts) assert.ok(!t.includes(KEY.slice(0, 4)), `the start of the key went out: ${t}`);
    // Cuts fell inside the key: what was held back went out redacted.
    assert.ok(
      texts.some((t) => t.startsWith('your key is [redacted]')),
      texts.join(' | '),
    );
  });

  it('the key as a member name, past the length of an error message, or an answer nested past serializing', async () => {
    const ask = (model: string, content: string) =>
      http(url, 'POST', '/v1/chat/completions', { key, body: { model, messages: [{ role: 'user', content }] } });
    const named = await ask('qwen/keyed', 'name');
    assert.equal(named.status, 200, named.text);
    assert.ok(!named.text.includes(KEY));
    const long = await ask('qwen/keyed', 'long');
    assert.equal(long.status, 400);
    assert.ok(!long.text.includes(KEY.slice(0, 8)), long.text);
    for (const model of ['qwen/keyed', 'qwen/keyless']) {
      const deep = await ask(model, 'deep');
      assert.equal(deep.status, 502, deep.text);
      assert.equal(deep.json.error.code, 'upstream_error');
      assert.match(deep.json.error.message, /nested deeper than 512 levels/);
    }
  });
});
