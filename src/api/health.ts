import type { App, RouteContext } from './context.js';
import { ApiError } from '../core/errors.js';
import { secretMatches, sha256Hex } from '../core/keys.js';

export function registerHealthRoutes(app: App, ctx: RouteContext): void {
  /** The process is alive and serving HTTP. */
  app.get('/healthz', async () => ({ status: 'ok' }));

  /**
   * Prometheus metrics. Open by default so any scraper can read it; with SWITCHYARD_METRICS_TOKEN set
   * it needs `Authorization: Bearer <token>` (or keep the port off public networks).
   */
  // `Authorization: Bearer <token>` exactly; the token is hashed and compared in constant time, as
  // API keys are, so the answer's timing says nothing of it.
  const tokenHash = ctx.config.metricsToken === undefined ? undefined : sha256Hex(ctx.config.metricsToken);
  app.get('/metrics', async (req, reply) => {
    if (tokenHash !== undefined) {
      const auth = req.headers.authorization ?? '';
      const sent = auth.startsWith('Bearer ') && secretMatches(auth.slice(7), tokenHash);
      if (!sent) throw new ApiError('invalid_api_key', 'The metrics endpoint needs its token.');
    }
    reply.type(ctx.metrics.registry.contentType);
    return ctx.metrics.text();
  });

  /** Ready to serve: the database answers, and the usage ledger can write to it (answers wait for their record). */
  app.get('/readyz', async () => {
    try {
      await ctx.store.ping();
    } catch (err) {
      app.log.warn({ err }, 'readiness check failed');
      throw new ApiError('service_unavailable', 'The database is not reachable.', { retryAfterMs: 5000 });
    }
    if (!ctx.ledger.writable) {
      throw new ApiError(
        'service_unavailable',
        'The usage ledger cannot write to the database; generation answers are held until it can.',
        { retryAfterMs: 5000 },
      );
    }
    return { status: 'ready', database: ctx.store.dialect };
  });
}
