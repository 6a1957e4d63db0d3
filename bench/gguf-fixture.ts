/**
 * Writes a Llama-architecture GGUF with random weights of a chosen shape, from a seed. A random model
 * costs the same to run as a trained one of the same shape, so it stands in for realistic sizes
 * (SmolLM-135M by default) that cannot be downloaded here. Output is gibberish by design.
 *
 * Layout (GGUF v3): header, metadata key/values, tensor infos, padding, tensor data at aligned offsets.
 */
import { closeSync, existsSync, mkdirSync, openSync, renameSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';

export interface Shape {
  name: string;
  dim: number;
  layers: number;
  heads: number;
  kvHeads: number;
  ffn: number;
  vocab: number;
  context: number;
}

export const SMOLLM_135M: Shape = {
  name: 'smollm-135m-shaped',
  dim: 576,
  layers: 30,
  heads: 9,
  kvHeads: 3,
  ffn: 1536,
  vocab: 49152,
  context: 2048,
};
/** The same architecture, small: for --quick runs that only check the writer and the harness. */
export const TINY: Shape = { name: 'tiny-shaped', dim: 64, layers: 2, heads: 4, kvHeads: 2, ffn: 128, vocab: 512, context: 512 };

const ALIGNMENT = 32;
const F32 = 0;
const Q8_0 = 8;
const enum Kv {
  U32 = 4,
  I32 = 5,
  F32 = 6,
  String = 8,
  Array = 9,
}

/** xorshift32: small, fast and the same on every machine for a seed. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 0x9e3779b9;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

class Bytes {
  private parts: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  i32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.push(b);
  }
  u64(v: number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  f32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  concat(): Buffer {
    return Buffer.concat(this.parts);
  }
}

type Value =
  | { t: Kv.U32 | Kv.I32 | Kv.F32; v: number }
  | { t: Kv.String; v: string }
  | { t: Kv.Array; of: Kv.String; v: string[] }
  | { t: Kv.Array; of: Kv.F32 | Kv.I32; v: number[] };

function writeValue(b: Bytes, val: Value): void {
  b.u32(val.t);
  switch (val.t) {
    case Kv.U32:
      b.u32(val.v);
      break;
    case Kv.I32:
      b.i32(val.v);
      break;
    case Kv.F32:
      b.f32(val.v);
      break;
    case Kv.String:
      b.str(val.v);
      break;
    case Kv.Array:
      b.u32(val.of);
      b.u64(val.v.length);
      if (val.of === Kv.String) for (const s of val.v as string[]) b.str(s);
      else if (val.of === Kv.F32) for (const n of val.v as number[]) b.f32(n);
      else for (const n of val.v as number[]) b.i32(n);
      break;
  }
}

/** A SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then made-up pieces. */
function vocabulary(size: number): { tokens: string[]; scores: number[]; types: number[] } {
  const tokens = ['<unk>', '<s>', '</s>'];
  const types = [2, 3, 3];
  for (let i = 0; i < 256; i++) {
    tokens.push(`<0x${i.toString(16).toUpperCase().padStart(2, '0')}>`);
    types.push(6);
  }
  for (let i = 0; tokens.length < size; i++) {
    let piece = '';
    for (let n = i; ; n = Math.floor(n / 26) - 1) {
      piece = String.fromCharCode(97 + (n % 26)) + piece;
      if (n < 26) break;
    }
    tokens.push(i % 2 ? piece : `▁${piece}`);
    types.push(1);
  }
  return { tokens, scores: tokens.map((_, i) => -i), types };
}

interface Tensor {
  name: string;
  dims: number[];
  type: typeof F32 | typeof Q8_0;
}

function tensors(s: Shape): Tensor[] {
  const kv = (s.dim / s.heads) * s.kvHeads;
  const list: Tensor[] = [
    { name: 'token_embd.weight', dims: [s.dim, s.vocab], type: Q8_0 },
    { name: 'output_norm.weight', dims: [s.dim], type: F32 },
  ];
  for (let i = 0; i < s.layers; i++) {
    list.push(
      { name: `blk.${i}.attn_norm.weight`, dims: [s.dim], type: F32 },
      { name: `blk.${i}.attn_q.weight`, dims: [s.dim, s.dim], type: Q8_0 },
      { name: `blk.${i}.attn_k.weight`, dims: [s.dim, kv], type: Q8_0 },
      { name: `blk.${i}.attn_v.weight`, dims: [s.dim, kv], type: Q8_0 },
      { name: `blk.${i}.attn_output.weight`, dims: [s.dim, s.dim], type: Q8_0 },
      { name: `blk.${i}.ffn_norm.weight`, dims: [s.dim], type: F32 },
      { name: `blk.${i}.ffn_gate.weight`, dims: [s.dim, s.ffn], type: Q8_0 },
      { name: `blk.${i}.ffn_down.weight`, dims: [s.ffn, s.dim], type: Q8_0 },
      { name: `blk.${i}.ffn_up.weight`, dims: [s.dim, s.ffn], type: Q8_0 },
    );
  }
  return list;
}

const sizeOf = (t: Tensor): number => {
  const n = t.dims.reduce((a, d) => a * d, 1);
  return t.type === F32 ? n * 4 : (n / 32) * 34;
};
const align = (n: number): number => Math.ceil(n / ALIGNMENT) * ALIGNMENT;

/** Ways to break a fixture on purpose (the hostile-model tests). */
export interface Damage {
  /** Metadata keys left out. */
  drop?: string[];
  /** Metadata keys written as a string instead of a number. */
  asString?: string[];
  /** Metadata keys written as 0. */
  zero?: string[];
  /** A ggml type id for the first tensor. */
  firstTensorType?: number;
  /** Claimed tensor count, whatever the file holds. */
  tensorCount?: number;
}

/** Writes the fixture to `path` unless it is already there; returns the path. */
export function writeFixture(path: string, shape: Shape, seed = 42, damage: Damage = {}): string {
  if (existsSync(path)) return path;
  mkdirSync(dirname(path), { recursive: true });
  const vocab = vocabulary(shape.vocab);
  const meta: Array<[string, Value]> = [
    ['general.architecture', { t: Kv.String, v: 'llama' }],
    ['general.name', { t: Kv.String, v: `${shape.name} (random weights, seed ${seed})` }],
    ['general.alignment', { t: Kv.U32, v: ALIGNMENT }],
    ['general.file_type', { t: Kv.U32, v: 7 }],
    ['llama.context_length', { t: Kv.U32, v: shape.context }],
    ['llama.embedding_length', { t: Kv.U32, v: shape.dim }],
    ['llama.block_count', { t: Kv.U32, v: shape.layers }],
    ['llama.feed_forward_length', { t: Kv.U32, v: shape.ffn }],
    ['llama.rope.dimension_count', { t: Kv.U32, v: shape.dim / shape.heads }],
    ['llama.attention.head_count', { t: Kv.U32, v: shape.heads }],
    ['llama.attention.head_count_kv', { t: Kv.U32, v: shape.kvHeads }],
    ['llama.attention.layer_norm_rms_epsilon', { t: Kv.F32, v: 1e-5 }],
    ['llama.rope.freq_base', { t: Kv.F32, v: 10000 }],
    ['llama.vocab_size', { t: Kv.U32, v: shape.vocab }],
    ['tokenizer.ggml.model', { t: Kv.String, v: 'llama' }],
    ['tokenizer.ggml.tokens', { t: Kv.Array, of: Kv.String, v: vocab.tokens }],
    ['tokenizer.ggml.scores', { t: Kv.Array, of: Kv.F32, v: vocab.scores }],
    ['tokenizer.ggml.token_type', { t: Kv.Array, of: Kv.I32, v: vocab.types }],
    ['tokenizer.ggml.bos_token_id', { t: Kv.U32, v: 1 }],
    ['tokenizer.ggml.eos_token_id', { t: Kv.U32, v: 2 }],
    ['tokenizer.ggml.unknown_token_id', { t: Kv.U32, v: 0 }],
  ];
  const edited = meta
    .filter(([k]) => !damage.drop?.includes(k))
    .map(([k, v]): [string, Value] =>
      damage.asString?.includes(k)
        ? [k, { t: Kv.String, v: String((v as { v: unknown }).v) }]
        : damage.zero?.includes(k)
          ? [k, { t: Kv.U32, v: 0 }]
          : [k, v],
    );
  const list = tensors(shape);
  const head = new Bytes();
  head.u32(0x46554747);
  head.u32(3);
  head.u64(damage.tensorCount ?? list.length);
  head.u64(edited.length);
  for (const [key, val] of edited) {
    head.str(key);
    writeValue(head, val);
  }
  let offset = 0;
  for (const [i, t] of list.entries()) {
    head.str(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(i === 0 && damage.firstTensorType !== undefined ? damage.firstTensorType : t.type);
    head.u64(offset);
    offset = align(offset + sizeOf(t));
  }
  const header = head.concat();
  const tmp = `${path}.partial`;
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, header);
    writeSync(fd, Buffer.alloc(align(header.length) - header.length));
    const next = rng(seed);
    // Weights uniform in ±0.02 (Q8_0: an fp16 scale per 32 int8 values); norms 1.
    const scale = Buffer.alloc(2);
    scale.writeUInt16LE(0x0c7d); // fp16 ≈ 0.000274 = 0.02 / 73
    for (const t of list) {
      const size = sizeOf(t);
      const buf = Buffer.alloc(align(size));
      if (t.type === F32) {
        for (let i = 0; i < size; i += 4) buf.writeFloatLE(1, i);
      } else {
        for (let block = 0; block < size; block += 34) {
          scale.copy(buf, block);
          for (let j = 0; j < 32; j += 4) {
            const r = next();
            buf[block + 2 + j] = r & 0xff;
            buf[block + 3 + j] = (r >>> 8) & 0xff;
            buf[block + 4 + j] = (r >>> 16) & 0xff;
            buf[block + 5 + j] = (r >>> 24) & 0xff;
          }
        }
      }
      writeSync(fd, buf);
    }
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  return path;
}
