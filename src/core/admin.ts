import { ApiError } from './errors.js';
import { newId, nowSeconds } from './ids.js';
import { createKey, type CreatedKey } from './keys.js';
import type { Catalogue } from './catalogue.js';
import { deploymentFrom, deploymentRecord, storedDeployment, type Deployment, type DeploymentSpec } from './deployments.js';
import { keyVarRefusal } from './upstream-keys.js';
import type { Model, ModelPatch, ModelSpec } from './model-spec.js';
import type { AddressPolicy } from '../engines/upstream/address-policy.js';
import type { ApiKeyRecord, KeyRole, Limits, Org, Store, UsageFilter, UsageGroup, UsageTotal } from '../store/store.js';

/** Told when something other processes cache has changed here, so this process's caches follow at once. */
export interface AdminHooks {
  keyChanged?(id: string): void;
  orgChanged?(id: string): void;
  deploymentsChanged?(): Promise<void>;
  /** The catalogue was changed here (and this process's catalogue already reloaded). */
  catalogueChanged?(): void;
}

/** A deployment to add, as the admin API and the CLI take it. */
/** A deployment to add: a config-file entry's fields, without the id (one is made). */
export type NewDeployment = Omit<DeploymentSpec, 'id'>;

/**
 * The administration use cases, shared by the admin API and the CLI so that both validate alike:
 * organizations, keys and their limits, the catalogue, upstream deployments, usage totals. Errors
 * are ApiErrors (the API answers them; the CLI prints them).
 */
export class AdminService {
  constructor(
    private readonly store: Store,
    private readonly catalogue: Catalogue,
    private readonly addresses: AddressPolicy,
    private readonly keyVars: readonly string[],
    private readonly hooks: AdminHooks = {},
  ) {}

  // ---- organizations

  async createOrg(id: string, name: string | undefined, limits: Limits | null): Promise<Org> {
    if (await this.store.getOrg(id)) throw new ApiError('conflict', `Organization '${id}' already exists.`, { param: 'id' });
    const org: Org = { id, name: name ?? id, created_at: nowSeconds(), limits };
    await this.store.createOrg(org);
    return org;
  }

  listOrgs(): Promise<Org[]> {
    return this.store.listOrgs();
  }

  async getOrg(id: string): Promise<Org> {
    const org = await this.store.getOrg(id);
    if (!org) throw new ApiError('not_found', `No organization '${id}'.`);
    return org;
  }

  async setOrgLimits(id: string, limits: Limits | null): Promise<Org> {
    if (!(await this.store.setOrgLimits(id, limits))) throw new ApiError('not_found', `No organization '${id}'.`);
    this.hooks.orgChanged?.(id);
    return this.getOrg(id);
  }

  // ---- keys

  /** Creates the key, and its organization when that does not exist yet. */
  createKey(org: string, name: string, role: KeyRole, limits: Limits | undefined): Promise<CreatedKey> {
    return createKey(this.store, { org, name, role, limits });
  }

  listKeys(org?: string): Promise<ApiKeyRecord[]> {
    return this.store.listKeys(org);
  }

  getKey(id: string): Promise<ApiKeyRecord> {
    return this.key(id);
  }

  private async key(id: string): Promise<ApiKeyRecord> {
    const k = await this.store.getKey(id);
    if (!k) throw new ApiError('not_found', `No API key '${id}'.`);
    return k;
  }

  async setKeyLimits(id: string, limits: Limits | null): Promise<ApiKeyRecord> {
    if (!(await this.store.setKeyLimits(id, limits))) throw new ApiError('not_found', `No API key '${id}'.`);
    this.hooks.keyChanged?.(id);
    return this.key(id);
  }

  async revokeKey(id: string): Promise<ApiKeyRecord> {
    const revoked = await this.store.revokeKey(id, nowSeconds());
    if (!revoked) throw new ApiError('not_found', `No API key '${id}'.`);
    if (revoked === 'last_admin')
      throw new ApiError('conflict', `'${id}' is the last admin key: create another admin key before revoking it.`);
    this.hooks.keyChanged?.(id);
    return this.key(id);
  }

  // ---- catalogue

  listModels(): readonly Model[] {
    return this.catalogue.all();
  }

  /**
   * What a key's or an organization's `limits.models` names that no usable model has: said in the
   * reply (a typo there leaves a key that can use nothing, with no other sign). Not refused: a model
   * may be added after the key that names it, or come from another instance's config file.
   */
  limitsWarning(limits: Limits | null | undefined): string | undefined {
    const unknown = (limits?.models ?? []).filter((id) => {
      const m = this.catalogue.find(id);
      return !m || m.status === 'deleted';
    });
    if (unknown.length === 0) return undefined;
    return `limits.models names no model in the catalogue: ${unknown.map((id) => `'${id}'`).join(', ')}; requests with it can use only the models listed.`;
  }

  getModel(id: string): Model {
    const m = this.catalogue.find(id);
    if (!m) throw new ApiError('model_not_found', `No model '${id}'.`, { param: 'model' });
    return m;
  }

  async createModel(spec: ModelSpec): Promise<Model> {
    const model = await this.catalogue.create(spec);
    this.hooks.catalogueChanged?.();
    return model;
  }

  async updateModel(id: string, patch: ModelPatch): Promise<Model> {
    if (this.catalogue.isLocal(id)) {
      throw new ApiError('invalid_request', `'${id}' is a local model file; change it under localModels in the config file.`);
    }
    const model = await this.catalogue.update(id, patch);
    this.hooks.catalogueChanged?.();
    return model;
  }

  /** Deleting keeps the row (usage records refer to it) and hides the model everywhere but here. */
  deleteModel(id: string): Promise<Model> {
    return this.updateModel(id, { status: 'deleted' });
  }

  // ---- deployments

  /** Deployments in the database (the config file's are the file's). */
  async listStoredDeployments(): Promise<Deployment[]> {
    return (await this.store.listDeployments()).map(storedDeployment);
  }

  async addDeployment(d: NewDeployment): Promise<Deployment> {
    const model = this.catalogue.find(d.model);
    if (!model) throw new ApiError('model_not_found', `No model '${d.model}' in the catalogue.`, { param: 'model' });
    // A deleted model answers 404 to every request: a deployment for it would serve nothing until
    // it is moved back to inactive, and then active (an inactive one may get deployments ahead).
    if (model.status === 'deleted')
      throw new ApiError('invalid_value', `'${d.model}' is deleted: it serves no requests, so a deployment for it would serve none.`, {
        param: 'model',
      });
    if (this.catalogue.isLocal(d.model))
      throw new ApiError('invalid_value', `'${d.model}' is served from a local file.`, { param: 'model' });
    if (d.weight !== undefined && !(d.weight > 0))
      throw new ApiError('invalid_value', 'weight must be a positive number.', { param: 'weight' });
    const keyRefused = d.apiKeyEnv === undefined ? undefined : keyVarRefusal(d.apiKeyEnv, this.keyVars);
    if (keyRefused)
      throw new ApiError('invalid_value', `api_key_env '${d.apiKeyEnv}' is refused: ${keyRefused}.`, { param: 'api_key_env' });
    const refused = await this.addresses.check(d.baseUrl);
    if (refused) throw new ApiError('invalid_value', `base_url ${d.baseUrl} is refused: ${refused}.`, { param: 'base_url' });
    const deployment = deploymentFrom(d, newId('dep'), 'database', nowSeconds());
    await this.store.createDeployment(deploymentRecord(deployment));
    await this.hooks.deploymentsChanged?.();
    return deployment;
  }

  async removeDeployment(id: string): Promise<void> {
    if (!(await this.store.deleteDeployment(id))) {
      throw new ApiError('not_found', `No deployment '${id}' in the database (config-file deployments change in the config file).`);
    }
    await this.hooks.deploymentsChanged?.();
  }

  // ---- usage

  usageTotals(groupBy: UsageGroup, filter: UsageFilter): Promise<UsageTotal[]> {
    return this.store.usageTotals(groupBy, filter);
  }
}
