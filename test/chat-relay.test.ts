import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ApiError } from '../src/core/errors.js';
import { ChatRelay } from '../src/protocols/chat/relay.js';

/**
 * The fast lane's chunk reader on its own, differentially: a stream read in one relay (which learns
 * a template from the upstream's content chunks and skips JSON.parse for the chunks that match it)
 * must give the client exactly the frames, and count exactly the output, that a relay reading every
 * chunk the slow way gives. The reference reads each chunk in a relay of its own, which never has a
 * template (one is learned from a stream's second content chunk and used from the third).
 */

const CATALOGUE = 'meta-llama/tiny-stories';
const tooLarge = () => new ApiError('upstream_error', 'too large');
const relay = (cap = Number.MAX_SAFE_INTEGER) => new ChatRelay(CATALOGUE, (t) => t, cap, 32, 1 << 20, tooLarge);

/** Text that JSON.stringify writes as it is, and text it escapes (quotes, backslashes, controls, lone surrogates). */
const text = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 6 }) },
  { weight: 1, arbitrary: fc.constantFrom('"', '\\', 'a\nb', '\r', '\t', '\ud800', 'x\udc00y', '😀', '\u2028', 'é', '') },
);

type Chunk = Record<string, unknown>;

/** One stream: fixed head fields, then chunks of every kind an upstream sends, each written plainly or Python-style. */
const streamArb = fc
  .record({
    id: fc.constantFrom('chatcmpl-up', 'id with "quote"', 'x'),
    model: fc.constantFrom('vendor-model', 'vendor/model', 'm"x'),
    withModel: fc.boolean(),
    withUsageNull: fc.boolean(),
  })
  .chain((head) => {
    const base = (): Chunk => ({
      id: head.id,
      object: 'chat.completion.chunk',
      created: 7,
      ...(head.withModel && { model: head.model }),
      ...(head.withUsageNull && { usage: null }),
    });
    const choice = (delta: object, finish: string | null = null) => ({
      ...base(),
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    });
    const chunk: fc.Arbitrary<Chunk> = fc.oneof(
      { weight: 10, arbitrary: text.map((t) => choice({ content: t })) },
      { weight: 1, arbitrary: text.map((t) => choice({ role: 'assistant', content: t })) },
      { weight: 1, arbitrary: text.map((t) => choice({ reasoning_content: t })) },
      { weight: 1, arbitrary: text.map((t) => choice({ content: t, refusal: '' })) },
      { weight: 1, arbitrary: text.map((t) => choice({ content: t, extra: t })) },
      { weight: 1, arbitrary: text.map((t) => ({ ...choice({ content: 'same' }), obfuscation: t })) },
      { weight: 1, arbitrary: text.map((t) => choice({ content: t }, 'stop')) },
      {
        weight: 1,
        arbitrary: text.map((t) =>
          choice({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: t } }] }),
        ),
      },
      { weight: 1, arbitrary: fc.constant({ ...base(), choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } }) },
    );
    return fc.array(
      fc.record({ chunk, spaced: fc.nat({ max: 4 }).map((n) => n === 0) }).map(({ chunk: c, spaced }) => {
        const json = JSON.stringify(c);
        return spaced ? json.replace(/,"/g, ', "') : json;
      }),
      { minLength: 1, maxLength: 40 },
    );
  });

/** A stream's text split into the network pieces it arrived in. */
const cutsArb = fc.array(fc.nat({ max: 4000 }), { maxLength: 6 });

function pieces(all: string, cuts: number[]): string[] {
  const at = [...new Set(cuts.map((c) => c % (all.length + 1)))].sort((a, b) => a - b);
  const out: string[] = [];
  let from = 0;
  for (const c of at) {
    out.push(all.slice(from, c));
    from = c;
  }
  out.push(all.slice(from));
  return out;
}

describe('chat relay', () => {
  it('frames and counts every stream exactly as reading each chunk on its own does', () => {
    fc.assert(
      fc.property(streamArb, cutsArb, (payloads, cuts) => {
        const r = relay();
        let frames = '';
        for (const p of pieces(payloads.map((x) => `data: ${x}\n\n`).join('') + 'data: [DONE]\n\n', cuts)) frames += r.push(p);
        let expected = '';
        let deltas = 0;
        let chars = 0;
        let reasoning = 0;
        for (const p of payloads) {
          const one = relay();
          expected += one.push(`data: ${p}\n\n`);
          deltas += one.deltas;
          chars += one.chars;
          reasoning += one.reasoningChars;
        }
        // The stream's end: [DONE] adds a finish chunk only where no chunk carried a finish reason.
        const finished = payloads.some(
          (p) => (JSON.parse(p) as { choices?: Array<{ finish_reason: unknown }> }).choices?.[0]?.finish_reason,
        );
        const tail = frames.slice(expected.length);
        assert.equal(frames.slice(0, expected.length), expected);
        if (finished) assert.equal(tail, '');
        else assert.match(tail, /^data: \{.*"finish_reason":"stop"\}\]\}\n\n$/);
        assert.deepEqual([r.deltas, r.chars, r.reasoningChars], [deltas, chars, reasoning]);
        assert.equal(r.done, true);
        assert.equal(r.failure, undefined);
        for (const line of frames.split('\n\n').filter(Boolean)) {
          const chunk = JSON.parse(line.slice(6)) as Chunk;
          assert.equal(chunk['model'], CATALOGUE);
        }
      }),
      { numRuns: 400, seed: 20261125 },
    );
  });

  it('learns a template from a plain stream and still cuts it at the output limit', () => {
    const chunk = (i: number) =>
      `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: ` w${i}` }, finish_reason: null }] })}\n\n`;
    const r = relay(5);
    let out = '';
    for (let i = 0; i < 50; i++) out += r.push(chunk(i));
    const frames = out
      .split('\n\n')
      .filter(Boolean)
      .map(
        (l) => JSON.parse(l.slice(6)) as { model: string; choices: Array<{ delta: { content?: string }; finish_reason: string | null }> },
      );
    assert.deepEqual(
      frames.map((f) => f.choices[0]!.delta.content ?? f.choices[0]!.finish_reason),
      [' w0', ' w1', ' w2', ' w3', ' w4', 'length'],
    );
    assert.equal(r.capped, true);
    assert.equal(r.deltas, 5);
    assert.ok(frames.every((f) => f.model === CATALOGUE));
  });
});
