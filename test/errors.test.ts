import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { connect } from 'node:net';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { request } from 'undici';
import { createKey, http, startServer, type Envelope, type HttpResult, type TestServer } from './helpers/server.js';

function assertEnvelope(res: HttpResult<Envelope>, status: number, code: string): void {
  assert.equal(res.status, status, res.text);
  assert.match(String(res.headers['content-type']), /^application\/json/);
  assert.match(String(res.headers['x-request-id']), /^req_/);
  assert.deepEqual(Object.keys(res.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(res.json.error.code, code);
  assert.ok(res.json.error.message.length > 0);
}

describe('error contract', () => {
  let server: TestServer;
  let key: string;

  before(async () => {
    server = await startServer({ env: { SWITCHYARD_BODY_LIMIT: '4096' } });
    key = (await createKey(server, 'acme')).key;
  });
  after(() => server.close());

  it('answers malformed JSON with 400 invalid_json', async () => {
    for (const body of ['{"org": "acme",', 'not json', '{"a":1}}']) {
      const res = await http(server.url, 'POST', '/admin/keys', { key: server.adminKey, body });
      assertEnvelope(res, 400, 'invalid_json');
      // The parser's reason, which says where it stopped.
      assert.match(res.json.error.message, /^The request body is not valid JSON: .*(position|end of JSON|Unexpected)/);
    }
    const empty = await http(server.url, 'POST', '/admin/keys', {
      key: server.adminKey,
      body: '',
      headers: { 'content-type': 'application/json' },
    });
    assertEnvelope(empty, 400, 'invalid_json');
    // Valid JSON with a prototype-poisoning key is refused too.
    const proto = await http(server.url, 'POST', '/admin/orgs', { key: server.adminKey, body: '{"id":"x","__proto__":{"admin":true}}' });
    assertEnvelope(proto, 400, 'invalid_json');
    assert.match(proto.json.error.message, /'__proto__' key/);
  });

  it('answers a compressed body with 415, not as JSON it cannot read', async () => {
    const res = await http(server.url, 'POST', '/admin/orgs', {
      key: server.adminKey,
      body: gzipSync('{"id":"zipped"}'),
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
    });
    assertEnvelope(res, 415, 'unsupported_media_type');
    assert.match(res.json.error.message, /Content-Encoding 'gzip'/);
  });

  it('parses JSON sent without a JSON content type (curl -d, text/plain)', async () => {
    for (const [id, type] of [
      ['form-sender', 'application/x-www-form-urlencoded'],
      ['text-sender', 'text/plain'],
      ['text-utf8-sender', 'text/plain; charset=utf-8'],
    ] as const) {
      const res = await http(server.url, 'POST', '/admin/orgs', {
        key: server.adminKey,
        body: `{"id":"${id}"}`,
        headers: { 'content-type': type },
      });
      assert.equal(res.status, 201, `${type}: ${res.text}`);
    }
  });

  it('answers wrong types and missing fields with 400 naming the parameter', async () => {
    const wrongType = await http(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: { org: 5, name: 'x' } });
    assertEnvelope(wrongType, 400, 'invalid_value');
    assert.equal(wrongType.json.error.param, 'org');
    const missing = await http(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: { org: 'acme' } });
    assertEnvelope(missing, 400, 'missing_required_parameter');
    assert.equal(missing.json.error.param, 'name');
    // A wrong type inside a nullable object is named where it is, not as the whole object.
    const fractional = await http(server.url, 'POST', '/admin/keys', {
      key: server.adminKey,
      body: { org: 'acme', name: 'x', limits: { rpm: 1.5 } },
    });
    assertEnvelope(fractional, 400, 'invalid_value');
    assert.equal(fractional.json.error.param, 'limits.rpm');
    assert.match(fractional.json.error.message, /expected integer/);
    const notObject = await http(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: '[1,2]' });
    assertEnvelope(notObject, 400, 'invalid_value');
    const nested = await http(server.url, 'POST', '/admin/models', {
      key: server.adminKey,
      body: { id: 'qwen/x', context_length: 10, pricing: [{ metric: 'input_tokens', rate: -1 }] },
    });
    assertEnvelope(nested, 400, 'invalid_value');
    assert.equal(nested.json.error.param, 'pricing[0].rate');
    // A literal past the double range is Infinity to JSON.parse: refused, not stored as null.
    for (const [path, body, param] of [
      ['/admin/keys', '{"org":"acme","name":"x","limits":{"rpm":1e309}}', 'limits.rpm'],
      ['/admin/orgs', '{"id":"huge","limits":{"budget":1e309}}', 'limits.budget'],
      ['/admin/models', '{"id":"qwen/x","context_length":1e309}', 'context_length'],
      ['/admin/models', '{"id":"qwen/x","context_length":10,"pricing":[{"metric":"input_tokens","rate":1e999}]}', 'pricing[0].rate'],
      [
        '/v1/chat/completions',
        '{"model":"local/stories260k","messages":[{"role":"user","content":"hi"}],"max_tokens":1e309}',
        'max_tokens',
      ],
      ['/v1/responses', '{"model":"local/stories260k","input":"hi","temperature":-1e309}', 'temperature'],
    ] as const) {
      const res = await http(server.url, 'POST', path, { key: server.adminKey, body });
      assertEnvelope(res, 400, 'invalid_value');
      assert.equal(res.json.error.param, param, res.text);
      assert.match(res.json.error.message, /beyond the range of a double/);
    }
  });

  it('answers unknown routes with 404', async () => {
    assertEnvelope(await http(server.url, 'GET', '/v1/nothing-here', { key }), 404, 'not_found');
    assertEnvelope(await http(server.url, 'POST', '/v2/chat', { key, body: {} }), 404, 'not_found');
    assertEnvelope(await http(server.url, 'GET', '/'), 404, 'not_found');
  });

  it('answers wrong methods with 405 and an Allow header', async () => {
    const res = await http(server.url, 'POST', '/v1/models', { key, body: {} });
    assertEnvelope(res, 405, 'method_not_allowed');
    assert.equal(res.headers['allow'], 'GET, HEAD');
    assertEnvelope(await http(server.url, 'PUT', '/admin/keys', { key: server.adminKey, body: {} }), 405, 'method_not_allowed');
    // Methods without any route (OPTIONS with CORS off, TRACE, and PROPFIND, which Fastify does not
    // route at all) on a fixed path: the same 405. On an unknown path, still a 404.
    for (const method of ['OPTIONS', 'TRACE', 'PROPFIND', 'SEARCH']) {
      const r = await request(`${server.url}/v1/models`, { method, headers: { authorization: `Bearer ${key}` } });
      const text = await r.body.text();
      assert.equal(r.statusCode, 405, `${method}: ${text}`);
      assert.equal(r.headers['allow'], 'GET, HEAD');
      assert.match(String(r.headers['x-request-id']), /^req_/);
      assert.equal((JSON.parse(text) as Envelope).error.code, 'method_not_allowed');
      const unknown = await request(`${server.url}/v1/nothing-here`, { method });
      await unknown.body.text();
      assert.equal(unknown.statusCode, 404, method);
    }
  });

  it('answers CONNECT with a 405 in the envelope instead of closing the connection without a word', async () => {
    const { connect } = await import('node:net');
    const url = new URL(server.url);
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(url.port), url.hostname, () =>
        socket.write('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'),
      );
      let text = '';
      socket.setEncoding('utf8');
      socket.on('data', (d: string) => (text += d));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    assert.match(answer, /^HTTP\/1\.1 405 /);
    assert.match(answer, /\r\nx-request-id: req_[0-9a-f]+\r\n/);
    assert.match(answer, /\r\nallow: GET, HEAD, POST, PUT, PATCH, DELETE\r\n/);
    const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as Envelope;
    assert.equal(body.error.code, 'method_not_allowed');
    // The server goes on serving.
    assert.equal((await http(server.url, 'GET', '/v1/models', { key })).status, 200);
  });

  it('answers a method a path with a parameter lacks with 404, not a 405 naming the pattern', async () => {
    // `POST /v1/responses/<anything>` is not a path this server has, whatever `<anything>` is.
    for (const [method, path] of [
      ['DELETE', '/v1/models/local/stories260k'],
      ['POST', '/v1/responses/resp_123'],
      ['PATCH', '/v1/responses/resp_123'],
      ['POST', '/v1/conversations/conv_1/items/msg_1'],
    ] as const) {
      const res = await http(server.url, method, path, { key, body: {} });
      assertEnvelope(res, 404, 'not_found');
      assert.match(String((res.json as { error: { message: string } }).error.message), new RegExp(`${method} ${path}`));
    }
  });

  it('answers bodies over the configured limit with 413', async () => {
    const big = JSON.stringify({ org: 'acme', name: 'x'.repeat(8000) });
    assertEnvelope(await http(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: big }), 413, 'request_too_large');
  });

  it('reads the rest of a body over the limit, so a client still sending gets the 413 and keeps its connection', async () => {
    // Answered before the body has arrived: closing then, with the client's bytes unread, made the
    // kernel reset the connection and the SDKs report a connection error instead of the 413.
    const total = 4 << 20;
    const socket = connect(Number(new URL(server.url).port), '127.0.0.1');
    let received = '';
    socket.on('data', (d: Buffer) => {
      received += d.toString();
    });
    const head = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key}\r\ncontent-type: application/json\r\ncontent-length: ${total}\r\n\r\n`;
    socket.write(head);
    const chunk = Buffer.alloc(64 << 10, 'x');
    for (let sent = 0; sent < total; sent += chunk.length) if (!socket.write(chunk)) await once(socket, 'drain');
    // Then a second request on the same connection.
    socket.write(`GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n`);
    let finished = false;
    const closed = once(socket, 'close').then(() => {
      if (!finished) assert.fail(`the connection was closed; it read: ${received.slice(0, 300)}`);
    });
    while (!/HTTP\/1\.1 200[\s\S]*\r\n\r\n/.test(received)) await Promise.race([once(socket, 'data'), closed]);
    finished = true;
    socket.destroy();
    await closed;
    assert.match(received, /^HTTP\/1\.1 413 /);
    assert.match(received, /"code":"request_too_large"/);
    assert.doesNotMatch(received.split('\r\n\r\n')[0]!, /connection: close/i);
  });

  it('answers a malformed URL with 400', async () => {
    assertEnvelope(await http(server.url, 'GET', '/v1/models/%E0%A4%A', { key }), 400, 'invalid_url');
  });

  it('puts x-request-id on every response and keeps a sane inbound one', async () => {
    const ok = await http(server.url, 'GET', '/healthz');
    assert.match(String(ok.headers['x-request-id']), /^req_[0-9a-f]{32}$/);
    const traced = await http(server.url, 'GET', '/v1/models', { key, headers: { 'x-request-id': 'trace-1234' } });
    assert.equal(traced.headers['x-request-id'], 'trace-1234');
    const hostile = await http(server.url, 'GET', '/v1/models', { key, headers: { 'x-request-id': 'bad id\twith spaces' } });
    assert.match(String(hostile.headers['x-request-id']), /^req_/);
    // A key sent as the request id (by mistake or to plant it in the log) is not taken.
    const keyed = await http(server.url, 'GET', '/v1/models', { key, headers: { 'x-request-id': key } });
    assert.match(String(keyed.headers['x-request-id']), /^req_/);
  });

  it('keeps inference keys out of the admin API with 403', async () => {
    for (const [method, path] of [
      ['GET', '/admin/keys'],
      ['POST', '/admin/orgs'],
      ['GET', '/admin/models'],
    ] as const) {
      const res = await http(server.url, method, path, { key, ...(method === 'POST' && { body: { id: 'x' } }) });
      assertEnvelope(res, 403, 'permission_denied');
      assert.equal(res.json.error.type, 'permission_error');
    }
    assertEnvelope(await http(server.url, 'GET', '/admin/keys'), 401, 'missing_api_key');
  });

  it('keeps CORS closed unless origins are configured', async () => {
    const preflight = {
      origin: 'https://app.example',
      'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization, content-type, x-stainless-os',
    };
    const closed = await http(server.url, 'OPTIONS', '/v1/chat/completions', { headers: preflight });
    assert.equal(closed.headers['access-control-allow-origin'], undefined);
    const open = await startServer({ env: { SWITCHYARD_CORS_ORIGIN: 'https://app.example' } });
    try {
      const res = await http(open.url, 'OPTIONS', '/v1/chat/completions', { headers: preflight });
      assert.equal(res.status, 204);
      assert.equal(res.headers['access-control-allow-origin'], 'https://app.example');
      assert.match(String(res.headers['access-control-allow-headers']), /x-stainless-os/);
      // Every method the API answers, and the headers the SDKs read.
      const del = await http(open.url, 'OPTIONS', '/v1/responses/resp_1', {
        headers: { ...preflight, 'access-control-request-method': 'DELETE' },
      });
      assert.match(String(del.headers['access-control-allow-methods']), /DELETE/);
      assert.match(String(del.headers['access-control-allow-methods']), /PATCH/);
      const answered = await http(open.url, 'GET', '/healthz', { headers: { origin: 'https://app.example' } });
      for (const h of ['request-id', 'x-should-retry', 'x-ratelimit-remaining-tokens'])
        assert.match(String(answered.headers['access-control-expose-headers']), new RegExp(h));
      const other = await http(open.url, 'OPTIONS', '/v1/chat/completions', { headers: { ...preflight, origin: 'https://evil.example' } });
      assert.notEqual(other.headers['access-control-allow-origin'], 'https://evil.example');
    } finally {
      await open.close();
    }
  });

  it('survives a body that never finishes arriving without blocking others', async () => {
    // Declares 1000 bytes, sends 10, then gives up: the server must keep answering everyone else.
    const hang = request(`${server.url}/admin/orgs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.adminKey}`, 'content-type': 'application/json', 'content-length': '1000' },
      body: Readable.from(
        (async function* () {
          yield Buffer.from('{"id":"sl');
          await new Promise((r) => setTimeout(r, 200));
          throw new Error('client gave up');
        })(),
      ),
    }).catch(() => undefined);
    const res = await http(server.url, 'GET', '/healthz');
    assert.equal(res.status, 200);
    await hang;
  });
});
