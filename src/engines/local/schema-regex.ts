/**
 * JSON Schema `pattern` (an ECMA-262 regex) → GBNF for the text of a JSON string. The grammar
 * accepts strings that match the whole pattern: a subset of what the pattern accepts (it is not
 * anchored), and every one of them valid. Characters that JSON must escape are written escaped.
 * Lookaround, word boundaries and Unicode properties, which have no element-by-element equivalent,
 * make `patternToGbnf` return undefined; `patternAutomatonGbnf` writes them as a finite automaton
 * (schema-automaton.ts) into rules the caller keeps. What neither can express (back-references, a
 * lookbehind at the start) the caller leaves to the schema check.
 *
 * Parsed with regexpp (the ESLint project's ECMAScript regex parser), so the syntax accepted is
 * exactly JavaScript's, with or without the `u` flag as the validator compiles it.
 */
import type { AST } from '@eslint-community/regexpp';
import { ESCAPED, PLAIN, parsePattern, type Ranges } from './regex-syntax.js';
import { patternAutomaton, type Automaton } from './schema-automaton.js';

class Unsupported extends Error {}

/** Repetitions above this are written as this many (a subset); a pattern needing more is left to the check. */
const MAX_REPEAT = 256;
/** Characters of the Basic Multilingual Plane only: `.` and counts mean the same with and without the `u` flag. */
const TOP = 0xffff;

const DIGIT: Ranges = [[0x30, 0x39]];
const WORD: Ranges = [
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
];
const SPACE: Ranges = [
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
];
const LINE_TERMINATORS: Ranges = [
  [0x0a, 0x0a],
  [0x0d, 0x0d],
  [0x2028, 0x2029],
];

function normalise(r: Ranges): Ranges {
  const sorted = r.filter(([a, b]) => a <= b).sort((x, y) => x[0] - y[0]);
  const out: Ranges = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

function complement(r: Ranges): Ranges {
  const out: Ranges = [];
  let next = 0;
  for (const [a, b] of normalise(r)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= TOP) out.push([next, TOP]);
  return out;
}

function intersect(r: Ranges, s: Ranges): Ranges {
  const out: Ranges = [];
  for (const [a, b] of r) for (const [c, d] of s) if (Math.max(a, c) <= Math.min(b, d)) out.push([Math.max(a, c), Math.min(b, d)]);
  return normalise(out);
}

const classChar = (c: number): string =>
  /[a-zA-Z0-9]/.test(String.fromCharCode(c)) ? String.fromCharCode(c) : c < 0x100 ? `\\x${hex(c, 2)}` : `\\u${hex(c, 4)}`;
const hex = (c: number, n: number): string => c.toString(16).toUpperCase().padStart(n, '0');

/** A GBNF expression for one character of the set, as JSON text. */
function charSet(r: Ranges): string {
  const set = normalise(r);
  const plain = intersect(set, PLAIN);
  const alts: string[] = [];
  if (plain.length > 0) {
    const only = plain[0]!;
    if (plain.length === 1 && only[0] === only[1] && /[a-zA-Z0-9 _.,:;!?@#$%&*+=~^'`|<>()[\]{}\/-]/.test(String.fromCharCode(only[0])))
      alts.push(JSON.stringify(String.fromCharCode(only[0])));
    else alts.push(`[${plain.map(([a, b]) => (a === b ? classChar(a) : `${classChar(a)}-${classChar(b)}`)).join('')}]`);
  }
  for (const [c, text] of ESCAPED) if (set.some(([a, b]) => a <= c && c <= b)) alts.push(text);
  if (alts.length === 0) throw new Unsupported('a character class that matches no character a JSON string can hold');
  return alts.length === 1 ? alts[0]! : `( ${alts.join(' | ')} )`;
}

function setOf(node: AST.CharacterSet): Ranges {
  switch (node.kind) {
    // regexpp's AnyCharacterSet: the `.` of a pattern, every character but a line terminator.
    case 'any':
      return complement(LINE_TERMINATORS);
    case 'digit':
      return node.negate ? complement(DIGIT) : DIGIT;
    case 'word':
      return node.negate ? complement(WORD) : WORD;
    case 'space':
      return node.negate ? complement(SPACE) : SPACE;
    default:
      throw new Unsupported('Unicode property escapes');
  }
}

function classRanges(node: AST.CharacterClass): Ranges {
  if (node.unicodeSets) throw new Unsupported('set notation');
  const r: Ranges = [];
  for (const e of node.elements) {
    if (e.type === 'Character') r.push([e.value, e.value]);
    else if (e.type === 'CharacterClassRange') r.push([e.min.value, e.max.value]);
    else if (e.type === 'CharacterSet') r.push(...setOf(e));
    else throw new Unsupported('set notation');
  }
  return node.negate ? complement(r) : normalise(r);
}

interface Position {
  atStart: boolean;
  atEnd: boolean;
  /** The most repetitions past its minimum an unbounded quantifier is written with (Infinity: unbounded). */
  open: number;
}

function alternatives(alts: AST.Alternative[], pos: Position): string {
  const parts = alts.map((a) => sequence(a, pos));
  return parts.length === 1 ? parts[0]! : `( ${parts.join(' | ')} )`;
}

function sequence(alt: AST.Alternative, pos: Position): string {
  const out: string[] = [];
  const n = alt.elements.length;
  // An anchor counts as at the start while only anchors come before it (and likewise at the end).
  let firstReal = alt.elements.findIndex((e) => e.type !== 'Assertion');
  if (firstReal < 0) firstReal = n;
  let lastReal = n - 1;
  while (lastReal >= 0 && alt.elements[lastReal]!.type === 'Assertion') lastReal--;
  alt.elements.forEach((e, i) => {
    const expr = element(e, { atStart: pos.atStart && i <= firstReal, atEnd: pos.atEnd && i >= lastReal, open: pos.open });
    if (expr) out.push(expr);
  });
  return out.length === 0 ? '""' : out.join(' ');
}

/**
 * How many repetitions past its minimum an open quantifier is written with: `open`, unless a
 * repetition is nested in it. llama.cpp expands a bounded repetition by copying its body, and
 * refuses a bounded one inside another (a semver pattern's `(\.[0-9a-z-]+)*`) past a few thousand
 * copies; the inner ones stay bounded, the outer one open.
 */
function openPast(q: AST.Quantifier, open: number): number {
  return repeats(q.element) ? Infinity : open;
}

/** Whether a repetition (of more than one) is in the node. */
function repeats(e: AST.Node): boolean {
  switch (e.type) {
    case 'Quantifier':
      return e.max > 1 || repeats(e.element);
    case 'Group':
    case 'CapturingGroup':
      return e.alternatives.some(repeats);
    case 'Alternative':
      return e.elements.some(repeats);
    default:
      return false;
  }
}

function element(e: AST.Element, pos: Position): string | undefined {
  switch (e.type) {
    case 'Assertion':
      if (e.kind === 'start' && pos.atStart) return undefined;
      if (e.kind === 'end' && pos.atEnd) return undefined;
      throw new Unsupported(`the assertion ${e.raw}`);
    case 'Character':
      return charSet([[e.value, e.value]]);
    case 'CharacterSet':
      return charSet(setOf(e));
    case 'CharacterClass':
      return charSet(classRanges(e));
    case 'Group':
    case 'CapturingGroup':
      return alternatives(e.alternatives, pos);
    case 'Quantifier': {
      if (e.max === 0) return undefined;
      if (e.min > MAX_REPEAT) throw new Unsupported(`a repetition of more than ${MAX_REPEAT}`);
      const inner = element(e.element, { atStart: false, atEnd: false, open: pos.open }) ?? '""';
      const max = e.max === Infinity ? e.min + openPast(e, pos.open) : Math.min(e.max, MAX_REPEAT);
      const q =
        e.min === 0 && max === Infinity
          ? '*'
          : e.min === 1 && max === Infinity
            ? '+'
            : e.min === 0 && max === 1
              ? '?'
              : max === Infinity
                ? `{${e.min},}`
                : e.min === max
                  ? `{${max}}`
                  : `{${e.min},${max}}`;
      return `( ${inner} )${q}`;
    }
    default:
      throw new Unsupported(e.raw);
  }
}

/** The pattern's syntax tree, read as the validator compiles it (regex-syntax.ts). */
function parse(pattern: string, unicode?: boolean): AST.Pattern | undefined {
  return parsePattern(pattern, unicode)?.ast;
}

/** Where an automaton's grammar puts its rules: one per state, and they refer to each other. */
export interface RuleSink {
  /** A rule name to define later (a state's rule is referred to before it is written). */
  reserve(hint: string): string;
  define(name: string, body: string): void;
  /** A rule with this body, shared with any other of the same body. */
  rule(hint: string, body: string): string;
}

/** The most grammar text one automaton may write (its character classes are written out). */
const MAX_AUTOMATON_TEXT = 256 * 1024;
/** A character class longer than this is written once, as a rule of its own, and referred to. */
const SHARED_CLASS = 64;

/**
 * GBNF for the text between the quotes of JSON strings that match `pattern` in full; undefined
 * when the pattern uses what a grammar cannot express. `open` bounds unbounded repetitions (`+`,
 * `*`, `{n,}`) to that many past their minimum: a subset, for text that must end with something
 * other than the closing quote (a `Z` after `\d+`), which a model that writes on inside a string
 * would otherwise never reach.
 */
export function patternToGbnf(pattern: string, open = Infinity, unicode?: boolean): string | undefined {
  const ast = parse(pattern, unicode);
  if (ast === undefined) return undefined;
  try {
    return alternatives(ast.alternatives, { atStart: true, atEnd: true, open });
  } catch (err) {
    if (err instanceof Unsupported) return undefined;
    throw err;
  }
}

/**
 * GBNF for a pattern that `patternToGbnf` cannot read element by element (lookaround, `\b`,
 * `\p{…}`), or for several patterns at once: their automaton (schema-automaton.ts), one rule per
 * state, in `rules`; `within`, a pattern (a format's) the strings must match in full as well.
 * Undefined where there is none; `unsatisfiable` where no string within the lengths matches.
 */
export function patternAutomatonGbnf(
  pattern: string | readonly string[],
  rules: RuleSink,
  minLength = 0,
  maxLength = Infinity,
  within?: string,
  unicode?: boolean,
): { body: string; lengthsHeld: boolean } | { unsatisfiable: string } | undefined {
  const made = patternAutomaton(pattern, minLength, maxLength, within, unicode);
  if (made === undefined || 'unsatisfiable' in made) return made;
  try {
    const body = automatonGbnf(made.automaton, rules);
    return body === undefined ? undefined : { body, lengthsHeld: made.lengthsHeld };
  } catch (err) {
    if (err instanceof Unsupported) return undefined;
    throw err;
  }
}

/** One rule per state: each transition's characters and the state it leads to, and `""` where the string may end. */
function automatonGbnf(a: Automaton, rules: RuleSink): string | undefined {
  const classes = a.states.map((state) => state.out.map(({ chars }) => charSet(chars)));
  // Counted as written: a long class once (a shared rule), and a rule name wherever it stands.
  const all = classes.flat();
  const long = new Set(all.filter((text) => text.length > SHARED_CLASS));
  const size =
    [...long].reduce((n, text) => n + text.length, 0) + all.reduce((n, text) => n + (text.length > SHARED_CLASS ? 32 : text.length), 0);
  if (size > MAX_AUTOMATON_TEXT) return undefined;
  const names = a.states.map(() => rules.reserve('pattern-state'));
  a.states.forEach((state, i) => {
    const alts = state.out.map(({ to }, j) => {
      const chars = classes[i]![j]!;
      // A long character class (a Unicode property's ranges) is written once and shared.
      return `${chars.length > SHARED_CLASS ? rules.rule('pattern-chars', chars) : chars} ${names[to]!}`;
    });
    if (state.final) alts.push('""');
    rules.define(names[i]!, alts.join(' | '));
  });
  return names[0];
}

/** The lengths of the strings `patternToGbnf` allows, and whether the pattern itself is anchored. */
export interface PatternSpan {
  /** Fewest and most characters of a string the grammar allows (the most may be Infinity). */
  min: number;
  max: number;
  /** The most characters a whole match of the pattern itself may have (the grammar caps repetitions). */
  matchMax: number;
  /** Every top-level alternative starts with `^` (ends with `$`): nothing may come before (after) its match. */
  anchoredStart: boolean;
  anchoredEnd: boolean;
  /** No top-level alternative starts with `^` (ends with `$`): other text may come before (after) its match. */
  openStart: boolean;
  openEnd: boolean;
}

/** `open`: the grammar's bound on open repetitions (as `patternToGbnf` got it); undefined: the pattern's own lengths, uncapped. */
function span(alts: readonly AST.Alternative[], open: number | undefined): [number, number] {
  let lo = Infinity;
  let hi = 0;
  for (const alt of alts) {
    let a = 0;
    let b = 0;
    for (const e of alt.elements) {
      const [x, y] = elementSpan(e, open);
      a += x;
      b += y;
    }
    lo = Math.min(lo, a);
    hi = Math.max(hi, b);
  }
  return [lo === Infinity ? 0 : lo, hi];
}

function elementSpan(e: AST.Element, open: number | undefined): [number, number] {
  switch (e.type) {
    case 'Character':
    case 'CharacterSet':
    case 'CharacterClass':
      return [1, 1];
    case 'Group':
    case 'CapturingGroup':
      return span(e.alternatives, open);
    case 'Quantifier': {
      if (e.max === 0) return [0, 0];
      // As the grammar writes it: at most MAX_REPEAT repetitions, and `open` past the minimum of an open one.
      const [x, y] = elementSpan(e.element, open);
      const max = open === undefined ? e.max : e.max === Infinity ? e.min + openPast(e, open) : Math.min(e.max, MAX_REPEAT);
      return [x * e.min, y === 0 ? 0 : y * max];
    }
    default:
      return [0, 0];
  }
}

type Anchoring = 'all' | 'none' | 'some';

/** Whether the alternatives are anchored at one end: all of them, none, or some (groups looked into). */
function anchoring(alts: readonly AST.Alternative[], side: 'start' | 'end'): Anchoring {
  const each = alts.map((alt): Anchoring => {
    const e = side === 'start' ? alt.elements[0] : alt.elements.at(-1);
    if (e?.type === 'Assertion') return e.kind === side ? 'all' : 'none';
    if (e?.type === 'Group' || e?.type === 'CapturingGroup') return anchoring(e.alternatives, side);
    return 'none';
  });
  return each.every((a) => a === 'all') ? 'all' : each.every((a) => a === 'none') ? 'none' : 'some';
}

/**
 * What `patternToGbnf` makes of `pattern`, by length: the grammar allows only strings that match
 * the whole pattern, so a `minLength` above its longest needs text the pattern leaves open (before
 * an unanchored start, after an unanchored end), and is unsatisfiable where it is anchored at both.
 * Undefined where `patternToGbnf` is. `open` as given to `patternToGbnf`.
 */
export function patternSpan(pattern: string, open = Infinity, unicode?: boolean): PatternSpan | undefined {
  const ast = parse(pattern, unicode);
  if (ast === undefined || patternToGbnf(pattern, Infinity, unicode) === undefined) return undefined;
  const [min, max] = span(ast.alternatives, open);
  const [, matchMax] = span(ast.alternatives, undefined);
  const start = anchoring(ast.alternatives, 'start');
  const end = anchoring(ast.alternatives, 'end');
  return {
    min,
    max,
    matchMax,
    anchoredStart: start === 'all',
    anchoredEnd: end === 'all',
    openStart: start === 'none',
    openEnd: end === 'none',
  };
}

/**
 * A pattern that is one repetition of one character (class) between `^` and `$` (`^[a-z]+$`,
 * `^\d{2,}$`): that character's grammar and the repetition's bounds, so that a string's length
 * bounds can be written into the repetition itself (zod's `.regex(/^[a-z]+$/).min(3).max(6)`).
 */
export function singleRepeat(pattern: string, unicode?: boolean): { element: string; min: number; max: number } | undefined {
  const ast = parse(pattern, unicode);
  const only = ast?.alternatives.length === 1 ? ast.alternatives[0]!.elements : [];
  const [start, q, end] = only;
  if (only.length !== 3 || start?.type !== 'Assertion' || start.kind !== 'start' || end?.type !== 'Assertion' || end.kind !== 'end')
    return undefined;
  if (q?.type !== 'Quantifier' || !['Character', 'CharacterSet', 'CharacterClass'].includes(q.element.type)) return undefined;
  try {
    const grammar = element(q.element, { atStart: false, atEnd: false, open: Infinity });
    return grammar === undefined ? undefined : { element: grammar, min: q.min, max: q.max };
  } catch (err) {
    if (err instanceof Unsupported) return undefined;
    throw err;
  }
}

/** Whether `name` matches `pattern` as the validator reads it (u flag, or without where it must). */
export function patternMatches(pattern: string, name: string, unicode?: boolean): boolean {
  let re: RegExp;
  try {
    re = new RegExp(pattern, unicode === false ? '' : 'u');
  } catch {
    re = new RegExp(pattern);
  }
  return re.test(name);
}
