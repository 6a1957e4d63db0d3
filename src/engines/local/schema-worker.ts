/**
 * The schema worker thread: compiles JSON schemas into grammars (schema-gbnf.ts) and validators
 * (Ajv), and validates generated documents. All of it is CPU work proportional to the schema, so it
 * runs here, where a slow schema delays no request and can be stopped (the main thread terminates
 * the worker when a compile or a validation overruns its time limit: a `pattern` that backtracks
 * can take longer than any request should wait on a document a grammar let through).
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { ValidateFunction } from 'ajv';
import { SchemaCompileError, schemaToGbnf, type CompiledGrammar } from './schema-gbnf.js';
import type { SchemaWorkerReply, SchemaWorkerRequest } from './schema-protocol.js';
import { compileValidator, type Draft } from './schema-validator.js';

const capacity = (workerData as { cacheSize: number }).cacheSize;
/** Validators by schema key, least recently used first. */
const validators = new Map<string, ValidateFunction>();

function remember(key: string, v: ValidateFunction): void {
  validators.delete(key);
  validators.set(key, v);
  while (validators.size > capacity) validators.delete(validators.keys().next().value!);
}

function handle(m: SchemaWorkerRequest): SchemaWorkerReply {
  switch (m.op) {
    case 'compile': {
      let validate: ValidateFunction;
      let draft: Draft;
      let unicode: boolean;
      try {
        ({ validate, draft, unicode } = compileValidator(m.schema as object));
      } catch (err) {
        // Ajv's code generator recurses per property and subschema: a huge flat schema can overflow it.
        if (err instanceof RangeError)
          return { id: m.id, ok: false, kind: 'unsupported', message: 'the schema is too complex to build a validator for' };
        return { id: m.id, ok: false, kind: 'invalid', message: (err as Error).message };
      }
      let grammar: CompiledGrammar;
      try {
        // Patterns read with the flag the validator compiled them with.
        grammar = schemaToGbnf(m.schema, draft, unicode);
      } catch (err) {
        if (err instanceof SchemaCompileError) return { id: m.id, ok: false, kind: err.kind, message: err.message };
        if (err instanceof RangeError)
          return { id: m.id, ok: false, kind: 'unsupported', message: 'the schema is too deeply nested to compile' };
        throw err;
      }
      remember(m.key, validate);
      return { id: m.id, ok: true, gbnf: grammar.gbnf, checked: grammar.checked };
    }
    case 'validate': {
      const v = validators.get(m.key);
      if (!v) return { id: m.id, ok: false, kind: 'missing', message: 'validator not cached' };
      remember(m.key, v);
      let value: unknown;
      try {
        value = JSON.parse(m.text);
      } catch (err) {
        return { id: m.id, ok: true, valid: false, errors: `not JSON: ${(err as Error).message}` };
      }
      const valid = v(value);
      return { id: m.id, ok: true, valid, ...(!valid && { errors: describe(v.errors) }) };
    }
    case 'forget':
      validators.delete(m.key);
      return { id: m.id, ok: true };
  }
}

/** Ajv's first error, short: where, and what it expected. */
function describe(errors: ValidateFunction['errors']): string {
  const e = errors?.[0];
  if (!e) return 'invalid';
  return `${e.instancePath || '/'} ${e.message ?? 'is invalid'}${e.params && Object.keys(e.params).length > 0 ? ` ${JSON.stringify(e.params)}` : ''}`.slice(
    0,
    500,
  );
}

// Ajv compiles its meta-schema on first use (tens of ms): do it now, so no request's time limit pays for it.
compileValidator({ type: 'object', properties: { a: { type: 'string' } } });
schemaToGbnf({ type: 'object' }, '07');

parentPort!.on('message', (m: SchemaWorkerRequest) => {
  // A compile's or a validation's time limit counts from here, not from when it was queued.
  if (m.op !== 'forget') parentPort!.postMessage({ id: m.id, started: true } satisfies SchemaWorkerReply);
  let reply: SchemaWorkerReply;
  try {
    reply = handle(m);
  } catch (err) {
    reply = { id: m.id, ok: false, kind: 'invalid', message: (err as Error).message };
  }
  parentPort!.postMessage(reply);
});
