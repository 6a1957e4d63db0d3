import type { FastifyBaseLogger } from 'fastify';
import pino, { type Bindings, type ChildLoggerOptions } from 'pino';

const LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
type Level = (typeof LEVELS)[number];
type LogMethod = (this: FastifyBaseLogger, ...args: unknown[]) => void;

// The log methods, one per level, are put on the prototype below.
export interface RequestLogger extends Pick<FastifyBaseLogger, Level> {}

/**
 * A request's logger (`req.log`), which becomes pino's child logger (the request id bound) the first
 * time the request logs something. Fastify makes a child per request, and pino's child copies the
 * parent and serializes the binding: about 4k instructions per request under callgrind. Most
 * requests log nothing but their access line, which is written without it (http/access-log.ts).
 * What a request does log is written exactly as by the child it stands for, which also decides
 * what its level lets through.
 */
export class RequestLogger implements FastifyBaseLogger {
  /** The child, once made. */
  made: FastifyBaseLogger | undefined;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildLoggerOptions,
  ) {}

  /** The child logger, made now if not yet. */
  pinoChild(): FastifyBaseLogger {
    return (this.made ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    return this.made?.level ?? this.options.level ?? this.parent.level;
  }

  set level(level: string) {
    this.pinoChild().level = level;
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.pinoChild().child(bindings, options);
  }
}

/** pino's level values: a call below the logger's level is dropped without making the child (pino's method for it does nothing). */
const VALUES: Readonly<Record<string, number>> = { ...pino.levels.values, silent: Infinity };

for (const level of LEVELS) {
  if (level === 'silent') {
    // pino's `silent` does nothing, at any level.
    RequestLogger.prototype.silent = (): void => undefined;
    continue;
  }
  const value = VALUES[level]!;
  RequestLogger.prototype[level] = function (this: RequestLogger, ...args: unknown[]): void {
    if (!this.made) {
      const at = VALUES[this.level];
      // A level pino does not have by default (a custom one) is left to the child to judge.
      if (at !== undefined && value < at) return;
    }
    const child = this.pinoChild();
    (child[level] as LogMethod).apply(child, args);
  } as FastifyBaseLogger[Level];
}

/** Fastify's `childLoggerFactory`: the request's logger, made a child only when used. */
export function requestLogger(
  this: unknown,
  logger: FastifyBaseLogger,
  bindings: Bindings,
  options: ChildLoggerOptions,
): FastifyBaseLogger {
  return new RequestLogger(logger, bindings, options);
}
