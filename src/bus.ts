import cluster, { type Worker } from 'node:cluster';
import { createHash, randomBytes } from 'node:crypto';
import { resolve } from 'node:path';
import { Redis } from 'ioredis';
import pg from 'pg';
import type { Logger } from 'pino';
import type { Config } from './config.js';
import { ProcessBus, type BusMessage } from './core/bus.js';

/**
 * The cluster bus's transports (see core/bus.ts). Between the workers of one instance, the primary
 * relays over IPC; between instances, Redis pub/sub when REDIS_URL is set, else PostgreSQL
 * LISTEN/NOTIFY; the embedded SQLite database has one instance, so only IPC. A worker talks to its
 * primary only; the primary (or a process that runs alone) holds the one connection to the others.
 */

/** What crosses a transport: the instance it came from (to drop one's own echo) and the message. */
interface Envelope {
  i: string;
  m: BusMessage;
}

/** What crosses IPC between a worker and its primary. */
interface IpcEnvelope {
  sy: 'bus';
  m: BusMessage;
}

const isIpc = (m: unknown): m is IpcEnvelope => typeof m === 'object' && m !== null && (m as { sy?: unknown }).sy === 'bus' && 'm' in m;

interface Transport {
  send(e: Envelope): void;
  close(): Promise<void>;
}

/**
 * Instances share a bus when they share a database: the channel is named after it. A PostgreSQL
 * database is known by what it says of itself (its cluster's system identifier, its name and the
 * schema in use), not by how a URL spells it: `localhost` against `127.0.0.1`, a `?sslmode=`, or a
 * rotated password gave two instances on one database two channels, and a cancel sent to one never
 * reached the other. Where the server will not say (pg_control_system() revoked), the URL as
 * written, with a warning.
 */
async function channelFor(config: Config, log: Logger): Promise<string> {
  let identity = config.databaseUrl ?? resolve(config.dataDir, 'switchyard.db');
  if (config.databaseUrl !== undefined) {
    const client = new pg.Client({ connectionString: config.databaseUrl, connectionTimeoutMillis: 10_000, query_timeout: 10_000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      const { rows } = await client.query<{ id: string; db: string; schema: string | null }>(
        'select (select system_identifier::text from pg_control_system()) as id, current_database() as db, current_schema() as schema',
      );
      const row = rows[0];
      if (row) identity = `postgres:${row.id}/${row.db}/${row.schema ?? ''}`;
    } catch (err) {
      // Only a server that will not say (the function revoked, or missing on a managed service's
      // fork) falls back; one that cannot be reached fails the start, as the store would next.
      const code = (err as { code?: unknown }).code;
      if (code !== '42501' && code !== '42883') throw err;
      log.warn(
        { reason: err instanceof Error ? err.message : String(err) },
        'cluster bus: the database does not say which it is (pg_control_system()); instances must spell DATABASE_URL the same to share a bus',
      );
    } finally {
      await client.end().catch(() => undefined);
    }
  }
  return createHash('sha256').update(identity).digest('hex').slice(0, 16);
}

/** A connection URL without its password, for messages. */
function redactedUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    // ioredis reads options from the query too (`?password=…`): none of it is shown.
    u.search = '';
    return u.toString();
  } catch {
    return '(an unparseable URL)';
  }
}

async function redisTransport(url: string, channel: string, receive: (e: Envelope) => void, log: Logger): Promise<Transport> {
  const name = `switchyard:bus:${channel}`;
  const options = { maxRetriesPerRequest: null, lazyConnect: true } as const;
  const pub = new Redis(url, options);
  const sub = new Redis(url, options);
  // ioredis reports each failed reconnection (every second or two per connection while Redis is
  // down, in every process): one line in 30 s says it, as for the limit counters.
  let warned = 0;
  const onError = (err: Error): void => {
    if (Date.now() - warned < 30_000) return;
    warned = Date.now();
    log.warn({ err: err.message }, 'cluster bus: Redis connection error');
  };
  for (const c of [pub, sub]) c.on('error', onError);
  sub.on('message', (_channel: string, payload: string) => {
    try {
      receive(JSON.parse(payload) as Envelope);
    } catch (err) {
      log.warn({ err }, 'cluster bus: unreadable message');
    }
  });
  try {
    await Promise.all([pub.connect(), sub.connect()]);
    await sub.subscribe(name);
  } catch (err) {
    pub.disconnect();
    sub.disconnect();
    // ioredis says only "Connection is closed": name what could not be reached, and the setting.
    const where = redactedUrl(url);
    throw new Error(`cannot reach Redis at ${where} (REDIS_URL): ${(err as Error).message}`);
  }
  return {
    send: (e) => void pub.publish(name, JSON.stringify(e)).catch((err: unknown) => log.warn({ err }, 'cluster bus: publish failed')),
    close: async () => {
      sub.disconnect();
      pub.disconnect();
    },
  };
}

/** NOTIFY payloads must stay under 8000 bytes: longer messages go in pieces (3 bytes a character at most). */
const PG_PIECE_CHARS = 2400;

interface Piece {
  p: string;
  k: number;
  n: number;
  d: string;
}

async function pgTransport(url: string, channel: string, receive: (e: Envelope) => void, log: Logger): Promise<Transport> {
  const name = `switchyard_bus_${channel}`;
  const client = new pg.Client({ connectionString: url });
  client.on('error', (err: Error) => log.warn({ err: err.message }, 'cluster bus: PostgreSQL connection error'));
  // Pieces of one message come in order from one sender's connection; kept until the last arrives.
  const partial = new Map<string, string[]>();
  client.on('notification', (n: pg.Notification) => {
    if (n.channel !== name || n.payload === undefined) return;
    try {
      const piece = JSON.parse(n.payload) as Piece | Envelope;
      if (!('p' in piece)) return receive(piece);
      const parts = partial.get(piece.p) ?? [];
      parts[piece.k] = piece.d;
      if (parts.filter((x) => x !== undefined).length < piece.n) return void partial.set(piece.p, parts);
      partial.delete(piece.p);
      receive(JSON.parse(parts.join('')) as Envelope);
    } catch (err) {
      log.warn({ err }, 'cluster bus: unreadable message');
    }
  });
  await client.connect();
  await client.query(`LISTEN ${name}`);
  const notify = (payload: string) =>
    client.query('SELECT pg_notify($1, $2)', [name, payload]).catch((err: unknown) => log.warn({ err }, 'cluster bus: notify failed'));
  return {
    send: (e) => {
      const text = JSON.stringify(e);
      if (text.length <= PG_PIECE_CHARS) return void notify(text);
      const id = randomBytes(6).toString('base64url');
      const pieces: string[] = [];
      for (let at = 0; at < text.length;) {
        let end = Math.min(text.length, at + PG_PIECE_CHARS);
        // Never split a surrogate pair.
        if (end < text.length && /[\uD800-\uDBFF]/.test(text[end - 1]!)) end--;
        pieces.push(text.slice(at, end));
        at = end;
      }
      pieces.forEach((d, k) => void notify(JSON.stringify({ p: id, k, n: pieces.length, d } satisfies Piece)));
    },
    close: () => client.end(),
  };
}

/** The link to other instances, if the database is shared: Redis, else PostgreSQL, else none. */
async function remoteTransport(config: Config, receive: (e: Envelope) => void, log: Logger): Promise<Transport | undefined> {
  if (!config.redisUrl && !config.databaseUrl) return undefined;
  const channel = await channelFor(config, log);
  if (config.redisUrl) return redisTransport(config.redisUrl, channel, receive, log);
  if (config.databaseUrl) return pgTransport(config.databaseUrl, channel, receive, log);
  return undefined;
}

/** A process's name on the bus: unique across hosts, where pids are not. */
const processName = (): string => `${randomBytes(6).toString('base64url')}.${process.pid}`;

/** A process that serves alone (no cluster): its bus reaches other instances directly. */
export async function standaloneBus(config: Config, log: Logger): Promise<ProcessBus> {
  const self = processName();
  let transport: Transport | undefined;
  const bus: ProcessBus = new ProcessBus(
    self,
    (m) => transport?.send({ i: self, m }),
    async () => transport?.close(),
  );
  transport = await remoteTransport(
    config,
    (e) => {
      if (e.i !== self) bus.deliver(e.m);
    },
    log,
  );
  return bus;
}

/** A cluster worker's bus: everything goes through the primary. */
export function workerBus(): ProcessBus {
  const self = processName();
  const onMessage = (m: unknown) => {
    if (isIpc(m)) bus.deliver(m.m);
  };
  const bus: ProcessBus = new ProcessBus(
    self,
    (m) => {
      if (process.connected) process.send!({ sy: 'bus', m } satisfies IpcEnvelope);
    },
    async () => {
      process.off('message', onMessage);
    },
  );
  process.on('message', onMessage);
  return bus;
}

/** A message to a worker that has just gone is dropped: the worker is gone with whatever it held. */
const ignoreSendError = (): void => undefined;

/**
 * The primary's relay: a worker's message goes to its siblings and to the other instances; one from
 * another instance goes to every worker. Resolves to its closer.
 */
export async function relayBus(config: Config, log: Logger): Promise<() => Promise<void>> {
  const instance = randomBytes(6).toString('base64url');
  const workers = () => Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && w.isConnected());
  const toWorkers = (m: BusMessage, except?: Worker) => {
    // With a callback, a worker that exits meanwhile fails the send there instead of emitting an
    // 'error' no one listens to (an operator pass had the primary die of EPIPE during a drain).
    for (const w of workers()) if (w !== except) w.send({ sy: 'bus', m } satisfies IpcEnvelope, undefined, ignoreSendError);
  };
  const transport = await remoteTransport(
    config,
    (e) => {
      if (e.i !== instance) toWorkers(e.m);
    },
    log,
  );
  const onMessage = (worker: Worker, m: unknown) => {
    if (!isIpc(m)) return;
    toWorkers(m.m, worker);
    transport?.send({ i: instance, m: m.m });
  };
  cluster.on('message', onMessage);
  return async () => {
    cluster.off('message', onMessage);
    await transport?.close();
  };
}
