import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from './config.js';
import { createLogger, openStore } from './app.js';
import { ApiError } from './core/errors.js';
import { AdminService } from './core/admin.js';
import { LimitsSpec, ModelPatch, ModelSpec, ORG_ID_PATTERN, type Model, type ModelStatus } from './core/model-spec.js';
import { Catalogue, STATUS_MOVES } from './core/catalogue.js';
import { serve } from './main.js';
import { AddressPolicy } from './engines/upstream/address-policy.js';
import type { Limits, Store, UsageGroup } from './store/store.js';
import Value from 'typebox/value';
import type { TSchema } from 'typebox';

const USAGE = `Usage: switchyard <command>

  serve [--port N] [--host H]                    start the server (same as npm start)
  keys create --org ORG --name NAME [--admin] [LIMITS]
                                                 create an API key (the organization too, if new)
  keys list [--org ORG]                          list keys (never their secrets)
  keys limits KEY_ID [LIMITS] [--unset NAMES | --clear]
                                                 change a key's limits (the others stay)
  keys revoke KEY_ID                             revoke a key
  orgs create ORG [--name "Display name"]        create an organization
  orgs limits ORG [LIMITS] [--unset NAMES | --clear]
                                                 change an organization's limits (the others stay)
  orgs list                                      list organizations
  models list [--all]                            catalogue entries in the database (--all: deleted too)
  models status MODEL_ID STATUS                  move a model to pending|active|inactive|deleted
  models create MODEL_ID [MODEL FIELDS]          add a catalogue entry (text models need --context-length)
  models set MODEL_ID [MODEL FIELDS]             change name, pricing, visibility, owner or context length
  deployments list                               upstream deployments added at run time
  deployments add --model ID --base-url URL [--key-env VAR] [--upstream-model NAME] [--weight W] [--api chat|responses|anthropic]
  deployments remove DEPLOYMENT_ID
  usage [--by day|key|org|model] [--org ORG] [--key KEY_ID] [--model ID] [--from YYYY-MM-DD] [--to YYYY-MM-DD]
                                                 token and cost totals

LIMITS: --rpm N  --tpm N  --budget USD  --budget-period day|month  --models id,id,…
  (--unset rpm,budget,… removes those limits; --clear removes every limit)
MODEL FIELDS: --name TEXT  --description TEXT  --type TYPE  --context-length N  --input-price USD/M
  --output-price USD/M  --visibility public|private  --owner ORG  --output-size WxH,WxH

The CLI works on the database directly, with the same configuration as the server
(SWITCHYARD_CONFIG, SWITCHYARD_DATA_DIR, DATABASE_URL). A running server sees a revocation made
here within SWITCHYARD_KEY_CACHE_TTL_MS (default 1 s); through the admin API it is immediate.`;

class UsageError extends Error {}

const LIMIT_OPTIONS = {
  rpm: { type: 'string' },
  tpm: { type: 'string' },
  budget: { type: 'string' },
  'budget-period': { type: 'string' },
  models: { type: 'string' },
  clear: { type: 'boolean' },
} as const;

const LIMIT_NAMES = ['rpm', 'tpm', 'budget', 'budget_period', 'models'] as const;

/** Limits from command-line flags, checked with the same schema as the admin API. */
function limitsFrom(v: Partial<Record<keyof typeof LIMIT_OPTIONS, string | boolean | undefined>>): Limits | null | undefined {
  if (v.clear) return null;
  const out: Record<string, unknown> = {};
  const num = (name: string, raw: unknown) => {
    const n = Number(raw);
    if (raw === undefined) return;
    if (!Number.isFinite(n)) throw new UsageError(`--${name} must be a number`);
    out[name.replace('-', '_')] = n;
  };
  num('rpm', v.rpm);
  num('tpm', v.tpm);
  num('budget', v.budget);
  if (v['budget-period'] !== undefined) out['budget_period'] = v['budget-period'];
  if (typeof v.models === 'string')
    out['models'] = v.models
      .split(',')
      .map((m) => m.trim())
      .filter(Boolean);
  if (Object.keys(out).length === 0) return undefined;
  const first = Value.Errors(LimitsSpec, out)[0];
  if (first) throw new UsageError(`invalid limits: ${first.instancePath.slice(1) || 'limits'} ${first.message}`);
  return out as Limits;
}

const showLimits = (l: Limits | null | undefined): string => {
  if (!l) return '-';
  const parts = [
    l.rpm && `rpm=${l.rpm}`,
    l.tpm && `tpm=${l.tpm}`,
    l.budget !== undefined && `budget=$${l.budget}/${l.budget_period ?? 'month'}`,
    l.models && `models=${l.models.join(',')}`,
  ];
  return parts.filter(Boolean).join(' ') || '-';
};

const iso = (s: number | null): string => (s === null ? '-' : new Date(s * 1000).toISOString().replace('.000', ''));

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows
    .map((r) =>
      r
        .map((c, i) => c.padEnd(widths[i]!))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** On stderr, where limits name a model the catalogue does not have (see Admin.limitsWarning). */
function warnLimits(admin: AdminService, limits: Limits | null | undefined): void {
  const warning = admin.limitsWarning(limits);
  if (warning !== undefined) console.error(`Warning: ${warning}`);
}

/** `keys limits` and `orgs limits`: the same flags, a different record. */
/**
 * Changes the limits named on the command line and keeps the others (`--rpm 5` on a key with a
 * budget keeps the budget); `--unset` removes named ones, `--clear` all. The admin API's PATCH
 * replaces the whole `limits` object instead, as an API client sends what it wants the limits to be.
 */
async function setLimits(
  admin: AdminService,
  args: string[],
  what: 'key' | 'organization',
  current: (id: string) => Promise<Limits | null | undefined>,
  set: (id: string, limits: Limits | null) => Promise<unknown>,
): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { ...LIMIT_OPTIONS, unset: { type: 'string' } } });
  const id = positionals[0];
  const changed = limitsFrom(values);
  const unset = (values.unset ?? '')
    .split(',')
    .map((n) => n.trim().replace('-', '_'))
    .filter(Boolean);
  const unknown = unset.find((n) => !(LIMIT_NAMES as readonly string[]).includes(n));
  if (unknown !== undefined) throw new UsageError(`--unset: '${unknown}' is not a limit (${LIMIT_NAMES.join(', ')})`);
  if (!id || (changed === undefined && unset.length === 0))
    throw new UsageError(`${what === 'key' ? 'keys' : 'orgs'} limits needs a ${what} id and limits (or --unset, --clear)`);
  let limits: Limits | null = null;
  if (changed !== null) {
    const merged: Record<string, unknown> = { ...(await current(id)), ...changed };
    for (const n of unset) delete merged[n];
    const first = Value.Errors(LimitsSpec, merged)[0];
    if (first) throw new UsageError(`invalid limits: ${first.instancePath.slice(1) || 'limits'} ${first.message}`);
    limits = Object.keys(merged).length > 0 ? (merged as Limits) : null;
  }
  await set(id, limits);
  console.log(`Limits of ${id}: ${showLimits(limits)}`);
  warnLimits(admin, limits);
  return 0;
}

async function keysCommand(admin: AdminService, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'create': {
      const { values } = parseArgs({
        args,
        options: { org: { type: 'string' }, name: { type: 'string' }, admin: { type: 'boolean' }, ...LIMIT_OPTIONS },
      });
      if (!values.org || !values.name) throw new UsageError('keys create needs --org and --name');
      if (!new RegExp(ORG_ID_PATTERN).test(values.org)) throw new UsageError(`--org must match ${ORG_ID_PATTERN}`);
      const limits = limitsFrom(values) ?? undefined;
      const created = await admin.createKey(values.org, values.name, values.admin ? 'admin' : 'inference', limits);
      if (created.orgCreated) console.log(`Created organization ${values.org}.`);
      console.log(`Created ${created.record.role} key ${created.record.id} (${values.name}) for ${values.org}.`);
      if (limits) console.log(`Limits: ${showLimits(limits)}`);
      warnLimits(admin, limits);
      console.log('\nThe key is shown only this once; store it now:\n');
      console.log(`  ${created.key}\n`);
      return 0;
    }
    case 'list': {
      const { values } = parseArgs({ args, options: { org: { type: 'string' } } });
      const keys = await admin.listKeys(values.org);
      if (keys.length === 0) {
        console.log('No keys.');
        return 0;
      }
      console.log(
        table([
          ['ID', 'ORG', 'NAME', 'ROLE', 'CREATED', 'REVOKED', 'LIMITS'],
          ...keys.map((k) => [k.id, k.org_id, k.name, k.role, iso(k.created_at), iso(k.revoked_at), showLimits(k.limits)]),
        ]),
      );
      return 0;
    }
    case 'limits':
      return setLimits(
        admin,
        args,
        'key',
        async (id) => (await admin.getKey(id)).limits,
        (id, l) => admin.setKeyLimits(id, l),
      );
    case 'revoke': {
      const { positionals } = parseArgs({ args, allowPositionals: true });
      const id = positionals[0];
      if (!id) throw new UsageError('keys revoke needs a key id (see keys list)');
      await admin.revokeKey(id);
      console.log(`Revoked key ${id}.`);
      return 0;
    }
    default:
      throw new UsageError(`unknown keys command '${sub ?? ''}'`);
  }
}

async function orgsCommand(admin: AdminService, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'create': {
      const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { name: { type: 'string' } } });
      const id = positionals[0];
      if (!id || !new RegExp(ORG_ID_PATTERN).test(id)) throw new UsageError(`orgs create needs an id matching ${ORG_ID_PATTERN}`);
      await admin.createOrg(id, values.name, null);
      console.log(`Created organization ${id}.`);
      return 0;
    }
    case 'list': {
      const orgs = await admin.listOrgs();
      console.log(
        table([['ID', 'NAME', 'CREATED', 'LIMITS'], ...orgs.map((o) => [o.id, o.name, iso(o.created_at), showLimits(o.limits)])]),
      );
      return 0;
    }
    case 'limits':
      return setLimits(
        admin,
        args,
        'organization',
        async (id) => (await admin.getOrg(id)).limits,
        (id, l) => admin.setOrgLimits(id, l),
      );
    default:
      throw new UsageError(`unknown orgs command '${sub ?? ''}'`);
  }
}

const MODEL_OPTIONS = {
  name: { type: 'string' },
  description: { type: 'string' },
  type: { type: 'string' },
  'context-length': { type: 'string' },
  'input-price': { type: 'string' },
  'output-price': { type: 'string' },
  visibility: { type: 'string' },
  owner: { type: 'string' },
  'output-size': { type: 'string' },
} as const;

/** Catalogue fields from command-line flags; prices are US dollars per million tokens. */
function modelFieldsFrom(v: Partial<Record<keyof typeof MODEL_OPTIONS, string>>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (v.name !== undefined) out['name'] = v.name;
  if (v.description !== undefined) out['description'] = v.description;
  if (v.type !== undefined) out['model_type'] = v.type;
  if (v['context-length'] !== undefined) out['context_length'] = Number(v['context-length']);
  if (v.visibility !== undefined) out['visibility'] = v.visibility;
  if (v.owner !== undefined) out['owned_by'] = v.owner;
  if (v['output-size'] !== undefined) out['output_size'] = v['output-size'];
  return out;
}

/** Existing pricing with the prices given on the command line replacing their metrics. */
function pricingWith(existing: Model['pricing'], v: Partial<Record<keyof typeof MODEL_OPTIONS, string>>): Model['pricing'] {
  const given: Model['pricing'] = [];
  if (v['input-price'] !== undefined) given.push({ metric: 'input_tokens', rate: Number(v['input-price']) });
  if (v['output-price'] !== undefined) given.push({ metric: 'output_tokens', rate: Number(v['output-price']) });
  return [...existing.filter((p) => !given.some((g) => g.metric === p.metric)), ...given];
}

/** Checks command-line input with the admin API's own schema, so both refuse the same things. */
function checked<T>(schema: TSchema, value: unknown, what: string): T {
  const first = Value.Errors(schema, value)[0];
  if (first) throw new UsageError(`invalid ${what}: ${first.instancePath.slice(1) || 'id'} ${first.message}`);
  return value as T;
}

async function modelsCommand(admin: AdminService, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'list': {
      const { values } = parseArgs({ args, options: { all: { type: 'boolean' } } });
      const models = admin.listModels().filter((m) => values.all || m.status !== 'deleted');
      console.log(
        table([
          ['ID', 'TYPE', 'STATUS', 'VISIBILITY', 'OWNER', 'CONTEXT', 'PRICING (USD)'],
          ...models.map((m) => [
            m.id,
            m.model_type,
            m.status,
            m.visibility,
            m.owned_by,
            m.context_length === null ? '-' : String(m.context_length),
            m.pricing.map((p) => `${p.metric}=${p.rate}`).join(' ') || '-',
          ]),
        ]),
      );
      return 0;
    }
    case 'status': {
      const { positionals } = parseArgs({ args, allowPositionals: true });
      const [id, status] = positionals;
      if (!id || !status || !(status in STATUS_MOVES))
        throw new UsageError('models status needs a model id and one of pending, active, inactive, deleted');
      await admin.updateModel(id, { status: status as ModelStatus });
      console.log(`${id} is now ${status}.`);
      return 0;
    }
    case 'create': {
      const { values, positionals } = parseArgs({ args, allowPositionals: true, options: MODEL_OPTIONS });
      const id = positionals[0];
      if (!id) throw new UsageError('models create needs a model id (author/slug)');
      const spec = checked<ModelSpec>(ModelSpec, { ...modelFieldsFrom(values), pricing: pricingWith([], values), id }, 'model');
      await admin.createModel(spec);
      console.log(`Created ${id}. Running servers see it within SWITCHYARD_CATALOGUE_REFRESH_MS.`);
      return 0;
    }
    case 'set': {
      const { values, positionals } = parseArgs({ args, allowPositionals: true, options: MODEL_OPTIONS });
      const id = positionals[0];
      if (!id) throw new UsageError('models set needs a model id (author/slug)');
      const existing = admin.getModel(id);
      const patch = checked<ModelPatch>(
        ModelPatch,
        { ...modelFieldsFrom(values), pricing: pricingWith(existing.pricing, values) },
        'model',
      );
      await admin.updateModel(id, patch);
      console.log(`Updated ${id}. Running servers see it within SWITCHYARD_CATALOGUE_REFRESH_MS.`);
      return 0;
    }
    default:
      throw new UsageError(`unknown models command '${sub ?? ''}'`);
  }
}

async function deploymentsCommand(admin: AdminService, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'list': {
      const deps = await admin.listStoredDeployments();
      if (deps.length === 0) {
        console.log('No deployments added at run time (config-file deployments are in the config file).');
        return 0;
      }
      console.log(
        table([
          ['ID', 'MODEL', 'BASE URL', 'UPSTREAM MODEL', 'WEIGHT', 'API', 'KEY VARIABLE'],
          ...deps.map((d) => [d.id, d.model, d.baseUrl, d.upstreamModel ?? d.model, String(d.weight), d.api, d.apiKeyEnv ?? '-']),
        ]),
      );
      return 0;
    }
    case 'add': {
      const { values } = parseArgs({
        args,
        options: {
          model: { type: 'string' },
          'base-url': { type: 'string' },
          'key-env': { type: 'string' },
          'upstream-model': { type: 'string' },
          weight: { type: 'string' },
          api: { type: 'string' },
        },
      });
      const model = values.model;
      const baseUrl = values['base-url'];
      if (!model || !baseUrl || !/^https?:\/\//.test(baseUrl))
        throw new UsageError('deployments add needs --model and an http(s) --base-url');
      if (values.api !== undefined && values.api !== 'chat' && values.api !== 'responses' && values.api !== 'anthropic')
        throw new UsageError('--api must be chat, responses or anthropic');
      const d = await admin.addDeployment({
        model,
        baseUrl,
        apiKeyEnv: values['key-env'],
        upstreamModel: values['upstream-model'],
        weight: values.weight === undefined ? undefined : Number(values.weight),
        api: values.api,
      });
      console.log(
        `Added deployment ${d.id} of ${model} at ${baseUrl}. Running servers route to it within SWITCHYARD_CATALOGUE_REFRESH_MS.`,
      );
      return 0;
    }
    case 'remove': {
      const { positionals } = parseArgs({ args, allowPositionals: true });
      const id = positionals[0];
      if (!id) throw new UsageError('deployments remove needs a deployment id');
      await admin.removeDeployment(id);
      console.log(`Removed deployment ${id}.`);
      return 0;
    }
    default:
      throw new UsageError(`unknown deployments command '${sub ?? ''}'`);
  }
}

async function usageCommand(admin: AdminService, args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      by: { type: 'string' },
      org: { type: 'string' },
      key: { type: 'string' },
      model: { type: 'string' },
      from: { type: 'string' },
      to: { type: 'string' },
    },
  });
  const by = (values.by ?? 'day') as UsageGroup;
  if (!['day', 'key', 'org', 'model'].includes(by)) throw new UsageError('--by must be day, key, org or model');
  const rows = await admin.usageTotals(by, { org: values.org, key: values.key, model: values.model, from: values.from, to: values.to });
  if (rows.length === 0) {
    console.log('No usage.');
    return 0;
  }
  console.log(
    table([
      [by.toUpperCase(), 'REQUESTS', 'ERRORS', 'INPUT', 'CACHED', 'OUTPUT', 'COST (USD)', 'UNPRICED'],
      ...rows.map((r) => [
        r.group,
        String(r.requests),
        String(r.errors),
        String(r.input_tokens),
        String(r.cached_tokens),
        String(r.output_tokens),
        r.cost.toFixed(6),
        String(r.unpriced_requests),
      ]),
    ]),
  );
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  if (cmd === undefined || cmd === 'help' || cmd === '--help' || cmd === '-h') {
    console.log(USAGE);
    return cmd === undefined ? 2 : 0;
  }
  if (cmd === 'serve') return serve(argv.slice(1));
  if (!['keys', 'orgs', 'usage', 'models', 'deployments'].includes(cmd)) {
    console.error(`switchyard: unknown command '${cmd}'\n\n${USAGE}`);
    return 2;
  }
  let store: Store | undefined;
  let catalogue: Catalogue | undefined;
  try {
    const config = loadConfig();
    store = openStore(config);
    await store.migrate();
    // The same catalogue the server builds (the config file's models, the local files), so that the
    // use cases validate here exactly as in the admin API; no refresh timer in a one-shot command.
    catalogue = new Catalogue(store, { ...config, catalogueRefreshMs: 0 }, createLogger({ ...config, logLevel: 'warn' }));
    await catalogue.init();
    const admin = new AdminService(store, catalogue, new AddressPolicy(config.upstreamAllow), config.upstreamKeyVars);
    if (cmd === 'usage') return await usageCommand(admin, argv.slice(1));
    if (cmd === 'models') return await modelsCommand(admin, sub, rest);
    if (cmd === 'deployments') return await deploymentsCommand(admin, sub, rest);
    return cmd === 'keys' ? await keysCommand(admin, sub, rest) : await orgsCommand(admin, sub, rest);
  } catch (err) {
    // What the use cases refuse (a conflict, an unknown id, a refused URL) is the command's failure.
    if (err instanceof ApiError) {
      console.error(`switchyard: ${err.message}`);
      return 1;
    }
    if (err instanceof UsageError || err instanceof ConfigError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`switchyard: ${(err as Error).message}\n\n${USAGE}`);
      return 2;
    }
    throw err;
  } finally {
    catalogue?.stop();
    await store?.close();
  }
}
