import type { FastifyRequest } from 'fastify';
import type { WebSocket, RawData } from 'ws';
import { Ajv } from 'ajv';
import type { App, RouteContext } from './context.js';
import { ApiError } from '../core/errors.js';
import type { Principal } from '../core/principal.js';
import { extractToken } from '../protocols/api-key.js';
import { ConnectionResponses } from '../core/responses/connection-state.js';
import { ResponsesRequestSchema, decodeResponsesRequest, type ResponsesRequest } from '../protocols/responses/request.js';
import { socketError, socketFrame } from '../protocols/responses/stream.js';
import { BODY_VALIDATION, parseRequestJson, validationError, type ValidationIssue } from '../protocols/validation.js';
import { PageQuery } from '../protocols/pages.js';
import { listResponses } from './responses.js';

/** `response.create` messages a connection may queue behind the one running (Open Responses runs them in turn). */
const MAX_PENDING = 8;
/** What ws checks of a handshake, checked first so that a bad one is answered in the error envelope. */
const WS_KEY = /^[+/0-9A-Za-z]{22}==$/;
const WS_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** Past this much unsent data, the next event waits until the client has read (a slow reader cannot grow memory). */
const HIGH_WATER = 1024 * 1024;
/** A peer that does not answer a ping within this long is gone. */
const PING_MS = 30_000;
/** HTTP/SSE transport fields that Open Responses forbids in a WebSocket `response.create`. */
const HTTP_ONLY = ['stream', 'stream_options', 'background'] as const;

// Bodies are checked exactly as on HTTP (one schema, no coercion), compiled once.
const validate = new Ajv(BODY_VALIDATION).compile(ResponsesRequestSchema);

/**
 * One Responses WebSocket (Open Responses' WebSocket transport): `response.create` messages run one
 * after another, each streaming the same events as SSE; `previous_response_id` continues from the
 * connection's own recent responses (so `store: false` ones can be continued) or the store; a failed
 * continuation forgets the response it continued; the connection ends at its time limit with a
 * `websocket_connection_limit_reached` error. Authenticated once, at the upgrade, like any request.
 */
class ResponseSocket {
  private readonly local = new ConnectionResponses();
  private readonly pending: RawData[] = [];
  private pendingBytes = 0;
  private running: AbortController | undefined;
  /** Error events sent and not yet handed to the socket (see error). */
  private unsentErrorBytes = 0;
  private draining = false;
  private idle: Promise<void> = Promise.resolve();
  private turns = 0;
  private expired = false;
  private closing = false;
  private alive = true;
  private readonly timers: NodeJS.Timeout[] = [];
  private readonly opened = performance.now();

  constructor(
    private readonly ws: WebSocket,
    private readonly req: FastifyRequest,
    private readonly ctx: RouteContext,
  ) {}

  start(): void {
    const { ws } = this;
    ws.on('message', (data, isBinary) => this.receive(data, isBinary));
    ws.on('pong', () => {
      this.alive = true;
    });
    ws.once('close', () => this.closed());
    this.timers.push(setTimeout(() => this.expire(), this.ctx.config.websocketMaxConnectionMs));
    this.timers.push(
      setInterval(() => {
        if (!this.alive) return ws.terminate();
        this.alive = false;
        ws.ping();
      }, PING_MS),
    );
    for (const t of this.timers) t.unref();
  }

  private receive(data: RawData, isBinary: boolean): void {
    if (this.closing) return;
    if (isBinary) return this.error(new ApiError('invalid_request', 'Send response.create events as JSON text messages.'));
    if (this.expired) return this.limitReached();
    if (this.pending.length >= MAX_PENDING) {
      return this.error(
        new ApiError(
          'rate_limited',
          `At most ${MAX_PENDING} response.create events may wait on one connection; open another for parallel runs.`,
        ),
      );
    }
    // Queued messages hold one request body's worth (SWITCHYARD_BODY_LIMIT) in all, not each: eight
    // 15 MB messages queued behind a long turn held 128 MB per connection.
    const bytes = sizeOf(data);
    const limit = this.ctx.config.bodyLimit;
    if (this.pendingBytes + bytes > limit && this.pending.length > 0) {
      return this.error(
        new ApiError(
          'rate_limited',
          `The response.create events waiting on this connection may hold ${limit} bytes in all; wait for a turn to end.`,
        ),
      );
    }
    this.pendingBytes += bytes;
    this.pending.push(data);
    if (!this.draining) this.idle = this.drain();
  }

  private clearPending(): void {
    this.pending.length = 0;
    this.pendingBytes = 0;
  }

  /** Runs queued turns one at a time until none is left. */
  private async drain(): Promise<void> {
    this.draining = true;
    try {
      for (let data = this.pending.shift(); data !== undefined && !this.closing; data = this.pending.shift()) {
        this.pendingBytes -= sizeOf(data);
        await this.turn(data);
      }
    } finally {
      this.draining = false;
    }
    if (this.expired && !this.closing) this.limitReached();
  }

  private async turn(data: RawData): Promise<void> {
    const n = ++this.turns;
    let previous: string | null = null;
    try {
      const message = this.parse(data);
      // Known before the message is validated: a continuation refused for any field forgets it too.
      if (typeof message['previous_response_id'] === 'string') previous = message['previous_response_id'];
      const body = this.check(message);
      const create = { ...decodeResponsesRequest(body), stream: true };
      const abort = new AbortController();
      this.running = abort;
      const { run } = await this.ctx.responses.create(
        create,
        await this.principal(),
        { id: `${this.req.id}.${n}`, started: performance.now() },
        this.local,
      );
      // The client may have left while the response was being created.
      if (abort.signal.aborted) run.abort.abort();
      else abort.signal.addEventListener('abort', () => run.abort.abort(), { once: true });
      // One WebSocket message per event (the SDK reads them so), from the batches the run hands over.
      // The stream's `error` event before `response.failed` is left out here: on this transport an
      // `error` message is the transport's own (with a status, and it ends the turn for clients),
      // and the terminal event carries the error. The turn numbers what it sends from 0 without gaps.
      let seq = 0;
      follow: for await (const { events } of run.batches(abort.signal)) {
        for (const ev of events) {
          if (ev.type === 'error') continue;
          if (!(await this.send(socketFrame(ev, seq++)))) break follow;
        }
      }
      await run.done;
      if (run.fold.status === 'failed' && previous !== null) this.local.evict(previous);
    } catch (err) {
      // A continuation that fails forgets what it continued (Open Responses: a later try is not found).
      if (previous !== null) this.local.evict(previous);
      const e = err instanceof ApiError ? err : new ApiError('internal_error', 'The response failed.');
      if (!(err instanceof ApiError)) this.req.log.error({ err, turn: n }, 'websocket turn failed');
      this.error(e);
    } finally {
      this.running = undefined;
    }
  }

  /**
   * The key's principal as it is now: each turn is authenticated again with the key the upgrade
   * carried, as every HTTP request is, so a key revoked or restricted since takes effect on the
   * next turn (a revoked key's turn is a 401 error event, and the connection then closes).
   */
  private async principal(): Promise<Principal> {
    try {
      return await this.ctx.auth.authenticate(extractToken(this.req.headers, this.req.raw.rawHeaders));
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        this.closing = true;
        this.clearPending();
        setImmediate(() => this.ws.close(1008, 'API key no longer valid'));
      }
      throw err;
    }
  }

  /** A `response.create` message's fields (without `type`); anything else is the turn's error. */
  private parse(data: RawData): Record<string, unknown> {
    // Text frames arrive as one Buffer (ws's default binary type); a fragmented one as a list of them.
    const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    const msg = parseRequestJson(bytes.toString('utf8'), 'message');
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) throw new ApiError('invalid_request', 'Send a JSON object.');
    const { type, ...body } = msg as Record<string, unknown>;
    if (type !== 'response.create') {
      throw new ApiError('invalid_value', `Unknown event type ${JSON.stringify(type)}: a client sends 'response.create'.`, {
        param: 'type',
      });
    }
    return body;
  }

  /** A `response.create` message's fields as a validated request body. */
  private check(body: Record<string, unknown>): ResponsesRequest {
    for (const field of HTTP_ONLY) {
      if (field in body) {
        throw new ApiError('unsupported_parameter', `'${field}' is an HTTP field; leave it out of WebSocket response.create events.`, {
          param: field,
        });
      }
    }
    if (!validate(body)) throw validationError((validate.errors ?? []) as ValidationIssue[], 'body');
    return body as ResponsesRequest;
  }

  /** Sends one message; waits when the client reads slowly. False once the connection is gone. */
  private async send(text: string): Promise<boolean> {
    const { ws } = this;
    if (ws.readyState !== ws.OPEN) return false;
    if (ws.bufferedAmount < HIGH_WATER) {
      ws.send(text);
      return true;
    }
    return new Promise((resolve) => ws.send(text, (err) => resolve(!err)));
  }

  /**
   * Sends an error event. Errors answer the client's own messages, one each, so a client that sends
   * and never reads would have them pile up in the socket's buffer without bound (an outside pass:
   * 4 MB of one-byte messages grew the server by 470 MB and held its event loop for seconds). Once
   * a megabyte of error events waits unsent, the connection is closed instead. Only error events
   * count: a turn's own events wait for the client as they always did (send), however many.
   */
  private error(e: ApiError): void {
    const { ws } = this;
    if (ws.readyState !== ws.OPEN) return;
    const text = socketError(e);
    if (this.unsentErrorBytes + text.length > HIGH_WATER) return this.overrun();
    this.unsentErrorBytes += text.length;
    // Called once the message is handed to the socket (or the connection failed).
    ws.send(text, () => {
      this.unsentErrorBytes -= text.length;
    });
  }

  /** The client does not read what it is sent: the connection ends now (a close frame would wait behind the rest). */
  private overrun(): void {
    if (this.ws.readyState !== this.ws.OPEN) return;
    // closed() follows, which stops a running turn and drops the queue.
    this.closing = true;
    this.clearPending();
    this.req.log.warn({ unsent_error_bytes: this.unsentErrorBytes }, 'websocket client does not read its errors; connection closed');
    this.ws.terminate();
  }

  private expire(): void {
    this.expired = true;
    if (!this.draining) this.limitReached();
  }

  /** The time limit: said once as an error event, then the connection closes (1000: a normal end). */
  private limitReached(): void {
    if (this.closing) return;
    this.closing = true;
    const minutes = Math.round(this.ctx.config.websocketMaxConnectionMs / 60_000);
    this.error(
      new ApiError(
        'websocket_connection_limit_reached',
        `This connection reached its limit of ${minutes} minutes; open a new WebSocket and continue with previous_response_id.`,
      ),
    );
    this.ws.close(1000, 'connection limit reached');
  }

  /** Shutdown: no new turns; the running one finishes (within the shutdown timeout), then 1001. */
  async shutdown(): Promise<void> {
    this.closing = true;
    this.clearPending();
    await this.idle;
    if (this.ws.readyState === this.ws.OPEN) this.ws.close(1001, 'server shutting down');
  }

  private closed(): void {
    this.closing = true;
    this.clearPending();
    // The client left: a turn still running stops, like a streamed HTTP response whose client went away.
    this.running?.abort();
    for (const t of this.timers) clearTimeout(t);
    this.req.log.info(
      { method: 'GET', url: '/v1/responses', status: 101, turns: this.turns, ms: Math.round(performance.now() - this.opened) },
      'websocket closed',
    );
  }
}

/** A message's size in bytes, as ws hands it over. */
const sizeOf = (data: RawData): number =>
  Array.isArray(data) ? data.reduce((n, b) => n + b.length, 0) : Buffer.isBuffer(data) ? data.length : data.byteLength;

/**
 * The open Responses WebSockets, to close on shutdown, and how many each organization holds: every
 * one counts toward the server's in-flight bound, so without a cap of its own one key opened enough
 * idle sockets to shed every other organization's requests (a hostile pass).
 */
export class ResponseSockets {
  private readonly open = new Set<ResponseSocket>();
  private readonly byOrg = new Map<string, number>();

  constructor(private readonly maxPerOrg: number) {}

  /** Refuses an upgrade past the organization's share, before anything is upgraded. */
  admit(orgId: string): void {
    if ((this.byOrg.get(orgId) ?? 0) >= this.maxPerOrg)
      throw new ApiError(
        'rate_limited',
        `This organization has ${this.maxPerOrg} Responses WebSockets open, its limit (SWITCHYARD_WEBSOCKET_MAX_PER_ORG); close one, or use HTTP.`,
      );
  }

  add(s: ResponseSocket, ws: WebSocket, orgId: string): void {
    this.open.add(s);
    this.byOrg.set(orgId, (this.byOrg.get(orgId) ?? 0) + 1);
    ws.once('close', () => {
      this.open.delete(s);
      const n = (this.byOrg.get(orgId) ?? 1) - 1;
      if (n > 0) this.byOrg.set(orgId, n);
      else this.byOrg.delete(orgId);
    });
  }

  async shutdown(): Promise<void> {
    await Promise.all([...this.open].map((s) => s.shutdown()));
  }
}

/**
 * `GET /v1/responses` with an Upgrade: the WebSocket transport; without one, the list of stored
 * responses. The route's hooks (authentication, load shedding) and its query check run before the
 * upgrade, so a refused connection gets the HTTP error, not a socket.
 */
export function registerResponseSocket(app: App, ctx: RouteContext, sockets: ResponseSockets): void {
  app.route({
    method: 'GET',
    url: '/v1/responses',
    onRequest: ctx.requireKey,
    // Before the upgrade: a refused one gets the HTTP error in the envelope, not ws's own HTML page.
    preHandler: async (req) => {
      if (req.headers.upgrade === undefined) return;
      checkHandshake(req);
      sockets.admit(req.principal!.orgId);
    },
    schema: { querystring: PageQuery },
    handler: async (req) => listResponses(ctx, req.principal!, req.query),
    wsHandler: (ws: WebSocket, req: FastifyRequest) => {
      const s = new ResponseSocket(ws, req, ctx);
      sockets.add(s, ws, req.principal!.orgId);
      s.start();
    },
  });
}

/** The handshake checks ws makes (RFC 6455), as a 400 in the error envelope rather than ws's text/html one. */
function checkHandshake(req: FastifyRequest): void {
  const h = req.headers;
  const bad = (what: string, param: string) => new ApiError('invalid_request', `WebSocket handshake: ${what}.`, { param });
  if (String(h.upgrade).toLowerCase() !== 'websocket') throw bad("the Upgrade header must be 'websocket'", 'upgrade');
  const key = h['sec-websocket-key'];
  if (typeof key !== 'string' || !WS_KEY.test(key)) throw bad('Sec-WebSocket-Key must be 16 bytes in base64', 'sec-websocket-key');
  const version = h['sec-websocket-version'];
  if (version !== '13' && version !== '8') throw bad('Sec-WebSocket-Version must be 13', 'sec-websocket-version');
  const protocols = h['sec-websocket-protocol'];
  if (protocols !== undefined) {
    const names = String(protocols)
      .split(',')
      .map((p) => p.trim());
    if (names.some((p) => !WS_TOKEN.test(p)) || new Set(names).size !== names.length)
      throw bad('Sec-WebSocket-Protocol must be a list of distinct tokens', 'sec-websocket-protocol');
  }
}
