/**
 * The cluster bus: what every process of the service (the workers of one instance, and every
 * instance on the same database) must learn at once. Caches stay per process for speed; the bus
 * invalidates them. Running responses live in the process that generates them; the bus lets any
 * other process follow, read or cancel one. Transports (IPC through the cluster's primary, Redis
 * pub/sub, PostgreSQL LISTEN/NOTIFY) are put together at start-up (src/bus.ts).
 */

/** The events of a response, as the Responses format makes them (opaque here). */
type WireEvents = unknown[];

export type BusMessage =
  /** A key was revoked or its limits changed: drop it from every key cache. */
  | { t: 'key'; id: string }
  /** An organization's limits changed. */
  | { t: 'org'; id: string }
  /** The catalogue or the stored deployments changed: reload them. */
  | { t: 'catalogue' }
  | { t: 'deployments' }
  /** Stop generating this response (cancel, delete); its owner answers `response.ended` once stored. */
  | { t: 'response.cancel'; id: string }
  /** A response stopped running on its owner, and its final state is stored. */
  | { t: 'response.ended'; id: string }
  /** `from` follows this response: its owner sends it every event from the first, then each as it comes. */
  | { t: 'response.watch'; id: string; from: string }
  /** Events `start`… of a response for the process `to`; `done` after the last. */
  | { t: 'response.events'; id: string; to: string; start: number; events: WireEvents; done: boolean }
  /** `from` asks the owner for the response object as it is now. */
  | { t: 'response.get'; id: string; from: string; nonce: number }
  | { t: 'response.snapshot'; id: string; to: string; nonce: number; resource: Record<string, unknown> };

export type BusHandler = (m: BusMessage) => void;

export interface ClusterBus {
  /** This process's name on the bus (messages addressed `to` it are its own). */
  readonly self: string;
  /** Sends to every other process of the service (not back to this one). */
  publish(m: BusMessage): void;
  subscribe(handler: BusHandler): () => void;
  close(): Promise<void>;
}

/**
 * A bus whose messages leave through `send` (a transport, or nothing for a lone process) and arrive
 * through `deliver`. Handlers run one by one; one that throws does not stop the others.
 */
export class ProcessBus implements ClusterBus {
  private readonly handlers = new Set<BusHandler>();

  constructor(
    readonly self: string,
    private readonly send: (m: BusMessage) => void = () => undefined,
    private readonly onClose: () => Promise<void> = async () => undefined,
  ) {}

  publish(m: BusMessage): void {
    this.send(m);
  }

  deliver(m: BusMessage): void {
    if ('to' in m && m.to !== this.self) return;
    for (const h of this.handlers) {
      try {
        h(m);
      } catch {
        // A handler's failure is its own; the bus carries on.
      }
    }
  }

  subscribe(handler: BusHandler): () => void {
    this.handlers.add(handler);
    return () => this.handlers.delete(handler);
  }

  close(): Promise<void> {
    this.handlers.clear();
    return this.onClose();
  }
}
