import Type from 'typebox';

/** Request shapes of the Conversations API (the items themselves are read by items.ts). */
export const Metadata = Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 });
export const Items = Type.Array(Type.Record(Type.String(), Type.Unknown()), { maxItems: 20 });
export const IdParams = Type.Object({ id: Type.String() });
export const ItemParams = Type.Object({ id: Type.String(), item_id: Type.String() });
export const PageQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  after: Type.Optional(Type.String()),
  order: Type.Optional(Type.Enum(['asc', 'desc'])),
});
export const CreateConversation = Type.Union([
  Type.Object({ items: Type.Optional(Type.Union([Items, Type.Null()])), metadata: Type.Optional(Type.Union([Metadata, Type.Null()])) }),
  Type.Null(),
]);
