/**
 * The numeric rules of the local engine's grammar (engines/local/schema-numbers.ts), held to the
 * guarantee the grammar makes: every number it lets a model write lies in the schema's range. The
 * rules are sampled by a small GBNF sampler written here for the subset they use (literals, classes,
 * repetitions, groups, alternatives), and every sample is parsed as JSON and tested against the
 * bounds, for ranges drawn at random: fractional bounds, ranges inside one whole part, exclusive
 * bounds, negatives, and integers past 2^53.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { integerBounds, integerRange, multiplesIn, numberRange, type NumberBounds } from '../src/engines/local/schema-numbers.js';
import { schemaToGbnf } from '../src/engines/local/schema-gbnf.js';

type Node =
  | { kind: 'lit'; text: string }
  | { kind: 'class'; ranges: Array<[number, number]> }
  | { kind: 'seq'; items: Node[] }
  | { kind: 'alt'; options: Node[] }
  | { kind: 'rep'; node: Node; min: number; max: number };

/** Parses the GBNF expression subset the numeric rules write. */
function parse(expr: string): Node {
  const tokens = expr.match(/"(?:[^"\\]|\\.)*"|\[[^\]]*\]|\{\d+(?:,\d+)?\}|[()|]/g) ?? [];
  let i = 0;
  const alt = (): Node => {
    const options = [seq()];
    while (tokens[i] === '|') {
      i++;
      options.push(seq());
    }
    return options.length === 1 ? options[0]! : { kind: 'alt', options };
  };
  const seq = (): Node => {
    const items: Node[] = [];
    while (i < tokens.length && tokens[i] !== '|' && tokens[i] !== ')') {
      const t = tokens[i++]!;
      let node: Node;
      if (t === '(') {
        node = alt();
        assert.equal(tokens[i++], ')');
      } else if (t.startsWith('"')) node = { kind: 'lit', text: JSON.parse(t) as string };
      else if (t.startsWith('[')) {
        const ranges: Array<[number, number]> = [];
        const body = t.slice(1, -1);
        for (let k = 0; k < body.length; k++) {
          if (body[k + 1] === '-' && k + 2 < body.length) {
            ranges.push([body.charCodeAt(k), body.charCodeAt(k + 2)]);
            k += 2;
          } else ranges.push([body.charCodeAt(k), body.charCodeAt(k)]);
        }
        node = { kind: 'class', ranges };
      } else throw new Error(`unexpected token ${t} in ${expr}`);
      const rep = tokens[i]?.match(/^\{(\d+)(?:,(\d+))?\}$/);
      if (rep) {
        i++;
        node = { kind: 'rep', node, min: Number(rep[1]), max: Number(rep[2] ?? rep[1]) };
      }
      items.push(node);
    }
    return items.length === 1 ? items[0]! : { kind: 'seq', items };
  };
  const root = alt();
  assert.equal(i, tokens.length, `the whole expression is read: ${expr}`);
  return root;
}

/** A random string the expression matches; `pick(n)` chooses among n ways. */
function sample(node: Node, pick: (n: number) => number): string {
  switch (node.kind) {
    case 'lit':
      return node.text;
    case 'class': {
      const [lo, hi] = node.ranges[pick(node.ranges.length)]!;
      return String.fromCharCode(lo + pick(hi - lo + 1));
    }
    case 'seq':
      return node.items.map((n) => sample(n, pick)).join('');
    case 'alt':
      return sample(node.options[pick(node.options.length)]!, pick);
    case 'rep': {
      let out = '';
      const n = node.min + pick(node.max - node.min + 1);
      for (let k = 0; k < n; k++) out += sample(node.node, pick);
      return out;
    }
  }
}

/** Samples of the expression, leaning to both ends of each choice as often as to its middle. */
function samples(expr: string, count: number, seed: number): string[] {
  const root = parse(expr);
  let state = seed >>> 0 || 1;
  const random = (): number => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
  const out: string[] = [];
  for (let k = 0; k < count; k++) {
    const edge = k % 3;
    out.push(sample(root, (n) => (edge === 0 ? 0 : edge === 1 ? n - 1 : Math.floor(random() * n))));
  }
  return out;
}

const inside = (v: number, b: NumberBounds): boolean =>
  (b.exclusiveMin ? v > b.min : v >= b.min) && (b.exclusiveMax ? v < b.max : v <= b.max);

/** Bounds as schemas write them: a few decimal digits, around zero or far from it. */
const boundArb = fc.oneof(
  fc.integer({ min: -2000, max: 2000 }).map((n) => n / 1000),
  fc.integer({ min: -100_000, max: 100_000 }).map((n) => n / 100),
  fc.integer({ min: -50, max: 50 }),
  fc.double({ min: -1e6, max: 1e6, noNaN: true }),
);
const boundsArb = fc
  .record({
    a: boundArb,
    b: boundArb,
    exclusiveMin: fc.boolean(),
    exclusiveMax: fc.boolean(),
    openMin: fc.boolean(),
    openMax: fc.boolean(),
  })
  .map(({ a, b, exclusiveMin, exclusiveMax, openMin, openMax }) => ({
    min: openMin && openMax ? Math.min(a, b) : openMin ? -Infinity : Math.min(a, b),
    max: openMax && !openMin ? Infinity : Math.max(a, b),
    exclusiveMin,
    exclusiveMax,
  }));

describe('numeric ranges in the local grammar', () => {
  it('every number the grammar admits lies in the range, fractional bounds included', () => {
    fc.assert(
      fc.property(boundsArb, fc.integer(), (b, seed) => {
        const expr = numberRange(b);
        if (expr === undefined) return;
        for (const text of samples(expr, 60, seed)) {
          const v = JSON.parse(text) as unknown;
          assert.equal(typeof v, 'number', text);
          assert.ok(inside(v as number, b), `${text} outside ${JSON.stringify(b)}`);
        }
      }),
      { numRuns: 1500 },
    );
  });

  it('a range that cuts one whole part still has values (0.5 to 0.6, 37.2 to 37.9, -0.6 to -0.5)', () => {
    for (const [min, max, exMin, exMax] of [
      [0.5, 0.6, false, false],
      [0.1, 0.9, true, true],
      [2.5, 2.75, false, false],
      [37.2, 37.9, false, false],
      [0.001, 0.002, false, false],
      [-0.6, -0.5, false, false],
      [-0.51, 0.33, false, false],
      [51.28, 51.69, false, false],
      [0.5, 0.5, false, false],
      [1e-7, 2e-7, false, false],
      // A single value that needs 17 digits, and a cut whole part past 10^9.
      [0.30000000000000004, 0.30000000000000004, false, false],
      [63.00000000000001, 63.00000000000001, false, false],
      [61266907025, 61266907025.3, true, false],
    ] as const) {
      const b = { min, max, exclusiveMin: exMin, exclusiveMax: exMax };
      const expr = numberRange(b);
      assert.ok(expr, `no rule for ${JSON.stringify(b)}`);
      const values = samples(expr, 90, 7).map((t) => JSON.parse(t) as number);
      for (const v of values) assert.ok(inside(v, b), `${v} outside ${JSON.stringify(b)}`);
      // Both ends of the range are reached, not one value.
      if (max - min > 1e-6) assert.ok(new Set(values).size > 2, `${JSON.stringify(b)}: ${[...new Set(values)].join(', ')}`);
    }
  });

  it('a range with room for a value at a few digits has a rule', () => {
    fc.assert(
      fc.property(boundsArb, (b) => {
        if (Math.abs(b.min) > 1e9 || Math.abs(b.max) > 1e9 || b.max - b.min < 1e-6) return;
        assert.ok(numberRange(b), JSON.stringify(b));
      }),
      { numRuns: 1500 },
    );
  });

  it('integers: exactly the range, bounds past 2^53 and exclusive ones included', () => {
    const cases: NumberBounds[] = [
      { min: 1e15, max: Infinity, exclusiveMin: false, exclusiveMax: false },
      { min: 1.7e18, max: 1.8e18, exclusiveMin: false, exclusiveMax: false },
      { min: 1e17, max: Infinity, exclusiveMin: true, exclusiveMax: false },
      { min: 1e20, max: 1e20, exclusiveMin: false, exclusiveMax: false },
      { min: -1e19, max: -9e18, exclusiveMin: false, exclusiveMax: true },
      { min: 2 ** 53, max: 2 ** 53 + 10, exclusiveMin: true, exclusiveMax: false },
      { min: -3, max: 250, exclusiveMin: false, exclusiveMax: false },
      { min: 0.5, max: 1.5, exclusiveMin: false, exclusiveMax: false },
    ];
    for (const b of cases) {
      const expr = integerRange(...integerBounds(b));
      assert.ok(expr, `no rule for ${JSON.stringify(b)}`);
      for (const text of samples(expr, 90, 11)) {
        const v = JSON.parse(text) as number;
        assert.ok(Number.isInteger(v) && inside(v, b), `${text} outside ${JSON.stringify(b)}`);
      }
    }
    // Past the largest double: nothing left (no exception), and an open range stops at it.
    assert.equal(
      integerRange(...integerBounds({ min: Number.MAX_VALUE, max: Infinity, exclusiveMin: true, exclusiveMax: false })),
      undefined,
    );
    assert.equal(
      integerRange(...integerBounds({ min: -Infinity, max: -Number.MAX_VALUE, exclusiveMin: false, exclusiveMax: true })),
      undefined,
    );
    for (const text of samples(integerRange(1e308, Infinity)!, 90, 5)) {
      const v = JSON.parse(text) as number;
      assert.ok(Number.isFinite(v) && v >= 1e308, `${text.slice(0, 12)}… parses to ${v}`);
    }
    // A bound written past the largest double parses to Infinity: as a lower bound it leaves no
    // number (Ajv agrees), as an upper one it bounds nothing.
    assert.throws(() => schemaToGbnf(JSON.parse('{"type":"number","minimum":1e400}')), /accepts no value/);
    assert.throws(() => schemaToGbnf(JSON.parse('{"type":"integer","exclusiveMaximum":-1e400}')), /accepts no value/);
    assert.match(schemaToGbnf(JSON.parse('{"anyOf":[{"type":"number","minimum":1e400},{"type":"boolean"}]}')).gbnf, /^root ::= boolean/);
    assert.match(schemaToGbnf(JSON.parse('{"type":"number","maximum":1e400}')).gbnf, /^root ::= number/);
    // An integer with a fractional multipleOf: integers that are multiples, found by walking the integers.
    assert.deepEqual(multiplesIn(0.001, { min: 0.338, max: 38.7, exclusiveMin: false, exclusiveMax: false }, true, 3), ['1', '2', '3']);
    assert.deepEqual(multiplesIn(0.3, { min: 1, max: 10, exclusiveMin: false, exclusiveMax: false }, true), ['3', '6', '9']);
    // Small ranges are matched exactly: every integer in them, and nothing else.
    fc.assert(
      fc.property(fc.integer({ min: -1200, max: 1200 }), fc.integer({ min: 0, max: 600 }), (lo, width) => {
        const re = new RegExp(`^${toRegExp(integerRange(lo, lo + width)!)}$`);
        for (let v = lo - 3; v <= lo + width + 3; v++)
          assert.equal(re.test(String(v)), v >= lo && v <= lo + width, `${v} in [${lo}, ${lo + width}]`);
      }),
      { numRuns: 200 },
    );
  });
});

/** The expression as a regular expression (the same subset), for testing membership. */
function toRegExp(expr: string): string {
  return expr.replace(/"((?:[^"\\]|\\.)*)"|\s+|\(/g, (m, lit: string | undefined) =>
    lit !== undefined ? (JSON.parse(`"${lit}"`) as string).replace(/[.*+?^${}()|[\]\\-]/g, '\\$&') : m === '(' ? '(?:' : '',
  );
}
