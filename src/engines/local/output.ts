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
  /** Called once generation ended; returns the finish reason to report. */
  end(reason: 'stop' | 'length'): Promise<'stop' | 'length' | 'tool_calls'>;
}

export const TOOL_TRIGGER = '<tool_call>';
export const newCallId = (): string => newId('call');

/** Second line of defence: the grammar should make this impossible; when it happens it is a bug to see. */
export interface SchemaCheck {
  /** Validates against the original schema (in the schema worker); `valid` is undefined when it could not be checked. */
  check(text: string): Promise<{ valid: boolean | undefined; errors?: string | undefined }>;
  onViolation(what: string, errors: unknown): void;
}

async function check(text: string, c: SchemaCheck | undefined, what: string): Promise<void> {
  if (!c) return;
  const verdict = await c.check(text);
  if (verdict.valid === false) c.onViolation(what, verdict.errors);
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

/** Structured output: the grammar makes the text JSON of the schema; it streams as text. */
export class JsonSink implements Sink {
  private buf = '';
  readonly stopped = false;
  readonly thinking = false;

  constructor(
    private readonly push: Push,
    private readonly schema: SchemaCheck | undefined,
  ) {}

  text(t: string): Wait {
    this.buf += t;
    return this.push({ type: 'text.delta', text: t });
  }

  async end(reason: 'stop' | 'length'): Promise<'stop' | 'length'> {
    if (reason === 'stop') await check(this.buf, this.schema, 'structured output');
    return reason;
  }
}

/** One forced call to a known function: the text is its arguments, streamed as they are generated. */
export class CallSink implements Sink {
  private started = false;
  private args = '';
  readonly stopped = false;
  readonly thinking = false;

  constructor(
    private readonly push: Push,
    private readonly tool: FunctionTool,
    private readonly schema: SchemaCheck | undefined,
  ) {}

  text(t: string): Wait {
    this.args += t;
    if (!this.started) {
      this.started = true;
      this.push({ type: 'tool_call.start', index: 0, id: newCallId(), name: this.tool.name });
    }
    return this.push({ type: 'tool_call.delta', index: 0, arguments: t });
  }

  async end(reason: 'stop' | 'length'): Promise<'length' | 'tool_calls'> {
    if (reason === 'length') return 'length';
    await check(this.args, this.schema, `arguments of ${this.tool.name}`);
    return 'tool_calls';
  }
}

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
  ) {}

  text(t: string): Wait {
    this.buf += t;
    return undefined;
  }

  async end(reason: 'stop' | 'length'): Promise<'stop' | 'length' | 'tool_calls'> {
    if (reason === 'length') return 'length';
    let call: { name?: unknown; arguments?: unknown };
    try {
      call = JSON.parse(this.buf) as typeof call;
    } catch (err) {
      this.schemas
        .values()
        .next()
        .value?.onViolation('tool call', (err as Error).message);
      return 'stop';
    }
    const name = String(call.name);
    const args = JSON.stringify(call.arguments ?? {});
    await check(args, this.schemas.get(name), `arguments of ${name}`);
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
  ) {
    this.call = new ChoiceSink(push, schemas);
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

  async end(reason: 'stop' | 'length'): Promise<'stop' | 'length' | 'tool_calls'> {
    if (this.mode === 'call') return this.call.end(reason);
    if (this.mode === 'undecided' && this.held) await this.textSink.text(this.held);
    return this.textSink.end(reason);
  }
}
