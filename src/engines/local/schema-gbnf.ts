/**
 * JSON schema → GBNF (llama.cpp's grammar format), so that a local model can only write JSON the
 * schema accepts. Pure and synchronous; it runs in a worker thread (schema-worker.ts), never on the
 * request path's event loop. What it cannot enforce exactly it refuses with a SchemaCompileError
 * naming the keyword: silently dropping a constraint would break the guarantee that an accepted
 * request never returns a document the schema rejects.
 *
 * The output is compact JSON (no whitespace), which costs a model the fewest tokens and leaves it
 * no room to wander. Properties come in declared order, required ones first.
 */

export class SchemaCompileError extends Error {}

type Schema = Record<string, unknown>;

/** Keywords that only describe: ignored, as JSON Schema says unknown keywords are. */
const UNSUPPORTED = new Set([
  'pattern',
  'patternProperties',
  'propertyNames',
  'minimum',
  'maximum',
  'exclusiveMinimum',
  'exclusiveMaximum',
  'multipleOf',
  'not',
  'if',
  'then',
  'else',
  'uniqueItems',
  'contains',
  'minContains',
  'maxContains',
  'dependencies',
  'dependentRequired',
  'dependentSchemas',
  'unevaluatedProperties',
  'unevaluatedItems',
  '$dynamicRef',
  '$recursiveRef',
]);
const TYPES = ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object'] as const;
type JsonType = (typeof TYPES)[number];

const HEX = '[0-9a-fA-F]';
/** Fixed rules every grammar may use. A `\u` escape never encodes a surrogate (it would count as two characters). */
const BASE_RULES: Record<string, string> = {
  null: '"null"',
  boolean: '"true" | "false"',
  integer: '"-"? ("0" | [1-9] [0-9]{0,15})',
  number: '"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?',
  char: `[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt] | "\\\\u" ([0-9a-cA-CefEF] ${HEX}{3} | [dD] [0-7] ${HEX}{2})`,
  string: '"\\"" char* "\\""',
  value: 'object-value | array-value | string | number | boolean | null',
  'object-value': '"{" ( string ":" value ( "," string ":" value )* )? "}"',
  'array-value': '"[" ( value ( "," value )* )? "]"',
  // Days 29–31 only in months that have them; 29 February is left out (it needs the year).
  date: '"\\"" date-body "\\""',
  'date-body':
    '[0-9]{4} "-" ( ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) | ( "0" [13-9] | "1" [0-2] ) "-" ( "29" | "30" ) | ( "0" [13578] | "1" [02] ) "-31" )',
  time: '"\\"" time-body "\\""',
  'time-body':
    '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
  'date-time': '"\\"" date-body "T" time-body "\\""',
};
const FORMATS = new Set(['date', 'time', 'date-time']);

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
const repeat = (min: number, max: number): string =>
  max === Infinity ? (min === 0 ? '*' : min === 1 ? '+' : `{${min},}`) : `{${min},${max}}`;

/** `rule ( "," rule )…`: between min and max elements (min ≥ 1). */
function commaList(rule: string, min: number, max: number): string {
  if (max === 1) return rule;
  return `${rule} ( "," ${rule} )${repeat(min - 1, max - 1)}`;
}

/**
 * Merges schemas that must all hold (`allOf`, and a schema's own keywords with each `anyOf`/`oneOf`
 * branch). Only merges that keep the meaning exactly are made; anything else is refused.
 */
function merge(a: Schema, b: Schema, path: string): Schema {
  const out: Schema = { ...a };
  for (const [k, v] of Object.entries(b)) {
    if (!(k in out)) {
      out[k] = v;
      continue;
    }
    const prev = out[k];
    if (JSON.stringify(prev) === JSON.stringify(v)) continue;
    switch (k) {
      case 'properties': {
        const props: Schema = { ...(prev as Schema) };
        for (const [name, sub] of Object.entries(v as Schema)) {
          props[name] = name in props ? { allOf: [props[name], sub] } : sub;
        }
        out[k] = props;
        break;
      }
      case 'required':
        out[k] = [...new Set([...(prev as string[]), ...(v as string[])])];
        break;
      case 'type': {
        const left = Array.isArray(prev) ? prev : [prev];
        const right = Array.isArray(v) ? v : [v];
        const both = left
          .filter((t) => right.includes(t) || (t === 'integer' && right.includes('number')))
          .concat(right.filter((t) => t === 'integer' && left.includes('number')));
        if (both.length === 0) throw new SchemaCompileError(`allOf at '${path}' requires incompatible types`);
        out[k] = [...new Set(both)];
        break;
      }
      case 'minItems':
      case 'minLength':
      case 'minProperties':
        out[k] = Math.max(Number(prev), Number(v));
        break;
      case 'maxItems':
      case 'maxLength':
      case 'maxProperties':
        out[k] = Math.min(Number(prev), Number(v));
        break;
      case 'description':
      case 'title':
      case 'default':
      case 'examples':
      case '$comment':
      case '$schema':
      case '$id':
      case 'id':
        break;
      case 'additionalProperties':
        if (prev === false || v === false) out[k] = false;
        else if (prev === true) out[k] = v;
        else if (v !== true) out[k] = { allOf: [prev, v] };
        break;
      default:
        throw new SchemaCompileError(
          `'${k}' appears in several parts of an allOf at '${path}' with different values, which the grammar cannot combine`,
        );
    }
  }
  return out;
}

class Compiler {
  private readonly rules = new Map<string, string>();
  private readonly byBody = new Map<string, string>();
  private readonly refs = new Map<string, string>();
  private readonly used = new Set<string>();
  private counter = 0;

  constructor(private readonly root: unknown) {}

  /** A rule with this body (an existing one when the same body was made before). */
  private rule(hint: string, body: string): string {
    const known = this.byBody.get(body);
    if (known) return known;
    const name = `${
      hint
        .replace(/[^a-zA-Z0-9-]+/g, '-')
        .replace(/^-+|-+$/g, '')
        .toLowerCase()
        .slice(0, 40) || 'r'
    }-${this.counter++}`;
    this.rules.set(name, body);
    this.byBody.set(body, name);
    return name;
  }

  private base(name: string): string {
    this.used.add(name);
    return name;
  }

  private literal(value: unknown): string {
    return gbnfLiteral(JSON.stringify(value));
  }

  private resolve(ref: string, path: string): unknown {
    if (ref === '#') return this.root;
    if (!ref.startsWith('#/'))
      throw new SchemaCompileError(`only references inside the schema ('#/…') are supported (at '${path}': '${ref}')`);
    let cur: unknown = this.root;
    for (const raw of ref.slice(2).split('/')) {
      const part = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~');
      if (!isSchema(cur) && !Array.isArray(cur)) throw new SchemaCompileError(`reference '${ref}' (at '${path}') points nowhere`);
      cur = (cur as Record<string, unknown>)[part];
      if (cur === undefined) throw new SchemaCompileError(`reference '${ref}' (at '${path}') points nowhere`);
    }
    return cur;
  }

  compile(): string {
    const top = this.visit(this.root, '');
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
    return `${lines.join('\n')}\n`;
  }

  /** A rule name (or inline expression) matching exactly the JSON values `schema` accepts, or a subset of them. */
  private visit(schema: unknown, path: string): string {
    if (schema === true || (isSchema(schema) && Object.keys(schema).length === 0)) return this.base('value');
    if (schema === false) throw new SchemaCompileError(`the schema at '${path || '/'}' accepts nothing`);
    if (!isSchema(schema)) throw new SchemaCompileError(`the schema at '${path || '/'}' must be an object`);
    for (const k of Object.keys(schema)) {
      if (UNSUPPORTED.has(k))
        throw new SchemaCompileError(`JSON schema keyword '${k}' (at '${path}/${k}') cannot be enforced by the local engine's grammar`);
    }
    const ref = schema['$ref'];
    if (typeof ref === 'string') {
      let name = this.refs.get(ref);
      if (!name) {
        // Reserved before the target is compiled, so a recursive schema refers to itself.
        name = `ref-${this.counter++}`;
        this.refs.set(ref, name);
        this.rules.set(name, '');
        this.rules.set(name, this.visit(this.resolve(ref, path), `${path}/$ref`));
      }
      return name;
    }
    if (Array.isArray(schema['allOf'])) {
      const { allOf, ...rest } = schema;
      return this.visit(
        (allOf as unknown[]).reduce<Schema>((acc, sub, i) => {
          const s = isSchema(sub) && typeof sub['$ref'] === 'string' ? this.resolve(sub['$ref'], `${path}/allOf/${i}`) : sub;
          if (s === true) return acc;
          if (!isSchema(s)) throw new SchemaCompileError(`allOf at '${path}' holds a schema that is not an object`);
          return merge(acc, s, `${path}/allOf/${i}`);
        }, rest),
        path,
      );
    }
    const branches = schema['anyOf'] ?? schema['oneOf'];
    if (Array.isArray(branches)) {
      const key = 'anyOf' in schema ? 'anyOf' : 'oneOf';
      if (key === 'oneOf') {
        // Alternatives that can match the same value would make a "one of" produce two; refuse unless
        // the branches are told apart by type or by a constant property (a discriminator).
        this.checkExclusive(branches, path);
      }
      const { [key]: _drop, ...rest } = schema;
      const own = Object.keys(rest).some(
        (k) => !['description', 'title', 'default', 'examples', '$comment', '$schema', '$id', 'id', '$defs', 'definitions'].includes(k),
      );
      const alts = branches.map((b, i) => {
        const target = isSchema(b) && typeof b['$ref'] === 'string' && own ? this.resolve(b['$ref'], `${path}/${key}/${i}`) : b;
        return this.visit(own && isSchema(target) ? merge(rest, target, `${path}/${key}/${i}`) : target, `${path}/${key}/${i}`);
      });
      return this.rule(`${path}-alt`, alts.join(' | '));
    }
    if ('const' in schema) return this.rule(`${path}-const`, this.literal(schema['const']));
    const types = this.types(schema, path);
    if (Array.isArray(schema['enum'])) {
      const values = (schema['enum'] as unknown[]).filter((v) => types === undefined || types.some((t) => matchesType(v, t)));
      if (values.length === 0) throw new SchemaCompileError(`the enum at '${path}' has no value of the schema's type`);
      return this.rule(`${path}-enum`, [...new Set(values.map((v) => this.literal(v)))].join(' | '));
    }
    const list = types ?? [inferType(schema)];
    if (list.includes(undefined)) return this.base('value');
    const alts = (list as JsonType[]).filter((t) => !(t === 'integer' && list.includes('number'))).map((t) => this.typed(schema, t, path));
    return alts.length === 1 ? alts[0]! : this.rule(`${path}-types`, alts.join(' | '));
  }

  private types(schema: Schema, path: string): JsonType[] | undefined {
    const t = schema['type'];
    if (t === undefined) return undefined;
    const list = Array.isArray(t) ? t : [t];
    for (const x of list) {
      if (!TYPES.includes(x as JsonType)) throw new SchemaCompileError(`unknown type '${String(x)}' at '${path}/type'`);
    }
    if (schema['nullable'] === true && !list.includes('null')) list.push('null');
    return list as JsonType[];
  }

  private checkExclusive(branches: unknown[], path: string): void {
    const resolved = branches.map((b, i) =>
      isSchema(b) && typeof b['$ref'] === 'string' ? this.resolve(b['$ref'], `${path}/oneOf/${i}`) : b,
    );
    const typeSets = resolved.map((b) => (isSchema(b) && typeof b['type'] === 'string' ? b['type'] : undefined));
    if (typeSets.every((t) => t !== undefined) && new Set(typeSets.map((t) => (t === 'integer' ? 'number' : t))).size === typeSets.length)
      return;
    // Every branch an object with a required property of the same name holding a different const.
    const objs = resolved.filter(isSchema);
    if (objs.length === resolved.length) {
      const first = objs[0];
      const props = first ? Object.entries((first['properties'] as Schema | undefined) ?? {}) : [];
      for (const [name] of props) {
        const consts = objs.map((o) => {
          const p = (o['properties'] as Schema | undefined)?.[name];
          const required = Array.isArray(o['required']) && (o['required'] as unknown[]).includes(name);
          return required && isSchema(p) && 'const' in p ? JSON.stringify(p['const']) : undefined;
        });
        if (consts.every((c) => c !== undefined) && new Set(consts).size === consts.length) return;
      }
    }
    if (
      resolved.every((b) => isSchema(b) && 'const' in b) &&
      new Set(resolved.map((b) => JSON.stringify((b as Schema)['const']))).size === resolved.length
    )
      return;
    throw new SchemaCompileError(
      `oneOf at '${path}' has branches that could match the same value; the grammar can enforce it only as anyOf (use anyOf, or tell the branches apart by type or a const property)`,
    );
  }

  private typed(schema: Schema, type: JsonType, path: string): string {
    switch (type) {
      case 'null':
      case 'boolean':
      case 'integer':
      case 'number':
        return this.base(type);
      case 'string':
        return this.stringRule(schema, path);
      case 'array':
        return this.arrayRule(schema, path);
      case 'object':
        return this.objectRule(schema, path);
    }
  }

  private stringRule(schema: Schema, path: string): string {
    const format = schema['format'];
    if (typeof format === 'string') {
      if (!FORMATS.has(format))
        throw new SchemaCompileError(`string format '${format}' (at '${path}/format') cannot be enforced by the local engine's grammar`);
      return this.base(format);
    }
    const min = typeof schema['minLength'] === 'number' ? schema['minLength'] : 0;
    const max = typeof schema['maxLength'] === 'number' ? schema['maxLength'] : Infinity;
    if (min > max) throw new SchemaCompileError(`minLength is above maxLength at '${path}'`);
    if (min === 0 && max === Infinity) return this.base('string');
    this.base('char');
    return this.rule(`${path}-string`, `"\\"" char${repeat(min, max)} "\\""`);
  }

  private arrayRule(schema: Schema, path: string): string {
    const items = schema['items'];
    const prefix: unknown[] = Array.isArray(schema['prefixItems'])
      ? (schema['prefixItems'] as unknown[])
      : Array.isArray(items)
        ? items
        : [];
    const rest: unknown = Array.isArray(items) ? schema['additionalItems'] : Array.isArray(schema['prefixItems']) ? items : items;
    const min = typeof schema['minItems'] === 'number' ? schema['minItems'] : 0;
    const max = typeof schema['maxItems'] === 'number' ? schema['maxItems'] : Infinity;
    if (min > max) throw new SchemaCompileError(`minItems is above maxItems at '${path}'`);
    if (max === 0) return this.rule('empty-array', '"[" "]"');
    const restAllowed = rest !== false;
    if (!restAllowed && min > prefix.length)
      throw new SchemaCompileError(`minItems at '${path}' asks for more items than the schema allows`);
    const restMin = Math.max(0, min - prefix.length);
    // After a tuple, unconstrained extra items are allowed but never needed: only as many as minItems asks for.
    const restOpen = rest === undefined || rest === true;
    const restMax = prefix.length > 0 && restOpen ? restMin : max === Infinity ? Infinity : max - prefix.length;
    const restRule = restAllowed && restMax > 0 ? this.visit(rest === undefined ? true : rest, `${path}/items`) : undefined;
    const slots = prefix.slice(0, max).map((p, i) => this.visit(p, `${path}/prefixItems/${i}`));
    // Elements in order: the prefix, then repetitions of the rest, each optional past minItems.
    const parts: Array<{ rule: string; required: boolean }> = slots.map((rule, i) => ({ rule, required: i < min }));
    let tail = '';
    if (restRule) {
      if (parts.length === 0) {
        const body = restMin === 0 ? `( ${commaList(restRule, 1, restMax)} )?` : commaList(restRule, restMin, restMax);
        return this.rule(`${path}-array`, `"[" ${body} "]"`);
      }
      tail = `( "," ${restRule} )${repeat(restMin, restMax)}`;
    }
    // Nest optional elements: "[" A ( "," B ( "," C tail )? )? "]"
    let body = tail;
    for (let i = parts.length - 1; i >= 0; i--) {
      const p = parts[i]!;
      const sep = i === 0 ? '' : '"," ';
      const inner = `${sep}${p.rule}${body ? ` ${body}` : ''}`;
      body = p.required ? inner : `( ${inner} )?`;
    }
    return this.rule(`${path}-array`, `"[" ${body} "]"`);
  }

  private objectRule(schema: Schema, path: string): string {
    const properties: Schema = isSchema(schema['properties']) ? { ...schema['properties'] } : {};
    const required = new Set(Array.isArray(schema['required']) ? (schema['required'] as unknown[]).map(String) : []);
    const additional = schema['additionalProperties'];
    const minProps = typeof schema['minProperties'] === 'number' ? schema['minProperties'] : 0;
    const maxProps = typeof schema['maxProperties'] === 'number' ? schema['maxProperties'] : Infinity;
    // A property whose schema is `false` may not appear: leave it out (unless it is required).
    for (const [name, sub] of Object.entries(properties)) {
      if (sub !== false) continue;
      if (required.has(name)) throw new SchemaCompileError(`required property '${name}' at '${path}' has the schema false`);
      delete properties[name];
    }
    const declared = Object.keys(properties);
    if (maxProps === 0) return this.rule('empty-object', '"{" "}"');
    for (const name of required) {
      if (!(name in properties)) {
        if (additional === false)
          throw new SchemaCompileError(`required property '${name}' at '${path}' is not allowed by additionalProperties: false`);
        properties[name] = additional === undefined || additional === true ? true : additional;
        declared.push(name);
      }
    }
    if (declared.length === 0) {
      // A map: arbitrary keys, values of additionalProperties (or anything), as many as min/maxProperties allow.
      if (additional === false) return this.rule('empty-object', '"{" "}"');
      const value = this.visit(additional === undefined ? true : additional, `${path}/additionalProperties`);
      const pair = this.rule(`${path}-pair`, `${this.base('string')} ":" ${value}`);
      const body = minProps === 0 ? `( ${commaList(pair, 1, maxProps)} )?` : commaList(pair, minProps, maxProps);
      return this.rule(`${path}-object`, `"{" ${body} "}"`);
    }
    const ordered = [...declared.filter((n) => required.has(n)), ...declared.filter((n) => !required.has(n))];
    if (required.size > maxProps) throw new SchemaCompileError(`maxProperties at '${path}' is below the number of required properties`);
    if (minProps > required.size)
      throw new SchemaCompileError(`minProperties at '${path}' is more than its required properties; the grammar cannot enforce it`);
    if (maxProps < ordered.length)
      throw new SchemaCompileError(`maxProperties at '${path}' is below the number of properties; the grammar cannot enforce it`);
    const kv = ordered.map((name) =>
      this.rule(
        `${path}-${name}-kv`,
        `${gbnfLiteral(JSON.stringify(name))} ":" ${this.visit(properties[name], `${path}/properties/${name}`)}`,
      ),
    );
    const req = kv.slice(0, required.size);
    const opt = kv.slice(required.size);
    let body: string;
    if (req.length > 0) {
      body = [req.join(' "," '), ...opt.map((o) => `( "," ${o} )?`)].join(' ');
    } else {
      // Any subset of the optional properties, in order: S_i ::= kv_i T_{i+1} | S_{i+1}, T_i ::= ("," kv_i)? T_{i+1}.
      let t = '';
      const tails: string[] = [];
      for (let i = opt.length - 1; i >= 0; i--) {
        tails[i] = t;
        t = `( "," ${opt[i]} )?${t ? ` ${t}` : ''}`;
      }
      const alts = opt.map((o, i) => `${o}${tails[i] ? ` ${tails[i]}` : ''}`);
      body = `( ${alts.join(' | ')} )?`;
    }
    return this.rule(`${path}-object`, `"{" ${body} "}"`);
  }
}

function inferType(schema: Schema): JsonType | undefined {
  if (
    'properties' in schema ||
    'required' in schema ||
    'additionalProperties' in schema ||
    'minProperties' in schema ||
    'maxProperties' in schema
  )
    return 'object';
  if ('items' in schema || 'prefixItems' in schema || 'minItems' in schema || 'maxItems' in schema) return 'array';
  if ('minLength' in schema || 'maxLength' in schema || 'format' in schema) return 'string';
  return undefined;
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

/** The grammar for values of `schema`; throws SchemaCompileError for what it cannot enforce. */
export function schemaToGbnf(schema: unknown): string {
  return new Compiler(schema).compile();
}

/** Any JSON object (`json_object`). */
export function anyObjectGbnf(): string {
  return new Compiler({ type: 'object' }).compile();
}
