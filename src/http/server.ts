import { randomUUID } from 'node:crypto';
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest, type HTTPMethods } from 'fastify';
import cors from '@fastify/cors';
import swagger from '@fastify/swagger';
import { Ajv } from 'ajv';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { Catalogue } from '../core/catalogue.js';
import type { Router } from '../core/router.js';
import type { ResponseService } from '../core/responses.js';
import type { Ledger } from '../core/ledger.js';
import type { Metrics } from '../core/metrics.js';
import type { Limiter } from '../core/limits.js';
import type { LocalEngine } from '../engines/local/local-engine.js';
import type { Store } from '../store/store.js';
import { ApiError } from './errors.js';
import { LoadShedder } from './load-shedder.js';
import { KeyAuthenticator, type Principal } from './auth.js';
import { registerModelRoutes } from '../api/models.js';
import { registerAdminRoutes } from '../api/admin.js';
import { registerHealthRoutes } from '../api/health.js';
import { registerChatRoutes } from '../api/chat.js';
import { registerResponseRoutes } from '../api/responses.js';
import { registerConversationRoutes } from '../api/conversations.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | null;
    /** The catalogue model a generation request used, for metrics. */
    modelId: string | null;
    /** performance.now() when the request arrived. */
    startedAt: number;
  }
}

export interface ServerDeps {
  config: Config;
  store: Store;
  catalogue: Catalogue;
  router: Router;
  reloadDeployments: () => Promise<void>;
  local: LocalEngine;
  responses: ResponseService;
  ledger: Ledger;
  metrics: Metrics;
  limiter: Limiter;
  log: Logger;
}

export type App = FastifyInstance<Server, IncomingMessage, ServerResponse, FastifyBaseLogger, TypeBoxTypeProvider>;
export type AuthHook = (req: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void) => void;

export interface RouteContext extends ServerDeps {
  auth: KeyAuthenticator;
  /** onRequest hooks: authentication runs before the body is read. */
  requireKey: AuthHook;
  requireAdmin: AuthHook;
}

/** A URL for the access log: query values that look like credentials are replaced (clients do put keys there). */
const SECRET_PARAM = /([?&][^=&]*(?:key|token|secret|password|auth)[^=&]*=)[^&]*/gi;
function loggableUrl(url: string): string {
  return url.includes('?') ? url.replace(SECRET_PARAM, '$1[redacted]') : url;
}

const INBOUND_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const ROUTABLE_METHODS: HTTPMethods[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'];

interface ValidationIssue {
  keyword: string;
  instancePath: string;
  message?: string | undefined;
  params: Record<string, unknown>;
}

/** `/messages/0/content` → `messages[0].content` */
function paramName(pointer: string, extra?: string): string {
  const parts = pointer.split('/').filter(Boolean).map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  if (extra !== undefined) parts.push(extra);
  return parts.reduce((acc, p) => (/^\d+$/.test(p) ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

function validationError(issues: readonly ValidationIssue[], where: string): ApiError {
  // For unions ajv reports each branch, then the union; the branch that got past the type check
  // (a range, an enum) says what is really wrong.
  const union = issues.find((i) => i.keyword === 'anyOf' || i.keyword === 'oneOf');
  const specific = union && issues.find((i) => i.instancePath.startsWith(union.instancePath) && !['type', 'anyOf', 'oneOf', 'const'].includes(i.keyword));
  const issue = specific ?? union ?? issues[0];
  if (!issue) return new ApiError('invalid_request', `Invalid ${where}.`);
  if (issue.keyword === 'required') {
    const param = paramName(issue.instancePath, String(issue.params['missingProperty']));
    return new ApiError('missing_required_parameter', `Missing required parameter: '${param}'.`, { param });
  }
  const param = paramName(issue.instancePath) || where;
  let detail: string;
  switch (issue.keyword) {
    case 'enum':
      detail = `must be one of ${(issue.params['allowedValues'] as unknown[]).map((v) => `'${String(v)}'`).join(', ')}`;
      break;
    case 'type':
      return new ApiError('invalid_value', `Invalid type for '${param}': expected ${String(issue.params['type'])}.`, { param });
    case 'anyOf':
    case 'oneOf':
      detail = 'does not match any of the accepted shapes';
      break;
    default:
      detail = issue.message ?? 'is invalid';
  }
  return new ApiError('invalid_value', `Invalid value for '${param}': ${detail}.`, { param });
}

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

function sendError(reply: FastifyReply, e: ApiError): FastifyReply {
  return reply.code(e.status).headers(e.headers).type('application/json; charset=utf-8').send(e.toBody());
}

/**
 * Requests Node's HTTP parser refuses before Fastify sees them (a head over maxHeaderBytes, bad
 * header bytes, a broken request line) still get the envelope and a request id. The connection is
 * then closed gently: what the client is still sending is read and dropped for a moment, because
 * closing with unread bytes makes the kernel reset the connection and the client lose the answer.
 */
const answeredSockets = new WeakSet<Duplex>();
function clientError(err: NodeJS.ErrnoException, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed || answeredSockets.has(socket)) return;
  answeredSockets.add(socket);
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const e = err.code === 'HPE_HEADER_OVERFLOW'
    ? new ApiError('request_header_too_large', 'The request headers are larger than this server accepts.')
    : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new ApiError('request_timeout', 'The request did not arrive in time.')
      : new ApiError('invalid_request', `The request is not valid HTTP (${err.code ?? 'parse error'}).`);
  const body = JSON.stringify(e.toBody());
  const status = e.status;
  socket.removeAllListeners('data');
  socket.on('data', () => undefined);
  socket.once('end', () => socket.destroy());
  setTimeout(() => socket.destroy(), 2000).unref();
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\ncontent-type: application/json; charset=utf-8\r\n`
    + `content-length: ${Buffer.byteLength(body)}\r\nx-request-id: req_${randomUUID().replace(/-/g, '')}\r\nconnection: close\r\n\r\n${body}`);
}

export async function buildServer(deps: ServerDeps): Promise<App> {
  const { config, log } = deps;
  const app = Fastify({
    loggerInstance: log,
    // One log line per request (onResponse below) rather than Fastify's two.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    bodyLimit: config.bodyLimit,
    http: { maxHeaderSize: config.maxHeaderBytes },
    clientErrorHandler: clientError,
    genReqId: (req) => {
      const inbound = req.headers['x-request-id'];
      return typeof inbound === 'string' && INBOUND_REQUEST_ID.test(inbound) ? inbound : `req_${randomUUID().replace(/-/g, '')}`;
    },
    return503OnClosing: true,
    forceCloseConnections: 'idle',
    frameworkErrors: (err, req, reply) => {
      reply.header('x-request-id', req.id);
      const e = err.code === 'FST_ERR_BAD_URL'
        ? new ApiError('invalid_url', `The request URL is malformed: ${req.url}`)
        : toApiError(err, log);
      void sendError(reply, e);
    },
  }).withTypeProvider<TypeBoxTypeProvider>() as unknown as App;

  // Bodies are validated as sent (a string is never a number); query strings and path params are text
  // by nature, so they are coerced. Each schema is compiled once, when its route is registered.
  const bodyAjv = new Ajv({ coerceTypes: false, useDefaults: true, removeAdditional: false, allErrors: false, strict: false });
  const textAjv = new Ajv({ coerceTypes: 'array', useDefaults: true, removeAdditional: false, allErrors: false, strict: false });
  app.setValidatorCompiler(({ schema, httpPart }) => (httpPart === 'body' ? bodyAjv : textAjv).compile(schema));

  app.decorateRequest('principal', null);
  app.decorateRequest('modelId', null);
  app.decorateRequest('startedAt', 0);
  const { metrics } = deps;
  const shedder = new LoadShedder(config.maxInFlight, config.maxEventLoopDelayMs);
  app.addHook('onClose', (_app, done) => {
    shedder.close();
    done();
  });
  const onEnd = () => { shedder.inFlight -= 1; };
  // Hooks on every request are callback-style: an async hook costs a promise per request.
  app.addHook('onRequest', (req, reply, done) => {
    req.startedAt = performance.now();
    reply.header('x-request-id', req.id);
    // Probes and metrics are answered even under load: they are how operators see it.
    if (!req.url.startsWith('/v1/') && !req.url.startsWith('/admin/')) return done();
    const reason = shedder.refuse();
    if (reason) {
      metrics.shed.inc({ reason });
      return done(new ApiError('overloaded', 'The server is overloaded; retry shortly.', { headers: { 'retry-after': '1' } }));
    }
    shedder.inFlight += 1;
    reply.raw.once('close', onEnd);
    done();
  });
  app.addHook('onResponse', (req, reply, done) => {
    const labels = { route: req.routeOptions.url ?? 'unmatched', model: req.modelId ?? '', status: String(reply.statusCode) };
    metrics.requests.inc(labels);
    metrics.duration.observe(labels, reply.elapsedTime / 1000);
    req.log.info({ method: req.method, url: loggableUrl(req.url), status: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'request');
    done();
  });

  // Clients (curl -d, some SDK wrappers) often send JSON without the JSON content type: parse it anyway.
  app.addContentTypeParser('*', { parseAs: 'string' }, app.getDefaultJsonParser('error', 'ignore'));

  // The OpenAPI document is generated from the route schemas that validate requests.
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'Switchyard', version: '0.1.0', description: 'OpenAI-compatible model inference service' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' }, apiKey: { type: 'apiKey', in: 'header', name: 'x-api-key' } } },
      security: [{ bearer: [] }, { apiKey: [] }],
    },
  });

  if (config.corsOrigin !== '') {
    await app.register(cors, {
      origin: config.corsOrigin === '*' ? '*' : config.corsOrigin.split(',').map((o) => o.trim()),
      exposedHeaders: ['x-request-id', 'retry-after', 'x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests'],
      maxAge: 600,
    });
  }

  app.setErrorHandler((err: FastifyError, req: FastifyRequest, reply: FastifyReply) => sendError(reply, toApiError(err, req.log)));
  app.setNotFoundHandler((req, reply) =>
    sendError(reply, new ApiError('not_found', `Unknown request URL: ${req.method} ${req.url.split('?')[0]}.`)));

  // Remember which methods each path has, so the others answer 405 rather than 404.
  const methodsByPath = new Map<string, Set<string>>();
  app.addHook('onRoute', (route) => {
    const set = methodsByPath.get(route.url) ?? new Set<string>();
    for (const m of [route.method].flat()) set.add(m);
    methodsByPath.set(route.url, set);
  });

  const auth = new KeyAuthenticator(deps.store, config.keyCacheTtlMs);
  // A key found in the cache is checked without a promise; a miss reads the database.
  const authHook = (admin: boolean): AuthHook => (req, _reply, done) => {
    const accept = (who: Principal) => {
      if (admin && who.role !== 'admin') return done(new ApiError('permission_denied', 'This endpoint needs an admin key.'));
      req.principal = who;
      done();
    };
    let who: Principal | Promise<Principal>;
    try {
      who = auth.authenticate(req.headers);
    } catch (err) {
      return done(err as Error);
    }
    if (who instanceof Promise) who.then(accept, done);
    else accept(who);
  };
  const requireKey = authHook(false);
  const requireAdmin = authHook(true);
  const ctx: RouteContext = { ...deps, auth, requireKey, requireAdmin };

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  registerHealthRoutes(app, ctx);
  registerModelRoutes(app, ctx);
  registerChatRoutes(app, ctx);
  registerResponseRoutes(app, ctx);
  registerConversationRoutes(app, ctx);
  registerAdminRoutes(app, ctx);

  for (const [url, methods] of [...methodsByPath]) {
    if (url === '*' || url === '/*') continue;
    const allowed = ROUTABLE_METHODS.filter((m) => methods.has(m));
    const others = ROUTABLE_METHODS.filter((m) => !methods.has(m));
    if (others.length === 0) continue;
    const allow = allowed.join(', ');
    app.route({
      method: others,
      url,
      schema: { hide: true },
      handler: (req, reply) => sendError(reply, new ApiError('method_not_allowed',
        `Method ${req.method} is not allowed for ${url}; use ${allow}.`, { headers: { allow } })),
    });
  }
  return app;
}
