/**
 * A catalogue entry as the store keeps it, and the vocabulary its fields use. The schemas that
 * validate what operators write (core/model-spec.ts) are built from the same lists.
 */

/** The catalogue's vocabulary (spec §2.6, §4.3). */
export const MODEL_TYPES = ['text_generation', 'image_generation', 'speech_to_text', 'text_to_speech', 'moderation'] as const;
export type ModelType = (typeof MODEL_TYPES)[number];
export const MODEL_STATUSES = ['pending', 'active', 'inactive', 'deleted'] as const;
export type ModelStatus = (typeof MODEL_STATUSES)[number];
export const VISIBILITIES = ['private', 'public'] as const;
export type Visibility = (typeof VISIBILITIES)[number];
/** `image_generation` is outside the spec's capability enum but is what image models carry. */
export const CAPABILITIES = [
  'streaming',
  'vision',
  'function_calling',
  'structured_output',
  'reasoning',
  'image_editing',
  'image_generation',
] as const;
export type Capability = (typeof CAPABILITIES)[number];

/** One price of a model: US dollars per million units of `metric` (input_tokens, output_tokens, …). */
export interface Price {
  metric: string;
  rate: number;
}

/** A catalogue entry with every field resolved, as stored and served. */
export interface Model {
  id: string;
  author: string;
  slug: string;
  name: string;
  description: string;
  created: number;
  owned_by: string;
  status: ModelStatus;
  visibility: Visibility;
  pricing: Price[];
  context_length: number | null;
  model_type: ModelType;
  capabilities: Capability[];
  output_size: string | null;
  /** Where the entry came from: the config file, the admin API, or a GGUF file in the models dir. */
  source: ModelSource;
}
export type ModelSource = 'config' | 'admin' | 'local';
