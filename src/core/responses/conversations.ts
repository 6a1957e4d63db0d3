import { ApiError } from '../errors.js';
import type { Principal } from '../principal.js';
import type { ConversationRecord, ItemPage, Store } from '../../store/store.js';
import { checkNewItemIds, checkOutputsAnswerCalls, parseItems, resolveInput, type InputItem, type Item } from '../items.js';
import { newId, nowSeconds, orderMs } from '../ids.js';
import { PAGE_BYTES, type Page, type PageRequest } from '../paging.js';
import type { ReasoningSeal } from '../reasoning-seal.js';

/** A conversation as served (its items are listed separately). */
export interface Conversation {
  id: string;
  object: 'conversation';
  created_at: number;
  metadata: Record<string, string>;
}

const render = (c: ConversationRecord): Conversation => ({
  id: c.id,
  object: 'conversation',
  created_at: c.created_at,
  metadata: JSON.parse(c.metadata) as Record<string, string>,
});

/**
 * Conversations: stored, ordered lists of items that responses read from and append to. They
 * belong to the organization of the key that created them; any other gets 404. Item ids are
 * unique within a conversation (a reused one is a 400, never a silently lost item).
 */
export class ConversationService {
  constructor(
    private readonly store: Store,
    private readonly seal: ReasoningSeal,
    /** The most of the conversation read to find the calls that new outputs answer (as a turn reads it). */
    private readonly historyMaxBytes: number,
  ) {}

  /**
   * Sealed content added to a conversation is this organization's and intact: every later turn opens
   * it, so one that does not open (`encrypted_content: "zzz"`) failed every response on the
   * conversation until it was deleted (a hostile pass), as an unanswered call output would.
   */
  private checkSealed(items: readonly Item[], who: Principal): void {
    items.forEach((it, i) => {
      if ((it.type !== 'reasoning' && it.type !== 'compaction') || it.encrypted_content === undefined) return;
      if (this.seal.unseal(it.encrypted_content, who.orgId, it.type) === undefined)
        throw new ApiError('invalid_value', `The encrypted_content of ${it.type} item '${it.id}' could not be verified.`, {
          param: `items[${i}].encrypted_content`,
        });
    });
  }

  private async load(id: string, who: Principal): Promise<ConversationRecord> {
    const c = await this.store.getConversation(id);
    if (!c || c.org_id !== who.orgId) throw new ApiError('not_found', `No conversation with id '${id}'.`, { param: 'conversation_id' });
    return c;
  }

  /** New items: references have nothing to refer to here. */
  private newItems(input: readonly InputItem[]): Item[] {
    return resolveInput(input, () => undefined);
  }

  private async append(c: ConversationRecord, items: readonly Item[]): Promise<void> {
    let appended: boolean;
    try {
      appended = await this.store.appendConversationItems(
        c.id,
        items.map((i) => ({ id: i.id, json: JSON.stringify(i) })),
        nowSeconds(),
      );
    } catch (err) {
      // Another request added the same id in between.
      if (this.store.isDataError(err))
        throw new ApiError(
          'invalid_value',
          'An item with one of these ids was just added to this conversation; item ids must be unique within it.',
          { param: 'items' },
        );
      throw err;
    }
    // Deleted since it was looked up.
    if (!appended) throw new ApiError('not_found', `No conversation with id '${c.id}'.`, { param: 'conversation_id' });
  }

  /**
   * A function call output added to a conversation answers a call made before it (in the
   * conversation or earlier among the new items), as in a response's input: every later turn sends
   * the conversation to the model, and an upstream refuses a result for no call, so one such item
   * would fail every turn until it was deleted. The conversation's items are read only when a new
   * output's call is not among the new items, and only as far back as a turn reads them.
   */
  private async checkOutputs(items: readonly Item[], conversationId: string | undefined): Promise<void> {
    const calls = new Set<string>();
    const unanswered = items.some((it) => {
      if (it.type === 'function_call') calls.add(it.call_id);
      return it.type === 'function_call_output' && !calls.has(it.call_id);
    });
    if (!unanswered) return;
    const history = conversationId
      ? await parseItems((await this.store.recentConversationItems(conversationId, this.historyMaxBytes, true)).items)
      : [];
    checkOutputsAnswerCalls(history, items, (i) => `items[${i}].call_id`);
  }

  async create(who: Principal, input: readonly InputItem[], metadata: Record<string, string>): Promise<Conversation> {
    const items = this.newItems(input);
    checkNewItemIds(items, new Set(), (i) => `items[${i}].id`);
    this.checkSealed(items, who);
    await this.checkOutputs(items, undefined);
    const conv: ConversationRecord = {
      id: newId('conv'),
      org_id: who.orgId,
      created_at: nowSeconds(),
      created_ms: orderMs(),
      metadata: JSON.stringify(metadata),
    };
    await this.store.createConversation(conv);
    await this.append(conv, items);
    return render(conv);
  }

  async get(id: string, who: Principal): Promise<Conversation> {
    return render(await this.load(id, who));
  }

  /**
   * The organization's conversations in creation order (`asc`) or the reverse, the same objects
   * `get` serves. `after` must be one of them (another organization's id is treated like one that does not exist).
   */
  async list(who: Principal, page: PageRequest): Promise<Page<Conversation>> {
    let after: ConversationRecord | undefined;
    if (page.after !== undefined) {
      after = await this.store.getConversation(page.after);
      if (!after || after.org_id !== who.orgId)
        throw new ApiError('invalid_value', `No conversation '${page.after}' to list after.`, { param: 'after' });
    }
    const found = await this.store.listConversations(who.orgId, { after, limit: page.limit, order: page.order });
    return { data: found.records.map(render), hasMore: found.hasMore };
  }

  async update(id: string, who: Principal, metadata: Record<string, string>): Promise<Conversation> {
    const c = await this.load(id, who);
    await this.store.updateConversation(c.id, JSON.stringify(metadata));
    return render({ ...c, metadata: JSON.stringify(metadata) });
  }

  async delete(id: string, who: Principal): Promise<void> {
    const c = await this.load(id, who);
    await this.store.deleteConversation(c.id);
  }

  async addItems(id: string, who: Principal, input: readonly InputItem[]): Promise<Item[]> {
    const c = await this.load(id, who);
    const items = this.newItems(input);
    checkNewItemIds(
      items,
      new Set(
        await this.store.conversationItemsIn(
          c.id,
          items.map((i) => i.id),
        ),
      ),
      (i) => `items[${i}].id`,
    );
    this.checkSealed(items, who);
    await this.checkOutputs(items, c.id);
    await this.append(c, items);
    return items;
  }

  async listItems(
    id: string,
    who: Principal,
    page: { after?: string | undefined; limit: number; order: 'asc' | 'desc' },
  ): Promise<{ items: Item[]; hasMore: boolean }> {
    const c = await this.load(id, who);
    const found: ItemPage | undefined = await this.store.listConversationItems(c.id, { ...page, maxBytes: PAGE_BYTES });
    // As the responses and conversations lists do: a cursor that names nothing is the client's mistake, not an empty page.
    if (found === undefined)
      throw new ApiError('invalid_value', `No item '${page.after}' in this conversation to list after.`, { param: 'after' });
    return { items: found.items.map((j) => JSON.parse(j) as Item), hasMore: found.hasMore };
  }

  async getItem(id: string, who: Principal, itemId: string): Promise<Item> {
    const c = await this.load(id, who);
    const item = await this.store.getConversationItem(c.id, itemId);
    if (item === undefined) throw new ApiError('not_found', `No item '${itemId}' in this conversation.`, { param: 'item_id' });
    return JSON.parse(item) as Item;
  }

  async deleteItem(id: string, who: Principal, itemId: string): Promise<Conversation> {
    const c = await this.load(id, who);
    if (!(await this.store.deleteConversationItem(c.id, itemId))) {
      throw new ApiError('not_found', `No item '${itemId}' in this conversation.`, { param: 'item_id' });
    }
    return render(c);
  }
}
