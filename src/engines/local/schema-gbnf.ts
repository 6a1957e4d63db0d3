/**
 * JSON schema → GBNF (llama.cpp's grammar format), so that a local model writes JSON the schema
 * accepts. Pure and synchronous; it runs in a worker thread (schema-worker.ts), never on the request
 * path's event loop. Reads drafts 04, 06, 07, 2019-09 and 2020-12.
 *
 * The rule for every keyword: the grammar accepts either exactly the values the schema accepts, or
 * a subset of them (a uniqueItems array of at most one item, a number range through whole parts, a
 * pattern matched in full, a plain host for `format: uri`). Either way every document it allows is
 * valid. A keyword that no grammar can hold (oneOf's "exactly one", `not` in general, uniqueItems
 * over several items) is compiled as loosely as it must be and named in `checked`: the engine then
 * validates each document and samples again when one fails (see local-engine.ts), so the guarantee
 * holds without the grammar. Unknown keywords and annotations are ignored, as JSON Schema says.
 *
 * The output is compact JSON (no whitespace), which costs a model the fewest tokens and leaves it
 * no room to wander. Properties come in declared order, required ones first.
 */
import { FORMAT_PATTERNS, STRING_FORMATS, INTEGER_FORMATS } from './schema-formats.js';
import { integerBounds, integerRange, multiplesIn, numberRange, type NumberBounds } from './schema-numbers.js';
import { patternAutomatonGbnf, patternMatches, patternSpan, patternToGbnf, singleRepeat, type RuleSink } from './schema-regex.js';
import { patternTest } from './schema-automaton.js';
import type { Draft } from './schema-validator.js';

/** The schema cannot be compiled (the request is refused with this message): unsupported, or invalid (it accepts nothing). */
export class SchemaCompileError extends Error {
  constructor(
    message: string,
    readonly kind: 'unsupported' | 'invalid' = 'unsupported',
  ) {
    super(message);
  }
}
/** No value satisfies this (sub)schema: an optional place drops it, a required one fails. */
class Unsatisfiable extends SchemaCompileError {}

export interface CompiledGrammar {
  gbnf: string;
  /** Keywords (with their paths) the grammar does not enforce exactly: the validator must. Empty: the grammar is exact. */
  checked: string[];
}

type Schema = Record<string, unknown>;

/** Keywords that constrain values; every other keyword is an annotation or unknown and is ignored. */
const CONSTRAINTS = new Set([
  'type',
  'enum',
  'const',
  'multipleOf',
  'maximum',
  'exclusiveMaximum',
  'minimum',
  'exclusiveMinimum',
  'maxLength',
  'minLength',
  'pattern',
  'format',
  'items',
  'prefixItems',
  'additionalItems',
  'maxItems',
  'minItems',
  'uniqueItems',
  'contains',
  'minContains',
  'maxContains',
  'properties',
  'patternProperties',
  'additionalProperties',
  'required',
  'maxProperties',
  'minProperties',
  'propertyNames',
  'dependencies',
  'dependentRequired',
  'dependentSchemas',
  'allOf',
  'anyOf',
  'oneOf',
  'not',
  'if',
  'then',
  'else',
  '$ref',
  '$recursiveRef',
  '$dynamicRef',
  'unevaluatedProperties',
  'unevaluatedItems',
  'nullable',
]);
const STRING_KEYS = ['minLength', 'maxLength', 'pattern', 'format'];
const NUMBER_KEYS = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'multipleOf'];
const ARRAY_KEYS = ['items', 'prefixItems', 'additionalItems', 'minItems', 'maxItems', 'uniqueItems', 'contains', 'unevaluatedItems'];
const OBJECT_KEYS = [
  'properties',
  'patternProperties',
  'additionalProperties',
  'required',
  'minProperties',
  'maxProperties',
  'propertyNames',
  'dependencies',
  'dependentRequired',
  'dependentSchemas',
  'unevaluatedProperties',
];
const TYPES = ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object'] as const;
type JsonType = (typeof TYPES)[number];

const HEX = '[0-9a-fA-F]';
/** Fixed rules every grammar may use. A `\u` escape never encodes a surrogate (it would count as two characters). */
const BASE_RULES: Record<string, string> = {
  null: '"null"',
  boolean: '"true" | "false"',
  integer: '"-"? ("0" | [1-9] [0-9]{0,14})',
  number: '"-"? ("0" | [1-9] [0-9]{0,14}) ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?',
  char: `[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt] | "\\\\u" ([0-9a-cA-CefEF] ${HEX}{3} | [dD] [0-7] ${HEX}{2})`,
  string: '"\\"" char* "\\""',
  value: 'object-value | array-value | string | number | boolean | null',
  'object-value': '"{" ( string ":" value ( "," string ":" value )* )? "}"',
  'array-value': '"[" ( value ( "," value )* )? "]"',
};
/** Members a minProperties may need under names of their own (namedPairs); past it the check judges. */
const MAX_NAMED_KEYS = 64;
/** Repetitions past their minimum that an open quantifier of a pattern beside a format is written with (see stringRule). */
const FORMAT_OPEN_REPEAT = 16;
/**
 * The same for a pattern alone: `^[A-Za-z]+\/[A-Za-z_]+$` ran to the end of the context on every try,
 * letters and never the `/`, where a small model is free to write on (as the automaton's strings are
 * bounded, schema-automaton.ts).
 */
const PATTERN_OPEN_REPEAT = 32;
/** Rules made beyond this are a schema too complex to compile (the compile time limit is the other bound). */
const MAX_RULES = 50_000;
/** Where relative `$id`s and `$ref`s of a schema without an absolute `$id` resolve. */
const ROOT_BASE = 'https://switchyard.invalid/schema.json';

/** A GBNF string literal for `text` (matched byte for byte). */
export function gbnfLiteral(text: string): string {
  let out = '"';
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return `${out}"`;
}

const isSchema = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);
const same = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b);
const hasConstraints = (s: Schema): boolean => Object.keys(s).some((k) => CONSTRAINTS.has(k));
/** llama.cpp refuses repetition counts of 2000 and more. */
const MAX_COUNT = 1999;
/** A bounded repetition longer than this is cut to it: a subset, and a grammar llama.cpp expands quickly. */
const LONG_REPEAT = 1000;

function repeat(min: number, max: number): string {
  if (min > MAX_COUNT)
    throw new SchemaCompileError(`a repetition of at least ${min} is more than the grammar engine allows (${MAX_COUNT})`);
  const top = max === Infinity ? max : max > LONG_REPEAT ? Math.max(min, LONG_REPEAT) : max;
  return top === Infinity ? (min === 0 ? '*' : min === 1 ? '+' : `{${min},}`) : min === top ? `{${min}}` : `{${min},${top}}`;
}

/** `rule ( "," rule )…`: between min and max elements (min ≥ 1). */
function commaList(rule: string, min: number, max: number): string {
  if (max === 1) return rule;
  return `${rule} ( "," ${rule} )${repeat(min - 1, max - 1)}`;
}

function jsonType(v: unknown): JsonType {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v as 'boolean' | 'string' | 'object';
}

function matchesType(v: unknown, t: JsonType): boolean {
  switch (t) {
    case 'null':
      return v === null;
    case 'boolean':
      return typeof v === 'boolean';
    case 'integer':
      return typeof v === 'number' && Number.isInteger(v);
    case 'number':
      return typeof v === 'number';
    case 'string':
      return typeof v === 'string';
    case 'array':
      return Array.isArray(v);
    case 'object':
      return isSchema(v);
  }
}

/** draft-04's boolean `exclusiveMinimum`/`exclusiveMaximum` in the later form (a bound of their own). */
function normaliseBounds(s: Schema): Schema {
  const exMin = s['exclusiveMinimum'];
  const exMax = s['exclusiveMaximum'];
  if (typeof exMin !== 'boolean' && typeof exMax !== 'boolean') return s;
  const out: Schema = { ...s };
  if (typeof exMin === 'boolean') {
    delete out['exclusiveMinimum'];
    if (exMin && num(s['minimum']) !== undefined) {
      out['exclusiveMinimum'] = s['minimum'];
      delete out['minimum'];
    }
  }
  if (typeof exMax === 'boolean') {
    delete out['exclusiveMaximum'];
    if (exMax && num(s['maximum']) !== undefined) {
      out['exclusiveMaximum'] = s['maximum'];
      delete out['maximum'];
    }
  }
  return out;
}

class Compiler {
  private readonly rules = new Map<string, string>();
  private readonly byBody = new Map<string, string>();
  private readonly refs = new Map<string, string>();
  private readonly used = new Set<string>();
  private readonly checked = new Set<string>();
  /** Schemas by absolute URI (`$id`, and `#anchor`s), for `$ref`. */
  private readonly index = new Map<string, unknown>();
  /** The base URI each subschema object resolves references against. */
  private readonly bases = new WeakMap<object, string>();
  private counter = 0;
  /** While above zero, merges are only being looked at (oneOf analysis): they leave nothing to the check. */
  private quiet = 0;

  constructor(
    private readonly root: unknown,
    private readonly draft: Draft,
    /** The flag the validator compiled the schema's patterns with (undefined: `u` where a pattern allows it). */
    private readonly unicode: boolean | undefined,
  ) {
    this.index.set(ROOT_BASE, root);
    this.walk(root, ROOT_BASE);
  }

  /** Leaves a keyword to the validator. */
  private check(keyword: string, path: string): void {
    if (this.quiet > 0) return;
    this.checked.add(`${keyword} at '${path || '/'}'`);
  }

  /** Records every subschema's base URI and every `$id` and anchor. */
  private walk(node: unknown, base: string): void {
    if (Array.isArray(node)) {
      for (const n of node) this.walk(n, base);
      return;
    }
    if (!isSchema(node) || this.bases.has(node)) return;
    const id = this.draft === '04' ? node['id'] : node['$id'];
    if (typeof id === 'string') {
      try {
        const url = new URL(id, base);
        if (id.startsWith('#')) this.index.set(url.href, node);
        else {
          if (url.hash) this.index.set(url.href, node);
          url.hash = '';
          base = url.href;
          this.index.set(base, node);
        }
      } catch {
        // An id that is not a URI reference: the validator decides whether the schema is usable.
      }
    }
    for (const k of ['$anchor', '$dynamicAnchor', '$recursiveAnchor']) {
      const a = node[k];
      if (typeof a === 'string') this.index.set(`${base}#${a}`, node);
    }
    this.bases.set(node, base);
    for (const k of ['properties', 'patternProperties', 'definitions', '$defs', 'dependentSchemas', 'dependencies']) {
      const v = node[k];
      if (isSchema(v)) for (const sub of Object.values(v)) this.walk(sub, base);
    }
    for (const k of ['items', 'prefixItems', 'allOf', 'anyOf', 'oneOf']) this.walk(node[k], base);
    for (const k of [
      'additionalProperties',
      'additionalItems',
      'not',
      'if',
      'then',
      'else',
      'contains',
      'propertyNames',
      'unevaluatedProperties',
      'unevaluatedItems',
    ])
      this.walk(node[k], base);
  }

  private resolve(ref: string, base: string, path: string): { target: unknown; base: string } {
    let url: URL;
    try {
      url = new URL(ref, base);
    } catch {
      throw new SchemaCompileError(`reference '${ref}' at '${path}' is not a URI reference`);
    }
    const fragment = url.hash.slice(1);
    url.hash = '';
    const doc = this.index.get(url.href);
    if (doc === undefined) throw new SchemaCompileError(`reference '${ref}' at '${path}' points outside the schema`);
    let target: unknown = doc;
    if (fragment.startsWith('/')) {
      for (const raw of fragment.slice(1).split('/')) {
        const part = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~');
        target = isSchema(target) || Array.isArray(target) ? (target as Record<string, unknown>)[part] : undefined;
        if (target === undefined) throw new SchemaCompileError(`reference '${ref}' at '${path}' points nowhere`);
      }
    } else if (fragment) {
      target = this.index.get(`${url.href}#${decodeURIComponent(fragment)}`);
      if (target === undefined) throw new SchemaCompileError(`reference '${ref}' at '${path}' names no anchor`);
    }
    return { target, base: (isSchema(target) && this.bases.get(target)) || url.href };
  }

  /** A rule with this body (an existing one when the same body was made before). */
  private rule(hint: string, body: string): string {
    const known = this.byBody.get(body);
    if (known) return known;
    const name = this.reserve(hint);
    this.rules.set(name, body);
    this.byBody.set(body, name);
    return name;
  }

  /** A new rule's name, its body to be set (an automaton's states refer to each other). */
  private reserve(hint: string): string {
    if (this.rules.size >= MAX_RULES) throw new SchemaCompileError('the schema is too complex to compile');
    const name = `${
      hint
        .replace(/[^a-zA-Z0-9-]+/g, '-')
        .replace(/^-+|-+$/g, '')
        .toLowerCase()
        .slice(-40)
        .replace(/^-+/, '') || 'r'
    }-${this.counter++}`;
    this.rules.set(name, '""');
    return name;
  }

  /** Patterns merged from an allOf, by the one pattern that stands for them in the merged schema. */
  private readonly mergedPatterns = new Map<string, readonly string[]>();

  /** Automata already written into this grammar, by what they were asked for; pattern tests, by pattern. */
  private readonly automata = new Map<string, ReturnType<typeof patternAutomatonGbnf>>();
  private readonly tests = new Map<string, ReturnType<typeof patternTest>>();

  /** A pattern's automaton in this grammar (schema-regex.ts), written once however often it is used. */
  private automatonGrammar(
    patterns: string | readonly string[],
    min = 0,
    max = Infinity,
    within?: string,
  ): ReturnType<typeof patternAutomatonGbnf> {
    const key = JSON.stringify([patterns, min, max === Infinity ? null : max, within ?? null]);
    if (!this.automata.has(key)) this.automata.set(key, patternAutomatonGbnf(patterns, this.sink, min, max, within, this.unicode));
    return this.automata.get(key);
  }

  /** A pattern's linear-time test (schema-automaton.ts), built once. */
  private patternTest(pattern: string): ReturnType<typeof patternTest> {
    if (!this.tests.has(pattern)) this.tests.set(pattern, patternTest(pattern, this.unicode));
    return this.tests.get(pattern);
  }

  /** Rules for a pattern's automaton (schema-regex.ts), kept in this grammar. */
  private readonly sink: RuleSink = {
    reserve: (hint) => this.reserve(hint),
    define: (name, body) => void this.rules.set(name, body),
    rule: (hint, body) => this.rule(hint, body),
  };

  private base(name: string): string {
    this.used.add(name);
    return name;
  }

  compile(): CompiledGrammar {
    let top: string;
    try {
      top = this.visit(this.root, '', ROOT_BASE);
    } catch (err) {
      if (err instanceof Unsatisfiable) throw new SchemaCompileError(`the schema accepts no value (${err.message})`, 'invalid');
      throw err;
    }
    const lines = [`root ::= ${top}`];
    for (const [name, body] of this.rules) lines.push(`${name} ::= ${body}`);
    // Base rules reach each other (string → char, value → object-value → …): add them to a fixed point.
    const pending = [...this.used];
    const added = new Set<string>();
    while (pending.length) {
      const name = pending.pop()!;
      if (added.has(name)) continue;
      added.add(name);
      const body = BASE_RULES[name]!;
      lines.push(`${name} ::= ${body}`);
      for (const other of Object.keys(BASE_RULES)) if (new RegExp(`(^|[^a-z-])${other}($|[^a-z-])`).test(body)) pending.push(other);
    }
    return { gbnf: `${lines.join('\n')}\n`, checked: [...this.checked] };
  }

  /** The rule for `$ref`: one per target, made before the target is compiled so recursion refers to itself. */
  private refRule(ref: string, base: string, path: string): string {
    const { target, base: targetBase } = this.resolve(ref, base, path);
    const key = `${targetBase} ${ref.startsWith('#') ? ref : new URL(ref, base).href}`;
    let name = this.refs.get(key);
    if (!name) {
      name = `ref-${this.counter++}`;
      this.refs.set(key, name);
      this.rules.set(name, '');
      try {
        this.rules.set(name, this.visit(target, `${path}/$ref`, targetBase));
      } catch (err) {
        this.rules.delete(name);
        this.refs.delete(key);
        throw err;
      }
    }
    return name;
  }

  /** Follows `$ref`s (for merging); a reference already being followed stays as it is. */
  private deref(s: unknown, base: string, path: string, seen: Set<string>): { schema: unknown; base: string } {
    let cur = s;
    let b = base;
    while (isSchema(cur) && typeof cur['$ref'] === 'string') {
      const { $ref, ...siblings } = cur;
      const ref = $ref as string;
      if (seen.has(ref) || seen.size > 64) return { schema: cur, base: b };
      seen.add(ref);
      const r = this.resolve(ref, b, path);
      // Keywords beside $ref apply too (see visit).
      const keep = hasConstraints(siblings);
      cur = keep && isSchema(r.target) ? { ...siblings, allOf: [r.target] } : r.target;
      b = keep ? b : r.base;
    }
    return { schema: cur, base: b };
  }

  /** A rule name (or inline expression) matching the JSON values `schema` accepts, or a subset of them. */
  private visit(schema: unknown, path: string, inherited: string): string {
    if (schema === true) return this.base('value');
    if (schema === false) throw new Unsatisfiable(`the schema at '${path || '/'}' accepts nothing`);
    if (!isSchema(schema)) throw new SchemaCompileError(`the schema at '${path || '/'}' must be an object or a boolean`);
    const base = this.bases.get(schema) ?? inherited;
    let s = normaliseBounds(schema);
    if (!hasConstraints(s)) return this.base('value');

    const dyn = s['$recursiveRef'] ?? s['$dynamicRef'];
    if (typeof dyn === 'string' && typeof s['$ref'] !== 'string') {
      // Resolved statically: within one document the dynamic scope ends where the static one does.
      const { $recursiveRef: _r, $dynamicRef: _d, ...rest } = s;
      s = { ...rest, $ref: dyn };
    }
    if (typeof s['$ref'] === 'string') {
      const { $ref, ...siblings } = s;
      // Keywords beside $ref apply, in every draft: the drafts before 2019-09 say to ignore them,
      // but Ajv, the validator, applies them (a `pattern` beside a `$ref` was a grammar the check
      // then failed, as a bug), and a document that meets both meets either reading.
      if (!hasConstraints(siblings)) return this.refRule($ref as string, base, path);
      s = { ...siblings, allOf: [...(Array.isArray(siblings['allOf']) ? siblings['allOf'] : []), { $ref }] };
    }
    if (Array.isArray(s['allOf'])) return this.visit(this.mergeAllOf(s, path, base), path, base);

    const oneOf = Array.isArray(s['oneOf']) ? (s['oneOf'] as unknown[]) : undefined;
    const anyOf = Array.isArray(s['anyOf']) ? (s['anyOf'] as unknown[]) : undefined;
    if (oneOf || anyOf) {
      const key = oneOf ? 'oneOf' : 'anyOf';
      const branches = (oneOf ?? anyOf)!;
      const { oneOf: _o, anyOf: _a, ...rest } = s;
      if (oneOf && anyOf) {
        // Both: the branches of anyOf are merged into the rest, one of them at a time would be a
        // product; the grammar follows oneOf and the validator checks anyOf.
        this.check('anyOf', path);
      }
      const plan = oneOf ? this.oneOfPlan(oneOf, rest, base, path) : undefined;
      if (oneOf && !plan) this.check('oneOf', path);
      const own = hasConstraints(rest);
      const alts: string[] = [];
      let why: Error | undefined;
      branches.forEach((b, i) => {
        const where = `${path}/${key}/${i}`;
        try {
          let target: unknown = b;
          let targetBase = base;
          const leave = plan?.[i] ?? [];
          if (own || leave.length > 0) {
            const d = this.deref(b, base, where, new Set());
            if (d.schema === false) return;
            target = d.schema === true ? rest : isSchema(d.schema) ? this.merge(rest, normaliseBounds(d.schema), where) : d.schema;
            targetBase = d.base;
            if (leave.length > 0 && isSchema(target)) {
              const props = isSchema(target['properties']) ? { ...target['properties'] } : {};
              for (const name of leave) props[name] = false;
              target = { ...target, properties: props };
            }
          }
          alts.push(this.visit(target, where, targetBase));
        } catch (err) {
          if (!(err instanceof Unsatisfiable)) throw err;
          why ??= err;
        }
      });
      if (alts.length === 0) throw why ?? new Unsatisfiable(`no branch of the ${key} at '${path || '/'}' can be satisfied`);
      const unique = [...new Set(alts)];
      return unique.length === 1 ? unique[0]! : this.rule(`${path}-alt`, unique.join(' | '));
    }

    if ('if' in s) {
      const { if: cond, then: yes, else: no, ...rest } = s;
      // Satisfying `if` and `then` together is always valid (a subset); `else` only when that is impossible.
      try {
        const withIf = isSchema(cond) ? this.merge(rest, normaliseBounds(cond), `${path}/if`) : cond === false ? undefined : rest;
        if (withIf) return this.visit(isSchema(yes) ? this.merge(withIf, normaliseBounds(yes), `${path}/then`) : withIf, path, base);
      } catch (err) {
        if (!(err instanceof Unsatisfiable)) throw err;
      }
      this.check('if', path);
      return this.visit(isSchema(no) ? this.merge(rest, normaliseBounds(no), `${path}/else`) : rest, path, base);
    }
    if ('then' in s || 'else' in s) {
      const { then: _t, else: _e, ...rest } = s;
      return this.visit(rest, path, base);
    }

    if ('not' in s) {
      const { not, ...rest } = s;
      return this.visit(this.applyNot(rest, not, path), path, base);
    }

    const types = this.types(s, path);
    if ('const' in s || Array.isArray(s['enum'])) {
      const values = 'const' in s ? [s['const']] : (s['enum'] as unknown[]);
      const typed = values.filter((v) => types === undefined || types.some((t) => matchesType(v, t)));
      if (typed.length === 0) throw new Unsatisfiable(`no value of the enum at '${path || '/'}' has the schema's type`);
      // Strings the pattern or lengths beside the enum refuse are left out here, not sampled and
      // checked (`{enum: ["alpha", "beta"], pattern: "^(?!b)"}` offered "beta"). The pattern is
      // tested by its automaton (a RegExp may backtrack for hours on a value); one without an
      // automaton is left to the check.
      const pattern = typeof s['pattern'] === 'string' ? s['pattern'] : undefined;
      const patterns = pattern === undefined ? [] : (this.mergedPatterns.get(pattern) ?? [pattern]);
      const tests = patterns.map((p) => this.patternTest(p));
      const lo = num(s['minLength']) ?? 0;
      const hi = num(s['maxLength']) ?? Infinity;
      // A value the automaton cannot judge (beyond the BMP, with a property read as its BMP part) stays, checked.
      let unknown = false;
      const matches = (v: string): boolean =>
        tests.every((t) => {
          const r = t?.(v);
          if (t !== undefined && r === undefined) unknown = true;
          return r !== false;
        });
      const fits = (v: string): boolean => [...v].length >= lo && [...v].length <= hi && matches(v);
      const allowed = typed.filter((v) => typeof v !== 'string' || fits(v));
      if (allowed.length === 0) throw new Unsatisfiable(`no value of the enum at '${path || '/'}' meets the pattern and lengths beside it`);
      const held = ['type', 'enum', 'const', 'nullable', 'minLength', 'maxLength'];
      if (tests.every((t) => t !== undefined) && !unknown) held.push('pattern');
      const others = Object.keys(s).filter((k) => CONSTRAINTS.has(k) && !held.includes(k));
      if (others.length > 0 || ('const' in s && Array.isArray(s['enum']))) this.check(others[0] ?? 'enum', path);
      return this.rule(`${path}-enum`, [...new Set(allowed.map((v) => gbnfLiteral(JSON.stringify(v))))].join(' | '));
    }
    const list = types ?? this.inferTypes(s);
    if (list === undefined) return this.base('value');
    const alts: string[] = [];
    let why: Error | undefined;
    for (const t of list.filter((t) => !(t === 'integer' && list.includes('number')))) {
      try {
        alts.push(this.typed(s, t, path, base));
      } catch (err) {
        if (!(err instanceof Unsatisfiable)) throw err;
        why ??= err;
      }
    }
    if (alts.length === 0) throw why ?? new Unsatisfiable(`no value of any type the schema at '${path || '/'}' allows satisfies it`);
    return alts.length === 1 ? alts[0]! : this.rule(`${path}-types`, alts.join(' | '));
  }

  private types(s: Schema, path: string): JsonType[] | undefined {
    const t = s['type'];
    if (t === undefined) return undefined;
    const list = (Array.isArray(t) ? t : [t]).filter((x) => {
      if (TYPES.includes(x as JsonType)) return true;
      throw new SchemaCompileError(`unknown type '${String(x)}' at '${path}/type'`);
    }) as JsonType[];
    if (s['nullable'] === true && !list.includes('null')) list.push('null');
    return list;
  }

  /** A schema without `type`: the types its keywords speak of (others would pass unchecked, so any would do; these are the point). */
  private inferTypes(s: Schema): JsonType[] | undefined {
    const out: JsonType[] = [];
    if (OBJECT_KEYS.some((k) => k in s)) out.push('object');
    if (ARRAY_KEYS.some((k) => k in s)) out.push('array');
    if (STRING_KEYS.some((k) => k in s)) out.push('string');
    if (NUMBER_KEYS.some((k) => k in s)) out.push('number');
    return out.length > 0 ? out : undefined;
  }

  /** A oneOf branch as one schema (references followed, allOf merged), for looking at; undefined if that fails. */
  private flat(b: unknown, base: string, path: string): unknown {
    this.quiet++;
    try {
      const d = this.deref(b, base, path, new Set());
      return isSchema(d.schema) && Array.isArray(d.schema['allOf']) ? this.mergeAllOf(d.schema, path, d.base) : d.schema;
    } catch {
      return undefined;
    } finally {
      this.quiet--;
    }
  }

  /**
   * How the branches of a oneOf are kept apart, so that the grammar's "any of" means "exactly one":
   * per branch, property names it must leave out (so that no other branch's required properties are
   * all present). `undefined` when they cannot be told apart here: the validator then checks.
   * Branches are apart when their types differ, when a required property holds different constants
   * in each, when they are different constants, or (objects) by their required properties.
   */
  private oneOfPlan(branches: unknown[], rest: Schema, base: string, path: string): string[][] | undefined {
    const flat = branches.map((b, i) => this.flat(b, base, `${path}/oneOf/${i}`));
    const none = branches.map((): string[] => []);
    const typeSet = (b: unknown): Set<string> | undefined => {
      if (!isSchema(b)) return undefined;
      let list: unknown[] | undefined;
      if (b['type'] !== undefined) list = Array.isArray(b['type']) ? b['type'] : [b['type']];
      else if ('const' in b) list = [jsonType(b['const'])];
      else if (Array.isArray(b['enum'])) list = (b['enum'] as unknown[]).map(jsonType);
      if (!list) return undefined;
      const set = new Set(list.map((t) => (t === 'integer' ? 'number' : String(t))));
      if (b['nullable'] === true) set.add('null');
      return set;
    };
    const sets = flat.map(typeSet);
    if (sets.every((t) => t !== undefined)) {
      const all = sets.flatMap((t) => [...t!]);
      if (new Set(all).size === all.length) return none;
    }
    const literals = flat.map((b) =>
      isSchema(b) && 'const' in b ? [b['const']] : isSchema(b) && Array.isArray(b['enum']) ? b['enum'] : undefined,
    );
    if (literals.every((l) => l !== undefined)) {
      const all = literals.flat().map((v) => JSON.stringify(v));
      if (new Set(all).size === all.length) return none;
    }
    // From here on every branch must make objects only.
    const restTypes = typeSet(rest);
    const objectsOnly = (b: unknown): boolean => {
      if (!isSchema(b)) return false;
      const t = typeSet(b) ?? restTypes;
      return t !== undefined ? t.size === 1 && t.has('object') : (this.inferTypes(b) ?? this.inferTypes(rest))?.join() === 'object';
    };
    if (!flat.every(objectsOnly)) return undefined;
    const objs = flat as Schema[];
    const requiredOf = (o: Schema): Set<string> =>
      new Set(
        [
          ...(Array.isArray(o['required']) ? (o['required'] as unknown[]) : []),
          ...(Array.isArray(rest['required']) ? (rest['required'] as unknown[]) : []),
        ].map(String),
      );
    const names = new Set(objs.flatMap((o) => Object.keys(isSchema(o['properties']) ? o['properties'] : {})));
    for (const name of names) {
      const values = objs.map((o) => {
        const p = isSchema(o['properties']) ? o['properties'][name] : undefined;
        if (!requiredOf(o).has(name) || !isSchema(p)) return undefined;
        if ('const' in p) return [JSON.stringify(p['const'])];
        if (Array.isArray(p['enum'])) return (p['enum'] as unknown[]).map((v) => JSON.stringify(v));
        return undefined;
      });
      if (values.every((v) => v !== undefined)) {
        const all = values.flat();
        if (new Set(all).size === all.length) return none;
      }
    }
    // By required properties: branch i leaves out one property that each other branch requires and it does not.
    const required = objs.map(requiredOf);
    const plan: string[][] = [];
    for (let i = 0; i < objs.length; i++) {
      const leave = new Set<string>();
      for (let j = 0; j < objs.length; j++) {
        if (j === i) continue;
        const candidates = [...required[j]!].filter((n) => !required[i]!.has(n));
        if (candidates.length === 0) return undefined;
        if (!candidates.some((n) => leave.has(n))) leave.add(candidates[0]!);
      }
      plan.push([...leave]);
    }
    return plan;
  }

  /** `not`: the common exact cases (a property that must be absent, a type that is excluded); others left to the check. */
  private applyNot(rest: Schema, not: unknown, path: string): Schema {
    if (not === false) return rest;
    if (not === true) throw new Unsatisfiable(`the schema at '${path || '/'}' is 'not: true'`);
    if (!isSchema(not)) return rest;
    const keys = Object.keys(not).filter((k) => CONSTRAINTS.has(k));
    // `not: {}` (or a schema of annotations only) forbids every value, as `not: true` does.
    if (keys.length === 0) throw new Unsatisfiable(`the schema at '${path || '/'}' is 'not' of a schema that accepts every value`);
    if (keys.length === 1 && keys[0] === 'required' && Array.isArray(not['required'])) {
      // Any one of the names absent is enough: make an optional one impossible.
      const required = new Set(Array.isArray(rest['required']) ? (rest['required'] as unknown[]).map(String) : []);
      const name = (not['required'] as unknown[]).map(String).find((n) => !required.has(n));
      if (name === undefined) throw new Unsatisfiable(`the schema at '${path || '/'}' requires what its 'not' forbids`);
      const props = isSchema(rest['properties']) ? rest['properties'] : {};
      return { ...rest, properties: { ...props, [name]: false } };
    }
    if (keys.length === 1 && keys[0] === 'type') {
      const excluded = new Set(Array.isArray(not['type']) ? (not['type'] as unknown[]) : [not['type']]);
      const current = this.types(rest, path) ?? this.inferTypes(rest) ?? [...TYPES];
      const left = current.filter((t) => !excluded.has(t) && !(t === 'integer' && excluded.has('number')));
      if (left.length === 0) throw new Unsatisfiable(`the schema at '${path || '/'}' excludes every type it allows`);
      // `number` minus `integer` is a number with a fraction: left to the check.
      if (left.includes('number') && excluded.has('integer')) this.check('not', path);
      const { nullable: _n, ...out } = rest;
      return { ...out, type: left };
    }
    this.check('not', path);
    return rest;
  }

  /** `allOf` merged into one schema (with references followed); what cannot be merged is left to the check. */
  private mergeAllOf(s: Schema, path: string, base: string, seen = new Set<string>()): Schema {
    const { allOf, ...rest } = s;
    let acc: Schema = rest;
    (allOf as unknown[]).forEach((sub, i) => {
      const where = `${path}/allOf/${i}`;
      const d = this.deref(sub, base, where, seen);
      if (d.schema === true) return;
      if (d.schema === false) throw new Unsatisfiable(`allOf at '${path || '/'}' holds false`);
      if (!isSchema(d.schema)) throw new SchemaCompileError(`allOf at '${path || '/'}' holds a schema that is not an object`);
      let part = normaliseBounds(d.schema);
      if (typeof part['$ref'] === 'string') {
        // A reference that is already being merged (recursion): it cannot be folded in.
        this.check('allOf', where);
        return;
      }
      if (Array.isArray(part['allOf'])) part = this.mergeAllOf(part, where, d.base, seen);
      acc = this.merge(acc, part, where);
    });
    return acc;
  }

  /**
   * Two schemas that must both hold, as one. Exact where the keywords combine (bounds, required,
   * properties, types, enums); where they do not, the first is kept and the keyword left to the check.
   */
  private merge(a: Schema, b: Schema, path: string): Schema {
    // A reference cannot sit beside other keywords: it becomes an allOf member.
    const refsOf = (x: Schema): unknown[] => (typeof x['$ref'] === 'string' ? [{ $ref: x['$ref'] }] : []);
    const out: Schema = { ...a };
    delete out['$ref'];
    const refs = [...refsOf(a), ...refsOf(b)];
    if (refs.length > 0) out['allOf'] = [...(Array.isArray(out['allOf']) ? out['allOf'] : []), ...refs];
    for (const [k, v] of Object.entries(b)) {
      if (k === '$ref') continue;
      if (!CONSTRAINTS.has(k) && k !== '$defs' && k !== 'definitions') continue;
      if (!(k in out)) {
        out[k] = v;
        continue;
      }
      const prev = out[k];
      if (same(prev, v)) continue;
      switch (k) {
        case 'properties':
        case 'patternProperties':
        case 'dependentSchemas': {
          const props: Schema = { ...(prev as Schema) };
          for (const [name, sub] of Object.entries(v as Schema)) props[name] = name in props ? { allOf: [props[name], sub] } : sub;
          out[k] = props;
          break;
        }
        case '$defs':
        case 'definitions':
          break;
        case 'required':
          out[k] = [...new Set([...(prev as unknown[]), ...(v as unknown[])])];
          break;
        case 'type': {
          const left = Array.isArray(prev) ? prev : [prev];
          const right = Array.isArray(v) ? v : [v];
          const both = left
            .filter((t) => right.includes(t) || (t === 'integer' && right.includes('number')))
            .concat(right.filter((t) => t === 'integer' && left.includes('number') && !right.includes('number')));
          if (both.length === 0) throw new Unsatisfiable(`allOf at '${path}' requires incompatible types`);
          out[k] = [...new Set(both)];
          break;
        }
        case 'enum':
        case 'const': {
          const left = k === 'enum' ? (prev as unknown[]) : [prev];
          const right = k === 'enum' ? (v as unknown[]) : [v];
          const both = left.filter((x) => right.some((y) => same(x, y)));
          if (both.length === 0) throw new Unsatisfiable(`allOf at '${path}' allows no common value`);
          if (k === 'const') out[k] = both[0];
          else out[k] = both;
          break;
        }
        case 'minItems':
        case 'minLength':
        case 'minProperties':
        case 'minimum':
        case 'exclusiveMinimum':
        case 'minContains':
          out[k] = Math.max(Number(prev), Number(v));
          break;
        case 'maxItems':
        case 'maxLength':
        case 'maxProperties':
        case 'maximum':
        case 'exclusiveMaximum':
        case 'maxContains':
          out[k] = Math.min(Number(prev), Number(v));
          break;
        case 'uniqueItems':
          out[k] = prev === true || v === true;
          break;
        case 'nullable':
          out[k] = prev === true && v === true;
          break;
        case 'items':
        case 'additionalItems':
        case 'contains':
        case 'propertyNames':
        case 'unevaluatedItems':
        case 'unevaluatedProperties':
          if (Array.isArray(prev) || Array.isArray(v)) {
            this.check(k, path);
            break;
          }
          out[k] = prev === true ? v : v === true ? prev : prev === false || v === false ? false : { allOf: [prev, v] };
          break;
        case 'additionalProperties':
          if (prev === false || v === false) out[k] = false;
          else if (prev === true) out[k] = v;
          else if (v !== true) out[k] = { allOf: [prev, v] };
          break;
        case 'dependentRequired':
        case 'dependencies': {
          const deps: Schema = { ...(prev as Schema) };
          for (const [name, d] of Object.entries(v as Schema)) {
            const p = deps[name];
            deps[name] =
              p === undefined
                ? d
                : Array.isArray(p) && Array.isArray(d)
                  ? [...new Set([...p, ...d])]
                  : { allOf: [Array.isArray(p) ? { required: p } : p, Array.isArray(d) ? { required: d } : d] };
          }
          out[k] = deps;
          break;
        }
        case 'anyOf':
        case 'oneOf': {
          const left = prev as unknown[];
          const right = v as unknown[];
          if (left.length * right.length <= 16) {
            out[k] = left.flatMap((x) => right.map((y) => ({ allOf: [x, y] })));
            if (k === 'oneOf') this.check('oneOf', path);
          } else this.check(k, path);
          break;
        }
        case 'allOf':
          out[k] = [...(prev as unknown[]), ...(v as unknown[])];
          break;
        case 'pattern':
          // Strings that match both in full, as one pattern the grammar reads as their automaton
          // (zod writes `.endsWith()` beside an email's pattern as an allOf of the two).
          if (typeof prev === 'string' && typeof v === 'string') {
            // The one pattern that stands for them says what they mean together, each matched
            // anywhere, as the validator reads them; it keys them (and a schema that writes the
            // same pattern itself means the same by it).
            const parts = [...(this.mergedPatterns.get(prev) ?? [prev]), v];
            const both = `^${parts.map((p) => `(?=[^]*?(?:${p}))`).join('')}[^]*$`;
            this.mergedPatterns.set(both, parts);
            out[k] = both;
          } else this.check(k, path);
          break;
        default:
          // format, multipleOf, not, if/then/else, $ref: two of them cannot become one.
          this.check(k, path);
      }
    }
    return out;
  }

  private typed(s: Schema, type: JsonType, path: string, base: string): string {
    switch (type) {
      case 'null':
      case 'boolean':
        return this.base(type);
      case 'integer':
      case 'number':
        return this.numberRule(s, type, path);
      case 'string':
        return this.stringRule(s, path);
      case 'array':
        return this.arrayRule(s, path, base);
      case 'object':
        return this.objectRule(s, path, base);
    }
  }

  private numberRule(s: Schema, type: 'integer' | 'number', path: string): string {
    // A bound written past the largest double (1e400) parses to Infinity, which `num` drops; as a
    // lower bound (or -Infinity as an upper one) it leaves no number, as the validator finds.
    if (
      s['minimum'] === Infinity ||
      s['exclusiveMinimum'] === Infinity ||
      s['maximum'] === -Infinity ||
      s['exclusiveMaximum'] === -Infinity
    )
      throw new Unsatisfiable(`a bound past the largest number leaves none at '${path || '/'}'`);
    let min = num(s['minimum']) ?? -Infinity;
    let max = num(s['maximum']) ?? Infinity;
    let exclusiveMin = false;
    let exclusiveMax = false;
    const exMin = num(s['exclusiveMinimum']);
    const exMax = num(s['exclusiveMaximum']);
    if (exMin !== undefined && exMin >= min) [min, exclusiveMin] = [exMin, true];
    if (exMax !== undefined && exMax <= max) [max, exclusiveMax] = [exMax, true];
    let integer = type === 'integer';
    const format = s['format'];
    if (typeof format === 'string' && Object.hasOwn(INTEGER_FORMATS, format)) {
      const [lo, hi] = INTEGER_FORMATS[format]!;
      if (lo > min) [min, exclusiveMin] = [lo, false];
      if (hi < max) [max, exclusiveMax] = [hi, false];
      integer = true;
    }
    if (min > max || (min === max && (exclusiveMin || exclusiveMax)))
      throw new Unsatisfiable(`no number lies between the bounds at '${path || '/'}'`);
    const bounds: NumberBounds = { min, max, exclusiveMin, exclusiveMax };
    const multipleOf = num(s['multipleOf']);
    if (multipleOf !== undefined && multipleOf > 0 && !(integer && multipleOf === 1)) {
      const values = multiplesIn(multipleOf, bounds, integer);
      if (values.length > 0) return this.rule(`${path}-multiple`, values.map((v) => `"${v}"`).join(' | '));
      this.check('multipleOf', path);
    }
    const bounded = min !== -Infinity || max !== Infinity;
    if (!bounded) return this.base(integer ? 'integer' : 'number');
    const body = integer ? integerRange(...integerBounds(bounds)) : numberRange(bounds);
    if (body !== undefined) return this.rule(`${path}-range`, body);
    if (integer) throw new Unsatisfiable(`no integer lies in the range at '${path || '/'}'`);
    this.check('minimum/maximum', path);
    return this.base('number');
  }

  private stringRule(s: Schema, path: string): string {
    const min = num(s['minLength']) ?? 0;
    const max = num(s['maxLength']) ?? Infinity;
    if (min > max) throw new Unsatisfiable(`minLength is above maxLength at '${path || '/'}'`);
    const bounded = min > 0 || max !== Infinity;
    const formatName = typeof s['format'] === 'string' && Object.hasOwn(FORMAT_PATTERNS, s['format']) ? s['format'] : undefined;
    const format = formatName !== undefined ? STRING_FORMATS[formatName] : undefined;
    let pattern = typeof s['pattern'] === 'string' ? s['pattern'] : undefined;
    // Several (an allOf's): their automaton; without one, the first pattern and the others checked.
    const parts = pattern !== undefined ? this.mergedPatterns.get(pattern) : undefined;
    // A pattern beside a format: the strings of both, where their automata meet. The format's text
    // is our subset of the format, so neither is left to the check (`format: email` with
    // `pattern: "@example\\.com$"` failed every sample, the format's grammar with the pattern checked).
    if (formatName !== undefined && pattern !== undefined) {
      const made = this.automatonGrammar(parts ?? [pattern], min, max, FORMAT_PATTERNS[formatName]);
      if (made !== undefined && 'body' in made) {
        if (!made.lengthsHeld && bounded) this.check('minLength/maxLength', path);
        return this.rule(`${path}-pattern`, `"\\"" ${made.body} "\\""`);
      }
    }
    // Where they do not meet, a pattern that describes the whole string (anchored at both ends) shapes it and the
    // format is checked: such a pattern beside a format is its author's narrower word (zod writes
    // one for each format it knows: a UUID's version and variant digits, a date-time ending in
    // `Z`), which the format's grammar (our own plain subset) would miss on nearly every try, and
    // its text is nearly always of the format. Its open repetitions are bounded as the format
    // grammars' are (a format's text is short), so that one of them (a date-time's fraction digits)
    // cannot run a document out of tokens. A pattern that matches only part of the string (`^https://`),
    // or whose bounded grammar cannot reach the length bounds, is checked instead, as before.
    const open = format !== undefined ? FORMAT_OPEN_REPEAT : PATTERN_OPEN_REPEAT;
    let patternBody: string | undefined;
    // The lengths are in the pattern's automaton (a pattern read through one), exactly.
    let lengthsHeld = false;
    // One repeated character between anchors: the length bounds go into the repetition, exactly (see sized).
    let repeated: ReturnType<typeof singleRepeat>;
    // Lookaround, `\b`, `\p{…}`, several patterns: their automaton (not beside a format: there its
    // bounded repetitions are the element-by-element grammar's).
    const automaton = (p: string | readonly string[]): void => {
      const made = this.automatonGrammar(p, min, max);
      if (made !== undefined && 'unsatisfiable' in made)
        throw new Unsatisfiable(`the pattern${typeof p === 'string' ? '' : 's'} at '${path || '/'}' ${made.unsatisfiable}`);
      if (made !== undefined) ({ body: patternBody, lengthsHeld } = made);
    };
    if (parts !== undefined) {
      if (format === undefined) automaton(parts);
      // Without their automaton: the first one, and the others checked.
      if (patternBody === undefined) {
        this.check('pattern', path);
        pattern = parts[0];
      }
    }
    if (pattern !== undefined && patternBody === undefined) {
      const span = format !== undefined ? patternSpan(pattern, open, this.unicode) : undefined;
      const whole = span !== undefined && span.anchoredStart && span.anchoredEnd && span.max >= min && span.min <= max;
      if (format === undefined || whole) patternBody = patternToGbnf(pattern, open, this.unicode);
      // The automaton also where the element-by-element grammar would leave the lengths to the
      // check (`^sk-.*` with minLength 10 was "sk-" on every try): it holds them exactly.
      repeated = bounded ? singleRepeat(pattern, this.unicode) : undefined;
      if (format === undefined && (patternBody === undefined || (bounded && repeated === undefined))) {
        const plain = patternBody;
        patternBody = undefined;
        automaton(pattern);
        patternBody ??= plain;
      }
      if (patternBody === undefined) this.check('pattern', path);
    }
    let shaped = format;
    const single = patternBody !== undefined && !lengthsHeld ? repeated : undefined;
    if (pattern !== undefined && patternBody !== undefined) {
      shaped = lengthsHeld ? patternBody : this.sized(pattern, patternBody, min, max, path, open, single);
      if (format !== undefined) this.check('format', path);
    }
    if (shaped !== undefined) {
      if (bounded && single === undefined && !lengthsHeld) this.check('minLength/maxLength', path);
      return this.rule(`${path}-${patternBody !== undefined ? 'pattern' : 'format'}`, `"\\"" ${shaped} "\\""`);
    }
    if (min === 0 && max === Infinity) return this.base('string');
    this.base('char');
    return this.rule(`${path}-string`, `"\\"" char${repeat(min, max)} "\\""`);
  }

  /**
   * A pattern's grammar (strings that match it whole) made to reach the length bounds where it
   * cannot alone: a `minLength` above its longest match is met with any text on a side the pattern
   * leaves open, and refused where it is anchored at both ends; a `maxLength` below its shortest is
   * refused. Lengths that overlap stay with the check.
   */
  private sized(
    pattern: string,
    body: string,
    min: number,
    max: number,
    path: string,
    open: number,
    single: ReturnType<typeof singleRepeat>,
  ): string {
    if (single !== undefined) {
      const lo = Math.max(single.min, min);
      const hi = Math.min(single.max, max, open === Infinity ? Infinity : Math.max(lo, single.min + open));
      if (lo > hi) throw new Unsatisfiable(`the pattern at '${path || '/'}' matches no string within minLength and maxLength`);
      return `( ${single.element} )${repeat(lo, hi)}`;
    }
    const span = patternSpan(pattern, open, this.unicode);
    if (span === undefined) return body;
    const where = path || '/';
    if (span.min > max) throw new Unsatisfiable(`the pattern at '${where}' matches no string of at most ${max} characters (maxLength)`);
    if (span.max >= min) return body;
    if (span.openStart || span.openEnd) {
      this.base('char');
      const pad = `char${repeat(min - span.max, max === Infinity ? Infinity : max - span.min)}`;
      return span.openEnd ? `${body} ${pad}` : `${pad} ${body}`;
    }
    // Only the grammar's cap on repetitions falls short of minLength, not the pattern: left to the check.
    if (span.matchMax >= min) return body;
    if (span.anchoredStart && span.anchoredEnd)
      throw new Unsatisfiable(
        `the pattern at '${where}' matches only strings of at most ${span.matchMax} character${span.matchMax === 1 ? '' : 's'}, below its minLength ${min}`,
      );
    return body;
  }

  private arrayRule(s: Schema, path: string, base: string): string {
    const modern = this.draft === '2020-12';
    const items = s['items'];
    const prefix: unknown[] = modern
      ? Array.isArray(s['prefixItems'])
        ? (s['prefixItems'] as unknown[])
        : []
      : Array.isArray(items)
        ? items
        : Array.isArray(s['prefixItems'])
          ? (s['prefixItems'] as unknown[])
          : [];
    let rest: unknown = modern ? items : Array.isArray(items) ? s['additionalItems'] : Array.isArray(s['prefixItems']) ? items : items;
    // Items past the tuple are forbidden outright (an item `contains` matches is one of them); an
    // unevaluatedItems schema applies only to items nothing else evaluated, and `contains` evaluates
    // the items it matches (2019-09 on, and Ajv): they need not satisfy it.
    const noMoreItems = rest === false;
    const unevaluated = rest === undefined && s['unevaluatedItems'] !== undefined;
    if (unevaluated) rest = s['unevaluatedItems'];
    if (Array.isArray(rest)) rest = undefined;
    const min = num(s['minItems']) ?? 0;
    let max = num(s['maxItems']) ?? Infinity;
    if (min > max) throw new Unsatisfiable(`minItems is above maxItems at '${path || '/'}'`);
    // How many items `contains` asks for: minContains and maxContains are keywords from 2019-09 on
    // (earlier drafts' validators ignore them, and so does the grammar).
    // `contains: true` asks for an item all the same (any item). (Draft-04 has no `contains`, but its
    // validator, Ajv's, applies it: so does the grammar.)
    const contains = s['contains'] === true ? {} : s['contains'];
    const containsAsked = contains !== undefined;
    const counted = this.draft === '2019-09' || this.draft === '2020-12';
    const minContains = !containsAsked ? 0 : counted ? (num(s['minContains']) ?? 1) : 1;
    const maxContains = containsAsked && counted ? num(s['maxContains']) : undefined;
    // (After a tuple, left to the check: Ajv, the validator, passes `[]` for some such schemas.)
    if (prefix.length === 0 && minContains > max)
      throw new Unsatisfiable(`contains needs ${minContains} items where maxItems allows ${max} at '${path || '/'}'`);
    if (prefix.length === 0 && minContains > 0 && noMoreItems)
      throw new Unsatisfiable(`contains needs ${minContains} items where items allows none at '${path || '/'}'`);
    // Items after those `contains` matched, under unevaluatedItems: either kind. (With minContains 0
    // Ajv skips `contains`, and marks nothing evaluated.)
    if (unevaluated && minContains > 0 && rest !== true) {
      rest = rest === false ? contains : isSchema(rest) && isSchema(contains) ? { anyOf: [rest, contains] } : rest;
      // Ajv marks nothing evaluated for a `contains` every item satisfies: checked, not trusted.
      if (isSchema(contains) && Object.keys(contains).length === 0) this.check('contains', path);
    }
    // uniqueItems: one item cannot repeat; more are left to the check. More items than the items
    // have values can never be found (three unique booleans): refused here, not after sampling.
    if (s['uniqueItems'] === true) {
      const values = prefix.length === 0 ? valuesAtMost(rest) : undefined;
      if (values !== undefined && min > values)
        throw new Unsatisfiable(`uniqueItems at '${path || '/'}' asks for ${min} different items of at most ${values} values`);
      if (Math.max(min, minContains) <= 1 && prefix.length <= 1) max = Math.min(max, 1);
      else this.check('uniqueItems', path);
    }
    let first: string | undefined;
    let containing = 0;
    if (containsAsked) {
      // maxContains holds by itself where the array cannot be longer.
      if (prefix.length === 0 && minContains > 0 && (maxContains === undefined || max <= maxContains)) {
        // The first minContains items satisfy `contains` (and `items`).
        first = this.visit(
          unevaluated || rest === undefined || rest === true
            ? contains
            : isSchema(rest) && isSchema(contains)
              ? { allOf: [rest, contains] }
              : contains,
          `${path}/contains`,
          base,
        );
        containing = minContains;
      } else if (minContains > 0 || maxContains !== undefined) this.check('contains', path);
    }
    if (max === 0) return this.rule('empty-array', '"[" "]"');
    // Items in order: the tuple (cut where an item is impossible), then repetitions of the rest.
    const slots: string[] = [];
    for (let i = 0; i < Math.min(prefix.length, max); i++) {
      try {
        slots.push(this.visit(prefix[i], `${path}/prefixItems/${i}`, base));
      } catch (err) {
        if (!(err instanceof Unsatisfiable) || i < min) throw err;
        max = i;
        break;
      }
    }
    let restRule: string | undefined;
    if (slots.length === prefix.length && rest !== false && max > slots.length) {
      try {
        // After a tuple, unconstrained extra items are allowed but never needed.
        const open = rest === undefined || rest === true;
        if (!(prefix.length > 0 && open && min <= prefix.length)) restRule = this.visit(rest ?? true, `${path}/items`, base);
      } catch (err) {
        if (!(err instanceof Unsatisfiable)) throw err;
      }
    }
    const fixedCount = first !== undefined ? containing : slots.length;
    const restMin = Math.max(0, min - fixedCount);
    const restMax = max === Infinity ? Infinity : max - fixedCount;
    if (!restRule && restMin > 0) throw new Unsatisfiable(`minItems at '${path || '/'}' asks for more items than the schema allows`);
    if (first !== undefined) {
      const tail = restRule && restMax > 0 ? ` ( "," ${restRule} )${repeat(restMin, restMax)}` : '';
      const more = containing > 1 ? ` ( "," ${first} )${repeat(containing - 1, containing - 1)}` : '';
      return this.rule(`${path}-array`, `"[" ${first}${more}${tail} "]"`);
    }
    if (slots.length === 0) {
      if (!restRule || restMax <= 0) return this.rule('empty-array', '"[" "]"');
      const body = restMin === 0 ? `( ${commaList(restRule, 1, restMax)} )?` : commaList(restRule, restMin, restMax);
      return this.rule(`${path}-array`, `"[" ${body} "]"`);
    }
    const tail = restRule && restMax > 0 ? `( "," ${restRule} )${repeat(restMin, restMax)}` : '';
    // Nest optional items: "[" A ( "," B ( "," C tail )? )? "]"
    let body = tail;
    for (let i = slots.length - 1; i >= 0; i--) {
      const sep = i === 0 ? '' : '"," ';
      const inner = `${sep}${slots[i]!}${body ? ` ${body}` : ''}`;
      body = i < min ? inner : `( ${inner} )?`;
    }
    return this.rule(`${path}-array`, `"[" ${body} "]"`);
  }

  /** Whether a property name satisfies `propertyNames` (undefined: cannot tell here, the check will). */
  private nameAllowed(name: string, rule: unknown): boolean | undefined {
    if (rule === undefined || rule === true) return true;
    if (rule === false) return false;
    if (!isSchema(rule)) return undefined;
    for (const k of Object.keys(rule)) {
      if (!CONSTRAINTS.has(k) || k === 'type') continue;
      const v = rule[k];
      if (k === 'pattern' && typeof v === 'string') {
        if (!patternMatches(v, name, this.unicode)) return false;
      } else if (k === 'maxLength' && typeof v === 'number') {
        if ([...name].length > v) return false;
      } else if (k === 'minLength' && typeof v === 'number') {
        if ([...name].length < v) return false;
      } else if (k === 'enum' && Array.isArray(v)) {
        if (!v.includes(name)) return false;
      } else if (k === 'const') {
        if (v !== name) return false;
      } else return undefined;
    }
    return true;
  }

  private objectRule(s: Schema, path: string, base: string): string {
    const properties: Schema = isSchema(s['properties']) ? { ...s['properties'] } : {};
    const required = new Set(Array.isArray(s['required']) ? (s['required'] as unknown[]).map(String) : []);
    let additional = s['additionalProperties'];
    if (additional === undefined && s['unevaluatedProperties'] !== undefined) additional = s['unevaluatedProperties'];
    const patterns = isSchema(s['patternProperties']) ? Object.entries(s['patternProperties']) : [];
    const names = s['propertyNames'];
    const minProps = num(s['minProperties']) ?? 0;
    const maxProps = num(s['maxProperties']) ?? Infinity;
    if (minProps > maxProps) throw new Unsatisfiable(`minProperties is above maxProperties at '${path || '/'}'`);

    // Dependencies: a present property requires others (or a schema). Required ones pull theirs in;
    // an optional one whose dependencies are not all required is left out (a subset).
    const deps = new Map<string, unknown>();
    for (const k of ['dependencies', 'dependentRequired', 'dependentSchemas']) {
      const v = s[k];
      if (isSchema(v)) for (const [name, d] of Object.entries(v)) deps.set(name, deps.has(name) ? { allOf: [deps.get(name), d] } : d);
    }
    const dropped = new Set<string>();
    for (let changed = true; changed;) {
      changed = false;
      for (const [name, d] of deps) {
        const needs = dependencyNeeds(d);
        const schemaDep =
          !Array.isArray(d) && d !== true && !(isSchema(d) && Object.keys(d).every((k) => k === 'required' || !CONSTRAINTS.has(k)));
        if (required.has(name)) {
          for (const n of needs)
            if (!required.has(n)) {
              required.add(n);
              changed = true;
            }
          if (schemaDep) this.check('dependentSchemas', path);
        } else if (!dropped.has(name) && (schemaDep || needs.some((n) => !required.has(n)))) {
          dropped.add(name);
        }
      }
    }

    // A property whose schema is false (or dropped, or a name propertyNames forbids) may not appear.
    for (const name of Object.keys(properties)) {
      let allowed = properties[name] !== false && !dropped.has(name);
      const byName = this.nameAllowed(name, names);
      if (byName === false) allowed = false;
      if (byName === undefined) this.check('propertyNames', path);
      if (allowed) {
        // A declared property whose name matches a pattern must satisfy that pattern's schema too.
        const extra = patterns.filter(([p]) => patternMatches(p, name, this.unicode)).map(([, v]) => v);
        if (extra.length > 0) properties[name] = { allOf: [properties[name], ...extra] };
        continue;
      }
      if (required.has(name)) throw new Unsatisfiable(`required property '${name}' at '${path || '/'}' cannot be present`);
      delete properties[name];
    }
    for (const name of required) {
      if (name in properties) continue;
      const byName = this.nameAllowed(name, names);
      if (byName === false || dropped.has(name))
        throw new Unsatisfiable(`required property '${name}' at '${path || '/'}' cannot be present`);
      if (byName === undefined) this.check('propertyNames', path);
      const matching = patterns.filter(([p]) => patternMatches(p, name, this.unicode)).map(([, v]) => v);
      if (matching.length > 0) properties[name] = matching.length === 1 ? matching[0] : { allOf: matching };
      else if (additional === false) throw new Unsatisfiable(`required property '${name}' at '${path || '/'}' is not allowed`);
      else properties[name] = additional ?? true;
    }

    const declared = Object.keys(properties);
    // Keys made up in a map could happen to be a name that had to stay out.
    if (
      declared.length === 0 &&
      isSchema(s['properties']) &&
      Object.keys(s['properties']).length > 0 &&
      (additional !== false || patterns.length > 0)
    )
      this.check('properties', path);
    const reserved = reservedNames(s, required, deps, minProps);
    if (declared.length === 0) return this.mapRule(s, path, base, additional, patterns, names, minProps, maxProps, reserved);

    if (required.size > maxProps) throw new Unsatisfiable(`maxProperties at '${path || '/'}' is below the required properties`);
    // More properties than are declared: every declared one, then other ones under names of their
    // own where any name may be (else the check judges).
    if (minProps > declared.length && additional === false && patterns.length === 0) {
      // Counting those left out for their dependencies, which may yet be present together where
      // their dependencies may be.
      const possible = possibleProperties(s, deps).size;
      if (possible < minProps)
        throw new Unsatisfiable(
          `the object at '${path || '/'}' may have ${possible} propert${possible === 1 ? 'y' : 'ies'} at most but needs ${minProps}`,
        );
    }
    const optional = declared.filter((n) => !required.has(n));
    // minProperties: the first optional properties become required; maxProperties: the last ones go.
    const promoted = optional.slice(0, Math.max(0, minProps - required.size));
    const mustHave = [...declared.filter((n) => required.has(n)), ...promoted];
    const mayHave = optional.slice(promoted.length, Math.max(promoted.length, maxProps - required.size));
    const kv = (name: string): string =>
      this.rule(
        `${path}-${name}-kv`,
        `${gbnfLiteral(JSON.stringify(name))} ":" ${this.visit(properties[name], `${path}/properties/${name}`, base)}`,
      );
    const req: string[] = mustHave.map(kv);
    const opt: string[] = [];
    for (const name of mayHave) {
      try {
        opt.push(kv(name));
      } catch (err) {
        if (!(err instanceof Unsatisfiable)) throw err;
      }
    }
    // Optional properties in order, each one at most once: T_i ::= ( "," kv_i )? T_{i+1}.
    const tails: string[] = [];
    for (let i = opt.length - 1; i >= 0; i--) {
      const next = tails[i + 1];
      tails[i] = this.rule(`${path}-tail`, `( "," ${opt[i]!} )?${next ? ` ${next}` : ''}`);
    }
    // Where no property was left out for its dependencies, the others are the only way to more:
    // a value schema they cannot meet makes the object unsatisfiable (the visit throws).
    const named = minProps > declared.length && reserved !== undefined && additional !== false && dropped.size === 0;
    if (named)
      req.push(
        ...this.namedPairs(minProps - declared.length, reserved, this.visit(additional ?? true, `${path}/additionalProperties`, base)),
      );
    else if (minProps > declared.length) {
      this.check('minProperties', path);
      // The rest by the first patternProperties pattern the grammar can write (their keys could
      // repeat, or be a declared name: the check judges, and the closing bias keeps keys apart).
      const [pattern, schema] = patterns[0] ?? [];
      const body = pattern !== undefined && dropped.size === 0 ? this.keyPattern(pattern) : undefined;
      if (pattern !== undefined && body !== undefined && req.length === declared.length) {
        if (patterns.length > 1) this.check('patternProperties', path);
        const pair = this.rule(
          `${path}-pattern-pair`,
          `${this.patternKey(pattern, body, path)} ":" ${this.visit(schema, `${path}/patternProperties`, base)}`,
        );
        for (let i = declared.length; i < minProps; i++) req.push(pair);
      }
    }
    let body: string;
    if (req.length > 0) {
      body = `${req.join(' "," ')}${tails[0] ? ` ${tails[0]}` : ''}`;
    } else if (opt.length === 0) {
      body = '';
    } else {
      // No required property: the first one present starts the list, S ::= kv_i T_{i+1} | … | empty.
      const alts = opt.map((o, i) => `${o}${tails[i + 1] ? ` ${tails[i + 1]}` : ''}`);
      body = `( ${this.rule(`${path}-first`, alts.join(' | '))} )?`;
    }
    return this.rule(`${path}-object`, `"{" ${body} "}"`);
  }

  /** A key pattern's grammar: element by element, or as its automaton. */
  private keyPattern(pattern: string): string | undefined {
    const made = patternToGbnf(pattern, PATTERN_OPEN_REPEAT, this.unicode) ?? this.automatonGrammar(pattern);
    return typeof made === 'string' ? made : made !== undefined && 'body' in made ? made.body : undefined;
  }

  /**
   * The grammar of a key written by a patternProperties pattern. A pattern open at an end (`^k`)
   * leaves text there free: keys can then differ (the closing bias keeps them apart), where the
   * match alone would be the one key `k`, repeated.
   */
  private patternKey(pattern: string, body: string, path: string): string {
    const span = patternSpan(pattern, Infinity, this.unicode);
    const free = span?.openEnd || span?.openStart ? this.base('char') : '';
    const padded = span?.openEnd ? `${body} ${free}*` : span?.openStart ? `${free}* ${body}` : body;
    return this.rule(`${path}-key`, `"\\"" ${padded} "\\""`);
  }

  /**
   * `n` members under names of their own (`key1`, `key2`, …, skipping `taken`), each with a value of
   * the grammar `v`: what a minProperties needs beyond the declared properties, which free keys could not
   * give (a model writes the same key twice, and JSON counts it once).
   */
  private namedPairs(n: number, taken: ReadonlySet<string>, v: string): string[] {
    const out: string[] = [];
    for (let i = 1; out.length < n; i++) {
      const name = `key${i}`;
      if (!taken.has(name)) out.push(`${gbnfLiteral(JSON.stringify(name))} ":" ${v}`);
    }
    return out;
  }

  /** An object with no declared properties: keys by patternProperties or propertyNames, values by their schema. */
  private mapRule(
    s: Schema,
    path: string,
    base: string,
    additional: unknown,
    patterns: Array<[string, unknown]>,
    names: unknown,
    minProps: number,
    maxProps: number,
    reserved: ReadonlySet<string> | undefined,
  ): string {
    let key: string | undefined;
    let value: unknown;
    if (patterns.length > 0) {
      const [pattern, schema] = patterns[0]!;
      const body = this.keyPattern(pattern);
      // A key that also matches another pattern must satisfy that one's schema as well.
      if (patterns.length > 1) this.check('patternProperties', path);
      if (body !== undefined) {
        key = this.patternKey(pattern, body, path);
        value = schema;
      } else {
        this.check('patternProperties', path);
        value = additional === false || additional === undefined ? schema : additional;
      }
    } else {
      if (additional === false) {
        if (minProps > 0) throw new Unsatisfiable(`the object at '${path || '/'}' may have no properties but needs ${minProps}`);
        return this.rule('empty-object', '"{" "}"');
      }
      value = additional ?? true;
    }
    // A few names only (propertyNames `const` or `enum`): each is a property of its own, at most
    // once, as declared ones are (a map's keys would be free to repeat the one name allowed).
    const few = isSchema(names)
      ? Array.isArray(names['enum'])
        ? names['enum']
        : 'const' in names
          ? [names['const']]
          : undefined
      : undefined;
    if (key === undefined && few !== undefined && few.every((n) => typeof n === 'string') && few.length <= MAX_NAMED_KEYS) {
      const only: Schema = { ...s, properties: Object.fromEntries(few.map((n) => [n, value])), additionalProperties: false };
      delete only['propertyNames'];
      delete only['unevaluatedProperties'];
      return this.objectRule(only, path, base);
    }
    if (names !== undefined && names !== true) {
      if (key !== undefined) this.check('propertyNames', path);
      else {
        const n = isSchema(names) ? { ...names, type: 'string' } : names;
        key = this.visit(n, `${path}/propertyNames`, base);
      }
    }
    key ??= this.base('string');
    if (maxProps === 0) return this.rule('empty-object', '"{" "}"');
    // The same key twice would count once. Where any name may be, the entries minProperties needs
    // have names of their own; where keys must fit a pattern or propertyNames, the check judges.
    if (minProps > 1 && reserved !== undefined && patterns.length === 0) {
      const v = this.visit(value, `${path}/additionalProperties`, base);
      const needed = this.namedPairs(minProps, reserved, v);
      const more = maxProps - minProps;
      const pairRule = more > 0 ? this.rule(`${path}-pair`, `${key} ":" ${v}`) : '';
      const rest = more > 0 ? ` ( "," ${pairRule} )${repeat(0, more)}` : '';
      return this.rule(`${path}-object`, `"{" ${needed.join(' "," ')}${rest} "}"`);
    }
    if (minProps > 1) this.check('minProperties', path);
    let pair: string;
    try {
      pair = this.rule(`${path}-pair`, `${key} ":" ${this.visit(value, `${path}/additionalProperties`, base)}`);
    } catch (err) {
      if (!(err instanceof Unsatisfiable) || minProps > 0) throw err;
      return this.rule('empty-object', '"{" "}"');
    }
    const body = minProps === 0 ? `( ${commaList(pair, 1, maxProps)} )?` : commaList(pair, minProps, maxProps);
    return this.rule(`${path}-object`, `"{" ${body} "}"`);
  }
}

/** The grammar for values of `schema` (read as `draft`); throws SchemaCompileError when no grammar can be made. */
export function schemaToGbnf(schema: unknown, draft: Draft = '07', unicode?: boolean): CompiledGrammar {
  return new Compiler(schema, draft, unicode).compile();
}

/** Any JSON object (`json_object`). */
export function anyObjectGbnf(): string {
  return new Compiler({ type: 'object' }, '07', true).compile().gbnf;
}

/** The properties a dependency (`dependentRequired`'s list, or a schema's `required`) needs present. */
function dependencyNeeds(d: unknown): string[] {
  const needs = Array.isArray(d) ? d : isSchema(d) && Array.isArray(d['required']) ? (d['required'] as unknown[]) : [];
  return needs.map(String);
}

/**
 * The declared properties that may be present: not `false`, and (to a fixed point) with every
 * property they depend on possible too.
 */
function possibleProperties(s: Schema, deps: ReadonlyMap<string, unknown>): Set<string> {
  const props = isSchema(s['properties']) ? s['properties'] : {};
  const possible = new Set(Object.keys(props).filter((n) => props[n] !== false));
  for (let changed = true; changed;) {
    changed = false;
    for (const name of possible) {
      if (dependencyNeeds(deps.get(name)).some((n) => !possible.has(n))) {
        possible.delete(name);
        changed = true;
      }
    }
  }
  return possible;
}

/**
 * The names members an object needs beyond its declared properties may not take (every name the
 * schema says anything about: properties, even forbidden or left out, required ones, and
 * dependencies either way); undefined where they cannot have names of their own at all: keys must
 * fit patternProperties or propertyNames, a `not` or `if` could rule a name out, or more are
 * needed than MAX_NAMED_KEYS.
 */
function reservedNames(
  s: Schema,
  required: ReadonlySet<string>,
  deps: ReadonlyMap<string, unknown>,
  minProps: number,
): Set<string> | undefined {
  const names = s['propertyNames'];
  if (minProps > MAX_NAMED_KEYS || isSchema(s['patternProperties']) || (names !== undefined && names !== true)) return undefined;
  if (s['not'] !== undefined || s['if'] !== undefined) return undefined;
  const out = new Set<string>([...Object.keys(isSchema(s['properties']) ? s['properties'] : {}), ...required]);
  for (const [name, d] of deps) {
    out.add(name);
    for (const n of dependencyNeeds(d)) out.add(n);
  }
  return out;
}

/** How many values a schema allows at most, where that is a small known number (enum, const, boolean, null). */
function valuesAtMost(schema: unknown): number | undefined {
  if (!isSchema(schema)) return undefined;
  if (Array.isArray(schema['enum'])) return new Set(schema['enum'].map((v) => JSON.stringify(v))).size;
  if ('const' in schema) return 1;
  if (schema['type'] === 'boolean') return 2;
  if (schema['type'] === 'null') return 1;
  return undefined;
}
