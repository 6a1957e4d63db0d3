import { ApiError } from './errors.js';
import type { Principal } from './principal.js';
import type { ChatCompletionRecord, Store } from '../store/store.js';
import { PAGE_BYTES, pageOf, type Page, type PageRequest } from './paging.js';
import { orderMs } from './ids.js';

/** A stored chat completion as the protocol renders it: the object served at creation, and its metadata. */
export interface StoredCompletion {
  id: string;
  metadata: Record<string, string>;
  /** The chat.completion object exactly as it was served. */
  completion: { id: string } & Record<string, unknown>;
}

/** One of a stored completion's request messages, in its wire form; ids are unique within the completion. */
export type StoredMessage = { id: string } & Record<string, unknown>;

const toStored = (r: ChatCompletionRecord): StoredCompletion => ({
  id: r.id,
  metadata: r.metadata,
  completion: JSON.parse(r.body) as StoredCompletion['completion'],
});

/**
 * Chat completions created with `store: true`: kept for the organization of the key that created
 * them, read, relabelled (metadata only), listed and deleted. Another organization's id answers
 * exactly like an unknown one (404), so ids leak nothing.
 */
export class StoredCompletions {
  constructor(private readonly store: Store) {}

  private notFound(id: string): ApiError {
    return new ApiError('not_found', `No stored chat completion with id '${id}'.`, { param: 'completion_id' });
  }

  private async record(id: string, who: Principal): Promise<ChatCompletionRecord> {
    const r = await this.store.getChatCompletion(who.orgId, id);
    if (!r) throw this.notFound(id);
    return r;
  }

  /** Stores a finished completion with the request's messages; resolves once it is in the database. */
  async save(
    who: Principal,
    c: { completion: Record<string, unknown> & { id: string; model: string; created: number }; messages: readonly StoredMessage[] },
    metadata: Record<string, string>,
  ): Promise<void> {
    await this.store.createChatCompletion(
      {
        id: c.completion.id,
        org_id: who.orgId,
        model: c.completion.model,
        created_at: c.completion.created,
        stored_at: orderMs(),
        metadata,
        body: JSON.stringify(c.completion),
      },
      JSON.stringify(c.messages),
    );
  }

  async get(id: string, who: Principal): Promise<StoredCompletion> {
    return toStored(await this.record(id, who));
  }

  async update(id: string, who: Principal, metadata: Record<string, string>): Promise<StoredCompletion> {
    const r = await this.record(id, who);
    // Deleted in between: the same answer as if it had never been there.
    if (!(await this.store.updateChatCompletionMetadata(who.orgId, id, metadata))) throw this.notFound(id);
    return toStored({ ...r, metadata });
  }

  async delete(id: string, who: Principal): Promise<void> {
    if (!(await this.store.deleteChatCompletion(who.orgId, id))) throw this.notFound(id);
  }

  async list(
    who: Principal,
    filter: { model?: string | undefined; metadata: Record<string, string> },
    page: PageRequest,
  ): Promise<Page<StoredCompletion>> {
    let after: ChatCompletionRecord | undefined;
    if (page.after !== undefined) {
      after = await this.store.getChatCompletion(who.orgId, page.after);
      if (!after) throw new ApiError('invalid_value', `No stored chat completion '${page.after}' to list after.`, { param: 'after' });
    }
    const found = await this.store.listChatCompletions(who.orgId, {
      ...filter,
      after,
      limit: page.limit,
      order: page.order,
      maxBytes: PAGE_BYTES,
    });
    return { data: found.records.map(toStored), hasMore: found.hasMore };
  }

  /** The request messages, in the order they were sent (`asc`) or the reverse. */
  async messages(id: string, who: Principal, page: PageRequest): Promise<Page<StoredMessage>> {
    const json = await this.store.getChatCompletionMessages(who.orgId, id);
    if (json === undefined) throw this.notFound(id);
    return pageOf(JSON.parse(json) as StoredMessage[], page, (after) => `No message '${after}' in this chat completion.`);
  }
}
