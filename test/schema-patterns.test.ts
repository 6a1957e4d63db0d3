/**
 * Patterns the grammar reads through a finite automaton (engines/local/schema-automaton.ts):
 * lookaround, word boundaries and Unicode property escapes. Held to JavaScript's own RegExp, the
 * one the validator uses: every string the automaton allows matches the pattern and its lengths,
 * and, up to the automaton's length bound, every string that matches the pattern in full is one it
 * allows (exact, not a guess). Strings are drawn at random by fast-check.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Ajv } from 'ajv';
import addFormatsModule from 'ajv-formats';
import { patternAutomaton, type Automaton } from '../src/engines/local/schema-automaton.js';
import { FORMAT_PATTERNS } from '../src/engines/local/schema-formats.js';
import { schemaToGbnf } from '../src/engines/local/schema-gbnf.js';

const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (a: Ajv) => Ajv;

function accepts(a: Automaton, s: string): boolean {
  let state = 0;
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    const next = a.states[state]!.out.find(({ chars }) => chars.some(([lo, hi]) => lo <= c && c <= hi));
    if (next === undefined) return false;
    state = next.to;
  }
  return a.states[state]!.final;
}

/** A string the automaton allows, by a walk with the given choices. */
function walk(a: Automaton, choices: number[]): string {
  let state = 0;
  let out = '';
  for (const pick of choices) {
    const s = a.states[state]!;
    if (s.final && (s.out.length === 0 || pick % 5 === 0)) return out;
    const t = s.out[pick % s.out.length]!;
    const [lo, hi] = t.chars[pick % t.chars.length]!;
    out += String.fromCodePoint(lo + (pick % (hi - lo + 1)));
    state = t.to;
  }
  // Out of choices: the shortest way to an end, by the first transition that gets nearer.
  for (let guard = 0; !a.states[state]!.final && guard < 10_000; guard++) {
    const t = a.states[state]!.out[0]!;
    out += String.fromCodePoint(t.chars[0]![0]);
    state = t.to;
  }
  return out;
}

const cases: Array<{ pattern: string; alphabet: string; minLength?: number; maxLength?: number }> = [
  { pattern: '^(?=.*[a-z])(?=.*[A-Z])(?=.*\\d)[A-Za-z\\d]{8,}$', alphabet: 'aZ09x' },
  { pattern: '^(?=.{3,8}$)[a-z]+(?:-[a-z]+)*$', alphabet: 'ab-' },
  { pattern: '^(?!admin$)[a-z]+$', alphabet: 'admin' },
  { pattern: '^(?!\\.)(?!.*\\.\\.)[a-z.]+@[a-z]+\\.[a-z]{2,}$', alphabet: 'a.@z' },
  { pattern: '\\bcat\\b', alphabet: 'cat ' },
  { pattern: '^\\p{Lu}\\p{Ll}+$', alphabet: 'AaÉé1' },
  {
    // zod's z.emoji(): at least one pictograph among emoji components.
    pattern: '^(?=[\\s\\S]*[\\p{Extended_Pictographic}\\p{Regional_Indicator}\\u20E3])[\\p{Extended_Pictographic}\\p{Emoji_Component}]+$',
    alphabet: '1#‼☀a',
  },
  { pattern: '^(?=.*\\d)\\w+$', alphabet: 'a1_', minLength: 4, maxLength: 6 },
  { pattern: '^[a-z]+(?=\\d)\\d+$|^x$', alphabet: 'ax1' },
  // A lookbehind at the end, lookaheads inside the one group between the anchors, in one branch only.
  { pattern: '^[a-z]+(?<!ing)$', alphabet: 'ing' },
  { pattern: '^(?:(?=.*[A-Z])(?=.*\\d)[A-Za-z\\d]{3,})$', alphabet: 'aA1' },
  { pattern: '^((?=.*\\d)\\w+|x)$', alphabet: 'ax1' },
  // A run of lookarounds in the middle: before it held to the lookbehinds, after it to the lookaheads.
  { pattern: '^[a-z]+(?=.*\\d)\\w*$', alphabet: 'a1_' },
  { pattern: '^\\d+(?!px)[a-z]*$', alphabet: '1pxa' },
  { pattern: '^\\w+(?<=\\d)(?=[a-z]{2}$)[a-z]+$', alphabet: 'a1' },
  { pattern: '\\d(?!.*x$)[a-z]+', alphabet: '1ax' },
  // Intermediate automata minimised: three lookaheads over 40 characters stay under the state limit.
  { pattern: '^(?=.*[A-Z])(?=.*\\d)(?=.*[!-/])[!-~]{40}$', alphabet: 'aA1!' },
  { pattern: '^\\p{L}+$', alphabet: 'aé1', minLength: 30 },
];

describe('patterns through an automaton (lookaround, \\b, \\p{…})', () => {
  for (const c of cases) {
    it(`${c.pattern}${c.minLength !== undefined ? ` (lengths ${c.minLength}–${c.maxLength})` : ''}`, () => {
      const made = patternAutomaton(c.pattern, c.minLength, c.maxLength);
      assert.ok(made !== undefined && 'automaton' in made, `no automaton: ${JSON.stringify(made)}`);
      assert.equal(made.lengthsHeld, true);
      const a = made.automaton;
      const re = new RegExp(c.pattern, 'u');
      const full = new RegExp(`^(?:${c.pattern})$`, 'u');
      const lo = c.minLength ?? 0;
      const hi = c.maxLength ?? Infinity;
      // Everything it allows is valid.
      fc.assert(
        fc.property(fc.array(fc.nat(1_000), { maxLength: 40 }), (choices) => {
          const s = walk(a, choices);
          const n = [...s].length;
          return re.test(s) && n >= lo && n <= hi;
        }),
        { numRuns: 500 },
      );
      // Everything valid (matched in full, up to 12 characters) it allows.
      fc.assert(
        fc.property(fc.array(fc.constantFrom(...c.alphabet), { maxLength: 12 }), (chars) => {
          const s = chars.join('');
          const n = chars.length;
          return accepts(a, s) === (full.test(s) && n >= lo && n <= hi);
        }),
        { numRuns: 2_000 },
      );
    });
  }

  it('bounds open-ended strings a little past the shortest, so that a model is led to the end', () => {
    const made = patternAutomaton('^(?=.*\\d)[a-z\\d]+$');
    assert.ok(made !== undefined && 'automaton' in made);
    // The longest string: a path of at most the states' count through an acyclic automaton.
    const longest = (state: number, seen: Set<number>): number => {
      assert.ok(!seen.has(state), 'the automaton has a cycle');
      const next = new Set(seen).add(state);
      return Math.max(0, ...made.automaton.states[state]!.out.map(({ to }) => 1 + longest(to, next)));
    };
    assert.equal(longest(0, new Set()), 33);
  });

  it("a pattern beside a format: strings of the format's grammar that the pattern matches anywhere, valid for ajv-formats", () => {
    const ajv = addFormats(new Ajv({ strict: false }));
    for (const [format, pattern] of [
      ['email', '@example\\.com$'],
      ['uri', '^https://'],
      ['date', '^2024-'],
      ['date-time', '^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(?:\\.\\d+)?Z$'],
      ['uuid', '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'],
      ['ipv4', '^10\\.'],
    ] as const) {
      const made = patternAutomaton(pattern, 0, Infinity, FORMAT_PATTERNS[format]);
      assert.ok(made !== undefined && 'automaton' in made, `${format} ${pattern}: ${JSON.stringify(made)}`);
      const check = ajv.compile({ type: 'string', format, pattern });
      fc.assert(
        fc.property(fc.array(fc.nat(1_000), { maxLength: 60 }), (choices) => {
          const s = walk(made.automaton, choices);
          return check(s) || assert.fail(`${format} ${pattern}: ${JSON.stringify(s)} ${JSON.stringify(check.errors)}`);
        }),
        { numRuns: 300 },
      );
    }
  });

  it('past the state limit, fewer repetitions (a subset): every string still valid', () => {
    // Four lookaheads over `.{8,64}`: about 16 × 57 states, past the 1,000 of the limit.
    const pattern = '^(?=.*[A-Z])(?=.*[a-z])(?=.*\\d)(?=.*[^A-Za-z0-9]).{8,64}$';
    const made = patternAutomaton(pattern, 8, 64);
    assert.ok(made !== undefined && 'automaton' in made, JSON.stringify(made));
    assert.equal(made.lengthsHeld, true);
    const re = new RegExp(pattern, 'u');
    fc.assert(
      fc.property(fc.array(fc.nat(1_000), { maxLength: 80 }), (choices) => {
        const s = walk(made.automaton, choices);
        return re.test(s) && s.length >= 8 && s.length <= 64;
      }),
      { numRuns: 500 },
    );
  });

  it('stays sound where a reading could go wrong: back-references, DEL, lengths without `u`, enum values beyond the BMP', () => {
    // Without `u`, a part cut away from its group would read `\\1` as U+0001: no automaton at all.
    assert.equal(patternAutomaton('^(?!\\1)(a)\\-?$', 0, Infinity, undefined, false), undefined);
    assert.equal(patternAutomaton('^(?=(a))\\1\\-?$', 0, Infinity, undefined, false), undefined);
    // DEL is no character the grammar writes: the pattern is checked, not a 400.
    assert.deepEqual(schemaToGbnf({ type: 'string', pattern: '^\\x7f$' }).checked, ["pattern at '/'"]);
    // Without `u` the automaton counts UTF-16 units, Ajv code points: "😀" matches `[^a]{2}` and
    // has length 1, so nothing within maxLength 1 is not a definite answer.
    assert.equal(patternAutomaton('^\\-?[^a]{2}$', 0, 1, undefined, false), undefined);
    // An enum value beyond the BMP beside a property read as its BMP part: the check judges it.
    const astral = schemaToGbnf({ enum: ['😀', 'A', 'b'], pattern: '^\\p{Lu}$' });
    assert.deepEqual(astral.checked, ["pattern at '/'"]);
    assert.match(astral.gbnf, /😀/u);
    assert.doesNotMatch(astral.gbnf, /"\\"b\\""/);
    // One pattern in fifty properties is one automaton in the grammar, not fifty (MAX_RULES).
    const password = { type: 'string', pattern: '^(?=.*[A-Z])(?=.*[a-z])(?=.*\\d)(?=.*[^A-Za-z0-9]).{8,64}$' };
    const many = schemaToGbnf({
      type: 'object',
      properties: Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`p${i}`, password])),
    });
    assert.ok(many.gbnf.split('\n').length < 1_000, `${many.gbnf.split('\n').length} rules`);
  });

  it('says when no string matches, where the pattern is anchored, and leaves it to the check where it is not', () => {
    assert.deepEqual(patternAutomaton('^(?=.*\\d)[a-z]+$'), { unsatisfiable: 'matches no string' });
    assert.deepEqual(patternAutomaton('^(?=\\w)[a-z]{3}$', 4, 10), { unsatisfiable: 'matches no string within minLength and maxLength' });
    // `x(?=a)` matches nothing in full, but the pattern is not anchored: strings that contain "xa".
    const around = patternAutomaton('x(?=a)');
    assert.ok(around !== undefined && 'automaton' in around, JSON.stringify(around));
    fc.assert(fc.property(fc.array(fc.nat(1_000), { maxLength: 40 }), (choices) => /x(?=a)/u.test(walk(around.automaton, choices))));
    // A property with no character in the BMP (Gothic letters): the grammar cannot write one, but a
    // string of them is valid; left to the check, not refused.
    assert.equal(patternAutomaton('^\\p{Script=Gothic}+$'), undefined);
    // Nothing matches anywhere within the lengths, anchored or not: refused.
    assert.deepEqual(patternAutomaton('^abc\\b', 0, 2), { unsatisfiable: 'matches no string within minLength and maxLength' });
    // Nothing matches in full within the lengths, but text after a match may: `^a(?=b)` is "ab…".
    const ab = patternAutomaton('^a(?=b)', 3);
    assert.ok(ab !== undefined && 'automaton' in ab, JSON.stringify(ab));
    fc.assert(
      fc.property(fc.array(fc.nat(1_000), { maxLength: 40 }), (choices) => {
        const s = walk(ab.automaton, choices);
        return /^a(?=b)/u.test(s) && s.length >= 3;
      }),
    );
    // Back-references are not regular.
    assert.equal(patternAutomaton('^(\\w+) \\1$'), undefined);
  });
});
