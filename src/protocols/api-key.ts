import type { IncomingHttpHeaders } from 'node:http';
import { ApiError } from '../core/errors.js';

/**
 * The API key a request presents: `Authorization: Bearer <key>` (which wins when both are sent) or
 * `x-api-key: <key>`. Undefined when there is none; '' for an Authorization header of another scheme.
 * `raw` (the request's raw header lines): a request with two Authorization lines is refused, where
 * Node's parser keeps the first and drops the rest (two x-api-key lines arrive joined, and no key
 * reads so).
 */
export function extractToken(headers: IncomingHttpHeaders, raw?: readonly string[]): string | undefined {
  const auth = headers.authorization;
  // Checked whatever the first line holds: an empty one would otherwise hand the choice to x-api-key.
  if (auth !== undefined && raw !== undefined && authorizationLines(raw) > 1)
    throw new ApiError('invalid_api_key', 'The request has more than one Authorization header; send one key.');
  if (auth !== undefined && auth !== '') {
    const space = auth.indexOf(' ');
    const scheme = space < 0 ? auth : auth.slice(0, space);
    if (scheme.toLowerCase() !== 'bearer') return '';
    return auth.slice(space + 1).trim();
  }
  const x = headers['x-api-key'];
  const value = Array.isArray(x) ? x[0] : x;
  return value === undefined ? undefined : value.trim();
}

/** How many Authorization lines a request's raw headers hold (names first, values after; a name's length is checked before its case). */
function authorizationLines(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 13 && name.toLowerCase() === 'authorization') n++;
  }
  return n;
}
