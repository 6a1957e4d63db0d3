import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { once } from 'node:events';
import type { AddressInfo, Socket } from 'node:net';
import { Pool, buildConnector, errors, type Dispatcher } from 'undici';
import { TooLarge, UpstreamCall } from '../src/engines/upstream/upstream-call.js';
import { withoutReconnectAfterAbort } from '../src/engines/upstream/connector.js';
import { Cancellation } from '../src/core/cancellation.js';

/**
 * The upstream engine's HTTP call (undici's dispatch API without a Readable per answer): the bounds,
 * back-pressure, cancel and timeout behaviour that `Pool.request` gave it before, against real
 * sockets.
 */

const servers: Server[] = [];
const pools: Pool[] = [];
after(async () => {
  for (const p of pools) await p.destroy();
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

async function serve(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  options: Pool.Options = {},
): Promise<{ pool: Pool; sockets: Set<Socket> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.once('end', () => handler(req, res));
  });
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => sockets.add(s));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  servers.push(server);
  const pool = new Pool(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, options);
  pools.push(pool);
  return { pool, sockets };
}

const POST = { path: '/', method: 'POST' as const, body: '{}' };
/** Each test's bound: a call that never wakes its reader fails the test instead of hanging the run. */
const T = { timeout: 15_000 };

describe('upstream call', () => {
  it('reads a whole answer and leaves the connection for the next request', T, async () => {
    const { pool, sockets } = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"a":');
      res.end('1}');
    });
    let closes = 0;
    for (let i = 0; i < 10; i++) {
      const signal = new Cancellation();
      const call = await UpstreamCall.start(pool, POST, signal);
      for (const s of sockets) if (!s.listenerCount('close')) s.once('close', () => closes++);
      assert.equal(call.statusCode, 200);
      assert.equal(call.headers['content-type'], 'application/json');
      assert.deepEqual(JSON.parse((await call.whole(1024)).toString()), { a: 1 });
      assert.equal(call.complete, true);
      assert.equal(signal.listenerCount('abort'), 0, 'no cancel listener is left once the body ended');
      call.release();
    }
    // undici's pool may open a second connection when the next request comes before the first is
    // marked free (Pool.request does the same), but none is closed and they do not pile up.
    assert.equal(closes, 0, 'no connection was closed');
    assert.ok(sockets.size <= 2, `${sockets.size} connections for 10 requests in a row`);
  });

  it('refuses a body past the limit without reading it all, and closes that connection', T, async () => {
    const big = Buffer.alloc(64 * 1024, 'x');
    let written = 0;
    let closed!: () => void;
    const serverSawClose = new Promise<void>((r) => (closed = r));
    const { pool } = await serve((req, res) => {
      res.writeHead(200);
      req.socket.once('close', () => closed());
      // 256 MB if nobody stops it.
      const pump = () => {
        while (written < 256 * 1024 * 1024) {
          written += big.length;
          if (!res.write(big)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    });
    const call = await UpstreamCall.start(pool, POST, new Cancellation());
    await assert.rejects(call.whole(1024 * 1024), TooLarge);
    await serverSawClose;
    assert.ok(written < 64 * 1024 * 1024, `the server wrote ${written} bytes before the call gave up`);
  });

  it('pauses the upstream while the reader does not read (back-pressure), then gets every byte', T, async () => {
    const total = 32 * 1024 * 1024;
    const piece = Buffer.alloc(64 * 1024, 'y');
    let written = 0;
    let blocked!: (n: number) => void;
    const serverBlocked = new Promise<number>((r) => (blocked = r));
    const { pool } = await serve((_req, res) => {
      res.writeHead(200);
      const pump = () => {
        while (written < total) {
          written += piece.length;
          if (!res.write(piece)) {
            blocked(written);
            return void res.once('drain', pump);
          }
        }
        res.end();
      };
      pump();
    });
    const call = await UpstreamCall.start(pool, POST, new Cancellation());
    // Nothing is read until the server cannot write any more: without back-pressure the client
    // would take all 32 MB into memory and the server would never block.
    const at = await serverBlocked;
    assert.ok(at < total, 'the server was held back');
    let got = 0;
    for (let chunk = await call.read(); chunk !== null; chunk = await call.read()) got += chunk.length;
    assert.equal(got, total);
    assert.equal(call.complete, true);
  });

  it('is cancelled before the answer starts, and after it, by the request signal', T, async () => {
    const requests: Array<{ url: string; closed: Promise<void> }> = [];
    let arrived!: () => void;
    const { pool } = await serve((req, res) => {
      requests.push({ url: req.url ?? '', closed: new Promise<void>((r) => req.socket.once('close', () => r())) });
      arrived();
      // '/' never answers (an upstream still thinking); '/half' sends a head and part of a body, then nothing.
      if (req.url === '/half') {
        res.writeHead(200);
        res.write('partial');
      }
    });
    const before = new Cancellation();
    const pending = UpstreamCall.start(pool, POST, before);
    await new Promise<void>((r) => (arrived = r));
    before.abort();
    await assert.rejects(pending, errors.RequestAbortedError);
    await requests[0]!.closed;

    const mid = new Cancellation();
    const call = await UpstreamCall.start(pool, { ...POST, path: '/half' }, mid);
    assert.equal((await call.read())?.toString(), 'partial');
    const reading = call.read();
    mid.abort();
    await assert.rejects(reading, errors.RequestAbortedError);
    await requests[1]!.closed;
    assert.equal(mid.listenerCount('abort'), 0, 'the call removed its listener');
    assert.equal(before.listenerCount('abort'), 0);
  });

  it('is refused with a signal aborted before the call or before its connection opened', T, async () => {
    const { pool } = await serve((_req, res) => res.end('{}'));
    const gone = new Cancellation();
    gone.abort();
    await assert.rejects(UpstreamCall.start(pool, POST, gone), errors.RequestAbortedError);
    // And one aborted before its connection was even open.
    const soon = new Cancellation();
    const pending = UpstreamCall.start(pool, POST, soon);
    soon.abort();
    await assert.rejects(pending, errors.RequestAbortedError);
  });

  it("keeps undici's timeouts: no head in time, and a silent body", T, async () => {
    const { pool } = await serve((req, res) => {
      if (req.url === '/silent') {
        res.writeHead(200);
        res.write('a');
      }
    });
    await assert.rejects(UpstreamCall.start(pool, { ...POST, headersTimeout: 200 }, new Cancellation()), {
      code: 'UND_ERR_HEADERS_TIMEOUT',
    });
    const signal = new Cancellation();
    const call = await UpstreamCall.start(pool, { ...POST, path: '/silent', bodyTimeout: 200 }, signal);
    assert.equal((await call.read())?.toString(), 'a');
    await assert.rejects(call.read(), { code: 'UND_ERR_BODY_TIMEOUT' });
    assert.equal(signal.listenerCount('abort'), 0);
  });

  it('closes the connection of a body released before its end', T, async () => {
    let closed!: () => void;
    const serverSawClose = new Promise<void>((r) => (closed = r));
    const { pool } = await serve((req, res) => {
      req.socket.once('close', () => closed());
      res.writeHead(200);
      res.write('first');
    });
    const signal = new Cancellation();
    const call = await UpstreamCall.start(pool, POST, signal);
    assert.equal((await call.read())?.toString(), 'first');
    call.release();
    assert.equal(signal.listenerCount('abort'), 0);
    await serverSawClose;
    assert.equal(call.complete, false);
    call.release();
  });

  it(
    "opens no connection in place of an aborted call's, and still connects for a call waiting behind it (the engine's connector)",
    T,
    async () => {
      let connects = 0;
      const inner = buildConnector({});
      const connect = withoutReconnectAfterAbort((opts, callback) => {
        connects += 1;
        inner(opts, callback);
      });
      const { pool } = await serve(
        (req, res) => {
          if (req.url !== '/hold') return void res.end('{}');
          res.writeHead(200);
          res.write('first');
        },
        { connections: 1, connect },
      );
      const held = async () => {
        const signal = new Cancellation();
        const call = await UpstreamCall.start(pool, { ...POST, path: '/hold' }, signal);
        assert.equal((await call.read())?.toString(), 'first');
        return { signal, call };
      };

      // undici 7 puts an aborted call back as pending when its socket closes, and connects again for
      // it (nodejs/undici#5845); undici runs that connect as it handles the close, so by the time
      // 'disconnect' has been emitted and this test goes on, it would have been counted.
      const a = await held();
      assert.equal(connects, 1);
      const gone = once(pool, 'disconnect');
      a.signal.abort();
      await assert.rejects(a.call.read(), errors.RequestAbortedError);
      await gone;
      assert.equal(connects, 1, 'no connection was opened for the aborted call');
      assert.equal(pool.stats.pending, 0);

      // A call queued behind a held one (one connection allowed) gets a new connection once the held
      // call is aborted: the socket error the connector substitutes does not fail waiting calls.
      const b = await held();
      const waiting = UpstreamCall.start(pool, POST, new Cancellation());
      b.signal.abort();
      const next = await waiting;
      assert.equal((await next.whole(1024)).toString(), '{}');
      assert.equal(connects, 3);
    },
  );

  it('refuses at once a call cancelled while it waits for a connection, and leaves that connection to the next call', T, async () => {
    let connects = 0;
    const inner = buildConnector({});
    const connect = withoutReconnectAfterAbort((opts, callback) => {
      connects += 1;
      inner(opts, callback);
    });
    const carried: string[] = [];
    const { pool } = await serve(
      (req, res) => {
        carried.push(req.url ?? '');
        if (req.url !== '/hold') return void res.end('{}');
        res.writeHead(200);
        res.write('first');
      },
      { connections: 1, connect },
    );
    const holder = new Cancellation();
    const held = await UpstreamCall.start(pool, { ...POST, path: '/hold' }, holder);
    assert.equal((await held.read())?.toString(), 'first');
    // Queued behind the held call (one connection allowed), then cancelled: refused now, not when
    // a connection frees.
    const queued = new Cancellation();
    const waiting = UpstreamCall.start(pool, { ...POST, path: '/never' }, queued);
    queued.abort();
    await assert.rejects(waiting, errors.RequestAbortedError);
    assert.equal(queued.listenerCount('abort'), 0);
    // The held call ends; the cancelled one gets its turn on a new connection and is dropped
    // without closing it, so the next call goes out on that same connection.
    const gone = once(pool, 'disconnect');
    holder.abort();
    await gone;
    const next = await UpstreamCall.start(pool, POST, new Cancellation());
    assert.equal((await next.whole(1024)).toString(), '{}');
    assert.equal(connects, 2);
    assert.deepEqual(carried, ['/hold', '/'], 'the cancelled call never went out');
  });

  it('waits past interim answers (103 Early Hints) for the real head', T, async () => {
    const { pool } = await serve((_req, res) => {
      res.writeEarlyHints({ link: '</style.css>; rel=preload' });
      // The real head comes later, as from an upstream that hints first and thinks after.
      setTimeout(() => {
        res.writeHead(429, { 'retry-after': '2', 'content-type': 'application/json' });
        res.end('{"error":{"message":"slow down"}}');
      }, 100);
    });
    const call = await UpstreamCall.start(pool, POST, new Cancellation());
    assert.equal(call.statusCode, 429);
    assert.equal(call.headers['retry-after'], '2');
    assert.equal((await call.whole(1024)).toString(), '{"error":{"message":"slow down"}}');
  });

  it('takes an AbortSignal as well, and drops what was unread when it fires', T, async () => {
    let more!: () => void;
    const { pool } = await serve((_req, res) => {
      res.writeHead(200);
      res.write('one');
      more = () => res.write('two');
    });
    const controller = new AbortController();
    const call = await UpstreamCall.start(pool, POST, controller.signal);
    assert.equal((await call.read())?.toString(), 'one');
    // 'two' arrives while nobody reads (looked for once per turn of the event loop); the cancel comes before the next read.
    more();
    while (call.buffered === 0) await new Promise((r) => setImmediate(r));
    controller.abort();
    await assert.rejects(call.read(), errors.RequestAbortedError);
    assert.equal(call.buffered, 0, 'what was unread is dropped');
  });

  it('pauses the upstream once 64 KiB wait unread and resumes it when they are read (the handler, driven directly)', T, async () => {
    const controller = new FakeController();
    let handler!: Dispatcher.DispatchHandler;
    const dispatcher = {
      dispatch(_opts: Dispatcher.DispatchOptions, h: Dispatcher.DispatchHandler) {
        handler = h;
        h.onRequestStart?.(controller, {});
        h.onResponseStart?.(controller, 200, {}, 'OK');
        return true;
      },
    } as unknown as Dispatcher;
    const call = await UpstreamCall.start(dispatcher, POST, new Cancellation());
    const piece = Buffer.alloc(16 * 1024, 'z');
    for (let i = 0; i < 3; i++) handler.onResponseData?.(controller, piece);
    assert.equal(controller.paused, false, 'below 64 KiB the upstream keeps sending');
    handler.onResponseData?.(controller, piece);
    assert.equal(controller.paused, true, 'at 64 KiB unread it is paused');
    assert.equal((await call.read())?.length, 64 * 1024, 'everything held comes in one read');
    assert.equal(controller.paused, false, 'and reading resumes it');
    // A reader already waiting takes each chunk as it comes: nothing is paused.
    const next = call.read();
    handler.onResponseData?.(controller, Buffer.alloc(100 * 1024));
    assert.equal((await next)?.length, 100 * 1024);
    assert.equal(controller.paused, false);
    handler.onResponseEnd?.(controller, {});
    assert.equal(await call.read(), null);
    assert.equal(call.complete, true);
  });
});

/** A DispatchController that records what the handler asked of it. */
class FakeController implements Dispatcher.DispatchController {
  paused = false;
  aborted = false;
  reason: Error | null = null;
  pause(): void {
    this.paused = true;
  }
  resume(): void {
    this.paused = false;
  }
  abort(reason: Error): void {
    this.aborted = true;
    this.reason = reason;
  }
}
