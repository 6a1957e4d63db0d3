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
 * simplifier removes the assertions it can prove away, and a lookaround it cannot, at the start or
 * end of an alternative or in a run in its middle, becomes an intersection (a negative one, with
 * the complement) of automata. Anything left over (a lookbehind at the start, a back-reference)
 * gives undefined, and the pattern stays with the check.
 */
import { visitRegExpAST, type AST } from '@eslint-community/regexpp';
import { CharSet, DFA, JS, NFA, TooManyNodesError, Transformers, transform, type NoParent, type TransitionIterable } from 'refa';
import { JSON_STRING_CHARS, parsePattern, type Ranges } from './regex-syntax.js';

export interface Automaton {
  /** State 0 is the start. Every state can reach a final one. */
  states: Array<{ final: boolean; out: Array<{ to: number; chars: Ranges }> }>;
}

/** Most states of any automaton built on the way (refa's node limit), and of the result. */
const MAX_STATES = 1_000;
/** refa's limit on the nodes of a parsed pattern (its own default). */
const MAX_AST_NODES = 10_000;

type Flags = '' | 'u';

/** The pattern's flags and tree, read as the validator compiles it (regex-syntax.ts). */
function parse(pattern: string, unicode?: boolean): { flags: Flags; ast: AST.Pattern } | undefined {
  const parsed = parsePattern(pattern, unicode);
  return parsed === undefined ? undefined : { flags: parsed.unicode ? 'u' : '', ast: parsed.ast };
}

/**
 * Property escapes read so far, by their text (`\p{Lu}`): a few milliseconds each, and bounded by
 * the escapes V8 accepts (a few thousand spellings of properties and values).
 */
const propertyRanges = new Map<string, string>();

/** Every BMP character but the surrogates, once, to match a property escape against. */
let bmp: string | undefined;

/**
 * A Unicode property escape's characters in the BMP as V8 reads it, written as class ranges:
 * refa's tables are of another Unicode version (U+2765 is `Extended_Pictographic` to refa, not to
 * Node 20), and the validator's RegExp decides. The grammar writes BMP characters only, and on
 * those the ranges and the escape agree, so the automaton stays exact for what it writes.
 */
function rangesOf(raw: string): string {
  let text = propertyRanges.get(raw);
  if (text === undefined) {
    bmp ??= Array.from({ length: 0x10000 - 0x800 }, (_, i) => String.fromCharCode(i < 0xd800 ? i : i + 0x800)).join('');
    const ranges: Array<[number, number]> = [];
    for (const m of bmp.matchAll(new RegExp(raw, 'gu'))) {
      const c = m[0].charCodeAt(0);
      const last = ranges[ranges.length - 1];
      if (last && last[1] === c - 1) last[1] = c;
      else ranges.push([c, c]);
    }
    const hex = (c: number): string => `\\u{${c.toString(16)}}`;
    text = ranges.map(([a, b]) => (a === b ? hex(a) : `${hex(a)}-${hex(b)}`)).join('');
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
  return minimal(DFA.fromFA(nfa, new DFA.LimitedNodeFactory(MAX_STATES)));
}

/**
 * An alternative's parts as the automaton reads them: its lookaheads right at its start (after a
 * `^`), its lookbehinds right at its end (before a `$`), and the source in between. An alternative
 * that is one group between its anchors (`^(?:(?=.*\d)\w+|x)$`) is read as the group's own
 * alternatives, each with those anchors.
 */
interface Part {
  start: boolean;
  end: boolean;
  ahead: AST.LookaheadAssertion[];
  behind: AST.LookbehindAssertion[];
  /** What is in between. */
  body: AST.Element[];
}

/** The source of consecutive elements of the pattern. */
const sourceOf = (pattern: string, els: readonly AST.Element[]): string =>
  els.length === 0 ? '' : pattern.slice(els[0]!.start, els[els.length - 1]!.end);

function partsOf(pattern: string, alt: AST.Alternative, start = false, end = false): Part[] {
  const els = alt.elements;
  let i = 0;
  let j = els.length;
  while (els[i]?.type === 'Assertion' && (els[i] as AST.Assertion).kind === 'start') (i++, (start = true));
  while (j > i && els[j - 1]?.type === 'Assertion' && (els[j - 1] as AST.Assertion).kind === 'end') (j--, (end = true));
  const only = els[i];
  if (j === i + 1 && (only?.type === 'Group' || only?.type === 'CapturingGroup'))
    return only.alternatives.flatMap((a) => partsOf(pattern, a, start, end));
  const ahead: AST.LookaheadAssertion[] = [];
  for (let e = els[i]; i < j && e?.type === 'Assertion' && e.kind === 'lookahead'; e = els[++i]) ahead.push(e);
  const behind: AST.LookbehindAssertion[] = [];
  for (let e = els[j - 1]; j > i && e?.type === 'Assertion' && e.kind === 'lookbehind'; e = els[j - 1]) (behind.unshift(e), j--);
  return [{ start, end, ahead, behind, body: els.slice(i, j) }];
}

const isLookaround = (e: AST.Node | undefined): e is AST.LookaroundAssertion =>
  e?.type === 'Assertion' && (e.kind === 'lookahead' || e.kind === 'lookbehind');

/** The kinds of assertion anywhere in these nodes (`\b` is `word`, `^` `start`, `$` `end`). */
function assertionKinds(nodes: readonly AST.Node[]): Set<string> {
  const kinds = new Set<string>();
  for (const node of nodes) {
    const visit = (n: AST.Node): void => {
      if (n.type === 'Assertion') kinds.add(n.kind);
      if ('alternatives' in n) n.alternatives.forEach(visit);
      if ('elements' in n && n.type === 'Alternative') n.elements.forEach(visit);
      if (n.type === 'Quantifier') visit(n.element);
    };
    visit(node);
  }
  return kinds;
}

/**
 * A body with one run of lookarounds in its middle that refa's simplifier could not remove
 * (`[a-z]+(?=.*\d)\w*`, `\d+(?!px)[a-z]*`): what comes before, held to the lookbehinds (it must end
 * with a match of each, or not), followed by what comes after, held to the lookaheads (it must
 * start with one, or not). Exact only where nothing else can see across the cut: no other
 * assertion before or after it, a lookahead's own with none but `$` (the string's end, which is the
 * end of what comes after), a lookbehind's with none but `^`. Undefined otherwise.
 */
function middle(pattern: string, els: readonly AST.Element[], flags: Flags, open: { start: boolean; end: boolean }): DFA | undefined {
  const k = els.findIndex(isLookaround);
  if (k <= 0) return undefined;
  let m = k;
  while (isLookaround(els[m + 1])) m++;
  if (m >= els.length - 1) return undefined;
  const before = els.slice(0, k);
  const after = els.slice(m + 1);
  const looks = els.slice(k, m + 1).filter(isLookaround);
  if (assertionKinds([...before, ...after]).size > 0) return undefined;
  for (const look of looks) {
    const inner = assertionKinds(look.alternatives);
    inner.delete(look.kind === 'lookahead' ? 'end' : 'start');
    if (inner.size > 0) return undefined;
  }
  let head = whole(`${open.start ? '[^]*' : ''}(?:${sourceOf(pattern, before)})`, flags);
  let tail = whole(`(?:${sourceOf(pattern, after)})${open.end ? '[^]*' : ''}`, flags);
  for (const look of looks) {
    if (look.kind === 'lookahead') tail = tail && held(tail, look, flags);
    else head = head && held(head, look, flags);
  }
  if (head === undefined || tail === undefined) return undefined;
  const joined = NFA.fromFA(head, new NFA.LimitedNodeFactory(MAX_STATES));
  joined.append(tail, new NFA.LimitedNodeFactory(MAX_STATES));
  return minimal(DFA.fromFA(joined, new DFA.LimitedNodeFactory(MAX_STATES)));
}

/** Minimised in place (and returned): intermediate automata stay small enough to intersect. */
function minimal(dfa: DFA): DFA {
  dfa.minimize();
  return dfa;
}

/** The strings of both, minimised. */
const meet = <B>(a: DFA, b: TransitionIterable<B>): DFA => minimal(DFA.fromIntersection(a, b, new DFA.LimitedNodeFactory(MAX_STATES)));

/**
 * The strings of `dfa` that a lookaround at their edge allows: a lookahead at their start sees all
 * of them (`(?=X)`: they start with a match of X, which may end with `$`; `(?!X)`: they do not), a
 * lookbehind at their end likewise (`(?<!ing)`: they do not end with "ing").
 */
function held(dfa: DFA, look: AST.LookaroundAssertion, flags: Flags): DFA | undefined {
  const inner = look.alternatives.map((a) => a.raw).join('|');
  const seen = whole(look.kind === 'lookahead' ? `(?:${inner})[^]*` : `[^]*(?:${inner})`, flags);
  if (seen === undefined) return undefined;
  if (look.negate) seen.complement();
  return meet(dfa, seen);
}

/**
 * The automaton of the strings that match `pattern` in full, whether those are all the strings the
 * pattern matches anywhere (every alternative is anchored at both ends), and whether a Unicode
 * property was read as its BMP characters only (an empty automaton then proves nothing). With
 * `search`, of the strings that match it anywhere (text before an alternative not anchored at its
 * start, after one not anchored at its end), as the validator reads a pattern; undefined where
 * such an alternative has a lookaround at its open end.
 */
function automatonOf(
  original: string,
  search: boolean,
  unicode: boolean | undefined,
): { fa: NFA; anchored: boolean; restricted: boolean; flags: Flags } | undefined {
  const first = parse(original, unicode);
  if (first === undefined) return undefined;
  // A back-reference is not regular; and cut away from its group (a part read alone, below), a
  // `\1` without the `u` flag would read as the character U+0001.
  let backreference = false;
  visitRegExpAST(first.ast, { onBackreferenceEnter: () => void (backreference = true) });
  if (backreference) return undefined;
  const pattern = propertiesAsRanges(original, first.ast);
  const parsed = pattern === original ? first : parse(pattern, unicode);
  if (parsed === undefined) return undefined;
  const { flags, ast } = parsed;
  const parts = ast.alternatives.flatMap((alt) => partsOf(pattern, alt));
  let union: NFA | undefined;
  const factory = new NFA.LimitedNodeFactory(MAX_STATES);
  for (const part of parts) {
    const open = { start: search && !part.start, end: search && !part.end };
    if ((open.start && part.ahead.length > 0) || (open.end && part.behind.length > 0)) return undefined;
    let dfa =
      whole(`${open.start ? '[^]*' : ''}(?:${sourceOf(pattern, part.body)})${open.end ? '[^]*' : ''}`, flags) ??
      middle(pattern, part.body, flags, open);
    // The lookarounds at the whole string's edges.
    for (const look of [...part.ahead, ...part.behind]) dfa = dfa && held(dfa, look, flags);
    if (dfa === undefined) return undefined;
    if (union === undefined) union = NFA.fromFA(dfa, factory);
    else union.union(dfa, factory);
  }
  if (union === undefined) return undefined;
  return { fa: union, anchored: parts.every((p) => p.start && p.end), restricted: pattern !== original, flags };
}

/**
 * Strings that match every pattern (in full, or with `search` anywhere), and `within` in full if
 * given; whether each pattern is anchored at both ends, and whether any was read restricted.
 */
function intersection(
  patterns: readonly string[],
  search: boolean,
  within: string | undefined,
  unicode: boolean | undefined,
): { fa: DFA; anchored: boolean; restricted: boolean; utf16: boolean } | undefined {
  let fa: DFA | undefined;
  let anchored = true;
  let restricted = false;
  let utf16 = false;
  const all = within === undefined ? patterns : [...patterns, within];
  for (const [i, pattern] of all.entries()) {
    // The format's pattern (last) is matched in full, and says nothing of the schema's anchoring.
    const format = i === patterns.length;
    const of = automatonOf(pattern, search && !format, unicode);
    if (of === undefined) return undefined;
    fa = fa === undefined ? minimal(DFA.fromFA(of.fa, new DFA.LimitedNodeFactory(MAX_STATES))) : meet(fa, of.fa);
    if (!format) anchored &&= of.anchored;
    restricted ||= of.restricted;
    utf16 ||= of.flags === '';
  }
  return fa === undefined ? undefined : { fa, anchored, restricted, utf16 };
}

/**
 * Whether a string matches `pattern` anywhere, as the validator's RegExp reads it, by the pattern's
 * automaton: in time linear in the string, where RegExp may backtrack for hours (`^(a+)+$`). Undefined
 * where the pattern has no automaton; the test says undefined (unknown: the check's to judge) for a
 * string with a character beyond the BMP where a Unicode property was read as its BMP part only.
 */
export function patternTest(pattern: string, unicode?: boolean): ((text: string) => boolean | undefined) | undefined {
  try {
    const of = automatonOf(pattern, true, unicode);
    if (of === undefined) return undefined;
    const dfa = minimal(DFA.fromFA(of.fa, new DFA.LimitedNodeFactory(MAX_STATES)));
    return (text) => {
      const chars = of.flags === 'u' ? [...text].map((c) => c.codePointAt(0)!) : Array.from(text, (_, i) => text.charCodeAt(i));
      if (of.restricted && chars.some((c) => c > 0xffff)) return undefined;
      return dfa.test(chars);
    };
  } catch {
    return undefined;
  }
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
  unicode?: boolean,
): PatternAutomaton | undefined {
  const list = typeof patterns === 'string' ? [patterns] : patterns;
  try {
    // Too many states (a password rule's four lookaheads over `.{8,64}`): the patterns with fewer
    // repetitions, a subset.
    for (const narrow of [false, true]) {
      const ps = narrow ? list.map((p) => narrowed(p, unicode)).filter((p): p is string => p !== undefined) : list;
      if (ps.length < list.length) return undefined;
      // Several patterns (an allOf's): strings that match each in full. Where none does (within the
      // lengths), strings that match each anywhere, as the validator reads them (`^a` and `b$`:
      // "ab"; a format's text with `^https://` at its start; `^a(?=b)` with minLength 3).
      let made = attempt(ps, false, minLength, maxLength, within, unicode, !narrow);
      if (made !== TOO_LARGE && made !== undefined && 'nothing' in made && !made.anchored)
        made = attempt(ps, true, minLength, maxLength, within, unicode, !narrow);
      if (made === TOO_LARGE) continue;
      if (made === undefined || 'automaton' in made) return made;
      // Nothing: a definite answer only from the schema's own patterns, read whole (anchored, or
      // anywhere), with every character (no property read as its BMP part) and no format's subset.
      const definite = !narrow && (made.anchored || made.search) && !made.restricted && within === undefined;
      return definite ? { unsatisfiable: made.nothing } : undefined;
    }
    return undefined;
  } catch {
    // refa's errors: a back-reference, a feature it does not know.
    return undefined;
  }
}

const TOO_LARGE = Symbol('too large');

type Attempt =
  | { automaton: Automaton; lengthsHeld: boolean }
  | { nothing: string; anchored: boolean; search: boolean; restricted: boolean }
  | typeof TOO_LARGE
  | undefined;

/**
 * patternAutomaton for these patterns, read whole or (`search`) anywhere. TOO_LARGE where the
 * automaton passes the state limit (with `mustBound`, also where its strings cannot be bounded
 * within it; without, the unbounded automaton is the answer then).
 */
function attempt(
  list: readonly string[],
  search: boolean,
  minLength: number,
  maxLength: number,
  within: string | undefined,
  unicode: boolean | undefined,
  mustBound: boolean,
): Attempt {
  try {
    const made = intersection(list, search, within, unicode);
    if (made === undefined) return undefined;
    const { fa, anchored, restricted, utf16 } = made;
    const nothing = (why: string, lengths = false): Attempt => ({
      nothing: why,
      anchored,
      search,
      // Without the `u` flag the automaton counts UTF-16 units, Ajv's lengths code points: a pair of
      // surrogates is two characters to one and one to the other.
      restricted: restricted || (lengths && utf16),
    });
    if (fa.isEmpty) return nothing('matches no string');
    const max = fa.maxCharacter;
    // Strings of JSON text only: a character class beyond it (an emoji outside the BMP) is left out.
    const json = CharSet.empty(max).union(
      JSON_STRING_CHARS.filter(([a]) => a <= max).map(([min, hi]) => ({ min, max: Math.min(hi, max) })),
    );
    const text = meet(fa, lengths(json, max, 0, Infinity));
    const fewest = shortest(text);
    // No string of the characters the grammar writes (only characters beyond the BMP): the check's.
    if (fewest === undefined) return undefined;
    let overflowed = false;
    for (const open of OPEN_LENGTH) {
      const hi = Math.min(maxLength, Math.max(minLength, fewest) + open);
      try {
        const bounded = meet(text, lengths(json, max, minLength, hi));
        const automaton = live(bounded);
        if (automaton !== undefined) return { automaton, lengthsHeld: true };
        // Nothing within these bounds: maybe beyond them (below).
        overflowed = false;
        break;
      } catch (err) {
        if (!(err instanceof TooManyNodesError)) throw err;
        overflowed = true;
      }
    }
    if (overflowed && mustBound) return TOO_LARGE;
    // Nothing within the lengths, of any character: none at all (the caller judges how definite).
    const inLengths = meet(fa, lengths(CharSet.all(max), max, minLength, maxLength > MAX_STATES ? Infinity : maxLength));
    if (inLengths.isEmpty) return nothing('matches no string within minLength and maxLength', true);
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
function narrowed(pattern: string, unicode: boolean | undefined): string | undefined {
  const parsed = parse(pattern, unicode);
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
