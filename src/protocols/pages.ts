import Type from 'typebox';

/** Cursor pages as every OpenAI list endpoint takes and serves them. */

/** `limit`, `after` and `order` of a list's query. */
export const PageQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  after: Type.Optional(Type.String()),
  order: Type.Optional(Type.Enum(['asc', 'desc'])),
});

/** A page in the OpenAI list shape. */
export function listPage<T extends { id: string }>(data: readonly T[], hasMore: boolean): Record<string, unknown> {
  return { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: hasMore };
}
