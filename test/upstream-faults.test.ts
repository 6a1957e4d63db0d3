import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';
import { Pool } from 'undici';
import { http, type TestServer, type WireList } from './helpers/server.js';
import { GATEWAY_MODEL as MODEL, chunkFrame, closers, completionBody, fixture, startGateway } from './helpers/fixtures.js';
import { deferred, eventually } from './helpers/wait.js';
import { spawnReady, type Proc } from '../bench/lib.js';

const ask = { model: MODEL, messages: [{ role: 'user' as const, content: 'Once upon a time' }], max_tokens: 8 };

interface WireDeployment {
  id: string;
  health: string;
}
interface UsageRow {
  group: string;
  requests: number;
  errors: number;
}

/** A fixture that counts the generation requests it gets and answers them with `answer`. */
async function counting(answer: (res: ServerResponse, req: IncomingMessage) => void) {
  const hits = { post: 0, probe: 0 };
  const f = await fixture((req, res) => {
    req.resume();
    if (req.method === 'GET') hits.probe += 1;
    else hits.post += 1;
    answer(res, req);
  });
  return { ...f, hits };
}

const ok = (res: ServerResponse) => res.writeHead(200, { 'content-type': 'application/json' }).end(completionBody('fine'));

async function usage(s: TestServer): Promise<UsageRow> {
  const r = await http<WireList<UsageRow>>(s.url, 'GET', '/admin/usage?group_by=model', { key: s.adminKey });
  return r.json.data[0] ?? { group: '', requests: 0, errors: 0 };
}

describe('upstream faults', () => {
  const open = closers();
  after(() => open.closeAll());
  const keep = open.keep;

  it('retries a 503 and a 429 on another deployment, and keeps off a deployment for its retry-after', async () => {
    const failing = keep(
      await counting((res) => res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"overloaded"}}')),
    );
    const limited = keep(
      await counting((res) =>
        res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '30' }).end('{"error":{"message":"slow down"}}'),
      ),
    );
    const healthy = keep(await counting(ok));
    const s = keep(
      await startGateway([
        { baseUrl: limited.url, weight: 1e9 },
        { baseUrl: failing.url, weight: 1e6 },
        { baseUrl: healthy.url, weight: 1 },
      ]),
    );
    const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 });

    const first = await client.chat.completions.create(ask);
    assert.equal(first.choices[0]!.message.content, 'fine');
    assert.deepEqual([limited.hits.post, failing.hits.post, healthy.hits.post], [1, 1, 1], 'tried 429, then 503, then the healthy one');

    const second = await client.chat.completions.create(ask);
    assert.equal(second.choices[0]!.message.content, 'fine');
    assert.equal(limited.hits.post, 1, 'the deployment that said retry-after 30 is not asked again');
    assert.equal(failing.hits.post, 2);
    assert.equal(healthy.hits.post, 2);
    const metrics = (await http(s.url, 'GET', '/metrics')).text;
    assert.match(metrics, /switchyard_upstream_retries_total 3/);
  });

  it('answers 429 with the upstream retry-after while every deployment is cooling, without calling it', async () => {
    const limited = keep(await counting((res) => res.writeHead(429, { 'retry-after': '20' }).end('{"error":{"message":"slow down"}}')));
    const s = keep(await startGateway([{ baseUrl: limited.url }]));
    const r1 = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(r1.status, 429);
    assert.equal(r1.headers['retry-after'], '20');
    const r2 = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(r2.status, 429);
    assert.ok(Number(r2.headers['retry-after']) <= 20 && Number(r2.headers['retry-after']) >= 19, String(r2.headers['retry-after']));
    assert.equal(limited.hits.post, 1);
  });

  it('stops retrying once the retry budget is spent, so an outage is not multiplied', async () => {
    const down = keep(await counting((res) => res.writeHead(503).end('{"error":{"message":"down"}}')));
    const s = keep(
      await startGateway([{ baseUrl: down.url }], { SWITCHYARD_RETRY_BUDGET_RATIO: '0', SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '2' }),
    );
    let next = 0;
    const worker = async () => {
      while (next < 150) {
        next += 1;
        assert.equal((await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask })).status, 502);
      }
    };
    await Promise.all(Array.from({ length: 10 }, worker));
    // 150 first tries, and retries only up to the budget's floor of 10 per second over 10 s.
    assert.equal(down.hits.post, 150 + 100);
    // Each failed attempt is counted once in the upstream-error metric, no more.
    const counted = /^switchyard_upstream_errors_total\{deployment="d0",code="upstream_error"\} (\d+)$/m.exec(
      (await http(s.url, 'GET', '/metrics')).text,
    );
    assert.equal(Number(counted?.[1]), down.hits.post);
  });

  it('ejects a deployment after consecutive failures and brings it back when its health check passes', async () => {
    let broken = true;
    const flaky = keep(
      await counting((res, req) => {
        if (broken) res.writeHead(500).end('{"error":{"message":"boom"}}');
        else if (req.method === 'GET') res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[]}');
        else ok(res);
      }),
    );
    const steady = keep(await counting(ok));
    const s = keep(
      await startGateway(
        [
          { baseUrl: flaky.url, weight: 1e9 },
          { baseUrl: steady.url, weight: 1 },
        ],
        {
          SWITCHYARD_BREAKER_FAILURES: '3',
          SWITCHYARD_HEALTH_CHECK_INTERVAL_MS: '100',
          SWITCHYARD_BREAKER_EJECT_MS: '60000',
        },
      ),
    );
    // Every deployment has its series from the start, before any ejection.
    const before = (await http(s.url, 'GET', '/metrics')).text;
    assert.match(before, /switchyard_deployment_up\{deployment="d0"\} 1/);
    assert.match(before, /switchyard_deployment_up\{deployment="d1"\} 1/);
    for (let i = 0; i < 6; i++) {
      const r = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
      assert.equal(r.status, 200, r.text);
    }
    assert.equal(flaky.hits.post, 3, 'three failures eject it; later requests go straight to the other');
    assert.equal(steady.hits.post, 6);
    const listed = await http<WireList<WireDeployment>>(s.url, 'GET', '/admin/deployments', { key: s.adminKey });
    assert.equal(listed.json.data.find((d) => d.id === 'd0')?.health, 'ejected');
    assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_deployment_up\{deployment="d0"\} 0/);

    await eventually(() => assert.ok(flaky.hits.probe >= 2, 'probed while out'));
    broken = false;
    await eventually(async () => {
      const l = await http<WireList<WireDeployment>>(s.url, 'GET', '/admin/deployments', { key: s.adminKey });
      assert.equal(l.json.data.find((d) => d.id === 'd0')?.health, 'up');
    });
    const back = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(back.status, 200);
    assert.equal(flaky.hits.post, 4, 'back in rotation after a passing health check');
    assert.match((await http(s.url, 'GET', '/metrics')).text, /switchyard_deployment_up\{deployment="d0"\} 1/);
  });

  it('gives up on an upstream that sends nothing within the first-byte timeout, with 504', async () => {
    const silent = keep(await counting(() => undefined));
    const s = keep(
      await startGateway([{ baseUrl: silent.url }], {
        SWITCHYARD_UPSTREAM_FIRST_BYTE_TIMEOUT_MS: '300',
        SWITCHYARD_UPSTREAM_MAX_ATTEMPTS: '1',
      }),
    );
    const r = await http(s.url, 'POST', '/v1/chat/completions', { key: s.adminKey, body: ask });
    assert.equal(r.status, 504);
    assert.equal(r.json.error.code, 'upstream_timeout');
    assert.match(r.json.error.message, /300 ms/);
  });

  it('ends a stream that goes silent with an error frame, and records it as failed', async () => {
    const stalls = keep(
      await counting((res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: '' }));
        res.write(chunkFrame({ content: 'Once' }));
      }),
    );
    const s = keep(await startGateway([{ baseUrl: stalls.url }], { SWITCHYARD_UPSTREAM_IDLE_TIMEOUT_MS: '300' }));
    const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 });
    let text = '';
    await assert.rejects(
      (async () => {
        for await (const c of await client.chat.completions.create({ ...ask, stream: true })) text += c.choices[0]?.delta.content ?? '';
      })(),
      (err: unknown) => err instanceof OpenAI.APIError && /silent for 300 ms/.test(err.message),
    );
    assert.equal(text, 'Once');
    assert.equal(stalls.hits.post, 1, 'bytes went out: never retried');
    const u = await usage(s);
    assert.deepEqual([u.requests, u.errors], [1, 1]);
  });

  it('closes the upstream connection of a stream its client left, and opens none in its place', async () => {
    // undici 7 reconnected after every aborted call (nodejs/undici#5845): each client that went
    // away mid-stream left a fresh, never-used connection on the upstream.
    const accepted = new Set<Socket>();
    const carried = new Set<Socket>();
    let heldOpen = 0;
    const heldClosed = deferred();
    const STREAMS = 3;
    const upstream = keep(
      await fixture((req, res) => {
        carried.add(req.socket);
        let body = '';
        req.setEncoding('utf8');
        req.on('data', (c: string) => (body += c));
        req.on('end', () => {
          if (req.method === 'GET') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[]}');
          if (!(JSON.parse(body) as { stream?: boolean }).stream) return void ok(res);
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(chunkFrame({ role: 'assistant', content: 'Once' }));
          // Held open until the gateway lets go.
          heldOpen += 1;
          req.socket.once('close', () => {
            heldOpen -= 1;
            if (heldOpen === 0) heldClosed.resolve();
          });
        });
      }),
    );
    upstream.server.on('connection', (s: Socket) => accepted.add(s));
    const s = keep(await startGateway([{ baseUrl: upstream.url }]));
    const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 });
    const streams = await Promise.all(Array.from({ length: STREAMS }, () => client.chat.completions.create({ ...ask, stream: true })));
    for (const stream of streams) {
      const first = await stream[Symbol.asyncIterator]().next();
      assert.equal(first.done, false);
    }
    assert.equal(heldOpen, STREAMS);
    for (const stream of streams) stream.controller.abort();
    // The gateway closes each upstream connection when its client goes away (the upstream's only
    // sign to stop generating).
    await heldClosed.promise;
    // A reconnect would be opened as the gateway handles those closes, before it reads this request.
    const after = await client.chat.completions.create(ask);
    assert.equal(after.choices[0]?.message.content, 'fine');
    const idle = [...accepted].filter((sock) => !carried.has(sock));
    assert.equal(idle.length, 0, `${idle.length} connections opened to the upstream carried no request`);
  });

  it('ends a Responses stream that breaks with response.failed, stored as failed', async () => {
    const breaks = keep(
      await counting((res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunkFrame({ role: 'assistant', content: '' }));
        res.write(chunkFrame({ content: 'Once' }));
        setTimeout(() => res.socket?.destroy(), 20);
      }),
    );
    const s = keep(await startGateway([{ baseUrl: breaks.url }]));
    const client = new OpenAI({ apiKey: s.adminKey, baseURL: s.baseURL, maxRetries: 0 });
    const types: string[] = [];
    let id = '';
    // The `error` event before `response.failed` (Open Responses): the openai SDK throws there.
    await assert.rejects(
      async () => {
        for await (const ev of await client.responses.create({ model: MODEL, input: 'Once upon a time', stream: true })) {
          types.push(ev.type);
          if (ev.type === 'response.created') id = ev.response.id;
        }
      },
      (err: unknown) => err instanceof OpenAI.APIError && err.code === 'upstream_error',
    );
    assert.ok(types.includes('response.output_text.delta'), types.join(' '));
    assert.ok(!types.includes('response.completed'));
    // The AI SDK reports it as an error, not as an answer that ended for no reason (an outside
    // pass: before the error event it read the cut text as finishReason "unknown", no error).
    const provider = createOpenAI({ apiKey: s.adminKey, baseURL: s.baseURL });
    let reported: unknown;
    const result = streamText({ model: provider.responses(MODEL), prompt: 'Once upon a time', onError: (e) => void (reported = e.error) });
    let text = '';
    for await (const delta of result.textStream) text += delta;
    assert.equal(text, 'Once');
    // @ai-sdk/openai 2 reports an error event through onError and leaves the finish reason
    // 'unknown' (it reads no finish from response.failed); before, onError never ran.
    assert.notEqual(await result.finishReason, 'stop');
    assert.match(JSON.stringify(reported), /upstream_error/, 'the AI SDK reported the error');
    const stored = await client.responses.retrieve(id);
    assert.equal(stored.status, 'failed');
    assert.equal(stored.error?.code, 'upstream_error');
    const u = await usage(s);
    assert.deepEqual([u.requests, u.errors], [2, 2], "the openai SDK's request and the AI SDK's");
  });

  it('serves 1,000 requests with 0 errors while one of two deployments is killed mid-run', async () => {
    const ups: Proc[] = [await spawnReady('fake-upstream.js', ['0']), await spawnReady('fake-upstream.js', ['0'])];
    open.add(async () => {
      for (const u of ups) await u.stop();
    });
    const s = keep(await startGateway(ups.map((u) => ({ baseUrl: `${u.url}/v1` }))));
    const pool = new Pool(s.url, { connections: 16 });
    open.add(() => pool.close());
    const body = JSON.stringify(ask);
    const statuses = new Map<number, number>();
    let done = 0;
    let next = 0;
    const worker = async () => {
      while (next < 1000) {
        next += 1;
        const res = await pool.request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { authorization: `Bearer ${s.adminKey}`, 'content-type': 'application/json' },
          body,
        });
        await res.body.dump();
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        if (++done === 300) ups[0]!.child.kill('SIGKILL');
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    assert.deepEqual([...statuses], [[200, 1000]]);
    const listed = await http<WireList<WireDeployment>>(s.url, 'GET', '/admin/deployments', { key: s.adminKey });
    assert.equal(listed.json.data.find((d) => d.id === 'd0')?.health, 'ejected');
    const u = await usage(s);
    assert.deepEqual([u.requests, u.errors], [1000, 0]);
    const retries = /switchyard_upstream_retries_total (\d+)/.exec((await http(s.url, 'GET', '/metrics')).text)?.[1];
    console.log(`# failover: 1,000 requests, ${statuses.get(200)} × 200, deployment d0 killed after 300, ${retries} retries`);
  });
});
