import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { http, startServer, type TestServer, type WireKey, type WireList } from './helpers/server.js';
import { GATEWAY_MODEL as MODEL, chunkFrame, closers, completionJson, fixture, jsonFixture, startGateway } from './helpers/fixtures.js';
import { settle } from './helpers/wait.js';

interface Total {
  requests: number;
  errors: number;
  input_tokens: number;
  output_tokens: number;
  cost: number;
  unpriced_requests: number;
  estimated_requests: number;
}

const PRICE = [
  { metric: 'input_tokens', rate: 100 },
  { metric: 'output_tokens', rate: 100 },
];

async function usageOnce(s: TestServer, want: number): Promise<Total> {
  const read = async () => (await http<WireList<Total>>(s.url, 'GET', '/admin/usage?group_by=model', { key: s.adminKey })).json.data[0];
  const t = await settle(read, (x) => x !== undefined && x.requests >= want, 10_000, 25);
  assert.ok(t, 'a usage record exists');
  return t;
}

/** Sends a streamed chat request on a raw socket, reads until `until` says so, then leaves. */
function leaveStream(s: TestServer, key: string, body: object, until: (received: string) => boolean): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    const json = JSON.stringify(body);
    let received = '';
    socket.on('data', (d: Buffer) => {
      received += d.toString();
      if (until(received)) {
        socket.destroy();
        resolve(received);
      }
    });
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(json)}\r\n\r\n${json}`,
    );
  });
}

describe('every generation is billed for what it produced', () => {
  const open = closers();
  after(() => open.closeAll());

  it('bills a local generation the client left mid-stream, for the tokens it generated', async () => {
    const s = open.keep(
      await startServer({
        configFile: {
          name: 'priced.json',
          text: JSON.stringify({ localModels: { 'stories260K.gguf': { id: 'meta-llama/tiny-stories', pricing: PRICE } } }),
        },
      }),
    );
    const body = {
      model: 'meta-llama/tiny-stories',
      messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 400,
      stream: true,
    };
    const seen = await leaveStream(s, s.adminKey, body, (r) => (r.match(/"content":"[^"]+"/g) ?? []).length >= 10);
    assert.ok(seen.includes('chat.completion.chunk'));
    const t = await usageOnce(s, 1);
    assert.equal(t.requests, 1);
    assert.equal(t.errors, 1, 'recorded as cancelled (499)');
    assert.ok(t.output_tokens >= 10 && t.output_tokens < 400, `${t.output_tokens} output tokens`);
    assert.equal(t.input_tokens, 5);
    assert.ok(Math.abs(t.cost - ((5 + t.output_tokens) * 100) / 1e6) < 1e-9, `cost ${t.cost}`);
    assert.equal(t.estimated_requests, 0, 'the local engine counts exactly');
  });

  it('bills an upstream answer whose client left before the usage chunk, by estimate', async () => {
    const holds = open.keep(
      await fixture((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: '' }));
        for (let i = 0; i < 12; i++) res.write(chunkFrame({ content: ' word' }));
        res.write(chunkFrame({}, 'stop'));
        // The usage chunk and [DONE] never come: the client leaves first.
      }),
    );
    const s = open.keep(await startGateway([{ baseUrl: holds.url }], {}, { pricing: PRICE }));
    await leaveStream(
      s,
      s.adminKey,
      { model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }], stream: true },
      (r) => (r.match(/ word/g) ?? []).length >= 12,
    );
    const t = await usageOnce(s, 1);
    // 12 deltas of " word": 60 characters, 15 tokens at 4 characters a token (and at least one per delta).
    assert.equal(t.output_tokens, 15);
    assert.ok(t.input_tokens > 0);
    assert.ok(t.cost > 0);
    assert.equal(t.estimated_requests, 1);
  });

  it('never records an upstream that reports no usage as free', async () => {
    const silent = open.keep(
      await fixture((req, res) => {
        let raw = '';
        req.on('data', (c: Buffer) => {
          raw += c.toString();
        });
        req.on('end', () => {
          if ((JSON.parse(raw) as { stream?: boolean }).stream) {
            res.writeHead(200, { 'content-type': 'text/event-stream' });
            res.write(chunkFrame({ role: 'assistant', content: 'Once upon a time there was' }));
            res.end(`${chunkFrame({}, 'stop')}data: [DONE]\n\n`);
          } else {
            res.writeHead(200, { 'content-type': 'application/json' }).end(
              JSON.stringify({
                id: 'x',
                object: 'chat.completion',
                choices: [{ index: 0, message: { role: 'assistant', content: 'Once upon a time there was' }, finish_reason: 'stop' }],
              }),
            );
          }
        });
      }),
    );
    const s = open.keep(await startGateway([{ baseUrl: silent.url }], {}, { pricing: PRICE }));
    for (const stream of [false, true]) {
      const r = await http(s.url, 'POST', '/v1/chat/completions', {
        key: s.adminKey,
        body: { model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }], stream },
      });
      assert.equal(r.status, 200);
    }
    const t = await usageOnce(s, 2);
    assert.equal(t.requests, 2);
    // 26 characters ≈ 7 tokens (4 characters a token), at least one per delta.
    assert.equal(t.output_tokens, 14);
    assert.ok(t.input_tokens > 0);
    assert.ok(t.cost > 0, 'not $0');
    assert.equal(t.unpriced_requests, 0);
    assert.equal(t.estimated_requests, 2, 'and marked as an estimate');
  });

  it('bills the estimate, flagged, where an upstream reports usage that cannot be right (a billion tokens for a word, or none)', async () => {
    const liar = open.keep(
      await jsonFixture<{ stream?: boolean; messages: Array<{ content: string }> }>((body, res) => {
        const usage =
          body.messages[0]!.content === 'huge'
            ? { prompt_tokens: 2_000_000_000, completion_tokens: 1_000_000_000, total_tokens: 3_000_000_000 }
            : { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
        const text = 'Once upon a time there was';
        const usageFrame = `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage })}\n\n`;
        if (body.messages[0]!.content === 'huge-first') {
          // The count of the prompt before the output, and output past max_tokens: cut there.
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(usageFrame.replace('"prompt_tokens":0', '"prompt_tokens":2000000000'));
          for (let i = 0; i < 40; i++) res.write(chunkFrame({ content: 'x ' }));
          return void res.end(`${chunkFrame({}, 'stop')}data: [DONE]\n\n`);
        }
        if (!body.stream)
          return void res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(completionJson({ role: 'assistant', content: text }, 'stop', usage));
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: text }));
        res.write(chunkFrame({}, 'stop'));
        res.end(
          `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage })}\n\ndata: [DONE]\n\n`,
        );
      }),
    );
    const s = open.keep(await startGateway([{ baseUrl: liar.url }], {}, { pricing: PRICE }));
    type Answer = { usage?: { prompt_tokens: number; completion_tokens: number; input_tokens: number; output_tokens: number } };
    let n = 0;
    for (const content of ['huge', 'none']) {
      // The fast lane (chat to a chat upstream), whole and streamed, and the canonical lane (Responses).
      for (const stream of [false, true]) {
        const r = await http<Answer>(s.url, 'POST', '/v1/chat/completions', {
          key: s.adminKey,
          body: {
            model: MODEL,
            messages: [{ role: 'user', content }],
            max_tokens: 50,
            stream,
            stream_options: stream ? { include_usage: true } : undefined,
          },
        });
        assert.equal(r.status, 200, r.text);
        const usage = stream ? (JSON.parse(r.text.split('\n\n').at(-3)!.slice(6)) as Answer).usage! : r.json.usage!;
        // 26 characters: 7 tokens by estimate; the prompt, a word and its role, a few.
        assert.deepEqual([usage.completion_tokens, usage.prompt_tokens > 0 && usage.prompt_tokens < 50], [7, true], r.text);
        n++;
      }
      const resp = await http<Answer>(s.url, 'POST', '/v1/responses', {
        key: s.adminKey,
        body: { model: MODEL, input: content, max_output_tokens: 50 },
      });
      assert.equal(resp.status, 200, resp.text);
      assert.equal(resp.json.usage!.output_tokens, 7, resp.text);
      // Streamed on the canonical lane: the count is read as it comes, and still not believed.
      const streamed = await http(s.url, 'POST', '/v1/responses', {
        key: s.adminKey,
        body: { model: MODEL, input: content, max_output_tokens: 50, stream: true },
      });
      const done = JSON.parse(
        streamed.text
          .split('\n\n')
          .filter((f) => f.includes('response.completed'))[0]!
          .split('data: ')[1]!,
      ) as {
        response: Answer;
      };
      assert.equal(done.response.usage!.output_tokens, 7, streamed.text);
      assert.ok(done.response.usage!.input_tokens < 50, streamed.text);
      n += 2;
    }
    // Cut at max_tokens after a count of the prompt past the context: the estimate of the prompt.
    const cut = await http<Answer>(s.url, 'POST', '/v1/chat/completions', {
      key: s.adminKey,
      body: {
        model: MODEL,
        messages: [{ role: 'user', content: 'huge-first' }],
        max_tokens: 5,
        stream: true,
        stream_options: { include_usage: true },
      },
    });
    const cutUsage = (JSON.parse(cut.text.split('\n\n').at(-3)!.slice(6)) as Answer).usage!;
    assert.deepEqual([cutUsage.completion_tokens, cutUsage.prompt_tokens < 50], [5, true], cut.text);
    n++;
    const t = await usageOnce(s, n);
    assert.equal(t.output_tokens, 7 * (n - 1) + 5);
    assert.ok(t.input_tokens > 0 && t.input_tokens < 50 * n, String(t.input_tokens));
    // Estimates of a few tokens each (a billion tokens would cost thousands of dollars here).
    assert.ok(t.cost > 0 && t.cost < 0.05, String(t.cost));
    assert.equal(t.estimated_requests, n, 'and marked as an estimate');
    assert.match(
      (await http(s.url, 'GET', '/metrics')).text,
      new RegExp(`switchyard_upstream_usage_invalid_total\\{deployment="d0"\\} ${n}\\b`),
    );
  });

  it('keeps a budget under concurrency: spend is reserved at admission, so 30 requests at once do not overshoot', async () => {
    // Each request may cost at most 100 output tokens at $100 per million: $0.01, plus its input.
    const slow = open.keep(
      await fixture((req, res) => {
        req.resume();
        setTimeout(
          () =>
            res.writeHead(200, { 'content-type': 'application/json' }).end(
              JSON.stringify({
                id: 'x',
                object: 'chat.completion',
                choices: [{ index: 0, message: { role: 'assistant', content: 'fine' }, finish_reason: 'stop' }],
                usage: { prompt_tokens: 5, completion_tokens: 100, total_tokens: 105 },
              }),
            ),
          200,
        );
      }),
    );
    const s = open.keep(await startGateway([{ baseUrl: slow.url }], {}, { pricing: PRICE }));
    const created = await http<WireKey>(s.url, 'POST', '/admin/keys', {
      key: s.adminKey,
      body: { org: 'acme', name: 'budget', limits: { budget: 0.05, budget_period: 'day' } },
    });
    const key = created.json.key!;
    const results = await Promise.all(
      Array.from({ length: 30 }, () =>
        http(s.url, 'POST', '/v1/chat/completions', {
          key,
          body: { model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 100 },
        }),
      ),
    );
    const ok = results.filter((r) => r.status === 200).length;
    const refused = results.filter((r) => r.status === 429 && r.json.error.code === 'budget_exceeded').length;
    assert.equal(ok + refused, 30);
    const t = await usageOnce(s, ok);
    const perRequest = ((5 + 100) * 100) / 1e6;
    console.log(
      `# budget $0.05, 30 concurrent requests of $${perRequest.toFixed(4)}: ${ok} admitted, ${refused} refused, $${t.cost.toFixed(4)} spent`,
    );
    // Overshoot is bounded by the worst case of requests admitted while there was room: here, none.
    assert.ok(t.cost <= 0.05 + perRequest, `spent $${t.cost}`);
    assert.ok(ok >= 4, `${ok} admitted`);
    // What was reserved and not spent is given back: with the budget raised, the next request passes.
    const k = (await http<WireList<WireKey>>(s.url, 'GET', '/admin/keys?org=acme', { key: s.adminKey })).json.data[0]!;
    await http(s.url, 'PATCH', `/admin/keys/${k.id}`, {
      key: s.adminKey,
      body: { limits: { budget: t.cost + perRequest * 1.5, budget_period: 'day' } },
    });
    const next = await http(s.url, 'POST', '/v1/chat/completions', {
      key,
      body: { model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 100 },
    });
    assert.equal(next.status, 200, next.text);
  });
});
