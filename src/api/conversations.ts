import Type from 'typebox';
import type { App, RouteContext } from '../http/server.js';
import { ApiError } from '../http/errors.js';
import { newId, normaliseInput, type Item } from '../core/items.js';
import type { ConversationRecord } from '../store/store.js';
import type { Principal } from '../http/auth.js';
import { PageQuery, itemPage } from './responses.js';

const Metadata = Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 });
const Items = Type.Array(Type.Record(Type.String(), Type.Unknown()), { maxItems: 20 });
const IdParams = Type.Object({ id: Type.String() });
const ItemParams = Type.Object({ id: Type.String(), item_id: Type.String() });

const render = (c: ConversationRecord): Record<string, unknown> =>
  ({ id: c.id, object: 'conversation', created_at: c.created_at, metadata: JSON.parse(c.metadata) as Record<string, string> });

/** Conversations: a stored, ordered list of items that responses read from and append to. */
export function registerConversationRoutes(app: App, ctx: RouteContext): void {
  const { store } = ctx;

  const load = async (id: string, who: Principal): Promise<ConversationRecord> => {
    const c = await store.getConversation(id);
    if (!c || c.org_id !== who.orgId) throw new ApiError('not_found', `No conversation with id '${id}'.`, { param: 'conversation_id' });
    return c;
  };
  const toItems = (raw: Array<Record<string, unknown>>): Item[] => normaliseInput(raw, () => undefined);
  const now = () => Math.floor(Date.now() / 1000);

  app.post('/v1/conversations', {
    onRequest: ctx.requireKey,
    schema: { body: Type.Union([Type.Object({ items: Type.Optional(Type.Union([Items, Type.Null()])), metadata: Type.Optional(Type.Union([Metadata, Type.Null()])) }), Type.Null()]) },
  }, async (req) => {
    const items = toItems(req.body?.items ?? []);
    const conv: ConversationRecord = { id: newId('conv'), org_id: req.principal!.orgId, created_at: now(), metadata: JSON.stringify(req.body?.metadata ?? {}) };
    await store.createConversation(conv);
    await store.appendConversationItems(conv.id, items.map((i) => ({ id: i.id, json: JSON.stringify(i) })), now());
    return render(conv);
  });

  app.get('/v1/conversations/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) =>
    render(await load(req.params.id, req.principal!)));

  app.post('/v1/conversations/:id', { onRequest: ctx.requireKey, schema: { params: IdParams, body: Type.Object({ metadata: Metadata }) } }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    await store.updateConversation(c.id, JSON.stringify(req.body.metadata));
    return render({ ...c, metadata: JSON.stringify(req.body.metadata) });
  });

  app.delete('/v1/conversations/:id', { onRequest: ctx.requireKey, schema: { params: IdParams } }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    await store.deleteConversation(c.id);
    return { id: c.id, object: 'conversation.deleted', deleted: true };
  });

  app.post('/v1/conversations/:id/items', {
    onRequest: ctx.requireKey,
    schema: { params: IdParams, body: Type.Object({ items: Items }) },
  }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    const items = toItems(req.body.items);
    await store.appendConversationItems(c.id, items.map((i) => ({ id: i.id, json: JSON.stringify(i) })), now());
    return itemPage(items, false);
  });

  app.get('/v1/conversations/:id/items', { onRequest: ctx.requireKey, schema: { params: IdParams, querystring: PageQuery } }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    const page = await store.listConversationItems(c.id, { after: req.query.after, limit: req.query.limit ?? 20, order: req.query.order ?? 'desc' });
    return itemPage(page.items.map((j) => JSON.parse(j) as Item), page.hasMore);
  });

  app.get('/v1/conversations/:id/items/:item_id', { onRequest: ctx.requireKey, schema: { params: ItemParams } }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    const item = await store.getConversationItem(c.id, req.params.item_id);
    if (item === undefined) throw new ApiError('not_found', `No item '${req.params.item_id}' in this conversation.`, { param: 'item_id' });
    return JSON.parse(item) as Item;
  });

  app.delete('/v1/conversations/:id/items/:item_id', { onRequest: ctx.requireKey, schema: { params: ItemParams } }, async (req) => {
    const c = await load(req.params.id, req.principal!);
    if (!(await store.deleteConversationItem(c.id, req.params.item_id))) {
      throw new ApiError('not_found', `No item '${req.params.item_id}' in this conversation.`, { param: 'item_id' });
    }
    return render(c);
  });
}
