import type { App, RouteContext } from '../http/server.js';
import { ApiError } from '../http/errors.js';

export function registerHealthRoutes(app: App, ctx: RouteContext): void {
  /** The process is alive and serving HTTP. */
  app.get('/healthz', async () => ({ status: 'ok' }));

  /** Ready to serve: the database answers. */
  app.get('/readyz', async () => {
    try {
      await ctx.store.ping();
    } catch (err) {
      app.log.warn({ err }, 'readiness check failed');
      throw new ApiError('service_unavailable', 'The database is not reachable.', { headers: { 'retry-after': '5' } });
    }
    return { status: 'ready', database: ctx.store.dialect };
  });
}
