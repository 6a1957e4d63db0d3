import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import {
  Kysely,
  Migrator,
  PostgresDialect,
  sql,
  type OnConflictTables,
  type OnConflictUpdateDatabase,
  type RawBuilder,
  type Selectable,
  type SqlBool,
  type UpdateObject,
} from 'kysely';
import SqliteDatabase from 'better-sqlite3';
import pg from 'pg';
import { migrationProvider } from './migrations.js';
import { WalCheckpointer } from './wal-checkpointer.js';
import { NonBlockingSqliteDialect, isSqliteBusy, withStatementCache } from './sqlite-dialect.js';
import type {
  ApiKeyRecord,
  ChatCompletionQuery,
  ChatCompletionRecord,
  ConversationRecord,
  CreationQuery,
  DeploymentRecord,
  ItemPage,
  RecentItems,
  ListedResponse,
  KeyRole,
  Limits,
  Org,
  QuarantinedUsage,
  ResponseRecord,
  StaleResponse,
  Store,
  UsageFilter,
  UsageGroup,
  UsageRecord,
  UsageTotal,
} from './store.js';
import type { Capability, Model, ModelSource, ModelStatus, ModelType, Price, Visibility } from './model-record.js';

/** A model row: enums as plain text, arrays as JSON text. */
type ModelsTable = Omit<Model, 'pricing' | 'capabilities' | 'status' | 'visibility' | 'model_type' | 'source'> & {
  pricing: string;
  capabilities: string;
  status: string;
  visibility: string;
  model_type: string;
  source: string;
};

interface Database {
  orgs: Omit<Org, 'limits'> & { limits: string | null };
  api_keys: Omit<ApiKeyRecord, 'role' | 'limits'> & { role: string; limits: string | null };
  models: ModelsTable;
  responses: Omit<ListedResponse, 'background'> & { background: number; pending_usage: string | null };
  response_inputs: { response_id: string; items: string };
  conversations: ConversationRecord;
  conversation_items: { id: string; conversation_id: string; seq: number; item: string; bytes: number; created_at: number };
  stored_items: { org_id: string; id: string; response_id: string; item: string; created_at: number };
  settings: { key: string; value: string };
  chat_completions: Omit<ChatCompletionRecord, 'metadata'> & { metadata: string; messages: string };
  chat_completion_metadata: { completion_id: string; key: string; value: string };
  deployments: Omit<DeploymentRecord, 'api'> & { api: string };
  usage_records: Omit<UsageRecord, 'stream' | 'price_missing' | 'estimated'> & { stream: number; price_missing: number; estimated: number };
  usage_quarantine: QuarantinedUsage;
}

/** Ids bound in one statement at most (5 parameters a row when inserting items). */
const ID_SLICE = 500;
/** Item sizes read per query when a turn reads a conversation newest first. */
const SIZE_PAGE = 1000;
/** About how much of a conversation's items one statement reads. */
const ITEM_PAGE_BYTES = 1024 * 1024;

/**
 * Lets the event loop run between the slices of a large write or read outside a transaction.
 * better-sqlite3 runs each statement on the event loop, and awaiting a statement that is already
 * done never gives way to I/O: 200,000 input items stored in 400 slices held every other request
 * for seconds (the load shedder answered them 503).
 */
const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * Rows after a cursor in creation order (`created_ms`, then `id`): later ones for `asc`, earlier
 * ones for `desc`. The same SQL on both dialects, for a table with both columns.
 */
function createdAfter(after: { id: string; created_ms: number }, order: 'asc' | 'desc'): RawBuilder<SqlBool> {
  const op = sql.raw(order === 'asc' ? '>' : '<');
  return sql<SqlBool>`(created_ms ${op} ${after.created_ms} or (created_ms = ${after.created_ms} and id ${op} ${after.id}))`;
}

function rowToListedResponse(row: Selectable<Database['responses']>): ListedResponse {
  const { pending_usage: _, ...r } = row;
  return {
    ...r,
    background: Number(r.background) === 1,
    created_at: Number(r.created_at),
    created_ms: Number(r.created_ms),
    updated_at: Number(r.updated_at),
  };
}

function rowToConversation(r: Selectable<Database['conversations']>): ConversationRecord {
  return { ...r, created_at: Number(r.created_at), created_ms: Number(r.created_ms) };
}

function modelToRow(m: Model): ModelsTable {
  return { ...m, pricing: JSON.stringify(m.pricing), capabilities: JSON.stringify(m.capabilities) };
}

function rowToModel(r: Selectable<ModelsTable>): Model {
  return {
    id: r.id,
    author: r.author,
    slug: r.slug,
    name: r.name,
    description: r.description,
    created: Number(r.created),
    owned_by: r.owned_by,
    status: r.status as ModelStatus,
    visibility: r.visibility as Visibility,
    pricing: JSON.parse(r.pricing) as Price[],
    context_length: r.context_length === null ? null : Number(r.context_length),
    model_type: r.model_type as ModelType,
    capabilities: JSON.parse(r.capabilities) as Capability[],
    output_size: r.output_size,
    source: r.source as ModelSource,
  };
}

/**
 * Of a page's rows in order with their sizes (`n`, bytes), the ones the page holds: at most
 * `limit`, stopping before the row that would take the total past `maxBytes` (a first row larger
 * than that is the page alone).
 */
function fitting<T extends { n: number | string | null }>(rows: readonly T[], limit: number, maxBytes: number): T[] {
  const out: T[] = [];
  let total = 0;
  for (const r of rows) {
    if (out.length === limit) break;
    total += Number(r.n ?? 0);
    if (out.length > 0 && total > maxBytes) break;
    out.push(r);
  }
  return out;
}

const CHAT_COMPLETION_COLUMNS = ['id', 'org_id', 'model', 'created_at', 'stored_at', 'metadata', 'body'] as const;

function rowToChatCompletion(
  r: Pick<Selectable<Database['chat_completions']>, (typeof CHAT_COMPLETION_COLUMNS)[number]>,
): ChatCompletionRecord {
  return {
    ...r,
    created_at: Number(r.created_at),
    stored_at: Number(r.stored_at),
    metadata: JSON.parse(r.metadata) as Record<string, string>,
  };
}

const metadataRows = (completionId: string, metadata: Readonly<Record<string, string>>) =>
  Object.entries(metadata).map(([key, value]) => ({ completion_id: completionId, key, value }));

const parseLimits = (text: string | null): Limits | null => (text ? (JSON.parse(text) as Limits) : null);

function rowToOrg(r: Selectable<Database['orgs']>): Org {
  return { ...r, created_at: Number(r.created_at), limits: parseLimits(r.limits) };
}

function rowToKey(r: Selectable<Database['api_keys']>): ApiKeyRecord {
  return {
    ...r,
    limits: parseLimits(r.limits),
    role: r.role as KeyRole,
    created_at: Number(r.created_at),
    revoked_at: r.revoked_at === null ? null : Number(r.revoked_at),
  };
}

const INT8_OID = 20;

/**
 * How often the WAL is checkpointed (on a worker thread). A ledger commit of one record adds about
 * 18 KB to the WAL, so at a thousand commits a second it holds a few MB between checkpoints.
 */
const WAL_CHECKPOINT_MS = 250;
/** Running responses whose heartbeat records one statement writes (three parameters each). */
const HEARTBEAT_SLICE = 200;
const WAL_SIZE_LIMIT = 32 * 1024 * 1024;

const USAGE_COLUMNS: ReadonlyArray<keyof UsageRecord> = [
  'id',
  'at',
  'day',
  'request_id',
  'key_id',
  'org_id',
  'model',
  'deployment',
  'endpoint',
  'stream',
  'input_tokens',
  'cached_tokens',
  'output_tokens',
  'reasoning_tokens',
  'cost',
  'price_missing',
  'estimated',
  'latency_ms',
  'ttft_ms',
  'status',
  'error_code',
];
/** What `doUpdateSet` takes for usage_records (the row written, or `excluded`: the one that conflicted). */
type UsageUpsert = UpdateObject<
  OnConflictUpdateDatabase<Database, 'usage_records'>,
  OnConflictTables<'usage_records'>,
  OnConflictTables<'usage_records'>
>;
/**
 * A record already there under the same id is kept (a batch written again after a failure), unless
 * it is the snapshot an abandoned response was billed from (failAbandonedResponses: estimated, 500):
 * the run it came from was only slow, ended after all, and its own record replaces it.
 */
const SNAPSHOT_ROW = `usage_records.estimated = 1 AND usage_records.status = 500 AND usage_records.error_code = 'server_error'`;
const REPLACE_SNAPSHOT = USAGE_COLUMNS.filter((c) => c !== 'id')
  .map((c) => `${c} = excluded.${c}`)
  .join(', ');

/**
 * Runs the prepared insert with a usage record's fields as its arguments, in USAGE_COLUMNS' order
 * (SQLite has no booleans: flags go in as 0 or 1). Arguments rather than one array: better-sqlite3
 * reads an array's elements one by one through V8's API, which cost about 22k instructions per
 * record under callgrind (a third of a one-record commit); arguments it reads directly.
 */
function runUsageInsert(stmt: SqliteDatabase.Statement, r: UsageRecord): void {
  stmt.run(
    r.id,
    r.at,
    r.day,
    r.request_id,
    r.key_id,
    r.org_id,
    r.model,
    r.deployment,
    r.endpoint,
    r.stream ? 1 : 0,
    r.input_tokens,
    r.cached_tokens,
    r.output_tokens,
    r.reasoning_tokens,
    r.cost,
    r.price_missing ? 1 : 0,
    r.estimated ? 1 : 0,
    r.latency_ms,
    r.ttft_ms,
    r.status,
    r.error_code,
  );
}

/**
 * SQLite result codes and PostgreSQL SQLSTATE classes that mean "this row is wrong" (a type, range
 * or constraint problem) rather than "the database cannot take writes now".
 */
const SQLITE_DATA_CODES = /^SQLITE_(CONSTRAINT|MISMATCH|TOOBIG|RANGE)/;
const PG_DATA_CLASSES = new Set(['22', '23']);

/**
 * The usage ledger's connection to a SQLite file. Like the store's (see NonBlockingSqliteDialect)
 * it never waits for the write lock: a busy database fails at once (SQLITE_BUSY) and the ledger
 * tries again on a later turn with whatever was recorded meanwhile (`Ledger`). A connection of its
 * own because the ledger commits with its prepared statement outside Kysely, whose mutex would not
 * hold it back: it must never run inside a transaction open on the store's connection.
 * Checkpoints stay with the checkpointer thread.
 */
function openLedgerConnection(file: string): SqliteDatabase.Database {
  const db = new SqliteDatabase(file);
  db.pragma('synchronous = NORMAL');
  db.pragma('wal_autocheckpoint = 0');
  db.pragma(`journal_size_limit = ${WAL_SIZE_LIMIT}`);
  db.pragma('busy_timeout = 0');
  return db;
}

export interface StoreOptions {
  /** `postgres://…` selects PostgreSQL; anything else (or nothing) selects SQLite. */
  databaseUrl?: string | undefined;
  /** SQLite file used when no PostgreSQL URL is given. */
  sqlitePath: string;
}

/** The SQLite database file these options name, or undefined for PostgreSQL. */
export function sqliteFileOf(opts: StoreOptions): string | undefined {
  const url = opts.databaseUrl;
  if (url && /^postgres(ql)?:\/\//.test(url)) return undefined;
  return url ? url.replace(/^sqlite:\/\//, '').replace(/^file:/, '') : opts.sqlitePath;
}

/** SQLite and PostgreSQL behind one implementation: Kysely writes the dialect's SQL. */
export class KyselyStore implements Store {
  readonly dialect: 'sqlite' | 'postgres';
  private readonly db: Kysely<Database>;
  private readonly sqlite: SqliteDatabase.Database | undefined;
  /** The usage ledger's own SQLite connection (see `openLedgerConnection`). */
  private readonly ledgerDb: SqliteDatabase.Database | undefined;
  private insertUsageBatch: ((records: readonly UsageRecord[]) => void) | undefined;
  private readonly checkpointer: WalCheckpointer | undefined;

  constructor(opts: StoreOptions) {
    const url = opts.databaseUrl;
    const file = sqliteFileOf(opts);
    if (file === undefined) {
      this.dialect = 'postgres';
      const pool = new pg.Pool({
        connectionString: url,
        max: 10,
        // Unix-second bigint columns fit a JS number; pg would hand them back as strings.
        types: {
          getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
            oid === INT8_OID ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
        },
      });
      this.db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
    } else {
      this.dialect = 'sqlite';
      let database: SqliteDatabase.Database;
      try {
        if (file !== ':memory:') makeDirectory(dirname(resolve(file)));
        database = new SqliteDatabase(file);
      } catch (err) {
        // "ENOTDIR: not a directory, mkdir …" alone does not say which setting put it there.
        throw new Error(`cannot open the SQLite database ${file} (set by SWITCHYARD_DATA_DIR or DATABASE_URL): ${(err as Error).message}`);
      }
      database.pragma('journal_mode = WAL');
      database.pragma('synchronous = NORMAL');
      database.pragma('foreign_keys = ON');
      if (file !== ':memory:') {
        // Checkpoints run on a worker thread (see WalCheckpointer), not in the commits of the event loop.
        database.pragma('wal_autocheckpoint = 0');
        // A WAL that grew under a burst is cut back to this size once it has been copied.
        database.pragma(`journal_size_limit = ${WAL_SIZE_LIMIT}`);
        this.checkpointer = new WalCheckpointer(file, WAL_CHECKPOINT_MS);
      }
      // Set up with better-sqlite3's default busy timeout (workers starting at once may meet in
      // the journal mode's switch), then none: a statement that finds the write lock held is run
      // again on a later turn of the event loop (NonBlockingSqliteDialect), never waited for in
      // SQLite's busy handler.
      database.pragma('busy_timeout = 0');
      this.db = new Kysely<Database>({ dialect: new NonBlockingSqliteDialect({ database: withStatementCache(database) }) });
      this.sqlite = database;
      // An in-memory database exists only on its one connection, and nothing else can hold its lock.
      this.ledgerDb = file === ':memory:' ? database : openLedgerConnection(file);
    }
  }

  async migrate(): Promise<void> {
    // Kysely looks for its own tables in every schema of a PostgreSQL database: name ours, so two
    // Switchyards in two schemas of one database (tests do that) each keep their own migrations.
    const schema =
      this.dialect === 'postgres'
        ? (await sql<{ schema: string }>`select current_schema() as schema`.execute(this.db)).rows[0]?.schema
        : undefined;
    const migrator = new Migrator({ db: this.db, provider: migrationProvider, ...(schema && { migrationTableSchema: schema }) });
    const { error, results } = await migrator.migrateToLatest();
    const failed = results?.find((r) => r.status === 'Error');
    if (error || failed) {
      const cause = error instanceof Error ? error.message : String(error ?? '');
      throw new Error(`database migration ${failed?.migrationName ?? ''} failed: ${cause}`);
    }
  }

  async ping(): Promise<void> {
    await sql`select 1`.execute(this.db);
  }

  async close(): Promise<void> {
    await this.checkpointer?.close();
    if (this.ledgerDb !== this.sqlite) this.ledgerDb?.close();
    await this.db.destroy();
  }

  async createOrg(org: Org): Promise<void> {
    await this.db
      .insertInto('orgs')
      .values({ ...org, limits: org.limits ? JSON.stringify(org.limits) : null })
      .execute();
  }

  async getOrg(id: string): Promise<Org | undefined> {
    const row = await this.db.selectFrom('orgs').selectAll().where('id', '=', id).executeTakeFirst();
    return row && rowToOrg(row);
  }

  async listOrgs(): Promise<Org[]> {
    const rows = await this.db.selectFrom('orgs').selectAll().orderBy('id').execute();
    return rows.map(rowToOrg);
  }

  async createKey(key: ApiKeyRecord): Promise<void> {
    await this.db
      .insertInto('api_keys')
      .values({ ...key, limits: key.limits ? JSON.stringify(key.limits) : null })
      .execute();
  }

  async setKeyLimits(id: string, limits: Limits | null): Promise<boolean> {
    const res = await this.db
      .updateTable('api_keys')
      .set({ limits: limits ? JSON.stringify(limits) : null })
      .where('id', '=', id)
      .executeTakeFirst();
    return Number(res.numUpdatedRows) > 0;
  }

  async setOrgLimits(id: string, limits: Limits | null): Promise<boolean> {
    const res = await this.db
      .updateTable('orgs')
      .set({ limits: limits ? JSON.stringify(limits) : null })
      .where('id', '=', id)
      .executeTakeFirst();
    return Number(res.numUpdatedRows) > 0;
  }

  async spentSince(scope: 'key' | 'org', id: string, sinceMs: number): Promise<number> {
    const row = await this.db
      .selectFrom('usage_records')
      .select((eb) => eb.fn.sum<number | string | null>('cost').as('spent'))
      .where(scope === 'key' ? 'key_id' : 'org_id', '=', id)
      .where('at', '>=', sinceMs)
      .executeTakeFirst();
    return Number(row?.spent ?? 0);
  }

  async getKey(id: string): Promise<ApiKeyRecord | undefined> {
    const row = await this.db.selectFrom('api_keys').selectAll().where('id', '=', id).executeTakeFirst();
    return row && rowToKey(row);
  }

  async listKeys(orgId?: string): Promise<ApiKeyRecord[]> {
    let q = this.db.selectFrom('api_keys').selectAll();
    if (orgId !== undefined) q = q.where('org_id', '=', orgId);
    const rows = await q.orderBy('created_at').orderBy('id').execute();
    return rows.map(rowToKey);
  }

  async revokeKey(id: string, at: number): Promise<boolean | 'last_admin'> {
    return this.db.transaction().execute(async (tx) => {
      const existing = await tx.selectFrom('api_keys').select(['role', 'revoked_at']).where('id', '=', id).executeTakeFirst();
      if (!existing) return false;
      if (existing.revoked_at !== null) return true;
      if (existing.role === 'admin') {
        // PostgreSQL: the active admin keys' rows are locked, so two revocations at once cannot each
        // leave the other's key as the last one and revoke both. SQLite: transactions already do.
        let q = tx.selectFrom('api_keys').select('id').where('role', '=', 'admin').where('revoked_at', 'is', null);
        if (this.dialect === 'postgres') q = q.forUpdate();
        if ((await q.execute()).length <= 1) return 'last_admin';
      }
      await tx.updateTable('api_keys').set({ revoked_at: at }).where('id', '=', id).where('revoked_at', 'is', null).execute();
      return true;
    });
  }

  async countActiveAdminKeys(): Promise<number> {
    const row = await this.db
      .selectFrom('api_keys')
      .select((eb) => eb.fn.countAll<number | string>().as('n'))
      .where('role', '=', 'admin')
      .where('revoked_at', 'is', null)
      .executeTakeFirstOrThrow();
    return Number(row.n);
  }

  async upsertModel(model: Model): Promise<void> {
    const row = modelToRow(model);
    const { id: _id, created: _created, ...update } = row;
    await this.db
      .insertInto('models')
      .values(row)
      .onConflict((oc) => oc.column('id').doUpdateSet(update))
      .execute();
  }

  async insertModel(model: Model): Promise<boolean> {
    const result = await this.db
      .insertInto('models')
      .values(modelToRow(model))
      .onConflict((oc) => oc.column('id').doNothing())
      .executeTakeFirst();
    return Number(result.numInsertedOrUpdatedRows ?? 0) > 0;
  }

  async getModel(id: string): Promise<Model | undefined> {
    const row = await this.db.selectFrom('models').selectAll().where('id', '=', id).executeTakeFirst();
    return row && rowToModel(row);
  }

  async listModels(): Promise<Model[]> {
    const rows = await this.db.selectFrom('models').selectAll().orderBy('id').execute();
    return rows.map(rowToModel);
  }

  async createResponse(r: ResponseRecord): Promise<void> {
    const { input_items, ...row } = r;
    await this.db.transaction().execute(async (tx) => {
      await tx
        .insertInto('responses')
        .values({ ...row, background: row.background ? 1 : 0 })
        .execute();
      await tx.insertInto('response_inputs').values({ response_id: r.id, items: input_items }).execute();
    });
  }

  async getResponse(id: string): Promise<ListedResponse | undefined> {
    const row = await this.db.selectFrom('responses').selectAll().where('id', '=', id).executeTakeFirst();
    return row && rowToListedResponse(row);
  }

  async getResponseInput(id: string): Promise<string | undefined> {
    const row = await this.db.selectFrom('response_inputs').select('items').where('response_id', '=', id).executeTakeFirst();
    return row?.items;
  }

  async listResponses(orgId: string, q: CreationQuery): Promise<{ records: ListedResponse[]; hasMore: boolean }> {
    let query = this.db.selectFrom('responses').where('org_id', '=', orgId);
    if (q.after !== undefined) query = query.where(createdAfter(q.after, q.order));
    query = query
      .orderBy('created_ms', q.order)
      .orderBy('id', q.order)
      .limit(q.limit + 1);
    if (q.maxBytes === undefined) {
      const rows = await query.selectAll().execute();
      return { records: rows.slice(0, q.limit).map(rowToListedResponse), hasMore: rows.length > q.limit };
    }
    // Sizes first, then only the rows the page holds (see CreationQuery.maxBytes).
    const sized = await query.select(['id', sql<number>`octet_length(body)`.as('n')]).execute();
    const ids = fitting(sized, q.limit, q.maxBytes).map((r) => r.id);
    if (ids.length === 0) return { records: [], hasMore: false };
    const rows = await this.db
      .selectFrom('responses')
      .selectAll()
      .where('id', 'in', ids)
      .orderBy('created_ms', q.order)
      .orderBy('id', q.order)
      .execute();
    return { records: rows.map(rowToListedResponse), hasMore: sized.length > ids.length };
  }

  async updateResponse(
    id: string,
    from: readonly string[],
    set: Partial<Pick<ResponseRecord, 'status' | 'body' | 'updated_at'>>,
  ): Promise<boolean> {
    const res = await this.db
      .updateTable('responses')
      .set(set)
      .where('id', '=', id)
      .where('status', 'in', [...from])
      .executeTakeFirst();
    return Number(res.numUpdatedRows) > 0;
  }

  async deleteResponse(id: string): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      await tx.deleteFrom('stored_items').where('response_id', '=', id).execute();
      await tx.deleteFrom('response_inputs').where('response_id', '=', id).execute();
      const res = await tx.deleteFrom('responses').where('id', '=', id).executeTakeFirst();
      return Number(res.numDeletedRows) > 0;
    });
  }

  async saveResponseItems(orgId: string, responseId: string, items: ReadonlyArray<{ readonly id: string }>, at: number): Promise<void> {
    // An id already stored keeps the item (and response) it was first stored with: a later request
    // that sends the same item inline must not move it to a response that may be deleted first.
    const byId = new Map<string, { readonly id: string }>();
    for (const i of items) if (!byId.has(i.id)) byId.set(i.id, i);
    const unique = [...byId.values()];
    // In slices, well inside SQLite's and PostgreSQL's limits on bound parameters, each serialized
    // as it is written (200,000 items at once took a quarter of a second of the event loop).
    for (let n = 0; n < unique.length; n += ID_SLICE) {
      if (n > 0) await nextTurn();
      const rows = unique
        .slice(n, n + ID_SLICE)
        .map((i) => ({ org_id: orgId, id: i.id, response_id: responseId, item: JSON.stringify(i), created_at: at }));
      await this.db
        .insertInto('stored_items')
        .values(rows)
        .onConflict((oc) => oc.columns(['org_id', 'id']).doNothing())
        .execute();
    }
    // The response may have been deleted between two slices (deleting it deletes the items stored
    // so far): what came after would be left to no response, and still found by reference.
    if (unique.length > ID_SLICE) {
      const kept = await this.db.selectFrom('responses').select('id').where('id', '=', responseId).executeTakeFirst();
      if (!kept) await this.db.deleteFrom('stored_items').where('response_id', '=', responseId).execute();
    }
  }

  async findItems(
    orgId: string,
    ids: readonly string[],
    maxBytes: number,
    conversationId?: string,
  ): Promise<Map<string, string> | undefined> {
    const unique = [...new Set(ids)];
    // Sizes first (octet_length reads neither SQLite's overflow pages nor PostgreSQL's TOAST): the
    // items named may be far more than a request may read, and reading them is the cost.
    let total = 0;
    for (const bytes of (await this.resolveItems(orgId, unique, sql<number>`octet_length(item)`, conversationId)).values()) {
      total += Number(bytes);
      if (total > maxBytes) return undefined;
    }
    const items = new Map<string, string>();
    for (const [id, item] of await this.resolveItems(orgId, unique, sql<string>`item`, conversationId)) items.set(id, String(item));
    return items;
  }

  /**
   * `what` of the item each id names for the organization: the given conversation's own item, else
   * a stored response's, else the newest conversation item with that id; in slices of ids, the
   * event loop running between them.
   */
  private async resolveItems(
    orgId: string,
    unique: readonly string[],
    what: RawBuilder<unknown>,
    conversationId: string | undefined,
  ): Promise<Map<string, unknown>> {
    const found = new Map<string, unknown>();
    for (let n = 0; n < unique.length; n += ID_SLICE) {
      if (n > 0) await nextTurn();
      const slice = unique.slice(n, n + ID_SLICE);
      if (conversationId !== undefined) {
        const own = await this.db
          .selectFrom('conversation_items')
          .select(['id', what.as('v')])
          .where('conversation_id', '=', conversationId)
          .where('id', 'in', slice)
          .execute();
        for (const r of own) found.set(r.id, r.v);
      }
      const unowned = slice.filter((id) => !found.has(id));
      if (unowned.length === 0) continue;
      const stored = await this.db
        .selectFrom('stored_items')
        .select(['id', what.as('v')])
        .where('org_id', '=', orgId)
        .where('id', 'in', unowned)
        .execute();
      for (const r of stored) found.set(r.id, r.v);
      const rest = unowned.filter((id) => !found.has(id));
      if (rest.length === 0) continue;
      const inConversations = await this.db
        .selectFrom('conversation_items')
        .innerJoin('conversations', 'conversations.id', 'conversation_items.conversation_id')
        .select(['conversation_items.id as id', what.as('v')])
        .where('conversations.org_id', '=', orgId)
        .where('conversation_items.id', 'in', rest)
        .orderBy('conversation_items.created_at', 'desc')
        .execute();
      for (const r of inConversations) if (!found.has(r.id)) found.set(r.id, r.v);
    }
    return found;
  }

  async staleResponses(statuses: readonly string[], before: number): Promise<StaleResponse[]> {
    const rows = await this.db
      .selectFrom('responses')
      .selectAll()
      .where('status', 'in', [...statuses])
      .where('updated_at', '<', before)
      .execute();
    return rows.map((r) => ({ ...rowToListedResponse(r), pending_usage: r.pending_usage }));
  }

  async pendingUsage(id: string): Promise<string | null> {
    const row = await this.db.selectFrom('responses').select('pending_usage').where('id', '=', id).executeTakeFirst();
    return row?.pending_usage ?? null;
  }

  async touchResponses(ids: readonly string[], at: number, usage: ReadonlyMap<string, string>): Promise<void> {
    const plain = ids.filter((id) => !usage.has(id));
    if (plain.length) await this.db.updateTable('responses').set({ updated_at: at }).where('id', 'in', plain).execute();
    // Each running response's own record, a slice of them per statement (`case id when … then …`),
    // the event loop running between slices: a statement per response held the event loop (or a
    // pooled connection) for as many statements as there were running responses (a review).
    const entries = [...usage];
    for (let n = 0; n < entries.length; n += HEARTBEAT_SLICE) {
      if (n > 0) await nextTurn();
      const slice = entries.slice(n, n + HEARTBEAT_SLICE);
      const cases = sql.join(
        slice.map(([id, record]) => sql`when ${id} then ${record}`),
        sql` `,
      );
      await this.db
        .updateTable('responses')
        .set({ updated_at: at, pending_usage: sql<string>`case id ${cases} end` })
        .where(
          'id',
          'in',
          slice.map(([id]) => id),
        )
        .execute();
    }
  }

  async createConversation(c: ConversationRecord): Promise<void> {
    await this.db.insertInto('conversations').values(c).execute();
  }

  async getConversation(id: string): Promise<ConversationRecord | undefined> {
    const row = await this.db.selectFrom('conversations').selectAll().where('id', '=', id).executeTakeFirst();
    return row && rowToConversation(row);
  }

  async listConversations(orgId: string, q: CreationQuery): Promise<{ records: ConversationRecord[]; hasMore: boolean }> {
    let query = this.db.selectFrom('conversations').selectAll().where('org_id', '=', orgId);
    if (q.after !== undefined) query = query.where(createdAfter(q.after, q.order));
    const rows = await query
      .orderBy('created_ms', q.order)
      .orderBy('id', q.order)
      .limit(q.limit + 1)
      .execute();
    return { records: rows.slice(0, q.limit).map(rowToConversation), hasMore: rows.length > q.limit };
  }

  async updateConversation(id: string, metadata: string): Promise<void> {
    await this.db.updateTable('conversations').set({ metadata }).where('id', '=', id).execute();
  }

  async deleteConversation(id: string): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      await tx.deleteFrom('conversation_items').where('conversation_id', '=', id).execute();
      const res = await tx.deleteFrom('conversations').where('id', '=', id).executeTakeFirst();
      return Number(res.numDeletedRows) > 0;
    });
  }

  async appendConversationItems(conversationId: string, items: ReadonlyArray<{ id: string; json: string }>, at: number): Promise<boolean> {
    if (items.length === 0) return true;
    return this.db.transaction().execute(async (tx) => {
      // PostgreSQL: the conversation row lock serializes appenders. SQLite: transactions already do.
      let q = tx.selectFrom('conversations').select('id').where('id', '=', conversationId);
      if (this.dialect === 'postgres') q = q.forUpdate();
      if (!(await q.executeTakeFirst())) return false;
      const row = await tx
        .selectFrom('conversation_items')
        .select((eb) => eb.fn.max<number | string | null>('seq').as('top'))
        .where('conversation_id', '=', conversationId)
        .executeTakeFirst();
      const start = Number(row?.top ?? 0) + 1;
      // In slices: one statement for every item would pass the databases' limits on bound
      // parameters (SQLite's 32,766, PostgreSQL's 65,535) from about 6,500 items on.
      for (let n = 0; n < items.length; n += ID_SLICE) {
        await tx
          .insertInto('conversation_items')
          .values(
            items.slice(n, n + ID_SLICE).map((it, i) => ({
              id: it.id,
              conversation_id: conversationId,
              seq: start + n + i,
              item: it.json,
              bytes: Buffer.byteLength(it.json),
              created_at: at,
            })),
          )
          .execute();
      }
      return true;
    });
  }

  async listConversationItems(
    conversationId: string,
    opts: { after?: string | undefined; limit: number; order: 'asc' | 'desc'; maxBytes: number },
  ): Promise<ItemPage | undefined> {
    let q = this.db.selectFrom('conversation_items').select(['seq', 'bytes']).where('conversation_id', '=', conversationId);
    if (opts.after !== undefined) {
      const anchor = await this.db
        .selectFrom('conversation_items')
        .select('seq')
        .where('conversation_id', '=', conversationId)
        .where('id', '=', opts.after)
        .executeTakeFirst();
      if (!anchor) return undefined;
      q = q.where('seq', opts.order === 'asc' ? '>' : '<', Number(anchor.seq));
    }
    // Sizes first: the page stops where its items would pass maxBytes (an outside pass listed 100
    // items of 14 MB in one 42 MB reply, holding the event loop for seconds), then only those are read.
    const rows = await q
      .orderBy('seq', opts.order)
      .limit(opts.limit + 1)
      .execute();
    const unsized = await this.sizesOfUnsized(conversationId, rows);
    const seqs = fitting(
      rows.map((r) => ({ seq: Number(r.seq), n: unsized?.get(Number(r.seq)) ?? Number(r.bytes) })),
      opts.limit,
      opts.maxBytes,
    ).map((r) => r.seq);
    if (seqs.length === 0) return { items: [], hasMore: false };
    const items = await this.db
      .selectFrom('conversation_items')
      .select('item')
      .where('conversation_id', '=', conversationId)
      .where('seq', 'in', seqs)
      .orderBy('seq', opts.order)
      .execute();
    return { items: items.map((r) => r.item), hasMore: rows.length > seqs.length };
  }

  async recentConversationItems(conversationId: string, maxBytes: number, partial: boolean): Promise<RecentItems> {
    // Sizes first, newest first and a page at a time, down to the oldest item that still fits.
    const fit: Array<{ seq: number; bytes: number }> = [];
    let total = 0;
    let complete = true;
    sizes: for (let before = Number.POSITIVE_INFINITY; ;) {
      let q = this.db.selectFrom('conversation_items').select(['seq', 'bytes']).where('conversation_id', '=', conversationId);
      // A page at a time with a turn of the event loop between pages (a conversation of many small
      // items was scanned in one turn).
      if (before !== Number.POSITIVE_INFINITY) {
        await nextTurn();
        q = q.where('seq', '<', before);
      }
      const rows = await q.orderBy('seq', 'desc').limit(SIZE_PAGE).execute();
      const unsized = await this.sizesOfUnsized(conversationId, rows);
      for (const r of rows) {
        const bytes = unsized?.get(Number(r.seq)) ?? Number(r.bytes);
        total += bytes;
        if (total > maxBytes) {
          complete = false;
          break sizes;
        }
        fit.push({ seq: (before = Number(r.seq)), bytes });
      }
      if (rows.length < SIZE_PAGE) break;
    }
    if (!complete && !partial) return { items: [], complete };
    // Then those items, oldest first, about a megabyte a statement with a turn of the event loop
    // between statements: on SQLite each statement holds the event loop while it reads.
    const items: string[] = [];
    for (let end = fit.length - 1; end >= 0;) {
      let start = end;
      for (let bytes = fit[end]!.bytes; start > 0 && bytes + fit[start - 1]!.bytes <= ITEM_PAGE_BYTES; start--)
        bytes += fit[start - 1]!.bytes;
      if (items.length > 0) await nextTurn();
      const rows = await this.db
        .selectFrom('conversation_items')
        .select('item')
        .where('conversation_id', '=', conversationId)
        .where('seq', '>=', fit[end]!.seq)
        .where('seq', '<=', fit[start]!.seq)
        .orderBy('seq')
        .execute();
      for (const r of rows) items.push(r.item);
      end = start - 1;
    }
    return { items, complete };
  }

  async openingConversationItems(conversationId: string, maxItems: number, maxBytes: number): Promise<string[]> {
    const rows = await this.db
      .selectFrom('conversation_items')
      .select(['seq', 'bytes'])
      .where('conversation_id', '=', conversationId)
      .orderBy('seq')
      .limit(maxItems)
      .execute();
    const unsized = await this.sizesOfUnsized(conversationId, rows);
    let total = 0;
    let last: number | undefined;
    for (const r of rows) {
      total += unsized?.get(Number(r.seq)) ?? Number(r.bytes);
      if (total > maxBytes) break;
      last = Number(r.seq);
    }
    if (last === undefined) return [];
    const items = await this.db
      .selectFrom('conversation_items')
      .select('item')
      .where('conversation_id', '=', conversationId)
      .where('seq', '<=', last)
      .orderBy('seq')
      .execute();
    return items.map((r) => r.item);
  }

  /**
   * Sizes of items written without one (0: by an instance not yet migrated, during a rolling
   * upgrade), read apart so that the size reads stay on their covering index; none in steady state.
   */
  private async sizesOfUnsized(
    conversationId: string,
    rows: ReadonlyArray<{ seq: number; bytes: number }>,
  ): Promise<Map<number, number> | undefined> {
    const seqs = rows.filter((r) => Number(r.bytes) === 0).map((r) => Number(r.seq));
    if (seqs.length === 0) return undefined;
    const sized = await this.db
      .selectFrom('conversation_items')
      .select(['seq', sql<number>`octet_length(item)`.as('n')])
      .where('conversation_id', '=', conversationId)
      .where('seq', 'in', seqs)
      .execute();
    return new Map(sized.map((r) => [Number(r.seq), Number(r.n)]));
  }

  async getConversationItem(conversationId: string, itemId: string): Promise<string | undefined> {
    const row = await this.db
      .selectFrom('conversation_items')
      .select('item')
      .where('conversation_id', '=', conversationId)
      .where('id', '=', itemId)
      .executeTakeFirst();
    return row?.item;
  }

  async conversationItemsIn(conversationId: string, itemIds: readonly string[]): Promise<string[]> {
    if (itemIds.length === 0) return [];
    const rows = await this.db
      .selectFrom('conversation_items')
      .select('id')
      .where('conversation_id', '=', conversationId)
      .where('id', 'in', [...itemIds])
      .execute();
    return rows.map((r) => r.id);
  }

  async deleteConversationItem(conversationId: string, itemId: string): Promise<boolean> {
    const res = await this.db
      .deleteFrom('conversation_items')
      .where('conversation_id', '=', conversationId)
      .where('id', '=', itemId)
      .executeTakeFirst();
    return Number(res.numDeletedRows) > 0;
  }

  async createChatCompletion(c: ChatCompletionRecord, messages: string): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      await tx
        .insertInto('chat_completions')
        .values({ ...c, metadata: JSON.stringify(c.metadata), messages })
        .execute();
      const pairs = metadataRows(c.id, c.metadata);
      if (pairs.length) await tx.insertInto('chat_completion_metadata').values(pairs).execute();
    });
  }

  async getChatCompletion(orgId: string, id: string): Promise<ChatCompletionRecord | undefined> {
    const row = await this.db
      .selectFrom('chat_completions')
      .select(CHAT_COMPLETION_COLUMNS)
      .where('org_id', '=', orgId)
      .where('id', '=', id)
      .executeTakeFirst();
    return row && rowToChatCompletion(row);
  }

  async getChatCompletionMessages(orgId: string, id: string): Promise<string | undefined> {
    const row = await this.db
      .selectFrom('chat_completions')
      .select('messages')
      .where('org_id', '=', orgId)
      .where('id', '=', id)
      .executeTakeFirst();
    return row?.messages;
  }

  async updateChatCompletionMetadata(orgId: string, id: string, metadata: Readonly<Record<string, string>>): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      const res = await tx
        .updateTable('chat_completions')
        .set({ metadata: JSON.stringify(metadata) })
        .where('org_id', '=', orgId)
        .where('id', '=', id)
        .executeTakeFirst();
      if (Number(res.numUpdatedRows) === 0) return false;
      await tx.deleteFrom('chat_completion_metadata').where('completion_id', '=', id).execute();
      const pairs = metadataRows(id, metadata);
      if (pairs.length) await tx.insertInto('chat_completion_metadata').values(pairs).execute();
      return true;
    });
  }

  async deleteChatCompletion(orgId: string, id: string): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      const res = await tx.deleteFrom('chat_completions').where('org_id', '=', orgId).where('id', '=', id).executeTakeFirst();
      if (Number(res.numDeletedRows) === 0) return false;
      // The foreign key cascades too; deleting here does not depend on SQLite's foreign_keys pragma.
      await tx.deleteFrom('chat_completion_metadata').where('completion_id', '=', id).execute();
      return true;
    });
  }

  async listChatCompletions(orgId: string, q: ChatCompletionQuery): Promise<{ records: ChatCompletionRecord[]; hasMore: boolean }> {
    let query = this.db.selectFrom('chat_completions').select(CHAT_COMPLETION_COLUMNS).where('org_id', '=', orgId);
    if (q.model !== undefined) query = query.where('model', '=', q.model);
    for (const [key, value] of Object.entries(q.metadata)) {
      query = query.where(({ exists, selectFrom }) =>
        exists(
          selectFrom('chat_completion_metadata')
            .select('completion_id')
            .whereRef('chat_completion_metadata.completion_id', '=', 'chat_completions.id')
            .where('key', '=', key)
            .where('value', '=', value),
        ),
      );
    }
    const after = q.after;
    if (after !== undefined) {
      const op = q.order === 'asc' ? '>' : '<';
      query = query.where((eb) =>
        eb.or([eb('stored_at', op, after.stored_at), eb.and([eb('stored_at', '=', after.stored_at), eb('id', op, after.id)])]),
      );
    }
    query = query
      .orderBy('stored_at', q.order)
      .orderBy('id', q.order)
      .limit(q.limit + 1);
    if (q.maxBytes === undefined) {
      const rows = await query.execute();
      return { records: rows.slice(0, q.limit).map(rowToChatCompletion), hasMore: rows.length > q.limit };
    }
    // Sizes first, then only the rows the page holds (see CreationQuery.maxBytes).
    const sized = await query
      .clearSelect()
      .select(['id', sql<number>`octet_length(body)`.as('n')])
      .execute();
    const ids = fitting(sized, q.limit, q.maxBytes).map((r) => r.id);
    if (ids.length === 0) return { records: [], hasMore: false };
    const rows = await this.db
      .selectFrom('chat_completions')
      .select(CHAT_COMPLETION_COLUMNS)
      .where('id', 'in', ids)
      .orderBy('stored_at', q.order)
      .orderBy('id', q.order)
      .execute();
    return { records: rows.map(rowToChatCompletion), hasMore: sized.length > ids.length };
  }

  async getSetting(key: string): Promise<string | undefined> {
    const row = await this.db.selectFrom('settings').select('value').where('key', '=', key).executeTakeFirst();
    return row?.value;
  }

  async setSettingOnce(key: string, value: string): Promise<string> {
    await this.db
      .insertInto('settings')
      .values({ key, value })
      .onConflict((oc) => oc.column('key').doNothing())
      .execute();
    return (await this.getSetting(key))!;
  }

  async insertUsage(records: readonly UsageRecord[]): Promise<void> {
    if (records.length === 0) return;
    if (this.ledgerDb) {
      // The ledger's batches run on the event loop: one prepared statement in one transaction is
      // several times cheaper than building a many-row INSERT for every batch.
      this.insertUsageBatch ??= this.prepareUsageInsert(this.ledgerDb);
      this.insertUsageBatch(records);
      return;
    }
    await this.db
      .insertInto('usage_records')
      .values(
        records.map((r) => ({ ...r, stream: r.stream ? 1 : 0, price_missing: r.price_missing ? 1 : 0, estimated: r.estimated ? 1 : 0 })),
      )
      .onConflict((oc) =>
        oc
          .column('id')
          .doUpdateSet((eb) => {
            // Every column but the id, from the row that conflicted: the list's columns are the
            // table's (USAGE_COLUMNS is keyed by UsageRecord), which the keys built here lose.
            const set: Record<string, unknown> = {};
            for (const c of USAGE_COLUMNS) if (c !== 'id') set[c] = eb.ref(`excluded.${c}`);
            return set as UsageUpsert;
          })
          .where(sql<SqlBool>`${sql.raw(SNAPSHOT_ROW)}`),
      )
      .execute();
  }

  private prepareUsageInsert(db: SqliteDatabase.Database): (records: readonly UsageRecord[]) => void {
    const columns = USAGE_COLUMNS.join(', ');
    const stmt = db.prepare(
      `INSERT INTO usage_records (${columns}) VALUES (${USAGE_COLUMNS.map(() => '?').join(', ')}) ` +
        `ON CONFLICT (id) DO UPDATE SET ${REPLACE_SNAPSHOT} WHERE ${SNAPSHOT_ROW}`,
    );
    const many = db.transaction((records: readonly UsageRecord[]) => {
      for (const r of records) runUsageInsert(stmt, r);
    });
    // One record (requests one at a time) is its own transaction without BEGIN and COMMIT
    // statements around it: SQLite commits a lone statement the same way, 8k instructions sooner.
    // Several take the write lock at BEGIN (IMMEDIATE), so a busy database fails before any work.
    return (records) => (records.length === 1 ? runUsageInsert(stmt, records[0]!) : many.immediate(records));
  }

  isDataError(err: unknown): boolean {
    if (err instanceof TypeError || err instanceof RangeError) return true;
    const code = (err as { code?: unknown }).code;
    if (typeof code !== 'string') return false;
    return this.dialect === 'sqlite' ? SQLITE_DATA_CODES.test(code) : code.length === 5 && PG_DATA_CLASSES.has(code.slice(0, 2));
  }

  isBusyError(err: unknown): boolean {
    // PostgreSQL's inserts of new rows never wait on another writer's lock as a whole database.
    return this.dialect === 'sqlite' && isSqliteBusy(err);
  }

  async quarantineUsage(records: readonly QuarantinedUsage[]): Promise<void> {
    if (records.length === 0) return;
    await this.db
      .insertInto('usage_quarantine')
      .values([...records])
      .onConflict((oc) => oc.column('id').doNothing())
      .execute();
  }

  async listQuarantinedUsage(): Promise<QuarantinedUsage[]> {
    const rows = await this.db.selectFrom('usage_quarantine').selectAll().orderBy('at').execute();
    return rows.map((r) => ({ ...r, at: Number(r.at) }));
  }

  async usageTotals(groupBy: UsageGroup, f: UsageFilter): Promise<UsageTotal[]> {
    const column = ({ key: 'key_id', org: 'org_id', model: 'model', day: 'day' } as const)[groupBy];
    let q = this.db
      .selectFrom('usage_records')
      .select((eb) => [
        eb.ref(column).as('group'),
        eb.fn.countAll<number | string>().as('requests'),
        eb.fn.sum<number | string>(eb.case().when('status', '>=', 400).then(1).else(0).end()).as('errors'),
        eb.fn.sum<number | string>('input_tokens').as('input_tokens'),
        eb.fn.sum<number | string>('cached_tokens').as('cached_tokens'),
        eb.fn.sum<number | string>('output_tokens').as('output_tokens'),
        eb.fn.sum<number | string>('reasoning_tokens').as('reasoning_tokens'),
        eb.fn.sum<number | string | null>('cost').as('cost'),
        eb.fn.sum<number | string>('price_missing').as('unpriced_requests'),
        eb.fn.sum<number | string>('estimated').as('estimated_requests'),
      ]);
    if (f.org !== undefined) q = q.where('org_id', '=', f.org);
    if (f.key !== undefined) q = q.where('key_id', '=', f.key);
    if (f.model !== undefined) q = q.where('model', '=', f.model);
    if (f.from !== undefined) q = q.where('day', '>=', f.from);
    if (f.to !== undefined) q = q.where('day', '<=', f.to);
    const rows = await q.groupBy(column).orderBy(column).execute();
    return rows.map((r) => ({
      group: String(r.group),
      requests: Number(r.requests),
      errors: Number(r.errors ?? 0),
      input_tokens: Number(r.input_tokens ?? 0),
      cached_tokens: Number(r.cached_tokens ?? 0),
      output_tokens: Number(r.output_tokens ?? 0),
      reasoning_tokens: Number(r.reasoning_tokens ?? 0),
      // Each record's cost is rounded to 1e-10 dollars; their sum in floating point is not (6.000000000000001e-05).
      cost: Math.round(Number(r.cost ?? 0) * 1e10) / 1e10,
      unpriced_requests: Number(r.unpriced_requests ?? 0),
      estimated_requests: Number(r.estimated_requests ?? 0),
    }));
  }

  async listDeployments(): Promise<DeploymentRecord[]> {
    const rows = await this.db.selectFrom('deployments').selectAll().orderBy('model').orderBy('id').execute();
    return rows.map((r) => ({
      ...r,
      weight: Number(r.weight),
      created_at: Number(r.created_at),
      api: r.api === 'responses' || r.api === 'anthropic' ? r.api : 'chat',
    }));
  }

  async createDeployment(d: DeploymentRecord): Promise<boolean> {
    const res = await this.db
      .insertInto('deployments')
      .values(d)
      .onConflict((oc) => oc.column('id').doNothing())
      .executeTakeFirst();
    return Number(res.numInsertedOrUpdatedRows ?? 0) > 0;
  }

  async deleteDeployment(id: string): Promise<boolean> {
    const res = await this.db.deleteFrom('deployments').where('id', '=', id).executeTakeFirst();
    return Number(res.numDeletedRows) > 0;
  }
}

/**
 * `mkdir -p`, one level at a time. Node's `mkdirSync(dir, { recursive: true })` never returns where
 * a directory cannot be made for ENOENT under an existing parent (`/proc/x`): it makes the parent,
 * which exists, and tries again, forever, on the event loop, with the start-up's signals held.
 */
function makeDirectory(dir: string): void {
  if (existsSync(dir)) return;
  const parent = dirname(dir);
  if (parent !== dir) makeDirectory(parent);
  try {
    mkdirSync(dir);
  } catch (err) {
    // Made meanwhile by another process (a worker, the CLI) starting at the same time.
    if ((err as { code?: unknown }).code !== 'EEXIST' || !statSync(dir).isDirectory()) throw err;
  }
}
