import { randomInt } from 'node:crypto';
import {
  getLlama,
  LlamaGrammarEvaluationState,
  LlamaLogLevel,
  type Llama,
  type LlamaGrammar,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import type { Logger } from 'pino';
import { ApiError, CancelledError } from '../../core/errors.js';
import type { FunctionTool, GenerationEvent, GenerationRequest } from '../../core/canonical.js';
import { Channel } from '../../core/channel.js';
import { onAbort, unlessAborted, type CancelSignal } from '../../core/cancellation.js';
import { estimateInputTokens, MAX_CHARS_PER_TOKEN } from '../../core/estimate.js';
import type { DeploymentTarget, Engine } from '../engine.js';
import { inspectGgufIsolated } from './gguf.js';
import { PromptRenderer } from './prompt.js';
import { AutoSink, CallSink, ChoiceSink, JsonSink, TextSink, type Push, type SchemaCheck, type Sink } from './output.js';
import { SchemaGrammars, type CompileBudget, type CompiledSchema } from './schema-grammar.js';
import { ByteTokens } from './grammar-text.js';
import { ClosingBias } from './closing-bias.js';

export interface LocalEngineOptions {
  /** llama.cpp threads per context. More than one on a 2-core box collapsed throughput (see README). */
  threads: number;
  /** Sequences per model context: requests decoded together in one batch. */
  parallel: number;
  /** Requests that may wait for a sequence; past that, 503. */
  queueSize: number;
  memoryBudgetBytes: number;
  gpu: 'auto' | false;
  /** Chat templates configured per file, overriding the GGUF's. */
  templates: ReadonlyMap<string, string>;
  /** Compiled JSON schemas (grammar and validator) kept for reuse. */
  schemaCacheSize: number;
  /** How long compiling one schema may take before the request is refused. */
  schemaCompileTimeoutMs: number;
  log: Logger;
}

interface Slot {
  sequence: LlamaContextSequence;
  busy: boolean;
  /** The cache scope (organization) of the request that left its tokens in the sequence. */
  scope: string | undefined;
}

interface Waiter {
  resolve(slot: Slot): void;
  reject(err: Error): void;
}

/** One loaded model: its context, its sequences and the queue in front of them. */
class LoadedModel {
  readonly slots: Slot[];
  /** Requests a client waits on, in order; bounded by the queue size. */
  readonly waiters: Waiter[] = [];
  /** Background responses, in order: served when no request above waits, and not bounded by the queue size. */
  readonly background: Waiter[] = [];
  lastUsed = Date.now();
  active = 0;
  /** Made at the first structured output (reading the vocabulary takes a while on large models). */
  private closing: Promise<ClosingBias | undefined> | undefined;
  /** Made at the first structured output too (grammar-text.ts). */
  private byteTokenMap: Promise<ByteTokens | undefined> | undefined;

  constructor(
    readonly file: string,
    readonly model: LlamaModel,
    readonly context: LlamaContext,
    readonly renderer: PromptRenderer,
    readonly bytes: number,
  ) {
    this.slots = Array.from({ length: context.totalSequences }, () => ({ sequence: context.getSequence(), busy: false, scope: undefined }));
  }

  closingBias(): Promise<ClosingBias | undefined> {
    this.closing ??= ClosingBias.for(this.model).catch(() => undefined);
    return this.closing;
  }

  byteTokens(): Promise<ByteTokens | undefined> {
    this.byteTokenMap ??= ByteTokens.for(this.model).catch(() => undefined);
    return this.byteTokenMap;
  }

  /**
   * A free sequence, preferring the one whose cached tokens share the longest prefix with the
   * prompt among those the same scope left (another organization's cache is never reused).
   */
  take(prompt: readonly Token[], scope: string | undefined): Slot | undefined {
    let best: Slot | undefined;
    let bestShared = -1;
    for (const s of this.slots) {
      if (s.busy) continue;
      const shared = s.scope === scope ? s.sequence.compareContextTokens(prompt as Token[]).firstDifferentIndex : 0;
      if (shared > bestShared) {
        best = s;
        bestShared = shared;
      }
    }
    if (best) best.busy = true;
    return best;
  }

  release(slot: Slot): void {
    const next = this.waiters.shift() ?? this.background.shift();
    if (next) next.resolve(slot);
    else slot.busy = false;
  }
}

interface OutputPlan {
  grammar?: LlamaGrammar;
  /** The grammar applies only after the model opens a tool call (tool_choice auto). */
  lazy: boolean;
  /** Tools described in the prompt. */
  tools: FunctionTool[];
  /** Outputs sampled at most: more than one where a schema is checked after the grammar. */
  attempts: number;
  /** A sink for one attempt; `last`: no attempt follows it. */
  make(push: Push, last: boolean): Sink;
}

/**
 * Attempts at an output whose schema the grammar does not enforce whole (each within max_tokens;
 * every token of every attempt is billed). Found by measurement on the JSONSchemaBench sample: a
 * failed check is rare, and a second failure rarer still.
 */
const SCHEMA_ATTEMPTS = 4;
/** A retry samples at least this hot: at temperature 0 it would write the same failing output again. */
const RETRY_TEMPERATURE = 0.8;

const EMPTY_PARAMETERS = { type: 'object', properties: {}, additionalProperties: false };

/** A tool's parameters schema; none (or an empty one) means an empty object. */
function parametersOf(t: FunctionTool): Record<string, unknown> {
  return t.parameters && Object.keys(t.parameters).length > 0 ? t.parameters : EMPTY_PARAMETERS;
}

/**
 * `{"name": <one of the tools>, "arguments": <that tool's parameters>}`. Each tool's parameters get
 * an `$id` of their own (unless they name themselves), so that their `#/$defs/…` references still
 * resolve inside them and not against this wrapper.
 */
function callSchema(tools: readonly FunctionTool[]): Record<string, unknown> {
  return {
    oneOf: tools.map((t, i) => ({
      type: 'object',
      properties: { name: { const: t.name }, arguments: { $id: `tool-${i}.json`, ...parametersOf(t) } },
      required: ['name', 'arguments'],
      additionalProperties: false,
    })),
  };
}

/** Characters of prompt text: message contents, tool calls and tool definitions. */
function promptChars(messages: GenerationRequest['messages'], tools: readonly FunctionTool[]): number {
  let n = 0;
  for (const m of messages) {
    if (typeof m.content === 'string') n += m.content.length;
    else if (m.content) for (const p of m.content) if (p.type === 'text') n += p.text.length;
    for (const c of m.toolCalls ?? []) n += c.name.length + c.arguments.length;
  }
  for (const t of tools) n += t.name.length + (t.description?.length ?? 0) + (t.parameters ? JSON.stringify(t.parameters).length : 0);
  return n;
}

/** The few tokens before the ones being decoded, so a tokenizer knows about leading spaces. */
function lastTokens(prompt: readonly Token[], generated: readonly Token[], pending: number): Token[] {
  const end = generated.length - pending;
  return end > 0 ? generated.slice(Math.max(0, end - 4), end) : prompt.slice(-4);
}

export class LocalEngine implements Engine {
  readonly kind = 'local';
  private llama: Promise<Llama> | undefined;
  private readonly loaded = new Map<string, LoadedModel>();
  private readonly loading = new Map<string, Promise<LoadedModel>>();
  private readonly grammars: SchemaGrammars;

  constructor(private readonly opts: LocalEngineOptions) {
    this.grammars = new SchemaGrammars(() => this.getLlama(), {
      cacheSize: opts.schemaCacheSize,
      compileTimeoutMs: opts.schemaCompileTimeoutMs,
      log: opts.log,
    });
  }

  /** Schemas compiled and kept now (bounded by schemaCacheSize). */
  get cachedSchemas(): number {
    return this.grammars.size;
  }

  private getLlama(): Promise<Llama> {
    this.llama ??= getLlama({ gpu: this.opts.gpu, logLevel: LlamaLogLevel.error });
    return this.llama;
  }

  /** Loads the model if needed (validating the file first), unloading idle ones past the budget. */
  async load(file: string): Promise<LoadedModel> {
    const hit = this.loaded.get(file);
    if (hit) return hit;
    let pending = this.loading.get(file);
    if (!pending) {
      pending = this.doLoad(file).finally(() => this.loading.delete(file));
      this.loading.set(file, pending);
    }
    return pending;
  }

  private async doLoad(file: string): Promise<LoadedModel> {
    const { log } = this.opts;
    const info = await inspectGgufIsolated(file);
    const llama = await this.getLlama();
    const started = Date.now();
    let lastLogged = -1;
    log.info({ file, bytes: info.fileSize }, 'loading model');
    const model = await llama.loadModel({
      modelPath: file,
      onLoadProgress: (p: number) => {
        const step = Math.floor(p * 4);
        if (step > lastLogged) {
          lastLogged = step;
          log.info({ file, progress: Math.round(p * 100) }, 'loading model: progress');
        }
      },
    });
    const contextSize = Math.min(info.contextLength, model.trainContextSize);
    const estimate = model.fileInsights.estimateContextResourceRequirements({
      contextSize,
      sequences: this.opts.parallel,
      modelGpuLayers: model.gpuLayers,
    });
    // Whole bytes: the estimate's parts are not always integers.
    const bytes = Math.ceil(model.size + estimate.cpuRam + estimate.gpuVram);
    this.evictFor(bytes);
    const context = await model.createContext({
      contextSize,
      sequences: this.opts.parallel,
      threads: this.opts.threads,
      batching: { dispatchSchedule: (d) => queueMicrotask(d) },
    });
    const template = this.opts.templates.get(file) ?? info.chatTemplate;
    const loaded = new LoadedModel(file, model, context, new PromptRenderer(model, template), bytes);
    this.loaded.set(file, loaded);
    log.info(
      {
        file,
        ms: Date.now() - started,
        context_size: contextSize,
        sequences: this.opts.parallel,
        threads: this.opts.threads,
        chat_template: template ? 'template' : 'plain-text fallback',
        bytes,
      },
      'model loaded',
    );
    return loaded;
  }

  /** Unloads least-recently-used idle models until `incoming` fits the budget. */
  private evictFor(incoming: number): void {
    let used = [...this.loaded.values()].reduce((a, m) => a + m.bytes, 0);
    const idle = [...this.loaded.values()].filter((m) => m.active === 0).sort((a, b) => a.lastUsed - b.lastUsed);
    for (const m of idle) {
      if (used + incoming <= this.opts.memoryBudgetBytes) break;
      this.loaded.delete(m.file);
      used -= m.bytes;
      this.opts.log.info({ file: m.file, freed: m.bytes }, 'unloading least-recently-used model');
      void m.context
        .dispose()
        .then(() => m.model.dispose())
        .catch(() => undefined);
    }
    if (used + incoming > this.opts.memoryBudgetBytes) {
      this.opts.log.warn({ used, incoming, budget: this.opts.memoryBudgetBytes }, 'memory budget exceeded: every loaded model is busy');
    }
  }

  private acquire(m: LoadedModel, prompt: Token[], req: GenerationRequest): Promise<Slot> {
    const { signal } = req;
    const slot = m.take(prompt, req.cacheScope);
    if (slot) return Promise.resolve(slot);
    // A background response waits however long its queue: it was acknowledged as queued, and
    // failing it as busy would lose what the client was told would run.
    const queue = req.background === true ? m.background : m.waiters;
    if (queue === m.waiters && m.waiters.length >= this.opts.queueSize) {
      return Promise.reject(new ApiError('overloaded', 'The model is busy and its queue is full; retry shortly.', { retryAfterMs: 1000 }));
    }
    return new Promise<Slot>((resolve, reject) => {
      const waiter: Waiter = {
        resolve: (s) => {
          forget();
          resolve(s);
        },
        reject,
      };
      const forget = onAbort(signal, () => {
        const i = queue.indexOf(waiter);
        if (i >= 0) queue.splice(i, 1);
        reject(new CancelledError('The request was cancelled while it waited.'));
      });
      queue.push(waiter);
    });
  }

  async countInputTokens(req: GenerationRequest, target: DeploymentTarget): Promise<{ tokens: number; estimated: boolean }> {
    if (target.engine !== 'local') throw new Error('local engine given a non-local target');
    const m = await this.loadFor(req, target);
    const tools = req.toolChoice === 'none' ? [] : (req.tools ?? []);
    const limit = Math.min(target.contextLength, m.context.contextSize);
    // As in generate: text that cannot fit is not tokenized (it would hold the event loop). It is
    // past the context whatever its count, so it gets the estimate the upstreams get, flagged (at
    // least the lower bound that proves it cannot fit).
    const chars = promptChars(req.messages, tools);
    if (chars > limit * MAX_CHARS_PER_TOKEN)
      return { tokens: Math.max(estimateInputTokens(req), Math.ceil(chars / MAX_CHARS_PER_TOKEN)), estimated: true };
    return { tokens: m.renderer.render(req.messages, tools).length, estimated: false };
  }

  private async loadFor(req: GenerationRequest, target: DeploymentTarget & { engine: 'local' }): Promise<LoadedModel> {
    try {
      // A request stopped meanwhile (its client left, a shutdown) does not wait for the load, which
      // can take seconds on a busy machine; the model goes on loading for the next one.
      return await unlessAborted(
        this.load(target.file),
        req.signal,
        () => new CancelledError('The request was cancelled while its model loaded.'),
      );
    } catch (err) {
      if (err instanceof ApiError) throw err;
      this.opts.log.error({ err, file: target.file }, 'model failed to load');
      throw new ApiError('model_load_failed', `The model '${req.model}' could not be loaded.`);
    }
  }

  async *generate(req: GenerationRequest, target: DeploymentTarget): AsyncGenerator<GenerationEvent> {
    if (target.engine !== 'local') throw new Error('local engine given a non-local target');
    const m = await this.loadFor(req, target);
    const plan = await this.plan(req, target.reasoning);
    const limit = Math.min(target.contextLength, m.context.contextSize);
    const requested = req.maxOutputTokens ?? 0;
    // Tokenizing is synchronous (about a second per 2 MB here): text that cannot fit even at the most
    // characters a token can stand for is refused before it holds the event loop.
    const chars = promptChars(req.messages, plan.tools);
    if (chars > limit * MAX_CHARS_PER_TOKEN) {
      throw new ApiError(
        'context_length_exceeded',
        `This model's maximum context length is ${limit} tokens. However, the messages alone are ${chars} characters, ` +
          `at least ${Math.ceil(chars / MAX_CHARS_PER_TOKEN)} tokens. Please reduce the length of the messages.`,
        { param: 'messages' },
      );
    }
    const prompt = m.renderer.render(req.messages, plan.tools);
    if (prompt.length + requested > limit || prompt.length >= limit) {
      throw new ApiError(
        'context_length_exceeded',
        `This model's maximum context length is ${limit} tokens. However, you requested ${prompt.length + requested} tokens ` +
          `(${prompt.length} in the messages, ${requested} in the completion). Please reduce the length of the messages or completion.`,
        { param: 'messages' },
      );
    }
    const maxOut = req.maxOutputTokens ?? limit - prompt.length;

    m.active++;
    m.lastUsed = Date.now();
    let slot: Slot;
    try {
      slot = await this.acquire(m, prompt, req);
    } catch (err) {
      m.active--;
      throw err;
    }
    // The producer runs ahead by at most the channel's capacity, so token k+1 is computed while
    // token k is being written to the client.
    const out = new Channel<GenerationEvent>();
    // What another organization left in the sequence is cleared before this request evaluates.
    const foreign = slot.scope !== req.cacheScope;
    slot.scope = req.cacheScope;
    const producer = this.run(m, slot.sequence, prompt, maxOut, req, out, plan, foreign).finally(() => {
      m.active--;
      m.lastUsed = Date.now();
      m.release(slot);
    });
    try {
      yield* out;
    } finally {
      await producer;
    }
  }

  /** What happened to schema-checked outputs since start, for operators and metrics. */
  readonly schemaOutcomes = { violations: 0, resampled: 0, failed: 0, returnedInvalid: 0 };

  /** Outputs that failed schema validation although the grammar alone should have made that impossible: should stay 0. */
  get schemaViolations(): number {
    return this.schemaOutcomes.violations;
  }

  /**
   * A tool's grammar and check. A `strict: false` tool is never refused for its schema: one that
   * cannot be compiled (`fallback`) takes any JSON object as its arguments.
   */
  private async toolSchema(
    t: FunctionTool,
    req: GenerationRequest,
    budget: CompileBudget,
  ): Promise<{ c: CompiledSchema; fallback: boolean }> {
    const model = req.model;
    try {
      return { c: await this.grammars.forSchema(parametersOf(t), 'tools', req.cacheScope, budget), fallback: false };
    } catch (err) {
      if (t.strict === true || !(err instanceof ApiError)) throw err;
      this.opts.log.warn(
        { model, tool: t.name, reason: err.message },
        'strict: false tool schema not compiled; its arguments are any JSON object',
      );
      return { c: await this.grammars.anyObject(), fallback: true };
    }
  }

  /** Which sink the text goes to, and the grammar (if any) that constrains decoding. */
  private async plan(req: GenerationRequest, reasoning: boolean): Promise<OutputPlan> {
    const outcomes = this.schemaOutcomes;
    const log = this.opts.log;
    const checkOf = (c: CompiledSchema, lenient: boolean): SchemaCheck => ({
      check: c.check,
      // Nobody reads a non-streamed answer before it is complete, so it is always held until it passes.
      enforce: c.checked.length > 0 || req.stream !== true,
      lenient,
      onViolation: (what, errors, final) => {
        if (c.checked.length === 0) {
          outcomes.violations++;
          log.error({ model: req.model, what, errors }, 'output failed schema validation despite the grammar (bug)');
        }
        if (!final) {
          outcomes.resampled++;
          log.info({ model: req.model, what, errors, checked: c.checked }, 'output failed its schema check; sampling again');
        } else if (lenient) {
          outcomes.returnedInvalid++;
          log.warn({ model: req.model, what, errors }, 'strict: false tool call failed its schema check; returned as it is');
        } else {
          outcomes.failed++;
          log.warn({ model: req.model, what, errors }, 'output failed its schema check on every attempt');
        }
      },
    });
    const attemptsFor = (checks: Iterable<SchemaCheck>): number => ([...checks].some((c) => c.enforce) ? SCHEMA_ATTEMPTS : 1);
    const tools = req.toolChoice === 'none' ? [] : (req.tools ?? []);
    // The tools' schemas share one compile budget; the wrapper around them (below) has its own limit.
    const budget = this.grammars.budget();
    const scope = req.cacheScope;
    const fmt = req.responseFormat;
    const wantsJson = fmt !== undefined && fmt.type !== 'text';
    const stop = req.sampling.stop ?? [];
    if (tools.length > 0 && !(wantsJson && (req.toolChoice === undefined || req.toolChoice === 'auto'))) {
      const choice = req.toolChoice;
      const named =
        typeof choice === 'object'
          ? tools.find((t) => t.name === choice.name)
          : choice === 'required' && tools.length === 1
            ? tools[0]
            : undefined;
      if (typeof choice === 'object' && !named) {
        throw new ApiError('invalid_value', `tool_choice names '${choice.name}', which is not one of the tools.`, { param: 'tool_choice' });
      }
      if (named) {
        const { c } = await this.toolSchema(named, req, budget);
        const check = checkOf(c, named.strict !== true);
        return {
          grammar: c.grammar,
          lazy: false,
          tools,
          attempts: attemptsFor([check]),
          make: (push, last) => new CallSink(push, named, check, last),
        };
      }
      const checks = new Map<string, SchemaCheck>();
      const callable: FunctionTool[] = [];
      for (const t of tools) {
        const { c, fallback } = await this.toolSchema(t, req, budget);
        callable.push(fallback ? { ...t, parameters: { type: 'object' } } : t);
        checks.set(t.name, checkOf(c, t.strict !== true));
      }
      const wrapper = await this.grammars.forSchema(callSchema(callable), 'tools', scope);
      const attempts = attemptsFor(checks.values());
      if (choice === 'required')
        return { grammar: wrapper.grammar, lazy: false, tools, attempts, make: (push, last) => new ChoiceSink(push, checks, last) };
      return {
        grammar: wrapper.grammar,
        lazy: true,
        tools,
        attempts,
        make: (push, last) => new AutoSink(new TextSink(push, stop, reasoning), push, checks, last),
      };
    }
    if (fmt?.type === 'json_schema') {
      const c = await this.grammars.forSchema(fmt.schema, fmt.param ?? 'response_format', scope);
      const check = checkOf(c, false);
      return {
        grammar: c.grammar,
        lazy: false,
        tools: [],
        attempts: attemptsFor([check]),
        make: (push, last) => new JsonSink(push, check, last),
      };
    }
    if (fmt?.type === 'json_object') {
      const c = await this.grammars.anyObject();
      const check = checkOf(c, false);
      return { grammar: c.grammar, lazy: false, tools: [], attempts: 1, make: (push, last) => new JsonSink(push, check, last) };
    }
    return { lazy: false, tools: [], attempts: 1, make: (push) => new TextSink(push, stop, reasoning) };
  }

  private async run(
    m: LoadedModel,
    seq: LlamaContextSequence,
    prompt: Token[],
    maxOut: number,
    req: GenerationRequest,
    out: Channel<GenerationEvent>,
    plan: OutputPlan,
    foreign: boolean,
  ): Promise<void> {
    const tally = req.tally;
    tally.input = prompt.length;
    tally.exact = true;
    const push: Push = (ev) => out.push(ev);
    // Every attempt's tokens are generated, so every one is billed.
    let output = 0;
    let reasoningTokens = 0;
    const usage = (): GenerationEvent => ({
      type: 'usage',
      usage: { input: prompt.length, cached: tally.cached, output, reasoning: reasoningTokens },
    });
    try {
      if (foreign && seq.nextTokenIndex > 0) await seq.clearHistory();
      for (let attempt = 0; ; attempt++) {
        const last = attempt + 1 >= plan.attempts;
        const sink = plan.make(push, last);
        const done = await this.attempt(
          m,
          seq,
          prompt,
          // Every attempt within max_tokens in all: a retry gets what the ones before it left. Each
          // attempt had max_tokens of its own, so a budget or tpm was overshot by up to four times
          // what admission reserved (a hostile pass), and completion_tokens came out past max_tokens.
          maxOut - output,
          req,
          plan,
          sink,
          attempt,
          () => out.isCancelled,
          (n, reasoning) => {
            tally.output = output + n;
            if (reasoning) tally.reasoning = ++reasoningTokens;
          },
        );
        if (done === undefined) return;
        output += done.output;
        let reason = await sink.end(done.finish);
        if (reason === 'retry' && output >= maxOut) reason = 'failed';
        if (reason === 'retry') continue;
        if (reason === 'failed') {
          await out.push(usage());
          out.close(
            new ApiError(
              'structured_output_failed',
              `The model did not produce output that satisfies the schema in ${attempt + 1} attempt${attempt === 0 ? '' : 's'} (within max_tokens in all); retry, raise max_tokens, or simplify the schema.`,
              // The attempts were this server's own: a client library's automatic retries would
              // multiply them (a schema no value satisfies that the checks at admission did not catch).
              { final: true },
            ),
          );
          return;
        }
        await out.push(usage());
        const stopSequence = reason === 'stop' ? sink.stopSequence : undefined;
        await out.push({ type: 'finish', reason, ...(stopSequence !== undefined && { stopSequence }) });
        out.close();
        return;
      }
    } catch (err) {
      // An error meant for the client (a schema whose output check overran its time limit) is
      // answered as it is; what was generated is in the tally, and billed.
      if (err instanceof ApiError) out.close(err);
      else {
        this.opts.log.error({ err }, 'local generation failed');
        out.close(new ApiError('internal_error', 'The local engine failed while generating.'));
      }
    } finally {
      out.close();
    }
  }

  /**
   * One pass of decoding into `sink`. A retry starts again from the prompt with its own seed and at
   * least RETRY_TEMPERATURE. Returns undefined when the request was cancelled.
   */
  private async attempt(
    m: LoadedModel,
    seq: LlamaContextSequence,
    prompt: Token[],
    maxOut: number,
    req: GenerationRequest,
    plan: OutputPlan,
    sink: Sink,
    attempt: number,
    cancelled: () => boolean,
    onToken: (generated: number, reasoning: boolean) => void,
  ): Promise<{ finish: 'stop' | 'length'; output: number } | undefined> {
    const { model } = m;
    const s = req.sampling;
    const generated: Token[] = [];
    let pending: Token[] = [];
    // The token stream also ends on its own once a grammar is complete: that is a stop too.
    let finish: 'stop' | 'length' = 'stop';
    const penalties = (s.presencePenalty ?? 0) !== 0 || (s.frequencyPenalty ?? 0) !== 0;
    let tokens: AsyncGenerator<Token, void, void | Token | Token[]> | undefined;
    const grammarState = plan.grammar ? new LlamaGrammarEvaluationState({ model, grammar: plan.grammar }) : undefined;
    const temperature = s.temperature ?? 1;
    // A document under a grammar is nudged to close before max_tokens cuts it (closing-bias.ts).
    const closing = plan.grammar && !plan.lazy ? (await m.closingBias())?.track(maxOut) : undefined;
    // Under a grammar, byte tokens are read as the grammar reads them (grammar-text.ts).
    // A lazy grammar (tool_choice auto) applies from the token after its trigger.
    const byteTokens = plan.grammar ? await m.byteTokens() : undefined;
    const grammarText = byteTokens?.decoder();
    const underGrammar = plan.lazy ? () => (sink as AutoSink).triggered : () => true;
    try {
      // Keep the shared prefix in the KV cache; at least one prompt token is evaluated to get logits.
      const shared = Math.min(seq.compareContextTokens(prompt).firstDifferentIndex, prompt.length - 1);
      if (seq.nextTokenIndex > shared) await seq.eraseContextTokenRanges([{ start: shared, end: seq.nextTokenIndex }]);
      if (attempt === 0) req.tally.cached = shared;
      tokens = seq.evaluate(prompt.slice(shared), {
        temperature: attempt === 0 ? temperature : Math.max(temperature, RETRY_TEMPERATURE),
        topP: s.topP ?? 1,
        ...(s.topK !== undefined && { topK: s.topK }),
        // node-llama-cpp's default seed is the current second: without one of our own, every request
        // in the same second would sample the same text. A retry with a seed given varies it predictably.
        seed: s.seed !== undefined ? (s.seed + attempt) >>> 0 : randomInt(0x1_0000_0000),
        ...(grammarState && {
          // A lazy grammar (tool_choice auto) applies only once the model has opened a tool call.
          grammarEvaluationState: plan.lazy ? () => ((sink as AutoSink).triggered ? grammarState : undefined) : grammarState,
        }),
        ...(closing && { tokenBias: () => closing.bias() }),
        ...(penalties && {
          repeatPenalty: {
            punishTokens: () => generated,
            penalty: 1,
            presencePenalty: s.presencePenalty ?? 0,
            frequencyPenalty: s.frequencyPenalty ?? 0,
          },
        }),
      });
      for await (const token of tokens) {
        if (req.signal.aborted || cancelled()) return undefined;
        if (model.isEogToken(token)) break;
        generated.push(token);
        let text: string;
        let whole: boolean;
        if (grammarText && underGrammar()) {
          // Tokens held from before a lazy grammar applied go out first, as they decode.
          const before =
            pending.length > 0 ? model.detokenize(pending, false, lastTokens(prompt, generated.slice(0, -1), pending.length)) : '';
          pending = [];
          const bytes = byteTokens!.of(token);
          // A control token (`<s>`) is its text to the grammar, which llama.cpp matches against
          // "<s>"; decoded without special tokens it would vanish from a string the grammar counted
          // (`const: "<s>"` came back as "", failing the check the grammar had passed).
          text =
            before +
            (bytes ? grammarText.push(bytes) : grammarText.end() + model.detokenize([token], true, lastTokens(prompt, generated, 1)));
          whole = text !== '';
        } else {
          pending.push(token);
          text = model.detokenize(pending, false, lastTokens(prompt, generated, pending.length));
          // A character split across tokens decodes as U+FFFD until its last byte arrives.
          whole = !(text.endsWith('\uFFFD') && pending.length < 4);
        }
        closing?.feed(whole ? text : '', generated.length);
        if (whole) {
          pending = [];
          // No await unless the queue is full: `await undefined` would still let the consumer run first.
          const full = sink.text(text);
          if (full) await full;
          if (sink.stopped) break;
        }
        onToken(generated.length, sink.thinking);
        if (generated.length >= maxOut) {
          finish = 'length';
          break;
        }
      }
      // Tokens still held at the end were held for a character whose last bytes never came (the
      // output was cut by max_tokens in its middle): the text before it is sent, and of the
      // character nothing, rather than the U+FFFD a decoder makes of its first bytes. The same
      // for a sequence still open under a grammar.
      if (pending.length > 0) {
        const rest = model.detokenize(pending, false, lastTokens(prompt, generated, pending.length)).replace(/\uFFFD$/u, '');
        if (rest !== '') await sink.text(rest);
      }
      grammarText?.end();
      return { finish, output: generated.length };
    } finally {
      await tokens?.return();
    }
  }

  /** What is loaded now, for operators (GET /admin/local/loaded). */
  status(): Array<{ file: string; bytes: number; active: number; queued: number; sequences: number; last_used: number }> {
    return [...this.loaded.values()].map((m) => ({
      file: m.file,
      bytes: m.bytes,
      active: m.active,
      queued: m.waiters.length + m.background.length,
      sequences: m.slots.length,
      last_used: Math.floor(m.lastUsed / 1000),
    }));
  }

  async close(): Promise<void> {
    await this.grammars.close();
    for (const m of this.loaded.values()) {
      await m.context.dispose();
      await m.model.dispose();
    }
    this.loaded.clear();
    if (this.llama) await (await this.llama).dispose();
  }
}
