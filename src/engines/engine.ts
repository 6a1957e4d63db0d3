import type { GenerationEvent, GenerationRequest } from '../core/canonical.js';

/**
 * What every engine is: a canonical request in, an async stream of canonical events out.
 *
 * Contract (checked by test/engine-conformance.test.ts for every engine):
 * - Problems known before generation (bad input, context overflow, overload, unreachable upstream)
 *   are thrown as ApiError from the first `next()`, before any event, so the API layer can still
 *   answer with a proper HTTP status.
 * - After that, the stream ends with exactly one `finish` event, preceded by one `usage` event.
 * - Aborting `req.signal` ends the stream promptly and frees whatever the request held.
 */
export interface Engine {
  readonly kind: string;
  generate(req: GenerationRequest, target: DeploymentTarget, attempt?: Attempt): AsyncIterable<GenerationEvent>;
  /**
   * The prompt tokens a request would use, counted without generating (`estimated` where the engine
   * could not count them all); engines that cannot count leave it out.
   */
  countInputTokens?(req: GenerationRequest, target: DeploymentTarget): Promise<{ tokens: number; estimated: boolean }>;
  /** Active health check of a deployment (engines without remote targets need none). */
  probe?(target: DeploymentTarget): Promise<boolean>;
  close(): Promise<void>;
}

/** What the router tells an engine about one try of a request. */
export interface Attempt {
  /** Epoch ms by which the answer must have started, whatever the engine's own timeouts. */
  deadline: number;
  /** Output tokens the answer may have (the request's max, else the model's context): an engine cuts what goes past it. */
  outputCap?: number | undefined;
  /** The model's context, where the catalogue has one: an upstream's usage report past it is not believed. */
  contextLength?: number | undefined;
}

/** Where a request goes inside an engine: a local file, or an upstream model. */
export type DeploymentTarget =
  /** `reasoning`: the model thinks in `<think>…</think>` before answering; that part becomes reasoning. */
  | { engine: 'local'; file: string; contextLength: number; reasoning: boolean }
  /**
   * `api`: whether the upstream speaks the Responses API natively or only chat completions.
   * `guarded`: set through the admin API or CLI, so every connection passes the address policy.
   */
  | {
      engine: 'upstream';
      baseUrl: string;
      apiKey: string | undefined;
      upstreamModel: string;
      id: string;
      api: 'chat' | 'responses' | 'anthropic';
      guarded: boolean;
    };
