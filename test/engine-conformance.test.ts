import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import pino from 'pino';
import { LocalEngine } from '../src/engines/local/local-engine.js';
import { UpstreamEngine } from '../src/engines/upstream/upstream-engine.js';
import type { DeploymentTarget, Engine } from '../src/engines/engine.js';
import { newTally, type GenerationEvent, type GenerationRequest } from '../src/core/canonical.js';
import { ApiError } from '../src/core/errors.js';
import { loadConfig, upstreamOptions } from '../src/config.js';
import { createKey, SHARED_MODELS, startServer, type TestServer } from './helpers/server.js';

const log = pino({ level: 'silent' });

interface Subject {
  engine: Engine;
  target: DeploymentTarget;
}

function request(overrides: Partial<GenerationRequest> = {}): GenerationRequest {
  return {
    model: 'test/model',
    messages: [{ role: 'user', content: 'Once upon a time' }],
    sampling: { temperature: 0 },
    maxOutputTokens: 20,
    stream: true,
    signal: new AbortController().signal,
    tally: newTally(),
    ...overrides,
  };
}

async function collect(engine: Engine, req: GenerationRequest, target: DeploymentTarget): Promise<GenerationEvent[]> {
  const out: GenerationEvent[] = [];
  for await (const ev of engine.generate(req, target)) out.push(ev);
  return out;
}

const textOf = (events: GenerationEvent[]) => events.map((e) => (e.type === 'text.delta' ? e.text : '')).join('');

/** The one contract every engine keeps (see src/engines/engine.ts). */
function conformance(name: string, setup: () => Promise<Subject>): void {
  describe(`engine conformance: ${name}`, () => {
    let s: Subject;
    before(async () => {
      s = await setup();
    });

    for (const stream of [true, false]) {
      it(`emits text deltas, then one usage, then one finish (stream: ${stream})`, async () => {
        const events = await collect(s.engine, request({ stream }), s.target);
        const kinds = events.map((e) => e.type);
        assert.ok(kinds.filter((k) => k === 'text.delta').length >= 1);
        assert.equal(kinds.filter((k) => k === 'usage').length, 1);
        assert.equal(kinds.filter((k) => k === 'finish').length, 1);
        assert.deepEqual(kinds.slice(-2), ['usage', 'finish']);
        const usage = events.find((e) => e.type === 'usage');
        assert.ok(usage?.type === 'usage' && usage.usage.output === 20 && usage.usage.input === 5);
        const finish = events.at(-1);
        assert.ok(finish?.type === 'finish' && finish.reason === 'length');
        assert.match(textOf(events), /^, there was a little girl/);
      });
    }

    it('is deterministic at temperature 0', async () => {
      const a = textOf(await collect(s.engine, request(), s.target));
      const b = textOf(await collect(s.engine, request(), s.target));
      assert.equal(a, b);
    });

    it('stops before a stop sequence with reason stop', async () => {
      const events = await collect(s.engine, request({ sampling: { temperature: 0, stop: ['girl'] }, maxOutputTokens: 50 }), s.target);
      assert.equal(textOf(events), ', there was a little ');
      const finish = events.at(-1);
      assert.ok(finish?.type === 'finish' && finish.reason === 'stop');
    });

    it('throws context_length_exceeded before any event', async () => {
      const it = s.engine.generate(request({ maxOutputTokens: 1000 }), s.target)[Symbol.asyncIterator]();
      await assert.rejects(it.next(), (err: unknown) => err instanceof ApiError && err.code === 'context_length_exceeded');
    });

    it('ends promptly when the request is aborted', async () => {
      const abort = new AbortController();
      let n = 0;
      for await (const ev of s.engine.generate(request({ maxOutputTokens: 400, signal: abort.signal }), s.target)) {
        if (ev.type === 'text.delta' && ++n === 2) abort.abort();
        assert.ok(n < 50, 'generation went on after the abort');
      }
      // The engine is usable straight after.
      assert.ok(textOf(await collect(s.engine, request({ maxOutputTokens: 3 }), s.target)).length > 0);
    });
  });
}

const stories = join(SHARED_MODELS, 'stories260K.gguf');
let upstreamServer: TestServer | undefined;
const engines: Engine[] = [];
after(async () => {
  for (const e of engines) await e.close();
  await upstreamServer?.close();
});

/** A new local engine (closed after the tests) with nothing loaded yet. */
function localEngine(parallel: number): LocalEngine {
  const engine = new LocalEngine({
    threads: 1,
    parallel,
    queueSize: 4,
    memoryBudgetBytes: 512 * 1024 * 1024,
    gpu: false,
    templates: new Map(),
    schemaCacheSize: 16,
    schemaCompileTimeoutMs: 5000,
    log,
  });
  engines.push(engine);
  return engine;
}
const storiesTarget: DeploymentTarget = { engine: 'local', file: stories, contextLength: 512, reasoning: false };

conformance('local (node-llama-cpp)', () => Promise.resolve({ engine: localEngine(2), target: storiesTarget }));

describe('local engine: a request stopped while its model loads', () => {
  it('ends at once as cancelled, and the model goes on loading for the next request', async () => {
    // A fresh engine: nothing loaded yet, so the first request waits for the load.
    const engine = localEngine(1);
    const target = storiesTarget;
    const abort = new AbortController();
    const first = engine
      .generate(request({ signal: abort.signal }), target)
      [Symbol.asyncIterator]()
      .next();
    // Stopped before the load can have finished (it has not even been handed to llama.cpp yet):
    // a shutdown or a client leaving must not wait the load out.
    abort.abort();
    await assert.rejects(first, (err: unknown) => err instanceof ApiError && err.code === 'cancelled');
    assert.match(textOf(await collect(engine, request(), target)), /^, there was a little girl/);
  });
});

conformance('upstream (OpenAI-compatible, here a Switchyard serving the same model)', async () => {
  upstreamServer = await startServer();
  const { key } = await createKey(upstreamServer, 'upstream-user');
  const engine = new UpstreamEngine(log, upstreamOptions(loadConfig({ env: {} })));
  engines.push(engine);
  return {
    engine,
    target: {
      engine: 'upstream',
      id: 'test',
      baseUrl: upstreamServer.baseURL,
      apiKey: key,
      upstreamModel: 'local/stories260k',
      api: 'chat',
      guarded: false,
    },
  };
});

conformance('upstream speaking the Responses API (a Switchyard again)', async () => {
  upstreamServer ??= await startServer();
  const { key } = await createKey(upstreamServer, 'upstream-user-2');
  const engine = new UpstreamEngine(log, upstreamOptions(loadConfig({ env: {} })));
  engines.push(engine);
  return {
    engine,
    target: {
      engine: 'upstream',
      id: 'test-responses',
      baseUrl: upstreamServer.baseURL,
      apiKey: key,
      upstreamModel: 'local/stories260k',
      api: 'responses',
      guarded: false,
    },
  };
});
