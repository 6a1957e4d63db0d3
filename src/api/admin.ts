import Type from 'typebox';
import type { App, RouteContext } from './context.js';
import { LimitsSpec, ModelPatch, ModelSpec, ORG_ID_PATTERN, type Model } from '../core/model-spec.js';
import type { Deployment } from '../core/deployments.js';
import type { Standing } from '../core/deployment-health.js';
import type { ApiKeyRecord, Limits, Org } from '../store/store.js';
import { modelIdFromParams, renderModel } from './models.js';

/** A key as listed: everything but its hash. */
export function renderKey(k: ApiKeyRecord): Record<string, unknown> {
  return {
    id: k.id,
    object: 'api_key',
    org: k.org_id,
    name: k.name,
    role: k.role,
    created_at: k.created_at,
    revoked_at: k.revoked_at,
    limits: k.limits ?? null,
  };
}

const renderOrg = (o: Org): Record<string, unknown> => ({
  id: o.id,
  object: 'organization',
  name: o.name,
  created_at: o.created_at,
  limits: o.limits ?? null,
});

/** A deployment as the admin API shows it (`source`: `config` for the config file's, `admin` for the database's). */
function renderDeployment(d: Deployment, health?: Standing, warning?: string): Record<string, unknown> {
  return {
    id: d.id,
    object: 'deployment',
    model: d.model,
    base_url: d.baseUrl,
    api_key_env: d.apiKeyEnv,
    upstream_model: d.upstreamModel ?? d.model,
    weight: d.weight,
    api: d.api,
    source: d.source === 'file' ? 'config' : 'admin',
    created_at: d.createdAt,
    ...(health && { health }),
    ...(warning !== undefined && { warning }),
  };
}

const NullableLimits = Type.Union([LimitsSpec, Type.Null()]);
const OrgId = Type.String({ pattern: ORG_ID_PATTERN });
const IdParams = Type.Object({ id: Type.String() });
const ModelParams = Type.Object({ author: Type.String(), slug: Type.String() });
const EncodedModelParams = Type.Object({ id: Type.String() });

/**
 * Administration under `/admin`: organizations, API keys, the catalogue, deployments (usage is in
 * usage.ts). Every route needs an admin key (inference keys get 403); the use cases are core's
 * (shared with the CLI).
 */
export function registerAdminRoutes(app: App, ctx: RouteContext): void {
  const { admin, requireAdmin } = ctx;
  const renderAdminModel = (m: Model): Record<string, unknown> => ({ ...renderModel(m, ctx.router.canServe(m)), source: m.source });
  /** An answer with the warning its limits call for, if any (see Admin.limitsWarning). */
  const warned = (body: Record<string, unknown>, limits: Limits | null | undefined): Record<string, unknown> => {
    const warning = admin.limitsWarning(limits);
    return warning === undefined ? body : { ...body, warning };
  };

  app.post(
    '/admin/orgs',
    {
      onRequest: requireAdmin,
      schema: {
        body: Type.Object({
          id: OrgId,
          name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
          limits: Type.Optional(NullableLimits),
        }),
      },
    },
    async (req, reply) =>
      reply.code(201).send(warned(renderOrg(await admin.createOrg(req.body.id, req.body.name, req.body.limits ?? null)), req.body.limits)),
  );

  app.get('/admin/orgs', { onRequest: requireAdmin }, async () => ({ object: 'list', data: (await admin.listOrgs()).map(renderOrg) }));

  app.get('/admin/orgs/:id', { onRequest: requireAdmin, schema: { params: IdParams } }, async (req) =>
    renderOrg(await admin.getOrg(req.params.id)),
  );

  app.patch(
    '/admin/orgs/:id',
    { onRequest: requireAdmin, schema: { params: IdParams, body: Type.Object({ limits: NullableLimits }) } },
    async (req) => warned(renderOrg(await admin.setOrgLimits(req.params.id, req.body.limits)), req.body.limits),
  );

  app.post(
    '/admin/keys',
    {
      onRequest: requireAdmin,
      schema: {
        body: Type.Object({
          org: OrgId,
          name: Type.String({ minLength: 1, maxLength: 200 }),
          role: Type.Optional(Type.Enum(['inference', 'admin'])),
          limits: Type.Optional(NullableLimits),
        }),
      },
    },
    async (req, reply) => {
      const created = await admin.createKey(req.body.org, req.body.name, req.body.role ?? 'inference', req.body.limits ?? undefined);
      req.log.info({ key_id: created.record.id, org: created.record.org_id, role: created.record.role }, 'api key created');
      return reply
        .code(201)
        .send(warned({ ...renderKey(created.record), key: created.key, org_created: created.orgCreated }, req.body.limits));
    },
  );

  app.get(
    '/admin/keys',
    { onRequest: requireAdmin, schema: { querystring: Type.Object({ org: Type.Optional(Type.String()) }) } },
    async (req) => ({ object: 'list', data: (await admin.listKeys(req.query.org)).map(renderKey) }),
  );

  app.get('/admin/keys/:id', { onRequest: requireAdmin, schema: { params: IdParams } }, async (req) =>
    renderKey(await admin.getKey(req.params.id)),
  );

  app.patch(
    '/admin/keys/:id',
    { onRequest: requireAdmin, schema: { params: IdParams, body: Type.Object({ limits: NullableLimits }) } },
    async (req) => warned(renderKey(await admin.setKeyLimits(req.params.id, req.body.limits)), req.body.limits),
  );

  app.delete('/admin/keys/:id', { onRequest: requireAdmin, schema: { params: IdParams } }, async (req) => {
    const key = await admin.revokeKey(req.params.id);
    req.log.info({ key_id: req.params.id }, 'api key revoked');
    return renderKey(key);
  });

  app.get('/admin/local/loaded', { onRequest: requireAdmin }, async () => {
    const local = ctx.localStatus();
    return {
      object: 'list',
      data: local.models,
      // Outputs that failed the JSON-schema check although a grammar constrained them; should stay 0.
      schema_violations: local.schemaViolations,
      // Outputs whose schema the grammar checks only in part and that failed the check: sampled again,
      // given up (structured_output_failed), or returned as they were (strict: false tools).
      schema_checks: {
        resampled: local.schemaOutcomes.resampled,
        failed: local.schemaOutcomes.failed,
        returned_invalid: local.schemaOutcomes.returnedInvalid,
      },
      // Compiled JSON schemas kept for reuse (bounded by SWITCHYARD_SCHEMA_CACHE_SIZE).
      cached_schemas: local.cachedSchemas,
    };
  });

  app.get('/admin/deployments', { onRequest: requireAdmin }, async () => ({
    object: 'list',
    data: ctx.router.listDeployments().map((d) => renderDeployment(d.deployment, d.health, ctx.router.keyProblem(d.deployment.id))),
  }));

  app.post(
    '/admin/deployments',
    {
      onRequest: requireAdmin,
      schema: {
        body: Type.Object({
          model: ModelSpec.properties.id,
          base_url: Type.String({ pattern: '^https?://' }),
          api_key_env: Type.Optional(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })),
          upstream_model: Type.Optional(Type.String({ minLength: 1 })),
          weight: Type.Optional(Type.Number({ minimum: 0.0001 })),
          api: Type.Optional(Type.Enum(['chat', 'responses', 'anthropic'])),
        }),
      },
    },
    async (req, reply) => {
      const b = req.body;
      const d = await admin.addDeployment({
        model: b.model,
        baseUrl: b.base_url,
        apiKeyEnv: b.api_key_env,
        upstreamModel: b.upstream_model,
        weight: b.weight,
        api: b.api,
      });
      // Made, and said at once where its key is missing here: the log alone was easy to miss.
      return reply.code(201).send(renderDeployment(d, undefined, ctx.router.keyProblem(d.id)));
    },
  );

  app.delete('/admin/deployments/:id', { onRequest: requireAdmin, schema: { params: IdParams } }, async (req) => {
    await admin.removeDeployment(req.params.id);
    return { id: req.params.id, object: 'deployment.deleted', deleted: true };
  });

  app.get('/admin/models', { onRequest: requireAdmin }, async () => ({ object: 'list', data: admin.listModels().map(renderAdminModel) }));

  app.post('/admin/models', { onRequest: requireAdmin, schema: { body: ModelSpec } }, async (req, reply) =>
    reply.code(201).send(renderAdminModel(await admin.createModel(req.body))),
  );

  const getModel = (params: { author?: string; slug?: string; id?: string }) => renderAdminModel(admin.getModel(modelIdFromParams(params)));
  const patchModel = async (params: { author?: string; slug?: string; id?: string }, patch: ModelPatch) =>
    renderAdminModel(await admin.updateModel(modelIdFromParams(params), patch));
  const deleteModel = async (params: { author?: string; slug?: string; id?: string }) =>
    renderAdminModel(await admin.deleteModel(modelIdFromParams(params)));

  app.get('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams } }, async (req) => getModel(req.params));
  app.get('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams } }, async (req) => getModel(req.params));
  app.patch('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams, body: ModelPatch } }, async (req) =>
    patchModel(req.params, req.body),
  );
  app.patch('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams, body: ModelPatch } }, async (req) =>
    patchModel(req.params, req.body),
  );
  app.delete('/admin/models/:author/:slug', { onRequest: requireAdmin, schema: { params: ModelParams } }, async (req) =>
    deleteModel(req.params),
  );
  app.delete('/admin/models/:id', { onRequest: requireAdmin, schema: { params: EncodedModelParams } }, async (req) =>
    deleteModel(req.params),
  );
}
