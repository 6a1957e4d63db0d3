import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { request } from 'undici';
import pg from 'pg';
import OpenAI from 'openai';
import { loadConfig, PACKAGE_ROOT } from '../../src/config.js';
import { createService, type Service } from '../../src/app.js';

export const SHARED_MODELS = resolve(process.env['SWITCHYARD_TEST_MODELS_DIR'] ?? join(PACKAGE_ROOT, '..', 'shared', 'models'));
export const PG_URL = process.env['SWITCHYARD_TEST_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';

export interface TestServer {
  url: string;
  /** What an OpenAI client takes as baseURL. */
  baseURL: string;
  adminKey: string;
  dataDir: string;
  service: Service;
  close(): Promise<void>;
}

export interface StartOptions {
  env?: Record<string, string>;
  /** Written to a YAML/JSON file and passed as SWITCHYARD_CONFIG. */
  configFile?: { name: string; text: string };
  modelsDir?: string;
  /** Reuse this data dir (and leave it in place on close), to test restarts. */
  dataDir?: string;
  /** Another process of a running instance (as a cluster worker is): it takes no instance lock and sweeps nothing. */
  shared?: boolean;
}

export function tempDir(prefix = 'switchyard-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** A real server on a loopback port, with its own data dir, admin key and silent logs. */
export async function startServer(opts: StartOptions = {}): Promise<TestServer> {
  const dataDir = opts.dataDir ?? tempDir();
  const adminKey = opts.env?.['SWITCHYARD_ADMIN_KEY'] ?? `sk-test-admin-${randomBytes(12).toString('hex')}`;
  const env: Record<string, string> = {
    SWITCHYARD_DATA_DIR: dataDir,
    SWITCHYARD_MODELS_DIR: opts.modelsDir ?? SHARED_MODELS,
    SWITCHYARD_ADMIN_KEY: adminKey,
    SWITCHYARD_LOG_LEVEL: 'silent',
    HOST: '127.0.0.1',
    PORT: '0',
    ...opts.env,
  };
  if (opts.configFile) {
    const path = join(dataDir, opts.configFile.name);
    writeFileSync(path, opts.configFile.text);
    env['SWITCHYARD_CONFIG'] = path;
  }
  const config = loadConfig({ env });
  const service = await createService(config, undefined, { ...process.env, ...env }, opts.shared ? { shared: true } : {});
  const url = await service.app.listen({ host: '127.0.0.1', port: 0 });
  return {
    url,
    baseURL: `${url}/v1`,
    adminKey,
    dataDir,
    service,
    async close() {
      await service.close();
      if (!opts.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** Wire shapes the tests read. */
export interface Envelope {
  error: { message: string; type: string; param: string | null; code: string | null };
}
export interface WireModel {
  id: string;
  object: string;
  created: number;
  owned_by: string;
  author: string;
  slug: string;
  name: string;
  description: string;
  status: string;
  visibility: string;
  pricing: { metric: string; rate: number }[];
  context_length?: number;
  model_type: string;
  capabilities: string[];
  output_size?: string;
  source?: string;
}
export interface WireList<T> {
  object: string;
  data: T[];
}
export interface WireKey {
  id: string;
  object: string;
  org: string;
  name: string;
  role: string;
  created_at: number;
  revoked_at: number | null;
  key?: string;
  org_created?: boolean;
}

export interface HttpResult<T> {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  /** The parsed body; read it with the type the caller expects. */
  json: T;
}

/** Plain HTTP, no SDK: exactly what goes over the wire. */
export async function http<T = Envelope>(
  base: string,
  method: string,
  path: string,
  opts: { headers?: Record<string, string>; body?: string | Buffer | object; key?: string } = {},
): Promise<HttpResult<T>> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.key !== undefined) headers['authorization'] = `Bearer ${opts.key}`;
  let body: string | Buffer | undefined;
  if (opts.body !== undefined) {
    body = typeof opts.body === 'string' || Buffer.isBuffer(opts.body) ? opts.body : JSON.stringify(opts.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await request(`${base}${path}`, { method: method as 'GET', headers, ...(body !== undefined && { body }) });
  const text = await res.body.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.statusCode, headers: res.headers, text, json: json as T };
}

/** Creates an inference (or admin) key through the admin API and returns the secret. */
export async function createKey(
  server: TestServer,
  org: string,
  name = 'test',
  role: 'inference' | 'admin' = 'inference',
): Promise<{ key: string; id: string }> {
  const res = await http<WireKey>(server.url, 'POST', '/admin/keys', { key: server.adminKey, body: { org, name, role } });
  if (res.status !== 201 || res.json.key === undefined) throw new Error(`key creation failed: ${res.status} ${res.text}`);
  return { key: res.json.key, id: res.json.id };
}

/** A PostgreSQL schema of its own for one test, so parallel runs never see each other's rows. */
export async function pgSchema(): Promise<{ url: string; drop(): Promise<void> }> {
  const schema = `sy_test_${randomBytes(6).toString('hex')}`;
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  await client.query(`create schema ${schema}`);
  await client.end();
  const sep = PG_URL.includes('?') ? '&' : '?';
  return {
    url: `${PG_URL}${sep}options=${encodeURIComponent(`-c search_path=${schema}`)}`,
    async drop() {
      const c = new pg.Client({ connectionString: PG_URL });
      await c.connect();
      await c.query(`drop schema ${schema} cascade`);
      await c.end();
    },
  };
}

export interface SseEvent {
  event: string | undefined;
  data: string;
}

/** Reads a whole SSE body into its events (for checking framing exactly as sent). */
export async function readSse(
  base: string,
  method: string,
  path: string,
  opts: { key: string; body?: object },
): Promise<{ status: number; events: SseEvent[]; done: boolean }> {
  const res = await request(`${base}${path}`, {
    method: method as 'GET',
    headers: { authorization: `Bearer ${opts.key}`, 'content-type': 'application/json' },
    ...(opts.body !== undefined && { body: JSON.stringify(opts.body) }),
  });
  const text = await res.body.text();
  const events = text
    .split('\n\n')
    .filter((b) => b.trim() !== '')
    .map((block) => {
      let event: string | undefined;
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      return { event, data: data.join('\n') };
    });
  // A stream's closing `data: [DONE]` is not an event: `done` says whether it came, last.
  const last = events.at(-1);
  const done = last !== undefined && last.event === undefined && last.data === '[DONE]';
  if (done) events.pop();
  return { status: res.statusCode, events, done };
}

/** A server, an inference key of `org`, and the official SDK pointed at it. */
export async function startWithClient(org = 'acme', opts: StartOptions = {}): Promise<{ server: TestServer; key: string; client: OpenAI }> {
  const server = await startServer(opts);
  const { key } = await createKey(server, org);
  return { server, key, client: new OpenAI({ apiKey: key, baseURL: server.baseURL, maxRetries: 0 }) };
}
