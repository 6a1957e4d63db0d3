import Database from 'better-sqlite3';

/**
 * The embedded SQLite database serves one instance (its workers share it through their primary).
 * At start that instance takes every response still marked running for an orphan of its previous
 * run, which is only true while no other instance is serving the same data directory: a second
 * `npm start` on the same directory (a supervisor's overlap, or a start on another port) used to
 * fail the first one's running responses before it found its port taken. The instance therefore
 * holds an exclusive lock on a small file beside the database (`<database>.instance-lock`) for as
 * long as it runs.
 *
 * The lock is SQLite's own (an exclusive transaction on that file, which nothing ever
 * commits): the operating system releases it when the process ends, however it ends, so a crash
 * leaves nothing to clean up. The CLI does not take it: it changes keys and settings, which a
 * running instance picks up, and never sweeps responses.
 */
export class InstanceLock {
  private constructor(private readonly db: Database.Database) {}

  /**
   * Takes the lock of the SQLite database `file` (its directory exists: the store made it), or
   * throws an error that names the file when another process holds it. None for `:memory:`.
   */
  static take(file: string): InstanceLock | undefined {
    if (file === ':memory:') return undefined;
    const db = new Database(`${file}.instance-lock`);
    try {
      db.pragma('busy_timeout = 0');
      db.exec('BEGIN EXCLUSIVE');
    } catch (err) {
      db.close();
      if ((err as { code?: unknown }).code === 'SQLITE_BUSY')
        throw new Error(
          `another Switchyard instance is serving the SQLite database ${file} (it serves one instance; use SWITCHYARD_WORKERS for more processes, or PostgreSQL for several instances)`,
        );
      throw err;
    }
    return new InstanceLock(db);
  }

  release(): void {
    if (this.db.open) this.db.close();
  }
}
