import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import type { ServerResponse } from 'node:http';
import { http, startServer, tempDir, type TestServer } from './helpers/server.js';
import { GATEWAY_MODEL as MODEL, chunkFrame, closers, fixture, startGateway } from './helpers/fixtures.js';
import { sendRaw } from './helpers/fuzz-cases.js';

const ask = { model: MODEL, messages: [{ role: 'user' as const, content: 'Once upon a time' }] };


/** Opens a stream through the gateway on a raw socket; resolves once the first bytes arrived. */
function openStream(s: TestServer, body: object): Promise<{ socket: ReturnType<typeof connect>; received: () => number }> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    const json = JSON.stringify(body);
    let bytes = 0;
    socket.once('data', (d: Buffer) => {
      bytes += d.length;
      socket.on('data', (more: Buffer) => { bytes += more.length; });
      resolve({ socket, received: () => bytes });
    });
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${s.adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(json)}\r\n\r\n${json}`);
  });
}

describe('hardening', () => {
  const open = closers();
  after(() => open.closeAll());
  const keep = open.keep;

  it('refuses request heads over the limit with 431 in the envelope', async () => {
    const s = keep(await startServer({ env: { SWITCHYARD_MAX_HEADER_BYTES: '4096' } }));
    const r = await sendRaw(Number(new URL(s.url).port), Buffer.from(`GET /v1/models HTTP/1.1\r\nhost: x\r\nx-pad: ${'a'.repeat(8000)}\r\n\r\n`));
    assert.equal(r.status, 431);
    assert.equal((JSON.parse(r.body) as { error: { code: string } }).error.code, 'request_header_too_large');
    assert.ok(r.headers.get('x-request-id'));
    assert.equal((await http(s.url, 'GET', '/v1/models', { key: s.adminKey, headers: { 'x-pad': 'a'.repeat(2000) } })).status, 200);
  });

  it('refuses upstream URLs that reach internal addresses unless allowed, when set and on connect', async () => {
    let hits = 0;
    const internal = keep(await fixture((req, res) => {
      hits += 1;
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"message":{"content":"leak"}}]}');
    }));
    const s = keep(await startGateway([{ baseUrl: 'http://203.0.113.1/v1' }]));
    for (const base of [internal.url, 'http://169.254.169.254/latest', 'http://[::1]:8080/v1', 'http://10.1.2.3/v1', 'http://localhost:9/v1', 'http://[::ffff:127.0.0.1]/v1', 'http://user:pw@203.0.113.5/v1']) {
      const r = await http(s.url, 'POST', '/admin/deployments', { key: s.adminKey, body: { model: MODEL, base_url: base } });
      assert.equal(r.status, 400, `${base}: ${r.text}`);
      assert.equal(r.json.error.param, 'base_url');
    }
    assert.equal((await http(s.url, 'POST', '/admin/deployments', { key: s.adminKey, body: { model: MODEL, base_url: 'http://203.0.113.7/v1' } })).status, 201);

    // A stored deployment that points inside (written before the policy, or by another instance) is refused on connect.
    await s.service.store.createDeployment({ id: 'dep_inside', model: MODEL, base_url: internal.url, api_key_env: null, upstream_model: null, weight: 1e9, api: 'chat', created_at: 1 });
    const guarded = keep(await startServer({ modelsDir: tempDir(), dataDir: s.dataDir, env: { SWITCHYARD_ADMIN_KEY: s.adminKey, SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1' } }));
    const refused = await http(guarded.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...ask, max_tokens: 2 } });
    assert.equal(refused.status, 502, refused.text);
    assert.equal(refused.json.error.code, 'upstream_unreachable');
    assert.equal(hits, 0, 'no connection reached the internal address');

    const allowed = keep(await startServer({ modelsDir: tempDir(), dataDir: s.dataDir, env: { SWITCHYARD_ADMIN_KEY: s.adminKey, SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.0/8', SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1' } }));
    const ok = await http(allowed.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...ask, max_tokens: 2 } });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(hits, 1);
  });

  it('sheds load beyond the in-flight limit with 503 and retry-after, and recovers', async () => {
    const holds = keep(await fixture((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
    }));
    const s = keep(await startGateway([{ baseUrl: holds.url }], { SWITCHYARD_MAX_IN_FLIGHT: '2' }));
    const a = await openStream(s, { ...ask, stream: true });
    const b = await openStream(s, { ...ask, stream: true });
    const shed = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(shed.status, 503);
    assert.equal(shed.json.error.code, 'overloaded');
    assert.equal(shed.headers['retry-after'], '1');
    assert.equal((await http(s.url, 'GET', '/healthz')).status, 200, 'probes are still answered');
    a.socket.destroy();
    b.socket.destroy();
    await new Promise((r) => setTimeout(r, 50));
    const after = await http(s.url, 'GET', '/v1/models', { key: s.adminKey });
    assert.equal(after.status, 200);
    assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_shed_total\{reason="in_flight"\} 1/);
  });

  it('reads an endless upstream only as fast as a slow client takes it', async () => {
    let written = 0;
    let upstreamClosed = false;
    const endless = keep(await fixture((req, res: ServerResponse) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const frame = chunkFrame({ content: 'x'.repeat(1000) });
      const pump = () => {
        while (!res.destroyed) {
          written += frame.length;
          if (!res.write(frame)) return void res.once('drain', pump);
        }
      };
      res.on('close', () => { upstreamClosed = true; });
      pump();
    }));
    const s = keep(await startGateway([{ baseUrl: endless.url }]));
    const client = await openStream(s, { ...ask, stream: true });
    client.socket.pause();
    await new Promise((r) => setTimeout(r, 1500));
    const stalled = written;
    await new Promise((r) => setTimeout(r, 1000));
    // Socket buffers on both hops hold a few MB at most; without backpressure this would be gigabytes.
    assert.ok(written < 32 * 1024 * 1024, `upstream wrote ${written} bytes to a client that reads nothing`);
    assert.ok(written - stalled < 1024 * 1024, `still pulling from the upstream while the client is stalled: ${written - stalled} bytes`);
    console.log(`# slow client: the upstream got ${(written / 1e6).toFixed(1)} MB out in 2.5 s to a client reading nothing (${((written - stalled) / 1e3).toFixed(0)} kB in the last second)`);
    client.socket.resume();
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(written > stalled, 'reading resumes when the client does');
    client.socket.destroy();
    const gone = Date.now();
    while (!upstreamClosed && Date.now() - gone < 2000) await new Promise((r) => setTimeout(r, 5));
    assert.ok(upstreamClosed);
  });

  it('closes the upstream request within 100 ms of a client disconnect, streamed or not', async () => {
    const closedAt: number[] = [];
    const slow = keep(await fixture((req, res) => {
      req.resume();
      res.on('close', () => closedAt.push(Date.now()));
      if (req.headers.accept === 'text/event-stream') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
      }
      // Non-stream: never answers, like a long generation.
    }));
    const s = keep(await startGateway([{ baseUrl: slow.url }]));

    const streamed = await openStream(s, { ...ask, stream: true });
    const streamedGone = Date.now();
    let gone = streamedGone;
    streamed.socket.destroy();
    while (closedAt.length < 1 && Date.now() - gone < 2000) await new Promise((r) => setTimeout(r, 2));
    assert.equal(closedAt.length, 1);
    assert.ok(closedAt[0]! - gone <= 100, `stream: upstream closed after ${closedAt[0]! - gone} ms`);

    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    const json = JSON.stringify(ask);
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${s.adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${json.length}\r\n\r\n${json}`);
    await new Promise((r) => setTimeout(r, 300));
    gone = Date.now();
    socket.destroy();
    while (closedAt.length < 2 && Date.now() - gone < 2000) await new Promise((r) => setTimeout(r, 2));
    assert.equal(closedAt.length, 2);
    assert.ok(closedAt[1]! - gone <= 100, `non-stream: upstream closed after ${closedAt[1]! - gone} ms`);
    console.log(`# disconnect: upstream request closed ${closedAt[0]! - streamedGone} ms (stream) and ${closedAt[1]! - gone} ms (non-stream) after the client left`);
  });
});
