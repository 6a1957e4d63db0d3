import { Redis } from 'ioredis';
import { ApiError } from './errors.js';
import type { Limits, Store } from '../store/store.js';
import type { Metrics } from './metrics.js';

/** A value now (a local counter) or later (a shared one). */
export type Maybe<T> = T | Promise<T>;

/**
 * Runs `then` on a value now when it is known now, else once it resolves: admission against local
 * counters is synchronous, with no promise per step (it runs on every request with limits).
 */
function when<T, R>(value: Maybe<T>, then: (v: T) => Maybe<R>): Maybe<R> {
  return value instanceof Promise ? value.then(then) : then(value);
}

/** A counter update whose answer nobody waits for: a failed shared write is dropped, not thrown. */
function background(value: Maybe<number>): void {
  if (value instanceof Promise) value.catch(() => undefined);
}

/**
 * Windowed counters: in this process (answered synchronously), or shared by several instances in
 * Redis or by the workers of a cluster through their primary (answered with a promise).
 */
export interface Counters {
  /** Adds to the counter and returns its new value; a new counter expires after `ttlMs`. */
  add(key: string, amount: number, ttlMs: number): Maybe<number>;
  get(key: string): Maybe<number | undefined>;
  /** Sets the counter unless it exists; returns its value now. */
  init(key: string, value: number, ttlMs: number): Maybe<number>;
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

  add(key: string, amount: number, ttlMs: number): number {
    const e = this.live(key) ?? { value: 0, expires: Date.now() + ttlMs };
    e.value += amount;
    this.map.set(key, e);
    return e.value;
  }

  get(key: string): number | undefined {
    return this.live(key)?.value;
  }

  init(key: string, value: number, ttlMs: number): number {
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
const INIT = `redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
return redis.call('GET', KEYS[1])`;

/** The scripts as commands of the client (ioredis `defineCommand`: EVALSHA, and EVAL once when Redis lacks the script). */
interface CounterScripts {
  switchyardAdd(key: string, amount: number, ttlMs: number): Promise<string>;
  switchyardInit(key: string, value: number, ttlMs: number): Promise<string | null>;
}

export class RedisCounters implements Counters {
  private readonly redis: Redis & CounterScripts;

  /** `onError`: ioredis's connection errors (it reconnects by itself) and commands Redis refused, for the log. */
  constructor(
    url: string,
    private readonly onError: (err: Error) => void = () => undefined,
  ) {
    // Auto-pipelining sends the commands of one event-loop turn in one write: under load a turn
    // admits several requests, each with two or three counter operations. The scripts go by their
    // SHA, not their text, on every call. No offline queue: while the connection is down a command
    // fails at once (see `failed`), rather than each request of a limited key waiting out
    // ioredis's reconnection (3–5 s) and then failing, or, queued and given up on, being applied
    // once Redis is back (a counter raised for a request that was refused). No command timeout,
    // for the same reason: a command sent may have been applied, and only its answer says so.
    const redis = new Redis(url, {
      maxRetriesPerRequest: 2,
      enableOfflineQueue: false,
      lazyConnect: false,
      enableAutoPipelining: true,
    });
    redis.on('error', onError);
    redis.defineCommand('switchyardAdd', { numberOfKeys: 1, lua: ADD });
    redis.defineCommand('switchyardInit', { numberOfKeys: 1, lua: INIT });
    this.redis = redis as Redis & CounterScripts;
  }

  /** Resolves once connected (commands before that would fail: there is no offline queue). */
  ready(timeoutMs = 10_000): Promise<void> {
    if (this.redis.status === 'ready') return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('cannot reach Redis for the limit counters (REDIS_URL)')), timeoutMs);
      this.redis.once('ready', () => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /**
   * Redis did not answer, or refused the command: the request of a key or organization with limits
   * is refused with a 503 and a retry-after, not admitted uncounted (limits and budgets are promises
   * to whoever set them) and not a 500. Keys without limits never reach Redis and are served as usual.
   */
  private readonly failed = (err: unknown): never => {
    const down = this.redis.status !== 'ready';
    if (!down && err instanceof Error) this.onError(err);
    throw new ApiError(
      'service_unavailable',
      down
        ? 'The shared limits store (Redis) cannot be reached; try again shortly.'
        : 'The shared limits store (Redis) failed; try again shortly.',
      { retryAfterMs: 5000 },
    );
  };

  async add(key: string, amount: number, ttlMs: number): Promise<number> {
    return Number(await this.redis.switchyardAdd(`switchyard:${key}`, amount, ttlMs).catch(this.failed));
  }

  async get(key: string): Promise<number | undefined> {
    const v = await this.redis.get(`switchyard:${key}`).catch(this.failed);
    return v === null ? undefined : Number(v);
  }

  async init(key: string, value: number, ttlMs: number): Promise<number> {
    return Number((await this.redis.switchyardInit(`switchyard:${key}`, value, ttlMs).catch(this.failed)) ?? value);
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

/** The most a request can use: tokens (its estimated input and largest output), and their cost (null when unpriced). */
export interface WorstCase {
  tokens: number;
  cost: number | null;
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

/** A scope's counter names in one minute window. */
interface MinuteNames {
  rpm: string;
  rpmCount: string;
  tpm: string;
}

/** One request's admission while its limits are checked. */
interface Admitting {
  scopes: Scope[];
  now: number;
  minute: number;
  /** Seconds to the next minute window. */
  resetS: number;
  /** The worst-case cost reserved against each budget (0 without a budget or a price). */
  reserve: number;
  /** Budget counters that hold the reservation, with their time to live. */
  reserved: Array<{ key: string; ttlMs: number }>;
  /** For each budget, the window's counter of what requests in flight hold that this one is in (see HELD_WINDOW_MS). */
  holds: Array<{ key: string; held: string }>;
  /** The most tokens the request can use (its estimated input and largest output), reserved against each tpm limit. */
  tokenReserve: number;
  /** Token counters that hold that reservation. */
  tokensReserved: string[];
  /** Request counters this request was added to (taken back if a later limit refuses it). */
  counted: string[];
  /** A count of input tokens (nothing generated): its own requests-per-minute counter, and no token or spend limit. */
  countOnly: boolean;
  /** The tightest request and token limits seen, for the x-ratelimit-* headers. */
  requests?: { limit: number; remaining: number };
  tokens?: { limit: number; remaining: number };
}

/**
 * What requests in flight hold of each budget (their worst-case reservations) is counted beside the
 * budget's counter, shared as it is (Redis, or a cluster's primary), so that a budget refused only
 * for what they hold is refused for now (retry when they end) in every process, not for the rest of
 * the period. Holds are counted by ten-minute window: a request adds its hold to the current
 * window's counter, its process moves it into each new window while it runs (`moveHolds`, every
 * minute), and it takes it back when it ends. Holds are read from the current and the last window,
 * and a window's counter expires after two, so a hold whose process died (nobody moves it or takes
 * it back) is forgotten within twenty minutes.
 */
const HELD_WINDOW_MS = 10 * MINUTE;
const HELD_TTL_MS = 2 * HELD_WINDOW_MS;
const heldCounter = (key: string, window: number): string => `held:${key}:${window}`;
const heldKey = (key: string, now: number): string => heldCounter(key, Math.floor(now / HELD_WINDOW_MS));

/**
 * Per-key and per-organization limits: requests and tokens per minute (fixed one-minute windows),
 * a spend budget per day or month, and an allowed-models list. Requests are counted when admitted
 * (and not at all when a limit refuses them). Tokens and spend are reserved at admission at the
 * request's worst case and settled to what it really used when it ends, so that concurrent
 * requests see each other before they finish: 50 requests at once against a 100-token limit are
 * not all admitted because none has ended yet.
 */
export class Limiter {
  /** Counter names by scope and id, for the current minute window only (cleared when it ends). */
  private readonly names = { key: new Map<string, MinuteNames>(), org: new Map<string, MinuteNames>() };
  private namesMinute = 0;

  /** This process's requests in flight that hold some of a budget (their holds move with the windows). */
  private readonly holding = new Set<Admitting>();

  constructor(
    private readonly counters: Counters,
    private readonly store: Store,
    private readonly metrics: Metrics,
  ) {
    setInterval(() => this.moveHolds(), MINUTE).unref();
  }

  /**
   * The counter names of a scope's minute window, built once a minute rather than per request: a
   * name built anew is a new string, whose hash each lookup in the local counters' Map computed
   * again (about 2k instructions a lookup). A request settling after its window ended gets its
   * names built, not cached.
   */
  private namesOf(scope: 'key' | 'org', id: string, minute: number): MinuteNames {
    if (minute > this.namesMinute) {
      this.names.key.clear();
      this.names.org.clear();
      this.namesMinute = minute;
    }
    const byId = this.names[scope];
    let n = minute === this.namesMinute ? byId.get(id) : undefined;
    if (n === undefined) {
      n = { rpm: `rpm:${scope}:${id}:${minute}`, rpmCount: `rpm-count:${scope}:${id}:${minute}`, tpm: `tpm:${scope}:${id}:${minute}` };
      if (minute === this.namesMinute) byId.set(id, n);
    }
    return n;
  }

  /**
   * `worstCase` gives the most the request can use: its estimated input and largest possible output
   * in tokens, and what they cost at the model's prices (null when unpriced); it is asked once, only
   * when a tpm limit or a budget applies. Those amounts are added to the token and spend counters at
   * admission, so concurrent requests see each other before they finish: a limit is overshot at most
   * by the worst cases of requests admitted while it still had room, instead of by everything in
   * flight. A `count` (of input tokens, nothing generated) has its own requests-per-minute counter
   * and no token or spend limit. With local counters the answer is synchronous.
   */
  admit(who: Limited, model: string, worstCase?: () => WorstCase, kind: 'generation' | 'count' = 'generation'): Maybe<Admission> {
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
    const a: Admitting = {
      scopes,
      now,
      minute,
      resetS: Math.max(1, Math.ceil(((minute + 1) * MINUTE - now) / 1000)),
      reserve: 0,
      reserved: [],
      holds: [],
      tokenReserve: 0,
      tokensReserved: [],
      counted: [],
      countOnly: kind === 'count',
    };
    if (worstCase && !a.countOnly) {
      const budget = scopes.some((s) => s.limits.budget !== undefined);
      const tpm = scopes.some((s) => s.limits.tpm !== undefined);
      if (budget || tpm) {
        const worst = worstCase();
        if (budget) a.reserve = Math.max(0, worst.cost ?? 0);
        if (tpm) a.tokenReserve = Math.max(0, Math.ceil(worst.tokens));
      }
    }
    const refused = (err: unknown): never => {
      // The reservation goes before the hold that explains it, so that no process reads a reservation without its hold.
      this.giveBack(a, -a.reserve);
      this.release(a);
      this.giveBackTokens(a, -a.tokenReserve);
      for (const key of a.counted) background(this.counters.add(key, -1, 2 * MINUTE));
      throw err;
    };
    let checked: Maybe<void>;
    try {
      checked = this.check(a, 0);
    } catch (err) {
      return refused(err);
    }
    return checked instanceof Promise ? checked.then(() => this.admitted(a), refused) : this.admitted(a);
  }

  /** The limits of scope `i` and then of the ones after it, in order (rpm, tpm, budget). */
  private check(a: Admitting, i: number): Maybe<void> {
    const s = a.scopes[i];
    if (s === undefined) return;
    const { scope, id, limits } = s;
    const names = this.namesOf(scope, id, a.minute);
    const tokensKey = names.tpm;
    const tpm = () => {
      if (limits.tpm === undefined) return undefined;
      if (a.tokenReserve <= 0) return when(this.counters.get(tokensKey), (used) => this.checkTokens(a, s, used ?? 0));
      // The counter's value before this add is what was used and reserved by others.
      return when(this.counters.add(tokensKey, a.tokenReserve, 2 * MINUTE), (total) => {
        a.tokensReserved.push(tokensKey);
        this.checkTokens(a, s, total - a.tokenReserve, total);
      });
    };
    const rest = () => (a.countOnly ? this.check(a, i + 1) : when(tpm(), () => when(this.checkBudget(a, s), () => this.check(a, i + 1))));
    if (limits.rpm === undefined) return rest();
    const requestsKey = a.countOnly ? names.rpmCount : names.rpm;
    return when(this.counters.add(requestsKey, 1, 2 * MINUTE), (n) => {
      a.counted.push(requestsKey);
      this.checkRequests(a, s, n);
      return rest();
    });
  }

  private checkRequests(a: Admitting, { scope, limits }: Scope, n: number): void {
    const rpm = limits.rpm!;
    const remaining = Math.max(0, rpm - n);
    if (!a.requests || remaining < a.requests.remaining) a.requests = { limit: rpm, remaining };
    if (n > rpm)
      this.reject('requests', scope, rpm, a.resetS, {
        'x-ratelimit-limit-requests': String(rpm),
        'x-ratelimit-remaining-requests': '0',
        'x-ratelimit-reset-requests': `${a.resetS}s`,
      });
  }

  /**
   * Admits on what others used and reserved (`used`), and reports what is left once this request's
   * own reservation is counted (`withThis`), as `x-ratelimit-remaining-requests` counts the request itself.
   */
  private checkTokens(a: Admitting, { scope, limits }: Scope, used: number, withThis = used): void {
    const tpm = limits.tpm!;
    const remaining = Math.max(0, tpm - withThis);
    if (!a.tokens || remaining < a.tokens.remaining) a.tokens = { limit: tpm, remaining };
    if (used >= tpm)
      this.reject('tokens', scope, tpm, a.resetS, {
        'x-ratelimit-limit-tokens': String(tpm),
        'x-ratelimit-remaining-tokens': '0',
        'x-ratelimit-reset-tokens': `${a.resetS}s`,
      });
  }

  /** The spend so far (read from the database once per period), then this request's reservation. */
  private checkBudget(a: Admitting, { scope, id, limits }: Scope): Maybe<void> {
    const budget = limits.budget;
    if (budget === undefined) return;
    const period = limits.budget_period ?? 'month';
    const start = periodStart(period, new Date(a.now));
    const ttlMs = periodEnd(period, start) - a.now;
    const key = `spend:${scope}:${id}:${start}`;
    const spentSoFar = when(this.counters.get(key), (v) =>
      v !== undefined ? v : this.store.spentSince(scope, id, start).then((spent) => this.counters.init(key, spent, ttlMs)),
    );
    /** `spent`: what the counter says was spent and reserved by others (this request's own reservation left out: `mine`). */
    const over = (spent: number, mine: number): Maybe<void> => {
      if (spent < budget) return;
      this.metrics.rateLimited.inc({ limit: 'budget' });
      const who = scope === 'key' ? 'API key' : 'organization';
      // Refused only for what requests in flight hold (each its worst case), in any process: for now.
      return when(this.heldNow(key, a.now), (held) => {
        if (spent - Math.max(0, held - mine) < budget) {
          throw new ApiError(
            'budget_exceeded',
            `The ${who}'s budget of $${budget} for this ${period} is held by requests in progress, each for the most it may cost; try again when they finish.`,
            { retryAfterMs: 1000 },
          );
        }
        throw new ApiError('budget_exceeded', `The ${who} has used its budget of $${budget} for this ${period}.`, {
          retryAfterMs: ttlMs,
          final: true,
        });
      });
    };
    return when(spentSoFar, (spent) => {
      if (spent >= budget || a.reserve <= 0) return over(spent, 0);
      // The hold first: a process that reads the reservation below finds the hold that explains it
      // (one client's commands arrive in order, in Redis and through a cluster's primary).
      this.hold(a, key);
      // The counter's value before this add is what was spent and reserved by others.
      return when(this.counters.add(key, a.reserve, ttlMs), (total) => {
        a.reserved.push({ key, ttlMs });
        return over(total - a.reserve, a.reserve);
      });
    });
  }

  private hold(a: Admitting, key: string): void {
    const held = heldKey(key, Date.now());
    a.holds.push({ key, held });
    this.holding.add(a);
    background(this.counters.add(held, a.reserve, HELD_TTL_MS));
  }

  /**
   * Moves the holds of this process's requests in flight into the current window once a window
   * ends, so that a request holds for as long as it runs: only holds nobody moves (their process
   * died) are left to expire with their window.
   */
  private moveHolds(): void {
    const now = Date.now();
    for (const a of this.holding) {
      for (const h of a.holds) {
        const current = heldKey(h.key, now);
        if (current === h.held) continue;
        background(this.counters.add(current, a.reserve, HELD_TTL_MS));
        background(this.counters.add(h.held, -a.reserve, HELD_TTL_MS));
        h.held = current;
      }
    }
  }

  /** What requests in flight hold of a budget counter, in every process sharing the counters (this window's and the last one's). */
  private heldNow(key: string, now: number): Maybe<number> {
    const window = Math.floor(now / HELD_WINDOW_MS);
    return when(this.counters.get(heldCounter(key, window)), (current) =>
      when(this.counters.get(heldCounter(key, window - 1)), (last) => (current ?? 0) + (last ?? 0)),
    );
  }

  /** This request no longer holds its reservations (it ended, or was refused). */
  private release(a: Admitting): void {
    if (a.holds.length === 0) return;
    this.holding.delete(a);
    for (const { held } of a.holds) background(this.counters.add(held, -a.reserve, HELD_TTL_MS));
    a.holds.length = 0;
  }

  /** Adds `amount` to every budget counter that holds this request's reservation. */
  private giveBack(a: Admitting, amount: number): void {
    if (amount === 0) return;
    for (const r of a.reserved) background(this.counters.add(r.key, amount, r.ttlMs));
  }

  /** Adds `amount` to every token counter that holds this request's reservation. */
  private giveBackTokens(a: Admitting, amount: number): void {
    if (amount === 0) return;
    for (const key of a.tokensReserved) background(this.counters.add(key, amount, 2 * MINUTE));
  }

  /** The admission of a request that passed every limit: its headers, and how it settles. */
  private admitted(a: Admitting): Admission {
    const headers: Record<string, string> = {};
    if (a.requests) {
      headers['x-ratelimit-limit-requests'] = String(a.requests.limit);
      headers['x-ratelimit-remaining-requests'] = String(a.requests.remaining);
      headers['x-ratelimit-reset-requests'] = `${a.resetS}s`;
    }
    if (a.tokens) {
      headers['x-ratelimit-limit-tokens'] = String(a.tokens.limit);
      headers['x-ratelimit-remaining-tokens'] = String(a.tokens.remaining);
      headers['x-ratelimit-reset-tokens'] = `${a.resetS}s`;
    }
    let settled = false;
    return {
      headers,
      settle: (tokens, cost) => {
        if (settled) return;
        settled = true;
        // The reservations become what the request really used (an unpriced request costs nothing
        // here), and then it no longer holds them.
        this.giveBack(a, (cost ?? 0) - a.reserve);
        this.release(a);
        this.giveBackTokens(a, tokens - a.tokenReserve);
        for (const { scope, id, limits } of a.scopes) {
          if (limits.tpm !== undefined && tokens > 0 && a.tokenReserve <= 0)
            background(this.counters.add(this.namesOf(scope, id, a.minute).tpm, tokens, 2 * MINUTE));
          if (limits.budget !== undefined && cost && a.reserve === 0) {
            const period = limits.budget_period ?? 'month';
            const start = periodStart(period, new Date(a.now));
            background(this.counters.add(`spend:${scope}:${id}:${start}`, cost, periodEnd(period, start) - Date.now()));
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
