import type { GenerationRequest } from './canonical.js';

/**
 * Token estimates, for when no engine counted: an upstream that reported no usage (or nonsense), or a
 * request that stopped before it did. Four characters per token is the usual rule of thumb for
 * English text; records built on it are flagged `estimated`.
 */
export const CHARS_PER_TOKEN = 4;

/**
 * The most characters one token can plausibly stand for (long runs of spaces or punctuation in code);
 * more text than this many per token means the upstream is past the token limit.
 */
export const MAX_CHARS_PER_TOKEN = 32;

export const tokensForChars = (chars: number): number => Math.ceil(chars / CHARS_PER_TOKEN);

/**
 * The first `n` characters (UTF-16 units) of `text`, one fewer where the cut would split a surrogate
 * pair: half a pair is no character, and a client's decoder would show U+FFFD for it.
 */
export function clipChars(text: string, n: number): string {
  if (n >= text.length) return text;
  const high = n > 0 ? text.charCodeAt(n - 1) : 0;
  return text.slice(0, high >= 0xd800 && high <= 0xdbff ? n - 1 : n);
}

/** Input tokens of a request, estimated from its text (messages, tool definitions and their schemas). */
export function estimateInputTokens(req: GenerationRequest): number {
  let chars = 0;
  for (const m of req.messages) {
    if (typeof m.content === 'string') chars += m.content.length;
    else if (m.content) for (const p of m.content) chars += p.type === 'text' ? p.text.length : 0;
    for (const c of m.toolCalls ?? []) chars += c.name.length + c.arguments.length;
    chars += (m.reasoning?.length ?? 0) + CHARS_PER_TOKEN;
  }
  for (const t of req.tools ?? []) chars += t.name.length + (t.description?.length ?? 0) + JSON.stringify(t.parameters ?? {}).length;
  return tokensForChars(chars);
}
