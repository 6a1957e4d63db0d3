/**
 * Gateway scenarios: throughput at 64 connections, added latency and time to first chunk at one
 * connection, and memory with many idle streams. Subjects are the fake upstream itself (direct),
 * the minimal pass-through (reference) and Switchyard.
 */
import autocannon from 'autocannon';
import { Client, request } from 'undici';
import http from 'node:http';
import { median, percentile, probeHealth, sleep, treeCpuUs, treeRss } from './lib.js';

export interface Subject {
  name: string;
  url: string;
  /** Path of the chat-completions endpoint on this subject. */
  path: string;
  headers: Record<string, string>;
  model: string;
  /** The request body (default: `requestBody`, a chat completion). */
  body?: (stream: boolean) => string;
  /** The subject's process (with its workers), whose CPU time is measured. */
  pid?: number;
}

export interface Throughput {
  rps: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
  errors: number;
  non2xx: number;
  /** CPU time (user + system) the subject's processes spent per answered request. */
  cpu_us_per_request?: number;
}

/** The chat-completions request every gateway scenario sends. */
export const requestBody = (model: string, stream: boolean): string =>
  JSON.stringify({
    model,
    stream,
    max_tokens: 64,
    temperature: 0.7,
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'Say hello in one short sentence.' },
    ],
  });

/** The same request for `/v1/responses`; stored (`store`, the API's default) or not. */
export const responsesBody = (model: string, stream: boolean, store = true): string =>
  JSON.stringify({
    model,
    stream,
    store,
    max_output_tokens: 64,
    temperature: 0.7,
    instructions: 'You are a helpful assistant.',
    input: 'Say hello in one short sentence.',
  });

const bodyOf = (s: Subject, stream: boolean): string => s.body?.(stream) ?? requestBody(s.model, stream);

/** One run of the load generator against a subject's endpoint, with no warm-up. */
export function load(s: Subject, stream: boolean, connections: number, seconds: number): Promise<autocannon.Result> {
  return autocannon({
    url: s.url + s.path,
    method: 'POST',
    connections,
    headers: { 'content-type': 'application/json', ...s.headers },
    body: bodyOf(s, stream),
    duration: seconds,
  });
}

/** Requests per second (2xx only) and latency percentiles, with a warm-up run first. */
export async function throughput(s: Subject, stream: boolean, connections: number, seconds: number): Promise<Throughput> {
  return (await interleavedThroughput([s], stream, connections, 1, seconds))[0]!;
}

/** `xs` turned left by `n` places: the order of the subjects in burst `n`. */
const rotated = <T>(xs: readonly T[], n: number): T[] => xs.map((_, i) => xs[(i + n) % xs.length]!);

/**
 * Throughput of several subjects measured in turns: each is warmed up, then each takes `bursts`
 * bursts of `seconds`, one subject after the other, the order turned by one place every burst. This
 * VM's speed drifts by ±25% between runs of a few seconds and by several times over an hour, so
 * subjects measured one after the other for ten seconds each were measured on different machines,
 * as it were (two runs of the same build gave 0.53× and 0.74× for the stream, then 0.63× and 0.51×);
 * in turns, the drift falls on every subject alike. Requests per second and CPU per request are the
 * totals over all of a subject's bursts; the latency percentiles are the median burst's.
 */
export async function interleavedThroughput(
  subjects: readonly Subject[],
  stream: boolean,
  connections: number,
  bursts: number,
  seconds: number,
): Promise<Throughput[]> {
  const warmUp = Math.max(1, Math.round((seconds * bursts) / 4));
  for (const s of subjects) await load(s, stream, connections, warmUp);
  const runs = subjects.map(() => [] as Array<{ cpu?: number; r: autocannon.Result }>);
  for (let b = 0; b < bursts; b++) {
    for (const i of rotated(
      subjects.map((_, i) => i),
      b,
    )) {
      const s = subjects[i]!;
      const cpu = s.pid === undefined ? undefined : treeCpuUs(s.pid);
      const r = await load(s, stream, connections, seconds);
      runs[i]!.push({ ...(cpu !== undefined && { cpu: treeCpuUs(s.pid!) - cpu }), r });
    }
  }
  return runs.map((bs) => {
    const ok = bs.reduce((a, x) => a + x.r['2xx'], 0);
    const duration = bs.reduce((a, x) => a + x.r.duration, 0);
    const cpu = bs.every((x) => x.cpu !== undefined) ? bs.reduce((a, x) => a + x.cpu!, 0) : undefined;
    return {
      ...(cpu !== undefined && ok > 0 && { cpu_us_per_request: Math.round(cpu / ok) }),
      rps: Math.round(ok / duration),
      p50_ms: median(bs.map((x) => x.r.latency.p50)),
      p90_ms: median(bs.map((x) => x.r.latency.p90)),
      p99_ms: median(bs.map((x) => x.r.latency.p99)),
      errors: bs.reduce((a, x) => a + x.r.errors, 0),
      non2xx: bs.reduce((a, x) => a + x.r.non2xx, 0),
    };
  });
}

export interface Latency {
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
}

/**
 * One connection, one request at a time, timed here with a microsecond clock: to the end of the
 * answer (non-stream), or to the first body bytes of a stream (time to first chunk).
 */
export async function sequential(s: Subject, stream: boolean, count: number): Promise<Latency> {
  return (await interleavedSequential([s], stream, count, 1))[0]!;
}

/**
 * One connection per subject and round, one request at a time, the subjects taking turns over
 * `rounds` rounds (the order turned by one place each round), `count` timed requests each in all;
 * each round's connection first answers a fifth as many untimed ones. Percentiles are over all of a
 * subject's timed requests.
 */
export async function interleavedSequential(
  subjects: readonly Subject[],
  stream: boolean,
  count: number,
  rounds: number,
): Promise<Latency[]> {
  const times = subjects.map(() => [] as number[]);
  const perRound = Math.ceil(count / rounds);
  for (let round = 0; round < rounds; round++) {
    for (const i of rotated(
      subjects.map((_, i) => i),
      round,
    )) {
      times[i]!.push(...(await timedRequests(subjects[i]!, stream, perRound)));
    }
  }
  return times.map((t) => {
    t.sort((a, b) => a - b);
    return { p50_ms: percentile(t, 50), p90_ms: percentile(t, 90), p99_ms: percentile(t, 99) };
  });
}

/** `count` requests timed in ms on one new keep-alive connection, after a fifth as many untimed ones. */
async function timedRequests(s: Subject, stream: boolean, count: number): Promise<number[]> {
  const client = new Client(s.url, { pipelining: 1, keepAliveTimeout: 60_000 });
  const payload = bodyOf(s, stream);
  const times: number[] = [];
  const warm = Math.ceil(count / 5);
  try {
    for (let i = 0; i < count + warm; i++) {
      const t = process.hrtime.bigint();
      const res = await client.request({
        path: s.path,
        method: 'POST',
        headers: { 'content-type': 'application/json', ...s.headers },
        body: payload,
      });
      let elapsed: bigint | undefined;
      for await (const _ of res.body) {
        elapsed ??= process.hrtime.bigint() - t;
        if (!stream) continue;
      }
      if (!stream) elapsed = process.hrtime.bigint() - t;
      if (res.statusCode !== 200) throw new Error(`${s.name}: status ${res.statusCode}`);
      if (i >= warm) times.push(Number(elapsed) / 1e6);
    }
  } finally {
    await client.close();
  }
  return times;
}

export interface IdleStreams {
  streams: number;
  rss_before_mb: number;
  rss_mb: number;
  per_stream_kb: number;
  /** CPU time the server's processes spent after every client went away at once, until quiet again, per stream. */
  close_cpu_us_per_stream: number;
  /** The slowest answer to /healthz (asked every 10 ms, one at a time) meanwhile: how long the server stalled. */
  close_worst_probe_ms: number;
}

/**
 * Opens `count` streams of a model whose upstream holds them open after one chunk (the fake's
 * `hold`), waits until every one has
 * its first chunk, and reads the resident memory of the server's process tree.
 */
export async function idleStreams(s: Subject, pid: number, count: number): Promise<IdleStreams> {
  const before = treeRss(pid);
  const requests: http.ClientRequest[] = [];
  const payload = requestBody(s.model, true);
  let opened = 0;
  let failed = 0;
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  const target = new URL(s.url + s.path);
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${opened} of ${count} streams opened (${failed} failed)`)), 120_000);
    const settle = () => {
      if (opened + failed === count) {
        clearTimeout(timer);
        if (failed) reject(new Error(`${failed} of ${count} streams failed`));
        else resolve();
      }
    };
    let i = 0;
    // Opened in batches, so the listen backlog is not the thing measured.
    const batch = () => {
      for (let j = 0; j < 500 && i < count; j++, i++) {
        const req = http.request(
          {
            host: target.hostname,
            port: target.port,
            path: target.pathname,
            method: 'POST',
            agent,
            headers: { 'content-type': 'application/json', ...s.headers },
          },
          (res) => {
            res.once('data', () => {
              opened++;
              settle();
            });
            res.on('error', () => undefined);
          },
        );
        req.on('error', () => {
          failed++;
          settle();
        });
        req.end(payload);
        requests.push(req);
      }
      if (i < count) setTimeout(batch, 50);
    };
    batch();
  });
  await sleep(2000);
  const rss = treeRss(pid);
  // Then every client goes away at once: what the server spends closing the streams (each one's
  // upstream call, usage record and sockets), and how long it stops answering meanwhile.
  const client = new Client(s.url);
  const probe = probeHealth(client, 10);
  const cpuBefore = treeCpuUs(pid);
  for (const r of requests) r.destroy();
  agent.destroy();
  // Until the server is quiet again: two 100 ms spans in a row with under 10 ms of CPU (at most 20 s).
  let quiet = 0;
  let last = cpuBefore;
  for (let i = 0; quiet < 2 && i < 200; i++) {
    await sleep(100);
    const now = treeCpuUs(pid);
    quiet = now - last < 10_000 ? quiet + 1 : 0;
    last = now;
  }
  const closeCpu = last - cpuBefore;
  const worst = await probe.stop();
  await client.close();
  return {
    streams: count,
    rss_before_mb: Math.round(before / 1048576),
    rss_mb: Math.round(rss / 1048576),
    per_stream_kb: Math.round(((rss - before) / count / 1024) * 10) / 10,
    close_cpu_us_per_stream: Math.round(closeCpu / count),
    close_worst_probe_ms: Math.round(worst),
  };
}

/** A stream through the subject, read to its end: checks the setup before timing anything. */
export async function check(s: Subject): Promise<void> {
  for (const stream of [false, true]) {
    const res = await request(s.url + s.path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...s.headers },
      body: bodyOf(s, stream),
    });
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`${s.name} answered ${res.statusCode}: ${text.slice(0, 300)}`);
    if (stream && !text.includes('[DONE]')) throw new Error(`${s.name}: stream did not end with [DONE]`);
  }
}
