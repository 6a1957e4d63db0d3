/**
 * The console's one way to the server: the public and admin HTTP API, same origin, with the signed-in
 * key in the Authorization header. The key lives in sessionStorage only (never in a URL, never logged).
 */

const STORAGE_KEY = 'switchyard.console.key';

export type Role = 'admin' | 'inference';
export interface Session {
  key: string;
  role: Role;
}

/** An error answer of the API, with its envelope's fields. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code: string | null = null,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

const STORAGE_ROLE = 'switchyard.console.role';

export function readStoredKey(): string | null {
  try {
    return sessionStorage.getItem(STORAGE_KEY);
  } catch {
    return null;
  }
}

/** The role found at sign-in (a key's role never changes), so a reload need not ask the admin API again. */
export function readStoredRole(): Role | undefined {
  try {
    const role = sessionStorage.getItem(STORAGE_ROLE);
    return role === 'admin' || role === 'inference' ? role : undefined;
  } catch {
    return undefined;
  }
}

export function writeStoredKey(session: Session | null): void {
  try {
    if (session === null) {
      sessionStorage.removeItem(STORAGE_KEY);
      sessionStorage.removeItem(STORAGE_ROLE);
    } else {
      sessionStorage.setItem(STORAGE_KEY, session.key);
      sessionStorage.setItem(STORAGE_ROLE, session.role);
    }
  } catch {
    // storage disabled: the session lasts as long as the page
  }
}

/** The error an answer carries: the envelope's message when there is one. */
export async function failureOf(res: Response): Promise<ApiFailure> {
  let message = `${res.status} ${res.statusText}`;
  let code: string | null = null;
  let param: string | null = null;
  try {
    const body: unknown = await res.json();
    // OpenAI's envelope ({error:{message,code,param}}) or Anthropic's ({type:'error',error:{message}}).
    const err = isRecord(body) ? body['error'] : undefined;
    if (isRecord(err)) {
      message = str(err['message']) ?? message;
      code = str(err['code']) ?? str(err['type']);
      param = str(err['param']);
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiFailure(res.status, message, code, param);
}

export interface SseEvent {
  event: string | null;
  data: string;
}

/** Splits a server-sent-event body into its events as they arrive. */
export async function* readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut: number;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, '');
        let event: string | null = null;
        const data: string[] = [];
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith('event:')) event = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
        }
        if (data.length > 0 || event !== null) yield { event, data: data.join('\n') };
      }
    }
  } finally {
    reader.releaseLock();
  }
}

export class Api {
  constructor(
    readonly key: string,
    /** Called when the key stops being accepted (revoked while signed in). */
    private readonly onUnauthorized: () => void = () => undefined,
  ) {}

  private init(method: string, body: unknown, signal: AbortSignal | undefined): RequestInit {
    const headers: Record<string, string> = { authorization: `Bearer ${this.key}` };
    const init: RequestInit = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    if (signal) init.signal = signal;
    return init;
  }

  /** The raw answer (for streams and status checks); error answers are thrown as ApiFailure. */
  async fetch(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
    const res = await fetch(path, this.init(method, body, signal));
    if (!res.ok) {
      const failure = await failureOf(res);
      if (res.status === 401) this.onUnauthorized();
      throw failure;
    }
    return res;
  }

  async request<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.fetch(method, path, body, signal);
    return (await res.json()) as T;
  }

  get<T>(path: string, signal?: AbortSignal): Promise<T> {
    return this.request<T>('GET', path, undefined, signal);
  }

  /** A streamed answer, event by event. */
  async *stream(method: string, path: string, body: unknown, signal?: AbortSignal): AsyncGenerator<SseEvent> {
    const res = await this.fetch(method, path, body, signal);
    if (!res.body) return;
    const type = res.headers.get('content-type') ?? '';
    if (!type.startsWith('text/event-stream')) {
      // Not a stream after all (a JSON answer): hand it over as one event.
      yield { event: 'json', data: await res.text() };
      return;
    }
    yield* readEvents(res.body);
  }
}

/**
 * Checks a key and finds its role through the API itself: any key may list models; only an admin
 * key may list organizations (inference keys get 403).
 */
/**
 * Checks a key and finds its role: any key may list models, only an admin key may list
 * organizations (an inference key's 403 there is expected, once per sign-in). A role already known
 * for the key (a reload) is not asked again.
 */
export async function signIn(key: string, knownRole?: Role): Promise<Session> {
  const api = new Api(key);
  try {
    await api.get('/v1/models');
  } catch (err) {
    if (err instanceof ApiFailure && err.status === 401)
      throw new ApiFailure(401, 'This key is not accepted: check it, or ask for a new one.');
    throw err;
  }
  if (knownRole !== undefined) return { key, role: knownRole };
  try {
    await api.get('/admin/orgs');
    return { key, role: 'admin' };
  } catch (err) {
    if (err instanceof ApiFailure && err.status === 403) return { key, role: 'inference' };
    throw err;
  }
}

// Wire shapes the console reads.

export interface Pricing {
  metric: string;
  rate: number;
}
export interface Model {
  id: string;
  name: string;
  author: string;
  slug: string;
  owned_by: string;
  description: string;
  status: string;
  visibility: string;
  model_type: string;
  pricing: Pricing[];
  capabilities: string[];
  available: boolean;
  context_length?: number;
  output_size?: string;
  source?: string;
}
export interface List<T> {
  object: 'list';
  data: T[];
  has_more?: boolean;
}
export interface Limits {
  rpm?: number;
  tpm?: number;
  budget?: number;
  budget_period?: 'day' | 'month';
  models?: string[];
}
export interface ApiKey {
  id: string;
  org: string;
  name: string;
  role: Role;
  created_at: number;
  revoked_at: number | null;
  limits: Limits | null;
  key?: string;
}
export interface Org {
  id: string;
  name: string;
  created_at: number;
  limits: Limits | null;
}
export interface UsageRow {
  group: string;
  requests: number;
  errors: number;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  cost: number;
  unpriced_requests: number;
  estimated_requests: number;
}
export interface Deployment {
  id: string;
  model: string;
  base_url: string;
  api_key_env: string | null;
  upstream_model: string;
  weight: number;
  api: string;
  source: string;
  created_at: number;
  health?: 'up' | 'ejected' | 'cooling';
}
export interface LoadedModel {
  model: string | null;
  file: string;
  bytes: number;
  active: number;
  queued: number;
  sequences: number;
  last_used: number;
}
export interface LocalLoaded extends List<LoadedModel> {
  schema_violations: number;
  schema_checks: { resampled: number; failed: number; returned_invalid: number };
  cached_schemas: number;
}
