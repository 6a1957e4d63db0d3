import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { Catalogue } from '../core/catalogue.js';
import type { Router } from '../core/router.js';
import type { SchemaOutcomes } from '../core/metrics.js';
import type { ResponseService } from '../core/responses/service.js';
import type { ConversationService } from '../core/responses/conversations.js';
import type { StoredCompletions } from '../core/stored-completions.js';
import type { Ledger } from '../core/ledger.js';
import type { Metrics } from '../core/metrics.js';
import type { Limiter } from '../core/limits.js';
import type { GenerationPipeline } from '../core/generation.js';
import type { KeyAuthenticator } from '../core/principal.js';
import type { AdminService } from '../core/admin.js';
import type { Store } from '../store/store.js';
import type { ReasoningSeal } from '../core/reasoning-seal.js';
import type { ResponsesRequest } from '../protocols/responses/request.js';

/** The local engine's state as operators see it (GET /admin/local/loaded). */
export interface LocalStatus {
  models: Array<{
    model: string | null;
    file: string;
    bytes: number;
    active: number;
    queued: number;
    sequences: number;
    last_used: number;
  }>;
  schemaViolations: number;
  schemaOutcomes: SchemaOutcomes;
  cachedSchemas: number;
}

/** What the routes are given: the service's parts, and the hooks that authenticate. */
export interface ServerDeps {
  config: Config;
  store: Store;
  catalogue: Catalogue;
  router: Router;
  admin: AdminService;
  auth: KeyAuthenticator;
  /** What the local engine has loaded now, for operators. */
  localStatus: () => LocalStatus;
  responses: ResponseService<ResponsesRequest>;
  conversations: ConversationService;
  /** Chat completions created with `store: true`. */
  storedCompletions: StoredCompletions;
  ledger: Ledger;
  metrics: Metrics;
  limiter: Limiter;
  /** The generation pipeline every generation endpoint runs through. */
  pipeline: GenerationPipeline;
  /** Seals what clients carry between turns (reasoning, compactions, thinking signatures). */
  seal: ReasoningSeal;
  log: Logger;
}

export type App = FastifyInstance<Server, IncomingMessage, ServerResponse, FastifyBaseLogger, TypeBoxTypeProvider>;
export type AuthHook = (req: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void) => void;

export interface RouteContext extends ServerDeps {
  /** onRequest hooks: authentication runs before the body is read. */
  requireKey: AuthHook;
  requireAdmin: AuthHook;
}
