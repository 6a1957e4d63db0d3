import { stat } from 'node:fs/promises';
import { Worker } from 'node:worker_threads';
import { readGgufFileInfo } from 'node-llama-cpp';

/**
 * GGUF validation before anything is handed to llama.cpp. A file llama.cpp cannot handle can abort
 * the whole process (an assertion, not an exception), so the metadata is read in JavaScript first
 * and every key the loader relies on is checked, along with the tensor data actually being there.
 */
export class GgufValidationError extends Error {}

export interface GgufSummary {
  architecture: string;
  name: string | undefined;
  contextLength: number;
  chatTemplate: string | undefined;
  fileSize: number;
}

/** Bytes per block and elements per block of each ggml tensor type (ggml.h / ggml.c type traits). */
const GGML_TYPE_SIZE: Readonly<Record<number, readonly [bytes: number, elements: number]>> = {
  0: [4, 1],
  1: [2, 1],
  2: [18, 32],
  3: [20, 32],
  6: [22, 32],
  7: [24, 32],
  8: [34, 32],
  9: [36, 32],
  10: [84, 256],
  11: [110, 256],
  12: [144, 256],
  13: [176, 256],
  14: [210, 256],
  15: [292, 256],
  16: [66, 256],
  17: [74, 256],
  18: [98, 256],
  19: [50, 256],
  20: [18, 32],
  21: [110, 256],
  22: [82, 256],
  23: [136, 256],
  24: [1, 1],
  25: [2, 1],
  26: [4, 1],
  27: [8, 1],
  28: [8, 1],
  29: [56, 256],
  30: [2, 1],
  34: [54, 256],
  35: [66, 256],
  39: [17, 32],
};

/** Per-architecture hyperparameters llama.cpp reads without a default. */
const REQUIRED_ARCH_KEYS = ['context_length', 'embedding_length', 'block_count', 'feed_forward_length', 'attention.head_count'];

function lookup(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  for (const part of path.split('.')) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[part];
  }
  return cur;
}

const positive = (v: unknown): boolean =>
  (typeof v === 'number' && Number.isFinite(v) && v > 0) ||
  (Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === 'number' && x >= 0));

/**
 * inspectGguf in a worker thread with a time and memory limit. A hostile file can make the GGUF
 * reader itself spin (a 22-byte file that starts with the magic grew one to 400 MB in 3 s): the
 * worker is then terminated and the file rejected, and the server goes on.
 */
export function inspectGgufIsolated(path: string, timeoutMs = 5_000): Promise<GgufSummary> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL('./gguf-worker.js', import.meta.url), {
      workerData: path,
      resourceLimits: { maxOldGenerationSizeMb: 256 },
      stdout: true,
      stderr: true,
    });
    let settled = false;
    const settle = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      void worker.terminate();
      fn();
    };
    const timer = setTimeout(
      () => settle(() => reject(new GgufValidationError(`reading its metadata did not finish within ${timeoutMs} ms`))),
      timeoutMs,
    );
    worker.once('message', (m: { ok: true; summary: GgufSummary } | { ok: false; message: string }) =>
      settle(() => (m.ok ? resolve(m.summary) : reject(new GgufValidationError(m.message)))),
    );
    worker.once('error', (err) => settle(() => reject(new GgufValidationError(`reading its metadata failed: ${err.message}`))));
    worker.once('exit', (code) => settle(() => reject(new GgufValidationError(`reading its metadata stopped (exit ${code})`))));
  });
}

export async function inspectGguf(path: string): Promise<GgufSummary> {
  const fileSize = (await stat(path)).size;
  let info: Awaited<ReturnType<typeof readGgufFileInfo>>;
  try {
    info = await readGgufFileInfo(path, { readTensorInfo: true, logWarnings: false });
  } catch (err) {
    throw new GgufValidationError(`not a readable GGUF file: ${(err as Error).message}`);
  }
  const meta = info.metadata as unknown;
  const arch = lookup(meta, 'general.architecture');
  if (typeof arch !== 'string' || arch === '') throw new GgufValidationError('general.architecture is missing');
  for (const key of REQUIRED_ARCH_KEYS) {
    if (!positive(lookup(meta, `${arch}.${key}`))) throw new GgufValidationError(`${arch}.${key} is missing or not positive`);
  }
  const tokens = lookup(meta, 'tokenizer.ggml.tokens');
  if (!Array.isArray(tokens) || tokens.length === 0) throw new GgufValidationError('tokenizer.ggml.tokens is missing');
  const tensors = info.fullTensorInfo ?? info.tensorInfo ?? [];
  if (tensors.length === 0) throw new GgufValidationError('the file holds no tensors');
  for (const t of tensors) {
    const traits = GGML_TYPE_SIZE[t.ggmlType];
    if (!traits) throw new GgufValidationError(`tensor ${t.name} has ggml type ${t.ggmlType}, which this server does not know`);
    const elements = t.dimensions.reduce<number>((a, d) => a * Number(d), 1);
    const bytes = Math.ceil(elements / traits[1]) * traits[0];
    if (Number(t.fileOffset) + bytes > fileSize) {
      throw new GgufValidationError(`tensor ${t.name} extends past the end of the file (truncated download?)`);
    }
  }
  const name = lookup(meta, 'general.name');
  const template = lookup(meta, 'tokenizer.chat_template');
  return {
    architecture: arch,
    name: typeof name === 'string' ? name : undefined,
    contextLength: Number(lookup(meta, `${arch}.context_length`)),
    chatTemplate: typeof template === 'string' ? template : undefined,
    fileSize,
  };
}
