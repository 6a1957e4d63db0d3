import type { LlamaModel, Token } from 'node-llama-cpp';
import { scanVocabulary, vocabularyOf } from './vocabulary.js';

/**
 * Text under a grammar, decoded the way llama.cpp's grammar reads it.
 *
 * llama.cpp matches a grammar against code points decoded from each candidate token's bytes, and
 * its decoder checks a sequence's length and continuation bytes but not that the sequence is the
 * shortest one for its code point. So under a grammar that wants `日` (U+65E5, E6 97 A5) a model
 * with byte tokens (SentencePiece byte fallback, or the byte-level BPE of most GGUF models) may
 * also write F0 86 97 A5, an overlong form that the grammar reads as U+65E5 and any strict UTF-8
 * decoder (node-llama-cpp's detokenizer included) as four U+FFFD: the JSON the client got did not
 * hold the enum value the grammar made the model write, and failed validation (issue found by a
 * hostile pass: 3 seeds in 16 on a two-value non-ASCII enum with stories260K).
 *
 * Banning the overlong bytes while sampling would leave the grammar with nothing to pick where it
 * admitted a lead byte only for its overlong forms, so the bytes are read as the grammar read
 * them instead: the text is the code points the grammar matched, which is what makes it valid.
 * Only tokens whose bytes are not complete UTF-8 on their own go through here; the others are
 * detokenized as before (they also carry the tokenizer's leading-space rules).
 */

/** llama.cpp's token types (`tokenizer.ggml.token_type`) of tokens that stand for text or a byte. */
const NORMAL = 1;
const BYTE = 6;

/** llama.cpp's sequence length by the lead byte's high nibble (0: a continuation byte, which cannot lead). */
const LENGTH_BY_HIGH_NIBBLE = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4] as const;

const REPLACEMENT = '\uFFFD';
const strict = new TextDecoder('utf-8', { fatal: true });

/** GPT-2's byte-level BPE alphabet: the character each byte is written as in the vocabulary. */
function byteLevelAlphabet(): Map<number, number> {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const charToByte = new Map<number, number>();
  let next = 256;
  for (let b = 0; b < 256; b++) charToByte.set(printable(b) ? b : next++, b);
  return charToByte;
}

/** The bytes a vocabulary entry stands for, where the tokenizer's scheme is known (else undefined). */
function entryBytes(entry: string, scheme: string, alphabet: Map<number, number> | undefined): Uint8Array | undefined {
  if (scheme === 'llama') {
    // SentencePiece: byte-fallback entries are written <0xHH>; the others are text.
    const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(entry);
    return m ? Uint8Array.of(parseInt(m[1]!, 16)) : undefined;
  }
  if (alphabet) {
    const bytes = new Uint8Array(entry.length);
    for (let i = 0; i < entry.length; i++) {
      const b = alphabet.get(entry.charCodeAt(i));
      if (b === undefined) return undefined; // a special or added token, written as itself
      bytes[i] = b;
    }
    return bytes;
  }
  return undefined;
}

function isCompleteUtf8(bytes: Uint8Array): boolean {
  try {
    strict.decode(bytes);
    return true;
  } catch {
    return false;
  }
}

/** The tokens of a model whose bytes are not complete UTF-8 on their own, with those bytes. */
export class ByteTokens {
  private constructor(private readonly bytes: ReadonlyMap<Token, Uint8Array>) {}

  /** Read from the vocabulary (in chunks, so the event loop keeps turning); undefined where its scheme is not known. */
  static async for(model: LlamaModel): Promise<ByteTokens | undefined> {
    const vocab = vocabularyOf(model);
    const scheme = vocab?.scheme;
    if (!vocab || (scheme !== 'llama' && scheme !== 'gpt2')) return undefined;
    const alphabet = scheme === 'gpt2' ? byteLevelAlphabet() : undefined;
    const { types } = vocab;
    const bytes = new Map<Token, Uint8Array>();
    await scanVocabulary(vocab, (token, entry) => {
      // Control and user-defined tokens are written as their text, not as byte-level characters:
      // only normal and byte tokens are read as bytes (llama.cpp's token types 1 and 6).
      if (typeof entry !== 'string' || (types && types[token] !== NORMAL && types[token] !== BYTE)) return;
      const b = entryBytes(entry, scheme, alphabet);
      if (b && !isCompleteUtf8(b)) bytes.set(token, b);
    });
    return new ByteTokens(bytes);
  }

  /** The token's bytes if they are not complete UTF-8 on their own. */
  of(token: Token): Uint8Array | undefined {
    return this.bytes.get(token);
  }

  /** A decoder for one output. */
  decoder(): GrammarTextDecoder {
    return new GrammarTextDecoder();
  }
}

function codePointText(cp: number): string {
  // Code points a string cannot hold as UTF-8 (surrogates, past U+10FFFF): only a free-text
  // position of a grammar admits them, where U+FFFD is as valid.
  return (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff ? REPLACEMENT : String.fromCodePoint(cp);
}

/**
 * Decodes byte tokens as llama.cpp's grammar does (`decode_utf8` in llama-grammar.cpp): a
 * sequence's length from its lead byte, its bits taken as they are (no overlong check), and the
 * continuation bytes of a sequence begun in an earlier token checked. What the grammar would have
 * refused (it cannot come under one) becomes U+FFFD.
 */
export class GrammarTextDecoder {
  private value = 0;
  /** Continuation bytes still due for the sequence begun in an earlier token. */
  private remain = 0;

  /** The text of complete code points so far, given one token's bytes. */
  push(bytes: Uint8Array): string {
    let out = '';
    let i = 0;
    for (; i < bytes.length && this.remain > 0; i++) {
      const b = bytes[i]!;
      if (b >> 6 !== 2) {
        out += REPLACEMENT;
        this.remain = 0;
        break;
      }
      this.value = (this.value << 6) + (b & 0x3f);
      if (--this.remain === 0) out += codePointText(this.value);
    }
    while (i < bytes.length) {
      const first = bytes[i++]!;
      let remain = LENGTH_BY_HIGH_NIBBLE[first >> 4]! - 1;
      if (remain < 0) {
        out += REPLACEMENT;
        continue;
      }
      let value = first & ((1 << (7 - remain)) - 1);
      for (; i < bytes.length && remain > 0; i++, remain--) value = (value << 6) + (bytes[i]! & 0x3f);
      if (remain === 0) out += codePointText(value);
      else {
        this.value = value;
        this.remain = remain;
      }
    }
    return out;
  }

  /** Text that ends a sequence still open (a regular token, or the end of the output): U+FFFD for it. */
  end(): string {
    if (this.remain === 0) return '';
    this.remain = 0;
    return REPLACEMENT;
  }
}
