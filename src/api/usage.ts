import Type, { type Static } from 'typebox';
import type { App, RouteContext } from './context.js';
import { ownUsageTotals } from '../core/usage.js';
import type { UsageTotal } from '../store/store.js';

const Day = Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' });

/** The query of both usage endpoints: how to group, and what to count (days are UTC, both ends included). */
const UsageQuery = Type.Object({
  group_by: Type.Optional(Type.Enum(['day', 'key', 'org', 'model'])),
  org: Type.Optional(Type.String()),
  key: Type.Optional(Type.String()),
  model: Type.Optional(Type.String()),
  from: Type.Optional(Day),
  to: Type.Optional(Day),
});
type UsageQuery = Static<typeof UsageQuery>;

/**
 * Usage totals from the ledger: `GET /admin/usage` (admin keys: every record) and `GET /v1/usage`
 * (any key: its own records only), with the same query and the same answer.
 */
export function registerUsageRoutes(app: App, ctx: RouteContext): void {
  const answer = async (q: UsageQuery, totals: (groupBy: NonNullable<UsageQuery['group_by']>) => Promise<UsageTotal[]>) => {
    // Totals include every request answered so far: queued ledger records are written first.
    await ctx.ledger.flush();
    const groupBy = q.group_by ?? 'day';
    return { object: 'list', group_by: groupBy, data: await totals(groupBy) };
  };
  const filter = (q: UsageQuery) => ({ org: q.org, key: q.key, model: q.model, from: q.from, to: q.to });

  app.get('/admin/usage', { onRequest: ctx.requireAdmin, schema: { querystring: UsageQuery } }, async (req) =>
    answer(req.query, (groupBy) => ctx.admin.usageTotals(groupBy, filter(req.query))),
  );

  app.get('/v1/usage', { onRequest: ctx.requireKey, schema: { querystring: UsageQuery } }, async (req) =>
    answer(req.query, (groupBy) => ownUsageTotals(ctx.store, req.principal!, groupBy, filter(req.query))),
  );
}
