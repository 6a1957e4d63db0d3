import { createHash, hash, randomBytes } from 'node:crypto';
import type { ApiKeyRecord, KeyRole, Limits, Store } from '../store/store.js';
import { nowSeconds } from './ids.js';

/**
 * Keys look like `sk-sy-<16 hex id>_<43 chars secret>`. The id is not secret: it is what the
 * store is searched by, so the secret is only ever compared, in constant time, against one hash.
 * Keys an operator chooses (SWITCHYARD_ADMIN_KEY) need not follow the format; their id is derived
 * from their hash instead.
 */
const KEY_FORMAT = /^sk-sy-([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/;
const MIN_FOREIGN_KEY = 16;
const MAX_KEY = 512;
const PRINTABLE = /^[\x21-\x7e]+$/;

export interface ParsedKey {
  id: string;
  secret: string;
}

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** Returns undefined for something that cannot be a key at all. */
export function parseKey(token: string): ParsedKey | undefined {
  const m = KEY_FORMAT.exec(token);
  if (m) return { id: `key_${m[1]!}`, secret: m[2]! };
  if (token.length < MIN_FOREIGN_KEY || token.length > MAX_KEY || !PRINTABLE.test(token)) return undefined;
  return { id: `key_${sha256Hex(`id:${token}`).slice(0, 16)}`, secret: token };
}

export function generateKey(): { token: string; parsed: ParsedKey } {
  const idHex = randomBytes(8).toString('hex');
  const secret = randomBytes(32).toString('base64url');
  const token = `sk-sy-${idHex}_${secret}`;
  return { token, parsed: { id: `key_${idHex}`, secret } };
}

/**
 * Whether a presented secret is the one whose SHA-256 was stored (lowercase hex, as the store keeps
 * it), compared in constant time: every character is looked at whatever the first difference, so
 * the time says nothing about how much of the hash matched. Hex strings rather than buffers and
 * `timingSafeEqual`, because Node's one-shot hash into a Buffer costs twice its hex digest (a
 * backing store allocated per call: about 1 µs of a request's CPU here).
 */
export function secretMatches(secret: string, storedHex: string): boolean {
  const a = hash('sha256', secret, 'hex');
  if (a.length !== storedHex.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ storedHex.charCodeAt(i);
  return diff === 0;
}

export interface CreatedKey {
  /** The full key: shown once, never stored. */
  key: string;
  record: ApiKeyRecord;
  orgCreated: boolean;
}

export const ADMIN_ORG = 'admin';
export const BOOTSTRAP_KEY_NAME = 'bootstrap';

/** Creates the key, and its organization when that does not exist yet. */
export async function createKey(
  store: Store,
  opts: { org: string; name: string; role: KeyRole; limits?: Limits | undefined },
): Promise<CreatedKey> {
  let orgCreated = false;
  if (!(await store.getOrg(opts.org))) {
    await store.createOrg({ id: opts.org, name: opts.org, created_at: nowSeconds() });
    orgCreated = true;
  }
  const { token, parsed } = generateKey();
  const record: ApiKeyRecord = {
    id: parsed.id,
    org_id: opts.org,
    name: opts.name,
    role: opts.role,
    hash: sha256Hex(parsed.secret),
    created_at: nowSeconds(),
    revoked_at: null,
    limits: opts.limits ?? null,
  };
  await store.createKey(record);
  return { key: token, record, orgCreated };
}

/**
 * Makes sure an admin key exists. With SWITCHYARD_ADMIN_KEY set, that key is registered (and a
 * previous bootstrap key that differs is revoked, so rotating the variable rotates the key).
 * Without it, and with no admin key at all, one is generated; the caller prints it once.
 */
export async function ensureAdminKey(store: Store, configured: string | undefined): Promise<{ generated?: string }> {
  if (!(await store.getOrg(ADMIN_ORG))) {
    await store.createOrg({ id: ADMIN_ORG, name: 'Operators', created_at: nowSeconds() });
  }
  if (configured !== undefined) {
    const parsed = parseKey(configured);
    if (!parsed) throw new Error('SWITCHYARD_ADMIN_KEY must be 16 to 512 printable characters without spaces');
    const existing = await store.getKey(parsed.id);
    if (existing && (existing.revoked_at !== null || !secretMatches(parsed.secret, existing.hash))) {
      throw new Error('SWITCHYARD_ADMIN_KEY names a key that was revoked; choose a new value');
    }
    if (!existing) {
      await store.createKey({
        id: parsed.id,
        org_id: ADMIN_ORG,
        name: BOOTSTRAP_KEY_NAME,
        role: 'admin',
        hash: sha256Hex(parsed.secret),
        created_at: nowSeconds(),
        revoked_at: null,
      });
    }
    // The previous configured key is revoked once the new one exists: the store never revokes the
    // last admin key, and nothing is revoked when the new value is refused above.
    for (const k of await store.listKeys(ADMIN_ORG)) {
      if (k.name === BOOTSTRAP_KEY_NAME && k.id !== parsed.id && k.revoked_at === null) await store.revokeKey(k.id, nowSeconds());
    }
    return {};
  }
  if ((await store.countActiveAdminKeys()) > 0) return {};
  const created = await createKey(store, { org: ADMIN_ORG, name: BOOTSTRAP_KEY_NAME, role: 'admin' });
  return { generated: created.key };
}
