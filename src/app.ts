import { basename, resolve } from 'node:path';
import pino, { type Logger } from 'pino';
import { routingPolicy, schemaLimits, upstreamOptions, type Config } from './config.js';
import { Catalogue } from './core/catalogue.js';
import { ensureAdminKey } from './core/keys.js';
import { buildServer, type App } from './http/server.js';
import { InstanceLock } from './store/instance-lock.js';
import { KyselyStore, sqliteFileOf } from './store/kysely-store.js';
import { LocalEngine } from './engines/local/local-engine.js';
import { UpstreamEngine } from './engines/upstream/upstream-engine.js';
import type { Engine } from './engines/engine.js';
import { Router } from './core/router.js';
import { fileDeployment, storedDeployment } from './core/deployments.js';
import { AdminService } from './core/admin.js';
import { KeyAuthenticator } from './core/principal.js';
import type { LocalStatus } from './api/context.js';
import { AddressPolicy } from './engines/upstream/address-policy.js';
import { ReasoningSeal } from './core/reasoning-seal.js';
import { ResponseService, failAbandonedResponses } from './core/responses/service.js';
import { ConversationService } from './core/responses/conversations.js';
import { StoredCompletions } from './core/stored-completions.js';
import { responsesFormat } from './protocols/responses/resource.js';
import { Ledger } from './core/ledger.js';
import { Metrics } from './core/metrics.js';
import { Limiter, MemoryCounters, RedisCounters, type Counters } from './core/limits.js';
import type { Store } from './store/store.js';
import { GenerationPipeline } from './core/generation.js';
import type { ClusterBus } from './core/bus.js';
import { standaloneBus } from './bus.js';
import { LogBlocks } from './log-destination.js';

const storeOptions = (config: Config) => ({ databaseUrl: config.databaseUrl, sqlitePath: resolve(config.dataDir, 'switchyard.db') });

export function openStore(config: Config): Store {
  return new KyselyStore(storeOptions(config));
}

/** SQLite: the lock that makes this process the database's one instance (see InstanceLock). */
function instanceLock(config: Config): InstanceLock | undefined {
  const file = sqliteFileOf(storeOptions(config));
  return file === undefined ? undefined : InstanceLock.take(file);
}

/** The longest a log line waits in its block before it is written. */
const LOG_WAIT_MS = 100;

/**
 * The process's logger, on standard output, written in blocks (see LogBlocks) unless
 * `logBufferBytes` is 0. Warnings and errors are written at once.
 */
export function createLogger(config: Config): Logger {
  const out = pino.destination({ dest: 1, sync: false });
  if (config.logBufferBytes === 0) return pino({ level: config.logLevel, base: { service: 'switchyard' } }, out);
  const blocks = new LogBlocks(out, config.logBufferBytes, LOG_WAIT_MS);
  return pino({ level: config.logLevel, base: { service: 'switchyard' } }, blocks);
}

export interface Service {
  app: App;
  store: Store;
  catalogue: Catalogue;
  /** Set when this start generated the bootstrap admin key; shown once, never stored. */
  generatedAdminKey: string | undefined;
  metrics: Metrics;
  /** Stops accepting and waits for what runs (requests, responses) to end, then releases everything. */
  close(): Promise<void>;
  /**
   * The shutdown timeout passed: what still runs is stopped now (streams told with an error event,
   * responses failed, connections closed STOP_GRACE_MS later), billed for what it generated, so
   * that `close` can finish writing the ledger.
   */
  stopNow(): void;
  /**
   * Stopping did not finish either (a generation that does not end when told to): what is still
   * metered records what it used so far, and the ledger is written, before the process exits.
   */
  recordOpen(): Promise<void>;
}

/** How long a forced stop lets streams answer their clients with an error before it closes their connections (within main.ts's FORCED_STOP_MS). */
const STOP_GRACE_MS = 300;

/**
 * What a cluster's primary does once before its workers start: migrations, the bootstrap admin key,
 * the generated reasoning secret, and (SQLite: once it holds the instance lock, no other instance is
 * running) failing responses a previous run left unfinished.
 */
export async function prepareDatabase(
  config: Config,
  log: Logger,
): Promise<{ generatedAdminKey: string | undefined; lock: InstanceLock | undefined }> {
  const store = openStore(config);
  // SQLite: the primary holds the instance's lock for as long as it runs (the caller releases it).
  let lock: InstanceLock | undefined;
  try {
    lock = instanceLock(config);
    await store.migrate();
    const { generated } = await ensureAdminKey(store, config.adminKey);
    await ReasoningSeal.open(store, config.secretKey);
    if (store.dialect === 'sqlite') await failAbandonedResponses(store, responsesFormat, Date.now() + 1, log);
    return { generatedAdminKey: generated, lock };
  } catch (err) {
    lock?.release();
    throw err;
  } finally {
    await store.close();
  }
}

export interface ServiceOptions {
  /** Other processes use the same database (cluster workers): nothing running at start is assumed abandoned. */
  shared?: boolean;
  /** Rate-limit counters to use instead of Redis or this process's memory (a cluster primary's). */
  counters?: Counters;
  /** The cluster bus (a worker's, through its primary); by default this process links to other instances itself. */
  bus?: ClusterBus;
}

/** Everything but listening: store and migrations, bootstrap key, catalogue, HTTP routes. */
export async function createService(
  config: Config,
  log: Logger = createLogger(config),
  env: NodeJS.ProcessEnv = process.env,
  opts: ServiceOptions = {},
): Promise<Service> {
  const bus: ClusterBus = opts.bus ?? (await standaloneBus(config, log));
  const store = openStore(config);
  const engines: Engine[] = [];
  const stoppers: Array<() => Promise<void>> = [];
  let lock: InstanceLock | undefined;
  try {
    // Taken before anything running is swept as an orphan (ResponseService.start).
    if (opts.shared !== true) lock = instanceLock(config);
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
      schemaCacheSize: config.schemaCacheSize,
      schemaCompileTimeoutMs: config.schemaCompileTimeoutMs,
      templates: new Map(
        catalogue.localModels().flatMap((l) => {
          const t = config.localModels[basename(l.file)]?.chatTemplate;
          return t ? [[l.file, t] as const] : [];
        }),
      ),
      log,
    });
    engines.push(local);
    // Metrics first: engines and the ledger report into them.
    const metrics: Metrics = new Metrics(() => {
      const byFile = new Map(catalogue.localModels().map((l) => [l.file, metrics.modelLabel(l.model)]));
      return {
        models: local.status().map((st) => ({ model: byFile.get(st.file) ?? 'unknown', active: st.active, queued: st.queued })),
        schemaViolations: local.schemaViolations,
        schemaOutcomes: local.schemaOutcomes,
      };
    }, config.metricsToken !== undefined);
    metrics.isPrivate = (id) => catalogue.find(id)?.visibility === 'private';
    const upstream = new UpstreamEngine(log, upstreamOptions(config), {
      onInvalidUsage: (deployment) => metrics.upstreamUsageInvalid.inc({ deployment }),
    });
    engines.push(upstream);
    for (const d of config.deployments) {
      if (!catalogue.find(d.model)) log.warn({ model: d.model }, 'deployment names a model that is not in the catalogue');
    }
    const ledger = new Ledger(store, log, config.ledgerFlushMs, {
      onQuarantine: () => metrics.ledgerQuarantined.inc(),
      onWritable: (ok) => metrics.ledgerWritable.set(ok ? 1 : 0),
    });
    ledger.start();
    // ioredis reports each failed reconnection (every second or two while Redis is down): one line
    // in 30 s says it.
    let redisWarned = 0;
    const onRedisError = (err: Error): void => {
      if (Date.now() - redisWarned < 30_000) return;
      redisWarned = Date.now();
      log.warn({ reason: err.message }, 'Redis (limit counters) is unreachable: requests of keys with limits get 503 until it answers');
    };
    let counters: Counters;
    if (config.redisUrl) {
      const redis = new RedisCounters(config.redisUrl, onRedisError);
      // Closed with the service (below); here only if the service never starts.
      await redis.ready().catch(async (err: unknown) => {
        await redis.close();
        throw err;
      });
      counters = redis;
    } else counters = opts.counters ?? new MemoryCounters();
    const limiter = new Limiter(counters, store, metrics);
    const router = new Router(catalogue, local, upstream, config.deployments.map(fileDeployment), env, log, routingPolicy(config), {
      onDeploymentError: (deployment, code) => metrics.upstreamErrors.inc({ deployment, code }),
      onRetry: () => metrics.retries.inc(),
      onHealthChange: (deployment, up) => metrics.deploymentUp.set({ deployment }, up ? 1 : 0),
      onDeploymentGone: (deployment) => metrics.deploymentUp.remove({ deployment }),
    });
    stoppers.push(async () => router.close());
    // Deployments added through the admin API or the CLI live in the database; other instances pick
    // them up on the catalogue's refresh interval.
    const reloadDeployments = async () => router.setDeployments((await store.listDeployments()).map(storedDeployment));
    await reloadDeployments();
    if (config.catalogueRefreshMs > 0) {
      const timer = setInterval(
        () => reloadDeployments().catch((err: unknown) => log.warn({ err }, 'deployment refresh failed')),
        config.catalogueRefreshMs,
      );
      timer.unref();
      stoppers.push(async () => clearInterval(timer));
    }
    if (config.localPreload) {
      for (const l of catalogue.localModels()) await local.load(l.file);
    }
    const seal = await ReasoningSeal.open(store, config.secretKey);
    const pipeline = new GenerationPipeline(router, limiter, ledger, metrics, schemaLimits(config));
    const responses = new ResponseService(
      store,
      responsesFormat,
      pipeline,
      seal,
      log,
      {
        staleAfterMs: config.responseStaleMs,
        singleInstance: store.dialect === 'sqlite' && opts.shared !== true,
        historyMaxBytes: config.historyMaxBytes,
      },
      bus,
    );
    await responses.start();
    stoppers.push(() => responses.stop());
    const conversations = new ConversationService(store, seal, config.historyMaxBytes);
    const auth = new KeyAuthenticator(store, config.keyCacheTtlMs);
    // A change made here takes effect here at once, and in every other process when the bus tells it.
    const admin = new AdminService(store, catalogue, new AddressPolicy(config.upstreamAllow), config.upstreamKeyVars, {
      keyChanged: (id) => {
        auth.invalidate(id);
        bus.publish({ t: 'key', id });
      },
      orgChanged: (id) => {
        auth.invalidateOrg(id);
        bus.publish({ t: 'org', id });
      },
      deploymentsChanged: async () => {
        await reloadDeployments();
        bus.publish({ t: 'deployments' });
      },
      catalogueChanged: () => bus.publish({ t: 'catalogue' }),
    });
    const unsubscribe = bus.subscribe((m) => {
      const failed = (what: string) => (err: unknown) => log.warn({ err }, `${what} after a cluster change failed`);
      if (m.t === 'key') auth.invalidate(m.id);
      else if (m.t === 'org') auth.invalidateOrg(m.id);
      else if (m.t === 'deployments') reloadDeployments().catch(failed('reloading deployments'));
      else if (m.t === 'catalogue') catalogue.refresh().catch(failed('reloading the catalogue'));
    });
    stoppers.push(async () => unsubscribe());
    const localStatus = (): LocalStatus => {
      const byFile = new Map(catalogue.localModels().map((l) => [l.file, l.model.id]));
      return {
        models: local.status().map((st) => ({ model: byFile.get(st.file) ?? null, ...st })),
        schemaViolations: local.schemaViolations,
        schemaOutcomes: local.schemaOutcomes,
        cachedSchemas: local.cachedSchemas,
      };
    };
    const app = await buildServer({
      config,
      store,
      catalogue,
      router,
      admin,
      auth,
      localStatus,
      responses,
      conversations,
      storedCompletions: new StoredCompletions(store),
      ledger,
      metrics,
      limiter,
      pipeline,
      seal,
      log,
    });
    let closed = false;
    return {
      app,
      store,
      catalogue,
      generatedAdminKey: generated,
      metrics,
      stopNow() {
        // Recorded as stopped by the server (503), not as cancelled by their clients.
        ledger.stoppingOpen();
        responses.stopNow();
        // A generation that takes its next step meanwhile ends with an error its client is told
        // (metering.ts); the connections still open after that moment are closed, and each request
        // whose client goes stops as for a client that left: metering records what it made.
        setTimeout(() => app.server.closeAllConnections(), STOP_GRACE_MS).unref();
      },
      recordOpen: () => ledger.recordOpen(),
      async close() {
        if (closed) return;
        closed = true;
        catalogue.stop();
        // Keep-alive connections go as soon as their last answer is out: closing only the ones idle
        // at the start would leave the rest open until their keep-alive timeout.
        const sweep = setInterval(() => app.server.closeIdleConnections(), 100);
        // Stop accepting, and meanwhile end background work, so streams that follow it can finish.
        await Promise.all([app.close(), ...stoppers.map((stop) => stop())]).finally(() => clearInterval(sweep));
        // Every acknowledged request's usage record is written before the database closes.
        await ledger.close();
        await counters.close();
        await bus.close();
        try {
          for (const e of engines) await e.close();
          await store.close();
        } finally {
          lock?.release();
        }
      },
    };
  } catch (err) {
    await bus.close().catch(() => undefined);
    for (const e of engines) await e.close().catch(() => undefined);
    await store.close().catch(() => undefined);
    lock?.release();
    throw err;
  }
}
