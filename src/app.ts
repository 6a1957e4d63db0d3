import { resolve } from 'node:path';
import pino, { type Logger } from 'pino';
import type { Config } from './config.js';
import { Catalogue } from './core/catalogue.js';
import { ensureAdminKey } from './core/keys.js';
import { buildServer, type App } from './http/server.js';
import { KyselyStore } from './store/kysely-store.js';
import type { Store } from './store/store.js';

export function openStore(config: Config): Store {
  return new KyselyStore({ databaseUrl: config.databaseUrl, sqlitePath: resolve(config.dataDir, 'switchyard.db') });
}

export function createLogger(config: Config): Logger {
  return pino({ level: config.logLevel, base: { service: 'switchyard' } });
}

export interface Service {
  app: App;
  store: Store;
  catalogue: Catalogue;
  /** Set when this start generated the bootstrap admin key; shown once, never stored. */
  generatedAdminKey: string | undefined;
  close(): Promise<void>;
}

/** Everything but listening: store and migrations, bootstrap key, catalogue, HTTP routes. */
export async function createService(config: Config, log: Logger = createLogger(config)): Promise<Service> {
  const store = openStore(config);
  try {
    await store.migrate();
    const { generated } = await ensureAdminKey(store, config.adminKey);
    const catalogue = new Catalogue(store, config, log);
    await catalogue.init();
    const app = await buildServer({ config, store, catalogue, log });
    let closed = false;
    return {
      app, store, catalogue, generatedAdminKey: generated,
      async close() {
        if (closed) return;
        closed = true;
        catalogue.stop();
        await app.close();
        await store.close();
      },
    };
  } catch (err) {
    await store.close().catch(() => undefined);
    throw err;
  }
}
