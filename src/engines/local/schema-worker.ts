/**
 * The schema worker thread: compiles JSON schemas into grammars (schema-gbnf.ts) and validators
 * (Ajv), and validates generated documents. All of it is CPU work proportional to the schema, so it
 * runs here, where a slow schema delays no request and can be stopped (the main thread terminates
 * the worker when a compile overruns its time limit).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Ajv, type ValidateFunction } from 'ajv';
import { SchemaCompileError, schemaToGbnf } from './schema-gbnf.js';
import type { SchemaWorkerReply, SchemaWorkerRequest } from './schema-protocol.js';

const capacity = (workerData as { cacheSize: number }).cacheSize;
/** Validators by schema key, least recently used first. */
const validators = new Map<string, ValidateFunction>();

/**
 * Ajv instances keep every schema they compiled, and one instance costs a compiled meta-schema
 * (hundreds of KB): validators share an instance, and a new one is started every GENERATION
 * compiles, so an old instance is collected once its validators have been evicted.
 */
const GENERATION = 64;
let shared: Ajv | undefined;
let compiledOnShared = 0;
const newAjv = (): Ajv => new Ajv({ strict: false, allErrors: false, logger: false });
function compileValidator(schema: object): ValidateFunction {
  if (!shared || compiledOnShared >= GENERATION) {
    shared = newAjv();
    compiledOnShared = 0;
  }
  compiledOnShared++;
  try {
    return shared.compile(schema);
  } catch (err) {
    // Another schema with the same $id is already in the shared instance: this one gets its own.
    if (/already exists/.test((err as Error).message)) return newAjv().compile(schema);
    throw err;
  }
}

function remember(key: string, v: ValidateFunction): void {
  validators.delete(key);
  validators.set(key, v);
  while (validators.size > capacity) validators.delete(validators.keys().next().value!);
}

function handle(m: SchemaWorkerRequest): SchemaWorkerReply {
  switch (m.op) {
    case 'compile': {
      let validate: ValidateFunction;
      try {
        validate = compileValidator(m.schema as object);
      } catch (err) {
        // Ajv's code generator recurses per property and subschema: a huge flat schema can overflow it.
        if (err instanceof RangeError)
          return { id: m.id, ok: false, kind: 'unsupported', message: 'the schema is too complex to build a validator for' };
        return { id: m.id, ok: false, kind: 'invalid', message: (err as Error).message };
      }
      let gbnf: string;
      try {
        gbnf = schemaToGbnf(m.schema);
      } catch (err) {
        if (err instanceof SchemaCompileError) return { id: m.id, ok: false, kind: 'unsupported', message: err.message };
        if (err instanceof RangeError)
          return { id: m.id, ok: false, kind: 'unsupported', message: 'the schema is too deeply nested to compile' };
        throw err;
      }
      remember(m.key, validate);
      return { id: m.id, ok: true, gbnf };
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
      return { id: m.id, ok: true, valid, ...(!valid && { errors: JSON.stringify(v.errors).slice(0, 2000) }) };
    }
    case 'forget':
      validators.delete(m.key);
      return { id: m.id, ok: true };
  }
}

// Ajv compiles its meta-schema on first use (tens of ms): do it now, so no request's time limit pays for it.
compileValidator({ type: 'object', properties: { a: { type: 'string' } } });
schemaToGbnf({ type: 'object' });

parentPort!.on('message', (m: SchemaWorkerRequest) => {
  if (m.op === 'compile') parentPort!.postMessage({ id: m.id, started: true } satisfies SchemaWorkerReply);
  let reply: SchemaWorkerReply;
  try {
    reply = handle(m);
  } catch (err) {
    reply = { id: m.id, ok: false, kind: 'invalid', message: (err as Error).message };
  }
  parentPort!.postMessage(reply);
});
