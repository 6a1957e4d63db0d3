import {
  CompiledQuery,
  SqliteDialect,
  type DatabaseConnection,
  type Driver,
  type QueryResult,
  type SqliteDatabase as KyselySqliteDatabase,
  type SqliteStatement,
  type TransactionSettings,
} from 'kysely';
import type SqliteDatabase from 'better-sqlite3';

/**
 * When a write that found a SQLite file busy (another worker of a cluster holds its write lock) is
 * tried again: on the next turns of the event loop first (another worker's commit holds the lock
 * for tens of microseconds), then after a few milliseconds, at most 50 between tries. 0 is the
 * next turn. Used by the store's connection below and by the usage ledger's queue.
 */
export const BUSY_RETRY_MS = [0, 0, 0, 1, 2, 5, 10, 20, 50] as const;
/** How long a SQLite file may stay busy before a write gives up (what SQLite's busy timeout was). */
export const BUSY_LIMIT_MS = 5000;

/** Another connection holds the write lock: the statement did nothing and may be run again. */
export const isSqliteBusy = (err: unknown): boolean => {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
};

/** Resolves after the `tries`-th wait of BUSY_RETRY_MS: the next turn, or a few milliseconds. */
export function busyWait(tries: number): Promise<void> {
  const ms = BUSY_RETRY_MS[Math.min(tries, BUSY_RETRY_MS.length - 1)]!;
  return new Promise((resolve) => (ms === 0 ? setImmediate(resolve) : setTimeout(resolve, ms)));
}

/**
 * Kysely's SQLite dialect on a connection that never waits for the write lock on the event loop.
 *
 * With several workers on one SQLite file, a statement that finds another worker holding the write
 * lock waits in SQLite's busy handler, which sleeps (1, 2, 5 … ms) on the thread that runs it: the
 * event loop, so every request of that worker stalls. The store's connection instead has no busy
 * timeout, and this driver runs a statement that failed with SQLITE_BUSY again on a later turn
 * (`busyWait`) for up to `BUSY_LIMIT_MS`, serving requests meanwhile. Transactions begin IMMEDIATE,
 * taking the write lock before their first statement: once it is held nothing inside can be busy,
 * and a busy BEGIN is safe to run again (a deferred transaction that read first could fail at its
 * first write, when running that write again would not help). Kysely's own mutex keeps every other
 * query off the connection while one waits, as it does while one runs.
 */
export class NonBlockingSqliteDialect extends SqliteDialect {
  override createDriver(): Driver {
    return new BusyRetryingDriver(super.createDriver());
  }
}

class BusyRetryingConnection implements DatabaseConnection {
  constructor(readonly inner: DatabaseConnection) {}

  async executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    const started = Date.now();
    for (let tries = 0; ; tries++) {
      try {
        // The SQLite connection throws synchronously: awaited inside the try, both kinds land here.
        return await this.inner.executeQuery<R>(query);
      } catch (err) {
        if (!isSqliteBusy(err) || Date.now() - started > BUSY_LIMIT_MS) throw err;
      }
      await busyWait(tries);
    }
  }

  streamQuery<R>(query: CompiledQuery, chunkSize?: number): AsyncIterableIterator<QueryResult<R>> {
    return this.inner.streamQuery<R>(query, chunkSize);
  }
}

class BusyRetryingDriver implements Driver {
  /** SQLite has one connection per dialect: wrapped once. */
  private wrapped: BusyRetryingConnection | undefined;

  constructor(private readonly inner: Driver) {}

  init(): Promise<void> {
    return this.inner.init();
  }

  async acquireConnection(): Promise<DatabaseConnection> {
    const c = await this.inner.acquireConnection();
    if (this.wrapped?.inner !== c) this.wrapped = new BusyRetryingConnection(c);
    return this.wrapped;
  }

  async beginTransaction(connection: DatabaseConnection, _settings: TransactionSettings): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('commit'));
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('rollback'));
  }

  releaseConnection(connection: DatabaseConnection): Promise<void> {
    return this.inner.releaseConnection(unwrap(connection));
  }

  destroy(): Promise<void> {
    return this.inner.destroy();
  }
}

const unwrap = (c: DatabaseConnection): DatabaseConnection => (c instanceof BusyRetryingConnection ? c.inner : c);

/** Prepared statements kept per connection; the least recently used goes past this. */
const STATEMENT_CACHE_SIZE = 256;
/** Longer SQL (a many-row insert of one size) is prepared for its one use and not kept. */
const CACHED_SQL_MAX = 2048;

/**
 * A better-sqlite3 connection as Kysely's dialect sees it, with its prepared statements kept by
 * SQL text. Kysely prepares every query it runs, and SQLite compiles the text each time: under
 * Responses load (five statements per stored response) the compiling was about a tenth of the
 * worker's CPU. Kysely writes the same text for the same query (values are bound), so the text
 * is the key. A statement still being iterated is not handed out twice.
 */
export function withStatementCache(db: SqliteDatabase.Database): KyselySqliteDatabase {
  const cache = new Map<string, SqliteDatabase.Statement>();
  return {
    close: () => void db.close(),
    prepare(sql: string): SqliteStatement {
      const kept = cache.get(sql);
      if (kept !== undefined && !kept.busy) {
        // Most recently used last: a Map iterates in insertion order, so the first is the oldest.
        cache.delete(sql);
        cache.set(sql, kept);
        return kept;
      }
      const stmt = db.prepare(sql);
      if (sql.length <= CACHED_SQL_MAX && kept === undefined) {
        cache.set(sql, stmt);
        if (cache.size > STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
      }
      return stmt;
    },
  };
}
