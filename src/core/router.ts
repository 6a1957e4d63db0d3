import { basename } from 'node:path';
import type { Logger } from 'pino';
import { ApiError, modelNotFound } from '../http/errors.js';
import type { Principal } from '../http/auth.js';
import type { Catalogue } from './catalogue.js';
import type { GenerationEvent, GenerationRequest } from './canonical.js';
import type { Capability, Model } from './model-spec.js';
import type { DeploymentTarget, Engine } from '../engines/engine.js';

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

/**
 * Model → deployments. A local GGUF file is served by the local engine; catalogue models with
 * upstream deployments are spread over them by weight, and a request that fails before its first
 * event (connection refused, 5xx) moves on to the next deployment.
 */
export class Router {
  private upstreams = new Map<string, Deployment[]>();

  constructor(
    private readonly catalogue: Catalogue,
    private readonly local: Engine,
    private readonly upstream: Engine,
    private readonly configured: readonly DeploymentConfig[],
    private readonly env: NodeJS.ProcessEnv,
    private readonly log: Logger,
    /** Told about a deployment that failed and was skipped (for metrics). */
    private readonly onDeploymentError?: (deployment: string, code: string) => void,
  ) {
    this.setDeployments([]);
  }

  /** Config-file deployments plus the given ones (from the admin API); replaces the routing table at once. */
  setDeployments(stored: readonly DeploymentConfig[]): void {
    const table = new Map<string, Deployment[]>();
    [...this.configured, ...stored].forEach((d, i) => {
      const id = d.id ?? `${d.model}#${i}`;
      const apiKey = d.apiKeyEnv ? this.env[d.apiKeyEnv] : undefined;
      if (d.apiKeyEnv && !apiKey) this.log.warn({ deployment: id, env: d.apiKeyEnv }, 'deployment API key variable is not set');
      const list = table.get(d.model) ?? [];
      list.push({
        engine: this.upstream,
        weight: d.weight ?? 1,
        target: { engine: 'upstream', id, baseUrl: d.baseUrl, apiKey, upstreamModel: d.upstreamModel ?? d.model, api: d.api ?? 'chat' },
      });
      table.set(d.model, list);
    });
    this.upstreams = table;
  }

  /** Every deployment now routed to, for the admin API. */
  listDeployments(): Array<{ id: string; model: string; base_url: string; upstream_model: string; weight: number; api: string }> {
    return [...this.upstreams.entries()].flatMap(([model, ds]) => ds.map((d) => {
      const t = d.target as Extract<DeploymentTarget, { engine: 'upstream' }>;
      return { id: t.id, model, base_url: t.baseUrl, upstream_model: t.upstreamModel, weight: d.weight, api: t.api };
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
   * Starts the request on the first deployment that takes it, and hands back its first event and
   * the rest of its stream (read directly from the engine: no extra async layer per event).
   * `trace.deployment` is set to the deployment that serves the request.
   */
  async open(req: GenerationRequest, model: Model, trace: { deployment?: string } = {}): Promise<{ first: GenerationEvent | undefined; rest: AsyncIterator<GenerationEvent> }> {
    const candidates = this.deployments(model);
    if (candidates.length === 0) {
      throw new ApiError('no_deployment', `The model '${model.id}' has no deployment on this server.`, {
        param: 'model', headers: { 'x-should-retry': 'false' },
      });
    }
    let lastError: ApiError | undefined;
    for (const d of candidates) {
      trace.deployment = d.target.engine === 'upstream' ? d.target.id : `local:${basename(d.target.file)}`;
      const rest = d.engine.generate(req, d.target)[Symbol.asyncIterator]();
      try {
        const first = await rest.next();
        return { first: first.done ? undefined : first.value, rest };
      } catch (err) {
        if (err instanceof ApiError && err.failover && !req.signal.aborted) {
          lastError = err;
          this.onDeploymentError?.(trace.deployment, err.code);
          this.log.warn({ model: model.id, deployment: d.target.engine === 'upstream' ? d.target.id : 'local', error: err.message }, 'deployment failed; trying the next');
          continue;
        }
        throw err;
      }
    }
    throw lastError!;
  }
}
