/**
 * Validators for generated documents, by the JSON Schema draft the schema declares: draft-04
 * (ajv-draft-04), draft-06 and draft-07 (Ajv), 2019-09 and 2020-12 (Ajv2019, Ajv2020). A schema
 * without `$schema` is read as draft-07, the draft most schemas in the wild are written for. Formats
 * are checked (ajv-formats, full mode); a format no validator knows is an annotation, as the drafts
 * say, and so are unknown keywords.
 */
import { createRequire } from 'node:module';
import { Ajv, type Options, type ValidateFunction } from 'ajv';
import { Ajv2019 } from 'ajv/dist/2019.js';
import { Ajv2020 } from 'ajv/dist/2020.js';
import AjvDraft04Module from 'ajv-draft-04';
import addFormatsModule from 'ajv-formats';

// Both packages are CommonJS modules whose default export TypeScript sees one level down under NodeNext.
const interop = <T>(m: unknown): T => ((m as { default?: unknown }).default ?? m) as T;
const AjvDraft04 = interop<new (opts: Options) => Ajv>(AjvDraft04Module);
const addFormats = interop<(ajv: Ajv, opts: { mode: 'full' }) => Ajv>(addFormatsModule);
const draft06 = createRequire(import.meta.url)('ajv/dist/refs/json-schema-draft-06.json') as object;

export type Draft = '04' | '06' | '07' | '2019-09' | '2020-12';

/**
 * The draft a schema declares in `$schema`; without one, draft-04 if it names itself with draft-04's
 * `id`, else draft-07.
 */
export function draftOf(schema: unknown): Draft {
  const root = typeof schema === 'object' && schema !== null ? (schema as Record<string, unknown>) : {};
  const uri = root['$schema'];
  if (typeof uri !== 'string') return typeof root['id'] === 'string' && !('$id' in root) ? '04' : '07';
  if (uri.includes('draft-04')) return '04';
  if (uri.includes('draft-06')) return '06';
  if (uri.includes('2019-09')) return '2019-09';
  if (uri.includes('2020-12')) return '2020-12';
  return '07';
}

type AnyAjv = Pick<Ajv, 'compile'>;

function newAjv(draft: Draft, unicode: boolean): AnyAjv {
  const opts: Options = { strict: false, allErrors: false, logger: false, unicodeRegExp: unicode };
  let ajv: Ajv;
  switch (draft) {
    case '04':
      ajv = new AjvDraft04(opts);
      break;
    case '06':
      ajv = new Ajv(opts);
      ajv.addMetaSchema(draft06);
      break;
    case '2019-09':
      ajv = new Ajv2019(opts);
      break;
    case '2020-12':
      ajv = new Ajv2020(opts);
      break;
    default:
      ajv = new Ajv(opts);
  }
  addFormats(ajv, { mode: 'full' });
  return ajv;
}

/**
 * Ajv instances keep every schema they compiled, and one instance costs a compiled meta-schema
 * (hundreds of KB): validators share an instance per draft, and a new one is started every
 * GENERATION compiles, so an old instance is collected once its validators have been evicted.
 */
const GENERATION = 64;
const shared = new Map<Draft, { ajv: AnyAjv; compiled: number }>();

/**
 * A validator for `schema`, the draft it was read as, and whether its patterns were compiled with
 * the `u` flag (for the whole schema: see compileFor); the grammar compiler reads it the same way.
 */
export function compileValidator(schema: object): { validate: ValidateFunction; draft: Draft; unicode: boolean } {
  const draft = draftOf(schema);
  try {
    return { ...compileFor(schema, draft), draft };
  } catch (err) {
    // draft-04's `id` deep inside a schema that does not say which draft it is written for.
    if (draft !== '04' && /keyword "id"/.test((err as Error).message)) return { ...compileFor(schema, '04'), draft: '04' };
    throw err;
  }
}

function compileFor(schema: object, draft: Draft): { validate: ValidateFunction; unicode: boolean } {
  let s = shared.get(draft);
  if (!s || s.compiled >= GENERATION) {
    s = { ajv: newAjv(draft, true), compiled: 0 };
    shared.set(draft, s);
  }
  s.compiled++;
  try {
    return { validate: s.ajv.compile(schema), unicode: true };
  } catch (err) {
    const message = (err as Error).message;
    // Another schema with the same $id is already in the shared instance: this one gets its own.
    if (/already exists/.test(message)) return { validate: newAjv(draft, true).compile(schema), unicode: true };
    // Patterns written for JavaScript regexes without the `u` flag (`\_`, `\-` outside a class) are
    // common; JSON Schema's regex dialect tolerates them, so they are compiled without it: every
    // pattern of the schema (`\p{Lu}` beside `\-` is then a `p` and braces).
    if (/regular expression/i.test(message)) return { validate: newAjv(draft, false).compile(schema), unicode: false };
    throw err;
  }
}
