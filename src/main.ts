import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, databaseLocation, loadConfig } from './config.js';
import cluster from 'node:cluster';
import { createLogger, createService, prepareDatabase } from './app.js';
import { IpcCounters, START_FAILED, clusterMetrics, runPrimary } from './cluster.js';
import { workerBus } from './bus.js';

const USAGE = `Usage: npm start [-- --port N --host H]   (or: node dist/src/main.js, npx switchyard serve)

Serves the API until SIGTERM or SIGINT, then drains in-flight requests and exits.
  --port N   port to listen on (default: PORT, else 8080)
  --host H   address to listen on (default: HOST, else 127.0.0.1)
Every other setting is an environment variable, or a field of the file SWITCHYARD_CONFIG names
(README.md, "Configuration").
`;

function showGeneratedKey(key: string | undefined): void {
  if (!key) return;
  // Shown once: only its hash is stored.
  process.stdout.write(
    `\nNo admin key was configured, so one was generated. It is shown only this once:\n\n  ${key}\n\n` +
      'Keep it somewhere safe, or set SWITCHYARD_ADMIN_KEY to use your own. It is stored (as a hash) before\n' +
      'the server listens, so it stays valid even if this start fails below (a port already taken, say).\n\n',
  );
}

/**
 * `npm start [-- --port N --host H]`: serve until SIGTERM or SIGINT, then drain. With more than one
 * worker (SWITCHYARD_WORKERS, default: one per core) this process becomes the cluster's primary.
 */
export async function serve(argv: string[]): Promise<number> {
  let config;
  try {
    const { values } = parseArgs({
      args: argv,
      options: { port: { type: 'string' }, host: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const port = values.port === undefined ? undefined : Number(values.port);
    if (port !== undefined && !(Number.isInteger(port) && port >= 0 && port <= 65535)) {
      throw new ConfigError(`Invalid configuration: --port must be an integer from 0 to 65535 (got "${values.port}")`);
    }
    config = loadConfig({ overrides: { ...(port !== undefined && { port }), ...(values.host !== undefined && { host: values.host }) } });
  } catch (err) {
    console.error(err instanceof Error ? err.message : String(err));
    return 2;
  }
  // A signal that arrives while starting up (a worker being forked as the service stops, a container
  // stopped right after it started) is held and acted on once start-up is done, so the process still
  // drains and exits 0 rather than dying half-started by the default handler.
  let early: NodeJS.Signals | undefined;
  const hold = (signal: NodeJS.Signals) => {
    early ??= signal;
  };
  process.on('SIGTERM', hold);
  process.on('SIGINT', hold);
  const release = () => {
    process.off('SIGTERM', hold);
    process.off('SIGINT', hold);
  };
  const isWorker = cluster.isWorker;
  const log = isWorker ? createLogger(config).child({ worker: cluster.worker?.id }) : createLogger(config);
  /**
   * A start that fails: one line on stderr, not a stack trace, and (in a worker) the code that tells
   * the primary not to start another worker that would fail the same way.
   */
  const cannotStart = (err: unknown, what: string): number => {
    release();
    log.fatal({ err }, what);
    console.error(`switchyard: ${what}: ${(err as Error).message}`);
    return START_FAILED;
  };
  const clustered = !isWorker && config.workers > 1;
  let service;
  try {
    if (clustered) {
      const { generatedAdminKey, lock } = await prepareDatabase(config, log);
      try {
        showGeneratedKey(generatedAdminKey);
        release();
        if (early) return 0;
        return await runPrimary(config, config.workers, log);
      } finally {
        lock?.release();
      }
    }
    service = await createService(
      config,
      log,
      process.env,
      isWorker ? { shared: true, bus: workerBus(), ...(!config.redisUrl && { counters: new IpcCounters() }) } : {},
    );
  } catch (err) {
    return cannotStart(err, 'start-up failed');
  }
  // A scrape answers for every worker, not just the one it reached.
  if (isWorker) service.metrics.text = clusterMetrics(service.metrics.registry);
  showGeneratedKey(service.generatedAdminKey);
  if (!early) {
    let address: string;
    try {
      address = await service.app.listen({ host: config.host, port: config.port });
    } catch (err) {
      // Most often the port is taken.
      await service.close().catch(() => undefined);
      const taken = (err as NodeJS.ErrnoException).code === 'EADDRINUSE' ? ' (taken: choose another with PORT or --port)' : '';
      return cannotStart(err, `cannot listen on ${config.host}:${config.port}${taken}`);
    }
    log.info({ address, database: databaseLocation(config), models: service.catalogue.all().length }, 'switchyard listening');
    // Written at once, not with the next block of buffered lines: supervisors wait for this line.
    log.flush();
  }

  /**
   * How long stopping what is still running at the shutdown timeout may take, and then how long
   * recording what did not stop may take: together under the 2 s after which the primary kills a
   * worker (cluster.ts).
   */
  const FORCED_STOP_MS = 1_200;
  const LAST_RECORD_MS = 500;
  return new Promise<number>((resolveExit) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      log.info({ signal, timeout_ms: config.shutdownTimeoutMs }, 'shutting down: no new connections, draining requests');
      log.flush();
      let forced = false;
      const timer = setTimeout(() => {
        // Stopped rather than dropped: what they generated is billed before the ledger closes.
        forced = true;
        log.warn('in-flight requests did not finish in time; stopping them');
        service.stopNow();
        // A worker is killed 2 s after the timeout (cluster.ts): this must end before that.
        setTimeout(() => {
          log.warn('could not finish stopping; recording the usage of what still runs and exiting');
          const recorded = service.recordOpen().then(
            () => true,
            (err: unknown) => {
              log.error({ err }, 'recording the usage of what still ran failed');
              return false;
            },
          );
          void Promise.race([recorded, sleep(LAST_RECORD_MS, false)]).then((ok) => {
            if (!ok) log.error('could not record the usage of what still ran');
            resolveExit(1);
          });
        }, FORCED_STOP_MS);
      }, config.shutdownTimeoutMs);
      timer.unref();
      service.close().then(
        () => {
          clearTimeout(timer);
          if (forced) log.info('stopped what was still running; its usage is recorded');
          else log.info('shut down cleanly');
          resolveExit(forced ? 1 : 0);
        },
        (err: unknown) => {
          log.error({ err }, 'error while shutting down');
          resolveExit(1);
        },
      );
    };
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
    release();
    if (early) stop(early);
  });
}

const isEntry = process.argv[1] !== undefined && import.meta.url === new URL(`file://${process.argv[1]}`).href;
if (isEntry) {
  serve(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
}
