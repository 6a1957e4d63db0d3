import { TokenBias, type LlamaModel, type Token } from 'node-llama-cpp';
import { scanVocabulary, vocabularyOf } from './vocabulary.js';

/**
 * Budget-aware closing for grammar-constrained JSON. A document cut off at max_tokens is of no use
 * to anyone, and a small model inside a JSON string writes on (it was trained on prose, where a
 * quote mark is rare) until the budget is gone. So the output is followed with a small JSON lexer,
 * and tokens that close what is open get a logit bonus:
 * - inside a string, tokens holding `"`, once the string has run STRING_FROM of the budget, rising
 *   to MAX_LOGIT at STRING_FULL: one string may not eat the document's budget;
 * - outside strings, tokens holding `]` or `}`, once the innermost array or object has run
 *   CONTAINER_FROM of the budget (rising to MAX_LOGIT at CONTAINER_FULL): an optional property or
 *   another item is left out rather than the whole document cut;
 * - and both, whatever the local lengths, rising with the share of the budget spent to MAX_LOGIT
 *   at NUDGE_FULL: past that, the document should be closing.
 * - and, in an object, tokens that would end a key as one the object already has get a large
 *   negative bias (a repeated key is counted once by JSON: a value lost, a minProperties short).
 * The grammar still decides what may come next, so the bonus only ever picks among valid
 * continuations (a `"` where the schema needs more characters is still masked out). The fractions
 * scale with the budget, so a large budget leaves long strings alone. MAX_LOGIT is large because a
 * model's own preference can be larger still: stories260K puts `,` more than 16 logits above `}`
 * after an object member. Tuned on the 320 JSONSchemaBench schemas with that 512-token model
 * (test/schema-coverage.test.ts): 84% of documents complete and valid with one budget-wide nudge
 * to +16, 87% with these ramps to +16, 96% with these ramps to +32.
 */
const NUDGE_FULL = 0.4;
const STRING_FROM = 0.01;
const STRING_FULL = 0.05;
const CONTAINER_FROM = 0.02;
const CONTAINER_FULL = 0.08;
const MAX_LOGIT = 32;
/**
 * Taken from a token that would end an object's key as one the object already has: JSON counts a
 * repeated key once (a value lost, a minProperties short) and RFC 8259 says names SHOULD be unique.
 * Finite, not "never": where the grammar leaves only such tokens (a propertyNames enum), one is
 * still taken, and the schema check judges the document.
 */
const REPEATED_KEY_LOGIT = -64;
/** Bonus steps: one TokenBias per step and token class is made once and reused. */
const STEPS = 16;

export class ClosingBias {
  private readonly none: TokenBias;
  private readonly quotes: TokenBias[];
  private readonly brackets: TokenBias[];

  private constructor(
    private readonly model: LlamaModel,
    private readonly tokens: Readonly<Record<'quotes' | 'brackets', readonly Token[]>>,
    /** Each token holding `"`, with its text before the first one (what it adds to a key it ends). */
    private readonly quoteHeads: ReadonlyArray<readonly [Token, string]>,
    /**
     * Tokens that write a whole key, quotes and all (`" "`), by that key, each with whether it
     * starts a new member first (a `,` before its quote): taken from an object holding that key.
     */
    private readonly wholeKeys: ReadonlyMap<string, ReadonlyArray<readonly [Token, boolean]>>,
    /** Every token by its text: the ones that would complete a key the object has, inside that key. */
    private readonly byText: ReadonlyMap<string, readonly Token[]>,
  ) {
    this.none = new TokenBias(model.tokenizer);
    const steps = (kind: 'quotes' | 'brackets'): TokenBias[] =>
      Array.from({ length: STEPS }, (_, i) => {
        const bias = new TokenBias(model.tokenizer);
        for (const t of tokens[kind]) bias.set(t, { logit: (MAX_LOGIT * (i + 1)) / STEPS });
        return bias;
      });
    this.quotes = steps('quotes');
    this.brackets = steps('brackets');
  }

  /** The closing tokens of the model's vocabulary (read in chunks, so the event loop keeps turning); undefined if it cannot be read. */
  static async for(model: LlamaModel): Promise<ClosingBias | undefined> {
    const vocab = vocabularyOf(model);
    if (!vocab) return undefined;
    const quoteHeads: Array<readonly [Token, string]> = [];
    const brackets: Token[] = [];
    const wholeKeys = new Map<string, Array<readonly [Token, boolean]>>();
    const byText = new Map<string, Token[]>();
    // Decoded after a word, as in the middle of an output: alone, a SentencePiece token loses its
    // leading space (stories260K's ` "` reads as `"`), and a key it ends would be misread.
    const after = model.tokenize('a');
    await scanVocabulary(vocab, (token) => {
      if (model.isSpecialToken(token)) return;
      const text = model.detokenize([token], false, after);
      const same = byText.get(text);
      if (same) same.push(token);
      else byText.set(text, [token]);
      const quote = text.indexOf('"');
      if (quote >= 0) {
        quoteHeads.push([token, text.slice(0, quote)]);
        const end = text.indexOf('"', quote + 1);
        const before = text.slice(0, quote);
        const key = text.slice(quote + 1, end);
        // Only what can come before a key in the same object (a new object has no keys yet).
        if (end > quote && /^[\s,]*$/.test(before) && !key.includes('\\')) {
          const list = wholeKeys.get(key) ?? [];
          list.push([token, before.includes(',')]);
          wholeKeys.set(key, list);
        }
      }
      if (/[\]}]/.test(text)) brackets.push(token);
    });
    const quotes = quoteHeads.map(([t]) => t);
    return quotes.length > 0 || brackets.length > 0
      ? new ClosingBias(model, { quotes, brackets }, quoteHeads, wholeKeys, byText)
      : undefined;
  }

  /** A tracker for one output of at most `budget` tokens. */
  track(budget: number): ClosingTracker {
    return new ClosingTracker(this, budget);
  }

  /** The bias for a token class at a ramp position in [0, 1]. */
  pick(kind: 'quotes' | 'brackets', ramp: number): TokenBias {
    const step = this.step(ramp);
    return step <= 0 ? this.none : this[kind][step - 1]!;
  }

  private step(ramp: number): number {
    return Math.min(STEPS, Math.ceil(ramp * STEPS));
  }

  /**
   * `pick`, but with the tokens that would end an object key as one the object has (`taken`) all
   * but ruled out: inside a key that has reached `key` (tokens that end it), or where a key may
   * start (`key` undefined; `starting`: right after `{` or `,`, else only after a `,` of the token's
   * own; tokens that write a whole key). Undefined where no token would repeat a key. Made afresh
   * each time: only while a key is a prefix of one the object has, or an object has keys that one
   * token writes whole.
   */
  pickAvoiding(
    kind: 'quotes' | 'brackets',
    ramp: number,
    taken: ReadonlySet<string>,
    key: string | undefined,
    starting: boolean,
  ): TokenBias | undefined {
    let banned: Set<Token> | undefined;
    if (key !== undefined) {
      for (const [token, head] of this.quoteHeads) if (taken.has(key + head)) (banned ??= new Set()).add(token);
      // And a token that writes the rest of such a key: where the key's grammar allows nothing
      // after it (`^k[0-9]$`), its closing quote would be the only token left.
      for (const k of taken) {
        if (k.length <= key.length || !k.startsWith(key)) continue;
        for (const token of this.byText.get(k.slice(key.length)) ?? []) (banned ??= new Set()).add(token);
      }
    } else {
      for (const k of taken)
        for (const [token, comma] of this.wholeKeys.get(k) ?? []) if (starting || comma) (banned ??= new Set()).add(token);
    }
    if (banned === undefined) return undefined;
    const logit = (MAX_LOGIT * this.step(ramp)) / STEPS;
    const bias = new TokenBias(this.model.tokenizer);
    if (logit > 0) for (const t of this.tokens[kind]) if (!banned.has(t)) bias.set(t, { logit });
    for (const t of banned) bias.set(t, { logit: REPEATED_KEY_LOGIT });
    return bias;
  }
}

/** Where `value` lies between `from` (0) and `full` (1). */
const ramp = (value: number, from: number, full: number): number => (value <= from ? 0 : Math.min(1, (value - from) / (full - from)));

/** An open array or object: the token count at which it opened, and an object's keys so far. */
interface Container {
  at: number;
  /** An object's keys (raw JSON text between the quotes); undefined for an array. */
  keys: Set<string> | undefined;
  /** The next string in it is a key (after `{` or `,` in an object). */
  key: boolean;
}

/** Follows one output through a JSON lexer (in or out of a string, open containers, keys) token by token. */
export class ClosingTracker {
  private generated = 0;
  private inString = false;
  private escaped = false;
  /** The token count at which the current string opened. */
  private stringStart = 0;
  /** The text so far of the string being written, where it is an object's key; else undefined. */
  private keyText: string | undefined;
  /** Open arrays and objects, innermost last. */
  private readonly containers: Container[] = [];

  constructor(
    private readonly closing: ClosingBias,
    private readonly budget: number,
  ) {}

  /** The text decoded so far from the latest token(s) (empty while a character is split) and the tokens generated. */
  feed(text: string, generated: number): void {
    this.generated = generated;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      const top = this.containers.at(-1);
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (c === 0x5c) this.escaped = true;
        else if (c === 0x22) {
          this.inString = false;
          if (this.keyText !== undefined) top?.keys?.add(this.keyText);
          this.keyText = undefined;
          continue;
        }
        if (this.keyText !== undefined) this.keyText += text[i];
      } else if (c === 0x22) {
        this.inString = true;
        this.stringStart = generated;
        this.keyText = top?.key ? '' : undefined;
        if (top) top.key = false;
      } else if (c === 0x7b) this.containers.push({ at: generated, keys: new Set(), key: true });
      else if (c === 0x5b) this.containers.push({ at: generated, keys: undefined, key: false });
      else if (c === 0x7d || c === 0x5d) this.containers.pop();
      else if (c === 0x2c && top?.keys) top.key = true;
    }
  }

  /** The bias for the next token. */
  bias(): TokenBias {
    const spent = ramp(this.generated / this.budget, 0, NUDGE_FULL);
    const top = this.containers.at(-1);
    const taken = top?.keys !== undefined && top.keys.size > 0 ? top.keys : undefined;
    if (this.inString) {
      const length = (this.generated - this.stringStart) / this.budget;
      const r = Math.max(spent, ramp(length, STRING_FROM, STRING_FULL));
      const key = this.keyText;
      if (taken && key !== undefined && !this.escaped) {
        for (const k of taken)
          if (k.startsWith(key)) return this.closing.pickAvoiding('quotes', r, taken, key, false) ?? this.closing.pick('quotes', r);
      }
      return this.closing.pick('quotes', r);
    }
    const length = top === undefined ? 0 : (this.generated - top.at) / this.budget;
    const r = Math.max(spent, ramp(length, CONTAINER_FROM, CONTAINER_FULL));
    return (taken && this.closing.pickAvoiding('brackets', r, taken, undefined, top!.key)) ?? this.closing.pick('brackets', r);
  }
}
