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
 * How many of the first `n` characters (UTF-16 units) of `text` to keep, for `n` below its length:
 * one fewer where the cut would split a surrogate pair, for half a pair is no character and a
 * client's decoder would show U+FFFD for it.
 */
function clipLength(text: string, n: number): number {
  const high = n > 0 ? text.charCodeAt(n - 1) : 0;
  return high >= 0xd800 && high <= 0xdbff ? n - 1 : n;
}

/**
 * One answer held to the output tokens a request allows, where no engine counts tokens (an upstream
 * reports usage only at the end, if at all). Each content-bearing delta (text, reasoning, a tool
 * call's arguments) is at least one token, and every MAX_CHARS_PER_TOKEN characters at least one
 * more: past either bound the answer is capped and nothing more passes. Both chat lanes count with
 * it (the relay that passes the upstream's frames on, and the canonical lane's guard), so they cut an
 * answer at the same character and bill it alike.
 */
export class OutputLimit {
  /** Deltas that passed something. */
  deltas = 0;
  chars = 0;
  reasoningChars = 0;
  capped = false;
  private readonly maxChars: number;

  constructor(
    private readonly cap: number,
    maxCharsPerToken = MAX_CHARS_PER_TOKEN,
  ) {
    this.maxChars = cap * maxCharsPerToken;
  }

  /**
   * Counts one delta: how many of `text`'s characters may pass (all within the limit, none once
   * capped, and where it reaches the limit the characters up to it, never half a surrogate pair).
   * A delta that passes nothing is not counted: nothing of it reaches the client or the bill.
   */
  admit(text: string, reasoning: boolean): number {
    if (text.length === 0 || this.capped) return 0;
    if (this.deltas + 1 > this.cap) {
      this.capped = true;
      return 0;
    }
    let n = text.length;
    if (this.chars + n > this.maxChars) {
      n = clipLength(text, Math.max(0, this.maxChars - this.chars));
      this.capped = true;
      if (n === 0) return 0;
    }
    this.deltas++;
    this.chars += n;
    if (reasoning) this.reasoningChars += n;
    return n;
  }

  /** The part of a delta's text that may pass ('' once capped): `admit`, cut to its answer. */
  clip(text: string, reasoning: boolean): string {
    const n = this.admit(text, reasoning);
    return n === text.length ? text : text.slice(0, n);
  }

  /** Output tokens by estimate: at least one per delta, at least a token per CHARS_PER_TOKEN characters. */
  get outputTokens(): number {
    return Math.min(this.cap, Math.max(this.deltas, tokensForChars(this.chars)));
  }

  /** Of those, reasoning tokens by the same estimate. */
  get reasoningTokens(): number {
    return Math.min(this.outputTokens, tokensForChars(this.reasoningChars));
  }
}

/**
 * Tokens a chat template adds around each message (its role markers) and to start the answer, as
 * OpenAI counts them for its chat models (3 and 3); Llama's and Qwen's templates add as many or more.
 * One token per message, as before, made a "hi" two tokens where upstreams count about ten, and
 * concurrent small requests overran a budget by twice its size (an operator pass).
 */
const TOKENS_PER_MESSAGE = 3;
const TOKENS_TO_ANSWER = 3;

/** Input tokens of a request, estimated from its text (messages, tool definitions and their schemas). */
export function estimateInputTokens(req: GenerationRequest): number {
  let chars = 0;
  for (const m of req.messages) {
    if (typeof m.content === 'string') chars += m.content.length;
    else if (m.content) for (const p of m.content) chars += p.type === 'text' ? p.text.length : 0;
    for (const c of m.toolCalls ?? []) chars += c.name.length + c.arguments.length;
    chars += m.reasoning?.length ?? 0;
  }
  for (const t of req.tools ?? []) chars += t.name.length + (t.description?.length ?? 0) + JSON.stringify(t.parameters ?? {}).length;
  return tokensForChars(chars) + TOKENS_PER_MESSAGE * req.messages.length + TOKENS_TO_ANSWER;
}
