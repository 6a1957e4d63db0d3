import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import { PACKAGE_ROOT } from '../../src/config.js';

/**
 * The Open Responses specification's own OpenAPI document (shared/spec/open-responses/openapi.json,
 * release 2026-04-24), compiled for checking what the server emits: schemas by name, and stream
 * event schemas by the event type they are for.
 */
const SPEC = join(PACKAGE_ROOT, '..', 'shared', 'spec', 'open-responses', 'openapi.json');
const doc = JSON.parse(readFileSync(SPEC, 'utf8')) as {
  components: { schemas: Record<string, { properties?: { type?: { enum?: string[]; const?: string } } }> };
};
const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
ajv.addSchema({ $id: 'open-responses', ...doc });
export const validator = (name: string): ValidateFunction => ajv.getSchema(`open-responses#/components/schemas/${name}`)!;
export const responseResource = validator('ResponseResource');
/** Stream event schemas by the event type they are for. */
export const eventSchemas = new Map<string, ValidateFunction>();
for (const [name, schema] of Object.entries(doc.components.schemas)) {
  if (!name.endsWith('StreamingEvent')) continue;
  const t = schema.properties?.type;
  const type = t?.const ?? t?.enum?.[0];
  if (type) eventSchemas.set(type, validator(name));
}

/**
 * Raw reasoning is streamed under OpenAI's names (`response.reasoning_text.*`; the openai SDK's stream
 * helper rejects Open Responses' `response.reasoning.*`, see docs/decisions.md): held to the
 * specification's schemas for those events, in every field but the name.
 */
for (const [ours, theirs] of [
  ['response.reasoning_text.delta', 'response.reasoning.delta'],
  ['response.reasoning_text.done', 'response.reasoning.done'],
] as const) {
  const v = eventSchemas.get(theirs)!;
  const renamed = ((e: { type: string }) => v({ ...e, type: theirs })) as ValidateFunction;
  Object.defineProperty(renamed, 'errors', { get: () => v.errors });
  eventSchemas.set(ours, renamed);
}

export function valid(v: ValidateFunction, value: unknown, what: string): void {
  assert.ok(v(value), `${what}: ${ajv.errorsText(v.errors, { separator: '\n' })}\n${JSON.stringify(value).slice(0, 600)}`);
}
