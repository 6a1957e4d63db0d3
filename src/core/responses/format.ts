import type { GenerationEvent, GenerationRequest, Usage } from '../canonical.js';
import type { InputItem, Item } from '../items.js';

/**
 * What core needs of the Responses wire format, which the Responses protocol module provides (and
 * core never sees): core runs the lifecycle of a response (generation, storage, background runs,
 * cancel, replay, conversations) on canonical events and items; the protocol turns those into the
 * response object as served and the stream events a client reads.
 */

export type ResponseStatus = 'queued' | 'in_progress' | 'completed' | 'failed' | 'cancelled' | 'incomplete';
export const TERMINAL: readonly ResponseStatus[] = ['completed', 'failed', 'cancelled', 'incomplete'];

/** One stream event as the protocol renders it; opaque to core. */
export type ResponseEvent = { readonly type: string } & Readonly<Record<string, unknown>>;

/** A response being generated: canonical events in, the protocol's events out. */
export interface ResponseFold {
  /** The response object as served now (the protocol's own shape). */
  readonly resource: Readonly<Record<string, unknown>>;
  readonly status: ResponseStatus;
  /** Output items so far. */
  readonly output: readonly Item[];
  /** A background response waiting to start. */
  queued(): ResponseEvent[];
  start(): ResponseEvent[];
  apply(ev: GenerationEvent): ResponseEvent[];
  fail(code: string, message: string): ResponseEvent[];
  cancel(): ResponseEvent[];
}

/** What core decided about a new response; `echo` is the protocol's decoded request, which it echoes. */
export interface NewResponse<Echo> {
  id: string;
  createdAt: number;
  model: string;
  background: boolean;
  store: boolean;
  previousResponseId: string | null;
  conversationId: string | null;
  echo: Echo;
  /** `reasoning.summary` as asked: null for none. */
  summary: string | null;
  /** Seals reasoning into `encrypted_content`, when the request asked for it. */
  seal: ((text: string) => string) | undefined;
}

/** A stored response as core reads it. */
export interface StoredResponse {
  resource: Record<string, unknown>;
  status: ResponseStatus;
  output: Item[];
}

export interface ResponsesFormat<Echo> {
  open(r: NewResponse<Echo>): ResponseFold;
  /** Reads a stored response (as `serialize` wrote it). */
  read(stored: string): StoredResponse;
  /** The response as JSON: what is stored, and the body a non-stream client is sent as it is. */
  serialize(fold: ResponseFold): string;
  /** A stored response re-rendered as the events that made it, ending with its terminal event. */
  replay(stored: string): { events: ResponseEvent[]; finished: boolean };
  /**
   * The stored response with a terminal status core decided (cancelled elsewhere, abandoned by a
   * dead process), and the usage billed for it where it has none yet.
   */
  end(stored: string, status: 'cancelled' | 'failed', error?: { code: string; message: string }, usage?: Usage): string;
  /**
   * Whether an event ends the stream for its clients (it waits until the response and its usage
   * are stored): the terminal event, and an error event before it (clients stop at that one).
   */
  isTerminal(ev: ResponseEvent): boolean;
}

/** A response to create, as the Responses protocol decoded it. */
export interface ResponsesCreate<Echo> {
  model: string;
  input: InputItem[];
  instructions: string | null;
  /** The generation part: sampling, limits, tools, output format, reasoning effort. */
  generation: Pick<
    GenerationRequest,
    'sampling' | 'maxOutputTokens' | 'tools' | 'toolChoice' | 'parallelToolCalls' | 'responseFormat' | 'reasoningEffort'
  >;
  stream: boolean;
  store: boolean;
  background: boolean;
  previousResponseId: string | null;
  conversationId: string | null;
  /** Reasoning is returned sealed (`encrypted_content`), for a later unstored request to send back. */
  includeSealedReasoning: boolean;
  /** `reasoning.summary`: null for none. */
  summary: string | null;
  /** `auto`: older turns may be left out of what the model reads when the whole does not fit its context. */
  truncation: 'auto' | 'disabled';
  /** The decoded request, which the protocol echoes in the response object. */
  echo: Echo;
}

/** The result of `POST /v1/responses/compact`, before the protocol renders it. */
export interface Compaction {
  id: string;
  createdAt: number;
  output: Item[];
  usage: Usage;
}
