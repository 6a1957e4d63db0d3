import Type, { type Static } from 'typebox';
import {
  CAPABILITIES,
  MODEL_STATUSES,
  MODEL_TYPES,
  VISIBILITIES,
  type Capability,
  type Model,
  type ModelSource,
} from '../store/model-record.js';

export { CAPABILITIES, MODEL_STATUSES, MODEL_TYPES, VISIBILITIES } from '../store/model-record.js';
export type { Capability, Model, ModelSource, ModelStatus, ModelType, Visibility } from '../store/model-record.js';

export const SLUG_PATTERN = '^[a-z0-9][a-z0-9._-]*$';
export const MODEL_ID_PATTERN = '^[a-z0-9][a-z0-9-]*/[a-zA-Z0-9][a-zA-Z0-9._:+-]*$';
export const ORG_ID_PATTERN = '^[a-z0-9][a-z0-9_-]{0,62}$';
const SIZE_LIST_PATTERN = '^[0-9]+x[0-9]+(,[0-9]+x[0-9]+)*$';

export const PricingEntry = Type.Object(
  {
    metric: Type.String({ minLength: 1, maxLength: 64 }),
    rate: Type.Number({ minimum: 0 }),
  },
  { additionalProperties: false },
);
export type PricingEntry = Static<typeof PricingEntry>;

const modelFields = {
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Type.String({ maxLength: 4000 }),
  created: Type.Integer({ minimum: 0 }),
  owned_by: Type.String({ pattern: ORG_ID_PATTERN }),
  status: Type.Enum([...MODEL_STATUSES]),
  visibility: Type.Enum([...VISIBILITIES]),
  pricing: Type.Array(PricingEntry, { maxItems: 32 }),
  context_length: Type.Integer({ minimum: 1 }),
  model_type: Type.Enum([...MODEL_TYPES]),
  capabilities: Type.Array(Type.Enum([...CAPABILITIES]), { uniqueItems: true }),
  output_size: Type.String({ pattern: SIZE_LIST_PATTERN }),
};

/** A catalogue entry as an operator writes it (config file or admin API): everything but the id is optional. */
export const ModelSpec = Type.Object(
  {
    id: Type.String({ pattern: MODEL_ID_PATTERN, maxLength: 255 }),
    name: Type.Optional(modelFields.name),
    description: Type.Optional(modelFields.description),
    created: Type.Optional(modelFields.created),
    owned_by: Type.Optional(modelFields.owned_by),
    status: Type.Optional(modelFields.status),
    visibility: Type.Optional(modelFields.visibility),
    pricing: Type.Optional(modelFields.pricing),
    context_length: Type.Optional(modelFields.context_length),
    model_type: Type.Optional(modelFields.model_type),
    capabilities: Type.Optional(modelFields.capabilities),
    output_size: Type.Optional(modelFields.output_size),
  },
  { additionalProperties: false },
);
export type ModelSpec = Static<typeof ModelSpec>;

/** A change to an existing entry (admin PATCH): the id is in the path. */
export const ModelPatch = Type.Object(
  {
    name: Type.Optional(modelFields.name),
    description: Type.Optional(modelFields.description),
    owned_by: Type.Optional(modelFields.owned_by),
    status: Type.Optional(modelFields.status),
    visibility: Type.Optional(modelFields.visibility),
    pricing: Type.Optional(modelFields.pricing),
    context_length: Type.Optional(Type.Union([modelFields.context_length, Type.Null()])),
    capabilities: Type.Optional(modelFields.capabilities),
    output_size: Type.Optional(Type.Union([modelFields.output_size, Type.Null()])),
  },
  { additionalProperties: false },
);
export type ModelPatch = Static<typeof ModelPatch>;

export function splitModelId(id: string): { author: string; slug: string } {
  const at = id.indexOf('/');
  return { author: id.slice(0, at), slug: id.slice(at + 1) };
}

/**
 * Fill the defaults of a spec and check the rules that cut across fields. Returns a message
 * naming the problem, or the resolved model.
 */
export function resolveModelSpec(spec: ModelSpec, source: ModelSource, now: number): Model | string {
  const { author, slug } = splitModelId(spec.id);
  const model_type = spec.model_type ?? 'text_generation';
  const capabilities = [
    ...(spec.capabilities ?? (model_type === 'image_generation' ? ['image_generation'] : ['streaming'])),
  ] as Capability[];
  if (model_type === 'text_generation' && spec.context_length === undefined) {
    return `model '${spec.id}': context_length is required for text_generation models`;
  }
  if (model_type === 'image_generation') {
    if (spec.context_length !== undefined) return `model '${spec.id}': image_generation models have no context_length`;
    if (spec.output_size === undefined) return `model '${spec.id}': output_size is required for image_generation models`;
    if (!capabilities.includes('image_generation')) capabilities.push('image_generation');
  } else if (spec.output_size !== undefined) {
    return `model '${spec.id}': output_size is only for image_generation models`;
  }
  return {
    id: spec.id,
    author,
    slug,
    name: spec.name ?? slug,
    description: spec.description ?? '',
    created: spec.created ?? now,
    owned_by: spec.owned_by ?? author,
    status: spec.status ?? 'active',
    visibility: spec.visibility ?? 'public',
    pricing: spec.pricing ?? [],
    context_length: spec.context_length ?? null,
    model_type,
    capabilities,
    output_size: spec.output_size ?? null,
    source,
  };
}

/** Limits of a key or an organization (admin API and CLI). */
export const LimitsSpec = Type.Object(
  {
    rpm: Type.Optional(Type.Integer({ minimum: 1 })),
    tpm: Type.Optional(Type.Integer({ minimum: 1 })),
    budget: Type.Optional(Type.Number({ minimum: 0 })),
    budget_period: Type.Optional(Type.Enum(['day', 'month'])),
    models: Type.Optional(Type.Array(Type.String({ pattern: MODEL_ID_PATTERN }), { uniqueItems: true })),
  },
  { additionalProperties: false },
);
