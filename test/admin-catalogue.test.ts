import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createKey, http, startServer, tempDir, type TestServer, type WireList, type WireModel } from './helpers/server.js';

interface WireDeployment {
  id: string;
  model: string;
  base_url: string;
  api: string;
  source: string;
  weight: number;
}

/** A Switchyard with no models of its own (`gateway`) that may call another (`upstream`) with the key in UPSTREAM_KEY_A. */
async function gatewayAndUpstream(): Promise<{ upstream: TestServer; gateway: TestServer; close(): Promise<void> }> {
  const upstream = await startServer();
  const upstreamKey = (await createKey(upstream, 'downstream')).key;
  const gateway = await startServer({ modelsDir: tempDir(), env: { UPSTREAM_KEY_A: upstreamKey, SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1' } });
  return {
    upstream,
    gateway,
    close: async () => {
      await gateway.close();
      await upstream.close();
    },
  };
}

describe('administering the catalogue and deployments', () => {
  let a: TestServer;
  let b: TestServer;
  let close: () => Promise<void>;
  before(async () => {
    ({ upstream: a, gateway: b, close } = await gatewayAndUpstream());
  });
  after(() => close());

  const ask = (model: string) =>
    http(b.url, 'POST', '/v1/chat/completions', {
      key: b.adminKey,
      body: { model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 6, temperature: 0 },
    });

  it('adds and removes an upstream deployment at run time', async () => {
    const created = await http<WireModel>(b.url, 'POST', '/admin/models', {
      key: b.adminKey,
      body: {
        id: 'meta-llama/tiny-remote',
        context_length: 512,
        pricing: [
          { metric: 'input_tokens', rate: 0.1 },
          { metric: 'output_tokens', rate: 0.2 },
        ],
      },
    });
    assert.equal(created.status, 201, created.text);
    assert.equal((await ask('meta-llama/tiny-remote')).status, 503, 'no deployment yet');

    const dep = await http<WireDeployment>(b.url, 'POST', '/admin/deployments', {
      key: b.adminKey,
      body: { model: 'meta-llama/tiny-remote', base_url: a.baseURL, api_key_env: 'UPSTREAM_KEY_A', upstream_model: 'local/stories260k' },
    });
    assert.equal(dep.status, 201, dep.text);
    assert.match(dep.json.id, /^dep_/);
    assert.ok(!dep.text.includes('sk-'), 'no key in the reply, only the variable name');
    assert.equal((dep.json as { warning?: string }).warning, undefined);
    const ok = await ask('meta-llama/tiny-remote');
    assert.equal(ok.status, 200, ok.text);
    assert.match(ok.text, /there was a little/);
    // `available` is whether it serves now: not while inactive, whatever deployments it has.
    const status = async (s: string) =>
      (
        await http<WireModel & { available: boolean }>(b.url, 'PATCH', '/admin/models/meta-llama/tiny-remote', {
          key: b.adminKey,
          body: { status: s },
        })
      ).json;
    assert.deepEqual([(await status('inactive')).available, (await status('active')).available], [false, true]);

    // A key variable this server does not have: made, and the reply (and the list) says so.
    const unset = await http<WireDeployment & { warning?: string }>(b.url, 'POST', '/admin/deployments', {
      key: b.adminKey,
      body: { model: 'meta-llama/tiny-remote', base_url: a.baseURL, api_key_env: 'UPSTREAM_KEY_NOT_SET', weight: 0.001 },
    });
    assert.equal(unset.status, 201, unset.text);
    assert.match(unset.json.warning ?? '', /api_key_env 'UPSTREAM_KEY_NOT_SET' is not set in this server's environment/);
    const withWarning = await http<WireList<WireDeployment & { warning?: string }>>(b.url, 'GET', '/admin/deployments', {
      key: b.adminKey,
    });
    assert.match(withWarning.json.data.find((d) => d.id === unset.json.id)?.warning ?? '', /not set/);
    const up = (id: string) => `switchyard_deployment_up{deployment="${id}"}`;
    assert.ok((await http(b.url, 'GET', '/metrics')).text.includes(up(unset.json.id)));
    assert.equal((await http(b.url, 'DELETE', `/admin/deployments/${unset.json.id}`, { key: b.adminKey })).status, 200);
    // Its health series goes with it: a deleted deployment is not reported up.
    assert.ok(!(await http(b.url, 'GET', '/metrics')).text.includes(up(unset.json.id)));
    assert.ok((await http(b.url, 'GET', '/metrics')).text.includes(up(dep.json.id)));

    const listed = await http<WireList<WireDeployment>>(b.url, 'GET', '/admin/deployments', { key: b.adminKey });
    assert.deepEqual(
      listed.json.data.map((d) => [d.id, d.model, d.source]),
      [[dep.json.id, 'meta-llama/tiny-remote', 'admin']],
    );

    const bad = await http(b.url, 'POST', '/admin/deployments', {
      key: b.adminKey,
      body: { model: 'meta-llama/none', base_url: a.baseURL },
    });
    assert.equal(bad.status, 404);

    assert.equal((await http(b.url, 'DELETE', `/admin/deployments/${dep.json.id}`, { key: b.adminKey })).status, 200);
    assert.equal((await ask('meta-llama/tiny-remote')).status, 503);
  });

  it('moves model status only along the documented transitions', async () => {
    await http(b.url, 'POST', '/admin/models', { key: b.adminKey, body: { id: 'qwen/lifecycle', context_length: 100, status: 'pending' } });
    const move = (status: string) => http<WireModel>(b.url, 'PATCH', '/admin/models/qwen/lifecycle', { key: b.adminKey, body: { status } });
    assert.equal((await move('active')).status, 200);
    assert.equal((await move('pending')).status, 400, 'active does not go back to pending');
    assert.equal((await move('deleted')).status, 200);
    // A deleted model takes no deployment: it would serve nothing (a newcomer's README walk made one).
    const onDeleted = await http(b.url, 'POST', '/admin/deployments', {
      key: b.adminKey,
      body: { model: 'qwen/lifecycle', base_url: 'https://upstream.example/v1' },
    });
    assert.equal(onDeleted.status, 400, onDeleted.text);
    assert.match(onDeleted.text, /is deleted/);
    // Created again, it says how it comes back (it is not listed, but its id is kept).
    const again = await http(b.url, 'POST', '/admin/models', { key: b.adminKey, body: { id: 'qwen/lifecycle', context_length: 100 } });
    assert.equal(again.status, 409);
    assert.match(again.text, /was deleted: set its status to inactive/);
    const revive = await move('active');
    assert.equal(revive.status, 400, 'a deleted model comes back as inactive first');
    assert.match(revive.text, /inactive/);
    assert.equal((await move('inactive')).json.status, 'inactive');
    assert.equal((await move('active')).json.status, 'active');
    const pricing = await http<WireModel>(b.url, 'PATCH', '/admin/models/qwen/lifecycle', {
      key: b.adminKey,
      body: { visibility: 'private', owned_by: 'acme', pricing: [{ metric: 'input_tokens', rate: 0.5 }] },
    });
    assert.equal(pricing.json.visibility, 'private');
    assert.deepEqual(pricing.json.pricing, [{ metric: 'input_tokens', rate: 0.5 }]);
  });
});

describe('an open /metrics scrape and a model made private', () => {
  let up: TestServer;
  let s: TestServer;
  let close: () => Promise<void>;
  before(async () => {
    ({ upstream: up, gateway: s, close } = await gatewayAndUpstream());
  });
  after(() => close());

  it("stops naming the model and shows what it counted as private's (an outside pass found it still named)", async () => {
    const model = 'qwen/stories-remote';
    assert.equal((await http(s.url, 'POST', '/admin/models', { key: s.adminKey, body: { id: model, context_length: 512 } })).status, 201);
    const dep = await http(s.url, 'POST', '/admin/deployments', {
      key: s.adminKey,
      body: { model, base_url: up.baseURL, api_key_env: 'UPSTREAM_KEY_A', upstream_model: 'local/stories260k' },
    });
    assert.equal(dep.status, 201, dep.text);
    const ask = () =>
      http(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model, messages: [{ role: 'user', content: 'Once' }], max_tokens: 2 },
      });
    assert.equal((await ask()).status, 200);
    const before = (await http(s.url, 'GET', '/metrics')).text;
    assert.match(before, /switchyard_requests_total\{route="\/v1\/chat\/completions",model="qwen\/stories-remote",status="200"\} 1/);
    assert.equal((await http(s.url, 'POST', '/admin/orgs', { key: s.adminKey, body: { id: 'owner', name: 'Owner' } })).status, 201);
    const made = await http<WireModel>(s.url, 'PATCH', `/admin/models/${model}`, {
      key: s.adminKey,
      body: { visibility: 'private', owned_by: 'owner' },
    });
    assert.equal(made.json.visibility, 'private', made.text);
    // One request more, counted as private's from the start; the one before is shown there too.
    assert.equal((await ask()).status, 200);
    const after = (await http(s.url, 'GET', '/metrics')).text;
    assert.ok(
      !after.includes('stories-remote'),
      after
        .split('\n')
        .filter((l) => l.includes('stories-remote'))
        .join('\n'),
    );
    assert.match(after, /switchyard_requests_total\{route="\/v1\/chat\/completions",model="private",status="200"\} 2/);
    assert.match(after, /switchyard_request_duration_seconds_count\{route="\/v1\/chat\/completions",model="private",status="200"\} 2/);
    assert.match(after, /switchyard_tokens_total\{model="private",kind="output"\} 4/);
    // Each label set once: the series added up, not written twice.
    const lines = after.split('\n').filter((l) => l.startsWith('switchyard_request_duration_seconds_count{route="/v1/chat/completions"'));
    assert.equal(new Set(lines.map((l) => l.slice(0, l.lastIndexOf(' ')))).size, lines.length);
  });
});
