import type pino from 'pino';

type Output = ReturnType<typeof pino.destination>;

/**
 * The blocks written on exit, by one listener for the process: a listener each would pile up where
 * one process starts many servers (the tests). Weak, so a closed server's blocks can be collected.
 */
const exiting = new Set<WeakRef<LogBlocks>>();
let listening = false;
function onExit(blocks: LogBlocks): void {
  if (!listening) process.once('exit', () => exiting.forEach((ref) => ref.deref()?.flushSync()));
  listening = true;
  for (const ref of exiting) if (ref.deref() === undefined) exiting.delete(ref);
  exiting.add(new WeakRef(blocks));
}

/**
 * Whether a line pino wrote is a warning, an error or fatal: it starts `{"level":40`, `50` or `60`
 * (pino's levels, written first in every line). Read from the line so that no logMethod hook is
 * needed, which would put every line, the access log's too, through pino's slower path.
 */
export function warnOrWorse(line: string): boolean {
  const digit = line.charCodeAt(9);
  return digit >= 0x34 && digit <= 0x39 && line.charCodeAt(10) === 0x30 && line.charCodeAt(11) === 0x2c && line.startsWith('{"level":');
}

/**
 * Log lines gathered into blocks before they reach the output stream: pino's asynchronous
 * destination hands every write to Node's thread pool, and one hand-off per request (the access
 * log line) cost more than the line. A block is written once it reaches `blockBytes`, or `waitMs`
 * after its first line; `flush()` writes it now (warnings and errors, the start-up line). On exit
 * the block is written synchronously, so a process that ends (even by an uncaught error) loses
 * nothing; one killed outright loses at most the last `waitMs` of lines.
 */
export class LogBlocks {
  private block = '';
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly out: Output,
    private readonly blockBytes: number,
    private readonly waitMs: number,
  ) {
    onExit(this);
  }

  /** Writes the block synchronously: the process is exiting and has no more turns of its loop. */
  flushSync(): void {
    this.flush();
    try {
      this.out.flushSync();
    } catch {
      // Standard output is gone (a closed pipe): nothing more can be written.
    }
  }

  /** pino's destination interface: one serialized line. A warning or an error goes out at once, with the block before it. */
  write(line: string): boolean {
    this.block += line;
    if (this.block.length >= this.blockBytes || warnOrWorse(line)) this.flush();
    else this.timer ??= setTimeout(() => this.flush(), this.waitMs).unref();
    return true;
  }

  /** Hands the block to the output stream now (pino's `logger.flush(cb)` calls this with its callback). */
  flush(done?: (err?: Error) => void): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    if (this.block !== '') {
      const block = this.block;
      this.block = '';
      this.out.write(block);
    }
    done?.();
  }
}
