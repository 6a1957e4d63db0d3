import { Redis } from 'ioredis';
import { ApiError } from './errors.js';
import type { Limits, Store } from '../store/store.js';
import type { Metrics } from './metrics.js';

/** Windowed counters: in this process, or in Redis when several instances must share them. */
export interface Counters {
  /** Adds to the counter and returns its new value; a new counter expires after `ttlMs`. */
  add(key: string, amount: number, ttlMs: number): Promise<number>;
  get(key: string): Promise<number | undefined>;
  /** Sets the counter unless it exists; returns its value now. */
  init(key: string, value: number, ttlMs: number): Promise<number>;
  close(): Promise<void>;
}

export class MemoryCounters implements Counters {
  private readonly map = new Map<string, { value: number; expires: number }>();
  private readonly timer = setInterval(() => {
    const now = Date.now();
    for (const [k, v] of this.map) if (v.expires <= now) this.map.delete(k);
  }, 30_000).unref();

  private live(key: string): { value: number; expires: number } | undefined {
    const e = this.map.get(key);
    return e && e.expires > Date.now() ? e : undefined;
  }

  async add(key: string, amount: number, ttlMs: number): Promise<number> {
    const e = this.live(key) ?? { value: 0, expires: Date.now() + ttlMs };
    e.value += amount;
    this.map.set(key, e);
    return e.value;
  }

  async get(key: string): Promise<number | undefined> {
    return this.live(key)?.value;
  }

  async init(key: string, value: number, ttlMs: number): Promise<number> {
    const e = this.live(key);
    if (e) return e.value;
    this.map.set(key, { value, expires: Date.now() + ttlMs });
    return value;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
  }
}

/** One Lua script per operation, so each is atomic across every instance on the same Redis. */
const ADD = `local v = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return v`;

export class RedisCounters implements Counters {
  private readonly redis: Redis;

  constructor(url: string) {
    this.redis = new Redis(url, { maxRetriesPerRequest: 2, enableOfflineQueue: true, lazyConnect: false });
  }

  async add(key: string, amount: number, ttlMs: number): Promise<number> {
    return Number(await this.redis.eval(ADD, 1, `switchyard:${key}`, amount, ttlMs));
  }

  async get(key: string): Promise<number | undefined> {
    const v = await this.redis.get(`switchyard:${key}`);
    return v === null ? undefined : Number(v);
  }

  async init(key: string, value: number, ttlMs: number): Promise<number> {
    await this.redis.set(`switchyard:${key}`, String(value), 'PX', ttlMs, 'NX');
    return Number((await this.redis.get(`switchyard:${key}`)) ?? value);
  }

  async close(): Promise<void> {
    await this.redis.quit().catch(() => undefined);
  }
}

export interface Limited {
  keyId: string;
  orgId: string;
  keyLimits: Limits | null;
  orgLimits: Limits | null;
}

export interface Admission {
  /** x-ratelimit-* headers for the reply (the tighter of the key's and the organization's). */
  headers: Record<string, string>;
  /**
   * Called once the request ended, with what it used (later calls are ignored): tokens and spend are
   * counted, and the budget reservation made at admission is given back.
   */
  settle(tokens: number, cost: number | null): void;
}

const NO_LIMITS: Admission = { headers: {}, settle: () => undefined };

const MINUTE = 60_000;

function periodStart(period: 'day' | 'month', now: Date): number {
  return period === 'day'
    ? Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate())
    : Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1);
}

function periodEnd(period: 'day' | 'month', start: number): number {
  const d = new Date(start);
  return period === 'day' ? start + 86_400_000 : Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}

interface Scope {
  scope: 'key' | 'org';
  id: string;
  limits: Limits;
}

/**
 * Per-key and per-organization limits: requests and tokens per minute (fixed one-minute windows),
 * a spend budget per day or month, and an allowed-models list. Requests are counted when admitted;
 * tokens when the request ends (they are not known before). Spend is reserved at admission at the
 * request's worst case and settled to what it really cost when it ends.
 */
export class Limiter {
  constructor(
    private readonly counters: Counters,
    private readonly store: Store,
    private readonly metrics: Metrics,
  ) {}

  /**
   * `worstCase` gives the most the request can cost (its input and its largest possible output at
   * the model's prices; null when unpriced); it is asked only when a budget applies. That amount is
   * added to the spend counters at admission, so concurrent requests see each other's spend before
   * it happens: a budget is overshot at most by the worst cases of requests admitted while it still
   * had room, instead of by everything in flight.
   */
  async admit(who: Limited, model: string, worstCase: () => number | null = () => null): Promise<Admission> {
    if (who.keyLimits === null && who.orgLimits === null) return NO_LIMITS;
    const scopes: Scope[] = [];
    if (who.keyLimits) scopes.push({ scope: 'key', id: who.keyId, limits: who.keyLimits });
    if (who.orgLimits) scopes.push({ scope: 'org', id: who.orgId, limits: who.orgLimits });
    for (const { scope, limits } of scopes) {
      if (limits.models && !limits.models.includes(model)) {
        throw new ApiError('model_not_allowed', `This ${scope === 'key' ? 'API key' : 'organization'} may not use the model '${model}'.`, {
          param: 'model',
        });
      }
    }

    const now = Date.now();
    const minute = Math.floor(now / MINUTE);
    const resetS = Math.max(1, Math.ceil(((minute + 1) * MINUTE - now) / 1000));
    let tightestRequests: { limit: number; remaining: number } | undefined;
    let tightestTokens: { limit: number; remaining: number } | undefined;
    const reserve = scopes.some((s) => s.limits.budget !== undefined) ? Math.max(0, worstCase() ?? 0) : 0;
    /** Budget counters that hold this request's reservation, with their time to live. */
    const reserved: Array<{ key: string; ttlMs: number }> = [];
    const giveBack = (amount: number) => {
      for (const r of reserved) if (amount !== 0) void this.counters.add(r.key, amount, r.ttlMs).catch(() => undefined);
    };

    try {
      for (const { scope, id, limits } of scopes) {
        if (limits.rpm !== undefined) {
          const n = await this.counters.add(`rpm:${scope}:${id}:${minute}`, 1, 2 * MINUTE);
          const remaining = Math.max(0, limits.rpm - n);
          if (!tightestRequests || remaining < tightestRequests.remaining) tightestRequests = { limit: limits.rpm, remaining };
          if (n > limits.rpm)
            this.reject('requests', scope, limits.rpm, resetS, {
              'x-ratelimit-limit-requests': String(limits.rpm),
              'x-ratelimit-remaining-requests': '0',
              'x-ratelimit-reset-requests': `${resetS}s`,
            });
        }
        if (limits.tpm !== undefined) {
          const used = (await this.counters.get(`tpm:${scope}:${id}:${minute}`)) ?? 0;
          const remaining = Math.max(0, limits.tpm - used);
          if (!tightestTokens || remaining < tightestTokens.remaining) tightestTokens = { limit: limits.tpm, remaining };
          if (used >= limits.tpm)
            this.reject('tokens', scope, limits.tpm, resetS, {
              'x-ratelimit-limit-tokens': String(limits.tpm),
              'x-ratelimit-remaining-tokens': '0',
              'x-ratelimit-reset-tokens': `${resetS}s`,
            });
        }
        if (limits.budget !== undefined) {
          const period = limits.budget_period ?? 'month';
          const start = periodStart(period, new Date(now));
          const end = periodEnd(period, start);
          const key = `spend:${scope}:${id}:${start}`;
          let spent =
            (await this.counters.get(key)) ?? (await this.counters.init(key, await this.store.spentSince(scope, id, start), end - now));
          if (spent < limits.budget && reserve > 0) {
            // The counter's value before this add is what was spent and reserved by others.
            const total = await this.counters.add(key, reserve, end - now);
            reserved.push({ key, ttlMs: end - now });
            spent = total - reserve;
          }
          if (spent >= limits.budget) {
            this.metrics.rateLimited.inc({ limit: 'budget' });
            throw new ApiError(
              'budget_exceeded',
              `The ${scope === 'key' ? 'API key' : 'organization'} has used its budget of $${limits.budget} for this ${period}.`,
              {
                retryAfterMs: end - now,
                final: true,
              },
            );
          }
        }
      }
    } catch (err) {
      giveBack(-reserve);
      throw err;
    }

    const headers: Record<string, string> = {};
    if (tightestRequests) {
      headers['x-ratelimit-limit-requests'] = String(tightestRequests.limit);
      headers['x-ratelimit-remaining-requests'] = String(tightestRequests.remaining);
      headers['x-ratelimit-reset-requests'] = `${resetS}s`;
    }
    if (tightestTokens) {
      headers['x-ratelimit-limit-tokens'] = String(tightestTokens.limit);
      headers['x-ratelimit-remaining-tokens'] = String(tightestTokens.remaining);
      headers['x-ratelimit-reset-tokens'] = `${resetS}s`;
    }
    let settled = false;
    return {
      headers,
      settle: (tokens, cost) => {
        if (settled) return;
        settled = true;
        // The reservation becomes what the request really cost (an unpriced request costs nothing here).
        giveBack((cost ?? 0) - reserve);
        for (const { scope, id, limits } of scopes) {
          if (limits.tpm !== undefined && tokens > 0)
            void this.counters.add(`tpm:${scope}:${id}:${minute}`, tokens, 2 * MINUTE).catch(() => undefined);
          if (limits.budget !== undefined && cost && reserve === 0) {
            const period = limits.budget_period ?? 'month';
            const start = periodStart(period, new Date(now));
            void this.counters.add(`spend:${scope}:${id}:${start}`, cost, periodEnd(period, start) - Date.now()).catch(() => undefined);
          }
        }
      },
    };
  }

  private reject(kind: 'requests' | 'tokens', scope: string, limit: number, resetS: number, headers: Record<string, string>): never {
    this.metrics.rateLimited.inc({ limit: kind === 'requests' ? 'rpm' : 'tpm' });
    throw new ApiError(
      'rate_limit_exceeded',
      `Rate limit reached for ${scope === 'key' ? 'this API key' : 'this organization'}: ${limit} ${kind} per minute. Try again in ${resetS}s.`,
      {
        retryAfterMs: resetS * 1000,
        headers,
      },
    );
  }
}
