import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions } from 'pino';

type LogMethod = (this: FastifyBaseLogger, obj: unknown, ...rest: unknown[]) => void;

/**
 * A request's logger (`req.log`), which becomes pino's child logger (the request id bound) the first
 * time the request logs something. Fastify makes a child per request, and pino's child copies the
 * parent and serializes the binding: about 4k instructions per request under callgrind. Most
 * requests log nothing but their access line, which is written without it (http/access-log.ts).
 * What a request does log is written exactly as by the child it stands for.
 */
export class RequestLogger implements FastifyBaseLogger {
  private made: FastifyBaseLogger | undefined;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildLoggerOptions,
  ) {}

  /** The child logger, made now if not yet. */
  private get real(): FastifyBaseLogger {
    return (this.made ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    return this.made?.level ?? this.options.level ?? this.parent.level;
  }

  set level(level: string) {
    this.real.level = level;
  }

  fatal(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.fatal as LogMethod).call(r, obj, ...rest);
  }

  error(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.error as LogMethod).call(r, obj, ...rest);
  }

  warn(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.warn as LogMethod).call(r, obj, ...rest);
  }

  info(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.info as LogMethod).call(r, obj, ...rest);
  }

  debug(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.debug as LogMethod).call(r, obj, ...rest);
  }

  trace(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.trace as LogMethod).call(r, obj, ...rest);
  }

  silent(obj: unknown, ...rest: unknown[]): void {
    const r = this.real;
    (r.silent as LogMethod).call(r, obj, ...rest);
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.real.child(bindings, options);
  }
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
