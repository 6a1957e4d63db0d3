import { TokenBias, type LlamaModel, type Token } from 'node-llama-cpp';

/**
 * Budget-aware closing for grammar-constrained JSON. A document cut off at max_tokens is of no use
 * to anyone, and a small model inside a JSON string may write on until it is. Once an output has
 * spent NUDGE_FROM of its token budget, tokens that close something (`"`, `]`, `}`) get a logit
 * bonus that grows to MAX_LOGIT at the budget's end. The grammar still decides what may come next,
 * so the bonus only ever picks among valid continuations: a string ends sooner, an optional
 * property or another array item is left out. Below NUDGE_FROM sampling is untouched.
 */
const NUDGE_FROM = 0.1;
const MAX_LOGIT = 16;
/** Bonus steps: one TokenBias per step is made once and reused. */
const STEPS = 16;
/** Vocabulary entries read per turn of the event loop while looking for closing tokens. */
const SCAN_CHUNK = 4096;

export class ClosingBias {
  private readonly none: TokenBias;
  private readonly steps: TokenBias[] = [];

  private constructor(model: LlamaModel, closers: readonly Token[]) {
    this.none = new TokenBias(model.tokenizer);
    for (let i = 1; i <= STEPS; i++) {
      const bias = new TokenBias(model.tokenizer);
      for (const t of closers) bias.set(t, { logit: (MAX_LOGIT * i) / STEPS });
      this.steps.push(bias);
    }
  }

  /** The closing tokens of the model's vocabulary (read in chunks, so the event loop keeps turning); undefined if it cannot be read. */
  static async for(model: LlamaModel): Promise<ClosingBias | undefined> {
    const vocab = (model.fileInfo.metadata as { tokenizer?: { ggml?: { tokens?: unknown } } } | undefined)?.tokenizer?.ggml?.tokens;
    if (!Array.isArray(vocab)) return undefined;
    const closers: Token[] = [];
    for (let start = 0; start < vocab.length; start += SCAN_CHUNK) {
      const end = Math.min(vocab.length, start + SCAN_CHUNK);
      for (let t = start; t < end; t++) {
        const token = t as Token;
        if (model.isSpecialToken(token)) continue;
        if (/["\]}]/.test(model.detokenize([token]))) closers.push(token);
      }
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return closers.length > 0 ? new ClosingBias(model, closers) : undefined;
  }

  /** The bias after `generated` of `budget` tokens. */
  at(generated: number, budget: number): TokenBias {
    const spent = generated / budget;
    if (spent < NUDGE_FROM) return this.none;
    const step = Math.min(STEPS, Math.ceil(((spent - NUDGE_FROM) / (1 - NUDGE_FROM)) * STEPS));
    return step <= 0 ? this.none : this.steps[step - 1]!;
  }
}
