import Type from 'typebox';
import type { App, RouteContext } from './context.js';
import { decodeInput } from '../protocols/responses/items.js';
import { PageQuery, listPage } from '../protocols/pages.js';
import { Metadata } from '../protocols/fields.js';
import { CreateConversation, IdParams, ItemParams, NewItems } from '../protocols/responses/conversations.js';

/** The Conversations API: stored, ordered lists of items that responses read from and append to. */
export function registerConversationRoutes(app: App, ctx: RouteContext): void {
  const { conversations } = ctx;

  app.post('/v1/conversations', { onRequest: ctx.requireKey, schema: { body: CreateConversation } }, async (req) =>
    conversations.create(req.principal!, decodeInput(req.body?.items ?? [], 'items'), req.body?.metadata ?? {}),
  );

  // The organization's conversations, in creation order (`asc`, the default) or the reverse.
  app.get('/v1/conversations', { onRequest: ctx.requireKey, schema: { querystring: PageQuery } }, async (req) => {
    const { after, limit = 20, order = 'asc' } = req.query;
    const page = await conversations.list(req.principal!, { after, limit, order });
    return listPage(page.data, page.hasMore);
  });

  app.get('/v1/conversations/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) =>
    conversations.get(req.params.id, req.principal!),
  );

  app.post(
    '/v1/conversations/:id',
    { onRequest: ctx.requireKey, schema: { params: IdParams, body: Type.Object({ metadata: Metadata }) } },
    async (req) => conversations.update(req.params.id, req.principal!, req.body.metadata),
  );

  app.delete('/v1/conversations/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) => {
    await conversations.delete(req.params.id, req.principal!);
    return { id: req.params.id, object: 'conversation.deleted', deleted: true };
  });

  app.post(
    '/v1/conversations/:id/items',
    { onRequest: ctx.requireKey, schema: { params: IdParams, body: Type.Object({ items: NewItems }) } },
    async (req) => listPage(await conversations.addItems(req.params.id, req.principal!, decodeInput(req.body.items, 'items')), false),
  );

  app.get(
    '/v1/conversations/:id/items',
    { onRequest: ctx.requireKey, schema: { params: IdParams, querystring: PageQuery } },
    async (req) => {
      const page = await conversations.listItems(req.params.id, req.principal!, {
        after: req.query.after,
        limit: req.query.limit ?? 20,
        order: req.query.order ?? 'desc',
      });
      return listPage(page.items, page.hasMore);
    },
  );

  app.get('/v1/conversations/:id/items/:item_id', { onRequest: ctx.requireKey, schema: { params: ItemParams } }, async (req) =>
    conversations.getItem(req.params.id, req.principal!, req.params.item_id),
  );

  app.delete('/v1/conversations/:id/items/:item_id', { onRequest: ctx.requireKey, schema: { params: ItemParams } }, async (req) =>
    conversations.deleteItem(req.params.id, req.principal!, req.params.item_id),
  );
}
