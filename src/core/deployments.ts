import type { DeploymentRecord } from '../store/store.js';
import { nowSeconds } from './ids.js';

/**
 * An upstream deployment of a catalogue model: where the model is served, and how. Deployments come
 * from the config file (the operator's, trusted) or from the database (added through the admin API
 * or the CLI, held to the address policy and the key-variable rule); `source` says which.
 */
export interface Deployment {
  id: string;
  model: string;
  /** Base URL of the upstream's API, e.g. http://10.0.0.5:8000/v1 */
  baseUrl: string;
  /** The environment variable holding the upstream's key; the key itself is never stored. */
  apiKeyEnv: string | null;
  /** The model name the upstream uses; null: the catalogue id. */
  upstreamModel: string | null;
  weight: number;
  /** Whether the upstream speaks chat completions only or the Responses API natively. */
  api: 'chat' | 'responses' | 'anthropic';
  source: 'file' | 'database';
  /** Unix seconds, for deployments in the database. */
  createdAt: number | null;
}

/** A config-file entry (its keys as the file spells them). */
export interface DeploymentSpec {
  model: string;
  baseUrl: string;
  apiKeyEnv?: string | undefined;
  upstreamModel?: string | undefined;
  weight?: number | undefined;
  id?: string | undefined;
  api?: 'chat' | 'responses' | 'anthropic' | undefined;
}

/** A deployment from what an operator wrote (a config-file entry or an admin request), defaults filled in. */
export function deploymentFrom(d: DeploymentSpec, id: string, source: Deployment['source'], createdAt: number | null): Deployment {
  return {
    id,
    model: d.model,
    baseUrl: d.baseUrl,
    apiKeyEnv: d.apiKeyEnv ?? null,
    upstreamModel: d.upstreamModel ?? null,
    weight: d.weight ?? 1,
    api: d.api ?? 'chat',
    source,
    createdAt,
  };
}

/** A config-file deployment; without an id it is `config-<n>` (not named after the model: ids are metric labels, and a model may be private). */
export function fileDeployment(d: DeploymentSpec, index: number): Deployment {
  return deploymentFrom(d, d.id ?? `config-${index}`, 'file', null);
}

export function storedDeployment(r: DeploymentRecord): Deployment {
  return {
    id: r.id,
    model: r.model,
    baseUrl: r.base_url,
    apiKeyEnv: r.api_key_env,
    upstreamModel: r.upstream_model,
    weight: r.weight,
    api: r.api,
    source: 'database',
    createdAt: r.created_at,
  };
}

export function deploymentRecord(d: Deployment): DeploymentRecord {
  return {
    id: d.id,
    model: d.model,
    base_url: d.baseUrl,
    api_key_env: d.apiKeyEnv,
    upstream_model: d.upstreamModel,
    weight: d.weight,
    api: d.api,
    created_at: d.createdAt ?? nowSeconds(),
  };
}
