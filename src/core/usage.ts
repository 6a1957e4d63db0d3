import type { Principal } from './principal.js';
import type { Store, UsageFilter, UsageGroup, UsageTotal } from '../store/store.js';

/**
 * Usage totals every key may read of itself (`GET /v1/usage`): its own records only, whatever else the
 * filter narrows by. A filter naming another key can match nothing; one naming another organization
 * matches nothing either, since the key's records all carry its own. Admins read everyone's through
 * the admin API.
 */
export function ownUsageTotals(store: Store, who: Principal, groupBy: UsageGroup, filter: UsageFilter): Promise<UsageTotal[]> {
  if (filter.key !== undefined && filter.key !== who.keyId) return Promise.resolve([]);
  return store.usageTotals(groupBy, { ...filter, key: who.keyId });
}
