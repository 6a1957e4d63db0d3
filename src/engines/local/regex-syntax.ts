/**
 * What the two readers of a JSON Schema `pattern` share (schema-regex.ts, element by element, and
 * schema-automaton.ts, as an automaton): how a pattern is parsed, and which characters a grammar
 * writes in a JSON string and how.
 */
import { RegExpParser, type AST } from '@eslint-community/regexpp';

/** Sorted, disjoint, inclusive code point ranges. */
export type Ranges = Array<[number, number]>;

/**
 * The pattern's syntax tree, read as the validator compiles it. `unicode`: the flag the validator
 * compiled the schema's patterns with (Ajv drops `u` for every pattern of a schema where one needs
 * it dropped); undefined, with the `u` flag where the pattern allows it.
 */
export function parsePattern(pattern: string, unicode?: boolean): { ast: AST.Pattern; unicode: boolean } | undefined {
  const parser = new RegExpParser();
  for (const flag of unicode === undefined ? [true, false] : [unicode]) {
    try {
      return { ast: parser.parsePattern(pattern, 0, pattern.length, { unicode: flag }), unicode: flag };
    } catch {
      // Not a pattern with this flag.
    }
  }
  return undefined;
}

/**
 * Characters written as themselves in a JSON string: no quote, backslash, control character (DEL
 * included, as llama.cpp's own JSON grammar leaves it out) or surrogate; the BMP only, so that `.`
 * and lengths mean the same with and without the `u` flag.
 */
export const PLAIN: Ranges = [
  [0x20, 0x21],
  [0x23, 0x5b],
  [0x5d, 0x7e],
  [0x80, 0xd7ff],
  [0xe000, 0xffff],
];

/** Characters written escaped, and how (as GBNF). */
export const ESCAPED: ReadonlyArray<[number, string]> = [
  [0x22, '"\\\\\\""'],
  [0x5c, '"\\\\\\\\"'],
  [0x0a, '"\\\\n"'],
  [0x09, '"\\\\t"'],
  [0x0d, '"\\\\r"'],
];

/** Every character a grammar writes in a JSON string: the plain ones and the escaped ones. */
export const JSON_STRING_CHARS: Ranges = [...PLAIN, ...ESCAPED.map(([c]): [number, number] => [c, c])].sort((a, b) => a[0] - b[0]);
