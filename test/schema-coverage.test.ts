/**
 * Structured output on real-world schemas: every schema of ../shared/schemas (JSONSchemaBench,
 * eight categories) through chat completions and Responses on the local model, with the openai SDK.
 * Each answer is held to the original schema by a validator set up here from the published
 * packages (Ajv for the schema's draft, ajv-formats), not by the server's own. Prints the coverage
 * table that README and docs/decisions.md quote.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { Ajv, type Options, type ValidateFunction } from 'ajv';
import { Ajv2019 } from 'ajv/dist/2019.js';
import { Ajv2020 } from 'ajv/dist/2020.js';
import AjvDraft04Module from 'ajv-draft-04';
import addFormatsModule from 'ajv-formats';
import OpenAI from 'openai';
import { createKey, SHARED_MODELS, startServer, type TestServer } from './helpers/server.js';

const SCHEMAS = join(SHARED_MODELS, '..', 'schemas');
const STORIES = 'local/stories260k';
const interop = <T>(m: unknown): T => ((m as { default?: unknown }).default ?? m) as T;
const AjvDraft04 = interop<new (o: Options) => Ajv>(AjvDraft04Module);
const addFormats = interop<(a: Ajv) => Ajv>(addFormatsModule);

/** An independent validator for the schema's declared draft. */
function validatorFor(schema: Record<string, unknown>): ValidateFunction {
  const uri = String(schema['$schema'] ?? '');
  const opts: Options = { strict: false, logger: false };
  const make = (draft04: boolean, unicode: boolean): Ajv => {
    const o = { ...opts, unicodeRegExp: unicode };
    let ajv: Ajv;
    if (draft04) ajv = new AjvDraft04(o);
    else if (uri.includes('2020-12')) ajv = new Ajv2020(o);
    else if (uri.includes('2019-09')) ajv = new Ajv2019(o);
    else {
      ajv = new Ajv(o);
      if (uri.includes('draft-06')) ajv.addMetaSchema(createRequire(import.meta.url)('ajv/dist/refs/json-schema-draft-06.json') as object);
    }
    return addFormats(ajv);
  };
  const draft04 = uri.includes('draft-04') || (!uri && typeof schema['id'] === 'string');
  const attempts: Array<[boolean, boolean]> = [
    [draft04, true],
    [draft04, false],
    [true, true],
    [true, false],
  ];
  let last: unknown;
  for (const [d4, u] of attempts) {
    try {
      return make(d4, u).compile(schema);
    } catch (err) {
      last = err;
    }
  }
  throw last;
}

interface Row {
  accepted: number;
  valid: number;
  refused: number;
  invalid: number;
  failed: number;
  truncated: number;
}
type Outcome = 'valid' | 'invalid' | 'refused' | 'failed' | 'truncated';

const categories = readdirSync(SCHEMAS, { withFileTypes: true })
  .filter((d) => d.isDirectory())
  .map((d) => d.name)
  .sort();

async function pool<T>(items: T[], width: number, run: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < items.length) await run(items[next++]!);
    }),
  );
}

describe('structured output on 320 real-world JSON schemas (JSONSchemaBench) on the local model', () => {
  let server: TestServer;
  let client: OpenAI;
  const results = new Map<string, Map<string, Row>>();
  const refusals: string[] = [];
  const invalids: string[] = [];
  const truncated: string[] = [];
  const failures: string[] = [];

  before(async () => {
    server = await startServer();
    client = new OpenAI({ apiKey: (await createKey(server, 'acme')).key, baseURL: server.baseURL, maxRetries: 0, timeout: 120_000 });
  });
  after(() => server.close());

  const cases = categories.flatMap((category) =>
    readdirSync(join(SCHEMAS, category))
      .filter((f) => f.endsWith('.json'))
      .sort()
      .map((file) => ({
        category,
        file,
        schema: JSON.parse(readFileSync(join(SCHEMAS, category, file), 'utf8')) as Record<string, unknown>,
      })),
  );

  function record(api: string, category: string, file: string, outcome: Outcome, detail = ''): void {
    const byCategory = results.get(api) ?? new Map<string, Row>();
    results.set(api, byCategory);
    const row = byCategory.get(category) ?? { accepted: 0, valid: 0, refused: 0, invalid: 0, failed: 0, truncated: 0 };
    byCategory.set(category, row);
    if (outcome !== 'refused') row.accepted++;
    row[outcome]++;
    if (outcome === 'refused') refusals.push(`${api} ${category}/${file}: ${detail}`);
    if (outcome === 'invalid') invalids.push(`${api} ${category}/${file}: ${detail}`);
    if (outcome === 'truncated') truncated.push(`${api} ${category}/${file}: ${detail}`);
    if (outcome === 'failed') failures.push(`${api} ${category}/${file}: ${detail}`);
  }

  function classify(err: unknown): { outcome: Outcome; detail: string } {
    if (err instanceof OpenAI.APIError) {
      if (err.status === 400) return { outcome: 'refused', detail: err.message };
      if (err.code === 'structured_output_failed') return { outcome: 'failed', detail: err.message };
    }
    throw err;
  }

  /** The independent validator, or undefined for a schema that cannot be compiled (the server must refuse it). */
  function tryValidator(schema: Record<string, unknown>): ValidateFunction | undefined {
    try {
      return validatorFor(schema);
    } catch {
      return undefined;
    }
  }

  function judge(
    validate: ValidateFunction | undefined,
    text: string,
    finish: string | null | undefined,
  ): { outcome: Outcome; detail: string } {
    if (!validate) return { outcome: 'invalid', detail: 'accepted a schema that no validator can compile' };
    // A reply cut at max_tokens is not claimed to be a document (finish_reason "length").
    if (finish === 'length' || finish === 'max_output_tokens')
      return { outcome: 'truncated', detail: `${text.length} chars: ${text.slice(0, 160)}` };
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      return { outcome: 'invalid', detail: `not JSON: ${(err as Error).message}: ${text.slice(0, 200)}` };
    }
    if (validate(value)) return { outcome: 'valid', detail: '' };
    return { outcome: 'invalid', detail: `${JSON.stringify(validate.errors?.[0])}: ${text.slice(0, 300)}` };
  }

  it('chat completions: response_format json_schema on every schema', { timeout: 1_800_000 }, async () => {
    await pool(cases, 4, async ({ category, file, schema }) => {
      const validate = tryValidator(schema);
      let r: { outcome: Outcome; detail: string };
      try {
        const c = await client.chat.completions.create({
          model: STORIES,
          messages: [{ role: 'user', content: 'Write the JSON document.' }],
          temperature: 1,
          response_format: { type: 'json_schema', json_schema: { name: 'doc', schema } },
        });
        const choice = c.choices[0]!;
        r = judge(validate, choice.message.content ?? '', choice.finish_reason);
      } catch (err) {
        r = classify(err);
      }
      record('chat', category, file, r.outcome, r.detail);
    });
  });

  it('Responses: text.format json_schema on every schema', { timeout: 1_800_000 }, async () => {
    await pool(cases, 4, async ({ category, file, schema }) => {
      const validate = tryValidator(schema);
      let r: { outcome: Outcome; detail: string };
      try {
        const resp = await client.responses.create({
          model: STORIES,
          input: 'Write the JSON document.',
          temperature: 1,
          store: false,
          text: { format: { type: 'json_schema', name: 'doc', schema } },
        });
        if (resp.status === 'failed') {
          assert.equal(resp.error?.code, 'structured_output_failed', JSON.stringify(resp.error));
          r = { outcome: 'failed', detail: resp.error.message };
        } else r = judge(validate, resp.output_text, resp.status === 'incomplete' ? 'length' : 'stop');
      } catch (err) {
        r = classify(err);
      }
      record('responses', category, file, r.outcome, r.detail);
    });
  });

  // The goal: 90% accepted and valid overall, and in every category at least the best engine
  // of the JSONSchemaBench paper (about 41% on GitHub-hard). On this 512-token story model about 96%
  // is reached; most of the rest have no valid document that fits the context (docs/decisions.md).
  it('reports coverage per category, never an invalid document, refuses only schemas no validator accepts', () => {
    const lines = [
      '| API | category | schemas | accepted | valid | refused | invalid | failed check | cut at max_tokens |',
      '|---|---|---|---|---|---|---|---|---|',
    ];
    let total = 0;
    let valid = 0;
    let invalid = 0;
    for (const [api, byCategory] of results) {
      for (const category of categories) {
        const row = byCategory.get(category);
        if (!row) continue;
        const n = row.accepted + row.refused;
        total += n;
        valid += row.valid;
        invalid += row.invalid;
        lines.push(
          `| ${api} | ${category} | ${n} | ${row.accepted} | ${row.valid} (${Math.round((100 * row.valid) / n)}%) | ${row.refused} | ${row.invalid} | ${row.failed} | ${row.truncated} |`,
        );
      }
    }
    lines.push('', `Overall ${valid} of ${total} (${Math.round((100 * valid) / total)}%) accepted and valid, ${invalid} invalid.`);
    console.log(`\n${lines.join('\n')}\n`);
    if (refusals.length) console.log(`Refused:\n${refusals.join('\n')}\n`);
    if (truncated.length) console.log(`Cut at max_tokens:\n${truncated.join('\n')}\n`);
    if (failures.length) console.log(`Failed the check on every sample:\n${failures.join('\n')}\n`);
    if (invalids.length) console.log(`INVALID:\n${invalids.join('\n')}\n`);
    assert.equal(invalid, 0, `documents that fail their schema:\n${invalids.join('\n')}`);
    // The two refusals: a schema whose required property is forbidden, and one whose $ref cannot resolve.
    assert.ok(refusals.length <= 2 * results.size, refusals.join('\n'));
    assert.ok(valid / total >= 0.9, `${valid} of ${total} accepted and valid`);
    for (const byCategory of results.values())
      for (const [category, row] of byCategory)
        assert.ok(row.valid / (row.accepted + row.refused) >= 0.6, `${category}: ${JSON.stringify(row)}`);
  });
});
