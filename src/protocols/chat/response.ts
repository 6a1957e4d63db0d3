import { newId, nowSeconds } from '../../core/ids.js';
import type { ApiError } from '../../core/errors.js';
import type { FinishReason, GenerationEvent, Usage, WireText } from '../../core/canonical.js';

/**
 * The server side of chat completions: canonical events as one `chat.completion` object, or as the
 * `chat.completion.chunk` payloads of a stream, exactly as the wire doc describes them.
 */

export const newCompletionId = (): string => newId('chatcmpl', '-');

export function renderUsage(u: Usage): Record<string, unknown> {
  const out: Record<string, unknown> = {
    prompt_tokens: u.input,
    completion_tokens: u.output,
    total_tokens: u.input + u.output,
    prompt_tokens_details: { cached_tokens: u.cached },
    completion_tokens_details: { reasoning_tokens: u.reasoning },
  };
  // An extension field standard clients ignore: US dollars, null when the model has no price.
  if (u.cost !== undefined) out['cost'] = u.cost;
  // Also an extension: the counts are Switchyard's estimate (the engine reported none, or nonsense).
  if (u.estimated) out['estimated'] = true;
  return out;
}

/** A count as JSON writes it (a count is never anything but finite; null if it were). */
const num = (n: number): string => (Number.isFinite(n) ? `${n}` : 'null');

/**
 * renderUsage's object as the JSON text JSON.stringify writes for it, written out: Node 20's
 * JSON.stringify looks each property up the slow way, and the usage object alone cost more
 * instructions than every other step of splicing an answer (bench/README.md).
 */
export function usageJson(u: Usage): string {
  let out = `{"prompt_tokens":${num(u.input)},"completion_tokens":${num(u.output)},"total_tokens":${num(u.input + u.output)},"prompt_tokens_details":{"cached_tokens":${num(u.cached)}},"completion_tokens_details":{"reasoning_tokens":${num(u.reasoning)}}`;
  if (u.cost !== undefined) out += `,"cost":${u.cost === null ? 'null' : num(u.cost)}`;
  if (u.estimated) out += ',"estimated":true';
  return `${out}}`;
}

/** A fast-lane object's own JSON text with the metered usage put in where the upstream's was. */
const withUsage = (t: WireText, u: Usage): string => t.before + usageJson(u) + t.after;

/** A chat.completion object, with the fields stored ones are filed under. */
export type ChatCompletionObject = Record<string, unknown> & { id: string; model: string; created: number };

/** Folds the event stream into one chat.completion object. */
export class CompletionFold {
  private text = '';
  private reasoning = '';
  private refusal = '';
  private readonly calls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }> = [];
  private usage: Usage = { input: 0, cached: 0, output: 0, reasoning: 0 };
  private finish: FinishReason = 'stop';
  /** A finish event came: the completion ended (by any reason) rather than breaking off. */
  finished = false;
  /** The fast lane's answer: the upstream's own completion, given the metered usage in result(). */
  private relayed: Record<string, unknown> | undefined;
  /** The fast lane's answer as its own JSON text around the usage, where the engine could keep it. */
  private relayedText: WireText | undefined;

  apply(ev: GenerationEvent): void {
    switch (ev.type) {
      case 'text.delta':
        this.text += ev.text;
        break;
      case 'reasoning.delta':
        this.reasoning += ev.text;
        break;
      case 'refusal.delta':
        this.refusal += ev.text;
        break;
      case 'tool_call.start':
        this.calls[ev.index] = { id: ev.id, type: 'function', function: { name: ev.name, arguments: '' } };
        break;
      case 'tool_call.delta': {
        const c = this.calls[ev.index];
        if (c) c.function.arguments += ev.arguments;
        break;
      }
      case 'usage':
        this.usage = ev.usage;
        break;
      case 'finish':
        this.finish = ev.reason;
        this.finished = true;
        break;
      case 'wire.object':
        this.relayed = ev.object;
        this.relayedText = ev.text;
        break;
    }
  }

  /**
   * The fast lane's answer as JSON text with the metered usage, where the upstream's own text was
   * kept (its model name already the catalogue's): nothing to serialize again. Else undefined, and
   * result() gives the object.
   */
  json(): string | undefined {
    const t = this.relayedText;
    return t === undefined ? undefined : withUsage(t, this.usage);
  }

  /** The chat.completion object; a stream's fold takes the id and time its chunks carried. */
  result(model: string, id = newCompletionId(), created = nowSeconds()): ChatCompletionObject {
    if (this.relayed) {
      this.relayed['model'] = model;
      this.relayed['usage'] = renderUsage(this.usage);
      return this.relayed as ChatCompletionObject;
    }
    const calls = this.calls.filter(Boolean);
    // OpenAI's content is null for an answer that is only a refusal or only tool calls.
    const message: Record<string, unknown> = {
      role: 'assistant',
      content: (calls.length || this.refusal) && !this.text ? null : this.text,
      refusal: this.refusal || null,
    };
    if (this.reasoning) message['reasoning_content'] = this.reasoning;
    if (calls.length) message['tool_calls'] = calls;
    return {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message, logprobs: null, finish_reason: this.finish }],
      usage: renderUsage(this.usage),
    };
  }
}

/**
 * Renders the event stream as the `data:` payloads of a chat-completions stream. The frame around a
 * delta is built once per stream; each event costs one small JSON.stringify of its own text.
 */
/** A tool call's opening delta member: its index, id, and name with no arguments yet. */
const toolCallStart = (ev: { index: number; id: string; name: string }): string =>
  `"tool_calls":[{"index":${ev.index},"id":${JSON.stringify(ev.id)},"type":"function","function":{"name":${JSON.stringify(ev.name)},"arguments":""}}]`;

export class ChunkRenderer {
  private readonly head: string;
  private readonly tail: string;
  private usage: Usage | undefined;
  private started = false;
  /** The stream is the fast lane's (its frames are the upstream's own). */
  private relayed = false;
  /** The fast lane's chunk for the usage (the upstream's own), else one is made here. */
  private usageChunk: Record<string, unknown> | undefined;
  /** That chunk as its own JSON text around the usage, where the engine could keep it. */
  private usageText: WireText | undefined;
  /** The id and creation time every chunk carries (a stored stream is kept under them). */
  readonly id = newCompletionId();
  readonly created = nowSeconds();

  constructor(
    model: string,
    private readonly includeUsage: boolean,
  ) {
    this.head = `{"id":"${this.id}","object":"chat.completion.chunk","created":${this.created},"model":${JSON.stringify(model)},"choices":[`;
    this.tail = includeUsage ? '],"usage":null}' : ']}';
  }

  private choice(delta: string, finish: string | null = null): string {
    return `${this.head}{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finish === null ? 'null' : `"${finish}"`}}${this.tail}`;
  }

  /** The first chunk: the assistant's role, before any content. */
  first(): string {
    return this.choice('{"role":"assistant","content":""}');
  }

  /**
   * The frames for one event ('' when it shows nothing yet): the first starts with the role chunk,
   * unless the stream is the fast lane's, whose frames are the upstream's own and pass as they are.
   */
  frames(ev: GenerationEvent): string {
    if (ev.type === 'wire.frames') {
      this.started = true;
      this.relayed = true;
      return ev.frames;
    }
    if (ev.type === 'wire.object') {
      this.usageChunk = ev.object;
      this.usageText = ev.text;
      return '';
    }
    // The fast lane's frames carry the finish chunk themselves.
    if (this.relayed && ev.type === 'finish') return '';
    let out = '';
    if (!this.started) {
      this.started = true;
      // An answer that opens with a tool call opens as OpenAI's does: the role, `content: null` and
      // the call in one chunk. An empty string there reads as a text part to clients (the AI SDK
      // opens and closes an empty one).
      if (ev.type === 'tool_call.start') return `data: ${this.choice(`{"role":"assistant","content":null,${toolCallStart(ev)}}`)}\n\n`;
      out = `data: ${this.first()}\n\n`;
    }
    const line = this.event(ev);
    return line === undefined ? out : `${out}data: ${line}\n\n`;
  }

  /** The chunk for one event, or undefined (usage comes at the end, in `last`). */
  event(ev: GenerationEvent): string | undefined {
    switch (ev.type) {
      case 'text.delta':
        return this.choice(`{"content":${JSON.stringify(ev.text)}}`);
      case 'reasoning.delta':
        return this.choice(`{"reasoning_content":${JSON.stringify(ev.text)}}`);
      case 'refusal.delta':
        return this.choice(`{"refusal":${JSON.stringify(ev.text)}}`);
      case 'tool_call.start':
        return this.choice(`{${toolCallStart(ev)}}`);
      case 'tool_call.delta':
        return this.choice(`{"tool_calls":[{"index":${ev.index},"function":{"arguments":${JSON.stringify(ev.arguments)}}}]}`);
      case 'usage':
        this.usage = ev.usage;
        return undefined;
      case 'finish':
        return this.choice('{}', ev.reason);
      case 'message.phase':
      case 'reasoning.signature':
        // Chat completions have no place for them.
        return undefined;
      case 'wire.frames':
      case 'wire.object':
        // The fast lane's own events: written by the route as they are (see api/chat.ts).
        return undefined;
    }
  }

  /** What ends a complete stream, framed: the usage chunk (when asked for) and `[DONE]`. */
  last(): string {
    let out = '';
    if (!this.started) out = `data: ${this.first()}\n\n`;
    if (this.includeUsage && this.usage) {
      const t = this.usageText;
      // The fast lane's usage chunk as the upstream wrote it where the engine kept its text, else
      // serialized; the canonical lane's from its own frame.
      const chunk =
        t !== undefined
          ? withUsage(t, this.usage)
          : this.usageChunk
            ? JSON.stringify({ ...this.usageChunk, usage: renderUsage(this.usage) })
            : `${this.head}],"usage":${usageJson(this.usage)}}`;
      out += `data: ${chunk}\n\n`;
    }
    return `${out}data: [DONE]\n\n`;
  }

  /** A failure mid-stream: the SDKs throw on a data line that carries `error`. */
  static error(e: ApiError): string {
    return JSON.stringify(e.toBody());
  }
}
