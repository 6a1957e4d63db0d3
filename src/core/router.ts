import { basename } from 'node:path';
import type { Logger } from 'pino';
import { ApiError, CancelledError, modelNotFound } from './errors.js';
import type { Principal } from './principal.js';
import type { Catalogue } from './catalogue.js';
import { newTally, type GenerationEvent, type GenerationRequest } from './canonical.js';
import type { Model } from './model-spec.js';
import type { DeploymentTarget, Engine } from '../engines/engine.js';
import { keyVarRefusal } from './upstream-keys.js';
import { estimateInputTokens } from './estimate.js';
import type { Deployment } from './deployments.js';
import { DeploymentHealth, RetryBudget, type HealthPolicy, type Standing } from './deployment-health.js';

/**
 * A model without a deployment: 503 with `retry-after` (every 429 and 503 carries one, as the OpenAI
 * convention has it) of a minute, since an operator has to add one; `x-should-retry: false` already
 * keeps the SDKs from retrying on their own.
 */
const noDeployment = (model: Model): ApiError =>
  new ApiError('no_deployment', `The model '${model.id}' has no deployment on this server.`, {
    param: 'model',
    final: true,
    retryAfterMs: 60_000,
  });

/** A deployment as the router uses it: the engine that serves it and the engine's view of it. */
interface Route {
  target: DeploymentTarget;
  engine: Engine;
  weight: number;
  deployment: Deployment | undefined;
  /** What is wrong with its key here, found when the table is built (see keyProblem). */
  keyProblem?: string;
}

/** A deployment that speaks Anthropic's Messages API. */
const isAnthropic = (r: Route): boolean => r.target.engine === 'upstream' && r.target.api === 'anthropic';

export interface RoutingPolicy {
  /** Tries one request may make, the first included (each deployment once; a lone deployment twice). */
  maxAttempts: number;
  /** Time allowed for all of one request's tries to get an answer started (a hung upstream costs it once). */
  attemptsTimeoutMs: number;
  retryBudgetRatio: number;
  health: HealthPolicy;
  /** Extra variables stored deployments may name as their key (see core/upstream-keys.ts). */
  keyVars: readonly string[];
}

export interface RouterHooks {
  /** A deployment failed and was skipped (for metrics). */
  onDeploymentError?: (deployment: string, code: string) => void;
  onRetry?: () => void;
  onHealthChange?: (deployment: string, up: boolean) => void;
  /** A deployment is no longer routed to (deleted): its health series goes with it. */
  onDeploymentGone?: (deployment: string) => void;
}

const upstreamId = (d: Route): string | undefined => (d.target.engine === 'upstream' ? d.target.id : undefined);

/**
 * Model → deployments. A local GGUF file is served by the local engine; catalogue models with
 * upstream deployments are spread over them by weight. A request that fails before its first event
 * (connection refused or timed out, 429, 5xx) moves on to the next deployment, within the retry
 * budget; deployments that keep failing are ejected until a health check brings them back.
 */
export class Router {
  private upstreams = new Map<string, Route[]>();
  private byId = new Map<string, Route>();
  /** Deployment problems already logged (see setDeployments). */
  private reported = new Set<string>();
  private readonly health: DeploymentHealth;
  private readonly budget: RetryBudget;
  /** Deployments whose health has been reported once. */
  private readonly announced = new Set<string>();

  constructor(
    private readonly catalogue: Catalogue,
    private readonly local: Engine,
    private readonly upstream: Engine,
    /** Deployments from the config file; those in the database come through setDeployments. */
    private readonly fromFile: readonly Deployment[],
    private readonly env: NodeJS.ProcessEnv,
    private readonly log: Logger,
    private readonly policy: RoutingPolicy,
    private readonly hooks: RouterHooks = {},
  ) {
    this.budget = new RetryBudget(policy.retryBudgetRatio);
    this.health = new DeploymentHealth(
      policy.health,
      async (id) => {
        const d = this.byId.get(id);
        return d ? ((await d.engine.probe?.(d.target)) ?? true) : true;
      },
      log,
      hooks.onHealthChange,
    );
    this.setDeployments([]);
  }

  /** The config file's deployments plus these (from the database); replaces the routing table at once. */
  setDeployments(stored: readonly Deployment[]): void {
    const table = new Map<string, Route[]>();
    const byId = new Map<string, Route>();
    // The table is rebuilt on every catalogue refresh: a problem is logged when it appears, not every time.
    const problems = new Set<string>();
    const once = (key: string, report: () => void) => {
      problems.add(key);
      if (!this.reported.has(key)) report();
    };
    for (const d of [...this.fromFile, ...stored]) {
      const guarded = d.source === 'database';
      // A stored row naming another variable (written before this rule, or by hand) gets no key at all.
      const refused = guarded && d.apiKeyEnv ? keyVarRefusal(d.apiKeyEnv, this.policy.keyVars) : undefined;
      if (refused)
        once(`refused\0${d.id}\0${d.apiKeyEnv}`, () =>
          this.log.error({ deployment: d.id, env: d.apiKeyEnv }, `deployment key variable refused: ${refused}`),
        );
      const apiKey = d.apiKeyEnv && !refused ? this.env[d.apiKeyEnv] : undefined;
      if (d.apiKeyEnv && !refused && !apiKey)
        once(`unset\0${d.id}\0${d.apiKeyEnv}`, () =>
          this.log.warn({ deployment: d.id, env: d.apiKeyEnv }, 'deployment API key variable is not set'),
        );
      const keyProblem = refused
        ? `api_key_env '${d.apiKeyEnv}' is refused: ${refused}`
        : d.apiKeyEnv && !apiKey
          ? `api_key_env '${d.apiKeyEnv}' is not set in this server's environment: requests go upstream without a key until it is set and the server restarted`
          : undefined;
      const route: Route = {
        engine: this.upstream,
        weight: d.weight,
        deployment: d,
        ...(keyProblem !== undefined && { keyProblem }),
        target: {
          engine: 'upstream',
          id: d.id,
          baseUrl: d.baseUrl,
          apiKey,
          upstreamModel: d.upstreamModel ?? d.model,
          api: d.api,
          guarded,
        },
      };
      table.set(d.model, [...(table.get(d.model) ?? []), route]);
      byId.set(d.id, route);
    }
    this.upstreams = table;
    this.byId = byId;
    this.reported = problems;
    this.health.retain(new Set(byId.keys()));
    for (const id of this.announced) {
      if (byId.has(id)) continue;
      this.announced.delete(id);
      this.hooks.onDeploymentGone?.(id);
    }
    // Each deployment's health series exists from the start (1), not only after a first ejection.
    for (const id of byId.keys()) {
      if (this.announced.has(id)) continue;
      this.announced.add(id);
      this.hooks.onHealthChange?.(id, this.health.standing(id) !== 'ejected');
    }
  }

  close(): void {
    this.health.close();
  }

  /** Every deployment now routed to, with its health, for the admin API. */
  listDeployments(): Array<{ deployment: Deployment; health: Standing }> {
    return [...this.byId.values()].flatMap((r) =>
      r.deployment ? [{ deployment: r.deployment, health: this.health.standing(r.deployment.id) }] : [],
    );
  }

  /**
   * What is wrong with a deployment's key here, if anything: a variable named but not set in this
   * process's environment (its requests go upstream with no key), or one the policy refuses.
   */
  keyProblem(id: string): string | undefined {
    return this.byId.get(id)?.keyProblem;
  }

  /**
   * Whether this server generates with the model now: a local file, or at least one upstream
   * deployment, and the status `active` (a pending, inactive or deleted model is refused whatever
   * serves it, so the admin API showed a deleted model as available).
   */
  canServe(model: Model): boolean {
    if (model.model_type !== 'text_generation' || model.status !== 'active') return false;
    return (this.upstreams.get(model.id)?.length ?? 0) > 0 || this.catalogue.isLocal(model.id);
  }

  /** Whether every deployment that serves the model (and no local file) speaks Anthropic's Messages API. */
  anthropicOnly(model: Model): boolean {
    const routes = this.upstreams.get(model.id);
    if (!routes?.length || this.catalogue.isLocal(model.id)) return false;
    return routes.every(isAnthropic);
  }

  /** The model a principal may generate with, or the answer decided in docs/decisions.md. */
  resolve(id: string, who: Principal): Model {
    const model = this.catalogue.get(id, who);
    if (!model) throw modelNotFound(id, this.catalogue.suggestion(id, who)?.id);
    if (model.status === 'inactive') throw new ApiError('model_inactive', `The model '${id}' is inactive.`, { param: 'model' });
    if (model.status === 'pending') {
      throw new ApiError('model_not_ready', `The model '${id}' is not ready yet.`, { param: 'model', retryAfterMs: 30_000 });
    }
    if (model.model_type !== 'text_generation') {
      throw new ApiError(
        'invalid_value',
        `The model '${id}' is a ${model.model_type} model; this endpoint needs a text_generation model.`,
        { param: 'model' },
      );
    }
    return model;
  }

  private deployments(model: Model): Route[] {
    const local = this.catalogue.localModels().find((l) => l.model.id === model.id);
    if (local) {
      return [
        {
          engine: this.local,
          weight: 1,
          deployment: undefined,
          target: {
            engine: 'local',
            file: local.file,
            contextLength: model.context_length ?? Infinity,
            reasoning: model.capabilities.includes('reasoning'),
          },
        },
      ];
    }
    const ups = this.upstreams.get(model.id) ?? [];
    if (ups.length <= 1) return ups;
    // Weighted random first pick; the others follow as failover candidates.
    const pool = [...ups];
    const order: Route[] = [];
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
   * after a 429 are left out. Each deployment is tried once, but a lone deployment gets a second try
   * (a stale keep-alive connection, a restart); never more than maxAttempts in all.
   */
  private attempts(model: Model, req: GenerationRequest): Route[] {
    let order = this.deployments(model);
    // Anthropic's API has no JSON mode: a json_object request goes to the model's other deployments
    // (the pipeline refuses it for a model that only Anthropic deployments serve). An outside pass
    // got a 400 on some of the same requests, by the weighted pick.
    if (req.responseFormat?.type === 'json_object' && order.length > 1) {
      const others = order.filter((d) => !isAnthropic(d));
      if (others.length > 0) order = others;
    }
    if (order.length === 0) {
      throw noDeployment(model);
    }
    const now = Date.now();
    const up: Route[] = [];
    const out: Route[] = [];
    let wait = Infinity;
    for (const d of order) {
      const id = upstreamId(d);
      const standing = id === undefined ? 'up' : this.health.standing(id, now);
      if (standing === 'cooling') wait = Math.min(wait, this.health.coolingFor(id!, now));
      else (standing === 'up' ? up : out).push(d);
    }
    const usable = [...up, ...out];
    if (usable.length === 0) {
      throw new ApiError(
        'rate_limited',
        `Every deployment of '${model.id}' is rate limited upstream; retry after ${Math.max(1, Math.ceil(wait / 1000))} s.`,
        { retryAfterMs: wait },
      );
    }
    if (usable[0]!.target.engine === 'local') return usable;
    const tries = usable.length === 1 ? [usable[0]!, usable[0]!] : usable;
    return tries.slice(0, this.policy.maxAttempts);
  }

  /**
   * The prompt tokens a request would use: counted by the engine where it can (a local model's own
   * tokenizer), else estimated from the text (`estimated`), since chat-completions upstreams have
   * no counting endpoint.
   */
  async countInputTokens(req: GenerationRequest, model: Model): Promise<{ tokens: number; estimated: boolean }> {
    const first = this.deployments(model)[0];
    if (!first) throw noDeployment(model);
    if (first.engine.countInputTokens) return first.engine.countInputTokens(req, first.target);
    return { tokens: estimateInputTokens(req), estimated: true };
  }

  /**
   * Starts the request on the first deployment that takes it, and hands back its first event and
   * the rest of its stream (read directly from the engine: no extra async layer per event).
   * `trace.deployment` is set to the deployment that serves the request.
   */
  async open(
    req: GenerationRequest,
    model: Model,
    trace: { deployment?: string } = {},
  ): Promise<{ first: GenerationEvent | undefined; rest: AsyncIterator<GenerationEvent> }> {
    const tries = this.attempts(model, req);
    this.budget.request();
    const deadline = Date.now() + this.policy.attemptsTimeoutMs;
    let lastError: ApiError | undefined;
    for (let attempt = 0; attempt < tries.length; attempt++) {
      const d = tries[attempt]!;
      const id = upstreamId(d);
      if (attempt > 0) {
        // Cooled earlier in this request (429), or the budget or the time is spent: the last error stands.
        if (id !== undefined && this.health.standing(id) === 'cooling') continue;
        if (Date.now() >= deadline) break;
        if (!this.budget.tryRetry()) break;
        this.hooks.onRetry?.();
        // The same deployment again: give it a moment.
        if (tries.indexOf(d) < attempt) await new Promise((r) => setTimeout(r, 50));
        // Stopped meanwhile (its client left, or a shutdown): cancelled, not the last try's error.
        if (req.signal.aborted) throw new CancelledError();
      }
      trace.deployment = id ?? `local:${basename((d.target as { file: string }).file)}`;
      // Each try starts from nothing: what a failed one counted was not produced for the client.
      Object.assign(req.tally, newTally());
      const rest = d.engine
        .generate(req, d.target, {
          deadline,
          outputCap: req.maxOutputTokens ?? model.context_length ?? undefined,
          contextLength: model.context_length ?? undefined,
        })
        [Symbol.asyncIterator]();
      try {
        const first = await rest.next();
        if (id !== undefined) this.health.success(id);
        return { first: first.done ? undefined : first.value, rest };
      } catch (err) {
        // Every failed attempt on a deployment is counted once, here (metering counts only the
        // failures after a stream started).
        const failed =
          err instanceof ApiError && id !== undefined && !req.signal.aborted && (err.failover || err.code.startsWith('upstream_'));
        if (failed) this.hooks.onDeploymentError?.(id, err.code);
        if (failed && err.failover) {
          lastError = err;
          if (err.code === 'rate_limited') this.health.rateLimited(id, err.retryAfterMs ?? 1000);
          else this.health.failure(id);
          // A timed-out try spent the time allowed for all of them.
          if (err.code === 'upstream_timeout' && Date.now() >= deadline) break;
          this.log.warn({ model: model.id, deployment: id, error: err.message }, 'deployment failed; trying the next');
          continue;
        }
        // The client's error does not name the deployment (internal topology); the log does.
        if (failed) this.log.warn({ model: model.id, deployment: id, error: err.message }, 'deployment failed');
        throw err;
      }
    }
    if (lastError) throw lastError;
    throw new CancelledError();
  }
}
