import { ApiError } from './errors.js';
import { jsonPointer, walkJson } from './json-walk.js';

/**
 * Bounds on a JSON schema a request carries (structured output, tool parameters). A schema is
 * compiled into a grammar and a validator, and both cost time and memory in proportion to it: a
 * 200,000-value enum held a worker at 100% CPU for minutes, 1,500 levels of nesting overflowed the
 * stack, `minItems: 100000` broke llama.cpp's grammar parser. Each bound is a 400 that names it.
 * The defaults admit every one of the 320 real-world schemas in shared/schemas with room to spare.
 */
export interface SchemaLimits {
  /** Approximate serialized size (keys and string values counted in characters). */
  maxBytes: number;
  /** Nesting of objects and arrays. */
  maxDepth: number;
  /** Objects and arrays in the schema, all together. */
  maxNodes: number;
  /** Values of one enum. */
  maxEnum: number;
  /** Largest minItems / minLength / minProperties / minContains (each forces that much output). */
  maxMinCount: number;
}

const MIN_COUNT_KEYWORDS = ['minItems', 'minLength', 'minProperties', 'minContains'] as const;

const SETTING: Record<keyof SchemaLimits, string> = {
  maxBytes: 'SWITCHYARD_SCHEMA_MAX_BYTES',
  maxDepth: 'SWITCHYARD_SCHEMA_MAX_DEPTH',
  maxNodes: 'SWITCHYARD_SCHEMA_MAX_NODES',
  maxEnum: 'SWITCHYARD_SCHEMA_MAX_ENUM',
  maxMinCount: 'SWITCHYARD_SCHEMA_MAX_MIN_COUNT',
};

function refuse(param: string, what: string, limit: keyof SchemaLimits, value: number): never {
  throw new ApiError('schema_too_large', `The JSON schema is too large: ${what}; the limit is ${value} (${SETTING[limit]}).`, { param });
}

/**
 * Walks the schema once, without recursion (so nesting cannot overflow the stack), and throws a
 * 400 at the first bound it passes; the walk stops there, so its cost is bounded by the limits too.
 */
export function checkSchemaLimits(schema: unknown, limits: SchemaLimits, param: string): void {
  let bytes = 0;
  let nodes = 0;
  walkJson(schema, (node) => {
    const { value, depth } = node;
    if (typeof value === 'string') {
      bytes += value.length + 2;
      if (bytes > limits.maxBytes) refuse(param, `more than ${limits.maxBytes} bytes`, 'maxBytes', limits.maxBytes);
      return;
    }
    if (value === null || typeof value !== 'object') {
      bytes += 8;
      return;
    }
    if (depth > limits.maxDepth)
      refuse(
        param,
        `it nests deeper than ${limits.maxDepth} levels (at '${jsonPointer(node).slice(0, 200)}')`,
        'maxDepth',
        limits.maxDepth,
      );
    if (++nodes > limits.maxNodes) refuse(param, `it has more than ${limits.maxNodes} objects and arrays`, 'maxNodes', limits.maxNodes);
    bytes += 2;
    if (Array.isArray(value)) {
      bytes += value.length;
      return;
    }
    const obj = value as Record<string, unknown>;
    const en = obj['enum'];
    if (Array.isArray(en) && en.length > limits.maxEnum) {
      refuse(param, `the enum at '${jsonPointer(node) || '/'}' has ${en.length} values`, 'maxEnum', limits.maxEnum);
    }
    for (const k of MIN_COUNT_KEYWORDS) {
      const n = obj[k];
      if (typeof n === 'number' && n > limits.maxMinCount)
        refuse(param, `${k} at '${jsonPointer(node) || '/'}' is ${n}`, 'maxMinCount', limits.maxMinCount);
    }
    for (const key in obj) bytes += key.length + 3;
    if (bytes > limits.maxBytes) refuse(param, `more than ${limits.maxBytes} bytes`, 'maxBytes', limits.maxBytes);
  });
}
