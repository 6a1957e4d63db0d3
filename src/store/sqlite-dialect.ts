import {
  CompiledQuery,
  SqliteDialect,
  type DatabaseConnection,
  type Driver,
  type QueryResult,
  type SqliteDatabase as KyselySqliteDatabase,
  type SqliteStatement,
  type QueryCompiler,
  type TransactionSettings,
} from 'kysely';
import type SqliteDatabase from 'better-sqlite3';
import { BUSY_LIMIT_MS, busyWait } from './store.js';

/** Another connection holds the write lock: the statement did nothing and may be run again. */
export const isSqliteBusy = (err: unknown): boolean => {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
};

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
    const started = performance.now();
    for (let tries = 0; ; tries++) {
      try {
        // The SQLite connection throws synchronously: awaited inside the try, both kinds land here.
        return await this.inner.executeQuery<R>(query);
      } catch (err) {
        if (!isSqliteBusy(err) || performance.now() - started > BUSY_LIMIT_MS) throw err;
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

  async savepoint(connection: DatabaseConnection, name: string, compile: QueryCompiler['compileQuery']): Promise<void> {
    if (!this.inner.savepoint) throw new Error('savepoints are not supported');
    await this.inner.savepoint(connection, name, compile);
  }

  async rollbackToSavepoint(connection: DatabaseConnection, name: string, compile: QueryCompiler['compileQuery']): Promise<void> {
    if (!this.inner.rollbackToSavepoint) throw new Error('savepoints are not supported');
    await this.inner.rollbackToSavepoint(connection, name, compile);
  }

  async releaseSavepoint(connection: DatabaseConnection, name: string, compile: QueryCompiler['compileQuery']): Promise<void> {
    if (!this.inner.releaseSavepoint) throw new Error('savepoints are not supported');
    await this.inner.releaseSavepoint(connection, name, compile);
  }

  releaseConnection(connection: DatabaseConnection): Promise<void> {
    return this.inner.releaseConnection(unwrap(connection));
  }

  async destroy(): Promise<void> {
    // A statement may be waiting for the lock between turns: let it finish (or give up) first,
    // rather than close the connection under it. The connection is never released again.
    await this.inner.acquireConnection();
    await this.inner.destroy();
  }
}

const unwrap = (c: DatabaseConnection): DatabaseConnection => (c instanceof BusyRetryingConnection ? c.inner : c);

/** Prepared statements kept per connection; the least recently used goes past this. */
const STATEMENT_CACHE_SIZE = 256;
/**
 * SQL with more bound values than this (an `in (…)` list or a many-row insert of one size) is
 * prepared for its use and not kept: each size would take a place of its own and push the few
 * statements every request uses out.
 */
const CACHED_PARAMETERS_MAX = 32;

const parametersIn = (sql: string): number => {
  let n = 0;
  for (let i = sql.indexOf('?'); i >= 0; i = sql.indexOf('?', i + 1)) n++;
  return n;
};

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
      if (kept === undefined && parametersIn(sql) <= CACHED_PARAMETERS_MAX) {
        cache.set(sql, stmt);
        if (cache.size > STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
      }
      return stmt;
    },
  };
}
