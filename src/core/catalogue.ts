import { readdir, stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { inspectGgufIsolated } from '../engines/local/gguf.js';
import type { Store } from '../store/store.js';
import type { Principal } from './principal.js';
import { ApiError } from './errors.js';
import { nowSeconds } from './ids.js';
import { resolveModelSpec, type Model, type ModelPatch, type ModelSpec, type ModelStatus, type ModelType } from './model-spec.js';

export interface LocalModel {
  model: Model;
  file: string;
}

export interface ListFilter {
  type: ModelType;
  author?: string | undefined;
}

/**
 * The config file's (and the shipped) models into the store: the config wins for the fields it
 * describes, but `status` is run-time state (admin API, CLI) and is kept once the entry exists.
 */
async function syncConfiguredModels(store: Store, config: Config): Promise<void> {
  const t = nowSeconds();
  for (const spec of config.models) {
    const model = resolveModelSpec(spec, 'config', t);
    if (typeof model === 'string') throw new Error(`Invalid configuration: ${model}`);
    const existing = await store.getModel(model.id);
    await store.upsertModel(existing ? { ...model, status: existing.status } : model);
  }
}

/** Allowed status changes (docs/decisions.md); a deleted model comes back as inactive, for review. */
export const STATUS_MOVES: Readonly<Record<ModelStatus, readonly ModelStatus[]>> = {
  pending: ['active', 'inactive', 'deleted'],
  active: ['inactive', 'deleted'],
  inactive: ['active', 'deleted'],
  deleted: ['inactive'],
};

export function localSlug(file: string): string {
  return (
    basename(file)
      .replace(/\.gguf$/i, '')
      .toLowerCase()
      .replace(/[^a-z0-9._-]+/g, '-')
      .replace(/^[^a-z0-9]+/, '') || 'model'
  );
}

/** Where local GGUF models are looked for unless configured (missing is fine: no local models). */
export const DEFAULT_MODELS_DIR = './models';

/**
 * The model catalogue. Reads are served from an in-memory snapshot (the request path never waits
 * on the database); the snapshot is rebuilt after every write here and on a timer, so changes made
 * through another instance show up within `catalogueRefreshMs`.
 */
export class Catalogue {
  private byId = new Map<string, Model>();
  private sorted: Model[] = [];
  private local: LocalModel[] = [];
  private timer: NodeJS.Timeout | undefined;
  readonly authors: readonly string[];

  constructor(
    private readonly store: Store,
    private readonly config: Config,
    private readonly log: Logger,
  ) {
    this.authors = [...config.authors, config.localAuthor];
  }

  /** Writes the config file's models into the store, scans the models dir, and loads the snapshot. */
  async init(): Promise<void> {
    await syncConfiguredModels(this.store, this.config);
    this.local = await this.scanLocal();
    // The local file's entry is the one served (see refresh): a `models` entry of the same id,
    // its price included, would otherwise be ignored without a word.
    for (const m of this.config.models) {
      const file = this.local.find((l) => l.model.id === m.id)?.file;
      if (file !== undefined)
        this.log.warn(
          { id: m.id, file: basename(file) },
          'a models entry has the id of a local model file and is not used: set its fields (pricing, context_length …) under localModels instead',
        );
    }
    await this.refresh();
    if (this.config.catalogueRefreshMs > 0) {
      this.timer = setInterval(() => {
        this.refresh().catch((err: unknown) => this.log.warn({ err }, 'catalogue refresh failed'));
      }, this.config.catalogueRefreshMs);
      this.timer.unref();
    }
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  async refresh(): Promise<void> {
    const stored = await this.store.listModels();
    const byId = new Map<string, Model>();
    for (const m of stored) byId.set(m.id, m);
    // A local file wins over a stored entry of the same id: it is what this instance can serve.
    for (const l of this.local) byId.set(l.model.id, l.model);
    this.byId = byId;
    this.sorted = [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  localModels(): readonly LocalModel[] {
    return this.local;
  }

  private async scanLocal(): Promise<LocalModel[]> {
    const dir = resolve(this.config.modelsDir);
    let files: string[];
    try {
      files = (await readdir(dir)).filter((f) => f.toLowerCase().endsWith('.gguf')).sort();
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // The default dir may well be missing (no local models wanted); one set on purpose is a typo to point out.
      if (code === 'ENOENT' && this.config.modelsDir === DEFAULT_MODELS_DIR)
        this.log.info({ dir }, 'models dir does not exist; no local models');
      else if (code === 'ENOENT')
        this.log.warn({ dir }, 'the models dir set (SWITCHYARD_MODELS_DIR, modelsDir) does not exist; no local models');
      else this.log.warn({ dir, err }, 'cannot read models dir');
      return [];
    }
    const out: LocalModel[] = [];
    for (const f of files) {
      const path = join(dir, f);
      try {
        const info = await inspectGgufIsolated(path);
        // The file's modification time: the same in every worker and after a restart (the time of
        // the scan made a model's `created` differ between workers).
        const t = Math.floor((await stat(path)).mtimeMs / 1000);
        const named = this.config.localModels[f] ?? {};
        const spec: ModelSpec = {
          id: named.id ?? `${this.config.localAuthor}/${localSlug(f)}`,
          name: named.name ?? info.name ?? localSlug(f),
          description: named.description ?? `Local GGUF model ${f} (${info.architecture}), served in-process by llama.cpp.`,
          owned_by: named.owned_by ?? this.config.localAuthor,
          status: named.status ?? 'active',
          visibility: named.visibility ?? 'public',
          pricing: named.pricing ?? [
            { metric: 'input_tokens', rate: 0 },
            { metric: 'output_tokens', rate: 0 },
          ],
          context_length: named.context_length ?? info.contextLength,
          // Grammar-constrained decoding gives every local model tool calls and structured output.
          capabilities: named.capabilities ?? ['streaming', 'function_calling', 'structured_output'],
          model_type: 'text_generation',
          created: t,
        };
        const model = resolveModelSpec(spec, 'local', t);
        if (typeof model === 'string') throw new Error(model);
        if (out.some((o) => o.model.id === model.id)) throw new Error(`id ${model.id} is already used by another file`);
        out.push({ model, file: path });
        this.log.info({ file: f, id: model.id, context_length: model.context_length }, 'local model found');
      } catch (err) {
        this.log.error({ file: f, reason: (err as Error).message }, 'skipping invalid model file');
      }
    }
    return out;
  }

  /** Whether the principal may see this entry at all (deleted entries are gone for everyone). */
  visible(m: Model, who: Principal): boolean {
    if (m.status === 'deleted') return false;
    return m.visibility === 'public' || who.role === 'admin' || who.orgId === m.owned_by;
  }

  list(filter: ListFilter, who: Principal): Model[] {
    return this.sorted.filter(
      (m) =>
        m.model_type === filter.type &&
        (filter.author === undefined || m.author === filter.author) &&
        (m.status === 'active' || m.status === 'pending') &&
        this.visible(m, who),
    );
  }

  /** A model the principal may see whose id is `id` but for case (`local/stories260K` for the file stories260K.gguf). */
  sameButCase(id: string, who: Principal): Model | undefined {
    const lower = id.toLowerCase();
    return this.sorted.find((m) => m.id.toLowerCase() === lower && m.id !== id && this.visible(m, who));
  }

  /**
   * The model a caller probably meant by an id that names none: the same in another case, or, for
   * an id without its author (`stories260k`, or `claude-sonnet-4` as Anthropic's clients send it),
   * the one model the caller can see with that slug.
   */
  suggestion(id: string, who: Principal): Model | undefined {
    const cased = this.sameButCase(id, who);
    if (cased || id.includes('/')) return cased;
    const slug = id.toLowerCase();
    const found = this.sorted.filter((m) => m.id.slice(m.id.indexOf('/') + 1).toLowerCase() === slug && this.visible(m, who));
    return found.length === 1 ? found[0] : undefined;
  }

  get(id: string, who: Principal): Model | undefined {
    const m = this.byId.get(id);
    return m && this.visible(m, who) ? m : undefined;
  }

  // Administration: every entry, whatever its status or visibility.

  all(): readonly Model[] {
    return this.sorted;
  }

  find(id: string): Model | undefined {
    return this.byId.get(id);
  }

  isLocal(id: string): boolean {
    return this.local.some((l) => l.model.id === id);
  }

  /** Adds an entry (through the admin API or the CLI); its author must be one of the catalogue's. */
  async create(spec: ModelSpec): Promise<Model> {
    const author = spec.id.slice(0, spec.id.indexOf('/'));
    if (!this.authors.includes(author)) {
      throw new ApiError('invalid_value', `Unknown author '${author}'; authors are ${this.authors.join(', ')}.`, { param: 'id' });
    }
    const model = resolveModelSpec(spec, 'admin', nowSeconds());
    if (typeof model === 'string') throw new ApiError('invalid_value', model, { param: 'id' });
    if (this.byId.has(model.id) || !(await this.store.insertModel(model))) {
      // A deleted model keeps its id (its usage records name it); it is brought back, not created again.
      const existing = this.byId.get(model.id) ?? (await this.store.getModel(model.id));
      const deleted = existing?.status === 'deleted' ? ' It was deleted: set its status to inactive to bring it back.' : '';
      throw new ApiError('conflict', `Model '${model.id}' already exists.${deleted}`, { param: 'id' });
    }
    await this.refresh();
    return model;
  }

  /** Changes an entry; a status move must be one of STATUS_MOVES. */
  async update(id: string, patch: ModelPatch): Promise<Model> {
    const existing = await this.store.getModel(id);
    if (!existing) throw new ApiError('model_not_found', `No model '${id}'.`, { param: 'model' });
    if (patch.status !== undefined && patch.status !== existing.status && !STATUS_MOVES[existing.status].includes(patch.status)) {
      throw new ApiError(
        'invalid_value',
        `Model '${id}' cannot move from ${existing.status} to ${patch.status} (allowed: ${STATUS_MOVES[existing.status].join(', ')}).`,
        { param: 'status' },
      );
    }
    const merged: Record<string, unknown> = { ...existing, ...patch };
    const spec: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(merged)) {
      if (v !== null && k !== 'author' && k !== 'slug' && k !== 'source') spec[k] = v;
    }
    const model = resolveModelSpec(spec as ModelSpec, existing.source, existing.created);
    if (typeof model === 'string') throw new ApiError('invalid_value', model);
    await this.store.upsertModel(model);
    await this.refresh();
    return model;
  }
}
