import type { Logger } from 'pino';

export interface HealthPolicy {
  /** Consecutive failures that eject a deployment. */
  failures: number;
  /** How long an ejected deployment stays out unless a health check brings it back sooner. */
  ejectMs: number;
  /** How often an ejected deployment is probed. */
  probeIntervalMs: number;
}

interface State {
  failures: number;
  ejectedUntil: number;
  /** The upstream asked us to wait (429 retry-after) until then. */
  coolUntil: number;
  probe: NodeJS.Timeout | undefined;
}

export type Standing = 'up' | 'ejected' | 'cooling';

/**
 * Circuit breaker per deployment. `failures` consecutive failures eject it; while out it is probed
 * every `probeIntervalMs` and comes back on the first healthy answer, or after `ejectMs` on trial
 * (one more failure ejects it again). A 429 with retry-after cools it for that long. Ejected and
 * cooling deployments are tried only when nothing else is left.
 */
export class DeploymentHealth {
  private readonly states = new Map<string, State>();

  constructor(
    private readonly policy: HealthPolicy,
    /** True when the deployment answers its health check. */
    private readonly probe: (id: string) => Promise<boolean>,
    private readonly log: Logger,
    private readonly onChange?: (id: string, up: boolean) => void,
  ) {}

  private state(id: string): State {
    let s = this.states.get(id);
    if (!s) {
      s = { failures: 0, ejectedUntil: 0, coolUntil: 0, probe: undefined };
      this.states.set(id, s);
    }
    return s;
  }

  standing(id: string, now = Date.now()): Standing {
    const s = this.states.get(id);
    if (!s) return 'up';
    if (s.ejectedUntil > now) return 'ejected';
    if (s.coolUntil > now) return 'cooling';
    return 'up';
  }

  /** Milliseconds until a cooling deployment may be used again (0 when it may now). */
  coolingFor(id: string, now = Date.now()): number {
    return Math.max(0, (this.states.get(id)?.coolUntil ?? 0) - now);
  }

  success(id: string): void {
    const s = this.states.get(id);
    if (!s || (s.failures === 0 && s.ejectedUntil === 0)) return;
    this.restore(id, s, 'deployment answered; back in rotation');
  }

  failure(id: string, now = Date.now()): void {
    const s = this.state(id);
    s.failures += 1;
    if (s.failures < this.policy.failures || s.ejectedUntil > now) return;
    s.ejectedUntil = now + this.policy.ejectMs;
    this.log.warn({ deployment: id, failures: s.failures, for_ms: this.policy.ejectMs }, 'deployment ejected after consecutive failures');
    this.onChange?.(id, false);
    this.startProbing(id, s);
  }

  rateLimited(id: string, retryAfterMs: number, now = Date.now()): void {
    this.state(id).coolUntil = now + retryAfterMs;
  }

  private restore(id: string, s: State, message: string): void {
    const wasOut = s.ejectedUntil !== 0;
    s.failures = 0;
    s.ejectedUntil = 0;
    if (s.probe) clearInterval(s.probe);
    s.probe = undefined;
    if (wasOut) {
      this.log.info({ deployment: id }, message);
      this.onChange?.(id, true);
    }
  }

  private startProbing(id: string, s: State): void {
    if (s.probe) return;
    let running = false;
    s.probe = setInterval(() => {
      if (running) return;
      running = true;
      this.probe(id)
        .then(
          (ok) => {
            // After ejectMs the deployment is on trial anyway; probing goes on until something answers.
            if (ok && s.probe) this.restore(id, s, 'deployment passed its health check; back in rotation');
          },
          () => undefined,
        )
        .finally(() => {
          running = false;
        });
    }, this.policy.probeIntervalMs);
    s.probe.unref();
  }

  /** Forgets deployments that no longer exist. */
  retain(ids: ReadonlySet<string>): void {
    for (const [id, s] of this.states) {
      if (ids.has(id)) continue;
      if (s.probe) clearInterval(s.probe);
      this.states.delete(id);
    }
  }

  close(): void {
    this.retain(new Set());
  }
}

/**
 * Retries allowed: 10 per second plus `ratio` of the requests seen over the last ~10 s, so a
 * failing upstream gets at most that much extra traffic (the Envoy/Finagle retry-budget idea).
 */
export class RetryBudget {
  private window = 0;
  private requests = [0, 0];
  private retries = [0, 0];

  constructor(
    private readonly ratio: number,
    private readonly perSecond = 10,
    private readonly windowMs = 10_000,
  ) {}

  private roll(now: number): void {
    const w = Math.floor(now / this.windowMs);
    if (w === this.window) return;
    const fresh = w - this.window;
    this.requests = fresh === 1 ? [this.requests[1]!, 0] : [0, 0];
    this.retries = fresh === 1 ? [this.retries[1]!, 0] : [0, 0];
    this.window = w;
  }

  request(now = Date.now()): void {
    this.roll(now);
    this.requests[1]! += 1;
  }

  /** Takes one retry from the budget; false when it is spent. */
  tryRetry(now = Date.now()): boolean {
    this.roll(now);
    const allowed = this.perSecond * (this.windowMs / 1000) + this.ratio * (this.requests[0]! + this.requests[1]!);
    if (this.retries[0]! + this.retries[1]! >= allowed) return false;
    this.retries[1]! += 1;
    return true;
  }
}
