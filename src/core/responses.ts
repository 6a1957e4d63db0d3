import type { Logger } from 'pino';
import { ApiError } from '../http/errors.js';
import type { Principal } from '../http/auth.js';
import type { ConversationRecord, ResponseRecord, Store } from '../store/store.js';
import type { FunctionTool, GenerationRequest, ResponseFormat, ToolChoice } from './canonical.js';
import { itemsToMessages, newId, normaliseInput, type Item, type ReasoningItem } from './items.js';
import type { ReasoningSeal } from './reasoning-seal.js';
import { ResponseBuilder, TERMINAL, eventsOf, type ResponseObject, type ResponseStatus, type WireEvent } from './response-builder.js';
import type { Router } from './router.js';
import type { Model } from './model-spec.js';
import type { Ledger } from './ledger.js';
import type { Metrics } from './metrics.js';
import { MeteredStream } from './metering.js';

/** A validated `POST /v1/responses` body (see api/responses.ts for the schema). */
export interface ResponsesRequest {
  model: string;
  input: string | Array<Record<string, unknown>>;
  instructions?: string | null | undefined;
  max_output_tokens?: number | null | undefined;
  temperature?: number | null | undefined;
  top_p?: number | null | undefined;
  tools?: Array<{ type: 'function'; name: string; description?: string | null | undefined; parameters?: Record<string, unknown> | null | undefined; strict?: boolean | null | undefined }> | null | undefined;
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; name: string } | null | undefined;
  parallel_tool_calls?: boolean | null | undefined;
  stream?: boolean | null | undefined;
  text?: { format?: Record<string, unknown> | undefined } | null | undefined;
  reasoning?: { effort?: string | null | undefined; summary?: string | null | undefined } | null | undefined;
  store?: boolean | null | undefined;
  previous_response_id?: string | null | undefined;
  conversation?: string | { id: string } | null | undefined;
  background?: boolean | null | undefined;
  include?: string[] | null | undefined;
  metadata?: Record<string, string> | null | undefined;
  user?: string | null | undefined;
  truncation?: string | null | undefined;
}

/** A response being generated on this instance: its events so far and who is listening. */
export class Run {
  readonly events: Array<WireEvent & { sequence_number: number }> = [];
  readonly listeners = new Set<() => void>();
  readonly abort = new AbortController();
  finished = false;
  done: Promise<void> = Promise.resolve();

  constructor(readonly builder: ResponseBuilder, readonly orgId: string) {}

  private held: WireEvent[] | undefined;

  /** From now on terminal events wait until `release()`: the response and its usage are stored first. */
  holdTerminal(): void {
    this.held = [];
  }

  release(): void {
    const held = this.held;
    this.held = undefined;
    if (held?.length) this.emit(held);
  }

  emit(events: WireEvent[]): void {
    for (const e of events) {
      if (this.held && TERMINAL_EVENTS.has(e.type)) this.held.push(e);
      else this.events.push({ ...e, sequence_number: this.events.length });
    }
    for (const l of this.listeners) l();
  }
}

const TERMINAL_EVENTS = new Set(['response.completed', 'response.incomplete', 'response.failed']);

const HEARTBEAT_MS = 10_000;
const MAX_CHAIN = 1000;

const nowS = (): number => Math.floor(Date.now() / 1000);

export interface ResponseServiceOptions {
  /** A running response whose owner has not refreshed it for this long is taken as abandoned. */
  staleAfterMs: number;
  /** The embedded SQLite database has one instance: whatever was running at start was this process's. */
  singleInstance: boolean;
}

/** Responses still queued or running that nobody refreshed since `before` become failed. */
export async function failAbandonedResponses(store: Store, before: number, log: Logger, isRunningHere: (id: string) => boolean = () => false): Promise<void> {
  for (const r of await store.staleResponses(['queued', 'in_progress'], before)) {
    if (isRunningHere(r.id)) continue;
    const body = JSON.parse(r.body) as ResponseObject;
    body.status = 'failed';
    body.error = { code: 'server_error', message: 'The server running this response stopped before it finished.' };
    if (await store.updateResponse(r.id, ['queued', 'in_progress'], { status: 'failed', body: JSON.stringify(body), updated_at: Date.now() })) {
      log.warn({ response_id: r.id }, 'marked an abandoned response as failed');
    }
  }
}

/**
 * The Responses lifecycle: building the context (previous response chain, conversation, input),
 * running generation inline or in the background, storing the result, conversations, cancel, and
 * cleaning up after instances that died mid-response.
 *
 * Transitions (anything else is refused):
 *   queued → in_progress → completed | incomplete | failed | cancelled
 *   queued → cancelled | failed
 */
export class ResponseService {
  private readonly running = new Map<string, Run>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: Store,
    private readonly router: Router,
    private readonly seal: ReasoningSeal,
    private readonly log: Logger,
    private readonly meter: { ledger: Ledger; metrics: Metrics },
    private readonly opts: ResponseServiceOptions,
  ) {}

  async start(): Promise<void> {
    await this.sweep(this.opts.singleInstance ? Date.now() + 1 : Date.now() - this.opts.staleAfterMs);
    this.timer = setInterval(() => {
      const ids = [...this.running.keys()];
      this.store.touchResponses(ids, Date.now())
        .then(() => this.stopCancelledElsewhere(ids))
        .then(() => this.sweep(Date.now() - this.opts.staleAfterMs))
        .catch((err: unknown) => this.log.warn({ err }, 'response heartbeat failed'));
    }, Math.min(HEARTBEAT_MS, Math.max(1000, this.opts.staleAfterMs / 3)));
    this.timer.unref();
  }

  /**
   * Shutdown: background runs are cancelled (and stored so); foreground ones, which a client is
   * waiting for, are left to finish like any in-flight request.
   */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    const runs = [...this.running.values()];
    for (const r of runs) if (r.builder.response.background) r.abort.abort();
    await Promise.allSettled(runs.map((r) => r.done));
  }

  /** A background run cancelled through another instance is stopped here at the next heartbeat. */
  private async stopCancelledElsewhere(ids: readonly string[]): Promise<void> {
    for (const id of ids) {
      const run = this.running.get(id);
      if (!run?.builder.response.background || run.abort.signal.aborted) continue;
      if ((await this.store.getResponse(id))?.status === 'cancelled') run.abort.abort();
    }
  }

  private sweep(before: number): Promise<void> {
    return failAbandonedResponses(this.store, before, this.log, (id) => this.running.has(id));
  }

  // ---- reading

  private async record(id: string, who: Principal): Promise<ResponseRecord> {
    const r = await this.store.getResponse(id);
    if (!r || r.org_id !== who.orgId) throw new ApiError('not_found', `No response with id '${id}'.`, { param: 'response_id' });
    return r;
  }

  async get(id: string, who: Principal): Promise<ResponseObject> {
    const run = this.running.get(id);
    if (run && run.orgId === who.orgId) return structuredClone(run.builder.response);
    return JSON.parse((await this.record(id, who)).body) as ResponseObject;
  }

  /** The live run (to follow), or the stored response re-rendered as events. */
  async replay(id: string, who: Principal): Promise<Run> {
    const run = this.running.get(id);
    if (run && run.orgId === who.orgId) return run;
    const stored = JSON.parse((await this.record(id, who)).body) as ResponseObject;
    const ids = stored.output.map((o) => o.id);
    const sealed = stored.output.filter((o): o is ReasoningItem => o.type === 'reasoning').map((o) => o.encrypted_content);
    let sealIndex = 0;
    const base: ResponseObject = { ...structuredClone(stored), status: 'in_progress', output: [], usage: null, completed_at: null, error: null, incomplete_details: null };
    const builder = new ResponseBuilder(base, {
      summary: stored.reasoning.summary,
      idFor: (_kind, i) => ids[i] ?? newId('item'),
      ...(sealed.some(Boolean) && { seal: () => sealed[sealIndex++] ?? '' }),
    });
    const replayed = new Run(builder, stored.id);
    replayed.emit(builder.start());
    for (const ev of eventsOf(stored)) replayed.emit(builder.apply(ev));
    if (stored.status === 'failed') replayed.emit(builder.fail(stored.error?.code ?? 'server_error', stored.error?.message ?? ''));
    else if (stored.status === 'cancelled') replayed.emit(builder.cancel());
    else if (stored.status === 'incomplete') replayed.emit(builder.apply({ type: 'finish', reason: stored.incomplete_details?.reason === 'content_filter' ? 'content_filter' : 'length' }));
    else if (stored.status === 'completed') replayed.emit(builder.apply({ type: 'finish', reason: 'stop' }));
    replayed.finished = TERMINAL.includes(stored.status);
    return replayed;
  }

  async inputItems(id: string, who: Principal): Promise<Item[]> {
    return JSON.parse((await this.record(id, who)).input_items) as Item[];
  }

  async delete(id: string, who: Principal): Promise<void> {
    await this.record(id, who);
    const run = this.running.get(id);
    if (run) {
      run.abort.abort();
      await run.done;
    }
    await this.store.deleteResponse(id);
  }

  async cancel(id: string, who: Principal): Promise<ResponseObject> {
    const rec = await this.record(id, who);
    if (!rec.background) throw new ApiError('invalid_request', 'Only background responses can be cancelled.', { param: 'response_id' });
    const run = this.running.get(id);
    if (run) {
      run.abort.abort();
      await run.done;
      return structuredClone(run.builder.response);
    }
    const body = JSON.parse(rec.body) as ResponseObject;
    if (body.status === 'cancelled') return body;
    if (TERMINAL.includes(body.status)) {
      throw new ApiError('invalid_request', `A response that is ${body.status} cannot be cancelled.`, { param: 'response_id' });
    }
    // Running on another instance (or abandoned): record the cancellation; its owner stops on its next store.
    body.status = 'cancelled';
    if (!(await this.store.updateResponse(id, ['queued', 'in_progress'], { status: 'cancelled', body: JSON.stringify(body), updated_at: Date.now() }))) {
      return JSON.parse((await this.record(id, who)).body) as ResponseObject;
    }
    return body;
  }

  // ---- creating

  private async conversationFor(ref: ResponsesRequest['conversation'], who: Principal): Promise<ConversationRecord | undefined> {
    if (ref === undefined || ref === null) return undefined;
    const id = typeof ref === 'string' ? ref : ref.id;
    const conv = await this.store.getConversation(id);
    if (!conv || conv.org_id !== who.orgId) throw new ApiError('not_found', `No conversation with id '${id}'.`, { param: 'conversation' });
    return conv;
  }

  /** Everything before this response's input: the previous-response chain, or the conversation. */
  private async history(body: ResponsesRequest, who: Principal, conv: ConversationRecord | undefined): Promise<Item[]> {
    if (conv) return (await this.store.allConversationItems(conv.id)).map((j) => JSON.parse(j) as Item);
    const chain: Item[][] = [];
    for (let id = body.previous_response_id ?? null, n = 0; id !== null && n < MAX_CHAIN; n++) {
      const r = await this.store.getResponse(id);
      if (!r || r.org_id !== who.orgId) throw new ApiError('not_found', `No response with id '${id}'.`, { param: 'previous_response_id' });
      const prev = JSON.parse(r.body) as ResponseObject;
      chain.unshift([...(JSON.parse(r.input_items) as Item[]), ...prev.output]);
      id = prev.previous_response_id;
    }
    return chain.flat();
  }

  private reasoningText(who: Principal): (r: ReasoningItem) => string {
    return (r) => {
      if (r.encrypted_content !== undefined) {
        const text = this.seal.unseal(r.encrypted_content, who.orgId);
        if (text === undefined) {
          throw new ApiError('invalid_value', `The encrypted_content of reasoning item '${r.id}' could not be verified.`, { param: 'input' });
        }
        return text;
      }
      return (r.content ?? []).map((c) => c.text).join('') || r.summary.map((s) => s.text).join('');
    };
  }

  /**
   * Creates a response. Returns the run (to stream or await) and whether it was started in the
   * background. Problems found before generation starts are thrown as HTTP errors and nothing is stored.
   */
  /** `model` is the catalogue entry the caller resolved (and admitted through the limits) for `body.model`. */
  async create(
    body: ResponsesRequest, who: Principal, model: Model,
    request: { id: string; started: number; settle?: (tokens: number, cost: number | null) => void },
  ): Promise<{ run: Run; firstEvents: Promise<void> }> {
    if (body.previous_response_id && body.conversation) {
      throw new ApiError('invalid_request', 'Send previous_response_id or conversation, not both.', { param: 'conversation' });
    }
    const store = body.store !== false;
    const background = body.background === true;
    if (background && !store) throw new ApiError('invalid_request', 'Background responses must be stored (store: true).', { param: 'background' });
    const conv = await this.conversationFor(body.conversation, who);
    const history = await this.history(body, who, conv);
    const known = new Map(history.map((i) => [i.id, i]));
    const input = normaliseInput(body.input, (id) => known.get(id));
    const messages = itemsToMessages([...history, ...input], body.instructions, this.reasoningText(who));

    const includeSealed = body.include?.includes('reasoning.encrypted_content') === true;
    const response: ResponseObject = {
      id: newId('resp'),
      object: 'response',
      created_at: nowS(),
      status: background ? 'queued' : 'in_progress',
      completed_at: null,
      background,
      error: null,
      incomplete_details: null,
      instructions: body.instructions ?? null,
      max_output_tokens: body.max_output_tokens ?? null,
      model: model.id,
      output: [],
      parallel_tool_calls: body.parallel_tool_calls ?? true,
      previous_response_id: body.previous_response_id ?? null,
      conversation: conv ? { id: conv.id } : null,
      reasoning: { effort: body.reasoning?.effort ?? null, summary: body.reasoning?.summary ?? null },
      store,
      temperature: body.temperature ?? 1,
      text: { format: body.text?.format ?? { type: 'text' } },
      tool_choice: body.tool_choice ?? 'auto',
      tools: (body.tools ?? []).map((t) => ({ type: 'function', name: t.name, description: t.description ?? null, parameters: t.parameters ?? null, strict: t.strict ?? true })),
      top_p: body.top_p ?? 1,
      truncation: body.truncation ?? 'disabled',
      usage: null,
      user: body.user ?? null,
      metadata: body.metadata ?? {},
    };
    const builder = new ResponseBuilder(response, {
      summary: body.reasoning?.summary ?? null,
      ...(includeSealed && { seal: (text: string) => this.seal.seal(text, who.orgId) }),
    });
    const run = new Run(builder, who.orgId);

    const req: GenerationRequest = { model: model.id, messages, sampling: {}, stream: true, signal: run.abort.signal };
    if (body.temperature != null) req.sampling.temperature = body.temperature;
    if (body.top_p != null) req.sampling.topP = body.top_p;
    if (body.max_output_tokens != null) req.maxOutputTokens = body.max_output_tokens;
    if (body.tools?.length) {
      req.tools = body.tools.map((t): FunctionTool => ({
        name: t.name,
        ...(t.description != null && { description: t.description }),
        ...(t.parameters != null && { parameters: t.parameters }),
        ...(t.strict != null && { strict: t.strict }),
      }));
      if (body.tool_choice != null) req.toolChoice = typeof body.tool_choice === 'string' ? body.tool_choice : { name: body.tool_choice.name } satisfies ToolChoice;
      if (body.parallel_tool_calls != null) req.parallelToolCalls = body.parallel_tool_calls;
    }
    const fmt = body.text?.format;
    if (fmt && fmt['type'] !== 'text') {
      req.responseFormat = fmt['type'] === 'json_schema'
        ? { type: 'json_schema', name: String(fmt['name'] ?? 'output'), schema: (fmt['schema'] ?? {}) as Record<string, unknown>, ...(typeof fmt['strict'] === 'boolean' && { strict: fmt['strict'] }) }
        : { type: 'json_object' } satisfies ResponseFormat;
    }
    if (body.reasoning?.effort != null) req.reasoningEffort = body.reasoning.effort;

    this.router.requireCapabilities(model, req);
    const open = () => MeteredStream.open(this.router, req, {
      model, who, endpoint: 'responses', requestId: request.id, stream: body.stream === true, started: request.started, trace: {},
      ...(request.settle && { settle: request.settle }),
    }, this.meter.ledger, this.meter.metrics);
    const persist = async (status: readonly ResponseStatus[]) => {
      if (!store) return;
      await this.store.updateResponse(response.id, status, { status: response.status, body: JSON.stringify(response), updated_at: Date.now() });
    };

    let events: MeteredStream | undefined;
    if (!background) {
      // Errors before the first token (context overflow, overload…) are the request's HTTP error.
      events = await open();
    }
    if (store) {
      await this.store.createResponse({
        id: response.id, org_id: who.orgId, status: response.status, background,
        conversation_id: conv?.id ?? null, previous_response_id: response.previous_response_id,
        created_at: response.created_at, updated_at: Date.now(), body: JSON.stringify(response), input_items: JSON.stringify(input),
      });
    }
    this.running.set(response.id, run);
    if (background) run.emit([{ type: 'response.queued', response: structuredClone(response) }]);

    let startedResolve!: () => void;
    const firstEvents = new Promise<void>((r) => { startedResolve = r; });
    run.holdTerminal();
    run.done = (async () => {
      try {
        run.emit(builder.start());
        await persist(['queued', 'in_progress']);
        startedResolve();
        events ??= await open();
        for (let ev = await events.next(); ev; ev = await events.next()) {
          run.emit(builder.apply(ev));
          if (run.abort.signal.aborted) break;
        }
        if (run.abort.signal.aborted && !TERMINAL.includes(response.status)) run.emit(builder.cancel());
      } catch (err) {
        if (run.abort.signal.aborted) run.emit(builder.cancel());
        else {
          const e = err instanceof ApiError ? err : new ApiError('internal_error', 'Generation failed.');
          if (!(err instanceof ApiError)) this.log.error({ err, response_id: response.id }, 'response generation failed');
          run.emit(builder.fail(e.code === 'internal_error' ? 'server_error' : e.code, e.message));
        }
      } finally {
        startedResolve();
        await events?.close();
        try {
          await events?.persisted();
          await persist(['queued', 'in_progress']);
          if (conv && (response.status === 'completed' || response.status === 'incomplete')) {
            // One contiguous block per response, appended when it ends: concurrent responses on one
            // conversation never interleave, and each saw the conversation as it was when it started.
            await this.store.appendConversationItems(conv.id, [...input, ...response.output].map((i) => ({ id: i.id, json: JSON.stringify(i) })), nowS());
          }
        } catch (err) {
          this.log.error({ err, response_id: response.id }, 'storing the response failed');
        }
        run.release();
        run.finished = true;
        this.running.delete(response.id);
        for (const l of run.listeners) l();
      }
    })();
    return { run, firstEvents };
  }
}
