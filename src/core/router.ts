import { basename } from 'node:path';
import type { Logger } from 'pino';
import { ApiError, modelNotFound } from '../http/errors.js';
import type { Principal } from '../http/auth.js';
import type { Catalogue } from './catalogue.js';
import type { GenerationEvent, GenerationRequest } from './canonical.js';
import type { Capability, Model } from './model-spec.js';
import type { DeploymentTarget, Engine } from '../engines/engine.js';
import { DeploymentHealth, RetryBudget, type HealthPolicy, type Standing } from './deployment-health.js';

export interface DeploymentConfig {
  model: string;
  baseUrl: string;
  apiKeyEnv?: string | undefined;
  upstreamModel?: string | undefined;
  weight?: number | undefined;
  id?: string | undefined;
  api?: 'chat' | 'responses' | undefined;
}

interface Deployment {
  target: DeploymentTarget;
  engine: Engine;
  weight: number;
}

export interface RoutingPolicy {
  /** Deployments one request may try, the first included. */
  maxAttempts: number;
  retryBudgetRatio: number;
  health: HealthPolicy;
}

export const ROUTING_DEFAULTS: RoutingPolicy = {
  maxAttempts: 3, retryBudgetRatio: 0.2, health: { failures: 5, ejectMs: 30_000, probeIntervalMs: 2_000 },
};

export interface RouterHooks {
  /** A deployment failed and was skipped (for metrics). */
  onDeploymentError?: (deployment: string, code: string) => void;
  onRetry?: () => void;
  onHealthChange?: (deployment: string, up: boolean) => void;
}

const upstreamId = (d: Deployment): string | undefined => (d.target.engine === 'upstream' ? d.target.id : undefined);

/**
 * Model → deployments. A local GGUF file is served by the local engine; catalogue models with
 * upstream deployments are spread over them by weight. A request that fails before its first event
 * (connection refused or timed out, 429, 5xx) moves on to the next deployment, within the retry
 * budget; deployments that keep failing are ejected until a health check brings them back.
 */
export class Router {
  private upstreams = new Map<string, Deployment[]>();
  private byId = new Map<string, Deployment>();
  private readonly health: DeploymentHealth;
  private readonly budget: RetryBudget;

  constructor(
    private readonly catalogue: Catalogue,
    private readonly local: Engine,
    private readonly upstream: Engine,
    private readonly configured: readonly DeploymentConfig[],
    private readonly env: NodeJS.ProcessEnv,
    private readonly log: Logger,
    private readonly policy: RoutingPolicy = ROUTING_DEFAULTS,
    private readonly hooks: RouterHooks = {},
  ) {
    this.budget = new RetryBudget(policy.retryBudgetRatio);
    this.health = new DeploymentHealth(policy.health, async (id) => {
      const d = this.byId.get(id);
      return d ? (await d.engine.probe?.(d.target)) ?? true : true;
    }, log, hooks.onHealthChange);
    this.setDeployments([]);
  }

  /** Config-file deployments plus the given ones (from the admin API); replaces the routing table at once. */
  setDeployments(stored: readonly DeploymentConfig[]): void {
    const table = new Map<string, Deployment[]>();
    const byId = new Map<string, Deployment>();
    const fromFile = this.configured.length;
    [...this.configured, ...stored].forEach((d, i) => {
      const id = d.id ?? `${d.model}#${i}`;
      const apiKey = d.apiKeyEnv ? this.env[d.apiKeyEnv] : undefined;
      if (d.apiKeyEnv && !apiKey) this.log.warn({ deployment: id, env: d.apiKeyEnv }, 'deployment API key variable is not set');
      const list = table.get(d.model) ?? [];
      const deployment: Deployment = {
        engine: this.upstream,
        weight: d.weight ?? 1,
        target: { engine: 'upstream', id, baseUrl: d.baseUrl, apiKey, upstreamModel: d.upstreamModel ?? d.model, api: d.api ?? 'chat', guarded: i >= fromFile },
      };
      list.push(deployment);
      byId.set(id, deployment);
      table.set(d.model, list);
    });
    this.upstreams = table;
    this.byId = byId;
    this.health.retain(new Set(byId.keys()));
  }

  close(): void {
    this.health.close();
  }

  /** Every deployment now routed to, for the admin API. */
  listDeployments(): Array<{ id: string; model: string; base_url: string; upstream_model: string; weight: number; api: string; health: Standing }> {
    return [...this.upstreams.entries()].flatMap(([model, ds]) => ds.map((d) => {
      const t = d.target as Extract<DeploymentTarget, { engine: 'upstream' }>;
      return { id: t.id, model, base_url: t.baseUrl, upstream_model: t.upstreamModel, weight: d.weight, api: t.api, health: this.health.standing(t.id) };
    }));
  }

  /** The model a principal may generate with, or the answer decided in docs/decisions.md. */
  resolve(id: string, who: Principal): Model {
    const model = this.catalogue.get(id, who);
    if (!model) throw modelNotFound(id);
    if (model.status === 'inactive') throw new ApiError('model_inactive', `The model '${id}' is inactive.`, { param: 'model' });
    if (model.status === 'pending') {
      throw new ApiError('model_not_ready', `The model '${id}' is not ready yet.`, { param: 'model', headers: { 'retry-after': '30' } });
    }
    if (model.model_type !== 'text_generation') {
      throw new ApiError('invalid_value', `The model '${id}' is a ${model.model_type} model; this endpoint needs a text_generation model.`, { param: 'model' });
    }
    return model;
  }

  /** A request that needs what the model does not advertise gets a 400 naming the capability. */
  requireCapabilities(model: Model, req: Pick<GenerationRequest, 'tools' | 'toolChoice' | 'responseFormat'>): void {
    const need = (cap: Capability, param: string) => {
      if (!model.capabilities.includes(cap)) {
        throw new ApiError('missing_capability', `The model '${model.id}' does not support ${cap}.`, { param });
      }
    };
    if (req.tools?.length && req.toolChoice !== 'none') need('function_calling', 'tools');
    if (req.responseFormat && req.responseFormat.type !== 'text') need('structured_output', 'response_format');
  }

  private deployments(model: Model): Deployment[] {
    const local = this.catalogue.localModels().find((l) => l.model.id === model.id);
    if (local) {
      return [{ engine: this.local, weight: 1, target: {
        engine: 'local', file: local.file, contextLength: model.context_length ?? Infinity, reasoning: model.capabilities.includes('reasoning'),
      } }];
    }
    const ups = this.upstreams.get(model.id) ?? [];
    if (ups.length <= 1) return ups;
    // Weighted random first pick; the others follow as failover candidates.
    const pool = [...ups];
    const order: Deployment[] = [];
    while (pool.length) {
      const total = pool.reduce((a, d) => a + d.weight, 0);
      let r = Math.random() * total;
      const i = pool.findIndex((d) => (r -= d.weight) < 0);
      order.push(...pool.splice(i < 0 ? pool.length - 1 : i, 1));
    }
    return order;
  }

  /**
   * Healthy deployments in weighted order, then ejected ones as a last resort; deployments cooling
   * after a 429 are left out. With fewer deployments than attempts the list repeats, so a single
   * deployment still gets a second try (a stale keep-alive connection, a restart).
   */
  private attempts(model: Model): Deployment[] {
    const order = this.deployments(model);
    if (order.length === 0) {
      throw new ApiError('no_deployment', `The model '${model.id}' has no deployment on this server.`, {
        param: 'model', headers: { 'x-should-retry': 'false' },
      });
    }
    const now = Date.now();
    const up: Deployment[] = [];
    const out: Deployment[] = [];
    let wait = Infinity;
    for (const d of order) {
      const id = upstreamId(d);
      const standing = id === undefined ? 'up' : this.health.standing(id, now);
      if (standing === 'cooling') wait = Math.min(wait, this.health.coolingFor(id!, now));
      else (standing === 'up' ? up : out).push(d);
    }
    const usable = [...up, ...out];
    if (usable.length === 0) {
      const seconds = String(Math.max(1, Math.ceil(wait / 1000)));
      throw new ApiError('rate_limited', `Every deployment of '${model.id}' is rate limited upstream; retry after ${seconds} s.`, { headers: { 'retry-after': seconds } });
    }
    if (usable[0]!.target.engine === 'local') return usable;
    return Array.from({ length: Math.max(usable.length, this.policy.maxAttempts) }, (_, i) => usable[i % usable.length]!).slice(0, this.policy.maxAttempts);
  }

  /**
   * Starts the request on the first deployment that takes it, and hands back its first event and
   * the rest of its stream (read directly from the engine: no extra async layer per event).
   * `trace.deployment` is set to the deployment that serves the request.
   */
  async open(req: GenerationRequest, model: Model, trace: { deployment?: string } = {}): Promise<{ first: GenerationEvent | undefined; rest: AsyncIterator<GenerationEvent> }> {
    const tries = this.attempts(model);
    this.budget.request();
    let lastError: ApiError | undefined;
    for (let attempt = 0; attempt < tries.length; attempt++) {
      const d = tries[attempt]!;
      const id = upstreamId(d);
      if (attempt > 0) {
        // Cooled earlier in this request (429), or the budget is spent: the last error stands.
        if (id !== undefined && this.health.standing(id) === 'cooling') continue;
        if (!this.budget.tryRetry()) break;
        this.hooks.onRetry?.();
        // The same deployment again: give it a moment.
        if (tries.indexOf(d) < attempt) await new Promise((r) => setTimeout(r, 50 * attempt));
        if (req.signal.aborted) break;
      }
      trace.deployment = id ?? `local:${basename((d.target as { file: string }).file)}`;
      const rest = d.engine.generate(req, d.target)[Symbol.asyncIterator]();
      try {
        const first = await rest.next();
        if (id !== undefined) this.health.success(id);
        return { first: first.done ? undefined : first.value, rest };
      } catch (err) {
        if (err instanceof ApiError && err.failover && !req.signal.aborted && id !== undefined) {
          lastError = err;
          if (err.code === 'rate_limited') this.health.rateLimited(id, retryAfterMs(err.headers['retry-after']));
          else this.health.failure(id);
          this.hooks.onDeploymentError?.(id, err.code);
          this.log.warn({ model: model.id, deployment: id, error: err.message }, 'deployment failed; trying the next');
          continue;
        }
        throw err;
      }
    }
    if (lastError) throw lastError;
    throw new ApiError('invalid_request', 'The request was cancelled.');
  }
}

/** retry-after as seconds or an HTTP date; capped at a minute so one answer cannot park a deployment. */
function retryAfterMs(value: string | undefined): number {
  if (!value) return 1000;
  const seconds = Number(value);
  const ms = Number.isFinite(seconds) ? seconds * 1000 : Date.parse(value) - Date.now();
  return Math.min(60_000, Math.max(0, Number.isFinite(ms) ? ms : 1000));
}
