import { Ajv, type ValidateFunction } from 'ajv';
import { LlamaGrammar, type Llama } from 'node-llama-cpp';
import { ApiError } from '../../http/errors.js';

/**
 * JSON schema → llama.cpp grammar, for decoding that cannot produce invalid JSON. node-llama-cpp's
 * grammar generator understands a subset of JSON Schema; anything outside it is refused with a 400
 * naming the feature, because silently dropping a constraint would break the guarantee.
 */
const STRUCTURAL = new Set([
  'type', 'const', 'enum', 'oneOf', 'anyOf', 'properties', 'additionalProperties', 'required', 'minProperties', 'maxProperties',
  'items', 'prefixItems', 'minItems', 'maxItems', 'minLength', 'maxLength', 'format', '$defs', '$ref',
]);
/** Keywords that only describe and constrain nothing. */
const ANNOTATIONS = new Set(['description', 'title', 'default', 'examples', '$schema', '$id', '$comment', 'deprecated', 'readOnly', 'writeOnly', 'strict', 'nullable']);
const FORMATS = new Set(['date-time', 'time', 'date']);

type Schema = Record<string, unknown>;

/** Rewrites what has an exact equivalent (anyOf → oneOf, definitions → $defs) and refuses the rest. */
export function toGrammarSchema(schema: unknown, param: string, path = ''): Schema {
  if (schema === true || schema === undefined) return {};
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
    throw new ApiError('unsupported_schema', `The schema at '${path || '/'}' must be an object.`, { param });
  }
  const out: Schema = {};
  for (const [k, v] of Object.entries(schema as Schema)) {
    const at = `${path}/${k}`;
    const key = k === 'anyOf' ? 'oneOf' : k === 'definitions' ? '$defs' : k;
    if (ANNOTATIONS.has(key)) {
      if (key === 'description') out[key] = v;
      continue;
    }
    if (!STRUCTURAL.has(key)) {
      throw new ApiError('unsupported_schema', `JSON schema keyword '${k}' (at '${at}') cannot be enforced by the local engine's grammar; remove it or use another model.`, { param });
    }
    switch (key) {
      case 'properties':
      case '$defs':
        out[key] = Object.fromEntries(Object.entries(v as Schema).map(([name, sub]) => [name, toGrammarSchema(sub, param, `${at}/${name}`)]));
        break;
      case 'oneOf':
      case 'prefixItems':
        out[key] = (v as unknown[]).map((sub, i) => toGrammarSchema(sub, param, `${at}/${i}`));
        break;
      case 'items':
        out[key] = toGrammarSchema(v, param, at);
        break;
      case 'additionalProperties':
        out[key] = typeof v === 'boolean' ? v : toGrammarSchema(v, param, at);
        break;
      case 'format':
        if (!FORMATS.has(String(v))) {
          throw new ApiError('unsupported_schema', `String format '${String(v)}' (at '${at}') cannot be enforced by the local engine's grammar.`, { param });
        }
        out[key] = v;
        break;
      case '$ref': {
        const ref = String(v).replace('#/definitions/', '#/$defs/');
        if (!ref.startsWith('#/$defs/')) throw new ApiError('unsupported_schema', `Only local '#/$defs/…' references are supported (at '${at}').`, { param });
        out[key] = ref;
        break;
      }
      default:
        out[key] = v;
    }
  }
  // An object without declared properties is any object.
  if (out['type'] === 'object' && out['properties'] === undefined && out['additionalProperties'] === undefined) out['additionalProperties'] = true;
  return out;
}

/**
 * Two corrections to node-llama-cpp's generated GBNF:
 * - its root ends with forced newlines and then any number more, which a small model fills until the
 *   context runs out; without them the grammar is complete at the closing brace, and llama.cpp then
 *   allows only the end-of-sequence token;
 * - its integers accept an exponent, so `-30e-2` (not an integer) could be produced.
 */
export function adjustGrammar(gbnf: string): string {
  return gbnf
    .replace(/^(root ::= .*?) "(\\n)+" \[\\n\]\*$/m, '$1')
    .replace(/^integer-number-rule ::= .*$/m, 'integer-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15})');
}

export interface CompiledSchema {
  grammar: LlamaGrammar;
  validate: ValidateFunction;
}

/** Grammars and validators are compiled once per distinct schema and reused. */
export class SchemaGrammars {
  private readonly cache = new Map<string, Promise<CompiledSchema>>();
  private readonly ajv = new Ajv({ strict: false, allErrors: false });
  private json: Promise<LlamaGrammar> | undefined;

  constructor(private readonly llama: () => Promise<Llama>) {}

  /** The generic JSON grammar, for `json_object`. */
  anyJson(): Promise<LlamaGrammar> {
    this.json ??= this.llama().then((l) => l.getGrammarFor('json'));
    return this.json;
  }

  forSchema(schema: Record<string, unknown>, param: string): Promise<CompiledSchema> {
    const grammarSchema = toGrammarSchema(schema, param);
    const key = JSON.stringify(schema);
    let hit = this.cache.get(key);
    if (!hit) {
      let validate: ValidateFunction;
      try {
        validate = this.ajv.compile(schema);
      } catch (err) {
        throw new ApiError('invalid_value', `The JSON schema is invalid: ${(err as Error).message}`, { param });
      }
      hit = this.llama().then(async (l) => {
        const generated = await l.createGrammarForJsonSchema(grammarSchema as Parameters<Llama['createGrammarForJsonSchema']>[0]);
        return { grammar: new LlamaGrammar(l, { grammar: adjustGrammar(generated.grammar) }), validate };
      });
      hit.catch(() => this.cache.delete(key));
      if (this.cache.size > 256) this.cache.delete(this.cache.keys().next().value!);
      this.cache.set(key, hit);
    }
    return hit;
  }
}
