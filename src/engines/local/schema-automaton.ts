/**
 * JSON Schema `pattern`s as a finite automaton over the characters a JSON string can hold: the
 * strings that match the whole pattern, exactly, within the schema's lengths. The grammar compiler
 * (schema-regex.ts) reads most patterns element by element; this is for what it cannot: lookaround,
 * `\b`, Unicode property escapes, several patterns at once (an allOf's), and lengths a pattern does
 * not settle. Password rules (`^(?=.*[a-z])(?=.*\d).{8,}$`), reserved words (`^(?!admin$)[a-z]+$`),
 * length lookaheads (`^(?=.{3,20}$)…`), zod's `z.emoji()` (`\p{Extended_Pictographic}`) and its
 * `.endsWith()` beside an email's pattern were left to the check: an unconstrained string, and for
 * most a 500 after every resample.
 *
 * refa (finite automata for JavaScript regexes, on the same regexpp parser) does the work: its
 * simplifier removes the assertions it can prove away, and a lookahead at the start of an
 * alternative, which it cannot, becomes an intersection (a negative one, with the complement) of
 * automata. Anything left over (a lookbehind at the start, a back-reference) gives undefined, and
 * the pattern stays with the check.
 */
import { RegExpParser, visitRegExpAST, type AST } from '@eslint-community/regexpp';
import { CharSet, DFA, JS, NFA, TooManyNodesError, Transformers, transform, type NoParent } from 'refa';

/** Sorted, disjoint, inclusive code point ranges. */
export type Ranges = Array<[number, number]>;

export interface Automaton {
  /** State 0 is the start. Every state can reach a final one. */
  states: Array<{ final: boolean; out: Array<{ to: number; chars: Ranges }> }>;
}

/** Most states of any automaton built on the way (refa's node limit), and of the result. */
const MAX_STATES = 1_000;
/** refa's limit on the nodes of a parsed pattern (its own default). */
const MAX_AST_NODES = 10_000;

/**
 * Characters a JSON string written by the grammar may hold: the Basic Multilingual Plane without
 * surrogates or control characters other than tab, line feed and carriage return (schema-regex.ts
 * writes the same set).
 */
const JSON_TEXT: Ranges = [
  [0x09, 0x0a],
  [0x0d, 0x0d],
  [0x20, 0xd7ff],
  [0xe000, 0xffff],
];

type Flags = '' | 'u';

/** The pattern's flags as the validator compiles it (with `u`, or without where it must), and its tree. */
function parse(pattern: string): { flags: Flags; ast: AST.Pattern } | undefined {
  const parser = new RegExpParser();
  for (const flags of ['u', ''] as const) {
    try {
      return { flags, ast: parser.parsePattern(pattern, 0, pattern.length, { unicode: flags === 'u' }) };
    } catch {
      // Not a pattern with this flag.
    }
  }
  return undefined;
}

const propertyRanges = new Map<string, string>();

/**
 * A Unicode property escape's characters in the BMP as V8 reads it, written as class ranges:
 * refa's tables are of another Unicode version (U+2765 is `Extended_Pictographic` to refa, not to
 * Node 20), and the validator's RegExp decides. The grammar writes BMP characters only, and on
 * those the ranges and the escape agree, so the automaton stays exact for what it writes.
 */
function rangesOf(raw: string): string {
  let text = propertyRanges.get(raw);
  if (text === undefined) {
    const re = new RegExp(`^${raw}$`, 'u');
    const parts: string[] = [];
    const hex = (c: number): string => `\\u{${c.toString(16)}}`;
    for (let c = 0, start = -1; c <= 0x10000; c++) {
      const inside = c < 0x10000 && re.test(String.fromCharCode(c));
      if (inside && start < 0) start = c;
      if (!inside && start >= 0) {
        parts.push(start === c - 1 ? hex(start) : `${hex(start)}-${hex(c - 1)}`);
        start = -1;
      }
    }
    text = parts.join('');
    propertyRanges.set(raw, text);
  }
  return text;
}

/** The pattern with each `\\p{…}`/`\\P{…}` replaced by its characters (rangesOf). */
function propertiesAsRanges(pattern: string, ast: AST.Pattern): string {
  const found: AST.CharacterSet[] = [];
  visitRegExpAST(ast, { onCharacterSetEnter: (node) => void (node.kind === 'property' && found.push(node)) });
  let out = pattern;
  for (const node of found.sort((a, b) => b.start - a.start)) {
    const ranges = rangesOf(node.raw);
    const text = node.parent.type === 'CharacterClass' ? ranges : `[${ranges}]`;
    out = out.slice(0, node.start) + text + out.slice(node.end);
  }
  return out;
}

/** `^` or `$` in refa's tree: a negated lookbehind (lookahead) of any character. */
function isEdgeAnchor(e: RefaElement | undefined, kind: 'behind' | 'ahead'): boolean {
  if (e?.type !== 'Assertion' || e.kind !== kind || !e.negate || e.alternatives.length !== 1) return false;
  const only = e.alternatives[0]!.elements;
  const first = only[0];
  return only.length === 1 && first?.type === 'CharacterClass' && first.characters.isAll;
}

type RefaConcatenation = NoParent<JS.ParseResult['expression']>['alternatives'][number];
type RefaElement = RefaConcatenation['elements'][number];

function hasAssertion(alternatives: readonly RefaConcatenation[]): boolean {
  return alternatives.some((c) =>
    c.elements.some((e) => {
      if (e.type === 'Assertion' || e.type === 'Unknown') return true;
      if (e.type === 'Alternation') return hasAssertion(e.alternatives);
      if (e.type === 'Quantifier') return hasAssertion(e.alternatives);
      return false;
    }),
  );
}

/**
 * A DFA of the strings that `source` matches in full, or undefined where an assertion remains that
 * refa's simplifier could not remove. The pattern is wrapped in `^(?:…)$`, so that assertions at its
 * edges are judged against the ends of the string, and those two anchors are then taken off.
 */
function whole(source: string, flags: Flags): DFA | undefined {
  const { expression, maxCharacter } = JS.Parser.fromLiteral({ source: `^(?:${source})$`, flags }).parse({
    backreferences: 'throw',
    maxNodes: MAX_AST_NODES,
  });
  const simple = transform(Transformers.simplify(), expression);
  for (const c of simple.alternatives) {
    while (isEdgeAnchor(c.elements[0], 'behind')) c.elements.shift();
    while (isEdgeAnchor(c.elements[c.elements.length - 1], 'ahead')) c.elements.pop();
  }
  if (hasAssertion(simple.alternatives)) return undefined;
  const nfa = NFA.fromRegex(simple, { maxCharacter }, {}, new NFA.LimitedNodeFactory(MAX_STATES));
  return DFA.fromFA(nfa, new DFA.LimitedNodeFactory(MAX_STATES));
}

/** The alternative's lookaheads right at its start (after any `^`), and the source of the rest. */
function leadingLookaheads(pattern: string, alt: AST.Alternative): { looks: AST.LookaheadAssertion[]; rest: string } {
  let i = 0;
  while (alt.elements[i]?.type === 'Assertion' && (alt.elements[i] as AST.Assertion).kind === 'start') i++;
  const looks: AST.LookaheadAssertion[] = [];
  for (let e = alt.elements[i]; e?.type === 'Assertion' && e.kind === 'lookahead'; e = alt.elements[++i]) looks.push(e);
  const first = alt.elements[i];
  return { looks, rest: first === undefined ? '' : pattern.slice(first.start, alt.end) };
}

/**
 * The automaton of the strings that match `pattern` in full, and whether those are all the strings
 * the pattern matches anywhere (every alternative is anchored at both ends): only then does an
 * empty automaton mean that no string is valid. With `search`, of the strings that match it
 * anywhere (text before an alternative not anchored at its start, after one not anchored at its
 * end), as the validator reads a pattern; undefined where such an alternative has a lookahead.
 */
function automatonOf(original: string, search = false): { fa: NFA; anchored: boolean } | undefined {
  const first = parse(original);
  if (first === undefined) return undefined;
  const pattern = propertiesAsRanges(original, first.ast);
  const parsed = pattern === original ? first : parse(pattern);
  if (parsed === undefined) return undefined;
  const { flags, ast } = parsed;
  const ends = ast.alternatives.map((alt) => {
    const [first, last] = [alt.elements[0], alt.elements[alt.elements.length - 1]];
    return { start: first?.type === 'Assertion' && first.kind === 'start', end: last?.type === 'Assertion' && last.kind === 'end' };
  });
  let union: NFA | undefined;
  for (const [i, alt] of ast.alternatives.entries()) {
    const { looks, rest } = leadingLookaheads(pattern, alt);
    const open = { start: search && !ends[i]!.start, end: search && !ends[i]!.end };
    if (open.start && looks.length > 0) return undefined;
    let dfa = whole(`${open.start ? '[^]*' : ''}(?:${rest})${open.end ? '[^]*' : ''}`, flags);
    if (dfa === undefined) return undefined;
    // A lookahead at position 0 of a whole match sees the whole string: `(?=X)` asks that the string
    // start with a match of X (X may end with `$`), `(?!X)` that it not.
    for (const look of looks) {
      const inner = look.alternatives.map((a) => a.raw).join('|');
      const ahead = whole(`(?:${inner})[^]*`, flags);
      if (ahead === undefined) return undefined;
      if (look.negate) ahead.complement();
      dfa = DFA.fromIntersection(dfa, ahead, new DFA.LimitedNodeFactory(MAX_STATES));
    }
    if (union === undefined) union = NFA.fromFA(dfa, new NFA.LimitedNodeFactory(MAX_STATES));
    else union.union(dfa, new NFA.LimitedNodeFactory(MAX_STATES));
  }
  return union === undefined ? undefined : { fa: union, anchored: ends.every((e) => e.start && e.end) };
}

/**
 * Strings that match every pattern (in full, or with `search` anywhere), and `within` in full if
 * given; whether each pattern is anchored at both ends.
 */
function intersection(
  patterns: readonly string[],
  search: boolean,
  within: string | undefined,
): { fa: DFA; anchored: boolean } | undefined {
  let fa: DFA | undefined;
  let anchored = true;
  for (const [pattern, mode] of [
    ...patterns.map((p) => [p, search] as const),
    ...(within !== undefined ? [[within, false] as const] : []),
  ]) {
    const of = automatonOf(pattern, mode);
    if (of === undefined) return undefined;
    const factory = new DFA.LimitedNodeFactory(MAX_STATES);
    fa = fa === undefined ? DFA.fromFA(of.fa, factory) : DFA.fromIntersection(fa, of.fa, factory);
    if (pattern !== within) anchored &&= of.anchored;
  }
  return fa === undefined ? undefined : { fa, anchored };
}

/** How many characters an automaton's strings may run past their shortest (or minLength) by default. */
const OPEN_LENGTH = [32, 16, 8];

export type PatternAutomaton =
  | {
      automaton: Automaton;
      /** Its strings are all within minLength and maxLength (the lengths need no check). */
      lengthsHeld: boolean;
    }
  | { unsatisfiable: string };

/**
 * The automaton of the strings of JSON text that match `patterns` in full (anywhere, where no string
 * matches them all in full), and `within` in full if given (a format's text), within `minLength` and
 * `maxLength`; undefined where the pattern is not regular as refa reads it (back-references,
 * assertions it cannot remove), or is too large (more than 1,000 states).
 *
 * Its strings are also at most 32 characters past the shortest one allowed (fewer where the states
 * would exceed the limit): a subset, so that a model that writes on inside a string is led to its
 * end. A password rule's `[a-z]` loop, until an uppercase letter and a digit come, is one a small
 * model never leaves; with the bound the grammar brings them in before the string runs out.
 */
export function patternAutomaton(
  patterns: string | readonly string[],
  minLength = 0,
  maxLength = Infinity,
  within?: string,
): PatternAutomaton | undefined {
  const list = typeof patterns === 'string' ? [patterns] : patterns;
  try {
    const exact = attempt(list, minLength, maxLength, within, true);
    if (exact !== TOO_LARGE) return exact;
    // Too many states (a password rule's four lookaheads over `.{8,64}`): the patterns with fewer
    // repetitions, a subset (and then no definite "matches nothing").
    const narrow = list.map(narrowed);
    if (narrow.some((p) => p === undefined)) return undefined;
    const subset = attempt(narrow as string[], minLength, maxLength, within, false);
    return subset === TOO_LARGE ? undefined : subset;
  } catch {
    // refa's errors: a back-reference, a feature it does not know.
    return undefined;
  }
}

const TOO_LARGE = Symbol('too large');

/**
 * patternAutomaton for these patterns; TOO_LARGE where the automaton passes the state limit before
 * its strings are bounded (with `definite`; without, the unbounded automaton is the answer then).
 * `definite`: the patterns are the schema's own, so that "matches nothing" is a definite answer.
 */
function attempt(
  list: readonly string[],
  minLength: number,
  maxLength: number,
  within: string | undefined,
  definite: boolean,
): PatternAutomaton | undefined | typeof TOO_LARGE {
  try {
    // Several patterns (an allOf's): strings that match each in full. Where none does, strings that
    // match each anywhere (`^a` and `b$`: "ab"; a format's text with `^https://` at its start).
    let made = intersection(list, false, within);
    if (made?.fa.isEmpty && !made.anchored) made = intersection(list, true, within);
    if (made === undefined) return undefined;
    const { fa } = made;
    // "Matches nothing" is definite only where the patterns are anchored, are the schema's own, and
    // no format's subset of its text was asked for; elsewhere the check judges.
    const anchored = made.anchored && definite && within === undefined;
    if (fa.isEmpty) return anchored ? { unsatisfiable: 'matches no string' } : undefined;
    const max = fa.maxCharacter;
    // Strings of JSON text only: a character class beyond it (an emoji outside the BMP) is left out.
    const json = CharSet.empty(max).union(JSON_TEXT.filter(([a]) => a <= max).map(([min, hi]) => ({ min, max: Math.min(hi, max) })));
    const text = DFA.fromIntersection(fa, lengths(json, max, 0, Infinity), new DFA.LimitedNodeFactory(MAX_STATES));
    const fewest = shortest(text);
    // No string of the characters the grammar writes (only characters beyond the BMP): the check's.
    if (fewest === undefined) return undefined;
    let overflowed = false;
    for (const open of OPEN_LENGTH) {
      const hi = Math.min(maxLength, Math.max(minLength, fewest) + open);
      try {
        const bounded = DFA.fromIntersection(text, lengths(json, max, minLength, hi), new DFA.LimitedNodeFactory(MAX_STATES));
        bounded.minimize();
        const automaton = live(bounded);
        if (automaton !== undefined) return { automaton, lengthsHeld: true };
        // Nothing within these bounds: maybe beyond them (below, a definite answer or the check).
        overflowed = false;
        break;
      } catch (err) {
        if (!(err instanceof TooManyNodesError)) throw err;
        overflowed = true;
      }
    }
    if (overflowed && definite) return TOO_LARGE;
    // Nothing the grammar can write within the lengths: a 400 if no string at all is (any character).
    const any = CharSet.all(max);
    const inLengths = DFA.fromIntersection(
      fa,
      lengths(any, max, minLength, maxLength > MAX_STATES ? Infinity : maxLength),
      new DFA.LimitedNodeFactory(MAX_STATES),
    );
    if (inLengths.isEmpty) return anchored ? { unsatisfiable: 'matches no string within minLength and maxLength' } : undefined;
    text.minimize();
    const automaton = live(text);
    return automaton === undefined ? undefined : { automaton, lengthsHeld: minLength === 0 && maxLength === Infinity };
  } catch (err) {
    if (err instanceof TooManyNodesError) return TOO_LARGE;
    throw err;
  }
}

/** Repetitions a narrowed pattern keeps past each quantifier's minimum. */
const NARROW_REPEAT = 16;

/**
 * The pattern with each quantifier's maximum brought down to its minimum and NARROW_REPEAT,
 * except inside a negative lookaround, where fewer repetitions would allow more strings: a pattern
 * whose strings are among the original's.
 */
function narrowed(pattern: string): string | undefined {
  const parsed = parse(pattern);
  if (parsed === undefined) return undefined;
  const edits: Array<{ start: number; end: number; text: string }> = [];
  visitRegExpAST(parsed.ast, {
    onQuantifierEnter: (q) => {
      if (q.max <= q.min + NARROW_REPEAT) return;
      for (let n: AST.Node | null = q.parent; n !== null; n = n.parent) if (n.type === 'Assertion' && 'negate' in n && n.negate) return;
      edits.push({ start: q.element.end, end: q.end, text: `{${q.min},${q.min + NARROW_REPEAT}}${q.greedy ? '' : '?'}` });
    },
  });
  let out = pattern;
  for (const e of edits.sort((x, y) => y.start - x.start)) out = out.slice(0, e.start) + e.text + out.slice(e.end);
  return out;
}

/** A DFA of the strings of `chars` from `min` to `max` characters long. */
function lengths(chars: CharSet, maxCharacter: number, min: number, max: number): DFA {
  const b = new DFA.Builder(new DFA.LimitedNodeFactory(MAX_STATES + 2));
  let node = b.initial;
  // (Past the node limit the factory throws: refa's TooManyNodesError.)
  for (let i = 0; i < min; i++) {
    const next = b.createNode();
    b.linkNodes(node, next, chars);
    node = next;
  }
  if (max === Infinity) {
    b.makeFinal(node);
    b.linkNodes(node, node, chars);
  } else {
    for (let i = min; i <= max; i++) {
      b.makeFinal(node);
      if (i === max) break;
      const next = b.createNode();
      b.linkNodes(node, next, chars);
      node = next;
    }
  }
  return DFA.fromBuilder(b, { maxCharacter });
}

/** The length of the DFA's shortest string, by breadth-first search; undefined if it has none. */
function shortest(dfa: DFA): number | undefined {
  let frontier = [dfa.initial];
  const seen = new Set(frontier);
  for (let depth = 0; frontier.length > 0; depth++) {
    if (frontier.some((n) => dfa.finals.has(n))) return depth;
    const next: DFA.Node[] = [];
    for (const n of frontier) for (const to of n.out.values()) if (!seen.has(to)) (seen.add(to), next.push(to));
    frontier = next;
  }
  return undefined;
}

/** The DFA's states that can reach a final one, numbered from the start (0); undefined if it cannot. */
function live(dfa: DFA): Automaton | undefined {
  const nodes = [...dfa.nodes()];
  const into = new Map<DFA.Node, DFA.Node[]>(nodes.map((n) => [n, []]));
  for (const n of nodes) for (const to of n.out.values()) into.get(to)?.push(n);
  const alive = new Set<DFA.Node>(dfa.finals);
  const queue = [...dfa.finals];
  for (let n = queue.pop(); n !== undefined; n = queue.pop())
    for (const from of into.get(n) ?? []) if (!alive.has(from)) (alive.add(from), queue.push(from));
  if (!alive.has(dfa.initial)) return undefined;
  const order = [dfa.initial, ...nodes.filter((n) => n !== dfa.initial && alive.has(n))];
  if (order.length > MAX_STATES) return undefined;
  const index = new Map(order.map((n, i) => [n, i]));
  return {
    states: order.map((n) => {
      const out = new Map<number, Ranges>();
      n.out.forEach((to, r) => {
        const i = index.get(to);
        if (i === undefined) return;
        const chars = out.get(i) ?? [];
        chars.push([r.min, r.max]);
        out.set(i, chars);
      });
      return { final: dfa.finals.has(n), out: [...out].map(([to, chars]) => ({ to, chars })) };
    }),
  };
}
