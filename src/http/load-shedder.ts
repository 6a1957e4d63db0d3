import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';

export type ShedReason = 'in_flight' | 'event_loop';

/**
 * Decides when this process is too busy to take another request: too many in progress, or an event
 * loop that has fallen behind (p99 delay over the last second above the limit). Refusing early with
 * 503 and retry-after keeps memory and latency bounded for the requests already admitted.
 */
export class LoadShedder {
  inFlight = 0;
  private lagging = false;
  private readonly histogram: IntervalHistogram | undefined;
  private readonly timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly maxInFlight: number,
    maxEventLoopDelayMs: number,
  ) {
    if (maxEventLoopDelayMs > 0) {
      const h = monitorEventLoopDelay({ resolution: 10 });
      h.enable();
      this.histogram = h;
      this.timer = setInterval(() => {
        this.lagging = h.percentile(99) / 1e6 > maxEventLoopDelayMs;
        h.reset();
      }, 1000);
      this.timer.unref();
    }
  }

  /** Why a new request should be refused now, or undefined to take it. */
  refuse(): ShedReason | undefined {
    if (this.inFlight >= this.maxInFlight) return 'in_flight';
    return this.lagging ? 'event_loop' : undefined;
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.histogram?.disable();
  }
}
