/**
 * Structured output cost over the 320 JSONSchemaBench schemas in ../shared/schemas: the schema
 * worker's compile (validator and grammar) per schema, llama.cpp's parse of the grammar (the one
 * step on the main thread), and the mask: time per generated token under each grammar against the
 * same model unconstrained (stories260K, one thread).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { getLlama, LlamaGrammar, LlamaGrammarEvaluationState, LlamaLogLevel, type Token } from 'node-llama-cpp';
import { PACKAGE_ROOT } from '../src/config.js';
import { schemaToGbnf } from '../src/engines/local/schema-gbnf.js';
import { compileValidator } from '../src/engines/local/schema-validator.js';

export interface SchemaBench {
  schemas: number;
  compiled: number;
  /** Validator + grammar, in the schema worker. */
  compile_ms: { p50: number; p99: number; max: number };
  /** LlamaGrammar from the grammar text, on the main thread. */
  parse_ms: { p50: number; p99: number; max: number };
  /** µs per token generated under a grammar, and without one. */
  token_us: { unconstrained: number; grammar_p50: number; grammar_p99: number };
}

const pct = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return Math.round(s[Math.min(s.length - 1, Math.floor(s.length * p))]! * 100) / 100;
};

export async function schemaScenario(opts: { quick: boolean; log: (m: string) => void }): Promise<SchemaBench> {
  const root = join(PACKAGE_ROOT, '..', 'shared', 'schemas');
  const files = readdirSync(root, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .flatMap((d) => readdirSync(join(root, d.name)).map((f) => join(root, d.name, f)));
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: join(PACKAGE_ROOT, '..', 'shared', 'models', 'stories260K.gguf') });
  const context = await model.createContext({ contextSize: 512, threads: 1 });
  const seq = context.getSequence();
  const prompt = model.tokenize('Write the JSON document.');
  const TOKENS = 48;

  async function perToken(grammar?: LlamaGrammar): Promise<number> {
    await seq.clearHistory();
    const state = grammar ? new LlamaGrammarEvaluationState({ model, grammar }) : undefined;
    const started = process.hrtime.bigint();
    let n = 0;
    for await (const t of seq.evaluate(prompt as Token[], { temperature: 1, seed: 1, ...(state && { grammarEvaluationState: state }) })) {
      if (model.isEogToken(t) || ++n >= TOKENS) break;
    }
    return n === 0 ? 0 : Number(process.hrtime.bigint() - started) / 1000 / n;
  }

  const compile: number[] = [];
  const parse: number[] = [];
  const masked: number[] = [];
  const unconstrained: number[] = [];
  const sample = opts.quick ? files.slice(0, 40) : files;
  for (const [i, file] of sample.entries()) {
    const schema = JSON.parse(readFileSync(file, 'utf8')) as object;
    let gbnf: string;
    const t0 = performance.now();
    try {
      const { draft, unicode } = compileValidator(schema);
      gbnf = schemaToGbnf(schema, draft, unicode).gbnf;
    } catch {
      continue;
    }
    compile.push(performance.now() - t0);
    const t1 = performance.now();
    const grammar = new LlamaGrammar(llama, { grammar: gbnf });
    parse.push(performance.now() - t1);
    masked.push(await perToken(grammar));
    if (i % 8 === 0) unconstrained.push(await perToken());
  }
  opts.log(`schemas: ${compile.length} of ${sample.length} compiled`);
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  return {
    schemas: sample.length,
    compiled: compile.length,
    compile_ms: { p50: pct(compile, 0.5), p99: pct(compile, 0.99), max: pct(compile, 1) },
    parse_ms: { p50: pct(parse, 0.5), p99: pct(parse, 0.99), max: pct(parse, 1) },
    token_us: { unconstrained: pct(unconstrained, 0.5), grammar_p50: pct(masked, 0.5), grammar_p99: pct(masked, 0.99) },
  };
}

export function renderSchemaTable(s: SchemaBench): string {
  return [
    `Structured output over ${s.schemas} JSONSchemaBench schemas (${s.compiled} compiled):`,
    '',
    '| step | p50 | p99 | max |',
    '|---|---|---|---|',
    `| compile: validator and grammar (schema worker thread) | ${s.compile_ms.p50} ms | ${s.compile_ms.p99} ms | ${s.compile_ms.max} ms |`,
    `| grammar parse by llama.cpp (main thread) | ${s.parse_ms.p50} ms | ${s.parse_ms.p99} ms | ${s.parse_ms.max} ms |`,
    `| time per token under the grammar (stories260K, 1 thread; unconstrained: ${s.token_us.unconstrained} µs) | ${s.token_us.grammar_p50} µs | ${s.token_us.grammar_p99} µs | |`,
  ].join('\n');
}
