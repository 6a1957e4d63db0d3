import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { request, type ServerResponse } from 'node:http';
import { http, startServer, tempDir, type TestServer } from './helpers/server.js';
import { GATEWAY_MODEL as MODEL, chunkFrame, closers, fixture, startGateway } from './helpers/fixtures.js';
import { sendRaw } from './helpers/fuzz-cases.js';
import { deferred, eventually } from './helpers/wait.js';

const ask = { model: MODEL, messages: [{ role: 'user' as const, content: 'Once upon a time' }] };

/** Opens a stream through the gateway on a raw socket; resolves once the first bytes arrived. */
function openStream(s: TestServer, body: object): Promise<{ socket: ReturnType<typeof connect>; received: () => number }> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    const json = JSON.stringify(body);
    let bytes = 0;
    socket.once('data', (d: Buffer) => {
      bytes += d.length;
      socket.on('data', (more: Buffer) => {
        bytes += more.length;
      });
      resolve({ socket, received: () => bytes });
    });
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${s.adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(json)}\r\n\r\n${json}`,
    );
  });
}

describe('hardening', () => {
  const open = closers();
  after(() => open.closeAll());
  const keep = open.keep;

  it("refuses a prompt far beyond a local model's context before tokenizing it, without holding the event loop", async () => {
    const s = keep(await startServer());
    // Load the model first, so what is observed is the refusal alone.
    assert.equal(
      (
        await http(s.url, 'POST', '/v1/chat/completions', {
          key: s.adminKey,
          body: { model: 'local/stories260k', messages: [{ role: 'user', content: 'Once' }], max_tokens: 1 },
        })
      ).status,
      200,
    );
    const loop = monitorEventLoopDelay({ resolution: 5 });
    loop.enable();
    const r = await http(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: { model: 'local/stories260k', messages: [{ role: 'user', content: 'y'.repeat(2 << 20) }], max_tokens: 1 },
    });
    loop.disable();
    assert.equal(r.status, 400);
    assert.equal(r.json.error.code, 'context_length_exceeded');
    assert.match(r.json.error.message, /2097152 characters/);
    // Tokenizing 2 MB held this (shared) event loop for about a second; parsing the body takes a few ms.
    assert.ok(loop.max / 1e6 < 500, `the event loop was held for ${(loop.max / 1e6).toFixed(0)} ms`);
  });

  it('reads a Messages turn of 60,000 tool calls and results in linear time, and names a few of its unanswered ones', async () => {
    const s = keep(await startServer());
    const n = 60_000;
    const uses = Array.from({ length: n }, (_, i) => ({ type: 'tool_use', id: `toolu_${i}`, name: 'f', input: {} }));
    const results = Array.from({ length: n }, (_, i) => ({ type: 'tool_result', tool_use_id: `toolu_${i}`, content: 'ok' }));
    const tools = [{ name: 'f', input_schema: { type: 'object' } }];
    const body = JSON.stringify({
      model: 'local/stories260k',
      max_tokens: 1,
      tools,
      messages: [
        { role: 'user', content: 'go' },
        { role: 'assistant', content: uses },
        { role: 'user', content: results },
      ],
    });
    const loop = monitorEventLoopDelay({ resolution: 5 });
    loop.enable();
    const r = await http(s.url, 'POST', '/v1/messages', { key: s.adminKey, body: JSON.parse(body) as Record<string, unknown> });
    loop.disable();
    // Read whole (the prompt is then far past the tiny model's context): each id was looked for among
    // every call before it, 10 s of held event loop for this 7 MB body, 40 s for 14 MB.
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, /maximum context length/);
    assert.ok(loop.max / 1e6 < 3000, `the event loop was held for ${(loop.max / 1e6).toFixed(0)} ms`);

    const unanswered = await http(s.url, 'POST', '/v1/messages', {
      key: s.adminKey,
      body: {
        model: 'local/stories260k',
        max_tokens: 1,
        tools,
        messages: [
          { role: 'user', content: 'go' },
          { role: 'assistant', content: uses.slice(0, 20_000) },
          { role: 'user', content: 'and?' },
        ],
      },
    });
    assert.equal(unanswered.status, 400);
    assert.match(unanswered.json.error.message, /toolu_0, toolu_1, .*toolu_9 and 19990 more\./);
    assert.ok(unanswered.text.length < 2000, `an error of ${unanswered.text.length} bytes`);
  });

  it('refuses request heads over the limit with 431 in the envelope', async () => {
    const s = keep(await startServer({ env: { SWITCHYARD_MAX_HEADER_BYTES: '4096' } }));
    const r = await sendRaw(
      Number(new URL(s.url).port),
      Buffer.from(`GET /v1/models HTTP/1.1\r\nhost: x\r\nx-pad: ${'a'.repeat(8000)}\r\n\r\n`),
    );
    assert.equal(r.status, 431);
    assert.equal((JSON.parse(r.body) as { error: { code: string } }).error.code, 'request_header_too_large');
    assert.ok(r.headers.get('x-request-id'));
    assert.equal((await http(s.url, 'GET', '/v1/models', { key: s.adminKey, headers: { 'x-pad': 'a'.repeat(2000) } })).status, 200);
    // On the Anthropic path, Anthropic's envelope and request-id header.
    const messages = await sendRaw(
      Number(new URL(s.url).port),
      Buffer.from(`POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nx-pad: ${'a'.repeat(8000)}\r\n\r\n{}`),
    );
    assert.equal(messages.status, 431);
    const anthropic = JSON.parse(messages.body) as { type: string; error: { type: string; message: string }; request_id: string };
    assert.equal(anthropic.type, 'error');
    assert.equal(anthropic.error.type, 'invalid_request_error');
    assert.match(anthropic.error.message, /headers are larger/);
    assert.equal(messages.headers.get('request-id'), anthropic.request_id);
    assert.equal(messages.headers.get('x-request-id'), anthropic.request_id);
  });

  it('answers a missing Host, non-finite and oversized counts and wrongly typed fields with a 400 in the envelope', async () => {
    const s = keep(await startServer());
    const port = Number(new URL(s.url).port);
    // HTTP/1.1 without Host: Node's parser answered a bare 400 with an empty body.
    const noHost = await sendRaw(port, Buffer.from('GET /healthz HTTP/1.1\r\n\r\n'));
    assert.equal(noHost.status, 400);
    assert.match((JSON.parse(noHost.body) as { error: { message: string } }).error.message, /Host header/);
    assert.ok(noHost.headers.get('x-request-id'));
    // An Expect other than 100-continue: Node answered a bare 417 with an empty body.
    const expect = await sendRaw(port, Buffer.from('GET /healthz HTTP/1.1\r\nhost: x\r\nexpect: 200-ok\r\n\r\n'));
    assert.equal(expect.status, 417);
    assert.equal((JSON.parse(expect.body) as { error: { code: string; param: string } }).error.code, 'expectation_failed');
    assert.ok(expect.headers.get('x-request-id'));
    const old = await sendRaw(port, Buffer.from('GET /healthz HTTP/1.0\r\n\r\n'));
    assert.equal(old.status, 200, 'HTTP/1.0 has no Host requirement');
    const cases: Array<[string, string, string]> = [
      // 1e309 parses to Infinity, which passed the integer check and became "Infinity tokens".
      ['/v1/chat/completions', `{"model":"local/stories260k","messages":[{"role":"user","content":"x"}],"max_tokens":1e309}`, 'max_tokens'],
      [
        '/v1/chat/completions',
        `{"model":"local/stories260k","messages":[{"role":"user","content":"x"}],"max_tokens":4294967296}`,
        'max_tokens',
      ],
      ['/v1/chat/completions', `{"model":"local/stories260k","messages":[{"role":"user","content":"x"}],"user":{"id":1}}`, 'user'],
      ['/v1/responses', `{"model":"local/stories260k","input":"x","max_output_tokens":1e309}`, 'max_output_tokens'],
      ['/v1/responses', `{"model":"local/stories260k","input":"x","include":["bogus"]}`, 'include[0]'],
      ['/v1/messages', `{"model":"local/stories260k","max_tokens":1e309,"messages":[{"role":"user","content":"x"}]}`, 'max_tokens'],
      ['/v1/messages', `{"model":"local/stories260k","max_tokens":5,"messages":[{"role":"user","content":[]}]}`, 'messages[0].content'],
    ];
    for (const [path, body, param] of cases) {
      const r = await http(s.url, 'POST', path, { key: s.adminKey, body });
      assert.equal(r.status, 400, `${body} → ${r.text}`);
      const error = (r.json as unknown as { error: { param?: string | null; type: string; message: string } }).error;
      assert.equal(error.type, 'invalid_request_error');
      // Anthropic's envelope has no param: its message names the field instead.
      if (path === '/v1/messages') assert.ok(error.message.includes(param.split('[')[0]!), `${body} → ${r.text}`);
      else assert.equal(error.param, param, `${body} → ${r.text}`);
    }
    // In a query string, text that parses to a number beyond any finite one: ajv coerced it to
    // Infinity and skipped its bounds (a 500 from the store, `"sequence_number":Infinity` in a replay).
    const stored = await http(s.url, 'POST', '/v1/responses', {
      key: s.adminKey,
      body: { model: 'local/stories260k', input: 'x', max_output_tokens: 2 },
    });
    const id = (stored.json as unknown as { id: string }).id;
    for (const [path, param] of [
      ['/v1/conversations?limit=1e400', 'limit'],
      ['/v1/responses?limit=Infinity', 'limit'],
      ['/v1/chat/completions?limit=-Infinity', 'limit'],
      ['/v1/models?limit=1e400', 'limit'],
      [`/v1/responses/${id}/input_items?limit=1e400`, 'limit'],
      [`/v1/responses/${id}?stream=true&starting_after=1e400`, 'starting_after'],
    ] as const) {
      const r = await http(s.url, 'GET', path, { key: s.adminKey });
      assert.equal(r.status, 400, `${path} → ${r.text}`);
      const error = (r.json as unknown as { error: { param: string; code: string; message: string } }).error;
      assert.deepEqual([error.param, error.code], [param, 'invalid_value'], r.text);
      assert.match(error.message, /finite number/);
    }
    assert.equal((await http(s.url, 'GET', `/v1/responses/${id}/input_items?limit=2`, { key: s.adminKey })).status, 200);
    // A final assistant message may be empty (a prefill), as Anthropic's API allows.
    const prefill = await http(s.url, 'POST', '/v1/messages', {
      key: s.adminKey,
      body: {
        model: 'local/stories260k',
        max_tokens: 3,
        messages: [
          { role: 'user', content: 'Once' },
          { role: 'assistant', content: '' },
        ],
      },
    });
    assert.equal(prefill.status, 200, prefill.text);
  });

  it('refuses upstream URLs that reach internal addresses unless allowed, when set and on connect', async () => {
    let hits = 0;
    const internal = keep(
      await fixture((req, res) => {
        hits += 1;
        req.resume();
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"message":{"content":"leak"}}]}');
      }),
    );
    const s = keep(await startGateway([{ baseUrl: 'http://203.0.113.1/v1' }]));
    for (const base of [
      internal.url,
      'http://169.254.169.254/latest',
      'http://[::1]:8080/v1',
      'http://10.1.2.3/v1',
      'http://localhost:9/v1',
      'http://[::ffff:127.0.0.1]/v1',
      'http://user:pw@203.0.113.5/v1',
      // IPv6 forms that carry an internal IPv4 address, and IPv6 ranges that are internal themselves.
      'http://[::7f00:1]/v1',
      'http://[::ffff:0:7f00:1]/v1',
      'http://[64:ff9b::7f00:1]/v1',
      'http://[2002:7f00:1::]/v1',
      'http://[fec0::1]/v1',
      'http://[::127.0.0.1]/v1',
      'http://[64:ff9b::a9fe:a9fe]/v1',
      'http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/v1',
      'http://[fd00::1]/v1',
    ]) {
      const r = await http(s.url, 'POST', '/admin/deployments', { key: s.adminKey, body: { model: MODEL, base_url: base } });
      assert.equal(r.status, 400, `${base}: ${r.text}`);
      assert.equal(r.json.error.param, 'base_url');
    }
    assert.equal(
      (await http(s.url, 'POST', '/admin/deployments', { key: s.adminKey, body: { model: MODEL, base_url: 'http://203.0.113.7/v1' } }))
        .status,
      201,
    );

    // A stored deployment that points inside (written before the policy, or by another instance) is refused on connect.
    await s.service.store.createDeployment({
      id: 'dep_inside',
      model: MODEL,
      base_url: internal.url,
      api_key_env: null,
      upstream_model: null,
      weight: 1e9,
      api: 'chat',
      created_at: 1,
    });
    const guarded = keep(
      await startServer({
        modelsDir: tempDir(),
        dataDir: s.dataDir,
        shared: true,
        env: { SWITCHYARD_ADMIN_KEY: s.adminKey, SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1' },
      }),
    );
    const refused = await http(guarded.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...ask, max_tokens: 2 } });
    assert.equal(refused.status, 502, refused.text);
    assert.equal(refused.json.error.code, 'upstream_unreachable');
    assert.match(refused.json.error.message, /SWITCHYARD_UPSTREAM_ALLOW/, 'the operator learns what to set');
    assert.ok(!refused.text.includes('127.0.0.1'), 'the internal address is not named');
    assert.equal(hits, 0, 'no connection reached the internal address');

    const allowed = keep(
      await startServer({
        modelsDir: tempDir(),
        dataDir: s.dataDir,
        shared: true,
        env: { SWITCHYARD_ADMIN_KEY: s.adminKey, SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.0/8', SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1' },
      }),
    );
    const ok = await http(allowed.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...ask, max_tokens: 2 } });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(hits, 1);
  });

  it('sheds load beyond the in-flight limit with 503 and retry-after, and recovers', async () => {
    const holds = keep(
      await fixture((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
      }),
    );
    const s = keep(await startGateway([{ baseUrl: holds.url }], { SWITCHYARD_MAX_IN_FLIGHT: '2' }));
    const a = await openStream(s, { ...ask, stream: true });
    const b = await openStream(s, { ...ask, stream: true });
    const shed = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(shed.status, 503);
    assert.equal(shed.json.error.code, 'overloaded');
    assert.equal(shed.headers['retry-after'], '1');
    // Anthropic's overloaded answer on the Messages endpoint: 529, with a reason phrase Node lacks.
    const messages = await new Promise<{ status: number | undefined; reason: string | undefined }>((resolve, reject) => {
      const r = request(
        `${s.url}/v1/messages`,
        { method: 'POST', headers: { 'x-api-key': s.adminKey, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' } },
        (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode, reason: res.statusMessage }));
        },
      );
      r.on('error', reject);
      r.end(JSON.stringify({ model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }));
    });
    assert.deepEqual(messages, { status: 529, reason: 'Overloaded' });
    assert.equal((await http(s.url, 'GET', '/healthz')).status, 200, 'probes are still answered');
    a.socket.destroy();
    b.socket.destroy();
    // The two slots free as the server notices the clients left.
    await eventually(async () => assert.equal((await http(s.url, 'GET', '/v1/models', { key: s.adminKey })).status, 200));
    // At least the one above (requests made while the slots were freeing may have been shed too).
    assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_shed_total\{reason="in_flight"\} [1-9]/);
  });

  it('reads an endless upstream only as fast as a slow client takes it', async () => {
    let written = 0;
    /** Since when the upstream has been waiting for the gateway to read (0: it is not waiting). */
    let blockedSince = 0;
    let drained = deferred();
    const upstreamClosed = deferred();
    const endless = keep(
      await fixture((req, res: ServerResponse) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const frame = chunkFrame({ content: 'x'.repeat(1000) });
        const pump = () => {
          blockedSince = 0;
          drained.resolve();
          while (!res.destroyed) {
            written += frame.length;
            if (!res.write(frame)) {
              blockedSince = Date.now();
              return void res.once('drain', pump);
            }
          }
        };
        res.on('close', () => upstreamClosed.resolve());
        pump();
      }),
    );
    // A context large enough that the output limit (which cuts an endless upstream) is never reached here.
    const s = keep(await startGateway([{ baseUrl: endless.url }], {}, { context_length: 1_000_000_000 }));
    const client = await openStream(s, { ...ask, stream: true });
    client.socket.pause();
    // Buffers fill until the upstream waits on the gateway; then nothing moves for a second (an
    // absence can only be observed over a window).
    await eventually(() => assert.ok(blockedSince > 0 && Date.now() - blockedSince > 200, 'the upstream is held back'));
    const stalled = written;
    await new Promise((r) => setTimeout(r, 1000));
    // Socket buffers on both hops hold a few MB at most; without backpressure this would be gigabytes.
    assert.ok(written < 32 * 1024 * 1024, `upstream wrote ${written} bytes to a client that reads nothing`);
    assert.ok(written - stalled < 1024 * 1024, `still pulling from the upstream while the client is stalled: ${written - stalled} bytes`);
    console.log(
      `# slow client: the upstream got ${(written / 1e6).toFixed(1)} MB out in 2.5 s to a client reading nothing (${((written - stalled) / 1e3).toFixed(0)} kB in the last second)`,
    );
    drained = deferred();
    client.socket.resume();
    await drained.promise;
    assert.ok(written > stalled, 'reading resumes when the client does');
    client.socket.destroy();
    await upstreamClosed.promise;
  });

  it('closes the upstream request as soon as the client disconnects, streamed or not', async () => {
    // The upstream never finishes on its own, so its request closing can only be the gateway's doing.
    const closed = [deferred<number>(), deferred<number>()];
    const arrived = [deferred(), deferred()];
    let n = 0;
    const slow = keep(
      await fixture((req, res) => {
        req.resume();
        const i = n++;
        arrived[i]?.resolve();
        res.on('close', () => closed[i]?.resolve(Date.now()));
        if (req.headers.accept === 'text/event-stream') {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
        }
        // Non-stream: never answers, like a long generation.
      }),
    );
    const s = keep(await startGateway([{ baseUrl: slow.url }]));

    const streamed = await openStream(s, { ...ask, stream: true });
    const streamedGone = Date.now();
    streamed.socket.destroy();
    const streamClosed = await closed[0]!.promise;

    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    const json = JSON.stringify(ask);
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${s.adminKey}\r\ncontent-type: application/json\r\ncontent-length: ${json.length}\r\n\r\n${json}`,
    );
    await arrived[1]!.promise;
    const gone = Date.now();
    socket.destroy();
    const plainClosed = await closed[1]!.promise;
    console.log(
      `# disconnect: upstream request closed ${streamClosed - streamedGone} ms (stream) and ${plainClosed - gone} ms (non-stream) after the client left`,
    );
  });

  it('answers 408 in the envelope to a request whose body never finishes, and frees its slot', async () => {
    const s = keep(await startServer({ env: { SWITCHYARD_BODY_TIMEOUT_MS: '500', SWITCHYARD_MAX_IN_FLIGHT: '3' } }));
    const port = Number(new URL(s.url).port);
    const stall = (head: string, part: string) =>
      new Promise<{ text: string; ms: number }>((resolve) => {
        const started = Date.now();
        const socket = connect(port, '127.0.0.1');
        let text = '';
        socket.on('data', (d: Buffer) => {
          text += d.toString();
        });
        socket.on('close', () => resolve({ text, ms: Date.now() - started }));
        socket.write(head + part);
      });
    const auth = `authorization: Bearer ${s.adminKey}\r\ncontent-type: application/json\r\n`;
    const [partial, chunked, messages] = await Promise.all([
      stall(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n${auth}content-length: 100\r\n\r\n`, '{"model":"local/'),
      stall(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n${auth}transfer-encoding: chunked\r\n\r\n`, '5\r\n{"mod\r\n'),
      stall(`POST /v1/messages HTTP/1.1\r\nhost: x\r\n${auth}content-length: 100\r\n\r\n`, '{"model":"local/'),
    ]);
    // On the Anthropic path, Anthropic's envelope (as 413 and 415 there have it).
    assert.match(messages!.text, /^HTTP\/1\.1 408/);
    assert.match(messages!.text, /\r\nrequest-id: req_/);
    const anthropic = JSON.parse(messages!.text.slice(messages!.text.indexOf('\r\n\r\n') + 4)) as { type: string; error: { type: string } };
    assert.equal(anthropic.type, 'error');
    assert.equal(anthropic.error.type, 'timeout_error');
    for (const r of [partial, chunked]) {
      assert.match(r.text, /^HTTP\/1\.1 408/);
      assert.match(r.text, /x-request-id: /);
      const body = JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4)) as { error: { code: string; type: string } };
      assert.equal(body.error.code, 'request_timeout');
      assert.ok(r.ms < 3_000, `answered after ${r.ms} ms`);
    }
    // Every slot (the limit is 3) is free again.
    assert.equal((await http(s.url, 'GET', '/v1/models', { key: s.adminKey })).status, 200);
  });
});
