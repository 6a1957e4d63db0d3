import { patternToGbnf } from './schema-regex.js';

/**
 * String `format`s as GBNF: the text between the quotes. Each grammar accepts a subset of what the
 * validator (ajv-formats, full mode) accepts, picked to be plain and short for a model to write:
 * `example.com`-like hosts, lower-case hex, no escapes. Formats not listed here constrain nothing a
 * grammar must hold (password, binary, float, double are always valid; unknown ones are annotations,
 * as the drafts say): the caller writes a plain string or number for them.
 */

const HEX = '[0-9a-f]';
const LABEL = '[a-z0-9]{1,20}';
const OCTET = '(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])';
// Days 29–31 only in months that have them; 29 February is left out (it needs the year).
const DATE = '[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)';
const TIME = '(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])';
const PATH = '(?:/[a-z0-9._~-]{0,20}){0,4}';
const URL = `https?://${LABEL}(?:\\.${LABEL}){0,2}\\.[a-z]{2,6}${PATH}`;

/**
 * Formats the validator checks, by name: a pattern (matched in full) of the text the grammar
 * writes for them (string formats only). Written as patterns so that a schema's own `pattern`
 * beside the format can be intersected with it (schema-automaton.ts); the grammar is compiled
 * from the same text.
 */
export const FORMAT_PATTERNS: Readonly<Record<string, string>> = {
  date: DATE,
  time: TIME,
  'date-time': `${DATE}T${TIME}`,
  'iso-time': TIME,
  'iso-date-time': `${DATE}T${TIME}`,
  duration: 'P(?:[0-9]{1,4}[YMDW]|T[0-9]{1,4}[HMS])',
  uri: URL,
  url: URL,
  'uri-reference': URL,
  'uri-template': URL,
  email: `${LABEL}(?:\\.${LABEL})?@${LABEL}(?:\\.${LABEL})?\\.[a-z]{2,6}`,
  hostname: `${LABEL}(?:\\.${LABEL}){0,3}`,
  ipv4: `${OCTET}\\.${OCTET}\\.${OCTET}\\.${OCTET}`,
  ipv6: `${HEX}{1,4}(?::${HEX}{1,4}){7}`,
  uuid: `${HEX}{8}-${HEX}{4}-${HEX}{4}-${HEX}{4}-${HEX}{12}`,
  regex: '[a-zA-Z0-9 ]{0,40}',
  'json-pointer': '(?:/[a-z0-9_]{0,20}){0,4}',
  'json-pointer-uri-fragment': '#(?:/[a-z0-9_]{0,20}){0,4}',
  'relative-json-pointer': '[0-9](?:/[a-z0-9_]{0,20}){0,4}',
  byte: '(?:[A-Za-z0-9+/]{4}){0,16}',
};

/** The grammar of each format's text, from its pattern. */
export const STRING_FORMATS: Readonly<Record<string, string>> = Object.fromEntries(
  Object.entries(FORMAT_PATTERNS).map(([name, pattern]) => {
    const grammar = patternToGbnf(pattern);
    if (grammar === undefined) throw new Error(`the ${name} format's pattern has no grammar`);
    return [name, grammar];
  }),
);

/** Number formats with a range: int32 is bounded, int64 is any (safe) integer. */
export const INTEGER_FORMATS: Readonly<Record<string, [number, number]>> = {
  int32: [-(2 ** 31), 2 ** 31 - 1],
  int64: [-Infinity, Infinity],
};
