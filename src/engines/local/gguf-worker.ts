/** Runs inspectGguf off the main thread; see inspectGgufIsolated. */
import { parentPort, workerData } from 'node:worker_threads';
import { inspectGguf } from './gguf.js';

try {
  parentPort!.postMessage({ ok: true, summary: await inspectGguf(workerData as string) });
} catch (err) {
  parentPort!.postMessage({ ok: false, message: (err as Error).message });
}
