import Type, { type Static } from 'typebox';
import type { App, RouteContext } from './context.js';
import { ownUsageTotals } from '../core/usage.js';
import type { UsageTotal } from '../store/store.js';
import { ApiError } from '../core/errors.js';

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

/** A day the pattern lets through must be a real one (not 2026-13-45), and the range must not run backwards. */
function checkDays(q: UsageQuery): void {
  for (const param of ['from', 'to'] as const) {
    const day = q[param];
    if (day === undefined) continue;
    const at = new Date(`${day}T00:00:00Z`);
    if (Number.isNaN(at.getTime()) || at.toISOString().slice(0, 10) !== day)
      throw new ApiError('invalid_value', `${param} '${day}' is not a day of the calendar (YYYY-MM-DD).`, { param });
  }
  if (q.from !== undefined && q.to !== undefined && q.from > q.to)
    throw new ApiError('invalid_value', `from (${q.from}) is after to (${q.to}).`, { param: 'from' });
}

/**
 * Usage totals from the ledger: `GET /admin/usage` (admin keys: every record) and `GET /v1/usage`
 * (any key: its own records only), with the same query and the same answer.
 */
export function registerUsageRoutes(app: App, ctx: RouteContext): void {
  const answer = async (q: UsageQuery, totals: (groupBy: NonNullable<UsageQuery['group_by']>) => Promise<UsageTotal[]>) => {
    checkDays(q);
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
