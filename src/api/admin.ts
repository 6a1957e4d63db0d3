import Type from 'typebox';
import type { App, RouteContext } from '../http/server.js';
import { ApiError } from '../http/errors.js';
import { createKey } from '../core/keys.js';
import { newId } from '../core/items.js';
import { LimitsSpec, ModelPatch, ModelSpec, ORG_ID_PATTERN, type Model } from '../core/model-spec.js';
import type { ApiKeyRecord, Org } from '../store/store.js';
import { modelIdFromParams, renderModel } from './models.js';
import { AddressPolicy } from '../engines/upstream/address-policy.js';

const now = (): number => Math.floor(Date.now() / 1000);

/** A key as listed: everything but its hash. */
export function renderKey(k: ApiKeyRecord): Record<string, unknown> {
  return { id: k.id, object: 'api_key', org: k.org_id, name: k.name, role: k.role, created_at: k.created_at, revoked_at: k.revoked_at, limits: k.limits ?? null };
}

const renderOrg = (o: Org): Record<string, unknown> => ({ id: o.id, object: 'organization', name: o.name, created_at: o.created_at, limits: o.limits ?? null });
const NullableLimits = Type.Union([LimitsSpec, Type.Null()]);
const renderAdminModel = (m: Model): Record<string, unknown> => ({ ...renderModel(m), source: m.source });

const OrgId = Type.String({ pattern: ORG_ID_PATTERN });
const ModelParams = Type.Object({ author: Type.String(), slug: Type.String() });
const EncodedModelParams = Type.Object({ id: Type.String() });

/**
 * Administration under `/admin`: organizations, API keys and the catalogue. Every route needs an
 * admin key; inference keys get 403.
 */
export function registerAdminRoutes(app: App, ctx: RouteContext): void {
  const { store, catalogue, requireAdmin } = ctx;
  const addresses = new AddressPolicy(ctx.config.upstreamAllow);

  app.post('/admin/orgs', {
    onRequest: requireAdmin,
    schema: { body: Type.Object({ id: OrgId, name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })), limits: Type.Optional(NullableLimits) }) },
  }, async (req, reply) => {
    if (await store.getOrg(req.body.id)) throw new ApiError('conflict', `Organization '${req.body.id}' already exists.`, { param: 'id' });
    const org: Org = { id: req.body.id, name: req.body.name ?? req.body.id, created_at: now(), limits: req.body.limits ?? null };
    await store.createOrg(org);
    return reply.code(201).send(renderOrg(org));
  });

  app.get('/admin/orgs', { onRequest: requireAdmin }, async () =>
    ({ object: 'list', data: (await store.listOrgs()).map(renderOrg) }));

  app.get('/admin/orgs/:id', { onRequest: requireAdmin, schema: { params: Type.Object({ id: Type.String() }) } }, async (req) => {
    const org = await store.getOrg(req.params.id);
    if (!org) throw new ApiError('not_found', `No organization '${req.params.id}'.`);
    return renderOrg(org);
  });

  app.patch('/admin/orgs/:id', {
    onRequest: requireAdmin,
    schema: { params: Type.Object({ id: Type.String() }), body: Type.Object({ limits: NullableLimits }) },
  }, async (req) => {
    if (!(await store.setOrgLimits(req.params.id, req.body.limits))) throw new ApiError('not_found', `No organization '${req.params.id}'.`);
    ctx.auth.invalidateOrg(req.params.id);
    return renderOrg((await store.getOrg(req.params.id))!);
  });

  app.post('/admin/keys', {
    onRequest: requireAdmin,
    schema: {
      body: Type.Object({
        org: OrgId,
        name: Type.String({ minLength: 1, maxLength: 200 }),
        role: Type.Optional(Type.Enum(['inference', 'admin'])),
        limits: Type.Optional(NullableLimits),
      }),
    },
  }, async (req, reply) => {
    const created = await createKey(store, { org: req.body.org, name: req.body.name, role: req.body.role ?? 'inference', limits: req.body.limits ?? undefined });
    req.log.info({ key_id: created.record.id, org: created.record.org_id, role: created.record.role }, 'api key created');
    return reply.code(201).send({ ...renderKey(created.record), key: created.key, org_created: created.orgCreated });
  });

  app.get('/admin/keys', {
    onRequest: requireAdmin,
    schema: { querystring: Type.Object({ org: Type.Optional(Type.String()) }) },
  }, async (req) => ({ object: 'list', data: (await store.listKeys(req.query.org)).map(renderKey) }));

  app.patch('/admin/keys/:id', {
    onRequest: requireAdmin,
    schema: { params: Type.Object({ id: Type.String() }), body: Type.Object({ limits: NullableLimits }) },
  }, async (req) => {
    if (!(await store.setKeyLimits(req.params.id, req.body.limits))) throw new ApiError('not_found', `No API key '${req.params.id}'.`);
    ctx.auth.invalidate(req.params.id);
    return renderKey((await store.getKey(req.params.id))!);
  });

  app.delete('/admin/keys/:id', { onRequest: requireAdmin, schema: { params: Type.Object({ id: Type.String() }) } }, async (req) => {
    if (!(await store.revokeKey(req.params.id, now()))) throw new ApiError('not_found', `No API key '${req.params.id}'.`);
    ctx.auth.invalidate(req.params.id);
    req.log.info({ key_id: req.params.id }, 'api key revoked');
    return renderKey((await store.getKey(req.params.id))!);
  });

  app.get('/admin/local/loaded', { onRequest: requireAdmin }, async () => {
    const byFile = new Map(catalogue.localModels().map((l) => [l.file, l.model.id]));
    return {
      object: 'list',
      data: ctx.local.status().map((s) => ({ model: byFile.get(s.file) ?? null, ...s })),
      // Outputs that failed the JSON-schema check although a grammar constrained them; should stay 0.
      schema_violations: ctx.local.schemaViolations,
    };
  });

  const Day = Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' });
  app.get('/admin/usage', {
    onRequest: requireAdmin,
    schema: {
      querystring: Type.Object({
        group_by: Type.Optional(Type.Enum(['day', 'key', 'org', 'model'])),
        org: Type.Optional(Type.String()),
        key: Type.Optional(Type.String()),
        model: Type.Optional(Type.String()),
        from: Type.Optional(Day),
        to: Type.Optional(Day),
      }),
    },
  }, async (req) => {
    // Totals include every request answered so far: queued ledger records are written first.
    await ctx.ledger.flush();
    const groupBy = req.query.group_by ?? 'day';
    const data = await store.usageTotals(groupBy, { org: req.query.org, key: req.query.key, model: req.query.model, from: req.query.from, to: req.query.to });
    return { object: 'list', group_by: groupBy, data };
  });

  app.get('/admin/deployments', { onRequest: requireAdmin }, async () => ({
    object: 'list',
    data: ctx.router.listDeployments().map((d) => ({ ...d, object: 'deployment', source: d.id.startsWith('dep_') ? 'admin' : 'config' })),
  }));

  app.post('/admin/deployments', {
    onRequest: requireAdmin,
    schema: {
      body: Type.Object({
        model: ModelSpec.properties.id,
        base_url: Type.String({ pattern: '^https?://' }),
        api_key_env: Type.Optional(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })),
        upstream_model: Type.Optional(Type.String({ minLength: 1 })),
        weight: Type.Optional(Type.Number({ minimum: 0.0001 })),
        api: Type.Optional(Type.Enum(['chat', 'responses'])),
      }),
    },
  }, async (req, reply) => {
    const b = req.body;
    if (!catalogue.find(b.model)) throw new ApiError('model_not_found', `No model '${b.model}' in the catalogue.`, { param: 'model' });
    if (catalogue.isLocal(b.model)) throw new ApiError('invalid_value', `'${b.model}' is served from a local file.`, { param: 'model' });
    const refused = await addresses.check(b.base_url);
    if (refused) throw new ApiError('invalid_value', `base_url is refused: ${refused}.`, { param: 'base_url' });
    const record = {
      id: newId('dep'), model: b.model, base_url: b.base_url, api_key_env: b.api_key_env ?? null, upstream_model: b.upstream_model ?? null,
      weight: b.weight ?? 1, api: b.api ?? 'chat', created_at: now(),
    } as const;
    await store.createDeployment(record);
    await ctx.reloadDeployments();
    return reply.code(201).send({ ...record, object: 'deployment', source: 'admin' });
  });

  app.delete('/admin/deployments/:id', { onRequest: requireAdmin, schema: { params: Type.Object({ id: Type.String() }) } }, async (req) => {
    if (!(await store.deleteDeployment(req.params.id))) {
      throw new ApiError('not_found', `No deployment '${req.params.id}' created through the admin API (config-file deployments change in the config file).`);
    }
    await ctx.reloadDeployments();
    return { id: req.params.id, object: 'deployment.deleted', deleted: true };
  });

  app.get('/admin/models', { onRequest: requireAdmin }, async () =>
    ({ object: 'list', data: catalogue.all().map(renderAdminModel) }));

  app.post('/admin/models', { onRequest: requireAdmin, schema: { body: ModelSpec } }, async (req, reply) => {
    const author = req.body.id.slice(0, req.body.id.indexOf('/'));
    if (!catalogue.authors.includes(author)) {
      throw new ApiError('invalid_value', `Unknown author '${author}'; authors are ${catalogue.authors.join(', ')}.`, { param: 'id' });
    }
    const created = await catalogue.create(req.body);
    if (typeof created === 'string') {
      throw new ApiError(created.endsWith('already exists') ? 'conflict' : 'invalid_value', created, { param: 'id' });
    }
    return reply.code(201).send(renderAdminModel(created));
  });

  const getModel = (id: string) => {
    const m = catalogue.find(id);
    if (!m) throw new ApiError('model_not_found', `No model '${id}'.`, { param: 'model' });
    return renderAdminModel(m);
  };
  const patchModel = async (id: string, patch: ModelPatch) => {
    if (catalogue.isLocal(id)) {
      throw new ApiError('invalid_request', `'${id}' is a local model file; change it under localModels in the config file.`);
    }
    const updated = await catalogue.update(id, patch);
    if (updated === undefined) throw new ApiError('model_not_found', `No model '${id}'.`, { param: 'model' });
    if (typeof updated === 'string') throw new ApiError('invalid_value', updated);
    return renderAdminModel(updated);
  };

  app.get('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams } },
    async (req) => getModel(modelIdFromParams(req.params)));
  app.get('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams } },
    async (req) => getModel(modelIdFromParams(req.params)));
  app.patch('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams, body: ModelPatch } },
    async (req) => patchModel(modelIdFromParams(req.params), req.body));
  app.patch('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams, body: ModelPatch } },
    async (req) => patchModel(modelIdFromParams(req.params), req.body));
  // Deleting keeps the row (usage records refer to it) and hides the model everywhere but here.
  app.delete('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams } },
    async (req) => patchModel(modelIdFromParams(req.params), { status: 'deleted' }));
  app.delete('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams } },
    async (req) => patchModel(modelIdFromParams(req.params), { status: 'deleted' }));
}
