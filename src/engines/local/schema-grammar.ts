import { createHash } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import { LlamaGrammar, type Llama } from 'node-llama-cpp';
import type { Logger } from 'pino';
import { ApiError } from '../../core/errors.js';
import { anyObjectGbnf } from './schema-gbnf.js';
import type { SchemaWorkerCall, SchemaWorkerReply, SchemaWorkerRequest } from './schema-protocol.js';

/** What the output check found: valid, invalid (with Ajv's errors), or unknown (the worker was restarted). */
export interface Verdict {
  valid: boolean | undefined;
  errors?: string | undefined;
}

export interface CompiledSchema {
  grammar: LlamaGrammar;
  /** Keywords the grammar does not enforce exactly (with paths); empty when it does enforce the whole schema. */
  checked: readonly string[];
  /** Validates a generated document against the original schema (off the main thread), as `scope`'s call. */
  check(text: string, scope?: string): Promise<Verdict>;
}

export interface SchemaGrammarOptions {
  /** Compiled schemas kept (grammars here, validators in the worker). */
  cacheSize: number;
  /**
   * A compile that takes longer is stopped (the worker is replaced) and the request refused; so is a
   * validation that takes longer than this or VALIDATE_TIMEOUT_MS, whichever is less.
   */
  compileTimeoutMs: number;
  log: Logger;
}

/** Cached schemas may hold at most this much JSON between them, however many there are. */
const MAX_CACHED_BYTES = 64 * 1024 * 1024;
/** A grammar this large would take llama.cpp's parser more than a few ms on the main thread. */
const MAX_GRAMMAR_BYTES = 4 * 1024 * 1024;
/**
 * The most a generated document's check may take. Ajv checks a document in microseconds to a few
 * ms; what takes longer is a `pattern` that backtracks (`^(a+)+$` against 40 characters runs for
 * hours), which would hold the worker, and every schema queued behind it, for as long.
 */
const VALIDATE_TIMEOUT_MS = 1_000;

type Reply = Exclude<SchemaWorkerReply, { started: true }>;

/**
 * The worker time one request's schemas may take to compile between them (a hostile pass sent 128
 * `strict: false` tools, each just under the time limit: one request held the worker for minutes).
 */
export interface CompileBudget {
  leftMs: number;
}

interface Pending {
  msg: SchemaWorkerCall;
  resolve: (r: Reply) => void;
  reject: (e: Error) => void;
  /** The call's own limit. */
  limitMs: number | undefined;
  /** The limit it runs under: with a budget, what is left of it when the call starts, if less. */
  timeoutMs: number | undefined;
  /** Whose call it is (an organization): calls are taken from each in turn. */
  scope: string;
  budget: CompileBudget | undefined;
  timer: NodeJS.Timeout | undefined;
  /** When the worker started on it. */
  startedAt: number;
  /** Times it was sent; a call that was in a worker that died twice is given up (it may be the cause). */
  tries: number;
}

/**
 * A compile or a validation overran its time limit. `full`: it had the whole limit (rather than what
 * its request's budget had left), so the schema itself is too slow to compile.
 */
class SchemaTimeout extends Error {
  constructor(readonly full: boolean) {
    super('schema worker call overran its time limit');
  }
}

/**
 * The schema worker thread, and the queue in front of it. The worker runs one call at a time, and
 * the calls waiting are taken from each scope (organization) in turn: one organization's slow
 * schemas keep its own later calls waiting, not everyone's (a hostile pass's four requests of slow
 * schemas held another tenant's first structured output for 21 s). A compile or a validation that
 * overruns its time limit (counted from when the worker starts on it, not from when it was queued)
 * is the only thing that makes the worker be replaced; the call it held is then sent again.
 */
class SchemaWorker {
  private worker: Worker | undefined;
  private seq = 0;
  /** Calls waiting, by scope, in the order the scopes take turns. */
  private readonly waiting = new Map<string, Pending[]>();
  /** The call the worker is on. */
  private current: { id: number; p: Pending; worker: Worker } | undefined;
  /** The scope that had the last turn. */
  private lastScope: string | undefined;
  private closed = false;

  constructor(
    private readonly cacheSize: number,
    private readonly log: Logger,
  ) {}

  private start(): Worker {
    const w = new Worker(new URL('./schema-worker.js', import.meta.url), {
      workerData: { cacheSize: this.cacheSize },
      resourceLimits: { maxOldGenerationSizeMb: 512 },
    });
    w.on('message', (m: SchemaWorkerReply) => {
      const cur = this.current;
      if (!cur || cur.id !== m.id || cur.worker !== w) return;
      const p = cur.p;
      if ('started' in m) {
        p.startedAt = performance.now();
        if (p.timeoutMs !== undefined) p.timer = setTimeout(() => this.overrun(w, m.id), p.timeoutMs);
        return;
      }
      this.settle();
      p.resolve(m);
    });
    const lost = (why: string) => {
      if (this.worker !== w) return;
      this.worker = undefined;
      this.log.error({ reason: why }, 'schema worker stopped; starting another');
      const cur = this.current;
      if (cur?.worker === w) {
        this.settle();
        // It died on its own: the call counts it, and goes first again.
        if (cur.p.tries >= 2) cur.p.reject(new Error('the schema worker stopped twice while holding this call'));
        else {
          cur.p.tries++;
          this.queue(cur.p, true);
          // Not passed over for having had the turn it lost.
          this.lastScope = undefined;
        }
      }
      this.pump();
    };
    w.on('error', (err) => lost(err.message));
    w.on('exit', (code) => lost(`exit ${code}`));
    w.unref();
    return w;
  }

  /**
   * The current call is over: its timer stopped, its time taken from its request's budget (at
   * least `atLeastMs`: a call that overran took all it was given).
   */
  private settle(atLeastMs = 0): void {
    const cur = this.current;
    if (!cur) return;
    this.current = undefined;
    const p = cur.p;
    if (p.timer) clearTimeout(p.timer);
    if (p.budget && p.startedAt > 0) p.budget.leftMs -= Math.max(performance.now() - p.startedAt, atLeastMs);
    setImmediate(() => this.pump());
  }

  /** A call ran past its limit: only terminating the thread stops it. */
  private overrun(w: Worker, id: number, again = true): void {
    const cur = this.current;
    if (!cur || cur.id !== id || cur.worker !== w) return;
    // A main thread held up past the limit (a long synchronous step) runs its timers before the
    // worker's answer waiting in its queue: that answer is read first (setImmediate runs after
    // it), so a call that finished in time is not taken for one that overran.
    if (again) {
      setImmediate(() => this.overrun(w, id, false));
      return;
    }
    const p = cur.p;
    // Its whole allowance: the timer runs on the event loop's clock, which an iteration holds back,
    // so it can fire with less than the limit measured since the start (a loaded CI run left the
    // budget a few ms, and the next schema ran and overran too).
    this.settle(p.timeoutMs);
    this.log.warn({ op: p.msg.op, timeout_ms: p.timeoutMs }, 'schema worker call overran its time limit; replacing the schema worker');
    if (this.worker === w) this.worker = undefined;
    void w.terminate();
    p.reject(new SchemaTimeout(p.timeoutMs === p.limitMs));
  }

  private queue(p: Pending, first = false): void {
    const q = this.waiting.get(p.scope);
    if (!q) this.waiting.set(p.scope, [p]);
    else if (first) q.unshift(p);
    else q.push(p);
  }

  /**
   * Starts the next call when the worker is free: from the scope first in line that did not have
   * the last turn (a scope whose turn it was goes to the back of the line), or from that one when no
   * other scope waits.
   */
  private pump(): void {
    while (!this.current && !this.closed) {
      let pick: string | undefined;
      for (const scope of this.waiting.keys()) {
        if (scope !== this.lastScope) {
          pick = scope;
          break;
        }
        pick = scope;
      }
      if (pick === undefined) return;
      const q = this.waiting.get(pick)!;
      const p = q.shift()!;
      this.waiting.delete(pick);
      if (q.length > 0) this.waiting.set(pick, q);
      this.lastScope = pick;
      if (p.budget && p.budget.leftMs <= 0) {
        p.reject(new SchemaTimeout(false));
        continue;
      }
      p.timeoutMs = p.budget && p.limitMs !== undefined ? Math.min(p.limitMs, Math.ceil(p.budget.leftMs)) : p.limitMs;
      let worker: Worker;
      try {
        worker = this.worker ??= this.start();
      } catch (err) {
        // No thread could be made (out of memory, too many threads): this call fails, not the process.
        p.reject(err instanceof Error ? err : new Error(String(err)));
        continue;
      }
      const id = ++this.seq;
      this.current = { id, p, worker };
      p.startedAt = 0;
      worker.postMessage({ ...p.msg, id } as SchemaWorkerRequest);
    }
  }

  call(msg: SchemaWorkerCall, timeoutMs?: number, scope = '', budget?: CompileBudget): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => {
      if (this.closed) {
        reject(new Error('the schema worker is closed'));
        return;
      }
      this.queue({ msg, resolve, reject, limitMs: timeoutMs, timeoutMs, scope, budget, timer: undefined, startedAt: 0, tries: 1 });
      this.pump();
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    const calls = [...this.waiting.values()].flat();
    this.waiting.clear();
    const cur = this.current;
    if (cur) {
      if (cur.p.timer) clearTimeout(cur.p.timer);
      this.current = undefined;
      calls.push(cur.p);
    }
    for (const p of calls) p.reject(new Error('the schema worker is closed'));
    const w = this.worker;
    this.worker = undefined;
    await w?.terminate();
  }
}

/** Refusals kept in the cache in place of a compiled schema (see `compiled`), for REFUSAL_KEPT_MS. */
const lasting = new WeakSet<object>();
const REFUSAL_KEPT_MS = 10 * 60_000;
/** Refusals for a request's spent budget rather than for the schema (see `forSchema`). */
const budgetRefusals = new WeakSet<object>();

interface Entry {
  compiled: Promise<CompiledSchema>;
  schema: Record<string, unknown>;
  bytes: number;
}

/**
 * Grammars and validators, compiled once per distinct schema in a worker thread and kept in a
 * bounded least-recently-used cache (count and bytes): a stream of distinct schemas cannot grow
 * memory. Only the llama.cpp grammar object is made on the main thread, from the finished grammar text.
 */
export class SchemaGrammars {
  private readonly cache = new Map<string, Entry>();
  private bytes = 0;
  private readonly worker: SchemaWorker;
  private anyObjectGrammar: Promise<CompiledSchema> | undefined;

  constructor(
    private readonly llama: () => Promise<Llama>,
    private readonly opts: SchemaGrammarOptions,
  ) {
    this.worker = new SchemaWorker(opts.cacheSize, opts.log);
  }

  /** Cached entries now, for tests and operators. */
  get size(): number {
    return this.cache.size;
  }

  /** `json_object`: a JSON object of whatever shape; checked to be an object. */
  anyObject(): Promise<CompiledSchema> {
    this.anyObjectGrammar ??= (async () => {
      const grammar = new LlamaGrammar(await this.llama(), { grammar: anyObjectGbnf() });
      return {
        grammar,
        checked: [],
        check: async (text: string): Promise<Verdict> => {
          try {
            const v: unknown = JSON.parse(text);
            return typeof v === 'object' && v !== null && !Array.isArray(v) ? { valid: true } : { valid: false, errors: 'not an object' };
          } catch (err) {
            return { valid: false, errors: (err as Error).message };
          }
        },
      };
    })();
    return this.anyObjectGrammar;
  }

  /** A request's compile budget: its schemas may take the compile time limit between them. */
  budget(): CompileBudget {
    return { leftMs: this.opts.compileTimeoutMs };
  }

  /**
   * The schema compiled; a schema that cannot be is refused with an error naming `param` (the
   * caller's field). `scope` (the organization) takes its turn at the worker; `budget`, where given,
   * is the request's, shared by its schemas.
   */
  forSchema(schema: Record<string, unknown>, param: string, scope = '', budget?: CompileBudget): Promise<CompiledSchema> {
    // A compile is shared by every request with the same schema while it runs (on chat it is
    // `response_format`, on Responses `text.format`): its errors name no field, each caller's does.
    const named = (err: unknown): never => {
      throw err instanceof ApiError ? new ApiError(err.code, err.message, { param }) : err;
    };
    const ready = (c: CompiledSchema): CompiledSchema => ({ ...c, check: (text: string) => c.check(text, scope).catch(named) });
    return this.compiled(schema, scope, budget).then(ready, (err: unknown) => {
      // A compile shared with another request, refused for that request's budget (not for this
      // schema): compiled again, as this caller's, within its own budget (a review found one
      // organization's spent budget refusing another's schema).
      if (budgetRefusals.has(err as object) && (budget === undefined || budget.leftMs > 0))
        return this.compiled(schema, scope, budget).then(ready, named);
      return named(err);
    });
  }

  private compiled(schema: Record<string, unknown>, scope: string, budget: CompileBudget | undefined): Promise<CompiledSchema> {
    const json = JSON.stringify(schema);
    const key = createHash('sha256').update(json).digest('base64url');
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit.compiled;
    }
    const compiled = this.compile(key, schema, scope, budget);
    const entry: Entry = { compiled, schema, bytes: json.length };
    this.cache.set(key, entry);
    this.bytes += entry.bytes;
    // A schema too slow to compile in the whole time limit stays refused while it is cached, so that
    // sending it again costs no more worker time; other failures are forgotten (they may pass later).
    compiled.catch((err: unknown) => {
      if (!lasting.has(err as object)) this.evict(key, entry);
      // Not for ever: one overrun on a machine busy decoding may be the machine's, not the schema's.
      else setTimeout(() => this.evict(key, entry), REFUSAL_KEPT_MS).unref();
    });
    while (this.cache.size > this.opts.cacheSize || this.bytes > MAX_CACHED_BYTES) {
      const [oldKey, old] = this.cache.entries().next().value!;
      this.evict(oldKey, old);
      if (oldKey === key) break;
    }
    return compiled;
  }

  private evict(key: string, entry: Entry): void {
    if (this.cache.get(key) !== entry) return;
    this.cache.delete(key);
    this.bytes -= entry.bytes;
    this.worker.call({ op: 'forget', key }).catch(() => undefined);
  }

  private async compile(
    key: string,
    schema: Record<string, unknown>,
    scope: string,
    budget: CompileBudget | undefined,
  ): Promise<CompiledSchema> {
    let reply: Reply;
    try {
      reply = await this.worker.call({ op: 'compile', key, schema }, this.opts.compileTimeoutMs, scope, budget);
    } catch (err) {
      if (err instanceof SchemaTimeout) {
        if (!err.full) {
          const refusal = new ApiError(
            'schema_too_large',
            `The request's JSON schemas took longer than ${this.opts.compileTimeoutMs} ms to compile between them (SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS); simplify them.`,
          );
          budgetRefusals.add(refusal);
          throw refusal;
        }
        const refusal = new ApiError(
          'schema_too_large',
          `The JSON schema took longer than ${this.opts.compileTimeoutMs} ms to compile (SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS); simplify it.`,
        );
        lasting.add(refusal);
        throw refusal;
      }
      throw new ApiError('unsupported_schema', `The JSON schema could not be compiled (${(err as Error).message}).`);
    }
    if (!reply.ok) {
      if (reply.kind === 'unsupported')
        throw new ApiError('unsupported_schema', `${capitalise(reply.message)}; remove it or use another model.`);
      throw new ApiError('invalid_value', `The JSON schema is invalid: ${reply.message}`);
    }
    const gbnf = reply.gbnf ?? '';
    if (gbnf.length > MAX_GRAMMAR_BYTES) {
      throw new ApiError('schema_too_large', `The JSON schema makes a grammar of ${gbnf.length} bytes; the limit is ${MAX_GRAMMAR_BYTES}.`);
    }
    let grammar: LlamaGrammar;
    try {
      grammar = new LlamaGrammar(await this.llama(), { grammar: gbnf });
    } catch (err) {
      throw new ApiError('unsupported_schema', `The JSON schema could not be turned into a grammar (${(err as Error).message}).`);
    }
    return { grammar, checked: reply.checked ?? [], check: (text, checkScope) => this.validate(key, schema, text, checkScope ?? scope) };
  }

  /**
   * Checks a generated document. One whose check overran its time limit is refused (a 400: the
   * schema, not the output, is at fault), and so is every later request with that schema, before
   * it generates anything.
   */
  private async validate(key: string, schema: Record<string, unknown>, text: string, scope: string, again = true): Promise<Verdict> {
    let reply: Reply;
    const limit = Math.min(VALIDATE_TIMEOUT_MS, this.opts.compileTimeoutMs);
    try {
      reply = await this.worker.call({ op: 'validate', key, text }, limit, scope);
    } catch (err) {
      if (!(err instanceof SchemaTimeout)) return { valid: undefined };
      const refusal = new ApiError(
        'unsupported_schema',
        `Checking the output against the JSON schema took longer than ${limit} ms (a \`pattern\` that backtracks, such as (a+)+?); simplify it.`,
      );
      const entry = this.cache.get(key);
      if (entry) {
        entry.compiled = Promise.reject(refusal);
        entry.compiled.catch(() => undefined);
      }
      throw refusal;
    }
    if (reply.ok) return { valid: reply.valid, errors: reply.errors };
    if (reply.kind === 'missing' && again) {
      // Evicted (or the worker was replaced) while the request ran: compile the validator again.
      try {
        await this.worker.call({ op: 'compile', key, schema }, this.opts.compileTimeoutMs, scope);
      } catch {
        return { valid: undefined };
      }
      return this.validate(key, schema, text, scope, false);
    }
    return { valid: undefined };
  }

  close(): Promise<void> {
    return this.worker.close();
  }
}

const capitalise = (s: string): string => s.charAt(0).toUpperCase() + s.slice(1);
