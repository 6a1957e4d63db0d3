import { newId } from '../../core/ids.js';
import type { FunctionTool, GenerationEvent } from '../../core/canonical.js';
import { StopMatcher } from '../../core/stop-matcher.js';
import { ThinkSplitter } from '../../core/think-splitter.js';

/**
 * Where the local engine's decoded text goes, by what the request asked for: plain text (with stop
 * strings and thought segments), JSON under a grammar, or tool calls under a grammar. Each method
 * returns a promise only when the event channel is full, so the token loop does not pause otherwise.
 */
export type Push = (ev: GenerationEvent) => Promise<void> | undefined;
type Wait = Promise<void> | undefined;

export interface Sink {
  text(t: string): Wait;
  /** Whether generation should stop now (a stop string was reached). */
  readonly stopped: boolean;
  /** True while the text is inside a thought segment (counted as reasoning tokens). */
  readonly thinking: boolean;
  /** The stop string that ended the text, if one did. */
  readonly stopSequence?: string | undefined;
  /** Called once generation ended; returns the finish reason to report (or that the attempt failed its schema). */
  end(reason: 'stop' | 'length'): Promise<Ending>;
}

export const TOOL_TRIGGER = '<tool_call>';
export const newCallId = (): string => newId('call');

/**
 * The JSON-schema check of a grammar-constrained output. Where the grammar is exact, it is a second
 * line of defence (a failure is a bug to see). Where it is not (`enforce`), the output is held back
 * until it passes; one that fails makes the engine sample again (`retry`), and after the last attempt
 * it is refused, or for a lenient (`strict: false`) tool returned as it is and counted.
 */
export interface SchemaCheck {
  /** Validates against the original schema (in the schema worker); `valid` is undefined when it could not be checked. */
  check(text: string): Promise<{ valid: boolean | undefined; errors?: string | undefined }>;
  /** Hold the output back until it passes (the grammar does not enforce the whole schema, or nobody reads it streamed). */
  enforce: boolean;
  /** After the last attempt, return an output that failed instead of refusing it (`strict: false` tools). */
  lenient: boolean;
  /** An output failed its check (logged and counted); `final`: no attempt is left after it. */
  onViolation(what: string, errors: unknown, final: boolean): void;
}

/** What ending an attempt decided: a finish reason, or sample again, or give up (the output failed its schema). */
export type Ending = 'stop' | 'length' | 'tool_calls' | 'retry' | 'failed';

/**
 * Checks an output; 'ok' to emit it, 'retry' to sample again, 'failed' to give up. `last`: no
 * attempt is left after this one.
 */
async function verdict(text: string, c: SchemaCheck | undefined, what: string, last: boolean): Promise<'ok' | 'retry' | 'failed'> {
  if (!c) return 'ok';
  let v: Awaited<ReturnType<SchemaCheck['check']>>;
  try {
    v = await c.check(text);
  } catch (err) {
    // A check that could not finish (its schema's pattern backtracks): a lenient tool's output is
    // returned as it is, as one that failed would be; anything else refuses the request.
    if (c.lenient) return 'ok';
    throw err;
  }
  if (v.valid !== false) return 'ok';
  // Output that was streamed as it was made cannot be taken back: the request ends with an error
  // after it (never a finish that claims it valid); held output is sampled again.
  c.onViolation(what, v.errors, last || !c.enforce);
  if (c.enforce && !last) return 'retry';
  return c.lenient ? 'ok' : 'failed';
}

export class TextSink implements Sink {
  private readonly stops: StopMatcher;
  private readonly splitter: ThinkSplitter | undefined;
  stopped = false;

  constructor(
    private readonly push: Push,
    stop: string[],
    reasoning: boolean,
  ) {
    this.stops = new StopMatcher(stop);
    this.splitter = reasoning ? new ThinkSplitter() : undefined;
  }

  get thinking(): boolean {
    return this.splitter?.thinking ?? false;
  }

  get stopSequence(): string | undefined {
    return this.stops.matched;
  }

  private send(text: string): Wait {
    if (!text) return undefined;
    if (!this.splitter) return this.push({ type: 'text.delta', text });
    let wait: Wait;
    for (const p of this.splitter.push(text))
      wait = this.push({ type: p.kind === 'reasoning' ? 'reasoning.delta' : 'text.delta', text: p.text }) ?? wait;
    return wait;
  }

  text(t: string): Wait {
    const { emit, stopped } = this.stops.push(t);
    if (stopped) this.stopped = true;
    return this.send(emit);
  }

  async end(reason: 'stop' | 'length'): Promise<'stop' | 'length'> {
    await this.send(this.stops.flush());
    for (const p of this.splitter?.flush() ?? [])
      await this.push({ type: p.kind === 'reasoning' ? 'reasoning.delta' : 'text.delta', text: p.text });
    return this.stopped ? 'stop' : reason;
  }
}

/**
 * Structured output: the grammar makes the text JSON of the schema; it streams as text, or, where the
 * schema is checked after the grammar, is held back until it passes.
 */
export class JsonSink implements Sink {
  private buf = '';
  readonly stopped = false;
  readonly thinking = false;

  constructor(
    private readonly push: Push,
    private readonly schema: SchemaCheck | undefined,
    private readonly last: boolean,
  ) {}

  private get holding(): boolean {
    return this.schema?.enforce === true;
  }

  text(t: string): Wait {
    this.buf += t;
    return this.holding ? undefined : this.push({ type: 'text.delta', text: t });
  }

  async end(reason: 'stop' | 'length'): Promise<Ending> {
    if (reason === 'stop') {
      const v = await verdict(this.buf, this.schema, 'structured output', this.last);
      if (v !== 'ok') return v;
    }
    if (this.holding && this.buf) await this.push({ type: 'text.delta', text: this.buf });
    return reason;
  }
}

/** One forced call to a known function: the text is its arguments, streamed as they are generated (or held, as JsonSink). */
export class CallSink implements Sink {
  private started = false;
  private args = '';
  readonly stopped = false;
  readonly thinking = false;

  constructor(
    private readonly push: Push,
    private readonly tool: FunctionTool,
    private readonly schema: SchemaCheck | undefined,
    private readonly last: boolean,
  ) {}

  private get holding(): boolean {
    return this.schema?.enforce === true;
  }

  private start(): void {
    if (this.started) return;
    this.started = true;
    this.push({ type: 'tool_call.start', index: 0, id: newCallId(), name: this.tool.name });
  }

  text(t: string): Wait {
    this.args += t;
    if (this.holding) return undefined;
    this.start();
    return this.push({ type: 'tool_call.delta', index: 0, arguments: t });
  }

  async end(reason: 'stop' | 'length'): Promise<Ending> {
    if (reason !== 'length') {
      const v = await verdict(this.args, this.schema, `arguments of ${this.tool.name}`, this.last);
      if (v !== 'ok') return v;
    }
    if (this.holding) {
      this.start();
      if (this.args) await this.push({ type: 'tool_call.delta', index: 0, arguments: this.args });
    }
    return reason === 'length' ? 'length' : 'tool_calls';
  }
}

/** Whether text is one whole JSON document. */
function wholeJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * The start of a call to one of several functions as the grammar writes it (callSchema's properties
 * in their order): group 1 is the name as written inside its quotes, group 2 is there once the
 * arguments have begun (they follow the match).
 */
const CALL_HEAD = /^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"(\s*,\s*"arguments"\s*:\s*)?/;

/**
 * A call to one of several functions: the grammar makes `{"name": …, "arguments": {…}}` with the
 * arguments of the named function. It is emitted whole once complete, since the name decides which
 * schema the arguments follow.
 */
export class ChoiceSink implements Sink {
  protected buf = '';
  readonly stopped = false;
  readonly thinking = false;

  constructor(
    protected readonly push: Push,
    private readonly schemas: ReadonlyMap<string, SchemaCheck>,
    private readonly last: boolean,
  ) {}

  text(t: string): Wait {
    this.buf += t;
    return undefined;
  }

  async end(reason: 'stop' | 'length'): Promise<Ending> {
    if (reason === 'length' && !wholeJson(this.buf)) {
      // Cut by the output limit: the call as far as it came, as a forced call's (CallSink), once
      // its name is whole. Open Responses: an item cut this way is `incomplete`, and its first
      // event carries at least the name. A call cut inside its name shows nothing. (A call whose
      // last token was the limit's is whole, and ends as a whole call does, below.) The text after the
      // head is the arguments so far: the outer object's closing brace is never in it, since
      // with it the text would be whole.
      const head = CALL_HEAD.exec(this.buf);
      if (head) {
        await this.push({ type: 'tool_call.start', index: 0, id: newCallId(), name: JSON.parse(`"${head[1]}"`) as string });
        const args = head[2] === undefined ? '' : this.buf.slice(head[0].length);
        if (args) await this.push({ type: 'tool_call.delta', index: 0, arguments: args });
      }
      return 'length';
    }
    let call: { name?: unknown; arguments?: unknown };
    try {
      call = JSON.parse(this.buf) as typeof call;
    } catch (err) {
      this.schemas
        .values()
        .next()
        .value?.onViolation('tool call', (err as Error).message, this.last);
      return this.last ? 'failed' : 'retry';
    }
    const name = String(call.name);
    const args = JSON.stringify(call.arguments ?? {});
    const v = await verdict(args, this.schemas.get(name), `arguments of ${name}`, this.last);
    if (v !== 'ok') return v;
    await this.push({ type: 'tool_call.start', index: 0, id: newCallId(), name });
    await this.push({ type: 'tool_call.delta', index: 0, arguments: args });
    return 'tool_calls';
  }
}

/**
 * `tool_choice: "auto"`: the model writes freely; if its answer opens with `<tool_call>`, the
 * grammar for a call switches on (see `triggered`) and the rest is handled as a ChoiceSink.
 * Otherwise the answer is text.
 */
export class AutoSink implements Sink {
  private held = '';
  private mode: 'undecided' | 'text' | 'call' = 'undecided';
  private readonly call: ChoiceSink;

  constructor(
    private readonly textSink: TextSink,
    push: Push,
    schemas: ReadonlyMap<string, SchemaCheck>,
    last: boolean,
  ) {
    this.call = new ChoiceSink(push, schemas, last);
  }

  get triggered(): boolean {
    return this.mode === 'call';
  }

  get stopped(): boolean {
    return this.mode === 'text' && this.textSink.stopped;
  }

  get thinking(): boolean {
    return this.mode === 'text' && this.textSink.thinking;
  }

  text(t: string): Wait {
    if (this.mode === 'text') return this.textSink.text(t);
    if (this.mode === 'call') return this.call.text(t);
    this.held += t;
    const lead = this.held.trimStart();
    if (lead.startsWith(TOOL_TRIGGER)) {
      this.mode = 'call';
      return this.call.text(lead.slice(TOOL_TRIGGER.length));
    }
    if (TOOL_TRIGGER.startsWith(lead)) return undefined;
    this.mode = 'text';
    return this.textSink.text(this.held);
  }

  async end(reason: 'stop' | 'length'): Promise<Ending> {
    if (this.mode === 'call') return this.call.end(reason);
    if (this.mode === 'undecided' && this.held) await this.textSink.text(this.held);
    return this.textSink.end(reason);
  }
}
