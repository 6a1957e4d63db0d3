import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';

/**
 * SQLite's WAL checkpoints, moved off the event loop. By default the connection that commits
 * checkpoints the WAL itself once it passes 1,000 pages: that commit then copies the pages into
 * the database and syncs both files, a stall of milliseconds on the thread that answers requests
 * (every ~200 requests at one connection, where the ledger commits one record per transaction).
 * The store turns that off (`wal_autocheckpoint = 0`) and this worker thread, with a connection of
 * its own, checkpoints every `intervalMs` instead (cheap when there is nothing to copy). PASSIVE mode never waits for the writer or for
 * readers: it copies what it can, and the next round does the rest.
 */
export class WalCheckpointer {
  private readonly worker: Worker;

  constructor(file: string, intervalMs: number) {
    // The driver's path is resolved here: an evaluated worker would resolve it from the working directory.
    const driver = createRequire(import.meta.url).resolve('better-sqlite3');
    this.worker = new Worker(CHECKPOINT_LOOP, { eval: true, workerData: { file, intervalMs, driver } });
    // A failed checkpoint only leaves the WAL longer; the worker reports nothing and is not waited for.
    this.worker.on('error', () => undefined);
    this.worker.unref();
  }

  /** Stops the loop; closing the last connection checkpoints what is left. */
  async close(): Promise<void> {
    await this.worker.terminate();
  }
}

/**
 * The worker's code, evaluated as CommonJS (a worker from a string cannot be an ES module), so
 * that it needs no file of its own beside the compiled store.
 */
const CHECKPOINT_LOOP = `
const { workerData } = require('node:worker_threads');
const Database = require(workerData.driver);
const db = new Database(workerData.file, { fileMustExist: true });
db.pragma('busy_timeout = 1000');
const checkpoint = () => {
  try {
    db.pragma('wal_checkpoint(PASSIVE)');
  } catch {
    // Busy or failing: the WAL grows until the next round can copy it.
  }
};
setInterval(checkpoint, workerData.intervalMs);
`;
