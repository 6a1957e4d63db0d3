import { sql, type Kysely, type Migration, type MigrationProvider } from 'kysely';

/**
 * Migrations are code, named in order; Kysely's migrator records what ran and takes a lock, so
 * several instances starting together on PostgreSQL do not race. Only portable column types are
 * used so one list serves both dialects: JSON is kept as text, times as integers. Times shown to
 * clients (`created_at`, `created`, `revoked_at`) are unix seconds, as the wire formats have them;
 * times used for ordering and expiry (`usage_records.at`, `responses.updated_at`, the quarantine's
 * `at`, `chat_completions.stored_at`, `created_ms` of responses and conversations) are unix milliseconds. `day` is the UTC date of `at`, for grouping.
 */
const migrations: Record<string, Migration> = {
  '0001_foundation': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('orgs')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema
        .createTable('api_keys')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('org_id', 'text', (c) => c.notNull().references('orgs.id'))
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('role', 'text', (c) => c.notNull())
        .addColumn('hash', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('revoked_at', 'bigint')
        .execute();
      await db.schema.createIndex('api_keys_org').on('api_keys').column('org_id').execute();
      await db.schema
        .createTable('models')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('author', 'text', (c) => c.notNull())
        .addColumn('slug', 'text', (c) => c.notNull())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('description', 'text', (c) => c.notNull())
        .addColumn('created', 'bigint', (c) => c.notNull())
        .addColumn('owned_by', 'text', (c) => c.notNull())
        .addColumn('status', 'text', (c) => c.notNull())
        .addColumn('visibility', 'text', (c) => c.notNull())
        .addColumn('pricing', 'text', (c) => c.notNull())
        .addColumn('context_length', 'integer')
        .addColumn('model_type', 'text', (c) => c.notNull())
        .addColumn('capabilities', 'text', (c) => c.notNull())
        .addColumn('output_size', 'text')
        .addColumn('source', 'text', (c) => c.notNull())
        .execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropTable('models').execute();
      await db.schema.dropTable('api_keys').execute();
      await db.schema.dropTable('orgs').execute();
    },
  },
  '0002_responses': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('responses')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('org_id', 'text', (c) => c.notNull())
        .addColumn('status', 'text', (c) => c.notNull())
        .addColumn('background', 'integer', (c) => c.notNull())
        .addColumn('conversation_id', 'text')
        .addColumn('previous_response_id', 'text')
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('updated_at', 'bigint', (c) => c.notNull())
        .addColumn('body', 'text', (c) => c.notNull())
        .addColumn('input_items', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('responses_status').on('responses').columns(['status', 'updated_at']).execute();
      await db.schema
        .createTable('conversations')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('org_id', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('metadata', 'text', (c) => c.notNull())
        .execute();
      await db.schema
        .createTable('conversation_items')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('conversation_id', 'text', (c) => c.notNull().references('conversations.id').onDelete('cascade'))
        .addColumn('seq', 'integer', (c) => c.notNull())
        .addColumn('item', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('conversation_items_seq').on('conversation_items').columns(['conversation_id', 'seq']).unique().execute();
      await db.schema
        .createTable('settings')
        .addColumn('key', 'text', (c) => c.primaryKey())
        .addColumn('value', 'text', (c) => c.notNull())
        .execute();
    },
    async down(db: Kysely<unknown>) {
      for (const t of ['settings', 'conversation_items', 'conversations', 'responses']) await db.schema.dropTable(t).execute();
    },
  },
  '0003_usage': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('usage_records')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('at', 'bigint', (c) => c.notNull())
        .addColumn('day', 'text', (c) => c.notNull())
        .addColumn('request_id', 'text', (c) => c.notNull())
        .addColumn('key_id', 'text', (c) => c.notNull())
        .addColumn('org_id', 'text', (c) => c.notNull())
        .addColumn('model', 'text', (c) => c.notNull())
        .addColumn('deployment', 'text')
        .addColumn('endpoint', 'text', (c) => c.notNull())
        .addColumn('stream', 'integer', (c) => c.notNull())
        .addColumn('input_tokens', 'integer', (c) => c.notNull())
        .addColumn('cached_tokens', 'integer', (c) => c.notNull())
        .addColumn('output_tokens', 'integer', (c) => c.notNull())
        .addColumn('reasoning_tokens', 'integer', (c) => c.notNull())
        .addColumn('cost', 'double precision')
        .addColumn('price_missing', 'integer', (c) => c.notNull())
        .addColumn('latency_ms', 'integer', (c) => c.notNull())
        .addColumn('ttft_ms', 'integer')
        .addColumn('status', 'integer', (c) => c.notNull())
        .addColumn('error_code', 'text')
        .execute();
      await db.schema.createIndex('usage_records_org_day').on('usage_records').columns(['org_id', 'day']).execute();
      await db.schema.createIndex('usage_records_key_day').on('usage_records').columns(['key_id', 'day']).execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropTable('usage_records').execute();
    },
  },
  '0004_limits': {
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable('api_keys').addColumn('limits', 'text').execute();
      await db.schema.alterTable('orgs').addColumn('limits', 'text').execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.alterTable('api_keys').dropColumn('limits').execute();
      await db.schema.alterTable('orgs').dropColumn('limits').execute();
    },
  },
  '0005_deployments': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('deployments')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('model', 'text', (c) => c.notNull())
        .addColumn('base_url', 'text', (c) => c.notNull())
        .addColumn('api_key_env', 'text')
        .addColumn('upstream_model', 'text')
        .addColumn('weight', 'double precision', (c) => c.notNull())
        .addColumn('api', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropTable('deployments').execute();
    },
  },
  '0006_usage_estimates': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .alterTable('usage_records')
        .addColumn('estimated', 'integer', (c) => c.notNull().defaultTo(0))
        .execute();
      await db.schema
        .createTable('usage_quarantine')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('at', 'bigint', (c) => c.notNull())
        .addColumn('record', 'text', (c) => c.notNull())
        .addColumn('error', 'text', (c) => c.notNull())
        .execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropTable('usage_quarantine').execute();
      await db.schema.alterTable('usage_records').dropColumn('estimated').execute();
    },
  },
  '0007_conversation_item_scope': {
    // Item ids were one global primary key: a client reusing an id inside a conversation lost the
    // turn, and another organization's id gave a 500 (and told the caller it existed). Ids are now
    // unique per conversation only.
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('conversation_items_v2')
        .addColumn('conversation_id', 'text', (c) => c.notNull().references('conversations.id').onDelete('cascade'))
        .addColumn('id', 'text', (c) => c.notNull())
        .addColumn('seq', 'integer', (c) => c.notNull())
        .addColumn('item', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('conversation_items_v2_pk', ['conversation_id', 'id'])
        .execute();
      await sql`insert into conversation_items_v2 (conversation_id, id, seq, item, created_at)
        select conversation_id, id, seq, item, created_at from conversation_items`.execute(db);
      await db.schema.dropTable('conversation_items').execute();
      await db.schema.alterTable('conversation_items_v2').renameTo('conversation_items').execute();
      await db.schema
        .createIndex('conversation_items_order')
        .on('conversation_items')
        .columns(['conversation_id', 'seq'])
        .unique()
        .execute();
    },
    async down() {
      throw new Error('0007_conversation_item_scope cannot be undone');
    },
  },
  // The items of stored responses, by organization, so an item_reference can name any of them
  // (the AI SDK's multi-step loop refers to the last step's reasoning item without chaining).
  '0008_stored_items': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('stored_items')
        .addColumn('org_id', 'text', (c) => c.notNull())
        .addColumn('id', 'text', (c) => c.notNull())
        .addColumn('response_id', 'text', (c) => c.notNull())
        .addColumn('item', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('stored_items_pk', ['org_id', 'id'])
        .execute();
      await db.schema.createIndex('stored_items_response').on('stored_items').column('response_id').execute();
      // Item references are looked up in conversations by item id alone (the key starts with the conversation).
      await db.schema.createIndex('conversation_items_id').on('conversation_items').column('id').execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropIndex('conversation_items_id').execute();
      await db.schema.dropTable('stored_items').execute();
    },
  },
  // Chat completions created with `store: true`. Metadata is kept twice: as JSON text on the row
  // (what reads return) and as one row per pair (what list filters match, with the same SQL on both
  // dialects and no JSON functions).
  '0009_stored_chat_completions': {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('chat_completions')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('org_id', 'text', (c) => c.notNull())
        .addColumn('model', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('stored_at', 'bigint', (c) => c.notNull())
        .addColumn('metadata', 'text', (c) => c.notNull())
        .addColumn('body', 'text', (c) => c.notNull())
        .addColumn('messages', 'text', (c) => c.notNull())
        .execute();
      // The list's order within an organization, and its cursor.
      await db.schema.createIndex('chat_completions_order').on('chat_completions').columns(['org_id', 'stored_at', 'id']).execute();
      await db.schema
        .createTable('chat_completion_metadata')
        .addColumn('completion_id', 'text', (c) => c.notNull().references('chat_completions.id').onDelete('cascade'))
        .addColumn('key', 'text', (c) => c.notNull())
        .addColumn('value', 'text', (c) => c.notNull())
        .addPrimaryKeyConstraint('chat_completion_metadata_pk', ['completion_id', 'key'])
        .execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropTable('chat_completion_metadata').execute();
      await db.schema.dropTable('chat_completions').execute();
    },
  },
  // Lists of an organization's stored responses and conversations, ordered by creation. `created_at`
  // is in seconds, too coarse to page on (a client makes several in one second); rows from before
  // this migration get their second's first millisecond, and ties fall back to the id.
  '0010_creation_order': {
    async up(db: Kysely<unknown>) {
      for (const table of ['responses', 'conversations']) {
        await db.schema
          .alterTable(table)
          .addColumn('created_ms', 'bigint', (c) => c.notNull().defaultTo(0))
          .execute();
        await sql`update ${sql.table(table)} set created_ms = created_at * 1000`.execute(db);
        await db.schema.createIndex(`${table}_org_order`).on(table).columns(['org_id', 'created_ms', 'id']).execute();
      }
    },
    async down(db: Kysely<unknown>) {
      for (const table of ['responses', 'conversations']) {
        await db.schema.dropIndex(`${table}_org_order`).execute();
        await db.schema.alterTable(table).dropColumn('created_ms').execute();
      }
    },
  },
  // A response's input items apart from its row: the row is rewritten on every change of status,
  // and a large input with it (three rewrites of a 6 MB input held a SQLite worker ~2 s).
  '0011_response_inputs': {
    async up(db: Kysely<unknown>) {
      // Each step may be run again: on SQLite a migration is not one transaction (Kysely runs its
      // DDL outside one), so a process stopped half-way finds some steps done at its next start.
      await db.schema
        .createTable('response_inputs')
        .ifNotExists()
        .addColumn('response_id', 'text', (c) => c.primaryKey())
        .addColumn('items', 'text', (c) => c.notNull())
        .execute();
      // (PostgreSQL runs it in one transaction, and its introspection would list other schemas' tables.)
      const transactional = db.getExecutor().adapter.supportsTransactionalDdl;
      const responses = transactional ? undefined : (await db.introspection.getTables()).find((t) => t.name === 'responses');
      if (transactional || responses?.columns.some((c) => c.name === 'input_items')) {
        await sql`insert into response_inputs (response_id, items)
          select id, input_items from responses where id not in (select response_id from response_inputs)`.execute(db);
        await db.schema.alterTable('responses').dropColumn('input_items').execute();
      }
    },
    async down(db: Kysely<unknown>) {
      await db.schema
        .alterTable('responses')
        .addColumn('input_items', 'text', (c) => c.notNull().defaultTo('[]'))
        .execute();
      await sql`update responses set input_items = (select items from response_inputs where response_id = responses.id) where exists (select 1 from response_inputs where response_id = responses.id)`.execute(
        db,
      );
      await db.schema.dropTable('response_inputs').execute();
    },
  },
  // Each conversation item's size, so that a turn reads the newest items within a byte budget
  // without loading the older ones (a 150 MB conversation read whole held the event loop 1.5 s a turn).
  '0012_conversation_item_bytes': {
    async up(db: Kysely<unknown>) {
      // May be run again on SQLite (see 0011): the column is added only when it is not there yet.
      const transactional = db.getExecutor().adapter.supportsTransactionalDdl;
      const items = transactional ? undefined : (await db.introspection.getTables()).find((t) => t.name === 'conversation_items');
      if (transactional || !items?.columns.some((c) => c.name === 'bytes')) {
        await db.schema
          .alterTable('conversation_items')
          .addColumn('bytes', 'bigint', (c) => c.notNull().defaultTo(0))
          .execute();
      }
      // Characters rather than bytes for items stored before: close enough for a budget.
      await sql`update conversation_items set bytes = length(item) where bytes = 0`.execute(db);
      // Sizes read from the index alone: in SQLite's row the column comes after the item, and
      // reaching it walks the item's overflow pages (90 ms for three 15 MB items).
      await db.schema
        .createIndex('conversation_items_sizes')
        .ifNotExists()
        .on('conversation_items')
        .columns(['conversation_id', 'seq', 'bytes'])
        .execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.dropIndex('conversation_items_sizes').execute();
      await db.schema.alterTable('conversation_items').dropColumn('bytes').execute();
    },
  },
  // What a running response has used so far, refreshed with its heartbeat: a process that dies
  // mid-run leaves it, and the response marked failed for it is billed that (it went unbilled).
  '0013_response_pending_usage': {
    async up(db: Kysely<unknown>) {
      const transactional = db.getExecutor().adapter.supportsTransactionalDdl;
      const responses = transactional ? undefined : (await db.introspection.getTables()).find((t) => t.name === 'responses');
      if (transactional || !responses?.columns.some((c) => c.name === 'pending_usage'))
        await db.schema.alterTable('responses').addColumn('pending_usage', 'text').execute();
    },
    async down(db: Kysely<unknown>) {
      await db.schema.alterTable('responses').dropColumn('pending_usage').execute();
    },
  },
};

export const migrationProvider: MigrationProvider = {
  getMigrations: async () => migrations,
};
