import Type from 'typebox';
import { ApiError } from '../../core/errors.js';
import { Metadata } from '../fields.js';
import { PageQuery } from '../pages.js';
import type { ChatRequest } from './request.js';

/**
 * The wire side of stored chat completions (OpenAI's `GET/POST/DELETE /v1/chat/completions/{id}`,
 * the list, and a completion's messages): request shapes, and the objects and pages served.
 */

export const CompletionParams = Type.Object({ id: Type.String({ minLength: 1 }) });

/** The list's query; `metadata[key]=value` filters come as further parameters (see metadataFilter). */
export const ListQuery = Type.Object({ ...PageQuery.properties, model: Type.Optional(Type.String()) });

/** Only the metadata can be changed; null clears it. */
export const UpdateBody = Type.Object({ metadata: Type.Union([Metadata, Type.Null()]) });

const METADATA_PARAM = /^metadata\[(.*)\]$/;
const MAX_FILTERS = 16;

/**
 * The `metadata[key]=value` filters of a list query (how the SDKs send a `metadata` object). Each
 * must be given once, as text; the key is the text between the outer brackets.
 */
export function metadataFilter(query: Readonly<Record<string, unknown>>): Record<string, string> {
  // No prototype: a filter on `__proto__` is a key like any other (it matches nothing stored, as
  // such keys are refused on write) rather than an assignment to the prototype that drops it.
  const out = Object.create(null) as Record<string, string>;
  let n = 0;
  for (const [param, value] of Object.entries(query)) {
    const key = METADATA_PARAM.exec(param)?.[1];
    if (key === undefined) continue;
    if (typeof value !== 'string') throw new ApiError('invalid_value', `Give '${param}' once, as text.`, { param });
    if (++n > MAX_FILTERS) throw new ApiError('invalid_value', `At most ${MAX_FILTERS} metadata filters.`, { param });
    out[key] = value;
  }
  return out;
}

type WireMessage = ChatRequest['messages'][number];
/** What core keeps of a message: opaque but for its id. */
type StoredMessage = { id: string } & Record<string, unknown>;

/**
 * The request's messages as OpenAI serves them back (ChatCompletionStoreMessage): each with an id
 * (`<completion id>-<index>`), its text as `content`, and the parts as sent in `content_parts`.
 */
export function storeMessages(completionId: string, messages: readonly WireMessage[]): StoredMessage[] {
  return messages.map((m, i) => {
    const parts = Array.isArray(m.content) ? m.content : null;
    // The text of the parts, as OpenAI gives it back; images keep their place only in content_parts.
    const content =
      parts === null
        ? (m.content ?? null)
        : parts
            .map((p: Readonly<Record<string, unknown>>) => (p['type'] === 'text' && typeof p['text'] === 'string' ? p['text'] : ''))
            .join('');
    const out: StoredMessage = {
      id: `${completionId}-${i}`,
      role: m.role,
      content,
      refusal: null,
      name: m.name ?? null,
      content_parts: parts,
    };
    if (m.tool_calls) out['tool_calls'] = m.tool_calls.map((c) => ({ id: c.id, type: c.type ?? 'function', function: c.function }));
    if (m.tool_call_id !== undefined) out['tool_call_id'] = m.tool_call_id;
    return out;
  });
}

/** A stored completion as served: the object returned at creation, with its metadata. */
export const storedCompletionObject = (c: {
  completion: { id: string } & Record<string, unknown>;
  metadata: Record<string, string>;
}): { id: string } & Record<string, unknown> => ({ ...c.completion, metadata: c.metadata });

export const deletedObject = (id: string) => ({ id, object: 'chat.completion.deleted', deleted: true });
