import type { Model } from './model-record.js';

/**
 * When a write that found the database busy (SQLite: another worker of a cluster holds the file's
 * write lock) is tried again: on the next turns of the event loop first (another worker's commit
 * holds the lock for tens of microseconds), then after a few milliseconds, at most 50 between
 * tries. 0 is the next turn. Used by the SQLite connection (sqlite-dialect.ts) and the usage
 * ledger's queue.
 */
export const BUSY_RETRY_MS = [0, 0, 0, 1, 2, 5, 10, 20, 50] as const;
/** How long a database may stay busy before a write gives up (what SQLite's busy timeout was). */
export const BUSY_LIMIT_MS = 5000;

/** Resolves after the `tries`-th wait of BUSY_RETRY_MS: the next turn, or a few milliseconds. */
export function busyWait(tries: number): Promise<void> {
  const ms = BUSY_RETRY_MS[Math.min(tries, BUSY_RETRY_MS.length - 1)]!;
  return new Promise((resolve) => (ms === 0 ? setImmediate(resolve) : setTimeout(resolve, ms)));
}

/** Limits a key or an organization can carry; absent fields mean no limit. */
export interface Limits {
  rpm?: number;
  tpm?: number;
  /** US dollars per budget period. */
  budget?: number;
  budget_period?: 'day' | 'month';
  /** Catalogue ids this key/org may use. */
  models?: string[];
}

export interface Org {
  id: string;
  name: string;
  created_at: number;
  limits?: Limits | null;
}

export type KeyRole = 'admin' | 'inference';

export interface ApiKeyRecord {
  id: string;
  org_id: string;
  name: string;
  role: KeyRole;
  /** Hex SHA-256 of the key's secret part; the key itself is never stored. */
  hash: string;
  created_at: number;
  revoked_at: number | null;
  limits?: Limits | null;
}

export interface ResponseRecord {
  id: string;
  org_id: string;
  status: string;
  background: boolean;
  conversation_id: string | null;
  previous_response_id: string | null;
  created_at: number;
  /** Unix milliseconds when it was created, strictly increasing within a process: lists are ordered by it, then by id. */
  created_ms: number;
  /** Unix milliseconds; a running response's owner refreshes it, so a dead owner's work can be found. */
  updated_at: number;
  /** The Response object as served, JSON. */
  body: string;
  /** The response's own input items, JSON array. */
  input_items: string;
}

/** A response as it is read back: without its input items (getResponseInput has them). */
export type ListedResponse = Omit<ResponseRecord, 'input_items'>;

/** A running response nobody refreshed, with the usage record its last heartbeat kept (JSON), if any. */
export type StaleResponse = ListedResponse & { pending_usage: string | null };

export interface ConversationRecord {
  id: string;
  org_id: string;
  created_at: number;
  /** Unix milliseconds when it was created, strictly increasing within a process: lists are ordered by it, then by id. */
  created_ms: number;
  metadata: string;
}

/** A page of an organization's stored responses or conversations, in creation order (`asc`) or the reverse. */
export interface CreationQuery {
  /** The record the page starts after, in `order`. */
  after?: { id: string; created_ms: number } | undefined;
  limit: number;
  order: 'asc' | 'desc';
  /**
   * The most the page's records may hold in all, in stored bytes, where they can be large (stored
   * responses): the page stops before the record that would pass it (a first record larger than
   * it is a page of its own). Unset: `limit` alone.
   */
  maxBytes?: number | undefined;
}

/** A chat completion stored with `store: true`. Its request messages are read separately. */
export interface ChatCompletionRecord {
  id: string;
  org_id: string;
  model: string;
  /** Unix seconds: the completion's `created`. */
  created_at: number;
  /** Unix milliseconds when it was stored: lists are ordered by it, then by id. */
  stored_at: number;
  metadata: Record<string, string>;
  /** The chat.completion object as served when it was created, JSON. */
  body: string;
}

export interface ChatCompletionQuery {
  model?: string | undefined;
  /** Every pair must match. */
  metadata: Readonly<Record<string, string>>;
  /** The completion the page starts after, in `order`. */
  after?: Pick<ChatCompletionRecord, 'id' | 'stored_at'> | undefined;
  limit: number;
  order: 'asc' | 'desc';
  /** As CreationQuery's. */
  maxBytes?: number | undefined;
}

export interface RecentItems {
  items: string[];
  complete: boolean;
}

export interface ItemPage {
  items: string[];
  hasMore: boolean;
}

export interface UsageRecord {
  id: string;
  /** Unix milliseconds. */
  at: number;
  /** UTC date, YYYY-MM-DD, for daily totals. */
  day: string;
  request_id: string;
  key_id: string;
  org_id: string;
  model: string;
  deployment: string | null;
  endpoint: 'chat.completions' | 'responses' | 'responses.compact' | 'messages';
  stream: boolean;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  /** US dollars; null when the model lacks a price for something it used (see price_missing). */
  cost: number | null;
  price_missing: boolean;
  /** The token counts are an estimate: the upstream reported no usage (or an invalid one), or the request stopped before it did. */
  estimated: boolean;
  latency_ms: number;
  ttft_ms: number | null;
  status: number;
  error_code: string | null;
}

export type UsageGroup = 'key' | 'org' | 'model' | 'day';

export interface UsageFilter {
  org?: string | undefined;
  key?: string | undefined;
  model?: string | undefined;
  /** Inclusive YYYY-MM-DD bounds. */
  from?: string | undefined;
  to?: string | undefined;
}

export interface UsageTotal {
  group: string;
  requests: number;
  errors: number;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  cost: number;
  /** Requests whose cost is unknown because a price is missing: `cost` leaves them out. */
  unpriced_requests: number;
  /** Requests whose token counts are Switchyard's estimate rather than the engine's own. */
  estimated_requests: number;
}

/** A usage record the database refused (kept as JSON, never silently dropped). */
export interface QuarantinedUsage {
  id: string;
  at: number;
  record: string;
  error: string;
}

/** An upstream deployment added through the admin API (config-file ones are not stored). */
export interface DeploymentRecord {
  id: string;
  model: string;
  base_url: string;
  /** Name of the environment variable with the upstream's key; the key itself is never stored. */
  api_key_env: string | null;
  upstream_model: string | null;
  weight: number;
  api: 'chat' | 'responses' | 'anthropic';
  created_at: number;
}

/** The one persistence interface; SQLite and PostgreSQL are dialects of the same implementation. */
export interface Store {
  readonly dialect: 'sqlite' | 'postgres';
  migrate(): Promise<void>;
  /** Throws when the database cannot be reached. */
  ping(): Promise<void>;
  close(): Promise<void>;

  createOrg(org: Org): Promise<void>;
  getOrg(id: string): Promise<Org | undefined>;
  listOrgs(): Promise<Org[]>;

  createKey(key: ApiKeyRecord): Promise<void>;
  getKey(id: string): Promise<ApiKeyRecord | undefined>;
  listKeys(orgId?: string): Promise<ApiKeyRecord[]>;
  /**
   * Revokes a key (revoking twice keeps the first time): false when there is none, 'last_admin'
   * (and nothing revoked) when it is the last admin key not revoked, whose loss would lock every
   * operator out of the admin API.
   */
  revokeKey(id: string, at: number): Promise<boolean | 'last_admin'>;
  countActiveAdminKeys(): Promise<number>;
  setKeyLimits(id: string, limits: Limits | null): Promise<boolean>;
  setOrgLimits(id: string, limits: Limits | null): Promise<boolean>;
  /** US dollars spent by a key or an organization since `sinceMs`, from the ledger. */
  spentSince(scope: 'key' | 'org', id: string, sinceMs: number): Promise<number>;

  /** Insert or replace every field but `created`, which is kept when the entry already exists. */
  upsertModel(model: Model): Promise<void>;
  /** Insert; returns false when the id is taken. */
  insertModel(model: Model): Promise<boolean>;
  getModel(id: string): Promise<Model | undefined>;
  listModels(): Promise<Model[]>;

  /** Stores the response and, apart from it, its input items (written once, never rewritten). */
  createResponse(r: ResponseRecord): Promise<void>;
  getResponse(id: string): Promise<ListedResponse | undefined>;
  /**
   * The response's own input items, JSON array: kept out of the response's row, which is rewritten
   * on every change of status (a 200,000-item input rewritten three times held a worker for seconds).
   */
  getResponseInput(id: string): Promise<string | undefined>;
  /** The organization's stored responses, a page at a time (without their input items). */
  listResponses(orgId: string, q: CreationQuery): Promise<{ records: ListedResponse[]; hasMore: boolean }>;
  /** Updates only when the current status is one of `from` (a state transition); returns whether it did. */
  updateResponse(
    id: string,
    from: readonly string[],
    set: Partial<Pick<ResponseRecord, 'status' | 'body' | 'updated_at'>>,
  ): Promise<boolean>;
  /** Deletes the response and its stored items. */
  deleteResponse(id: string): Promise<boolean>;
  /**
   * Keeps a stored response's items (input and output) findable by id within the organization, each
   * stored as its JSON (made a slice at a time, between which other requests run); an id already
   * stored keeps its first item.
   */
  saveResponseItems(orgId: string, responseId: string, items: ReadonlyArray<{ readonly id: string }>, at: number): Promise<void>;
  /**
   * Items with these ids the organization stored, in responses or conversations (JSON text by id);
   * undefined, with nothing read but their sizes, when they hold more than `maxBytes` between them.
   * With `conversationId` (one of the organization's), that conversation's own item comes first for
   * an id it holds: item ids are unique within a conversation, not across them.
   */
  findItems(orgId: string, ids: readonly string[], maxBytes: number, conversationId?: string): Promise<Map<string, string> | undefined>;
  /** Running responses whose owner stopped refreshing them before `before` (ms). */
  staleResponses(statuses: readonly string[], before: number): Promise<StaleResponse[]>;
  /** The usage record (JSON) a running response's last heartbeat kept, if any. */
  pendingUsage(id: string): Promise<string | null>;
  /**
   * Marks running responses as refreshed at `at`, and keeps with each response in `usage` the usage
   * record (JSON) its run would write if it stopped now.
   */
  touchResponses(ids: readonly string[], at: number, usage: ReadonlyMap<string, string>): Promise<void>;

  createConversation(c: ConversationRecord): Promise<void>;
  getConversation(id: string): Promise<ConversationRecord | undefined>;
  /** The organization's conversations, a page at a time. */
  listConversations(orgId: string, q: CreationQuery): Promise<{ records: ConversationRecord[]; hasMore: boolean }>;
  updateConversation(id: string, metadata: string): Promise<void>;
  deleteConversation(id: string): Promise<boolean>;
  /**
   * Appends items as one contiguous block, atomically, after everything already there. False (and
   * nothing written) when the conversation is gone (deleted while a response on it ran).
   */
  appendConversationItems(conversationId: string, items: ReadonlyArray<{ id: string; json: string }>, at: number): Promise<boolean>;
  /**
   * A page of the conversation's items: at most `limit`, and no more than `maxBytes` of them in all
   * unless the first alone is larger (it is still the page; `hasMore` says whether items follow).
   * Undefined when `after` names no item of this conversation.
   */
  listConversationItems(
    conversationId: string,
    opts: { after?: string | undefined; limit: number; order: 'asc' | 'desc'; maxBytes: number },
  ): Promise<ItemPage | undefined>;
  /**
   * The conversation's newest items whose JSON together takes at most `maxBytes` (UTF-8), oldest
   * first; `complete` is false when older items were left out, and then, unless `partial`, no item
   * is read at all. Only the items returned are read.
   */
  recentConversationItems(conversationId: string, maxBytes: number, partial: boolean): Promise<RecentItems>;
  /**
   * The conversation's oldest items, at most `maxItems` whose JSON together takes at most
   * `maxBytes`, oldest first: where a conversation that is read in part keeps its opening
   * instructions from.
   */
  openingConversationItems(conversationId: string, maxItems: number, maxBytes: number): Promise<string[]>;
  getConversationItem(conversationId: string, itemId: string): Promise<string | undefined>;
  /** Which of these item ids the conversation already holds (ids are unique per conversation). */
  conversationItemsIn(conversationId: string, itemIds: readonly string[]): Promise<string[]>;
  deleteConversationItem(conversationId: string, itemId: string): Promise<boolean>;

  /** Stores a completion with its request messages (JSON array), metadata included, in one transaction. */
  createChatCompletion(c: ChatCompletionRecord, messages: string): Promise<void>;
  /** Every chat-completion method is scoped by organization: another one's id is not found. */
  getChatCompletion(orgId: string, id: string): Promise<ChatCompletionRecord | undefined>;
  getChatCompletionMessages(orgId: string, id: string): Promise<string | undefined>;
  /** Replaces the metadata; false when there is no such completion. */
  updateChatCompletionMetadata(orgId: string, id: string, metadata: Readonly<Record<string, string>>): Promise<boolean>;
  deleteChatCompletion(orgId: string, id: string): Promise<boolean>;
  listChatCompletions(orgId: string, q: ChatCompletionQuery): Promise<{ records: ChatCompletionRecord[]; hasMore: boolean }>;

  listDeployments(): Promise<DeploymentRecord[]>;
  /** Returns false when the id is taken. */
  createDeployment(d: DeploymentRecord): Promise<boolean>;
  deleteDeployment(id: string): Promise<boolean>;

  insertUsage(records: readonly UsageRecord[]): Promise<void>;
  /**
   * True when a failed write was refused because of the data it carried (a type, range or
   * constraint error) rather than because the database could not be written (down, busy, full).
   */
  isDataError(err: unknown): boolean;
  /**
   * True when `insertUsage` failed only because another connection holds the database's write lock
   * (SQLite with several workers): it does not wait for the lock, and may be called again shortly.
   */
  isBusyError(err: unknown): boolean;
  /** Keeps records the database refused, as JSON text. */
  quarantineUsage(records: readonly QuarantinedUsage[]): Promise<void>;
  listQuarantinedUsage(): Promise<QuarantinedUsage[]>;
  usageTotals(groupBy: UsageGroup, filter: UsageFilter): Promise<UsageTotal[]>;

  getSetting(key: string): Promise<string | undefined>;
  /** Stores the value unless the key exists; returns what is stored now (first writer wins). */
  setSettingOnce(key: string, value: string): Promise<string>;
}
