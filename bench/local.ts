/**
 * Local engine: tokens/s and time to first token through the HTTP API against raw node-llama-cpp on
 * the same model, thread count and prompt, for one stream and for four concurrent ones. The server
 * runs as a child process (as in production); the raw loops run here, alternating with it.
 */
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { getLlama, LlamaLogLevel, type LlamaContext, type LlamaModel } from 'node-llama-cpp';
import { request } from 'undici';
import { PACKAGE_ROOT } from '../src/config.js';
import { ADMIN_KEY, median, startMain } from './lib.js';
import { SMOLLM_135M, TINY, writeFixture, type Shape } from './gguf-fixture.js';

const PROMPT = 'Once upon a time';
const THREADS = 1;
const PARALLEL = 4;

export interface LocalRun {
  streams: number;
  raw_tps: number;
  /** Non-stream requests: the engine's throughput, without a socket write per token. */
  api_tps: number;
  ratio: number;
  /** Streamed requests (one SSE event per token, read by this process on the same cores). */
  api_stream_tps: number;
  stream_ratio: number;
  raw_ttft_ms: number;
  api_ttft_ms: number;
}

export interface LocalResult {
  model: string;
  shape: string;
  threads: number;
  tokens: number;
  single: LocalRun;
  four: LocalRun;
}

interface Sample {
  tps: number;
  ttft: number;
}

/** `streams` sequences of one context generate `tokens` tokens each, at once. */
async function raw(context: LlamaContext, model: LlamaModel, streams: number, tokens: number): Promise<Sample> {
  const seqs = Array.from({ length: streams }, () => context.getSequence());
  try {
    const prompt = [model.tokens.bos!, ...model.tokenize(PROMPT)];
    const start = process.hrtime.bigint();
    const firsts: number[] = [];
    await Promise.all(
      seqs.map(async (seq) => {
        let n = 0;
        for await (const _ of seq.evaluate(prompt, { temperature: 0 })) {
          if (n === 0) firsts.push(Number(process.hrtime.bigint() - start) / 1e6);
          if (++n >= tokens) break;
        }
      }),
    );
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    return { tps: (streams * tokens) / seconds, ttft: median(firsts) };
  } finally {
    for (const s of seqs) s.dispose();
  }
}

/** The same through the API: `streams` concurrent chat completions, streamed or not. */
async function api(url: string, id: string, streams: number, tokens: number, stream: boolean): Promise<Sample> {
  const start = process.hrtime.bigint();
  const firsts: number[] = [];
  const counts = await Promise.all(
    Array.from({ length: streams }, async () => {
      const res = await request(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({
          model: id,
          messages: [{ role: 'user', content: PROMPT }],
          max_tokens: tokens,
          temperature: 0,
          stream,
          ...(stream && { stream_options: { include_usage: true } }),
        }),
      });
      if (!stream) {
        const json = (await res.body.json()) as { usage?: { completion_tokens: number } };
        if (res.statusCode !== 200 || !json.usage)
          throw new Error(`local API answered ${res.statusCode}: ${JSON.stringify(json).slice(0, 300)}`);
        return json.usage.completion_tokens;
      }
      let text = '';
      let first = true;
      for await (const chunk of res.body) {
        text += String(chunk);
        // The first chunk is the role; the first token is the first chunk with content.
        if (first && text.includes('"content":"') && /"content":"[^"]/.test(text)) {
          first = false;
          firsts.push(Number(process.hrtime.bigint() - start) / 1e6);
        }
      }
      if (res.statusCode !== 200) throw new Error(`local API answered ${res.statusCode}: ${text.slice(0, 300)}`);
      const usage = text
        .split('\n')
        .filter((l) => l.includes('"usage":{'))
        .at(-1);
      return (JSON.parse(usage!.slice(6)) as { usage: { completion_tokens: number } }).usage.completion_tokens;
    }),
  );
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  return { tps: counts.reduce((a, b) => a + b, 0) / seconds, ttft: firsts.length ? median(firsts) : NaN };
}

async function measure(file: string, shape: string, tokens: number, rounds: number, log: (m: string) => void): Promise<LocalResult> {
  const modelsDir = mkdtempSync(join(tmpdir(), 'switchyard-bench-models-'));
  symlinkSync(file, join(modelsDir, basename(file)));
  const id = `local/${basename(file)
    .replace(/\.gguf$/i, '')
    .toLowerCase()
    .replace(/[^a-z0-9._-]+/g, '-')}`;
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file });
  // As the engine does: one context of PARALLEL sequences, each with the model's context size.
  const context = await model.createContext({ contextSize: Math.min(model.trainContextSize, 4096), sequences: PARALLEL, threads: THREADS });
  const server = await startMain({
    SWITCHYARD_MODELS_DIR: modelsDir,
    SWITCHYARD_WORKERS: '1',
    SWITCHYARD_LOG_LEVEL: 'warn',
    SWITCHYARD_LOCAL_THREADS: String(THREADS),
    SWITCHYARD_LOCAL_PARALLEL: String(PARALLEL),
    SWITCHYARD_LOCAL_PRELOAD: 'true',
  });
  const runs: LocalRun[] = [];
  try {
    for (const streams of [1, PARALLEL]) {
      log(`local ${shape}: ${streams} stream(s), ${tokens} tokens, ${rounds} rounds`);
      await raw(context, model, streams, Math.min(tokens, 20));
      await api(server.url, id, streams, Math.min(tokens, 20), true);
      const r: Sample[] = [];
      const a: Sample[] = [];
      const st: Sample[] = [];
      for (let i = 0; i < rounds; i++) {
        r.push(await raw(context, model, streams, tokens));
        a.push(await api(server.url, id, streams, tokens, false));
        st.push(await api(server.url, id, streams, tokens, true));
      }
      const rawTps = median(r.map((s) => s.tps));
      const apiTps = median(a.map((s) => s.tps));
      const streamTps = median(st.map((s) => s.tps));
      const round3 = (n: number) => Math.round(n * 1000) / 1000;
      runs.push({
        streams,
        raw_tps: Math.round(rawTps),
        api_tps: Math.round(apiTps),
        ratio: round3(apiTps / rawTps),
        api_stream_tps: Math.round(streamTps),
        stream_ratio: round3(streamTps / rawTps),
        raw_ttft_ms: median(r.map((s) => s.ttft)),
        api_ttft_ms: median(st.map((s) => s.ttft)),
      });
    }
  } finally {
    await server.stop();
    await context.dispose();
    await model.dispose();
    rmSync(modelsDir, { recursive: true, force: true });
  }
  return { model: basename(file), shape, threads: THREADS, tokens, single: runs[0]!, four: runs[1]! };
}

export async function localScenarios(o: { quick: boolean; log: (m: string) => void }): Promise<LocalResult[]> {
  const stories = resolve(process.env['SWITCHYARD_BENCH_MODEL'] ?? join(PACKAGE_ROOT, '..', 'shared', 'models', 'stories260K.gguf'));
  const shape: Shape = o.quick ? TINY : SMOLLM_135M;
  const fixture = join(tmpdir(), 'switchyard-bench-fixtures', `${shape.name}-seed42.gguf`);
  o.log(`fixture ${fixture}`);
  writeFixture(fixture, shape, 42);
  return [
    await measure(stories, 'trained, dim 64, 5 layers, F32', o.quick ? 50 : 400, o.quick ? 1 : 5, o.log),
    await measure(fixture, o.quick ? 'random, tiny' : 'random, SmolLM-135M shape, Q8_0', o.quick ? 50 : 128, o.quick ? 1 : 3, o.log),
  ];
}
