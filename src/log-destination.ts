import pino from 'pino';

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

/** pino's level number for warnings; errors and fatal are above it. */
const WARN = 40;

/**
 * Log lines gathered into blocks before they reach the output stream: pino's asynchronous
 * destination hands every write to Node's thread pool, and one hand-off per request (the access
 * log line) cost more than the line. A block is written once it reaches `blockBytes`, or `waitMs`
 * after its first line; `flush()` writes it now (warnings and errors, the start-up line). On exit
 * the block is written synchronously, so a process that ends (even by an uncaught error) loses
 * nothing; one killed outright loses at most the last `waitMs` of lines.
 */
export class LogBlocks {
  /**
   * pino's metadata protocol (what pino.multistream uses): pino sets `lastLevel` before each write,
   * so a warning is told from an info line without reading the line (a line is a string pino
   * built by concatenation, and reading a character of it would copy it into one piece first).
   */
  readonly [pino.symbols.needsMetadataGsym] = true;
  lastLevel = 0;
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
    if (this.block.length >= this.blockBytes || this.lastLevel >= WARN) this.flush();
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
