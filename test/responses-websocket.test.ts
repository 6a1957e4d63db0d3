import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { connect } from 'node:net';
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { WebSocket } from 'ws';
import { GATEWAY_MODEL, chatFixture, chunkFrame, closers, startGateway } from './helpers/fixtures.js';
import { createKey, http, startServer, tempDir, type TestServer } from './helpers/server.js';
import { ConnectionResponses } from '../src/core/responses/connection-state.js';
import type { Item } from '../src/core/items.js';
import { startProcess } from './helpers/process.js';
import { eventually } from './helpers/wait.js';
import { rmSync } from 'node:fs';
import { eventSchemas, valid, validator } from './helpers/open-responses.js';

/**
 * The Responses WebSocket transport (Open Responses 2026-04-24, "WebSocket Transport"), driven by the
 * openai SDK's own WebSocket client and by a plain `ws` client for what the SDK does not send.
 */

const MODEL = 'local/stories260k';
const errorEvent = validator('WebSocketErrorEvent');

type Event = {
  type: string;
  sequence_number?: number;
  response?: { id: string; status: string; usage?: { input_tokens: number } };
} & Record<string, unknown>;

/** A plain WebSocket client that reads every message the server sends, in order. */
class Socket {
  readonly messages: Event[] = [];
  private waiters: Array<() => void> = [];
  closed: Promise<[number, Buffer]>;

  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data) => {
      this.messages.push(JSON.parse(String(data)) as Event);
      for (const w of this.waiters.splice(0)) w();
    });
    this.closed = once(ws, 'close') as Promise<[number, Buffer]>;
  }

  static async open(server: TestServer, headers: Record<string, string>): Promise<Socket> {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/responses`, { headers });
    await once(ws, 'open');
    return new Socket(ws);
  }

  send(msg: unknown): void {
    this.ws.send(typeof msg === 'string' ? msg : JSON.stringify(msg));
  }

  /** Messages from `from` on until one matches (a terminal event, an error). */
  async until(from: number, match: (e: Event) => boolean): Promise<Event[]> {
    for (;;) {
      const at = this.messages.slice(from).findIndex(match);
      if (at >= 0) return this.messages.slice(from, from + at + 1);
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
  }

  /** Sends one response.create and returns its messages, to its terminal event or error. */
  async turn(body: Record<string, unknown>): Promise<Event[]> {
    const from = this.messages.length;
    this.send({ type: 'response.create', model: MODEL, max_output_tokens: 6, ...body });
    return this.until(from, isEnd);
  }
}

const TERMINAL = new Set(['response.completed', 'response.incomplete', 'response.failed', 'error']);
const isEnd = (e: Event): boolean => TERMINAL.has(e.type);

function checkTurn(events: Event[]): Event {
  events.forEach((e, i) => {
    if (e.type === 'error') return valid(errorEvent, e, 'error event');
    const v = eventSchemas.get(e.type);
    assert.ok(v, `no schema for event ${e.type}`);
    valid(v, e, e.type);
    assert.equal(e.sequence_number, i, 'each turn numbers its events from 0');
  });
  const end = events.at(-1)!;
  assert.ok(end.type === 'response.completed' || end.type === 'response.incomplete', JSON.stringify(end));
  return end;
}

describe('Responses over WebSocket', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  before(async () => {
    server = c.keep(await startServer());
    key = (await createKey(server, 'sockets')).key;
  });
  after(() => c.closeAll());

  it("runs turns through the openai SDK's WebSocket client, continuing store:false responses on the connection", async () => {
    const client = new OpenAI({ apiKey: key, baseURL: `${server.url}/v1` });
    const ws = new ResponsesWS(client);
    const received: Event[] = [];
    const errors: unknown[] = [];
    ws.on('event', (e) => received.push(e as unknown as Event));
    ws.on('error', (e) => errors.push(e));
    const ended = () =>
      new Promise<Event>((resolve) => {
        const done = (e: unknown) => resolve(e as Event);
        ws.once('response.completed', done);
        ws.once('response.incomplete', done);
      });

    let end = ended();
    ws.send({ type: 'response.create', model: MODEL, store: false, input: 'Once upon a time', max_output_tokens: 6 });
    const first = await end;
    checkTurn(received.splice(0));
    assert.equal(first.response?.status, 'incomplete', 'the tiny model runs to its token limit');

    // The next turn sends only new input and continues from the connection's memory: it was never stored.
    end = ended();
    ws.send({
      type: 'response.create',
      model: MODEL,
      store: false,
      previous_response_id: first.response!.id,
      input: [{ type: 'message', role: 'user', content: 'And then?' }],
      max_output_tokens: 6,
    });
    const second = await end;
    checkTurn(received.splice(0));
    assert.ok(
      second.response!.usage!.input_tokens > first.response!.usage!.input_tokens + 6,
      'the second turn read the first one as context',
    );
    assert.deepEqual(errors, []);
    assert.equal((await http(server.url, 'GET', `/v1/responses/${first.response!.id}`, { key })).status, 404, 'store:false kept nothing');
    ws.close();
  });

  it('fails a continuation it cannot find with previous_response_not_found, and the connection recovers', async () => {
    const s = await Socket.open(server, { 'x-api-key': key });
    const lost = await s.turn({ store: false, previous_response_id: 'resp_not_here', input: 'x' });
    assert.equal(lost.length, 1);
    valid(errorEvent, lost[0], 'error');
    assert.equal(lost[0]!['status'], 400);
    assert.deepEqual(lost[0]!['error'], {
      type: 'invalid_request_error',
      code: 'previous_response_not_found',
      message: "Previous response with id 'resp_not_here' not found.",
      param: 'previous_response_id',
    });
    // Recovery: a new chain with the full input, on the same connection.
    checkTurn(await s.turn({ store: false, input: 'Once upon a time' }));
    s.ws.close();
    await s.closed;
  });

  it('forgets the response a failed continuation referred to (Open Responses: a later try is not found)', async () => {
    const s = await Socket.open(server, { authorization: `Bearer ${key}` });
    const a = checkTurn(await s.turn({ store: false, input: 'Once upon a time' }));
    // The continuation fails (it refers to an item that does not exist): 4xx, and `a` is evicted.
    const failed = await s.turn({
      store: false,
      previous_response_id: a.response!.id,
      input: [{ type: 'item_reference', id: 'msg_none' }],
    });
    assert.equal(failed.at(-1)!.type, 'error');
    assert.equal((failed.at(-1)!['error'] as { code: string }).code, 'not_found');
    const again = await s.turn({ store: false, previous_response_id: a.response!.id, input: 'Then?' });
    assert.equal((again.at(-1)!['error'] as { code: string }).code, 'previous_response_not_found');
    // Likewise when the continuation is refused for a field before anything runs (temperature 5).
    const b = checkTurn(await s.turn({ store: false, input: 'Once upon a time' }));
    const refused = await s.turn({ store: false, previous_response_id: b.response!.id, input: 'Then?', temperature: 5 });
    assert.equal((refused.at(-1)!['error'] as { code: string; param: string }).param, 'temperature');
    const later = await s.turn({ store: false, previous_response_id: b.response!.id, input: 'Then?' });
    assert.equal((later.at(-1)!['error'] as { code: string }).code, 'previous_response_not_found');
    s.ws.close();
  });

  it('continues a stored response from the store on a new connection', async () => {
    const one = await Socket.open(server, { 'x-api-key': key });
    const a = checkTurn(await one.turn({ input: 'Once upon a time' }));
    one.ws.close();
    await one.closed;
    const stored = await http(server.url, 'GET', `/v1/responses/${a.response!.id}`, { key });
    assert.equal(stored.status, 200, 'store defaults to true on WebSocket too');
    const two = await Socket.open(server, { 'x-api-key': key });
    const b = checkTurn(await two.turn({ previous_response_id: a.response!.id, input: 'Then?' }));
    assert.ok(b.response!.usage!.input_tokens > a.response!.usage!.input_tokens);
    two.ws.close();
  });

  it('runs response.create messages one after another, never interleaved', async () => {
    const s = await Socket.open(server, { 'x-api-key': key });
    const from = s.messages.length;
    for (let i = 0; i < 3; i++) s.send({ type: 'response.create', model: MODEL, store: false, input: `Story ${i}`, max_output_tokens: 5 });
    let at = from;
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const turn = await s.until(at, isEnd);
      at += turn.length;
      const end = checkTurn(turn);
      const created = turn[0]!;
      assert.equal(created.type, 'response.created');
      assert.equal(created.response!.id, end.response!.id, 'one response per turn, from created to its end');
      ids.push(end.response!.id);
    }
    assert.equal(new Set(ids).size, 3);
    s.ws.close();
  });

  it('answers malformed messages and HTTP-only fields with error events naming the problem, and stays open', async () => {
    const s = await Socket.open(server, { 'x-api-key': key });
    const expectError = async (msg: unknown, code: string, param: string | null, status = 400) => {
      const from = s.messages.length;
      s.send(msg);
      const [e] = await s.until(from, isEnd);
      valid(errorEvent, e, 'error');
      assert.equal(e!['status'], status);
      assert.equal((e!['error'] as { code: string }).code, code);
      assert.equal((e!['error'] as { param: string | null }).param, param);
    };
    await expectError('{not json', 'invalid_json', null);
    await expectError({ type: 'response.cancel' }, 'invalid_value', 'type');
    await expectError({ type: 'response.create', model: MODEL, input: 'x', stream: true }, 'unsupported_parameter', 'stream');
    await expectError({ type: 'response.create', model: MODEL, input: 'x', background: false }, 'unsupported_parameter', 'background');
    await expectError({ type: 'response.create', model: MODEL, input: 'x', temperature: 9 }, 'invalid_value', 'temperature');
    await expectError({ type: 'response.create', input: 'x' }, 'missing_required_parameter', 'model');
    await expectError({ type: 'response.create', model: 'nobody/none', input: 'x' }, 'model_not_found', 'model', 404);
    // As over HTTP, a `__proto__` key is refused (it was taken, and a `constructor` key beside it
    // reached the live event through a setter but not the stored response).
    await expectError(
      `{"type":"response.create","model":"${MODEL}","input":"x","metadata":{"__proto__":"x","constructor":"y"}}`,
      'invalid_json',
      null,
    );
    checkTurn(await s.turn({ store: false, input: 'Once' }));
    s.ws.close();
  });

  it("applies a key's new limits and its revocation to the next turn of an open connection", async () => {
    const { key: k, id } = await createKey(server, 'sockets');
    const s = await Socket.open(server, { authorization: `Bearer ${k}` });
    checkTurn(await s.turn({ store: false, input: 'Once upon a time' }));
    // Restricted to another model: the next turn is refused as an HTTP request would be.
    const patched = await http(server.url, 'PATCH', `/admin/keys/${id}`, {
      key: server.adminKey,
      body: { limits: { models: ['local/llama-2-tiny-random'] } },
    });
    assert.equal(patched.status, 200, patched.text);
    const refused = await s.turn({ store: false, input: 'Once upon a time' });
    assert.equal((refused.at(-1)!['error'] as { code: string }).code, 'model_not_allowed');
    // Revoked: the next turn is a 401 error event, and the connection closes.
    assert.equal((await http(server.url, 'DELETE', `/admin/keys/${id}`, { key: server.adminKey })).status, 200);
    const revoked = await s.turn({ store: false, input: 'Once upon a time', model: 'local/llama-2-tiny-random' });
    const error = revoked.at(-1)!;
    valid(errorEvent, error, 'error event');
    assert.equal(error['status'], 401);
    const [code] = await s.closed;
    assert.equal(code, 1008);
  });

  it('authenticates the upgrade like any request', async () => {
    for (const headers of [{}, { authorization: 'Bearer sk-sy-wrong' }]) {
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/responses`, { headers });
      ws.on('error', () => undefined);
      const [req, res] = (await once(ws, 'unexpected-response')) as [
        { destroy(): void },
        { statusCode: number; headers: Record<string, string>; resume(): void },
      ];
      assert.equal(res.statusCode, 401);
      assert.ok(res.headers['x-request-id']);
      res.resume();
      req.destroy();
    }
    // A plain GET (no upgrade) is the list of stored responses (test/stored-lists.test.ts).
    const plain = await http<{ object: string }>(server.url, 'GET', '/v1/responses', { key });
    assert.equal(plain.status, 200);
    assert.equal(plain.json.object, 'list');
  });

  it('refuses an upgrade to any other route over HTTP, in the envelope, and closes the connection', { timeout: 30_000 }, async () => {
    for (const path of ['/v1/models', '/v1/chat/completions', '/v1/responses/resp_x', '/v1/nothing-here']) {
      // The ws client: an HTTP answer, not a socket that opens and closes.
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}${path}`, { headers: { authorization: `Bearer ${key}` } });
      ws.on('error', () => undefined);
      const answer = await new Promise<{ statusCode: number; headers: Record<string, string>; body: Promise<string> } | 'upgraded'>(
        (resolve) => {
          ws.once('upgrade', () => resolve('upgraded'));
          ws.once('unexpected-response', (_req, res: NodeJS.ReadableStream & { statusCode: number; headers: Record<string, string> }) => {
            const body = (async () => {
              let text = '';
              for await (const chunk of res) text += String(chunk);
              return text;
            })();
            resolve({ statusCode: res.statusCode, headers: res.headers, body });
          });
        },
      );
      assert.notEqual(answer, 'upgraded', path);
      if (answer === 'upgraded') continue;
      assert.equal(answer.statusCode, 400, path);
      assert.ok(answer.headers['x-request-id']);
      assert.equal(answer.headers['connection'], 'close');
      const error = (JSON.parse(await answer.body) as { error: { code: string; message: string } }).error;
      assert.equal(error.code, 'invalid_request');
      assert.match(error.message, /only GET \/v1\/responses takes a WebSocket/);
      ws.terminate();
    }
    // A client that keeps its side open: the server ends the connection itself (FIN), and then
    // destroys it (an answered upgrade's socket is out of reach of the server's own timeouts).
    const { port } = new URL(server.url);
    const socket = connect({ host: '127.0.0.1', port: Number(port), allowHalfOpen: true });
    let received = '';
    socket.on('data', (d: Buffer) => (received += d.toString()));
    const ended = once(socket, 'end');
    // Not events.once: the reset that ends it comes as an 'error' first, which would reject it.
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.write(
      `GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n` +
        `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer ${key}\r\n\r\n`,
    );
    await ended;
    assert.match(received, /^HTTP\/1\.1 400 /);
    // The server's side is gone too once a write of this one is refused (a reset): it does not wait
    // on a client that never closes.
    socket.on('error', () => undefined);
    const poke = setInterval(() => socket.write('x'), 100);
    try {
      await closed;
    } finally {
      clearInterval(poke);
    }
  });
});

describe('Responses over WebSocket: a turn whose upstream breaks mid-answer', () => {
  const c = closers();
  let server: TestServer;
  before(async () => {
    // A failure no real engine produces on demand: the stream is cut after its first delta.
    const upstream = c.keep(
      await chatFixture((_stream, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: '' }) + chunkFrame({ content: 'Once' }));
        setTimeout(() => res.socket?.destroy(), 20);
      }),
    );
    server = c.keep(await startGateway([{ baseUrl: upstream.url }], { SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1' }));
  });
  after(() => c.closeAll());

  it("ends with response.failed, numbered from 0 without a gap and without the SSE stream's error event; the next turn runs", async () => {
    const s = await Socket.open(server, { authorization: `Bearer ${server.adminKey}` });
    const from = s.messages.length;
    s.send({ type: 'response.create', model: GATEWAY_MODEL, input: 'Once upon a time', store: false });
    const events = await s.until(from, (e) => e.type === 'response.failed' || e.type === 'error');
    assert.equal(events.at(-1)!.type, 'response.failed', JSON.stringify(events.map((e) => e.type)));
    assert.ok(!events.some((e) => e.type === 'error'), "on this transport an error message is the transport's own");
    events.forEach((e, i) => {
      assert.equal(e.sequence_number, i, 'each turn numbers its events from 0, without a gap');
      const v = eventSchemas.get(e.type);
      assert.ok(v, `no schema for event ${e.type}`);
      valid(v, e, e.type);
    });
    assert.equal((events.at(-1)!.response as unknown as { error: { code: string } }).error.code, 'upstream_error');
    // The connection stays open for the next turn, which fails the same way and numbers from 0 again.
    const next = s.messages.length;
    s.send({ type: 'response.create', model: GATEWAY_MODEL, input: 'again', store: false });
    const again = await s.until(next, (e) => e.type === 'response.failed' || e.type === 'error');
    assert.equal(again[0]!.sequence_number, 0);
    assert.equal(again.at(-1)!.type, 'response.failed');
    s.ws.close();
    await s.closed;
  });
});

describe('Responses over WebSocket: the connection time limit', () => {
  const c = closers();
  let server: TestServer;
  before(async () => {
    server = c.keep(await startServer({ env: { SWITCHYARD_WEBSOCKET_MAX_CONNECTION_MS: '1500' } }));
  });
  after(() => c.closeAll());

  it('ends a connection at its limit with websocket_connection_limit_reached, after the running turn', async () => {
    const s = await Socket.open(server, { 'x-api-key': server.adminKey });
    checkTurn(await s.turn({ store: false, input: 'Once upon a time' }));
    const [code] = await s.closed;
    const last = s.messages.at(-1)!;
    valid(errorEvent, last, 'error');
    assert.equal((last['error'] as { code: string }).code, 'websocket_connection_limit_reached');
    assert.equal(code, 1000);
  });
});

describe('Responses over WebSocket: a client that breaks the protocol', () => {
  it("closes a socket whose frame is past the body limit with 1009, logged as the client's error, not the server's", async () => {
    const dir = tempDir();
    const admin = 'sk-sy-ws-oversize-test-key-000001';
    const p = await startProcess({
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ADMIN_KEY: admin,
      SWITCHYARD_BODY_LIMIT: '4096',
      SWITCHYARD_WORKERS: '1',
    });
    try {
      const ws = new WebSocket(`${p.url.replace(/^http/, 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${admin}` } });
      await once(ws, 'open');
      const closed = once(ws, 'close');
      ws.send('x'.repeat(8192));
      const [code] = (await closed) as [number];
      assert.equal(code, 1009);
      await eventually(() => assert.match(p.stdout(), /websocket closed for a client error/));
      assert.match(p.stdout(), /"code":"WS_ERR_UNSUPPORTED_MESSAGE_LENGTH"/);
      assert.doesNotMatch(p.stdout(), /"level":50/, 'no error-level line');
      // The server goes on answering.
      assert.equal((await http(p.url, 'GET', '/healthz')).status, 200);
    } finally {
      p.child.kill('SIGTERM');
      await p.exited;
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('Responses over WebSocket: what one organization and one connection may hold', () => {
  const c = closers();
  let server: TestServer;
  let key: string;
  before(async () => {
    server = c.keep(await startServer({ env: { SWITCHYARD_WEBSOCKET_MAX_PER_ORG: '2', SWITCHYARD_BODY_LIMIT: '65536' } }));
    key = (await createKey(server, 'holders')).key;
  });
  after(() => c.closeAll());

  /** A raw upgrade request to /v1/responses: the status, headers and body of the HTTP answer. */
  async function handshake(headers: string): Promise<{ status: number; head: string; body: string }> {
    const { port } = new URL(server.url);
    const socket = connect({ host: '127.0.0.1', port: Number(port) });
    let received = '';
    socket.on('data', (d: Buffer) => (received += d.toString()));
    socket.write(`GET /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nAuthorization: Bearer ${key}\r\n${headers}\r\n`);
    await new Promise<void>((resolve) => socket.once('close', () => resolve()));
    const [head = '', body = ''] = received.split('\r\n\r\n');
    return { status: Number(/^HTTP\/1\.1 (\d+)/.exec(head)?.[1]), head, body };
  }

  it('refuses a bad handshake in the error envelope, before ws answers it with a page of its own', async () => {
    const version = 'Sec-WebSocket-Version: 13\r\n';
    for (const [headers, param] of [
      [`Upgrade: websocket\r\n${version}`, 'sec-websocket-key'],
      [`Upgrade: websocket\r\n${version}Sec-WebSocket-Key: abc\r\n`, 'sec-websocket-key'],
      [`Upgrade: h2c\r\n${version}Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n`, 'upgrade'],
      [
        `Upgrade: websocket\r\n${version}Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: a b,,\r\n`,
        'sec-websocket-protocol',
      ],
    ] as const) {
      const r = await handshake(`${headers}Connection: close\r\n`);
      assert.equal(r.status, 400, r.head);
      assert.match(r.head, /x-request-id: /i);
      assert.match(r.head, /content-type: application\/json/i);
      const error = (JSON.parse(r.body) as { error: { param: string; code: string } }).error;
      assert.deepEqual([error.code, error.param], ['invalid_request', param], r.body);
    }
  });

  it("caps one organization's open sockets (each counts toward the server's in-flight bound), not another's", async () => {
    const url = `${server.url.replace('http', 'ws')}/v1/responses`;
    const first = await Socket.open(server, { authorization: `Bearer ${key}` });
    const second = await Socket.open(server, { authorization: `Bearer ${key}` });
    const third = new WebSocket(url, { headers: { authorization: `Bearer ${key}` } });
    third.on('error', () => undefined);
    const [, res] = (await once(third, 'unexpected-response')) as [
      unknown,
      { statusCode: number; headers: Record<string, string>; resume(): void },
    ];
    assert.equal(res.statusCode, 429);
    assert.ok(res.headers['x-request-id']);
    res.resume();
    // Another organization is not held back by this one's sockets.
    const other = await Socket.open(server, { authorization: `Bearer ${(await createKey(server, 'others')).key}` });
    other.ws.close();
    // A closed socket gives its place back.
    first.ws.close();
    await first.closed;
    const again = await Socket.open(server, { authorization: `Bearer ${key}` });
    again.ws.close();
    second.ws.close();
    await Promise.all([again.closed, second.closed, other.closed]);
  });

  it('closes a connection whose client sends and never reads the errors it is answered with', async () => {
    // An outside pass: one-byte messages, each answered with a 200-byte error the client never
    // read, grew the server by 470 MB for 4 MB sent and held its event loop for seconds.
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/responses`, { headers: { authorization: `Bearer ${key}` } });
    await once(ws, 'open');
    const closed = once(ws, 'close');
    // The client reads nothing from here on: the server's replies wait in its buffers.
    (ws as unknown as { _socket: { pause(): void } })._socket.pause();
    let sent = 0;
    const stop = closed.then(() => undefined);
    let open = true;
    void stop.then(() => (open = false));
    while (open && sent < 200_000) {
      for (let i = 0; i < 2_000 && ws.readyState === ws.OPEN; i++, sent++) ws.send('x');
      await new Promise((r) => setImmediate(r));
    }
    // The connection is closed by the server, not the client, long before all were answered.
    if (open) ws.terminate();
    assert.ok(sent < 200_000, 'the server never closed the connection');
    await closed;
    const health = await http(server.url, 'GET', '/healthz');
    assert.equal(health.status, 200);
  });

  it('holds at most one body limit of queued messages per connection', async () => {
    const s = await Socket.open(server, { authorization: `Bearer ${key}` });
    // A long turn runs; behind it, two messages of 40 KB each: the second would hold past 64 KB.
    s.send({ type: 'response.create', model: 'local/llama-2-tiny-random', input: 'hello', max_output_tokens: 3000, store: false });
    const big = { type: 'response.create', model: MODEL, input: 'x'.repeat(40_000), max_output_tokens: 1, store: false };
    s.send(big);
    const from = s.messages.length;
    s.send(big);
    const [refused] = await s.until(from, (e) => e.type === 'error');
    assert.match(JSON.stringify(refused), /may hold 65536 bytes in all/);
    s.ws.close();
    await s.closed;
  });
});

describe("a connection's kept responses", () => {
  const item = (text: string): Item => ({
    id: 'msg_x',
    type: 'message',
    role: 'user',
    status: 'completed',
    content: [{ type: 'input_text', text }],
  });

  it('keeps at most its bound of characters, oldest going first, and a context past it not at all', () => {
    const kept = new ConnectionResponses(1000);
    kept.remember('a', [item('x'.repeat(400))], false);
    kept.remember('b', [item('x'.repeat(400))], false);
    kept.remember('c', [item('x'.repeat(400))], false);
    assert.deepEqual(
      ['a', 'b', 'c'].map((id) => kept.get(id) !== undefined),
      [false, true, true],
    );
    kept.remember('huge', [item('x'.repeat(1001))], false);
    assert.equal(kept.get('huge'), undefined);
    assert.ok(kept.get('c'), 'the others stay');
  });
});
