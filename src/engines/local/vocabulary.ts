import type { LlamaModel, Token } from 'node-llama-cpp';

/** Vocabulary entries read per turn of the event loop. */
const SCAN_CHUNK = 4096;

/** A model's tokenizer as its GGUF metadata gives it: entries, scheme (`llama`, `gpt2`, …) and token types. */
export interface Vocabulary {
  tokens: readonly unknown[];
  scheme: unknown;
  types: readonly unknown[] | undefined;
}

/** The vocabulary in a model's metadata; undefined where it has none to read. */
export function vocabularyOf(model: LlamaModel): Vocabulary | undefined {
  const ggml = (
    model.fileInfo.metadata as { tokenizer?: { ggml?: { tokens?: unknown; model?: unknown; token_type?: unknown } } } | undefined
  )?.tokenizer?.ggml;
  const tokens = ggml?.tokens;
  if (!Array.isArray(tokens)) return undefined;
  return { tokens, scheme: ggml?.model, types: Array.isArray(ggml?.token_type) ? (ggml.token_type as unknown[]) : undefined };
}

/**
 * Visits every token of a vocabulary in chunks, so the event loop keeps turning (a large model's
 * vocabulary is 150,000 entries and more; this runs at a request's first structured output).
 */
export async function scanVocabulary(vocab: Vocabulary, visit: (token: Token, entry: unknown) => void): Promise<void> {
  const n = vocab.tokens.length;
  for (let start = 0; start < n; start += SCAN_CHUNK) {
    const end = Math.min(n, start + SCAN_CHUNK);
    for (let t = start; t < end; t++) visit(t as Token, vocab.tokens[t]);
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}
