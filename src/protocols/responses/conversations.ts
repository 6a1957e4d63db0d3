import Type from 'typebox';
import { Metadata } from '../fields.js';

/** Request shapes of the Conversations API (the items themselves are read by items.ts). */
export const Items = Type.Array(Type.Record(Type.String(), Type.Unknown()), { maxItems: 20 });
/** Items added to a conversation: at least one (an empty list adds nothing, which is a client's mistake). */
export const NewItems = Type.Array(Type.Record(Type.String(), Type.Unknown()), { minItems: 1, maxItems: 20 });
export const IdParams = Type.Object({ id: Type.String() });
export const ItemParams = Type.Object({ id: Type.String(), item_id: Type.String() });
export const CreateConversation = Type.Union([
  Type.Object({ items: Type.Optional(Type.Union([Items, Type.Null()])), metadata: Type.Optional(Type.Union([Metadata, Type.Null()])) }),
  Type.Null(),
]);
