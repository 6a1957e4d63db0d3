import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ApiError } from '../src/core/errors.js';
import { OutputLimit } from '../src/core/estimate.js';
import { ChatRelay } from '../src/protocols/chat/relay.js';

/**
 * The fast lane's chunk reader on its own, differentially: a stream read in one relay (which learns
 * a template from the upstream's content chunks and skips JSON.parse for the chunks that match it)
 * must give the client exactly the frames, and count exactly the output, that a relay reading every
 * chunk the slow way gives. The reference reads each chunk in a relay of its own, which never has a
 * template (one is learned from a stream's second content chunk and used from the third).
 */

const tooLarge = () => new ApiError('upstream_error', 'too large');
/** One id and time for every relay of a test, so that two relays' frames can be compared. */
const IDS = { id: 'chatcmpl-test0001', created: 1764115200 };
const relay = (catalogue: string, cap = Number.MAX_SAFE_INTEGER, charsPerToken = 32) =>
  new ChatRelay(catalogue, (t) => t, new OutputLimit(cap, charsPerToken), 1 << 20, tooLarge, undefined, false, IDS);

/** Pieces of text: what JSON.stringify writes as it is, what it escapes, and what looks like the JSON around a text. */
const ATOMS = [
  'a',
  ' ',
  'é',
  '😀',
  '\ud800',
  '\udc00',
  '\u2028',
  '\u007f',
  '\u0000',
  '\n',
  '\r',
  '"',
  '\\',
  '/',
  '"content":"',
  '"model"',
  '{',
  '}',
  'null',
];
const text = fc.oneof(
  { weight: 4, arbitrary: fc.array(fc.constantFrom(...ATOMS), { maxLength: 5 }).map((a) => a.join('')) },
  { weight: 3, arbitrary: fc.string({ maxLength: 10 }) },
  { weight: 1, arbitrary: fc.string({ unit: 'grapheme', maxLength: 4 }) },
  { weight: 2, arbitrary: fc.constantFrom('', 'same', ' word') },
);
/** Any value an upstream may put in a field. */
const value = fc.oneof(fc.constant(null), fc.constant(''), text, fc.integer(), fc.constant([]), fc.constant({}), fc.boolean());
const rare = <T>(a: fc.Arbitrary<T>, weight = 4) => fc.oneof({ weight, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: a });
const NAMES = ['vendor-model', 'v/m', 'm"x', '"content":"a"', 'a\u2028b', 'x\ud800', 'model', ''];

type Chunk = Record<string, unknown>;
const defined = (o: Record<string, unknown>): Chunk => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));

const headArb = fc.record({
  id: fc.oneof(fc.constantFrom('chatcmpl-up', 'id "q"', '\ud800'), fc.integer(), fc.constant(undefined)),
  created: fc.constantFrom(7, 8, undefined),
  model: fc.oneof({ weight: 3, arbitrary: fc.constantFrom(...NAMES) }, { weight: 1, arbitrary: fc.constantFrom(undefined, null, 3) }),
  usage: fc.constantFrom(undefined, null),
  decoy: rare(text),
  extra: rare(value),
});
/** A choice but for its content: the fields a stream's chunks repeat. */
const choiceArb = fc.record({
  role: rare(fc.constantFrom('assistant', null)),
  reasoning_content: rare(value),
  reasoning: rare(value, 8),
  refusal: rare(value),
  tool_calls: rare(fc.constantFrom([], null, [{ index: 0, function: { arguments: 'ab' } }])),
  other: rare(value, 6),
  finish: fc.oneof({ weight: 8, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.constantFrom(undefined, 'stop', 'length', '') }),
});
/**
 * The shape of a chunk: everything but its text. Real streams repeat one shape with a new text each
 * time, which is what a template is learned from; a stream here has up to three, and other choices,
 * usage, an error and the way the upstream writes the JSON vary with the shape.
 */
const shapeArb = fc.record({
  head: fc.nat({ max: 2 }),
  choice: choiceArb,
  // The first choice is the content's; up to two more, as written by some servers.
  others: fc.oneof(
    { weight: 8, arbitrary: fc.array(choiceArb, { maxLength: 0 }) },
    { weight: 1, arbitrary: fc.array(choiceArb, { maxLength: 2 }) },
  ),
  noChoices: fc.oneof({ weight: 15, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
  usage: fc.oneof({ weight: 12, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
  error: fc.oneof({ weight: 30, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
  // As JSON.stringify writes it (mostly), or valid JSON it does not write.
  spelling: fc.oneof(
    { weight: 6, arbitrary: fc.constant('plain' as const) },
    { weight: 1, arbitrary: fc.constant('raw-text' as const) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        'spaced' as const,
        'escaped-key' as const,
        'escaped-text' as const,
        'raw-text' as const,
        'raw-control' as const,
        'duplicate' as const,
      ),
    },
  ),
});

type Head = typeof headArb extends fc.Arbitrary<infer H> ? H : never;
type Shape = typeof shapeArb extends fc.Arbitrary<infer S> ? S : never;
type ChoiceSpec = typeof choiceArb extends fc.Arbitrary<infer C> ? C : never;

function choiceOf(ch: ChoiceSpec, index: number, content: unknown): Chunk {
  return defined({
    index,
    delta: defined({
      role: ch.role,
      reasoning_content: ch.reasoning_content,
      reasoning: ch.reasoning,
      content,
      refusal: ch.refusal,
      tool_calls: ch.tool_calls,
      other: ch.other,
    }),
    logprobs: null,
    finish_reason: ch.finish,
  });
}

function chunkOf(head: Head, shape: Shape, content: unknown): Chunk {
  return defined({
    id: head.id,
    object: 'chat.completion.chunk',
    created: head.created,
    model: head.model,
    ...(head.decoy !== undefined && { meta: { content: head.decoy } }),
    choices: shape.noChoices ? [] : [choiceOf(shape.choice, 0, content), ...shape.others.map((c, i) => choiceOf(c, i + 1, 'other'))],
    usage: shape.usage ? { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } : head.usage,
    extra: head.extra,
    ...(shape.error && { error: { message: 'the engine fell over' } }),
  });
}

/** A text written into JSON with only what JSON needs escaped (lone surrogates and U+2028 stay raw). */
const rawString = (t: string) => `"${t.replace(/["\\\u0000-\u001f]/g, (c) => JSON.stringify(c).slice(1, -1))}"`;

function spell(chunk: Chunk, spelling: Shape['spelling'], content: unknown): string {
  const json = JSON.stringify(chunk);
  const written = `"content":${JSON.stringify(content)}`;
  switch (spelling) {
    case 'plain':
      return json;
    case 'spaced':
      return json.replace(/,"/g, ', "');
    case 'escaped-key':
      return json.replace(written, written.replace('"content"', '"\\u0063ontent"'));
    case 'escaped-text':
      return typeof content === 'string'
        ? json.replace(written, `"content":"${[...content].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('')}"`)
        : json;
    case 'raw-text':
      return typeof content === 'string' ? json.replace(written, `"content":${rawString(content)}`) : json;
    case 'raw-control':
      // Not JSON at all where the text has a control character (other than a line end, which ends the line).
      return typeof content === 'string'
        ? json.replace(written, `"content":"${content.replace(/["\\\n\r]/g, (c) => JSON.stringify(c).slice(1, -1))}"`)
        : json;
    case 'duplicate':
      // Duplicate keys: JSON.parse takes the last, here a content of "b" written escaped.
      return `${json.slice(0, -1)},"choices":[{"index":0,"delta":{"content":"\\u0062"},"finish_reason":null}]}`;
  }
}

/** Chunk texts: often a few that repeat (so templates are learned, and a text can equal another chunk's), else anything. */
const contentArb = fc.oneof(
  { weight: 2, arbitrary: fc.constant('b') },
  { weight: 3, arbitrary: fc.constantFrom('same', ' word', 'ZZZZ', 'x\ud800', 'a\tb') },
  { weight: 4, arbitrary: text },
  { weight: 1, arbitrary: value },
);

/** A stream: up to three heads and shapes, the catalogue name, and its chunks' payloads. */
const streamArb = fc
  .record({
    heads: fc.array(headArb, { minLength: 1, maxLength: 3 }),
    shapes: fc.array(shapeArb, { minLength: 1, maxLength: 3 }),
    catalogue: fc.constantFrom('meta-llama/tiny-stories', 'm"x', '"content":"a"', 'a\u2028b', 'x\ud800y', 'model'),
    chunks: fc.array(fc.record({ shape: fc.nat({ max: 2 }), content: contentArb }), { minLength: 1, maxLength: 40 }),
  })
  .map(({ heads, shapes, catalogue, chunks }) => ({
    catalogue,
    payloads: chunks.map(({ shape, content }) => {
      const sh = shapes[shape % shapes.length]!;
      return spell(chunkOf(heads[sh.head % heads.length]!, sh, content), sh.spelling, content);
    }),
  }));

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

/** A stream's SSE text, its lines ended as SSE allows: LF, CRLF or a lone CR. */
const sse = (payloads: readonly string[], eol = '\n') =>
  payloads.map((x) => `data: ${x}${eol}${eol}`).join('') + `data: [DONE]${eol}${eol}`;
const eolArb = fc.constantFrom('\n', '\r\n', '\r');

/** Everything a relay says about a stream it read, but its frames. */
const state = (r: ChatRelay) => ({
  deltas: r.limit.deltas,
  chars: r.limit.chars,
  reasoningChars: r.limit.reasoningChars,
  finish: r.finish,
  usage: r.usage,
  capped: r.capped,
  done: r.done,
  failure: r.failure?.message,
});

/** A chunk that opens a stream and counts nothing. */
const OPENING = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant' }, finish_reason: null }] })}\n\n`;

describe('chat relay', () => {
  it('frames and counts every stream exactly as reading each chunk on its own does, whatever its line ends', () => {
    let usageKept = 0;
    fc.assert(
      fc.property(streamArb, cutsArb, eolArb, ({ catalogue, payloads }, cuts, eol) => {
        const r = relay(catalogue);
        let frames = '';
        for (const p of pieces(sse(payloads, eol), cuts)) frames += r.push(p);
        let expected = '';
        let deltas = 0;
        let chars = 0;
        let reasoning = 0;
        let failed = false;
        // Only the stream's first delta gets the assistant's role: a relay for a later chunk is
        // given the opening first (its frame is not compared).
        let opened = false;
        for (const p of payloads) {
          const one = relay(catalogue);
          if (opened) one.push(OPENING);
          expected += one.push(`data: ${p}\n\n`);
          opened ||= one.opened;
          deltas += one.limit.deltas;
          chars += one.limit.chars;
          reasoning += one.limit.reasoningChars;
          // A failed chunk ends the stream: nothing after it is read.
          if (one.failure) {
            failed = true;
            break;
          }
        }
        assert.equal(frames.slice(0, expected.length), expected);
        assert.deepEqual([r.limit.deltas, r.limit.chars, r.limit.reasoningChars], [deltas, chars, reasoning]);
        assert.equal(r.failure !== undefined, failed);
        // [DONE] adds a finish chunk only where no chunk carried a finish reason.
        assert.ok(
          failed ||
            frames.length === expected.length ||
            /^data: \{.*"finish_reason":"stop"\}\]\}\n\n$/s.test(frames.slice(expected.length)),
        );
        // The usage chunk, where its text is kept, parses to the chunk the canonical way would send.
        const t = r.usageText;
        if (t) {
          const usage = { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3, cost: 0.5 };
          const text = t.before + JSON.stringify(usage) + t.after;
          assert.ok(!text.includes('\n'), text);
          assert.deepEqual(JSON.parse(text), { ...r.usageFrame(), usage });
          usageKept++;
        }
      }),
      { numRuns: 1000, seed: 20261125 },
    );
    assert.ok(usageKept > 0, `usage chunks kept as text: ${usageKept}`);
  });

  it('reads an event of two data lines as one when the CRLF between them is split across two reads', (t) => {
    // A finish chunk the relay writes takes its time from the clock: one clock for both relays.
    t.mock.timers.enable({ apis: ['Date'], now: 1_764_115_200_000 });
    const payload = JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: null }] });
    const [a, b] = [payload.slice(0, 10), payload.slice(10)];
    const r = relay('m');
    // A lone CR at the end of a read: only the next read tells whether it ends a line or starts a CRLF.
    let frames = r.push(`data: ${a}\r`);
    // An empty read in between (a decoder holding part of a character gives one) changes nothing.
    frames += r.push('');
    frames += r.push(`\ndata: ${b}\r\n\r\n`);
    frames += r.push('data: [DONE]\r\r');
    const reference = relay('m');
    const expected = reference.push(`data: ${a}\ndata: ${b}\n\ndata: [DONE]\n\n`);
    assert.equal(r.failure, undefined);
    assert.equal(frames, expected);
    assert.deepEqual(state(r), state(reference));
  });

  it('puts in the chunk members an upstream left out: logprobs, object, and usage: null where the client asked for usage', () => {
    // Some servers write chunks without `logprobs` (vLLM and llama.cpp's do not, Ollama's and
    // routing providers' sometimes do); openai-wire.md's chunk has it, and with include_usage every
    // chunk before the usage chunk has `usage: null`, on the canonical lane as well.
    const bare = (content: string, finish: string | null = null, usage?: null) =>
      `data: ${JSON.stringify({ id: 'up', created: 1, model: 'u', choices: [{ index: 0, delta: { content }, finish_reason: finish }], usage })}\n\n`;
    // Whether the upstream wrote `usage: null` (it does when asked for the usage, and Switchyard
    // always asks): a client that did not ask reads no usage member, as on the canonical lane.
    for (const [usageNull, upstreamNull] of [
      [false, false],
      [true, false],
      [false, true],
      [true, true],
    ] as const) {
      const u = upstreamNull ? null : undefined;
      const stream = [
        bare('a', null, u),
        bare('b', null, u),
        bare('c', null, u),
        bare('d', null, u),
        bare('', 'stop', u),
        'data: [DONE]\n\n',
      ];
      const r = new ChatRelay('m', (t) => t, new OutputLimit(1000), 1 << 20, tooLarge, undefined, usageNull, IDS);
      const chunks = stream
        .map((f) => r.push(f))
        .join('')
        .split('\n\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);
      assert.equal(chunks.length, 5);
      for (const ch of chunks) {
        assert.equal(ch['object'], 'chat.completion.chunk');
        assert.deepEqual(
          (ch['choices'] as Array<Record<string, unknown>>).map((c) => c['logprobs']),
          [null],
        );
        // The third and fourth are written from a template learned from the second.
        if (usageNull) assert.ok('usage' in ch && ch['usage'] === null, JSON.stringify(ch));
        else assert.ok(!('usage' in ch), JSON.stringify(ch));
      }
      assert.equal(chunks.map((c) => (c['choices'] as Array<{ delta: { content: string } }>)[0]!.delta.content).join(''), 'abcd');
    }
    // A finish chunk the relay writes itself (the upstream ended without one) has them too.
    const r = new ChatRelay('m', (t) => t, new OutputLimit(1000), 1 << 20, tooLarge, undefined, true, IDS);
    const last = r
      .push(bare('a') + 'data: [DONE]\n\n')
      .split('\n\n')
      .filter(Boolean)
      .at(-1)!;
    assert.deepEqual(JSON.parse(last.slice(6))['usage'], null);
  });

  it('drops a BOM at the start of a stream, as SSE does, and only there', () => {
    const payload = JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: null }] });
    const r = relay('m');
    const frames = r.push('') + r.push(`\ufeffdata: ${payload}\n\n`) + r.push('\ufeffdata: [DONE]\n\n');
    const reference = relay('m');
    assert.equal(frames, reference.push(`data: ${payload}\n\n`));
    assert.equal(r.limit.chars, 2);
    assert.equal(r.done, false, 'a BOM later in the stream is not dropped: that line is an unknown field');
  });

  it('counts, cuts and ends a stream at the output limit as the parsing path does', (t) => {
    // The `length` finish chunk takes its time from the clock where the upstream's chunks gave
    // none: both readings of a stream must see the same second.
    t.mock.timers.enable({ apis: ['Date'], now: 1_764_115_200_000 });
    // The same stream written with a space after each opening brace: valid JSON that JSON.stringify
    // does not write, so no template is ever learned from it; what the client parses must be the same.
    // Two characters a token as well as 32: most streams are then cut inside a delta's text.
    fc.assert(
      fc.property(streamArb, fc.nat({ max: 30 }), fc.constantFrom(2, 32), cutsArb, ({ catalogue, payloads }, cap, perToken, cuts) => {
        const read = (ps: readonly string[]) => {
          const r = relay(catalogue, cap, perToken);
          let frames = '';
          for (const p of pieces(sse(ps), cuts)) frames += r.push(p);
          const parsed = frames
            .split('\n\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l.slice(6)) as unknown);
          return { parsed, ...state(r) };
        };
        assert.deepEqual(read(payloads), read(payloads.map((p) => `{ ${p.slice(1)}`)));
      }),
      { numRuns: 1000, seed: 20261126 },
    );
  });

  it('cuts a delta that goes past the character limit where the limit is, as the canonical lane does, and bills what passed', () => {
    // Four tokens of at most 32 characters: 128 characters pass (the hostile pass's 129-character
    // delta was dropped whole, an empty answer billed at no output).
    const frame = (delta: object, finish: string | null = null) =>
      `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    type Parsed = { choices: Array<{ delta: Record<string, unknown>; finish_reason: string | null }>; usage?: unknown };
    const run = (frames: string[]) => {
      const r = relay('m', 4);
      const out = frames.map((f) => r.push(f)).join('');
      return {
        r,
        parsed: out
          .split('\n\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l.slice(6)) as Parsed),
      };
    };
    const long = 'a'.repeat(129);
    const one = run([frame({ role: 'assistant', content: long }, 'stop'), 'data: [DONE]\n\n']);
    assert.deepEqual(
      one.parsed.map((p) => [p.choices[0]!.delta['content'], p.choices[0]!.finish_reason]),
      [
        ['a'.repeat(128), null],
        [undefined, 'length'],
      ],
    );
    assert.equal(one.r.limit.chars, 128);
    assert.equal(one.r.limit.deltas, 1);
    assert.equal(one.r.capped, true);
    // After a learned template: the matched chunk is cut the same way.
    const templated = run([frame({ content: 'ab' }), frame({ content: 'cd' }), frame({ content: 'ef' }), frame({ content: long })]);
    assert.deepEqual(
      templated.parsed.map((p) => p.choices[0]!.delta['content'] ?? p.choices[0]!.finish_reason),
      ['ab', 'cd', 'ef', 'a'.repeat(122), 'length'],
    );
    // A surrogate pair is not split: the cut falls before it.
    const emoji = run([frame({ content: `${'a'.repeat(127)}\u{1F600}b` })]);
    assert.equal(emoji.parsed[0]!.choices[0]!.delta['content'], 'a'.repeat(127));
    // Reasoning, then content, in one delta: the reasoning passes, the content is cut, and a tool
    // call after the limit, and the upstream's usage in that chunk, are taken out.
    const mixed = run([
      `data: ${JSON.stringify({
        id: 'c',
        object: 'chat.completion.chunk',
        created: 1,
        model: 'm',
        choices: [
          {
            index: 0,
            delta: {
              reasoning_content: 'r'.repeat(100),
              content: 'c'.repeat(100),
              tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } }],
            },
            finish_reason: 'stop',
          },
        ],
        usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
      })}\n\n`,
    ]);
    assert.deepEqual(mixed.parsed[0]!.choices[0], {
      index: 0,
      // The stream's first delta: the assistant's role put in.
      delta: { reasoning_content: 'r'.repeat(100), content: 'c'.repeat(28), role: 'assistant' },
      logprobs: null,
      finish_reason: null,
    });
    // The usage is taken out (it goes in the usage chunk); this client did not ask for usage, so
    // no `usage: null` is left in its place either.
    assert.ok(!('usage' in mixed.parsed[0]!), JSON.stringify(mixed.parsed[0]));
    assert.equal(mixed.parsed[1]!.choices[0]!.finish_reason, 'length');
    assert.equal(mixed.r.limit.reasoningChars, 100);
    assert.equal(mixed.r.limit.chars, 128);
  });

  it('learns a template from a plain stream and still cuts it at the output limit', () => {
    const chunk = (i: number) =>
      `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: ` w${i}` }, finish_reason: null }] })}\n\n`;
    const r = relay('meta-llama/tiny-stories', 5);
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
    assert.equal(r.limit.deltas, 5);
    assert.ok(frames.every((f) => f.model === 'meta-llama/tiny-stories'));
  });

  it('gives a non-stream answer as its own text, with only the model, id, time and usage changed, wherever that is exact', () => {
    const USAGE = { prompt_tokens: 4, completion_tokens: 3, total_tokens: 7, cost: 1e-5 };
    const answerArb = fc.record({
      head: headArb,
      content: contentArb,
      usage: fc.constantFrom(undefined, null, { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 }, { n: [1, { m: '}' }] }),
      nested: rare(fc.constantFrom({ model: 'x' }, { usage: { a: 1 } }, ['model', 'usage', '{"usage":1}'])),
      // Where usage and the nested field go: JSON.stringify keeps insertion order.
      usageFirst: fc.boolean(),
      nestedFirst: fc.boolean(),
      spelling: fc.constantFrom('plain', 'indented', 'tabs', 'spaced', 'escaped-model', 'escaped-usage', 'duplicate-usage', 'numbers'),
      catalogue: fc.constantFrom('meta-llama/tiny-stories', 'm"x', 'a\u2028b', 'model', 'usage'),
      // Whether the upstream wrote the members OpenAI's schema requires that some upstreams leave out.
      complete: fc.oneof({ weight: 3, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
    });
    let kept = 0;
    fc.assert(
      fc.property(answerArb, (a) => {
        const body: Chunk = {};
        if (a.usageFirst && a.usage !== undefined) body['usage'] = a.usage;
        if (a.nestedFirst && a.nested !== undefined) body['meta'] = a.nested;
        Object.assign(
          body,
          defined({ id: a.head.id, object: 'chat.completion', created: a.head.created, model: a.head.model, extra: a.head.extra }),
        );
        body['choices'] = [
          a.complete
            ? { index: 0, message: { role: 'assistant', content: a.content, refusal: null }, logprobs: null, finish_reason: 'stop' }
            : { index: 0, message: { role: 'assistant', content: a.content }, finish_reason: 'stop' },
        ];
        if (!a.usageFirst && a.usage !== undefined) body['usage'] = a.usage;
        if (!a.nestedFirst && a.nested !== undefined) body['meta'] = a.nested;
        let text = JSON.stringify(body, null, a.spelling === 'indented' ? 2 : a.spelling === 'tabs' ? '\t' : undefined);
        if (a.spelling === 'spaced') text = text.replace(/":/g, '" : ').replace(/,"/g, ' ,  "');
        if (a.spelling === 'escaped-model') text = text.replace('"model"', '"mod\\u0065l"');
        if (a.spelling === 'escaped-usage') text = text.replace('"usage"', '"\\u0075sage"');
        if (a.spelling === 'duplicate-usage') text = `${text.slice(0, -1)},"usage":{"prompt_tokens":9}}`;
        if (a.spelling === 'numbers') text = text.replace('"created":7', '"created":7.0e0').replace('"index":0', '"index":-0');
        const parsed = JSON.parse(text) as Chunk;
        const r = relay(a.catalogue);
        const answer = JSON.parse(text) as Chunk;
        assert.equal(r.answer(answer, text), true);
        // Switchyard's own id and time, and the members the schema requires, in the answer as parsed.
        const choice = (answer['choices'] as Chunk[])[0]!;
        assert.deepEqual([answer['id'], answer['created'], answer['model']], [IDS.id, IDS.created, a.catalogue]);
        assert.deepEqual([choice['logprobs'], (choice['message'] as Chunk)['refusal']], [null, null]);
        const t = r.answerText;
        // An answer that lacked them is serialized with them.
        if (!a.complete) assert.equal(t, undefined);
        const plain = a.spelling === 'plain' || a.spelling === 'indented' || a.spelling === 'tabs' || a.spelling === 'spaced';
        const escapes = text.includes('\\u');
        // Where it can be exact (the usual upstream: the two keys written once), it is kept.
        const once = (key: string) => text.split(key).length === 2;
        const head = a.head.model !== undefined && a.head.id !== undefined && a.head.created !== undefined;
        const onceEach = once('"model"') && once('"id"') && once('"created"') && (a.usage === undefined || once('"usage"'));
        if (a.complete && plain && !escapes && head && onceEach) assert.ok(t, text);
        if (!t) return;
        kept++;
        const out = t.before + JSON.stringify(USAGE) + t.after;
        // What the client parses: the upstream's answer, the catalogue's model and the metered usage.
        assert.deepEqual(JSON.parse(out), { ...parsed, id: IDS.id, created: IDS.created, model: a.catalogue, usage: USAGE }, out);
      }),
      { numRuns: 3000 },
    );
    // Fewer than before ids and times were Switchyard's: an upstream's answer without either is serialized.
    assert.ok(kept > 250, `kept ${kept}`);
  });

  it('takes out calls to tools the request does not allow, their arguments uncounted, as the canonical lane suppresses them', () => {
    const head = { id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm' };
    const chunk = (delta: object, finish: string | null = null) =>
      `data: ${JSON.stringify({ ...head, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const call = (index: number, name: string) => ({
      tool_calls: [{ index, id: `call_${index}`, type: 'function', function: { name, arguments: '' } }],
    });
    const args = (index: number, text: string) => ({ tool_calls: [{ index, function: { arguments: text } }] });
    const stream = [
      chunk({ role: 'assistant', content: null }),
      chunk(call(0, 'delete_everything')),
      chunk(args(0, '{"all":')),
      chunk(args(0, 'true}')),
      chunk(call(1, 'get_weather')),
      chunk(args(1, '{"city":"Paris"}')),
      chunk({}, 'tool_calls'),
      'data: [DONE]\n\n',
    ].join('');
    const read = (callable: ReadonlySet<string> | undefined) => {
      const r = new ChatRelay('cat/model', (t) => t, new OutputLimit(1000), 1 << 20, tooLarge, callable, false, IDS);
      const frames = r
        .push(stream)
        .split('\n\n')
        .filter(Boolean)
        .map(
          (f) =>
            JSON.parse(f.slice(6)) as {
              model: string;
              choices: Array<{
                delta: { tool_calls?: Array<{ index: number; function: { name?: string; arguments: string } }> };
                finish_reason: string | null;
              }>;
            },
        );
      const calls = frames.flatMap((f) => f.choices[0]!.delta.tool_calls ?? []);
      return { r, frames, calls, finish: frames.at(-1)!.choices[0]!.finish_reason };
    };

    // Every call passes where the request allows any (the relay is given no set).
    const all = read(undefined);
    assert.deepEqual(new Set(all.calls.map((c) => c.index)), new Set([0, 1]));
    assert.equal(all.r.limit.chars, '{"all":true}{"city":"Paris"}'.length);

    // Only get_weather offered: the other call's start and arguments are gone, and not counted.
    const some = read(new Set(['get_weather']));
    assert.deepEqual(
      some.calls.map((c) => [c.index, c.function.name, c.function.arguments]),
      [
        [1, 'get_weather', ''],
        [1, undefined, '{"city":"Paris"}'],
      ],
    );
    assert.equal(some.finish, 'tool_calls');
    assert.equal(some.r.limit.chars, '{"city":"Paris"}'.length);
    assert.equal(some.frames.length, 4, 'the chunks that carried only the suppressed call are not sent');
    assert.ok(some.frames.every((f) => f.model === 'cat/model'));

    // No tools offered: no call at all, and the turn ends as a stop.
    const none = read(new Set());
    assert.deepEqual(none.calls, []);
    assert.equal(none.finish, 'stop');
    assert.equal(none.r.finish, 'stop');
    assert.equal(none.r.limit.chars, 0);

    // Calls found as the canonical lane's reader finds them: a call without a name is not allowed,
    // a delta without an index belongs to the call with its id, and extra choices and a legacy
    // function_call of a tool not offered are taken out.
    const r = new ChatRelay('cat/model', (t) => t, new OutputLimit(1000), 1 << 20, tooLarge, new Set(['get_weather']), false, IDS);
    const unindexed = (delta: object) => chunk({ tool_calls: [delta] });
    const out = r
      .push(
        [
          chunk({ tool_calls: [{ index: 5, id: 'anon', function: { arguments: '{"x":1}' } }] }),
          unindexed({ id: 'c1', type: 'function', function: { name: 'delete_everything', arguments: '' } }),
          unindexed({ id: 'c2', type: 'function', function: { name: 'get_weather', arguments: '' } }),
          unindexed({ id: 'c1', function: { arguments: '{"all":true}' } }),
          unindexed({ id: 'c2', function: { arguments: '{"city":"Oslo"}' } }),
          `data: ${JSON.stringify({
            ...head,
            choices: [
              { index: 0, delta: { content: 'a' } },
              { index: 1, delta: { content: 'unbilled' } },
            ],
          })}\n\n`,
          chunk({ function_call: { name: 'delete_everything', arguments: '{}' } }),
          'data: [DONE]\n\n',
        ].join(''),
      )
      .split('\n\n')
      .filter(Boolean)
      .map((f) => JSON.parse(f.slice(6)) as { choices: Array<{ delta: Record<string, unknown> }> });
    assert.deepEqual(
      out.map((f) => f.choices.map((c) => c.delta)),
      [
        // The first delta that goes out opens the message with the assistant's role.
        [{ tool_calls: [{ id: 'c2', type: 'function', function: { name: 'get_weather', arguments: '' } }], role: 'assistant' }],
        [{ tool_calls: [{ id: 'c2', function: { arguments: '{"city":"Oslo"}' } }] }],
        [{ content: 'a' }],
        [{}],
      ],
    );
    assert.equal(r.limit.chars, '{"city":"Oslo"}a'.length);

    // A whole answer that calls a tool not allowed goes to the canonical lane, which suppresses it.
    const answer = {
      ...head,
      object: 'chat.completion',
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            tool_calls: [{ id: 'a', type: 'function', function: { name: 'delete_everything', arguments: '{}' } }],
          },
          finish_reason: 'tool_calls',
        },
      ],
    };
    const text = JSON.stringify(answer);
    const relayOf = (callable: ReadonlySet<string>) =>
      new ChatRelay('cat/model', (t) => t, new OutputLimit(1000), 1 << 20, tooLarge, callable, false, IDS);
    assert.equal(relayOf(new Set(['get_weather'])).answer(JSON.parse(text), text), false);
    assert.equal(relayOf(new Set(['delete_everything'])).answer(JSON.parse(text), text), true);
    // So does one with a second choice, a call without a name, or a legacy call not allowed.
    const variant = (f: (a: typeof answer) => object) => {
      const t = JSON.stringify(f(structuredClone(answer)));
      return relayOf(new Set(['delete_everything'])).answer(JSON.parse(t), t);
    };
    assert.equal(
      variant((a) => ({ ...a, choices: [a.choices[0], { ...a.choices[0], index: 1 }] })),
      false,
    );
    assert.equal(
      variant((a) => {
        a.choices[0]!.message.tool_calls[0]!.function = { arguments: '{}' } as never;
        return a;
      }),
      false,
    );
    assert.equal(
      variant((a) => ({
        ...a,
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: null, function_call: { name: 'rm', arguments: '{}' } },
            finish_reason: 'function_call',
          },
        ],
      })),
      false,
    );
  });
});
