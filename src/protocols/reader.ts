import { ApiError } from '../core/errors.js';
import { walkJson } from '../core/json-walk.js';
import type { FinishReason, FunctionTool, GenerationEvent } from '../core/canonical.js';

/**
 * What every protocol's upstream reader shares: defensive reading of JSON an upstream sent (any
 * field may have any type), and usage as reported.
 */

/** A token count as an upstream reports it: a non-negative integer, or nothing we can use. */
const MAX_COUNT = 2_000_000_000;
export function count(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v <= MAX_COUNT ? v : undefined;
}
export const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);
export const obj = (v: unknown): Record<string, unknown> | undefined =>
  typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;

/**
 * Usage as the upstream reported it, field by field: a count that is not a non-negative integer
 * (a string, a boolean, a fraction, a negative, an object) is treated as missing, and `invalid`
 * says so; the engine then fills it from its own estimate and flags the record.
 */
export interface ReportedUsage {
  input: number | undefined;
  cached: number | undefined;
  output: number | undefined;
  reasoning: number | undefined;
  /** Of the input, what was written to the upstream's prompt cache (Anthropic reports it). */
  cacheWrite?: number;
  invalid: boolean;
}

export function reported(input: unknown, cached: unknown, output: unknown, reasoning: unknown): ReportedUsage {
  const r: ReportedUsage = {
    input: count(input),
    cached: count(cached),
    output: count(output),
    reasoning: count(reasoning),
    invalid: false,
  };
  r.invalid =
    (input !== undefined && r.input === undefined) ||
    (output !== undefined && r.output === undefined) ||
    (cached !== undefined && cached !== null && r.cached === undefined) ||
    (reasoning !== undefined && reasoning !== null && r.reasoning === undefined);
  return r;
}

/** Tool calls one answer may hold; an index beyond it is a malformed stream (it would allocate a sparse array). */
export const MAX_TOOL_CALLS = 128;

/** What a protocol's reader does with an upstream's stream: canonical events out, and when it ended. */
export interface StreamReader {
  /** One parsed SSE data payload (or a whole non-stream reply). Returns true at the end of the stream. */
  read(data: unknown, out: GenerationEvent[]): boolean;
  readonly usage: ReportedUsage | undefined;
  readonly finish: FinishReason;
}

/** Makes an upstream's text safe to pass on (the engine scrubs the deployment's key out of it). */
export type Clean = (text: string) => string;

/** An upstream's own error message, as the client will see it. */
export const upstreamFailure = (message: unknown, clean: Clean): ApiError =>
  // Scrubbed whole, then shortened: shortened first, a key past the cut lost its end and was no
  // longer matched, so its start went out (a hostile pass read 20 characters of it).
  new ApiError('upstream_error', `Upstream error: ${clean(String(typeof message === 'string' ? message : 'unknown')).slice(0, 500)}`);

/**
 * A function tool as the OpenAI wires (chat completions, Responses) write it to an upstream: its own
 * fields only, not what Switchyard keeps beside them (its position in the client's list, a cache mark).
 */
export function wireTool(t: FunctionTool): Record<string, unknown> {
  const out: Record<string, unknown> = { name: t.name };
  if (t.description !== undefined) out['description'] = t.description;
  if (t.parameters !== undefined) out['parameters'] = t.parameters;
  if (t.strict !== undefined) out['strict'] = t.strict;
  return out;
}

/**
 * Levels of arrays and objects a client's or an upstream's JSON value may nest before Switchyard
 * serializes it: JSON.parse reads any depth, but JSON.stringify recurses and overflows the stack
 * somewhere past a few thousand, which would be a 500 for a 40 KB body.
 */
export const MAX_JSON_DEPTH = 512;

/**
 * Whether JSON text nests arrays and objects more than `limit` deep, read off the text (brackets
 * outside strings) without walking a parse: every upstream answer takes this check, and most are
 * too short to nest that deep at all (each level takes two characters).
 */
export function textNestsDeeper(text: string, limit = MAX_JSON_DEPTH): boolean {
  if (text.length <= 2 * limit) return false;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      if (++depth > limit) return true;
    } else if (c === 0x7d || c === 0x5d) depth--;
  }
  return false;
}

/** Whether a parsed JSON value has an object or array nested deeper than `limit`. */
export function nestsDeeper(value: unknown, limit = MAX_JSON_DEPTH): boolean {
  return walkJson(value, ({ value: v, depth }) => depth >= limit && typeof v === 'object' && v !== null);
}
