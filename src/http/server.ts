import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyBodyParser,
  type FastifyError,
  type FastifyReply,
  type FastifyRequest,
  type HTTPMethods,
} from 'fastify';
import cors from '@fastify/cors';
import swagger from '@fastify/swagger';
import websocket from '@fastify/websocket';
import { Ajv, type ValidateFunction } from 'ajv';
import { ApiError } from '../core/errors.js';
import { randomHex } from '../core/ids.js';
import { BODY_VALIDATION, parseRequestJson, validationError, type ValidationIssue } from '../protocols/validation.js';
import { LoadShedder } from './load-shedder.js';
import { accessLog } from './access-log.js';
import { requestLogger } from './request-logger.js';
import { extractToken } from '../protocols/api-key.js';
import type { Principal } from '../core/principal.js';
import { asksAnthropic, registerModelRoutes } from '../api/models.js';
import { registerAdminRoutes } from '../api/admin.js';
import { registerUsageRoutes } from '../api/usage.js';
import { registerHealthRoutes } from '../api/health.js';
import { registerChatRoutes } from '../api/chat.js';
import { registerMessagesRoutes } from '../api/messages.js';
import { anthropicError } from '../protocols/messages/response.js';
import { registerStoredChatRoutes } from '../api/stored-chat.js';
import { registerResponseRoutes } from '../api/responses.js';
import { registerConversationRoutes } from '../api/conversations.js';
import { ResponseSockets, registerResponseSocket } from '../api/responses-socket.js';
import { registerConsole } from './console.js';

import type { App, AuthHook, RouteContext, ServerDeps } from '../api/context.js';

export type { App, RouteContext, ServerDeps };

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | null;
    /** The `model` label of a generation request's metrics (see Metrics.modelLabel). */
    metricsModel: string | null;
    /** performance.now() when the request arrived. */
    startedAt: number;
  }
}

/** Query parameters whose names say they hold a credential. */
const SECRET_PARAM = /([?&][^=&]*(?:key|token|secret|password|auth)[^=&]*=)[^&]*/gi;
/**
 * Values shaped like credentials wherever they stand (a bare `?sk-…`, a key in the path, an
 * oddly named parameter): provider-style keys (`sk-…`, `sk_live_…`, ours are `sk-sy-…`), JWTs, and
 * long opaque tokens that mix letters and digits and are not one of our own ids.
 */
const SECRET_SHAPE = /(?:\b(?:sk|pk|rk|ak)[-_][A-Za-z0-9_-]{8,}|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_.-]{8,}|[A-Za-z0-9_~+-]{32,})/g;
const OUR_ID = /^(?:[a-z]+[_-])?[0-9a-f]{16,}$/;
const MIXED = /[0-9]/;
const LETTER = /[A-Za-z]/;
const PROVIDER_KEY = /^(?:sk|pk|rk|ak)[-_]/;
function redactShapes(text: string): string {
  return text.replace(SECRET_SHAPE, (m) => {
    if (PROVIDER_KEY.test(m) || m.startsWith('eyJ')) return '[redacted]';
    // A long token: a credential unless it is one of our ids or has no mix of letters and digits.
    return OUR_ID.test(m) || !MIXED.test(m) || !LETTER.test(m) ? m : '[redacted]';
  });
}

/** A URL for the access log, with anything that looks like a credential replaced (clients do put keys in URLs). */
export function loggableUrl(url: string, knownSecret?: string): string {
  let out = url.includes('?') ? url.replace(SECRET_PARAM, '$1[redacted]') : url;
  if (knownSecret && out.includes(knownSecret)) out = out.split(knownSecret).join('[redacted]');
  if (out.length < 20) return out;
  let decoded = out;
  if (out.includes('%')) {
    try {
      decoded = decodeURIComponent(out);
    } catch {
      // a malformed escape: match the URL as it is
    }
  }
  // The decoded form is logged only when it had something to hide (a key written %-escaped).
  const redacted = redactShapes(decoded);
  return redacted !== decoded ? redacted : out;
}

/**
 * A query string's or path's validator that also refuses a number coerced from text to a value
 * that is not finite (`limit=1e400`, `Infinity`). ajv coerces such text to Infinity and then, with
 * `strictNumbers`, skips `minimum`/`maximum` for it rather than failing: an outside pass got a 500
 * from the store ("datatype mismatch") and `"sequence_number":Infinity` in a replay.
 */
function finiteText(validate: ValidateFunction): ValidateFunction {
  const check = ((data: unknown) => {
    if (!validate(data)) {
      check.errors = validate.errors ?? null;
      return false;
    }
    if (data !== null && typeof data === 'object') {
      for (const [key, value] of Object.entries(data)) {
        const values: unknown[] = Array.isArray(value) ? value : [value];
        if (values.some((v) => typeof v === 'number' && !Number.isFinite(v))) {
          check.errors = [
            {
              keyword: 'type',
              instancePath: `/${key}`,
              schemaPath: '#/type',
              params: { type: 'a finite number' },
              message: 'must be a finite number',
            },
          ];
          return false;
        }
      }
    }
    check.errors = null;
    return true;
  }) as ValidateFunction;
  return check;
}

const INBOUND_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const ROUTABLE_METHODS: HTTPMethods[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'];

function toApiError(err: FastifyError, log: FastifyBaseLogger): ApiError {
  if (err instanceof ApiError) return err;
  if (err.validation) return validationError(err.validation as ValidationIssue[], err.validationContext ?? 'request');
  switch (err.code) {
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ApiError('invalid_json', 'The request body is empty; send a JSON object.');
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new ApiError('invalid_json', 'The request body is not valid JSON.');
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ApiError('request_too_large', 'The request body is larger than this server accepts.');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ApiError('unsupported_media_type', 'Send the request body as application/json.');
    default:
  }
  if (err instanceof SyntaxError) return new ApiError('invalid_json', `The request body is not valid JSON: ${err.message}`);
  const status = err.statusCode ?? 500;
  if (status >= 400 && status < 500) return new ApiError('invalid_request', err.message);
  log.error({ err }, 'unhandled error');
  return new ApiError('internal_error', 'The server had an error while processing your request.');
}

/**
 * An error a route's request raised, as one from the registry. A body over the limit is answered
 * before it has all arrived, and Fastify then closes the connection: the client is still sending,
 * so closing with its bytes unread makes the kernel reset the connection, and the SDKs lost the 413
 * to a connection error (EPIPE) about half the time. The connection stays open instead, and Node
 * reads the rest of the body and drops it (within the request timeout, SWITCHYARD_BODY_TIMEOUT_MS).
 */
function routeError(err: FastifyError, req: FastifyRequest, reply: FastifyReply): ApiError {
  if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') reply.removeHeader('connection');
  // A route that needs a body got none: say so, rather than "body must be object".
  if (err.validation && err.validationContext === 'body' && req.body === undefined)
    return new ApiError('invalid_json', 'The request body is empty; send a JSON object.');
  // A query parameter given twice arrives as a list, and its schema's message would name the very
  // values sent as the ones allowed ("must be one of 'openai', … 'google'"): say what is wrong.
  // (Not where the failure is inside a parameter that is a list by its schema: `lifecycle[]=bogus`.)
  if (err.validation && err.validationContext === 'querystring') {
    const path = err.validation[0]?.instancePath.slice(1).split('/') ?? [];
    const name = path.length === 1 ? path[0]! : '';
    const value: unknown = (req.query as Record<string, unknown> | undefined)?.[name];
    if (name !== '' && Array.isArray(value))
      return new ApiError('invalid_value', `Query parameter '${name}' was given ${value.length} times; give it once.`, { param: name });
  }
  return toApiError(err, req.log);
}

/**
 * For a path that would exist under `/v1` (a client whose base URL lacks it) or with one `/v1` fewer
 * (one whose base URL has it where the SDK adds it again, as Anthropic's does): the base URL to give.
 */
function baseUrlHint(path: string, routes: ReadonlyMap<string, unknown>): string {
  if (!path.startsWith('/v1/') && routes.has(`/v1${path}`))
    return ' The API is under /v1: use a base URL ending in /v1 (http://host:port/v1).';
  if (path.startsWith('/v1/v1/') && routes.has(path.slice(3)))
    return ' The path has /v1 twice: give the SDK a base URL without /v1 (Anthropic SDKs add it themselves).';
  return '';
}

/** An error on a Messages path: Anthropic's envelope, and the request id where Anthropic's SDKs read it. */
function sendAnthropicError(reply: FastifyReply, id: string, e: ApiError): FastifyReply {
  reply.header('request-id', id);
  return sendError(reply, e, anthropicError(e, id));
}

/** The HTTP form of an error: its status, the envelope, and the headers its options ask for. */
function sendError(reply: FastifyReply, e: ApiError, as?: { status: number; body: Record<string, unknown> }): FastifyReply {
  const status = as?.status ?? e.status;
  reply.code(status).headers(e.headers);
  // Node has no reason phrase for Anthropic's 529 and would write "529 unknown".
  if (status === 529) reply.raw.statusMessage = 'Overloaded';
  if (e.retryAfterMs !== undefined) reply.header('retry-after', String(Math.max(1, Math.ceil(e.retryAfterMs / 1000))));
  // The OpenAI SDKs honour this: retrying cannot help until configuration or a budget changes.
  if (e.final) reply.header('x-should-retry', 'false');
  return reply.type('application/json; charset=utf-8').send(as?.body ?? e.toBody());
}

/**
 * Requests Node's HTTP parser refuses before Fastify sees them (a head over maxHeaderBytes, bad
 * header bytes, a broken request line) still get the envelope and a request id. The connection is
 * then closed gently: what the client is still sending is read and dropped for a moment, because
 * closing with unread bytes makes the kernel reset the connection and the client lose the answer.
 */
const answeredSockets = new WeakSet<Duplex>();
/**
 * Sockets whose request was answered (an error: a body over the limit, a key refused) before its
 * body had all arrived: Node reads the rest and drops it. Where that outlasts the request timeout,
 * the connection is closed without a word: the request has had its answer, and a 408 after it
 * would be a second one.
 */
const drainingSockets = new WeakSet<Duplex>();

/** Ends a socket with its last bytes (if any), and destroys it if its client has not closed its side within 2 s. */
function closeAnswered(socket: Duplex, last?: string): void {
  setTimeout(() => socket.destroy(), 2000).unref();
  socket.end(last);
}

function clientError(err: NodeJS.ErrnoException, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed || answeredSockets.has(socket)) return;
  answeredSockets.add(socket);
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT' && drainingSockets.has(socket)) {
    closeAnswered(socket);
    return;
  }
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const e =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new ApiError('request_header_too_large', 'The request headers are larger than this server accepts.')
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new ApiError('request_timeout', 'The request did not arrive in time.')
        : new ApiError('invalid_request', `The request is not valid HTTP (${err.code ?? 'parse error'}).`);
  const id = `req_${randomHex()}`;
  // On the Anthropic paths, Anthropic's envelope and its request-id header, as every other error there.
  const anthropic = MESSAGES_PATH.test(requestPath(err, socket) ?? '');
  const body = JSON.stringify(anthropic ? anthropicError(e, id).body : e.toBody());
  const status = e.status;
  socket.removeAllListeners('data');
  socket.on('data', () => undefined);
  socket.once('end', () => socket.destroy());
  closeAnswered(
    socket,
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\ncontent-type: application/json; charset=utf-8\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${id}\r\n${anthropic ? `request-id: ${id}\r\n` : ''}` +
      `connection: close\r\n\r\n${body}`,
  );
}

/** `/v1/messages` and the paths under it (with or without a query): Anthropic's envelope there. */
const MESSAGES_PATH = /^\/v1\/messages(?:[/?]|$)/;

/**
 * The path of the request a client error belongs to, where it can be known: the request Node had
 * parsed the head of (a body that never finished), or the request line at the start of the bytes
 * the parser refused (a head too large).
 */
function requestPath(err: NodeJS.ErrnoException & { rawPacket?: unknown }, socket: Duplex): string | undefined {
  const incoming = (socket as Duplex & { parser?: { incoming?: { url?: unknown } | null } | null }).parser?.incoming?.url;
  if (typeof incoming === 'string') return incoming;
  if (!Buffer.isBuffer(err.rawPacket)) return undefined;
  return /^[A-Z]+ (\S+) /.exec(err.rawPacket.subarray(0, 2048).toString('latin1'))?.[1];
}

export async function buildServer(deps: ServerDeps): Promise<App> {
  const { config, log } = deps;
  const app = Fastify({
    loggerInstance: log,
    // One log line per request (onResponse below) rather than Fastify's two.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    // The request's logger becomes a pino child only when the request logs something.
    childLoggerFactory: requestLogger,
    bodyLimit: config.bodyLimit,
    // Path parameters as long as the ids the API accepts (checked on the decoded value): model ids
    // up to 255 characters, client item ids up to 256. Fastify's default of 100 answered 400 for ids
    // the API had taken, so they could not be read, changed or deleted.
    routerOptions: { maxParamLength: 1024 },
    // A client that sends part of a request and stalls (slowloris, a chunked body that never ends)
    // gets 408 after bodyTimeoutMs instead of holding its slot forever; checked every second.
    requestTimeout: config.bodyTimeoutMs,
    http: {
      requireHostHeader: false,
      maxHeaderSize: config.maxHeaderBytes,
      headersTimeout: Math.min(60_000, config.bodyTimeoutMs),
      connectionsCheckingInterval: Math.min(1_000, Math.max(100, Math.floor(config.bodyTimeoutMs / 4))),
    },
    clientErrorHandler: clientError,
    genReqId: (req) => {
      const inbound = req.headers['x-request-id'];
      // An id shaped like an API key (sk-…) is not taken: it would be logged and echoed as it is.
      return typeof inbound === 'string' && INBOUND_REQUEST_ID.test(inbound) && !inbound.startsWith('sk-') ? inbound : `req_${randomHex()}`;
    },
    return503OnClosing: true,
    forceCloseConnections: 'idle',
    frameworkErrors: (err, req, reply) => {
      reply.header('x-request-id', req.id);
      const e =
        err.code === 'FST_ERR_BAD_URL' ? new ApiError('invalid_url', `The request URL is malformed: ${req.url}`) : toApiError(err, log);
      void sendError(reply, e);
    },
  }).withTypeProvider<TypeBoxTypeProvider>() as unknown as App;
  // An `Expect` other than 100-continue: Node answers a bare 417 itself unless this is handled.
  app.server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const body = JSON.stringify(
      new ApiError('expectation_failed', `The Expect header '${String(req.headers.expect).slice(0, 100)}' is not supported.`, {
        param: 'expect',
      }).toBody(),
    );
    res
      .writeHead(417, { 'content-type': 'application/json; charset=utf-8', 'x-request-id': `req_${randomHex()}`, connection: 'close' })
      .end(body);
  });

  // CONNECT (a proxy's tunnel) is not served: Node closes the socket without a word unless this
  // is handled, the one request that got no envelope and no request id.
  app.server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    if (answeredSockets.has(socket)) return;
    answeredSockets.add(socket);
    const allow = ROUTABLE_METHODS.join(', ');
    const body = JSON.stringify(new ApiError('method_not_allowed', `Method CONNECT is not allowed; use ${allow}.`).toBody());
    socket.on('error', () => socket.destroy());
    closeAnswered(
      socket,
      `HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
        `allow: ${allow}\r\nx-request-id: req_${randomHex()}\r\nconnection: close\r\n\r\n${body}`,
    );
  });

  // Bodies are validated as sent (BODY_VALIDATION); query strings and path params are text by
  // nature, so they are coerced. Each schema is compiled once, when its route is registered.
  const bodyAjv = new Ajv(BODY_VALIDATION);
  const textAjv = new Ajv({
    coerceTypes: 'array',
    useDefaults: true,
    removeAdditional: false,
    allErrors: false,
    strict: false,
    strictNumbers: true,
  });
  app.setValidatorCompiler(({ schema, httpPart }) => (httpPart === 'body' ? bodyAjv.compile(schema) : finiteText(textAjv.compile(schema))));

  app.decorateRequest('principal', null);
  app.decorateRequest('metricsModel', null);
  app.decorateRequest('startedAt', 0);
  const { metrics } = deps;
  const shedder = new LoadShedder(config.maxInFlight, config.maxEventLoopDelayMs);
  metrics.trackInFlight(() => shedder.inFlight);
  app.addHook('onClose', (_app, done) => {
    shedder.close();
    done();
  });
  const onEnd = () => {
    shedder.inFlight -= 1;
  };
  // Hooks on every request are callback-style: an async hook costs a promise per request.
  app.addHook('onRequest', (req, reply, done) => {
    req.startedAt = performance.now();
    reply.header('x-request-id', req.id);
    const upgrade = (req.raw as IncomingMessage & { upgrade?: boolean }).upgrade === true;
    if (upgrade) {
      // An upgrade request answered over HTTP (refused below, or by a later hook) is on a socket
      // Node's parser has left: no timeout or closeAllConnections reaches it, and server.close()
      // would wait for it. It is closed once the answer is out, as clientError closes its sockets.
      // (An accepted WebSocket never finishes this response: the plugin takes the socket over.)
      reply.header('connection', 'close');
      const socket = req.raw.socket;
      reply.raw.once('finish', () => closeAnswered(socket));
    }
    // HTTP/1.1 requires Host (RFC 9112 §3.2): refused here, in the envelope, rather than by Node's
    // parser with an empty body (requireHostHeader is off below for that reason).
    if (req.headers.host === undefined && req.raw.httpVersion === '1.1') {
      return done(new ApiError('invalid_request', 'An HTTP/1.1 request must carry a Host header.'));
    }
    // An upgrade reaches every route through the WebSocket plugin, which would switch protocols and
    // close at once with no reason where the route has no socket handler: refused over HTTP instead.
    if (upgrade && !(req.method === 'GET' && req.routeOptions.url === '/v1/responses')) {
      return done(
        new ApiError('invalid_request', 'This route does not accept a protocol upgrade; only GET /v1/responses takes a WebSocket.'),
      );
    }
    // Probes and metrics are answered even under load: they are how operators see it.
    if (!req.url.startsWith('/v1/') && !req.url.startsWith('/admin/')) return done();
    const reason = shedder.refuse();
    if (reason) {
      metrics.shed.inc({ reason });
      return done(new ApiError('overloaded', 'The server is overloaded; retry shortly.', { retryAfterMs: 1000 }));
    }
    shedder.inFlight += 1;
    reply.raw.once('close', onEnd);
    done();
  });
  const accessLine = accessLog(log);
  app.addHook('onResponse', (req, reply, done) => {
    if (reply.statusCode >= 400 && !req.raw.complete) {
      // Until its body has all been read: a later request on the connection times out like every other.
      const socket = req.raw.socket;
      drainingSockets.add(socket);
      req.raw.once('end', () => drainingSockets.delete(socket));
    }
    const route = req.routeOptions.url;
    metrics.countRequest(route ?? 'unmatched', req.metricsModel ?? '', reply.statusCode, reply.elapsedTime / 1000);
    // A URL that is exactly one of our routes' own paths (no parameter, no query) holds nothing to
    // redact, and is most requests: the redaction's regular expressions are skipped for it.
    const url = req.url === route ? route : loggableUrl(req.url, config.adminKey);
    // A load balancer's health checks (a couple a second per instance) would be most of the log:
    // a probe that passes is a debug line, one that fails an info line like any request.
    if (reply.statusCode < 400 && (route === '/healthz' || route === '/readyz')) {
      if (log.isLevelEnabled('debug'))
        log.debug({ request_id: req.id, method: req.method, url, status: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'request');
    } else accessLine(req.id, req.method, url, reply.statusCode, Math.round(reply.elapsedTime));
    done();
  });

  // Clients (curl -d, some SDK wrappers) often send JSON without the JSON content type: parse it anyway.
  // An empty body is no body (the OpenAI SDKs send `content-type: application/json` with an empty
  // POST for cancel and with DELETE); routes that need one say so through their schema.
  const parseJson: FastifyBodyParser<string> = (req, body, done) => {
    // A compressed body would be read as text and refused as "not valid JSON": say what is wrong.
    const encoding = req.headers['content-encoding'];
    if (encoding !== undefined && encoding.toLowerCase() !== 'identity')
      return done(
        new ApiError('unsupported_media_type', `Content-Encoding '${encoding}' is not accepted; send the body uncompressed.`),
        undefined,
      );
    if (body.trim() === '') return done(null, undefined);
    // Fastify's own JSON parser is this call, but it answers every failure with the same message.
    let parsed: unknown;
    try {
      parsed = parseRequestJson(body, 'request body');
    } catch (err) {
      return done(err as ApiError, undefined);
    }
    done(null, parsed);
  };
  // Fastify's own text/plain parser would hand routes a string ("expected object"): every body is JSON here.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);
  app.addContentTypeParser('*', { parseAs: 'string' }, parseJson);

  // The OpenAPI document is generated from the route schemas that validate requests.
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'Switchyard', version: '0.1.0', description: 'OpenAI-compatible model inference service' },
      components: {
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer' }, apiKey: { type: 'apiKey', in: 'header', name: 'x-api-key' } },
      },
      security: [{ bearer: [] }, { apiKey: [] }],
    },
  });

  if (config.corsOrigin !== '') {
    await app.register(cors, {
      origin: config.corsOrigin === '*' ? '*' : config.corsOrigin.split(',').map((o) => o.trim()),
      // Every method a route answers (the plugin's default leaves out DELETE and PATCH, which
      // deleting stored objects and the admin API need).
      methods: ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'],
      // What the SDKs read: the request id (Anthropic's name too), whether to retry, the limits.
      exposedHeaders: [
        'x-request-id',
        'request-id',
        'retry-after',
        'x-should-retry',
        'x-switchyard-estimated',
        'x-ratelimit-limit-requests',
        'x-ratelimit-remaining-requests',
        'x-ratelimit-reset-requests',
        'x-ratelimit-limit-tokens',
        'x-ratelimit-remaining-tokens',
        'x-ratelimit-reset-tokens',
      ],
      maxAge: 600,
    });
  }

  app.setErrorHandler((err: FastifyError, req: FastifyRequest, reply: FastifyReply) =>
    // Anthropic's SDKs read the catalogue's errors (an unknown model, a bad key) in their envelope.
    req.url.startsWith('/v1/models') && asksAnthropic(req.headers)
      ? sendAnthropicError(reply, req.id, routeError(err, req, reply))
      : sendError(reply, routeError(err, req, reply)),
  );
  // Remember which methods each path has, so the others answer 405 rather than 404.
  const methodsByPath = new Map<string, Set<string>>();
  app.addHook('onRoute', (route) => {
    const set = methodsByPath.get(route.url) ?? new Set<string>();
    for (const m of [route.method].flat()) set.add(m);
    methodsByPath.set(route.url, set);
  });

  app.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0]!;
    // Any method a fixed path that exists lacks (PUT on /v1/models, OPTIONS with CORS off, TRACE, or
    // one Fastify does not route at all, such as PROPFIND): 405 with the methods it has. A path with
    // a parameter (`/v1/responses/:id`) cannot tell a resource it lacks a method for from a path
    // that does not exist (`POST /v1/responses/compact` on a server without it): both are 404, as
    // OpenAI answers them, and such a route's pattern is never a request's path.
    const methods = path.includes(':') || path.includes('*') ? undefined : methodsByPath.get(path);
    const allow = methods && ROUTABLE_METHODS.filter((m) => methods.has(m)).join(', ');
    const e = allow
      ? new ApiError('method_not_allowed', `Method ${req.method} is not allowed for ${path}; use ${allow}.`, { headers: { allow } })
      : new ApiError('not_found', `Unknown request URL: ${req.method} ${path}.${baseUrlHint(path, methodsByPath)}`);
    // Under the Messages paths (`/v1/messages/batches`, which is not served) Anthropic's SDKs read Anthropic's envelope.
    return MESSAGES_PATH.test(path) ? sendAnthropicError(reply, req.id, e) : sendError(reply, e);
  });

  const { auth } = deps;
  // A key found in the cache is checked without a promise; a miss reads the database.
  const authHook =
    (admin: boolean): AuthHook =>
    (req, _reply, done) => {
      const accept = (who: Principal) => {
        if (admin && who.role !== 'admin') return done(new ApiError('permission_denied', 'This endpoint needs an admin key.'));
        req.principal = who;
        done();
      };
      let who: Principal | Promise<Principal>;
      try {
        who = auth.authenticate(extractToken(req.headers, req.raw.rawHeaders));
      } catch (err) {
        return done(err as Error);
      }
      if (who instanceof Promise) who.then(accept, done);
      else accept(who);
    };
  const requireKey = authHook(false);
  const requireAdmin = authHook(true);
  const ctx: RouteContext = { ...deps, requireKey, requireAdmin };

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  registerHealthRoutes(app, ctx);
  registerModelRoutes(app, ctx);
  registerChatRoutes(app, ctx);
  // Anthropic's Messages API answers errors in Anthropic's envelope, so its routes get their own scope.
  void app.register(async (scope) => {
    scope.setErrorHandler((err: FastifyError, req: FastifyRequest, reply: FastifyReply) => {
      // The request id also here: an error in a root hook (load shedding) comes before the scope's own hook.
      return sendAnthropicError(reply, req.id, routeError(err, req, reply));
    });
    // Anthropic's SDKs read the request id from `request-id`.
    scope.addHook('onRequest', (req, reply, done) => {
      reply.header('request-id', req.id);
      done();
    });
    registerMessagesRoutes(scope, ctx);
  });
  registerStoredChatRoutes(app, ctx);
  registerResponseRoutes(app, ctx);
  // The Responses WebSocket transport, in a scope of its own: the plugin adds an onRequest and an
  // onResponse hook to every route of the scope it is registered in, which every other request would
  // run for nothing. Open sockets are closed by their own shutdown (a running turn finishes first),
  // not the plugin's default, which drops them at once.
  const sockets = new ResponseSockets(config.websocketMaxPerOrg);
  void app.register(async (scope) => {
    await scope.register(websocket, {
      options: { maxPayload: config.bodyLimit },
      // What a client does wrong on an open socket (a frame past the size limit, invalid UTF-8, a bad
      // opcode: ws has closed it with the code that says so) or a connection that drops is the
      // client's doing: logged without a stack, not as the server's error.
      errorHandler: (err: Error & { code?: string }, socket, req) => {
        if (err.code?.startsWith('WS_ERR_') || err.code === 'ECONNRESET' || err.code === 'EPIPE')
          req.log.info({ code: err.code, reason: err.message }, 'websocket closed for a client error');
        else req.log.error({ err }, 'websocket failed');
        socket.terminate();
      },
      preClose: function (this: App, done: () => void) {
        const end = () => this.websocketServer.close(() => done());
        sockets.shutdown().then(end, end);
      },
    });
    registerResponseSocket(scope, ctx, sockets);
  });
  registerConversationRoutes(app, ctx);
  registerAdminRoutes(app, ctx);
  registerUsageRoutes(app, ctx);
  registerConsole(app);

  return app;
}
