import { basename, resolve } from 'node:path';
import pino, { type Logger } from 'pino';
import type { Config } from './config.js';
import { Catalogue } from './core/catalogue.js';
import { ensureAdminKey } from './core/keys.js';
import { buildServer, type App } from './http/server.js';
import { KyselyStore } from './store/kysely-store.js';
import { LocalEngine } from './engines/local/local-engine.js';
import { UpstreamEngine } from './engines/upstream/upstream-engine.js';
import type { Engine } from './engines/engine.js';
import { Router } from './core/router.js';
import { AddressPolicy } from './engines/upstream/address-policy.js';
import { ReasoningSeal } from './core/reasoning-seal.js';
import { ResponseService, failAbandonedResponses } from './core/responses.js';
import { Ledger } from './core/ledger.js';
import { Metrics } from './core/metrics.js';
import { Limiter, MemoryCounters, RedisCounters, type Counters } from './core/limits.js';
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

/**
 * What a cluster's primary does once before its workers start: migrations, the bootstrap admin key,
 * the generated reasoning secret, and (SQLite: no other instance can be running) failing responses a
 * previous run left unfinished.
 */
export async function prepareDatabase(config: Config, log: Logger): Promise<{ generatedAdminKey: string | undefined }> {
  const store = openStore(config);
  try {
    await store.migrate();
    const { generated } = await ensureAdminKey(store, config.adminKey);
    await ReasoningSeal.open(store, config.secretKey);
    if (store.dialect === 'sqlite') await failAbandonedResponses(store, Date.now() + 1, log);
    return { generatedAdminKey: generated };
  } finally {
    await store.close();
  }
}

export interface ServiceOptions {
  /** Other processes use the same database (cluster workers): nothing running at start is assumed abandoned. */
  shared?: boolean;
  /** Rate-limit counters to use instead of Redis or this process's memory (a cluster primary's). */
  counters?: Counters;
}

/** Everything but listening: store and migrations, bootstrap key, catalogue, HTTP routes. */
export async function createService(config: Config, log: Logger = createLogger(config), env: NodeJS.ProcessEnv = process.env, opts: ServiceOptions = {}): Promise<Service> {
  const store = openStore(config);
  const engines: Engine[] = [];
  const stoppers: Array<() => Promise<void>> = [];
  try {
    await store.migrate();
    const { generated } = await ensureAdminKey(store, config.adminKey);
    const catalogue = new Catalogue(store, config, log);
    await catalogue.init();
    const local = new LocalEngine({
      threads: config.localThreads,
      parallel: config.localParallel,
      queueSize: config.localQueueSize,
      memoryBudgetBytes: config.localMemoryBudgetMb * 1024 * 1024,
      gpu: config.localGpu,
      templates: new Map(catalogue.localModels().flatMap((l) => {
        const t = config.localModels[basename(l.file)]?.chatTemplate;
        return t ? [[l.file, t] as const] : [];
      })),
      log,
    });
    engines.push(local);
    const upstream = new UpstreamEngine(log, {
      connectTimeoutMs: config.upstreamConnectTimeoutMs,
      firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs,
      idleTimeoutMs: config.upstreamIdleTimeoutMs,
      policy: new AddressPolicy(config.upstreamAllow),
    });
    engines.push(upstream);
    for (const d of config.deployments) {
      if (!catalogue.find(d.model)) log.warn({ model: d.model }, 'deployment names a model that is not in the catalogue');
    }
    const metrics = new Metrics(() => {
      const byFile = new Map(catalogue.localModels().map((l) => [l.file, l.model.id]));
      return {
        models: local.status().map((st) => ({ model: byFile.get(st.file) ?? st.file, active: st.active, queued: st.queued })),
        schemaViolations: local.schemaViolations,
      };
    });
    const ledger = new Ledger(store, log, config.ledgerFlushMs);
    ledger.start();
    const counters = config.redisUrl ? new RedisCounters(config.redisUrl) : opts.counters ?? new MemoryCounters();
    const limiter = new Limiter(counters, store, metrics);
    const router = new Router(catalogue, local, upstream, config.deployments, env, log, {
      maxAttempts: config.upstreamMaxAttempts,
      retryBudgetRatio: config.retryBudgetRatio,
      health: { failures: config.breakerFailures, ejectMs: config.breakerEjectMs, probeIntervalMs: config.healthCheckIntervalMs },
    }, {
      onDeploymentError: (deployment, code) => metrics.upstreamErrors.inc({ deployment, code }),
      onRetry: () => metrics.retries.inc(),
      onHealthChange: (deployment, up) => metrics.deploymentUp.set({ deployment }, up ? 1 : 0),
    });
    stoppers.push(async () => router.close());
    // Deployments added through the admin API or the CLI live in the database; other instances pick
    // them up on the catalogue's refresh interval.
    const reloadDeployments = async () => router.setDeployments((await store.listDeployments()).map((d) => ({
      id: d.id, model: d.model, baseUrl: d.base_url, apiKeyEnv: d.api_key_env ?? undefined, upstreamModel: d.upstream_model ?? undefined, weight: d.weight, api: d.api,
    })));
    await reloadDeployments();
    if (config.catalogueRefreshMs > 0) {
      const timer = setInterval(() => reloadDeployments().catch((err: unknown) => log.warn({ err }, 'deployment refresh failed')), config.catalogueRefreshMs);
      timer.unref();
      stoppers.push(async () => clearInterval(timer));
    }
    if (config.localPreload) {
      for (const l of catalogue.localModels()) await local.load(l.file);
    }
    const seal = await ReasoningSeal.open(store, config.secretKey);
    const responses = new ResponseService(store, router, seal, log, { ledger, metrics }, {
      staleAfterMs: config.responseStaleMs,
      singleInstance: store.dialect === 'sqlite' && opts.shared !== true,
    });
    await responses.start();
    stoppers.push(() => responses.stop());
    const app = await buildServer({ config, store, catalogue, router, reloadDeployments, local, responses, ledger, metrics, limiter, log });
    let closed = false;
    return {
      app, store, catalogue, generatedAdminKey: generated,
      async close() {
        if (closed) return;
        closed = true;
        catalogue.stop();
        // Stop accepting, and meanwhile end background work, so streams that follow it can finish.
        await Promise.all([app.close(), ...stoppers.map((stop) => stop())]);
        // Every acknowledged request's usage record is written before the database closes.
        await ledger.close();
        await counters.close();
        for (const e of engines) await e.close();
        await store.close();
      },
    };
  } catch (err) {
    for (const e of engines) await e.close().catch(() => undefined);
    await store.close().catch(() => undefined);
    throw err;
  }
}
