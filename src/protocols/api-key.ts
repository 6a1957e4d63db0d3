import type { IncomingHttpHeaders } from 'node:http';

/**
 * The API key a request presents: `Authorization: Bearer <key>` (which wins when both are sent) or
 * `x-api-key: <key>`. Undefined when there is none; '' for an Authorization header of another scheme.
 */
export function extractToken(headers: IncomingHttpHeaders): string | undefined {
  const auth = headers.authorization;
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
