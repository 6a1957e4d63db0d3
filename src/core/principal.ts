import { ApiError } from './errors.js';
import { parseKey, secretMatches } from './keys.js';
import type { ApiKeyRecord, KeyRole, Limits, Org, Store } from '../store/store.js';

/** Who is calling: the key, its organization and role, and the limits both carry. */
export interface Principal {
  keyId: string;
  orgId: string;
  role: KeyRole;
  keyLimits: Limits | null;
  orgLimits: Limits | null;
}

interface CacheEntry {
  record: ApiKeyRecord | undefined;
  /** The record's stored hash (hex), lowercased once as secretMatches compares it. */
  hash: string | undefined;
  org: Org | undefined;
  expires: number;
}

const MAX_CACHE = 10_000;

/**
 * Turns a presented key into a principal. Key records are cached for a short TTL so the hot path
 * does not touch the database; revocation through this instance drops the entry at once, and
 * other instances see it within the TTL.
 */
export class KeyAuthenticator {
  private readonly cache = new Map<string, CacheEntry>();

  constructor(
    private readonly store: Store,
    private readonly ttlMs: number,
  ) {}

  /**
   * The principal for a presented key (undefined: none was presented; '': an unusable one), at once
   * when the key is cached, else a promise of it; a bad key throws (or rejects).
   */
  authenticate(token: string | undefined): Principal | Promise<Principal> {
    if (token === undefined) {
      throw new ApiError(
        'missing_api_key',
        "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' or as 'x-api-key: <key>'.",
      );
    }
    const parsed = token === '' ? undefined : parseKey(token);
    if (!parsed)
      throw new ApiError('invalid_api_key', "Malformed API key. Send it as 'Authorization: Bearer <key>' or as 'x-api-key: <key>'.");
    const hit = this.cache.get(parsed.id);
    if (hit && hit.expires > Date.now()) return this.check(hit, parsed.secret);
    return this.lookup(parsed.id).then((entry) => this.check(entry, parsed.secret));
  }

  private check({ record, hash, org }: CacheEntry, secret: string): Principal {
    if (!record || !hash || !secretMatches(secret, hash)) {
      throw new ApiError('invalid_api_key', 'Incorrect API key provided.');
    }
    if (record.revoked_at !== null) throw new ApiError('invalid_api_key', 'This API key has been revoked.');
    return { keyId: record.id, orgId: record.org_id, role: record.role, keyLimits: record.limits ?? null, orgLimits: org?.limits ?? null };
  }

  /** Drops every cached organization entry of this org (its limits changed). */
  invalidateOrg(orgId: string): void {
    for (const [id, e] of this.cache) if (e.record?.org_id === orgId) this.cache.delete(id);
  }

  invalidate(id: string): void {
    this.cache.delete(id);
  }

  private async lookup(id: string): Promise<CacheEntry> {
    const now = Date.now();
    const record = await this.store.getKey(id);
    const org = record ? await this.store.getOrg(record.org_id) : undefined;
    const entry = { record, hash: record?.hash.toLowerCase(), org, expires: now + this.ttlMs };
    if (this.ttlMs > 0) {
      if (this.cache.size >= MAX_CACHE) this.cache.delete(this.cache.keys().next().value!);
      this.cache.set(id, entry);
    }
    return entry;
  }
}
