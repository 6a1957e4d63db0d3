import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { http, tempDir, type TestServer, type WireList } from './helpers/server.js';
import { processMemory, startProcess, type Running } from './helpers/process.js';
import { GATEWAY_MODEL as MODEL, chunkFrame, closers, completionBody, fixture, jsonFixture, startGateway } from './helpers/fixtures.js';
import { eventually, settle } from './helpers/wait.js';

const ask = { model: MODEL, messages: [{ role: 'user' as const, content: 'Once upon a time' }] };

/** Writes `total` bytes made of `piece` without holding them all, respecting backpressure. */
function pump(res: ServerResponse, piece: string, total: number, then?: string): void {
  let sent = 0;
  const chunk = Buffer.from(piece.repeat(Math.ceil(65_536 / piece.length)));
  const go = () => {
    while (sent < total && !res.destroyed) {
      sent += chunk.length;
      if (!res.write(chunk)) return void res.once('drain', go);
    }
    if (!res.destroyed) res.end(then);
  };
  go();
}

const rss = async (url: string): Promise<number> => (await processMemory(url)).rss;

describe('upstream replies are bounded', () => {
  const open = closers();
  after(() => open.closeAll());

  it('answers 502 for an oversized answer, stream line or error body, reads none of them whole, and memory returns', async () => {
    const MB = 1024 * 1024;
    // Each request's model picks the misbehaviour.
    const upstream = open.keep(
      await fixture((req: IncomingMessage, res) => {
        let body = '';
        req.on('data', (c: Buffer) => {
          body += c.toString();
        });
        req.on('end', () => {
          const b = JSON.parse(body) as { model: string };
          if (b.model === 'big-answer') {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.write('{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"');
            pump(res, 'a', 200 * MB, '"},"finish_reason":"stop"}]}');
          } else if (b.model === 'big-line') {
            res.writeHead(200, { 'content-type': 'text/event-stream' });
            res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
            res.write('data: {"choices":[{"index":0,"delta":{"content":"');
            pump(res, 'b', 200 * MB, '"}}]}\n\n');
          } else {
            res.writeHead(500, { 'content-type': 'application/json' });
            pump(res, 'c', 300 * MB);
          }
        });
      }),
    );
    const dataDir = tempDir();
    const config = join(dataDir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        defaultCatalogue: false,
        models: ['big-answer', 'big-line', 'big-error'].map((m) => ({ id: `meta-llama/${m}`, context_length: 1_000_000_000 })),
        deployments: ['big-answer', 'big-line', 'big-error'].map((m) => ({
          model: `meta-llama/${m}`,
          baseUrl: upstream.url,
          upstreamModel: m,
        })),
      }),
    );
    const admin = 'sk-test-admin-bounds-0123456789abcdef';
    let proc: Running | undefined;
    open.add(async () => {
      proc?.child.kill('SIGKILL');
      rmSync(dataDir, { recursive: true, force: true });
    });
    proc = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_CONFIG: config,
      SWITCHYARD_ADMIN_KEY: admin,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1',
    });
    const before = await rss(proc.url);
    const send = (model: string, stream = false) =>
      http(proc!.url, 'POST', '/v1/chat/completions', {
        key: admin,
        body: { model: `meta-llama/${model}`, messages: [{ role: 'user', content: 'hi' }], stream },
      });
    // Six at once, twice over: unbounded, each would take hundreds of MB.
    for (let round = 0; round < 2; round++) {
      const results = await Promise.all([
        send('big-answer'),
        send('big-answer'),
        send('big-line', true),
        send('big-line', true),
        send('big-error'),
        send('big-error'),
      ]);
      const [a1, a2, l1, l2, e1, e2] = results;
      for (const r of [a1!, a2!]) {
        assert.equal(r.status, 502, r.text.slice(0, 200));
        assert.equal(r.json.error.code, 'upstream_error');
        assert.match(r.json.error.message, /larger than 8388608 bytes/);
      }
      for (const r of [l1!, l2!]) {
        assert.equal(r.status, 200, 'the stream had started');
        assert.match(r.text, /"code":"upstream_error"/);
        assert.match(r.text, /stream event larger than 4194304 bytes/);
      }
      for (const r of [e1!, e2!]) {
        assert.equal(r.status, 502);
        assert.match(r.json.error.message, /error body over 65536 bytes/);
        assert.ok(r.text.length < 2000);
      }
    }
    const url = proc.url;
    const after = await settle(
      () => rss(url),
      (r) => r - before <= 64 * MB,
      15_000,
    );
    console.log(
      `# oversized upstream replies: RSS ${Math.round(before / 1e6)} MB before, ${Math.round(after / 1e6)} MB after 12 (6 at a time, 200–300 MB each)`,
    );
    assert.ok(after - before < 64 * MB, `RSS went from ${before} to ${after}`);
  });

  it('stops an endless upstream at max_tokens and finishes with length, stream or not', async () => {
    let closed = 0;
    const endless = open.keep(
      await fixture((req, res) => {
        req.resume();
        res.on('close', () => {
          closed++;
        });
        if (req.headers.accept === 'text/event-stream') {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          const frame = chunkFrame({ content: ' word' });
          const go = () => {
            while (!res.destroyed) if (!res.write(frame)) return void res.once('drain', go);
          };
          res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
          go();
        } else {
          res.writeHead(200, { 'content-type': 'application/json' }).end(completionBody('x'.repeat(100_000)));
        }
      }),
    );
    const s = open.keep(await startGateway([{ baseUrl: endless.url }], {}, { context_length: 1_000_000_000 }));
    const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0, timeout: 10_000 });
    let text = '';
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of await client.chat.completions.create({
      ...ask,
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    })) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
      usage = c.usage ?? usage;
    }
    assert.equal(finish, 'length');
    assert.equal(text, 'Once word word word word', 'five deltas, then the limit');
    assert.equal(usage?.completion_tokens, 5);
    await eventually(() => assert.equal(closed, 1, 'the upstream request is closed'));

    const whole = await client.chat.completions.create({ ...ask, max_tokens: 5 });
    assert.equal(whole.choices[0]!.finish_reason, 'length');
    assert.ok(whole.choices[0]!.message.content!.length <= 5 * 32, `${whole.choices[0]!.message.content!.length} characters for 5 tokens`);

    // Without max_tokens, the model's context is the limit.
    const small = open.keep(await startGateway([{ baseUrl: endless.url }], {}, { context_length: 64 }));
    const c2 = new OpenAI({ apiKey: small.adminKey, baseURL: small.baseURL, maxRetries: 0, timeout: 10_000 });
    let n = 0;
    for await (const c of await c2.chat.completions.create({ ...ask, stream: true })) {
      if (c.choices[0]?.delta.content) n++;
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'length');
    assert.ok(n <= 64, `${n} deltas for a 64-token context`);
  });

  it('tries a lone deployment twice at most, and all its tries within the attempts timeout', async () => {
    let hits = 0;
    const hung = open.keep(
      await fixture((req) => {
        hits++;
        req.resume();
      }),
    );
    const s = open.keep(
      await startGateway([{ baseUrl: hung.url }], {
        SWITCHYARD_UPSTREAM_FIRST_BYTE_TIMEOUT_MS: '400',
        SWITCHYARD_UPSTREAM_ATTEMPTS_TIMEOUT_MS: '600',
      }),
    );
    const started = Date.now();
    const r = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    const took = Date.now() - started;
    assert.equal(r.status, 504);
    assert.equal(r.json.error.code, 'upstream_timeout');
    assert.equal(hits, 2, 'one retry for a lone deployment');
    // The first try waits 400 ms, the second only what is left of 600 ms.
    assert.ok(took < 1_100, `answered after ${took} ms`);
    assert.match(r.json.error.message, /sent nothing within \d+ ms/);

    // Three deployments: each once.
    const hits3 = [0, 0, 0];
    const three = await Promise.all(
      hits3.map((_, i) =>
        fixture((req, res) => {
          hits3[i]!++;
          req.resume();
          res.writeHead(503).end('{"error":{"message":"busy"}}');
        }),
      ),
    );
    for (const f of three) open.keep(f);
    const g = open.keep(await startGateway(three.map((f) => ({ baseUrl: f.url }))));
    assert.equal((await http(g.url, 'POST', '/v1/chat/completions', { key: g.adminKey, body: ask })).status, 502);
    assert.deepEqual(hits3, [1, 1, 1]);
  });

  // A regression would hang, not fail: the timeout makes it fail.
  it(
    'ends an upstream stream that sends keep-alives or empty chunks but no output: a 504 or 502, never a hang or a heap',
    { timeout: 60_000 },
    async () => {
      // The first message picks the misbehaviour.
      const upstream = open.keep(
        await jsonFixture<{ messages: Array<{ content: string }> }>((body, res) => {
          const mode = body.messages[0]!.content;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          const ping = () => {
            const timer = setInterval(() => res.write(': ping\n\n'), 20);
            res.on('close', () => clearInterval(timer));
          };
          if (mode === 'pings') ping();
          else if (mode === 'slow') {
            // A model that thinks unseen between outputs, longer than the idle timeout, with keep-alives.
            res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
            ping();
            setTimeout(() => res.end(`${chunkFrame({ content: ' upon a time' }, 'stop')}data: [DONE]\n\n`), 400);
          } else if (mode === 'empties') {
            res.write(chunkFrame({ role: 'assistant', content: '' }));
            pump(res, chunkFrame({}), 200 * 1024 * 1024);
          } else {
            res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
            ping();
          }
        }),
      );
      const s = open.keep(
        await startGateway([{ baseUrl: upstream.url }], {
          SWITCHYARD_UPSTREAM_FIRST_BYTE_TIMEOUT_MS: '500',
          SWITCHYARD_UPSTREAM_IDLE_TIMEOUT_MS: '300',
          SWITCHYARD_UPSTREAM_ATTEMPTS_TIMEOUT_MS: '900',
          SWITCHYARD_UPSTREAM_MAX_LINE_BYTES: '65536',
        }),
      );
      const say = (content: string) => [{ role: 'user', content }];
      // Pings alone, before any output: the first-byte timeout's time, on both lanes, stream or not.
      for (const [path, body] of [
        ['/v1/chat/completions', { model: MODEL, messages: say('pings') }],
        ['/v1/chat/completions', { model: MODEL, messages: say('pings'), stream: true }],
        ['/v1/responses', { model: MODEL, input: say('pings') }],
        ['/v1/responses', { model: MODEL, input: say('pings'), stream: true }],
      ] as const) {
        const started = Date.now();
        const r = await http(s.url, 'POST', path, { key: s.adminKey, body });
        assert.equal(r.status, 504, `${path} ${r.text}`);
        assert.equal(r.json.error.code, 'upstream_timeout');
        assert.match(r.json.error.message, /sent no output for \d+ ms/);
        assert.ok(Date.now() - started < 3_000, `answered after ${Date.now() - started} ms`);
      }
      // Empty chunks without end: held for failover only up to the bound of one event.
      const empties = await http(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model: MODEL, messages: say('empties'), stream: true },
      });
      assert.equal(empties.status, 502, empties.text);
      assert.match(empties.json.error.message, /more than 65536 bytes without any output/);
      // Output, then pings: the same time between outputs ends the stream with an error after what was sent.
      for (const path of ['/v1/chat/completions', '/v1/responses']) {
        const body =
          path === '/v1/responses'
            ? { model: MODEL, input: say('stall'), stream: true }
            : { model: MODEL, messages: say('stall'), stream: true };
        const stalled = await http(s.url, 'POST', path, { key: s.adminKey, body });
        assert.equal(stalled.status, 200, stalled.text);
        assert.match(stalled.text, /Once/);
        assert.match(stalled.text, /sent no output for 500 ms/);
      }
      // Keep-alives between outputs for longer than the idle timeout, within that time: a whole answer.
      const slow = await http<{ choices: Array<{ message: { content: string } }> }>(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model: MODEL, messages: say('slow') },
      });
      assert.equal(slow.status, 200, slow.text);
      assert.equal(slow.json.choices[0]!.message.content, 'Once upon a time');
    },
  );

  it('records an answer cut at max_tokens as billed for what it produced', async () => {
    const endless = open.keep(
      await fixture((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const go = () => {
          while (!res.destroyed) if (!res.write(chunkFrame({ content: 'x' }))) return void res.once('drain', go);
        };
        go();
      }),
    );
    const s: TestServer = open.keep(
      await startGateway(
        [{ baseUrl: endless.url }],
        {},
        {
          pricing: [
            { metric: 'input_tokens', rate: 1 },
            { metric: 'output_tokens', rate: 1 },
          ],
        },
      ),
    );
    await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: { ...ask, max_tokens: 7, stream: true } });
    const u = await http<WireList<{ output_tokens: number; estimated_requests: number; cost: number }>>(
      s.url,
      'GET',
      '/admin/usage?group_by=model',
      { key: s.adminKey },
    );
    assert.equal(u.json.data[0]!.output_tokens, 7);
    assert.equal(u.json.data[0]!.estimated_requests, 1);
    assert.ok(u.json.data[0]!.cost > 0);
  });
});
