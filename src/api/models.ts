import Type from 'typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { App, RouteContext } from './context.js';
import { modelNotFound } from '../core/errors.js';
import { MODEL_TYPES, type Model, type ModelType } from '../core/model-spec.js';
import { anthropicModel, anthropicModelPage } from '../protocols/messages/models.js';

/**
 * Anthropic's SDKs call the same paths for their Models API, with an `anthropic-version` header
 * (which the OpenAI SDKs never send): such a request is answered in Anthropic's shape, errors
 * included (http/server.ts).
 */
export const asksAnthropic = (headers: Record<string, unknown>): boolean => headers['anthropic-version'] !== undefined;

/** Whether to answer in Anthropic's shape; if so, the reply carries Anthropic's `request-id` as well. */
function answersAnthropic(req: FastifyRequest, reply: FastifyReply): boolean {
  if (!asksAnthropic(req.headers)) return false;
  reply.header('request-id', req.id);
  return true;
}

/** `text_to_text` is what usage guides send; it means text generation. */
const TYPE_VALUES = [...MODEL_TYPES, 'text_to_text'] as const;
type TypeValue = (typeof TYPE_VALUES)[number];

function normaliseType(t: TypeValue | undefined): ModelType | undefined {
  return t === 'text_to_text' ? 'text_generation' : t;
}

/**
 * The OpenAI model object with the catalogue's fields added; absent fields are left out, not null.
 * `available` says whether this server can generate with the model now (it has a local file or an
 * upstream deployment): a catalogue entry describes a model, not a promise to serve it.
 */
export function renderModel(m: Model, available: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = {
    id: m.id,
    object: 'model',
    created: m.created,
    owned_by: m.owned_by,
    author: m.author,
    slug: m.slug,
    name: m.name,
    description: m.description,
    status: m.status,
    visibility: m.visibility,
    pricing: m.pricing,
    model_type: m.model_type,
    capabilities: m.capabilities,
    available,
  };
  if (m.context_length !== null) out['context_length'] = m.context_length;
  if (m.output_size !== null) out['output_size'] = m.output_size;
  return out;
}

/**
 * Reads `author/slug` from either route shape: `/v1/models/author/slug` (older clients) or
 * `/v1/models/author%2Fslug` (openai-node ≥ 5). The router has decoded each parameter once
 * (`%2F` included); decoding again would read `local%252Fx` as `local/x`, a model the path does not name.
 */
export function modelIdFromParams(params: { author?: string; slug?: string; id?: string }): string {
  return params.id ?? `${params.author ?? ''}/${params.slug ?? ''}`;
}

export function registerModelRoutes(app: App, ctx: RouteContext): void {
  const { catalogue } = ctx;
  const TypeParam = Type.Optional(Type.Enum([...TYPE_VALUES]));
  const Lifecycle = Type.Enum(['active', 'deprecated', 'retired']);
  const ListQuery = Type.Object({
    type: TypeParam,
    author: Type.Optional(Type.Enum([...catalogue.authors])),
    // Anthropic's page parameters (read for Anthropic's SDKs only; the OpenAI list is one page).
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
    after_id: Type.Optional(Type.String()),
    before_id: Type.Optional(Type.String()),
    // Anthropic's lifecycle filter, as its SDK writes an array (`lifecycle[]=retired`) or as one value.
    lifecycle: Type.Optional(Type.Array(Lifecycle)),
    'lifecycle[]': Type.Optional(Type.Array(Lifecycle)),
  });
  const OneQuery = Type.Object({ type: TypeParam });

  app.get('/v1/models', { onRequest: ctx.requireKey, schema: { querystring: ListQuery } }, async (req, reply) => {
    const type = normaliseType(req.query.type) ?? 'text_generation';
    const models = catalogue.list({ type, author: req.query.author }, req.principal!);
    if (answersAnthropic(req, reply)) {
      const q = req.query;
      const lifecycle =
        q.lifecycle === undefined && q['lifecycle[]'] === undefined ? undefined : [...(q.lifecycle ?? []), ...(q['lifecycle[]'] ?? [])];
      return anthropicModelPage(models, { limit: q.limit, after_id: q.after_id, before_id: q.before_id, lifecycle });
    }
    return { object: 'list', data: models.map((m) => renderModel(m, ctx.router.canServe(m))) };
  });

  const getOne = (
    req: FastifyRequest,
    reply: FastifyReply,
    params: { author?: string; slug?: string; id?: string },
    typeParam: TypeValue | undefined,
  ) => {
    const id = modelIdFromParams(params);
    const model = catalogue.get(id, req.principal!);
    // The id is unique, so `type` only narrows when it is given explicitly.
    const type = normaliseType(typeParam);
    if (!model || (type !== undefined && model.model_type !== type)) throw modelNotFound(id);
    return answersAnthropic(req, reply) ? anthropicModel(model) : renderModel(model, ctx.router.canServe(model));
  };
  app.get(
    '/v1/models/:author/:slug',
    {
      onRequest: ctx.requireKey,
      schema: { querystring: OneQuery, params: Type.Object({ author: Type.String(), slug: Type.String() }) },
    },
    async (req, reply) => getOne(req, reply, req.params, req.query.type),
  );
  app.get(
    '/v1/models/:id',
    {
      onRequest: ctx.requireKey,
      schema: { querystring: OneQuery, params: Type.Object({ id: Type.String() }) },
    },
    async (req, reply) => getOne(req, reply, req.params, req.query.type),
  );
}
