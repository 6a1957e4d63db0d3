import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { http, tempDir, type WireKey } from './helpers/server.js';
import { startProcess, type Running } from './helpers/process.js';
import { fixture } from './helpers/fixtures.js';

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
      res.writeHead(401, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { message: `Incorrect API key provided: ${String(req.headers.authorization).slice(7)}` } }));
    });
    closers.push(() => upstream.close());
    const config = join(dataDir, 'config.json');
    writeFileSync(config, JSON.stringify({
      defaultCatalogue: false,
      models: [{ id: MODEL, name: 'TinyStories via upstream', context_length: 512 }],
      deployments: [{ model: MODEL, baseUrl: upstream.url, apiKeyEnv: 'UPSTREAM_KEY' }],
    }));
    proc = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir, SWITCHYARD_ADMIN_KEY: ADMIN, SWITCHYARD_WORKERS: '1', SWITCHYARD_LOG_LEVEL: 'trace',
      SWITCHYARD_CONFIG: config, UPSTREAM_KEY: UPSTREAM_SECRET,
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
    const upstreamAnswer = JSON.parse(bodies[6]!) as { error: { message: string } };
    assert.match(upstreamAnswer.error.message, /Incorrect API key provided: \[redacted\]/, 'the upstream error is passed on, without the credential');

    proc.child.kill('SIGTERM');
    await proc.exited;
    const logs = proc.stdout();
    assert.ok(logs.split('\n').filter((l) => l.includes('"msg":"request"')).length >= calls.length, 'the access log ran');
    for (const secret of secrets) {
      assert.ok(!logs.includes(secret), `a secret (${secret.slice(0, 12)}…) is in the logs`);
      for (const b of bodies) assert.ok(!b.includes(secret) || b === created.text, `a secret (${secret.slice(0, 12)}…) is in an answer: ${b.slice(0, 200)}`);
    }
    assert.match(logs, /api_key=\[redacted\]&type=text_generation/);
  });
});
