import type { App, RouteContext } from './context.js';
import {
  CompletionParams,
  ListQuery,
  UpdateBody,
  deletedObject,
  metadataFilter,
  storedCompletionObject,
} from '../protocols/chat/stored.js';
import { PageQuery, listPage } from '../protocols/pages.js';

/**
 * Stored chat completions (those created with `store: true`): read, relabel, list, delete, and
 * their request messages. `POST /v1/chat/completions` itself is in chat.ts.
 */
export function registerStoredChatRoutes(app: App, ctx: RouteContext): void {
  const { storedCompletions } = ctx;

  app.get('/v1/chat/completions', { onRequest: ctx.requireKey, schema: { querystring: ListQuery } }, async (req) => {
    const q = req.query;
    const page = await storedCompletions.list(
      req.principal!,
      { model: q.model, metadata: metadataFilter(q) },
      { after: q.after, limit: q.limit ?? 20, order: q.order ?? 'asc' },
    );
    return listPage(page.data.map(storedCompletionObject), page.hasMore);
  });

  app.get('/v1/chat/completions/:id', { onRequest: ctx.requireKey, schema: { params: CompletionParams } }, async (req) =>
    storedCompletionObject(await storedCompletions.get(req.params.id, req.principal!)),
  );

  app.post('/v1/chat/completions/:id', { onRequest: ctx.requireKey, schema: { params: CompletionParams, body: UpdateBody } }, async (req) =>
    storedCompletionObject(await storedCompletions.update(req.params.id, req.principal!, req.body.metadata ?? {})),
  );

  app.delete('/v1/chat/completions/:id', { onRequest: ctx.requireKey, schema: { params: CompletionParams } }, async (req) => {
    await storedCompletions.delete(req.params.id, req.principal!);
    return deletedObject(req.params.id);
  });

  app.get(
    '/v1/chat/completions/:id/messages',
    { onRequest: ctx.requireKey, schema: { params: CompletionParams, querystring: PageQuery } },
    async (req) => {
      const page = await storedCompletions.messages(req.params.id, req.principal!, {
        after: req.query.after,
        limit: req.query.limit ?? 20,
        order: req.query.order ?? 'asc',
      });
      return listPage(page.data, page.hasMore);
    },
  );
}
