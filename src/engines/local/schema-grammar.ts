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
  /** Validates a generated document against the original schema (off the main thread). */
  check(text: string): Promise<Verdict>;
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
interface Pending {
  msg: SchemaWorkerCall;
  resolve: (r: Reply) => void;
  reject: (e: Error) => void;
  timeoutMs: number | undefined;
  timer: NodeJS.Timeout | undefined;
  /** Times it was sent; a call that was in a worker that died twice is given up (it may be the cause). */
  tries: number;
}

/** A compile or a validation overran its time limit. */
class SchemaTimeout extends Error {}

/**
 * The schema worker thread. A compile or a validation that overruns its time limit (counted from
 * when the worker starts on it, not from when it was queued) is the only thing that makes the worker
 * be replaced; the calls it held are then sent again to the new one.
 */
class SchemaWorker {
  private worker: Worker | undefined;
  private seq = 0;
  private readonly pending = new Map<number, Pending>();
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
      const p = this.pending.get(m.id);
      if (!p) return;
      if ('started' in m) {
        if (p.timeoutMs !== undefined) p.timer = setTimeout(() => this.overrun(w, m.id), p.timeoutMs);
        return;
      }
      this.pending.delete(m.id);
      if (p.timer) clearTimeout(p.timer);
      p.resolve(m);
    });
    const lost = (why: string) => {
      if (this.worker !== w) return;
      this.worker = undefined;
      this.log.error({ reason: why }, 'schema worker stopped; starting another');
      this.resend(true);
    };
    w.on('error', (err) => lost(err.message));
    w.on('exit', (code) => lost(`exit ${code}`));
    w.unref();
    return w;
  }

  /** A compile ran past its limit: only terminating the thread stops it; the rest is sent again. */
  private overrun(w: Worker, id: number, again = true): void {
    const p = this.pending.get(id);
    if (!p || this.worker !== w) return;
    // A main thread held up past the limit (a long synchronous step) runs its timers before the
    // worker's answer waiting in its queue: that answer is read first (setImmediate runs after
    // it), so a call that finished in time is not taken for one that overran.
    if (again) {
      setImmediate(() => this.overrun(w, id, false));
      return;
    }
    this.pending.delete(id);
    this.log.warn({ op: p.msg.op, timeout_ms: p.timeoutMs }, 'schema worker call overran its time limit; replacing the schema worker');
    this.worker = undefined;
    void w.terminate();
    p.reject(new SchemaTimeout());
    this.resend(false);
  }

  /** Sends what the lost worker held to a new one; `crashed`: it died on its own, and counts against each call. */
  private resend(crashed: boolean): void {
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const p of calls) {
      if (p.timer) clearTimeout(p.timer);
      if (crashed && p.tries >= 2) p.reject(new Error('the schema worker stopped twice while holding this call'));
      else this.post(p.msg, p.timeoutMs, p.resolve, p.reject, p.tries + (crashed ? 1 : 0));
    }
  }

  private post(
    msg: SchemaWorkerCall,
    timeoutMs: number | undefined,
    resolve: (r: Reply) => void,
    reject: (e: Error) => void,
    tries = 1,
  ): void {
    if (this.closed) {
      reject(new Error('the schema worker is closed'));
      return;
    }
    this.worker ??= this.start();
    const id = ++this.seq;
    this.pending.set(id, { msg, resolve, reject, timeoutMs, timer: undefined, tries });
    this.worker.postMessage({ ...msg, id } as SchemaWorkerRequest);
  }

  call(msg: SchemaWorkerCall, timeoutMs?: number): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => this.post(msg, timeoutMs, resolve, reject));
  }

  async close(): Promise<void> {
    this.closed = true;
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const p of calls) {
      if (p.timer) clearTimeout(p.timer);
      p.reject(new Error('the schema worker is closed'));
    }
    const w = this.worker;
    this.worker = undefined;
    await w?.terminate();
  }
}

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

  /** The schema compiled; a schema that cannot be is refused with an error naming `param` (the caller's field). */
  forSchema(schema: Record<string, unknown>, param: string): Promise<CompiledSchema> {
    // A compile is shared by every request with the same schema while it runs (on chat it is
    // `response_format`, on Responses `text.format`): its errors name no field, each caller's does.
    const named = (err: unknown): never => {
      throw err instanceof ApiError ? new ApiError(err.code, err.message, { param }) : err;
    };
    return this.compiled(schema).then((c) => ({ ...c, check: (text: string) => c.check(text).catch(named) }), named);
  }

  private compiled(schema: Record<string, unknown>): Promise<CompiledSchema> {
    const json = JSON.stringify(schema);
    const key = createHash('sha256').update(json).digest('base64url');
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit.compiled;
    }
    const compiled = this.compile(key, schema);
    const entry: Entry = { compiled, schema, bytes: json.length };
    this.cache.set(key, entry);
    this.bytes += entry.bytes;
    compiled.catch(() => this.evict(key, entry));
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

  private async compile(key: string, schema: Record<string, unknown>): Promise<CompiledSchema> {
    let reply: Reply;
    try {
      reply = await this.worker.call({ op: 'compile', key, schema }, this.opts.compileTimeoutMs);
    } catch (err) {
      if (err instanceof SchemaTimeout) {
        throw new ApiError(
          'schema_too_large',
          `The JSON schema took longer than ${this.opts.compileTimeoutMs} ms to compile (SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS); simplify it.`,
        );
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
    return { grammar, checked: reply.checked ?? [], check: (text) => this.validate(key, schema, text) };
  }

  /**
   * Checks a generated document. One whose check overran its time limit is refused (a 400: the
   * schema, not the output, is at fault), and so is every later request with that schema, before
   * it generates anything.
   */
  private async validate(key: string, schema: Record<string, unknown>, text: string, again = true): Promise<Verdict> {
    let reply: Reply;
    const limit = Math.min(VALIDATE_TIMEOUT_MS, this.opts.compileTimeoutMs);
    try {
      reply = await this.worker.call({ op: 'validate', key, text }, limit);
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
        await this.worker.call({ op: 'compile', key, schema }, this.opts.compileTimeoutMs);
      } catch {
        return { valid: undefined };
      }
      return this.validate(key, schema, text, false);
    }
    return { valid: undefined };
  }

  close(): Promise<void> {
    return this.worker.close();
  }
}

const capitalise = (s: string): string => s.charAt(0).toUpperCase() + s.slice(1);
