import { ApiError } from '../../core/errors.js';
import type { FinishReason, WireText } from '../../core/canonical.js';
import { obj, str, textNestsDeeper, type Clean, type ReportedUsage } from '../reader.js';
import { CallIndexes, FINISH, readChunk } from './client.js';
import { SseInput } from '../sse-input.js';
import { nowSeconds } from '../../core/ids.js';
import type { OutputLimit } from '../../core/estimate.js';
import { newCompletionId } from './response.js';

/**
 * The same-protocol fast lane of chat completions (docs/decisions.md, "The same-protocol fast
 * lane"): an upstream's chat-completions stream passed on to a chat-completions client chunk for
 * chunk, instead of being turned into canonical events and rendered again. Every event is parsed
 * (or matched against a template learned from one, which gives the same: see `Template`), so what
 * is counted is exactly what the client's own parser will read (output for the limit and the
 * usage tally, the finish reason, usage, errors), and written back as one `data:` frame with
 * the catalogue's model name (spliced into the upstream's own text where that is exact, see
 * `renamed`; re-serialized where it is not). The usage chunk and `[DONE]` are held back (the route sends them once
 * the usage record is stored, with the cost); an event past the output limit ends the stream with a
 * `length` finish; only complete events are released, so nothing half-sent can join a later frame.
 */

/** Delta fields read as output, and whether they are reasoning; any other non-null field is counted too. */
const KNOWN_DELTA_FIELDS = new Set(['role', 'content', 'reasoning_content', 'reasoning', 'tool_calls', 'refusal']);

/**
 * Text JSON.stringify writes other than as it is (a quote, a backslash, a control character, a lone
 * surrogate): a chunk whose text has none of it can be matched against a template (see `Template`).
 */
const ESCAPED = /["\\\u0000-\u001f\ud800-\udfff]/u;

/** Templates learned per stream at most (an upstream whose chunks never repeat their shape stops costing one). */
const MAX_TEMPLATES = 3;

/**
 * A content chunk's text, split around its `delta.content` text, as JSON.stringify writes it (the
 * upstream's, and ours with the catalogue's model name). Most upstreams write every content chunk of
 * a stream the same way but for the text, so a chunk that is `prefix + text + suffix`, with a text
 * JSON.stringify would write as it is, is exactly the learned chunk with that text: its output is
 * the text's length and its frame `outPrefix + text + outSuffix`, with no JSON.parse.
 */
interface Template {
  prefix: string;
  suffix: string;
  outPrefix: string;
  outSuffix: string;
}

/**
 * Whether read() would count nothing of this chunk but its `delta.content`: no error, no usage, no
 * finish reason, and no other delta field with output (kept in step with read() and count()).
 */
function contentOnly(chunk: Record<string, unknown>, choice: Record<string, unknown>, delta: Record<string, unknown>): boolean {
  if ((chunk['error'] !== undefined && chunk['error'] !== null) || obj(chunk['usage']) || str(choice['finish_reason'])) return false;
  for (const key in delta) {
    const v = delta[key];
    if (key === 'content' || key === 'role' || v == null) continue;
    if ((key === 'reasoning_content' || key === 'reasoning' || key === 'refusal') && v === '') continue;
    if (key === 'tool_calls' && Array.isArray(v) && v.length === 0) continue;
    return false;
  }
  return true;
}

/** The end of the JSON string that starts at `at` (its opening quote) in valid JSON text. */
function stringEnd(text: string, at: number): number {
  let i = at + 1;
  for (;;) {
    const c = text.charCodeAt(i);
    if (c === 92) i += 2;
    else if (c === 34) return i + 1;
    else i++;
  }
}

/** The end of the JSON value that starts at `at` in valid JSON text (JSON.parse read it). */
function valueEnd(text: string, at: number): number {
  const c = text.charCodeAt(at);
  if (c === 34) return stringEnd(text, at);
  if (c === 123 || c === 91) {
    let depth = 0;
    for (let i = at; i < text.length;) {
      const d = text.charCodeAt(i);
      if (d === 34) {
        i = stringEnd(text, i);
        continue;
      }
      if (d === 123 || d === 91) depth++;
      else if ((d === 125 || d === 93) && --depth === 0) return i + 1;
      i++;
    }
    return text.length;
  }
  // A number, true, false or null: up to the next delimiter.
  let i = at;
  for (; i < text.length; i++) {
    const d = text.charCodeAt(i);
    if (d === 44 || d === 125 || d === 93 || d === 32 || d === 9 || d === 10 || d === 13) break;
  }
  return i;
}

/**
 * Where the value of `key` (a JSON string, quotes included) starts, when the key occurs in `text`
 * exactly once and a colon follows it; else -1. In text without `\u` escapes a key has one
 * spelling, so for a key the parsed object has at its top level, that one occurrence is it.
 */
function valueOf(text: string, key: string): number {
  const at = text.indexOf(key);
  if (at < 0 || text.includes(key, at + key.length)) return -1;
  const colon = skipSpace(text, at + key.length);
  return text.charCodeAt(colon) === 58 ? skipSpace(text, colon + 1) : -1;
}

/** The first position from `i` on that is not JSON white space. */
function skipSpace(text: string, i: number): number {
  for (let c = text.charCodeAt(i); c === 32 || c === 9 || c === 10 || c === 13; c = text.charCodeAt(++i));
  return i;
}

/** Top-level members whose values are Switchyard's own in what the client gets: the catalogue's model name, and the completion's id and time. */
interface OwnFields {
  model: string;
  id: string;
  created: string;
}

/**
 * An object's own JSON text (which JSON.parse read as `parsed`) with Switchyard's `model`, `id` and
 * `created` in place of the upstream's values: the client's chunk or answer without serializing the
 * parsed object again, which cost as much as the parse. Only where that is exact: no `\u` escape
 * anywhere, and each key written once, where the object has it at its top level (a key cannot be
 * spelled another way without an escape, so that one occurrence is the member JSON.parse read).
 * With `usage`, the text is split where the usage goes (the upstream's usage value left out; where
 * it sent none, a `usage` member is added at the end). Else undefined, and the caller serializes
 * the parsed object. Numbers keep the upstream's spelling, as in any pass-through.
 */
function spliced(text: string, parsed: Record<string, unknown>, own: OwnFields, usage: boolean): WireText | undefined {
  if (parsed['model'] === undefined || parsed['id'] === undefined || parsed['created'] === undefined || text.includes('\\u'))
    return undefined;
  const modelAt = valueOf(text, '"model"');
  const idAt = modelAt < 0 ? -1 : valueOf(text, '"id"');
  const createdAt = idAt < 0 ? -1 : valueOf(text, '"created"');
  if (createdAt < 0) return undefined;
  // Values to put in, by where they start; `null` marks where the usage goes.
  const cuts: Array<{ at: number; end: number; json: string | null }> = [
    { at: modelAt, end: valueEnd(text, modelAt), json: own.model },
    { at: idAt, end: valueEnd(text, idAt), json: own.id },
    { at: createdAt, end: valueEnd(text, createdAt), json: own.created },
  ];
  let key = '';
  if (usage) {
    if (parsed['usage'] !== undefined) {
      const at = valueOf(text, '"usage"');
      if (at < 0) return undefined;
      cuts.push({ at, end: valueEnd(text, at), json: null });
    } else {
      // The object's closing brace is the text's last one (only white space may follow it); the
      // object has members (a model at least), so the new one follows a comma.
      const at = text.lastIndexOf('}');
      cuts.push({ at, end: at, json: null });
      key = ',"usage":';
    }
  }
  cuts.sort((a, b) => a.at - b.at);
  let before = '';
  let after: string | undefined;
  let from = 0;
  for (const c of cuts) {
    const piece = text.slice(from, c.at);
    if (c.json === null) {
      before += piece + key;
      after = '';
    } else if (after === undefined) before += piece + c.json;
    else after += piece + c.json;
    from = c.end;
  }
  const rest = text.slice(from);
  return after === undefined ? { before: before + rest, after: '' } : { before, after: after + rest };
}

/**
 * Puts in the members of a `chat.completion` that OpenAI's schema requires and some upstreams
 * leave out (`choices[].logprobs` and `choices[].message.refusal` as null; `object`, a choice's
 * `index`, the message's `role`): a client
 * that validates the answer, or reads them, gets the same shape from every upstream. True when
 * none was missing (the upstream's text can then go on as it is).
 */
function completeAnswer(answer: Record<string, unknown>): boolean {
  let whole = filled(answer, 'object', 'chat.completion');
  const choices = answer['choices'];
  if (!Array.isArray(choices)) return whole;
  for (const c of choices) {
    const choice = obj(c);
    if (!choice) continue;
    whole = filled(choice, 'logprobs', null) && whole;
    whole = filled(choice, 'index', 0) && whole;
    const message = obj(choice['message']);
    if (!message) continue;
    whole = filled(message, 'refusal', null) && whole;
    whole = filled(message, 'role', 'assistant') && whole;
  }
  return whole;
}

/** Puts `value` at `key` where `o` has no such member; true when it had one (nothing changed). */
function filled(o: Record<string, unknown>, key: string, value: unknown): boolean {
  if (o[key] !== undefined) return true;
  o[key] = value;
  return false;
}

/**
 * Puts in the members of a `chat.completion.chunk` that OpenAI's schema has and some upstreams leave
 * out: `choices[].index`, `choices[].logprobs` and `choices[].finish_reason` (null), `object`, and,
 * where the client asked for the usage
 * (`stream_options.include_usage`), `usage` as null in every chunk before the usage chunk
 * (openai-wire.md). Where it did not ask, a `usage: null` is taken out: the upstream writes it
 * because Switchyard always asks for the usage (to bill it). A client then reads the same chunks
 * from every upstream, and on either lane. True when nothing was changed (the upstream's text can
 * then go on as it is).
 */
function completeChunk(chunk: Record<string, unknown>, usage: boolean): boolean {
  let whole = filled(chunk, 'object', 'chat.completion.chunk');
  if (usage) whole = filled(chunk, 'usage', null) && whole;
  else if (chunk['usage'] === null) {
    // JSON.stringify leaves out a member set to undefined.
    chunk['usage'] = undefined;
    whole = false;
  }
  const choices = chunk['choices'];
  if (!Array.isArray(choices)) return whole;
  for (const c of choices) {
    const choice = obj(c);
    if (!choice) continue;
    // The SDKs' stream helpers read each choice by its index and its finish by finish_reason.
    whole = filled(choice, 'index', 0) && whole;
    whole = filled(choice, 'logprobs', null) && whole;
    whole = filled(choice, 'finish_reason', null) && whole;
  }
  return whole;
}

/** The last catalogue id written as JSON, kept: most requests in a row name the same model. */
let lastModel = '';
let lastModelJson = '""';
function modelJsonOf(model: string): string {
  if (model !== lastModel) {
    lastModel = model;
    lastModelJson = JSON.stringify(model);
  }
  return lastModelJson;
}

export class ChatRelay {
  usage: ReportedUsage | undefined;
  finish: FinishReason = 'stop';
  /** `[DONE]` came. */
  done = false;
  /** A non-stream answer's text, where it can be given as it came (see `answer`). */
  answerText: WireText | undefined;
  /** The upstream's usage chunk's text, where it can be given as it came (see `usageFrame`). */
  usageText: WireText | undefined;
  /** The stream failed (an upstream error or a malformed event): thrown by the engine once the frames before it are out. */
  failure: ApiError | undefined;
  /** A chunk carried a finish reason (else one is written before the end). */
  private finished = false;
  /** Which call each tool-call entry belongs to, found as the canonical lane finds it. */
  private readonly callIndexes = new CallIndexes();
  /** Whether each tool call (by index) is passed on. */
  private readonly passed = new Map<number, boolean>();
  /** Whether the legacy `function_call` of this stream is passed on (undefined: none started). */
  private functionCall: boolean | undefined;
  /** Calls passed on, and calls taken out (a finish for tool calls none of which passed is a stop). */
  callsPassed = 0;
  callsSuppressed = 0;
  /** Text of events not yet complete. */
  private pending = '';
  private readonly input = new SseInput();
  /** The upstream's usage chunk, held back for the route to send with the metered usage. */
  private usageChunk: Record<string, unknown> | undefined;
  /**
   * The completion's id and time, Switchyard's own as on the canonical lane: an upstream's ids need
   * not be unique (Ollama draws them from a thousand) and its clock is not ours.
   */
  readonly id: string;
  readonly created: number;
  /** The catalogue id, the id and the time as JSON text. */
  private readonly own: OwnFields;
  private template: Template | undefined;
  /** A delta has gone out (with the role: see completed). */
  private roleSent = false;

  /** The stream's first delta has gone out, with the assistant's role. */
  get opened(): boolean {
    return this.roleSent;
  }
  private templates = 0;
  /** Content-only chunks parsed so far: a template is learned from the second (a one-chunk answer never pays for one). */
  private plainChunks = 0;

  constructor(
    /** The catalogue id the client asked for, which every chunk names. */
    private readonly model: string,
    private readonly clean: Clean,
    /** The output the answer may have, counted here; past it the answer is cut (the upstream should have stopped). */
    readonly limit: OutputLimit,
    /** Largest event accepted from the upstream (characters held at once, which bounds its bytes too). */
    private readonly maxEventChars: number,
    /** The error for an event past it. */
    private readonly tooLarge: () => ApiError,
    /**
     * The tools the request lets the model call (core/canonical.ts, callableTools): a call to any
     * other is taken out of the chunks, as the canonical lane suppresses it. Undefined: every tool
     * may be called (no check).
     */
    private readonly callable: ReadonlySet<string> | undefined = undefined,
    /** The client asked for the usage in its stream: every chunk before the usage chunk has `usage: null`. */
    private readonly usageNull = false,
    /** The completion's id and time (given by tests that compare two relays' frames). */
    ids: { id: string; created: number } = { id: newCompletionId(), created: nowSeconds() },
  ) {
    this.id = ids.id;
    this.created = ids.created;
    // An id is letters, digits and a dash: written as it is.
    this.own = { model: modelJsonOf(model), id: `"${this.id}"`, created: `${this.created}` };
  }

  /** The output limit was reached: the frames stop there and a `length` finish was written. */
  get capped(): boolean {
    return this.limit.capped;
  }

  /** The frames for the events completed by this text ('' while none is complete). */
  push(text: string): string {
    if (this.done || this.capped || this.failure) return '';
    // The scans below know LF and CRLF line ends; a lone CR is made an LF first (and a BOM dropped).
    text = this.input.push(text);
    // Only the new text is searched for the end of an event: a long event that comes in many
    // pieces is joined once, when it completes, not rescanned with every piece.
    const nl = text.lastIndexOf('\n');
    if (nl < 0) {
      this.pending += text;
      if (this.pending.length > this.maxEventChars) throw this.tooLarge();
      return '';
    }
    const all = this.pending + text;
    // Events end with a blank line (`\n\n`, or `\r\n\r\n`).
    let end = -1;
    for (let at = all.lastIndexOf('\n'); at > 0; at = all.lastIndexOf('\n', at - 1)) {
      const before = all.charCodeAt(at - 1) === 13 ? at - 2 : at - 1;
      if (before >= 0 && all.charCodeAt(before) === 10) {
        end = at;
        break;
      }
      // A line that is not blank: the event it ends may still be complete further back.
      if (all.length - at > this.maxEventChars) break;
    }
    if (end < 0) {
      this.pending = all;
      if (all.length > this.maxEventChars) throw this.tooLarge();
      return '';
    }
    this.pending = all.slice(end + 1);
    if (this.pending.length > this.maxEventChars) throw this.tooLarge();
    return this.events(all.slice(0, end + 1));
  }

  /** Complete events, read one by one; the frames to send for them. */
  private events(text: string): string {
    let out = '';
    // Nearly every event has one data line: it is kept as it is, and only a second one makes a list.
    let data: string | undefined;
    let more: string[] | undefined;
    let pos = 0;
    while (pos < text.length && !this.done && !this.capped && !this.failure) {
      let nl = text.indexOf('\n', pos);
      if (nl < 0) nl = text.length;
      const lineEnd = nl > pos && text.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
      if (lineEnd === pos) {
        // A blank line: the event is complete.
        if (data !== undefined) out += this.event(more ? [data, ...more].join('\n') : data);
        data = undefined;
        more = undefined;
      } else if (text.startsWith('data:', pos)) {
        const line = text.slice(text.charCodeAt(pos + 5) === 32 ? pos + 6 : pos + 5, lineEnd);
        if (data === undefined) data = line;
        else (more ??= []).push(line);
      }
      // Comments, `event:` and `id:` lines carry nothing in a chat stream.
      pos = nl + 1;
    }
    return out;
  }

  /** One event's data: its frame, or '' when it is held back or ends the stream. */
  private event(payload: string): string {
    if (payload === '[DONE]') {
      this.done = true;
      // Every stream ends with a finish reason, as the canonical lane's does.
      return this.finished ? '' : `data: ${this.finishFrame(this.finish)}\n\n`;
    }
    const t = this.template;
    const end = payload.length - (t?.suffix.length ?? 0);
    // Compared as slices: string equality is about twice as fast as startsWith here.
    if (t !== undefined && end >= t.prefix.length && payload.slice(0, t.prefix.length) === t.prefix && payload.slice(end) === t.suffix) {
      const text = payload.slice(t.prefix.length, end);
      if (!ESCAPED.test(text)) {
        // What read() counts for such a chunk: its text, nothing else. Past the limit, what fits
        // goes out, then the `length` finish.
        const n = this.limit.admit(text, false);
        if (n === text.length) return `data: ${t.outPrefix}${text}${t.outSuffix}\n\n`;
        const kept = text.slice(0, n);
        return `${kept === '' ? '' : `data: ${t.outPrefix}${kept}${t.outSuffix}\n\n`}data: ${this.finishFrame('length')}\n\n`;
      }
    }
    let chunk: Record<string, unknown> | undefined;
    try {
      // Nested past what is serialized again (the stack would overflow): as malformed.
      chunk = textNestsDeeper(payload) ? undefined : obj(JSON.parse(payload));
    } catch {
      chunk = undefined;
    }
    // Calls to tools the request does not allow are taken out; the chunk is then written anew.
    let changed = false;
    const charsBefore = this.limit.chars;
    try {
      if (!chunk) throw new ApiError('upstream_error', 'The upstream sent a malformed stream event.');
      if (this.callable !== undefined) {
        const left = this.suppress(chunk);
        // A chunk that carried nothing but calls taken out is not sent at all.
        if (left === 'nothing') return '';
        changed = left === 'changed';
      }
      this.read(chunk, 'delta');
    } catch (err) {
      // The frames before it still go out, as the canonical lane sends the events before it.
      this.failure = err instanceof ApiError ? err : new ApiError('upstream_error', 'The upstream sent a malformed stream event.');
      return '';
    }
    if (this.capped) {
      // The chunk that reached the limit goes out with what of it fits (read() cut it there), as
      // the canonical lane cuts a delta; its usage waits for the metered usage, like every usage chunk.
      if (this.limit.chars === charsBefore) return `data: ${this.finishFrame('length')}\n\n`;
      if (obj(chunk['usage'])) chunk['usage'] = null;
      this.completed(chunk, this.usageNull);
      this.ours(chunk);
      return `data: ${JSON.stringify(chunk)}\n\ndata: ${this.finishFrame('length')}\n\n`;
    }
    if (obj(chunk['usage'])) {
      const choices = chunk['choices'];
      // A usage chunk of its own (no choices) goes out as the upstream wrote it, with the metered
      // usage, where its text can be kept exactly (one line, as a frame must be: see aroundUsage).
      const whole = this.completed(chunk, false);
      this.usageText =
        !changed && whole && Array.isArray(choices) && choices.length === 0 && !payload.includes('\n')
          ? spliced(payload, chunk, this.own, true)
          : undefined;
      this.ours(chunk);
      // The usage goes out once metered (route); a chunk that also carries choices goes on without it.
      this.usageChunk = { ...chunk, choices: [] };
      if (!Array.isArray(choices) || choices.length === 0) return '';
      chunk['usage'] = null;
      return `data: ${JSON.stringify(chunk)}\n\n`;
    }
    // Judged on the chunk as the upstream wrote it; the template's frame is the completed chunk's.
    const text = !changed && this.templates < MAX_TEMPLATES ? this.templateText(payload, chunk) : undefined;
    const whole = this.completed(chunk, this.usageNull);
    const renamed = changed || !whole ? undefined : this.renamed(payload, chunk);
    let frame = renamed;
    if (frame === undefined) {
      this.ours(chunk);
      frame = JSON.stringify(chunk);
    }
    if (text !== undefined) this.learn(payload, frame, text);
    return `data: ${frame}\n\n`;
  }

  /**
   * The text of a chunk a template can be learned from, or undefined: a content-only chunk (its
   * output, as read() counts it, is its `delta.content` alone: no finish reason, usage or error),
   * whose text JSON.stringify writes as it is, and whose payload is exactly what JSON.stringify
   * writes for it (no spaces, numbers spelled as JavaScript spells them, no duplicate keys). The
   * first such chunk of a stream is only counted: a template pays off from the third.
   */
  private templateText(payload: string, chunk: Record<string, unknown>): string | undefined {
    const choices = chunk['choices'];
    const choice = Array.isArray(choices) ? obj(choices[0]) : undefined;
    const delta = obj(choice?.['delta']);
    const text = delta?.['content'];
    if (!delta || typeof text !== 'string' || text === '' || ESCAPED.test(text) || !contentOnly(chunk, choice!, delta)) return undefined;
    if (++this.plainChunks < 2) return undefined;
    this.templates++;
    return JSON.stringify(chunk) === payload ? text : undefined;
  }

  /**
   * The template of a chunk templateText accepted: its payload and its frame (the same chunk with
   * the catalogue's model name, as JSON.stringify writes it: `renamed` gives exactly that for such
   * a payload) split around the text. In JSON.stringify's output `"content":"` can only start the
   * key of an object's `content` string, so where `"content":"<text>"` occurs once it is the delta's
   * (the model name put into the frame is a JSON string, inside which it cannot occur).
   */
  private learn(payload: string, frame: string, text: string): void {
    const needle = `"content":"${text}"`;
    const at = payload.indexOf(needle);
    const outAt = frame.indexOf(needle);
    if (at < 0 || outAt < 0 || payload.includes(needle, at + 1) || frame.includes(needle, outAt + 1)) return;
    const slot = at + 11;
    const outSlot = outAt + 11;
    this.template = {
      prefix: payload.slice(0, slot),
      suffix: payload.slice(slot + text.length),
      outPrefix: frame.slice(0, outSlot),
      outSuffix: frame.slice(outSlot + text.length),
    };
  }

  /**
   * The event's own text with Switchyard's model name, id and time in place of the upstream's, or
   * undefined where that could differ from re-serializing the parsed chunk (which the caller then
   * does): serializing again cost as much as parsing, on every chunk. Exact only when the text is
   * one line (a data payload of several lines would end the client's SSE line; a payload holds no
   * CR, since push() made every lone CR a line end) and `spliced` finds each member exactly. A chunk
   * with a tool call's `id` is serialized (its key is then written twice).
   */
  private renamed(payload: string, chunk: Record<string, unknown>): string | undefined {
    if (payload.includes('\n')) return undefined;
    return spliced(payload, chunk, this.own, false)?.before;
  }

  /**
   * completeChunk, and the assistant's role in the first delta of the stream where the upstream
   * left it out: the openai SDK's stream helpers fail without it ("missing role for choice 0"), and
   * the canonical lane's first chunk has it. True when nothing was changed.
   */
  private completed(chunk: Record<string, unknown>, usage: boolean): boolean {
    let whole = completeChunk(chunk, usage);
    if (!this.roleSent) {
      const choices = chunk['choices'];
      const delta = Array.isArray(choices) ? obj(obj(choices[0])?.['delta']) : undefined;
      if (delta) {
        this.roleSent = true;
        whole = filled(delta, 'role', 'assistant') && whole;
      }
    }
    return whole;
  }

  /** Switchyard's model name, id and time in a parsed chunk or answer, for serializing it. */
  private ours(o: Record<string, unknown>): void {
    o['id'] = this.id;
    o['created'] = this.created;
    o['model'] = this.model;
  }

  /**
   * The chunk the usage goes out in: the upstream's own usage chunk when it sent one (its id and
   * extra fields kept), else one made from the stream's id and time. Its text, where kept, is
   * `usageText`.
   */
  usageFrame(): Record<string, unknown> {
    const chunk = this.usageChunk ?? { id: this.id, object: 'chat.completion.chunk', created: this.created, choices: [] };
    this.ours(chunk);
    return chunk;
  }

  /**
   * Whether a whole answer calls a tool the request does not allow (a call without a name is not
   * allowed), or has choices after the first, which the canonical lane leaves out.
   */
  private callsDisallowed(answer: Record<string, unknown>): boolean {
    const choices = answer['choices'];
    if (Array.isArray(choices) && choices.length > 1) return true;
    const message = obj(obj(Array.isArray(choices) ? choices[0] : undefined)?.['message']);
    const allowed = (fn: unknown) => this.callable!.has(str(obj(fn)?.['name']) ?? '');
    const legacy = message?.['function_call'];
    if (legacy !== undefined && legacy !== null && !allowed(legacy)) return true;
    const calls = message?.['tool_calls'];
    return Array.isArray(calls) && calls.some((c) => !allowed(obj(c)?.['function']));
  }

  /**
   * A whole non-stream answer: read like the stream's chunks. Returns false when the answer goes
   * past the output limit or calls a tool the request does not allow, which only the canonical
   * lane can cut or suppress. `text`, the JSON text it was
   * parsed from, is given where the parsed answer is still exactly that (nothing scrubbed out of
   * it): the client's answer is then made from the text (`answerText`).
   */
  answer(body: unknown, text: string | undefined): boolean {
    const answer = obj(body);
    if (!answer) throw new ApiError('upstream_error', 'The upstream sent a reply that is not a JSON object.');
    // A call to a tool the request does not allow: the canonical lane suppresses it.
    if (this.callable !== undefined && this.callsDisallowed(answer)) return false;
    this.read(answer, 'message');
    // An answer that lacked a member the client's schema requires is serialized with it.
    const whole = completeAnswer(answer);
    if (text !== undefined && whole && !this.capped) this.answerText = spliced(text, answer, this.own, true);
    this.ours(answer);
    return !this.capped;
  }

  /**
   * Takes out of a stream chunk the tool calls the request does not allow (their start, which
   * names the tool, and every later delta of the same call) and makes a finish for tool calls none
   * of which passed a stop, as the canonical lane does. A call without a name is not allowed (the
   * canonical lane starts it with an empty name). A request has one choice (n > 1 is refused), so
   * choices after the first, which neither lane reads, are taken out too. 'nothing' when the chunk
   * is left with nothing to send (no other delta field, finish, usage or error).
   */
  private suppress(chunk: Record<string, unknown>): 'same' | 'changed' | 'nothing' {
    const choices = chunk['choices'];
    let changed = false;
    if (Array.isArray(choices) && choices.length > 1) {
      chunk['choices'] = [choices[0]];
      changed = true;
    }
    const choice = Array.isArray(choices) ? obj(choices[0]) : undefined;
    const delta = obj(choice?.['delta']);
    const calls = delta?.['tool_calls'];
    if (delta && Array.isArray(calls) && calls.length > 0) {
      const kept: unknown[] = [];
      calls.forEach((call, position) => {
        if (this.callPassed(obj(call), position)) kept.push(call);
      });
      if (kept.length < calls.length) {
        changed = true;
        // JSON.stringify leaves out a field set to undefined.
        delta['tool_calls'] = kept.length > 0 ? kept : undefined;
      }
    }
    // The legacy single call: judged by its name where it starts, its later pieces with it.
    const legacy = obj(delta?.['function_call']);
    if (delta && legacy) {
      const name = str(legacy['name']);
      if (name !== undefined || this.functionCall === undefined) {
        this.functionCall = this.callable!.has(name ?? '');
        if (this.functionCall) this.callsPassed++;
        else this.callsSuppressed++;
      }
      if (!this.functionCall) {
        delta['function_call'] = undefined;
        changed = true;
      }
    }
    if (choice && choice['finish_reason'] === 'tool_calls' && this.callsPassed === 0 && this.callsSuppressed > 0) {
      choice['finish_reason'] = 'stop';
      changed = true;
    }
    if (!changed) return 'same';
    const empty =
      delta !== undefined &&
      Object.values(delta).every((v) => v == null || v === '') &&
      (choice!['finish_reason'] ?? null) === null &&
      !obj(chunk['usage']) &&
      (chunk['error'] ?? null) === null;
    return empty ? 'nothing' : 'changed';
  }

  /**
   * Whether a streamed tool-call entry is passed on: its call (protocols/chat/client.ts,
   * `CallIndexes`) is judged once, where it starts, by its name. An entry whose index is not a
   * number (which fails the canonical lane's stream) is judged by its own name.
   */
  private callPassed(c: Record<string, unknown> | undefined, position: number): boolean {
    if (!c) return false;
    const name = str(obj(c['function'])?.['name']);
    const index = this.callIndexes.of(c, position);
    if (typeof index !== 'number') return this.callable!.has(name ?? '');
    if (!this.callIndexes.start(index, str(c['id']))) return this.passed.get(index) ?? false;
    const passed = this.callable!.has(name ?? '');
    this.passed.set(index, passed);
    if (passed) this.callsPassed++;
    else this.callsSuppressed++;
    return passed;
  }

  /**
   * Counts the output at `holder[key]` (a string, or any other value as its JSON text). Whatever of
   * it does not pass is taken out of a stream's delta (`cut`): a string is cut to what passes,
   * anything else removed. A whole answer is left as it is (it goes to the canonical lane).
   */
  private take(holder: Record<string, unknown>, key: string, cut: boolean, reasoning = false): void {
    const v = holder[key];
    const text = typeof v === 'string' ? v : JSON.stringify(v);
    const n = this.limit.admit(text, reasoning);
    if (n === text.length || !cut) return;
    // JSON.stringify leaves out a member set to undefined.
    holder[key] = typeof v === 'string' && n > 0 ? v.slice(0, n) : undefined;
  }

  /**
   * A parsed chunk (`delta`) or answer (`message`): error, usage, and the output counted as the
   * canonical lane counts it (reasoning, content and each tool call's arguments are a delta each),
   * plus whatever else the client would read there (a refusal, content parts, audio). A chunk that
   * reaches the limit is cut there: what comes after it in the chunk is taken out, and so is its
   * finish reason (the stream ends with `length`).
   */
  private read(chunk: Record<string, unknown>, field: 'delta' | 'message'): void {
    const { usage, choice } = readChunk(chunk, this.clean);
    if (usage) this.usage = usage;
    if (!choice) return;
    const d = obj(choice[field]);
    const cut = field === 'delta';
    if (d) {
      const reasoningKey =
        str(d['reasoning_content']) !== undefined ? 'reasoning_content' : str(d['reasoning']) !== undefined ? 'reasoning' : undefined;
      if (reasoningKey !== undefined) this.take(d, reasoningKey, cut, true);
      if (d['content'] != null) this.take(d, 'content', cut);
      if (str(d['refusal']) !== undefined) this.take(d, 'refusal', cut);
      const calls = d['tool_calls'];
      if (Array.isArray(calls)) {
        // As in the canonical lane, a call's arguments are output; its start (id, name) is not, and
        // no call starts once the limit is reached.
        const kept = calls.filter((call) => {
          if (this.capped) return false;
          const fn = obj(obj(call)?.['function']);
          if (fn && str(fn['arguments']) !== undefined) this.take(fn, 'arguments', cut);
          return true;
        });
        if (cut && kept.length < calls.length) d['tool_calls'] = kept.length > 0 ? kept : undefined;
      }
      for (const key in d) {
        if (KNOWN_DELTA_FIELDS.has(key) || d[key] == null) continue;
        this.take(d, key, cut);
      }
    }
    if (this.capped) {
      if (cut) choice['finish_reason'] = null;
      return;
    }
    const finish = str(choice['finish_reason']);
    if (finish) {
      this.finish = FINISH[finish] ?? 'stop';
      this.finished = true;
    }
  }

  /**
   * Whether a stream that ended here was complete: its [DONE] came, or at least its finish reason
   * (some servers close the stream after the finish chunk without a [DONE]).
   */
  get complete(): boolean {
    return this.done || this.finished;
  }

  /** The chunk that ends a stream the upstream ended without one, or a capped one, in the stream's own id and time. */
  private finishFrame(reason: FinishReason): string {
    this.finished = true;
    const chunk: Record<string, unknown> = {
      id: this.id,
      object: 'chat.completion.chunk',
      created: this.created,
      model: this.model,
      // The stream's only chunk when the upstream sent none: it opens the message as well.
      choices: [{ index: 0, delta: this.roleSent ? {} : { role: 'assistant', content: '' }, logprobs: null, finish_reason: reason }],
    };
    this.roleSent = true;
    if (this.usageNull) chunk['usage'] = null;
    return JSON.stringify(chunk);
  }
}
