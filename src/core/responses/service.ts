import { setImmediate as nextTurn } from 'node:timers/promises';
import type { Logger } from 'pino';
import { ApiError } from '../errors.js';
import { Cancellation } from '../cancellation.js';
import type { Principal } from '../principal.js';
import type { ConversationRecord, ListedResponse, Store, UsageRecord } from '../../store/store.js';
import { costOf, writeOrQuarantine } from '../ledger.js';
import { generationRequest, newTally, tallyUsage, type GenerationRequest, type Message, type Usage } from '../canonical.js';
import {
  checkNewItemIds,
  checkOutputsAnswerCalls,
  checkUniqueInputIds,
  firstImage,
  fromTurn,
  openingInstructions,
  parseItems,
  inputField,
  itemsToMessages,
  resolveInput,
  type CompactionItem,
  type InputItem,
  type Item,
  type MessageItem,
  type ReasoningItem,
  type SealedText,
} from '../items.js';
import { newId, nowSeconds, orderMs } from '../ids.js';
import { PAGE_BYTES, type Page, type PageRequest } from '../paging.js';
import type { ReasoningSeal, SealPurpose } from '../reasoning-seal.js';
import type { Model } from '../model-spec.js';
import type { MeteredStream } from '../metering.js';
import type { GenerationPipeline, InputTokenCount } from '../generation.js';
import {
  TERMINAL,
  type Compaction,
  type ResponseEvent,
  type ResponseFold,
  type ResponsesCreate,
  type ResponsesFormat,
  type ResponseStatus,
} from './format.js';
import { EventLog, RemoteLog, Run } from './run.js';
import type { BusMessage, ClusterBus } from '../bus.js';
import type { ConnectionResponses } from './connection-state.js';

const HEARTBEAT_MS = 10_000;
const MAX_CHAIN = 1000;
/** How many of a conversation's first items are looked at for its opening instructions, when it is read in part. */
const OPENING_ITEMS = 8;
/** How long a process waits for a response's owner to answer over the bus before it reads the store instead. */
const OWNER_ANSWER_MS = 1000;
/** How long a cancel waits for the owner to stop and store the response. */
const CANCEL_WAIT_MS = 2000;
const ABANDONED = { code: 'server_error', message: 'The server running this response stopped before it finished.' };

/** What building a request's context reads of it (a create, a count, a compaction). */
type ContextRequest = Pick<ResponsesCreate<unknown>, 'model' | 'input' | 'instructions' | 'previousResponseId' | 'conversationId'> &
  Partial<Pick<ResponsesCreate<unknown>, 'truncation'>>;

/** The most a compaction summary may take; the instruction below asks for far less. */
const COMPACTION_MAX_TOKENS = 1024;
const COMPACTION_PROMPT =
  'Summarize the conversation above so that it can be continued from this summary alone. Keep every fact, ' +
  'decision, constraint, tool result and open task that later turns may need; leave out pleasantries. ' +
  'Write plain text, at most a few paragraphs.';

export interface ResponseServiceOptions {
  /** A running response whose owner has not refreshed it for this long is taken as abandoned. */
  staleAfterMs: number;
  /** The embedded SQLite database has one instance: whatever was running at start was this process's. */
  singleInstance: boolean;
  /** The most stored history (conversation items, previous responses) one request reads, in bytes of JSON. */
  historyMaxBytes: number;
}

/**
 * Writes the usage record a dead process's run left with its last heartbeat (see the heartbeat in
 * `start`), and gives its usage as a response reports it; nothing without one. A record the
 * database refuses is quarantined (a review found such a response retried on every sweep, never
 * marked), and its response reports no usage.
 */
async function billAbandoned(store: Store, responseId: string, pending: string | null): Promise<Usage | undefined> {
  if (pending === null) return undefined;
  let record: UsageRecord | undefined;
  try {
    record = JSON.parse(pending) as UsageRecord;
  } catch {
    record = undefined;
  }
  if (!(await writeOrQuarantine(store, record, `pending:${responseId}`, pending)) || record === undefined) return undefined;
  return {
    input: record.input_tokens,
    cached: record.cached_tokens,
    output: record.output_tokens,
    reasoning: record.reasoning_tokens,
    cost: record.cost,
    estimated: true,
  };
}

/** Responses still queued or running that nobody refreshed since `before` become failed. */
export async function failAbandonedResponses<E>(
  store: Store,
  format: ResponsesFormat<E>,
  before: number,
  log: Logger,
  isRunningHere: (id: string) => boolean = () => false,
): Promise<void> {
  for (const r of await store.staleResponses(['queued', 'in_progress'], before)) {
    if (isRunningHere(r.id)) continue;
    // Billed for what it had used at its last heartbeat, before it is marked (a failed write leaves
    // it to the next sweep). The record has the id its run would write at its end: a run that was
    // only slow and ends after all replaces it with its own (the store's insert), and one that has
    // already ended keeps its own.
    let billed: Usage | undefined;
    try {
      billed = await billAbandoned(store, r.id, r.pending_usage);
    } catch (err) {
      log.error({ err, response_id: r.id }, 'billing an abandoned response failed');
      continue;
    }
    // With the usage it is billed for, as every failed response reports it.
    const body = format.end(r.body, 'failed', ABANDONED, billed);
    if (await store.updateResponse(r.id, ['queued', 'in_progress'], { status: 'failed', body, updated_at: Date.now() })) {
      log.warn({ response_id: r.id }, 'marked an abandoned response as failed');
    }
  }
}

/**
 * Starts a generation for the Responses API. Engines name the prompt by the chat convention
 * (`messages`, as a context overflow does); a Responses request's prompt is its `input`.
 */
async function openAsResponses(open: () => Promise<MeteredStream>): Promise<MeteredStream> {
  try {
    return await open();
  } catch (err) {
    throw err instanceof ApiError && err.param === 'messages'
      ? err.naming('input', err.message.replace('the messages alone are', 'the input alone is').replaceAll('the messages', 'the input'))
      : err;
  }
}

/**
 * The Responses lifecycle, on canonical items and events: building the context (previous response
 * chain, conversation, input), running generation inline or in the background, storing the result,
 * cancel, replay, and cleaning up after instances that died mid-response. What the response looks
 * like on the wire is the format's (the Responses protocol module's).
 *
 * Transitions (anything else is refused):
 *   queued → in_progress → completed | incomplete | failed | cancelled
 *   queued → cancelled | failed
 */
export class ResponseService<Echo> {
  private readonly running = new Map<string, Run>();
  private timer: NodeJS.Timeout | undefined;
  /** Responses running elsewhere that clients here follow. */
  private readonly watching = new Map<string, Set<RemoteLog>>();
  /** Callers waiting for a response to stop running elsewhere (cancel, delete). */
  private readonly endWaiters = new Map<string, Set<() => void>>();
  private readonly snapshotWaiters = new Map<number, (resource: Record<string, unknown>) => void>();
  private nonce = 0;
  private unsubscribe: (() => void) | undefined;
  /** The shutdown timeout passed: runs stopped now are failed, not cancelled. */
  private shuttingDown = false;

  constructor(
    private readonly store: Store,
    private readonly format: ResponsesFormat<Echo>,
    private readonly pipeline: GenerationPipeline,
    private readonly seal: ReasoningSeal,
    private readonly log: Logger,
    private readonly opts: ResponseServiceOptions,
    private readonly bus: ClusterBus,
  ) {}

  /** What other processes ask of the runs here, and tell about theirs. */
  private readonly onBus = (m: BusMessage): void => {
    switch (m.t) {
      case 'response.cancel': {
        const run = this.running.get(m.id);
        if (run && !run.abort.aborted) run.abort.abort();
        return;
      }
      case 'response.ended':
        for (const wake of this.endWaiters.get(m.id) ?? []) wake();
        return;
      case 'response.watch': {
        const run = this.running.get(m.id);
        if (run) void this.forward(run, m.id, m.from);
        return;
      }
      case 'response.events':
        for (const log of this.watching.get(m.id) ?? []) log.add(m.start, m.events as ResponseEvent[], m.done);
        return;
      case 'response.get': {
        const run = this.running.get(m.id);
        if (run) this.bus.publish({ t: 'response.snapshot', id: m.id, to: m.from, nonce: m.nonce, resource: run.resource() });
        return;
      }
      case 'response.snapshot':
        this.snapshotWaiters.get(m.nonce)?.(m.resource);
        return;
      default:
    }
  };

  /**
   * Sends a run's events, from the first, to a process that follows it; batched per turn of the
   * event loop, so a fast stream is a few bus messages rather than one per token.
   */
  private async forward(run: Run, id: string, to: string): Promise<void> {
    let batch: ResponseEvent[] = [];
    let start = 0;
    let scheduled = false;
    const flush = (done: boolean) => {
      scheduled = false;
      if (batch.length === 0 && !done) return;
      this.bus.publish({ t: 'response.events', id, to, start, events: batch, done });
      start += batch.length;
      batch = [];
    };
    // An empty first message says "the owner is here" before the first event is ready.
    this.bus.publish({ t: 'response.events', id, to, start: 0, events: [], done: false });
    for await (const { events } of run.batches()) {
      for (const event of events) batch.push(event);
      if (!scheduled) {
        scheduled = true;
        setImmediate(() => flush(false));
      }
    }
    flush(true);
  }

  /** Resolves true when the response stops running elsewhere within `ms`, false otherwise. */
  private waitEnded(id: string, ms: number): Promise<boolean> {
    let set = this.endWaiters.get(id);
    if (!set) this.endWaiters.set(id, (set = new Set()));
    const waiters = set;
    return new Promise<boolean>((resolve) => {
      const wake = () => done(true);
      const timer = setTimeout(() => done(false), ms);
      const done = (ok: boolean) => {
        clearTimeout(timer);
        waiters.delete(wake);
        if (waiters.size === 0) this.endWaiters.delete(id);
        resolve(ok);
      };
      waiters.add(wake);
    });
  }

  /** The response object as its owner elsewhere serves it now, if one answers in time. */
  private askOwner(id: string): Promise<Record<string, unknown> | undefined> {
    const nonce = ++this.nonce;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.snapshotWaiters.delete(nonce);
        resolve(undefined);
      }, 250);
      this.snapshotWaiters.set(nonce, (resource) => {
        clearTimeout(timer);
        this.snapshotWaiters.delete(nonce);
        resolve(resource);
      });
      this.bus.publish({ t: 'response.get', id, from: this.bus.self, nonce });
    });
  }

  /**
   * Follows a response running in another process: its owner streams the events over the bus. If
   * no owner answers (it died, or the response just ended), the stored response finishes the log
   * once it is final (the sweep fails an abandoned one).
   */
  private followElsewhere(id: string): RemoteLog {
    const log = new RemoteLog();
    let set = this.watching.get(id);
    if (!set) this.watching.set(id, (set = new Set()));
    set.add(log);
    const asked = Date.now();
    const check = setInterval(() => {
      if (log.finished) return done();
      if (Date.now() - Math.max(asked, log.lastHeard) < OWNER_ANSWER_MS) return;
      this.store.getResponse(id).then(
        (r) => {
          if (!r) return log.settle([]);
          const { events, finished } = this.format.replay(r.body);
          if (finished) log.settle(events);
        },
        (err: unknown) => this.log.warn({ err, response_id: id }, 'reading a followed response failed'),
      );
    }, OWNER_ANSWER_MS / 4);
    check.unref();
    const done = () => {
      clearInterval(check);
      set.delete(log);
      if (set.size === 0) this.watching.delete(id);
    };
    this.bus.publish({ t: 'response.watch', id, from: this.bus.self });
    return log;
  }

  async start(): Promise<void> {
    this.unsubscribe = this.bus.subscribe(this.onBus);
    await this.sweep(this.opts.singleInstance ? Date.now() + 1 : Date.now() - this.opts.staleAfterMs);
    this.timer = setInterval(
      () => {
        const ids = [...this.running.keys()];
        // What each has used so far, for a process that dies before it ends (failAbandonedResponses).
        const usage = new Map<string, string>();
        for (const [id, run] of this.running) {
          const record = run.meter?.snapshot();
          if (record) usage.set(id, JSON.stringify(record));
        }
        this.store
          .touchResponses(ids, Date.now(), usage)
          .then(() => this.stopCancelledElsewhere(ids))
          .then(() => this.sweep(Date.now() - this.opts.staleAfterMs))
          .catch((err: unknown) => this.log.warn({ err }, 'response heartbeat failed'));
      },
      Math.min(HEARTBEAT_MS, Math.max(1000, this.opts.staleAfterMs / 3)),
    );
    this.timer.unref();
  }

  /**
   * A graceful shutdown: running responses, background ones included, go on to their end (within
   * the shutdown timeout, after which `stopNow` ends them); meanwhile they keep their heartbeat and
   * the bus, so other instances can still follow and cancel them and do not take them for abandoned.
   */
  async stop(): Promise<void> {
    await Promise.allSettled([...this.running.values()].map((r) => r.done));
    if (this.timer) clearInterval(this.timer);
    this.unsubscribe?.();
  }

  /**
   * The shutdown timeout passed: every running response stops now and is stored as `failed` with a
   * server error (nobody cancelled it), billed for what it generated.
   */
  stopNow(): void {
    this.shuttingDown = true;
    for (const r of this.running.values()) r.abort.abort();
  }

  /** The end of a run that was stopped: cancelled (by its client or a cancel call), or failed by a shutdown. */
  private stopped(fold: ResponseFold): ResponseEvent[] {
    return this.shuttingDown ? fold.fail('server_error', 'The server shut down before this response finished.') : fold.cancel();
  }

  /** A background run cancelled through another instance is stopped here at the next heartbeat. */
  private async stopCancelledElsewhere(ids: readonly string[]): Promise<void> {
    for (const id of ids) {
      const run = this.running.get(id);
      if (!run?.background || run.abort.aborted) continue;
      if ((await this.store.getResponse(id))?.status === 'cancelled') run.abort.abort();
    }
  }

  private sweep(before: number): Promise<void> {
    return failAbandonedResponses(this.store, this.format, before, this.log, (id) => this.running.has(id));
  }

  // ---- reading

  private async record(id: string, who: Principal): Promise<ListedResponse> {
    const r = await this.store.getResponse(id);
    if (!r || r.org_id !== who.orgId) throw new ApiError('not_found', `No response with id '${id}'.`, { param: 'response_id' });
    return r;
  }

  /**
   * The response object as served. `sealReasoning` (`include=reasoning.encrypted_content`) gives each
   * reasoning item that has its text and no `encrypted_content` yet one, sealed for the caller's
   * organization, as the create request would have with the same `include`.
   */
  async get(id: string, who: Principal, sealReasoning = false): Promise<Record<string, unknown>> {
    const run = this.running.get(id);
    const resource = run && run.orgId === who.orgId ? run.resource() : await this.current(await this.record(id, who));
    return sealReasoning ? this.withSealedReasoning(resource, who.orgId) : resource;
  }

  private withSealedReasoning(resource: Record<string, unknown>, orgId: string): Record<string, unknown> {
    const output = resource['output'];
    if (!Array.isArray(output)) return resource;
    return {
      ...resource,
      output: output.map((item: unknown) => {
        const r = item as Partial<ReasoningItem> | null;
        if (r?.type !== 'reasoning' || r.encrypted_content !== undefined || !r.content?.length) return item;
        return { ...r, encrypted_content: this.seal.seal(r.content.map((c) => c.text).join(''), orgId) };
      }),
    };
  }

  /** A stored response as it is now: the run's state while it runs, here or elsewhere; else what was stored. */
  private async current(r: Pick<ListedResponse, 'id' | 'body'>): Promise<Record<string, unknown>> {
    const run = this.running.get(r.id);
    if (run) return run.resource();
    const stored = this.format.read(r.body);
    if (TERMINAL.includes(stored.status)) return stored.resource;
    // Running elsewhere: its owner has the current state (the stored one is from its start).
    return (await this.askOwner(r.id)) ?? stored.resource;
  }

  /**
   * The organization's stored responses in creation order (`asc`) or the reverse, each the object
   * `get` serves. `after` must be one of them (another organization's id is treated like one that does not exist).
   */
  async list(who: Principal, page: PageRequest): Promise<Page<{ id: string } & Record<string, unknown>>> {
    let after: ListedResponse | undefined;
    if (page.after !== undefined) {
      after = await this.store.getResponse(page.after);
      if (!after || after.org_id !== who.orgId)
        throw new ApiError('invalid_value', `No stored response '${page.after}' to list after.`, { param: 'after' });
    }
    const found = await this.store.listResponses(who.orgId, { after, limit: page.limit, order: page.order, maxBytes: PAGE_BYTES });
    // The format serves every response object with its id.
    const data = (await Promise.all(found.records.map((r) => this.current(r)))) as Array<{ id: string } & Record<string, unknown>>;
    return { data, hasMore: found.hasMore };
  }

  /** The live run (to follow), here or in another process, or the stored response re-rendered as events. */
  async replay(id: string, who: Principal): Promise<EventLog> {
    const run = this.running.get(id);
    if (run && run.orgId === who.orgId) return run;
    const { events, finished } = this.format.replay((await this.record(id, who)).body);
    if (finished) return EventLog.of(events, finished);
    return this.followElsewhere(id);
  }

  async inputItems(id: string, who: Principal): Promise<Item[]> {
    return this.inputOf((await this.record(id, who)).id);
  }

  /** A stored response's own input items (kept apart from its row). */
  private async inputOf(id: string): Promise<Item[]> {
    return JSON.parse((await this.store.getResponseInput(id)) ?? '[]') as Item[];
  }

  async delete(id: string, who: Principal): Promise<void> {
    const rec = await this.record(id, who);
    const run = this.running.get(id);
    if (run) {
      run.abort.abort();
      await run.done;
    } else if (!TERMINAL.includes(this.format.read(rec.body).status) && !(await this.stopElsewhere(id, rec))) {
      // Abandoned: billed for what its last heartbeat saw before its row goes (as a cancel is).
      await billAbandoned(this.store, id, await this.store.pendingUsage(id));
    }
    // Deleted meanwhile by another request (concurrent deletes all waited for the same run): one
    // delete succeeds, the others find nothing, as a delete after it would.
    if (!(await this.store.deleteResponse(id))) throw new ApiError('not_found', `No response with id '${id}'.`, { param: 'response_id' });
  }

  /**
   * Asks the process running a response to stop, and waits until it has stored what it made;
   * false when no owner answered (none is alive, judging by the heartbeat, or it did not answer).
   */
  private async stopElsewhere(id: string, rec: ListedResponse): Promise<boolean> {
    if (rec.updated_at < Date.now() - this.opts.staleAfterMs) return false;
    const ended = this.waitEnded(id, CANCEL_WAIT_MS);
    this.bus.publish({ t: 'response.cancel', id });
    return ended;
  }

  async cancel(id: string, who: Principal): Promise<Record<string, unknown>> {
    const rec = await this.record(id, who);
    if (!rec.background) throw new ApiError('invalid_request', 'Only background responses can be cancelled.', { param: 'response_id' });
    const run = this.running.get(id);
    if (run) {
      run.abort.abort();
      await run.done;
      return run.resource();
    }
    const stored = this.format.read(rec.body);
    if (stored.status === 'cancelled') return stored.resource;
    if (TERMINAL.includes(stored.status)) {
      throw new ApiError('invalid_request', `A response that is ${stored.status} cannot be cancelled.`, { param: 'response_id' });
    }
    // Running in another process: it stops, stores the response (cancelled, with what it made) and says so.
    if (await this.stopElsewhere(id, rec)) return this.format.read((await this.record(id, who)).body).resource;
    // No owner answered (abandoned): record the cancellation, billed for what its last heartbeat
    // saw (a client could otherwise cancel a dead process's work out of its bill); an owner that is
    // only slow stops at its next heartbeat, and its own record replaces that one.
    const billed = await billAbandoned(this.store, id, await this.store.pendingUsage(id));
    const body = this.format.end(rec.body, 'cancelled', undefined, billed);
    if (!(await this.store.updateResponse(id, ['queued', 'in_progress'], { status: 'cancelled', body, updated_at: Date.now() }))) {
      return this.format.read((await this.record(id, who)).body).resource;
    }
    return this.format.read(body).resource;
  }

  // ---- creating

  private async conversationFor(id: string | null, who: Principal): Promise<ConversationRecord | undefined> {
    if (id === null) return undefined;
    const conv = await this.store.getConversation(id);
    if (!conv || conv.org_id !== who.orgId) throw new ApiError('not_found', `No conversation with id '${id}'.`, { param: 'conversation' });
    return conv;
  }

  /**
   * Everything before this response's input: the previous-response chain, or the conversation, read
   * newest first within `historyMaxBytes` of stored JSON. Past it, `truncation: "auto"` leaves the
   * oldest turns out (the model could not read that much anyway; `fit` cuts further to the context),
   * and otherwise the request is a 400: reading and parsing an unbounded history held the event
   * loop for every turn (a 150 MB conversation, 1.5 s). `complete` is false when turns were left out.
   */
  private async history(
    body: ContextRequest,
    who: Principal,
    conv: ConversationRecord | undefined,
    local: ConnectionResponses | undefined,
  ): Promise<{ items: Item[]; complete: boolean }> {
    const budget = this.opts.historyMaxBytes;
    const auto = body.truncation === 'auto';
    const tooLong = (what: string, param: string): ApiError =>
      new ApiError(
        'context_length_exceeded',
        `${what} holds more than ${budget} bytes of items, more than one request reads (SWITCHYARD_HISTORY_MAX_BYTES). ` +
          'Set truncation to "auto" to leave its oldest turns out.',
        { param },
      );
    if (conv) {
      const recent = await this.store.recentConversationItems(conv.id, budget, auto);
      if (!recent.complete && !auto) throw tooLong(`The conversation '${conv.id}'`, 'conversation');
      const items = await parseItems(recent.items);
      if (recent.complete) return { items, complete: true };
      // Cut short: its newest turns, after the system and developer messages it opened with (an
      // opening developer prompt was lost; "auto" drops the middle of a conversation, not its
      // instructions). Those are read within an eighth of the budget, from its first few items.
      const kept = fromTurn(items);
      const opening = openingInstructions(
        await parseItems(await this.store.openingConversationItems(conv.id, OPENING_ITEMS, Math.floor(budget / 8))),
      );
      const ids = new Set(kept.map((i) => i.id));
      return { items: [...opening.filter((i) => !ids.has(i.id)), ...kept], complete: false };
    }
    const previousResponseId = body.previousResponseId;
    const kept = previousResponseId === null ? undefined : local?.get(previousResponseId);
    if (kept) return { items: [...kept.items], complete: true };
    const chain: Item[][] = [];
    let bytes = 0;
    for (let id = previousResponseId, n = 0; id !== null && n < MAX_CHAIN; n++) {
      const r = await this.store.getResponse(id);
      if (!r || r.org_id !== who.orgId) {
        // Past the first link: a response the chain goes through was deleted, and with it the context
        // the model would read (docs/decisions.md, "Deleting a response").
        const message =
          n === 0
            ? `Previous response with id '${id}' not found.`
            : `Previous response with id '${previousResponseId}' cannot be continued: response '${id}', earlier in its chain, was deleted.`;
        throw new ApiError('previous_response_not_found', message, { param: 'previous_response_id' });
      }
      // Its output is not all there yet: continuing from it would continue from part of it.
      if (n === 0 && (r.status === 'queued' || r.status === 'in_progress')) {
        throw new ApiError('invalid_value', `Previous response with id '${id}' is still in progress.`, { param: 'previous_response_id' });
      }
      const input = (await this.store.getResponseInput(r.id)) ?? '[]';
      // Measured before anything is parsed; a link is a turn, so the cut falls between turns.
      bytes += Buffer.byteLength(input) + Buffer.byteLength(r.body);
      if (bytes > budget) {
        if (!auto) throw tooLong(`The chain of previous responses from '${previousResponseId}'`, 'previous_response_id');
        // Cut between responses, which may still part a response's calls from the next one's outputs.
        return { items: fromTurn(chain.flat()), complete: false };
      }
      // A link is parsed whole (it was one request's input and one answer); the event loop runs
      // between links.
      if (n > 0) await nextTurn();
      chain.unshift([...(JSON.parse(input) as Item[]), ...this.format.read(r.body).output]);
      id = r.previous_response_id;
    }
    return { items: chain.flat(), complete: true };
  }

  /**
   * Opens what was sealed for this organization; content sealed elsewhere or altered is a 400 naming
   * the input item's field where the item is in this request's `input` (else `input`: it came from
   * a stored response or a conversation).
   */
  private sealedText(who: Principal, input: readonly Item[] = [], sent: readonly InputItem[] = []): SealedText {
    const open = (sealed: string, purpose: SealPurpose, what: string, id: string): string => {
      const text = this.seal.unseal(sealed, who.orgId, purpose);
      if (text === undefined) {
        const i = input.findIndex((it) => it.id === id);
        throw new ApiError('invalid_value', `The encrypted_content of ${what} could not be verified.`, {
          param: i < 0 ? 'input' : inputField(sent, i, 'encrypted_content'),
        });
      }
      return text;
    };
    return {
      reasoning: (r) =>
        r.encrypted_content !== undefined
          ? open(r.encrypted_content, 'reasoning', `reasoning item '${r.id}'`, r.id)
          : (r.content ?? []).map((c) => c.text).join('') || r.summary.map((s) => s.text).join(''),
      compaction: (c) => open(c.encrypted_content, 'compaction', `compaction item '${c.id}'`, c.id),
    };
  }

  /**
   * What a request generates from, in the pipeline's order: the model first, then the context
   * (previous response or conversation, then item references), which create and count share.
   */
  private async context(body: ContextRequest, who: Principal, local?: ConnectionResponses) {
    const model = this.pipeline.resolve(body.model, who);
    if (body.previousResponseId && body.conversationId) {
      throw new ApiError('invalid_request', 'Send previous_response_id or conversation, not both.', { param: 'conversation' });
    }
    const conv = await this.conversationFor(body.conversationId, who);
    const { items: history, complete } = await this.history(body, who, conv, local);
    const inHistory = new Map(history.map((i) => [i.id, i]));
    const known = new Map(inHistory);
    // Other references may name any item the organization stored, in a response or a conversation.
    const elsewhere = body.input.flatMap((i) => (i.type === 'item_reference' && !known.has(i.id) ? [i.id] : []));
    if (elsewhere.length) {
      // Stored items named by reference are read whole, copied into this response's input (and its
      // conversation), and sent to the model: within the history's budget, apart from the history,
      // their sizes read first (a hostile pass's 732-byte request named 96 MB of items).
      // The conversation's own items first: an older one left out of what was read (truncation
      // "auto") is the one its id names here, not another conversation's item with the same id.
      const found = await this.store.findItems(who.orgId, elsewhere, this.opts.historyMaxBytes, conv?.id);
      if (!found)
        throw new ApiError(
          'context_length_exceeded',
          `The items input refers to hold more than ${this.opts.historyMaxBytes} bytes, more than one request reads (SWITCHYARD_HISTORY_MAX_BYTES).`,
          { param: 'input' },
        );
      for (const [itemId, json] of found) known.set(itemId, JSON.parse(json) as Item);
    }
    const input = resolveInput(body.input, (itemId) => known.get(itemId));
    checkUniqueInputIds(input);
    // An image for a model without vision, named where the request has it (the pipeline's own check
    // finds one in the history too, but can name no more than `input` there).
    const image = model.capabilities.includes('vision') ? undefined : firstImage(input, body.input);
    if (image !== undefined)
      throw new ApiError('unsupported_content', `The model '${model.id}' does not accept images (it lacks the vision capability).`, {
        param: image,
      });
    checkOutputsAnswerCalls(history, input, (i) => inputField(body.input, i, 'call_id'));
    // What this response adds to its conversation: its input, less items referenced from the
    // conversation itself (already there; items referenced from elsewhere are added); anything else
    // reusing an id there is a 400.
    let added = conv ? input.filter((i) => inHistory.get(i.id) !== i) : input;
    const there = new Set(inHistory.keys());
    if (conv && !complete && added.length > 0) {
      // Turns left out of what was read are the conversation's still: an item referenced from them
      // is there already, and a new item may not reuse one of their ids.
      const older = await this.store.conversationItemsIn(
        conv.id,
        added.map((i) => i.id),
      );
      for (const id of older) there.add(id);
      // A referenced item is the stored one itself (`known`); an item the request brings is new.
      added = added.filter((i) => !(there.has(i.id) && known.get(i.id) === i));
    }
    if (conv) checkNewItemIds(added, there, () => 'input');
    /** The items this request brings, to be findable later (not those it refers to). */
    const own = input.filter((i) => known.get(i.id) !== i);
    const messages = itemsToMessages([...history, ...input], body.instructions, this.sealedText(who, input, body.input));
    return { model, conv, history, input, added, own, messages };
  }

  /**
   * `truncation: "auto"`: when the whole context leaves no room to answer, the oldest turns are left
   * out of what it reads (the stored input keeps them), cut before a user message so that a function
   * call is never separated from its output; system and developer messages and the instructions
   * stay. The earliest cut that fits (keeping the most turns) is found by halving, each step one
   * count of the prompt (exact on the local engine, estimated for an upstream), leaving room for
   * `max_output_tokens` or, without it, a quarter of the context (at most 1,024 tokens) to answer
   * in. When not even the last turn fits, the context is left whole and the engine's
   * context_length_exceeded stands.
   */
  private async fit(model: Model, body: ResponsesCreate<Echo>, who: Principal, items: Item[], messages: Message[]): Promise<Message[]> {
    const ctx = model.context_length;
    if (ctx === undefined || ctx === null) return messages;
    const count = async (m: Message[]) =>
      (
        await this.pipeline.countInputTokens(
          model,
          generationRequest(body.generation, {
            model: model.id,
            messages: m,
            stream: false,
            signal: new Cancellation(),
            tally: newTally(),
          }),
        )
      ).tokens;
    const out = body.generation.maxOutputTokens;
    const room = ctx - (out ?? Math.min(1024, Math.floor(ctx / 4)));
    if ((await count(messages)) <= room) return messages;
    const cuts = items.flatMap((it, i) => (i > 0 && it.type === 'message' && it.role === 'user' ? [i] : []));
    const sealed = this.sealedText(who);
    const from = (cut: number) =>
      itemsToMessages(
        [
          ...items.slice(0, cut).filter((i) => i.type === 'message' && (i.role === 'system' || i.role === 'developer')),
          ...items.slice(cut),
        ],
        body.instructions,
        sealed,
      );
    let best: Message[] | undefined;
    for (let lo = 0, hi = cuts.length - 1; lo <= hi;) {
      const mid = (lo + hi) >> 1;
      const m = from(cuts[mid]!);
      if ((await count(m)) <= room) {
        best = m;
        hi = mid - 1;
      } else lo = mid + 1;
    }
    return best ?? messages;
  }

  /**
   * `POST /v1/responses/compact`: the context (previous response chain and input) condensed into the
   * user's messages, kept verbatim, and one compaction item: a summary the model writes of everything
   * (sealed, so only this service can read it back). A real generation, admitted, metered and billed
   * like any other; nothing is stored. A later request sends the output back as its input.
   */
  async compact(
    body: ContextRequest,
    who: Principal,
    request: { id: string; started: number },
  ): Promise<{ compaction: Compaction; model: Model; headers: Record<string, string> }> {
    // A compaction reads what fits of a long history (truncation auto): condensing it is the way on
    // for a chain or conversation past the history budget, and the request has no truncation field.
    const { model, history, input, messages } = await this.context({ ...body, truncation: 'auto' }, who);
    const kept = [...history, ...input].filter((i): i is MessageItem => i.type === 'message' && i.role === 'user');
    const abort = new Cancellation();
    const req: GenerationRequest = {
      sampling: { temperature: 0 },
      // A quarter of the context at most, so that the summary fits beside what it summarises.
      maxOutputTokens: Math.max(1, Math.min(COMPACTION_MAX_TOKENS, Math.floor((model.context_length ?? 4 * COMPACTION_MAX_TOKENS) / 4))),
      model: model.id,
      messages: [...messages, { role: 'user', content: COMPACTION_PROMPT }],
      stream: false,
      signal: abort,
      tally: newTally(),
    };
    const { admission, open } = await this.pipeline.admit(model, req, who, {
      endpoint: 'responses.compact',
      requestId: request.id,
      stream: false,
      started: request.started,
    });
    const events = await openAsResponses(open);
    let summary = '';
    let usage: Usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
    try {
      for (let ev = await events.next(); ev; ev = await events.next()) {
        if (ev.type === 'text.delta') summary += ev.text;
        else if (ev.type === 'usage') usage = ev.usage;
      }
      await events.persisted();
    } finally {
      await events.close();
    }
    const item: CompactionItem = {
      id: newId('cmp'),
      type: 'compaction',
      encrypted_content: this.seal.seal(summary.trim(), who.orgId, 'compaction'),
    };
    return {
      compaction: {
        id: newId('resp'),
        createdAt: nowSeconds(),
        output: [...kept.map((m) => ({ ...m, status: 'completed' })), item],
        usage,
      },
      model,
      headers: admission.headers,
    };
  }

  /**
   * `POST /v1/responses/input_tokens`: the tokens the request's input would take, without
   * generating, storing or billing anything; the same checks as a real request.
   */
  async countInputTokens(body: ResponsesCreate<Echo>, who: Principal): Promise<InputTokenCount> {
    const { model, messages } = await this.context(body, who);
    const req = generationRequest(body.generation, {
      model: model.id,
      messages,
      stream: false,
      signal: new Cancellation(),
      tally: newTally(),
    });
    return this.pipeline.countFor(model, req, who);
  }

  /**
   * Creates a response. Returns the run (to follow or await), a promise of its first events, the
   * model it runs on, and the rate-limit headers of its admission. Problems found before generation
   * starts are thrown as errors and nothing is stored.
   */
  async create(
    body: ResponsesCreate<Echo>,
    who: Principal,
    request: { id: string; started: number },
    local?: ConnectionResponses,
  ): Promise<{ run: Run; firstEvents: Promise<void>; model: Model; headers: Record<string, string> }> {
    const { store, background } = body;
    if (background && !store)
      throw new ApiError('invalid_request', 'Background responses must be stored (store: true).', { param: 'background' });
    const { model, conv, history, input, added, own, messages } = await this.context(body, who, local);
    // Continuing a response only this connection knows (`store: false`): a stored one cannot point
    // at it, so it keeps the context it continues as its input.
    const prev = body.previousResponseId === null ? undefined : local?.get(body.previousResponseId);
    const detached = prev !== undefined && !prev.stored;

    const fold: ResponseFold = this.format.open({
      id: newId('resp'),
      createdAt: nowSeconds(),
      model: model.id,
      background,
      store,
      previousResponseId: body.previousResponseId,
      conversationId: conv?.id ?? null,
      echo: body.echo,
      summary: body.summary,
      seal: body.includeSealedReasoning ? (text: string) => this.seal.seal(text, who.orgId) : undefined,
    });
    const id = String(fold.resource['id']);
    const run = new Run(fold, who.orgId, background, (ev) => this.format.isTerminal(ev));
    // A foreground response asked for whole is generated whole: a chat upstream sends one answer
    // to parse where its stream is an event per token (about a seventh of a stored response's
    // instructions, bench/README.md), and the local engine holds structured output until it passes,
    // as it does for chat. A background one streams, so that it reads as in progress from its first
    // output and a follower sees it come.
    const whole = !body.stream && !background;
    const req = generationRequest(body.generation, {
      model: model.id,
      messages,
      stream: !whole,
      signal: run.abort,
      tally: newTally(),
    });
    if (background) req.background = true;

    const { admission, open } = await this.pipeline.admit(model, req, who, {
      endpoint: 'responses',
      requestId: request.id,
      stream: body.stream,
      started: request.started,
    });
    // Shortened only once admitted (the key may use the model, and has room), since fitting loads
    // the model and counts the prompt; the reservation made for the whole context settles to the real use.
    if (body.truncation === 'auto') {
      try {
        req.messages = await this.fit(model, body, who, [...history, ...input], messages);
      } catch (err) {
        admission.settle(0, 0);
        throw err;
      }
    }
    /** Stores the response as it is now; false when it is not stored or its row was changed elsewhere (cancelled, deleted). */
    const persist = async (from: readonly ResponseStatus[], json?: string): Promise<boolean> => {
      if (!store) return false;
      return this.store.updateResponse(id, from, {
        status: fold.status,
        body: json ?? this.format.serialize(fold),
        updated_at: Date.now(),
      });
    };

    let events: MeteredStream | undefined;
    if (!background) {
      // Errors before the first token (context overflow, overload…) are the request's HTTP error.
      events = await openAsResponses(open);
      // Only a stored response can be found abandoned and billed from its heartbeat's snapshot.
      if (store) run.meter = events;
    }
    if (store) {
      try {
        await this.store.createResponse({
          id,
          org_id: who.orgId,
          status: fold.status,
          background,
          conversation_id: conv?.id ?? null,
          previous_response_id: detached ? null : body.previousResponseId,
          created_at: nowSeconds(),
          created_ms: orderMs(),
          updated_at: Date.now(),
          body: this.format.serialize(fold),
          input_items: JSON.stringify(detached ? [...history, ...input] : input),
        });
      } catch (err) {
        // Nothing was generated for anyone: stop, give the reservation back, and answer the error.
        if (events) await events.close();
        else admission.settle(0, 0);
        throw err;
      }
    }
    this.running.set(id, run);
    if (background) run.emit(fold.queued());

    let startedResolve!: () => void;
    const firstEvents = new Promise<void>((r) => {
      startedResolve = r;
    });
    run.holdTerminal();
    // A response stopped before its usage event still reports (and the ledger bills) what it used.
    let billed = false;
    const counted = () => {
      if (billed) return;
      billed = true;
      // With its cost, as a finished response's usage has it (the figure the ledger bills).
      const usage = tallyUsage(req.tally);
      run.emit(fold.apply({ type: 'usage', usage: { ...usage, cost: costOf(model, usage) } }));
    };
    run.done = (async () => {
      try {
        if (background) {
          // Answered at once, as `queued`; `in_progress` once the engine's first event comes (the
          // local engine: a free sequence and the prompt read; an upstream: its first output), so a
          // response waiting for room reads as waiting.
          startedResolve();
          events = await openAsResponses(open);
          if (store) run.meter = events;
        }
        run.emit(fold.start());
        // A background response was stored as queued; any other was stored in_progress already,
        // as it is now (one write fewer per request: a stored response's writes were most of its cost).
        if (background) await persist(['queued', 'in_progress']);
        startedResolve();
        events ??= await openAsResponses(open);
        for (let ev = await events.next(); ev; ev = await events.next()) {
          if (ev.type === 'usage') billed = true;
          run.emit(fold.apply(ev));
          if (run.abort.aborted) break;
        }
        if (run.abort.aborted && !TERMINAL.includes(fold.status)) {
          counted();
          run.emit(this.stopped(fold));
        }
      } catch (err) {
        counted();
        if (run.abort.aborted) run.emit(this.stopped(fold));
        else {
          const e = err instanceof ApiError ? err : new ApiError('internal_error', 'Generation failed.');
          if (!(err instanceof ApiError)) this.log.error({ err, response_id: id }, 'response generation failed');
          run.emit(fold.fail(e.code === 'internal_error' ? 'server_error' : e.code, e.message));
        }
      } finally {
        startedResolve();
        await events?.close();
        // Each write on its own, so one that fails does not lose the others.
        const attempt = async (what: string, write: () => Promise<unknown>) => {
          try {
            await write();
          } catch (err) {
            this.log.error({ err, response_id: id }, `storing the response failed: ${what}`);
          }
        };
        let kept = false;
        await attempt('usage', async () => events?.persisted());
        // The response as it ends, serialized once where the row stores it and a whole answer's
        // client is sent it (the same text JSON.stringify would make of settled(); serializing
        // twice was about a fortieth of a stored response's instructions). Not at all otherwise.
        const settledJson = whole ? this.format.serialize(fold) : undefined;
        run.settledJson = settledJson;
        await attempt('response', async () => {
          kept = await persist(['queued', 'in_progress'], settledJson);
          // Cancelled through another instance that heard nothing from this one (a bus message
          // lost): it stored the cancellation with nothing in it, and this run stopped at its next
          // heartbeat (or ended first). The row takes what the run made and was billed for, still
          // cancelled, as a cancel heard here would have stored it.
          if (!kept && store && background && fold.status !== 'failed') {
            const body = this.format.end(settledJson ?? this.format.serialize(fold), 'cancelled');
            await this.store.updateResponse(id, ['cancelled'], { status: 'cancelled', body, updated_at: Date.now() });
          }
        });
        // Only while the response is still this run's: one deleted or cancelled elsewhere keeps no items.
        if (kept) {
          await attempt('items', () => this.store.saveResponseItems(who.orgId, id, [...own, ...fold.output], nowSeconds()));
        }
        if (conv && (fold.status === 'completed' || fold.status === 'incomplete')) {
          // One contiguous block per response, appended when it ends: concurrent responses on one
          // conversation never interleave, and each saw the conversation as it was when it started.
          await attempt('conversation', async () => {
            const appended = await this.store.appendConversationItems(
              conv.id,
              [...added, ...fold.output].map((i) => ({ id: i.id, json: JSON.stringify(i) })),
              nowSeconds(),
            );
            // Deleted while this response ran: the response is kept (it names the conversation, as
            // OpenAI's do), the turn goes nowhere.
            if (!appended)
              this.log.info({ response_id: id, conversation_id: conv.id }, 'conversation deleted meanwhile; turn not appended');
          });
        }
        if (local && (fold.status === 'completed' || fold.status === 'incomplete'))
          local.remember(id, [...history, ...input, ...fold.output], kept);
        run.release();
        this.running.delete(id);
        run.finish();
        this.bus.publish({ t: 'response.ended', id });
      }
    })();
    return { run, firstEvents, model, headers: admission.headers };
  }
}
