/** What the Anthropic shape reads of a catalogue entry. */
export interface CatalogueEntry {
  id: string;
  name: string;
  /** Unix seconds. */
  created: number;
  context_length: number | null;
  status: string;
}

/**
 * The model catalogue as Anthropic's Models API writes it, for Anthropic's SDKs: `client.models.list()`
 * and `retrieve()` call `GET /v1/models[/{id}]` with an `anthropic-version` header, the path the
 * OpenAI-shaped catalogue is served on. Fields the catalogue does not know are null, as Anthropic
 * writes them for what does not apply.
 */
export function anthropicModel(m: CatalogueEntry): Record<string, unknown> {
  return {
    type: 'model',
    id: m.id,
    display_name: m.name,
    created_at: new Date(m.created * 1000).toISOString().replace('.000Z', 'Z'),
    max_input_tokens: m.context_length,
    max_tokens: null,
    capabilities: null,
    lifecycle: lifecycleOf(m),
    deprecated_at: null,
    retires_at: null,
    line: null,
  };
}

/** A model's lifecycle stage as Anthropic names it: an inactive model answers no generation, so it is deprecated as far as a client can tell. */
export function lifecycleOf(m: Pick<CatalogueEntry, 'status'>): 'active' | 'deprecated' | 'retired' {
  return m.status === 'inactive' ? 'deprecated' : m.status === 'deleted' ? 'retired' : 'active';
}

/** Anthropic's page parameters: `limit` (1 to 1,000, 20 by default) and one of `after_id`, `before_id`. */
export interface AnthropicPageQuery {
  limit?: number | undefined;
  after_id?: string | undefined;
  before_id?: string | undefined;
  /** Only models in these lifecycle stages (the SDK sends `lifecycle[]=…`, each stage once). */
  lifecycle?: readonly string[] | undefined;
}

/**
 * One page of the list in Anthropic's shape (`data`, `has_more`, `first_id`, `last_id`), in the
 * catalogue's order. An id the list does not hold starts nothing: an empty page, as a cursor past
 * the end reads.
 */
export function anthropicModelPage(all: CatalogueEntry[], q: AnthropicPageQuery): Record<string, unknown> {
  const stages = q.lifecycle;
  const models = stages === undefined ? all : all.filter((m) => stages.includes(lifecycleOf(m)));
  const limit = q.limit ?? 20;
  let from = 0;
  let to = Math.min(models.length, limit);
  if (q.after_id !== undefined) {
    const at = models.findIndex((m) => m.id === q.after_id);
    from = at < 0 ? models.length : at + 1;
    to = Math.min(models.length, from + limit);
  } else if (q.before_id !== undefined) {
    const at = models.findIndex((m) => m.id === q.before_id);
    to = at < 0 ? 0 : at;
    from = Math.max(0, to - limit);
  }
  const page = models.slice(from, to);
  return {
    data: page.map(anthropicModel),
    has_more: q.before_id !== undefined ? from > 0 : to < models.length,
    first_id: page[0]?.id ?? null,
    last_id: page.at(-1)?.id ?? null,
  };
}
