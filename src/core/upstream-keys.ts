/**
 * Which environment variables a deployment stored in the database (admin API, CLI) may name as its
 * upstream key. The server sends that variable's value to the upstream, so an open choice would let
 * an admin key holder send any of the server's secrets (SWITCHYARD_ADMIN_KEY, DATABASE_URL, …) to a
 * host of their choosing. Variables must start with UPSTREAM_KEY_, or be named in
 * SWITCHYARD_UPSTREAM_KEY_VARS. Config-file deployments are the operator's own and may name any.
 */
export const UPSTREAM_KEY_PREFIX = 'UPSTREAM_KEY_';

/** Why `name` may not be used as a stored deployment's key variable, or undefined when it may. */
export function keyVarRefusal(name: string, allowed: readonly string[]): string | undefined {
  if (name.startsWith(UPSTREAM_KEY_PREFIX) && name.length > UPSTREAM_KEY_PREFIX.length) return undefined;
  if (allowed.includes(name)) return undefined;
  return `only variables whose names start with ${UPSTREAM_KEY_PREFIX} (or are listed in SWITCHYARD_UPSTREAM_KEY_VARS) may hold an upstream key`;
}
