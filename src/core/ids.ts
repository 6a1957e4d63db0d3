import { randomUUID } from 'node:crypto';

/**
 * Random ids for objects (responses, items, completions, usage records). randomUUID draws from a
 * pre-filled entropy cache; randomBytes per call was a measurable share of the request hot path.
 */
export function newId(prefix: string, sep = '_'): string {
  return `${prefix}${sep}${randomUUID().replaceAll('-', '')}`;
}
