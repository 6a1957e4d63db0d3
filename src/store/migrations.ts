import type { Kysely, Migration, MigrationProvider } from 'kysely';

/**
 * Migrations are code, named in order; Kysely's migrator records what ran and takes a lock, so
 * several instances starting together on PostgreSQL do not race. Only portable column types are
 * used so one list serves both dialects: JSON is kept as text, times as unix seconds.
 */
const migrations: Record<string, Migration> = {
  '0001_foundation': {
    async up(db: Kysely<unknown>) {
      await db.schema.createTable('orgs')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema.createTable('api_keys')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('org_id', 'text', (c) => c.notNull().references('orgs.id'))
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('role', 'text', (c) => c.notNull())
        .addColumn('hash', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('revoked_at', 'bigint')
        .execute();
      await db.schema.createIndex('api_keys_org').on('api_keys').column('org_id').execute();
      await db.schema.createTable('models')
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
};

export const migrationProvider: MigrationProvider = {
  getMigrations: async () => migrations,
};
