/** Messages between the main thread and the schema worker (schema-worker.ts). */
export type SchemaWorkerRequest =
  | { id: number; op: 'compile'; key: string; schema: unknown }
  | { id: number; op: 'validate'; key: string; text: string }
  | { id: number; op: 'forget'; key: string };

export type SchemaWorkerReply =
  /** Sent when the worker starts on a compile: its time limit counts from here, not from the queue. */
  | { id: number; started: true }
  | { id: number; ok: true; gbnf?: string; checked?: string[]; valid?: boolean; errors?: string }
  | { id: number; ok: false; kind: 'invalid' | 'unsupported' | 'missing'; message: string };

/** A request before the worker channel numbers it. */
export type SchemaWorkerCall = SchemaWorkerRequest extends infer T ? (T extends unknown ? Omit<T, 'id'> : never) : never;
