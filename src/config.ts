import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { resolve, dirname, extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import Type, { type Static } from 'typebox';
import Value from 'typebox/value';
import { parse as parseYaml } from 'yaml';
import { ModelSpec, SLUG_PATTERN, PricingEntry } from './core/model-spec.js';
import { AddressPolicy, allowEntryProblem } from './engines/upstream/address-policy.js';
import type { RoutingPolicy } from './core/router.js';
import { DEFAULT_MODELS_DIR } from './core/catalogue.js';
import type { SchemaLimits } from './core/schema-limits.js';
import type { UpstreamOptions } from './engines/upstream/upstream-engine.js';

const LocalModelSpec = Type.Object(
  {
    id: Type.Optional(ModelSpec.properties.id),
    name: Type.Optional(Type.String({ minLength: 1 })),
    description: Type.Optional(Type.String()),
    owned_by: Type.Optional(ModelSpec.properties.owned_by),
    visibility: Type.Optional(ModelSpec.properties.visibility),
    status: Type.Optional(ModelSpec.properties.status),
    pricing: Type.Optional(Type.Array(PricingEntry)),
    capabilities: Type.Optional(ModelSpec.properties.capabilities),
    context_length: Type.Optional(Type.Integer({ minimum: 1 })),
    /** A Jinja chat template to use instead of the one in the GGUF (or for a GGUF without one). */
    chatTemplate: Type.Optional(Type.String({ minLength: 1 })),
  },
  { additionalProperties: false },
);
export type LocalModelSpec = Static<typeof LocalModelSpec>;

const DeploymentSpec = Type.Object(
  {
    /** Catalogue id this deployment serves. */
    model: ModelSpec.properties.id,
    /** Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 */
    baseUrl: Type.String({ pattern: '^https?://' }),
    /** Name of the environment variable holding the upstream's API key (the key never goes in a file). */
    apiKeyEnv: Type.Optional(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })),
    /** The model name the upstream uses; defaults to the catalogue id. */
    upstreamModel: Type.Optional(Type.String({ minLength: 1 })),
    weight: Type.Optional(Type.Number({ minimum: 0.0001 })),
    id: Type.Optional(Type.String({ minLength: 1 })),
    /** `chat` (default): the upstream only speaks chat completions, and Responses requests are translated. */
    api: Type.Optional(Type.Enum(['chat', 'responses', 'anthropic'])),
  },
  { additionalProperties: false },
);

const ConfigSchema = Type.Object(
  {
    host: Type.String({ minLength: 1 }),
    port: Type.Integer({ minimum: 0, maximum: 65535 }),
    dataDir: Type.String({ minLength: 1 }),
    modelsDir: Type.String({ minLength: 1 }),
    adminKey: Type.Optional(Type.String({ minLength: 16 })),
    databaseUrl: Type.Optional(Type.String({ pattern: '^(postgres|postgresql|sqlite)://|^file:' })),
    redisUrl: Type.Optional(Type.String({ pattern: '^rediss?://' })),
    bodyLimit: Type.Integer({ minimum: 1024 }),
    shutdownTimeoutMs: Type.Integer({ minimum: 0 }),
    websocketMaxConnectionMs: Type.Integer({ minimum: 1000 }),
    websocketMaxPerOrg: Type.Integer({ minimum: 1 }),
    historyMaxBytes: Type.Integer({ minimum: 1024 }),
    logLevel: Type.Enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    logBufferBytes: Type.Integer({ minimum: 0, maximum: 1024 * 1024 }),
    keyCacheTtlMs: Type.Integer({ minimum: 0 }),
    catalogueRefreshMs: Type.Integer({ minimum: 0 }),
    corsOrigin: Type.String(),
    authors: Type.Array(Type.String({ pattern: SLUG_PATTERN, maxLength: 64 }), { minItems: 1, uniqueItems: true }),
    localAuthor: Type.String({ pattern: SLUG_PATTERN, maxLength: 64 }),
    defaultCatalogue: Type.Boolean(),
    models: Type.Array(ModelSpec),
    localModels: Type.Record(Type.String(), LocalModelSpec),
    deployments: Type.Array(DeploymentSpec),
    localThreads: Type.Integer({ minimum: 1, maximum: 256 }),
    localParallel: Type.Integer({ minimum: 1, maximum: 64 }),
    localQueueSize: Type.Integer({ minimum: 0 }),
    localMemoryBudgetMb: Type.Integer({ minimum: 1 }),
    localGpu: Type.Union([Type.Literal('auto'), Type.Literal(false)]),
    localPreload: Type.Boolean(),
    /** Secret for sealing reasoning (encrypted_content); generated and kept in the database when unset. */
    secretKey: Type.Optional(Type.String({ minLength: 16 })),
    responseStaleMs: Type.Integer({ minimum: 1000 }),
    /** When set, GET /metrics needs `Authorization: Bearer <metricsToken>`. */
    metricsToken: Type.Optional(Type.String({ minLength: 8 })),
    ledgerFlushMs: Type.Integer({ minimum: 10 }),
    /** Worker processes serving the port (node:cluster); 1 serves from this process alone. */
    workers: Type.Integer({ minimum: 1, maximum: 256 }),
    /** Upstream timeouts: opening the connection, waiting for the response head, and silence between body chunks. */
    upstreamConnectTimeoutMs: Type.Integer({ minimum: 1 }),
    upstreamFirstByteTimeoutMs: Type.Integer({ minimum: 1 }),
    upstreamIdleTimeoutMs: Type.Integer({ minimum: 1 }),
    /** Deployments one request may try (the first plus retries). */
    upstreamMaxAttempts: Type.Integer({ minimum: 1, maximum: 10 }),
    /** Retries allowed as a share of requests over the last 10 s (plus 10 per second), so retries never multiply an outage. */
    retryBudgetRatio: Type.Number({ minimum: 0, maximum: 10 }),
    /** Consecutive failures that take a deployment out of rotation, and for how long before it is tried again. */
    breakerFailures: Type.Integer({ minimum: 1 }),
    breakerEjectMs: Type.Integer({ minimum: 100 }),
    /** How often an ejected deployment is probed (GET {baseUrl}/models); an answer below 500 brings it back. */
    healthCheckIntervalMs: Type.Integer({ minimum: 100 }),
    /**
     * Hosts or CIDR ranges that deployments stored in the database (admin API, CLI) may reach although
     * they are internal (loopback, private, link-local); '*' allows all. Config-file deployments are trusted.
     */
    upstreamAllow: Type.Array(Type.String({ minLength: 1 })),
    /** Requests in progress per process above which new ones are shed with 503 and retry-after. */
    maxInFlight: Type.Integer({ minimum: 1 }),
    /** Event-loop delay (p99 over the last second, ms) above which new requests are shed; 0 turns it off. */
    maxEventLoopDelayMs: Type.Integer({ minimum: 0 }),
    /** Largest request head (request line plus headers) in bytes; larger ones get 431. */
    maxHeaderBytes: Type.Integer({ minimum: 1024 }),
    /** How long a client may take to send its whole request (head and body); 408 after that. */
    bodyTimeoutMs: Type.Integer({ minimum: 100 }),
    /** Caps on what an upstream may send: a non-stream answer, one line of a stream, an error body. */
    upstreamMaxBodyBytes: Type.Integer({ minimum: 1024 }),
    upstreamMaxLineBytes: Type.Integer({ minimum: 1024 }),
    upstreamMaxErrorBytes: Type.Integer({ minimum: 256 }),
    /** Time allowed for all of one request's attempts (failover included) to get an upstream's answer started. */
    upstreamAttemptsTimeoutMs: Type.Integer({ minimum: 1 }),
    /**
     * Environment variables that deployments added through the admin API or the CLI may name as their
     * key (`api_key_env`), besides those starting with UPSTREAM_KEY_.
     */
    upstreamKeyVars: Type.Array(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' })),
    /** Bounds on a JSON schema in a request (structured output, tool parameters); each is a 400 beyond. */
    schemaMaxBytes: Type.Integer({ minimum: 1024 }),
    schemaMaxDepth: Type.Integer({ minimum: 2, maximum: 1000 }),
    schemaMaxNodes: Type.Integer({ minimum: 10 }),
    schemaMaxEnum: Type.Integer({ minimum: 1 }),
    /** Largest minItems / minLength / minProperties / minContains: each forces that much output. */
    schemaMaxMinCount: Type.Integer({ minimum: 1, maximum: 1900 }),
    /** Compiled schemas (grammar and validator) kept for reuse. */
    schemaCacheSize: Type.Integer({ minimum: 1 }),
    /** How long compiling one schema may take (in a worker thread) before the request is refused. */
    schemaCompileTimeoutMs: Type.Integer({ minimum: 10 }),
  },
  { additionalProperties: false },
);

export type Config = Static<typeof ConfigSchema>;
type ConfigKey = keyof Config;

export class ConfigError extends Error {}

/** Environment variables and the setting each one sets. */
const ENV: ReadonlyArray<[string, ConfigKey, 'string' | 'int' | 'bool' | 'number' | 'list']> = [
  ['HOST', 'host', 'string'],
  ['PORT', 'port', 'int'],
  ['SWITCHYARD_DATA_DIR', 'dataDir', 'string'],
  ['SWITCHYARD_MODELS_DIR', 'modelsDir', 'string'],
  ['SWITCHYARD_ADMIN_KEY', 'adminKey', 'string'],
  ['DATABASE_URL', 'databaseUrl', 'string'],
  ['REDIS_URL', 'redisUrl', 'string'],
  ['SWITCHYARD_BODY_LIMIT', 'bodyLimit', 'int'],
  ['SWITCHYARD_SHUTDOWN_TIMEOUT_MS', 'shutdownTimeoutMs', 'int'],
  ['SWITCHYARD_WEBSOCKET_MAX_CONNECTION_MS', 'websocketMaxConnectionMs', 'int'],
  ['SWITCHYARD_WEBSOCKET_MAX_PER_ORG', 'websocketMaxPerOrg', 'int'],
  ['SWITCHYARD_HISTORY_MAX_BYTES', 'historyMaxBytes', 'int'],
  ['SWITCHYARD_LOG_LEVEL', 'logLevel', 'string'],
  ['SWITCHYARD_LOG_BUFFER_BYTES', 'logBufferBytes', 'int'],
  ['SWITCHYARD_KEY_CACHE_TTL_MS', 'keyCacheTtlMs', 'int'],
  ['SWITCHYARD_CATALOGUE_REFRESH_MS', 'catalogueRefreshMs', 'int'],
  ['SWITCHYARD_CORS_ORIGIN', 'corsOrigin', 'string'],
  ['SWITCHYARD_LOCAL_THREADS', 'localThreads', 'int'],
  ['SWITCHYARD_LOCAL_PARALLEL', 'localParallel', 'int'],
  ['SWITCHYARD_LOCAL_QUEUE_SIZE', 'localQueueSize', 'int'],
  ['SWITCHYARD_LOCAL_MEMORY_MB', 'localMemoryBudgetMb', 'int'],
  ['SWITCHYARD_LOCAL_PRELOAD', 'localPreload', 'bool'],
  ['SWITCHYARD_SECRET_KEY', 'secretKey', 'string'],
  ['SWITCHYARD_RESPONSE_STALE_MS', 'responseStaleMs', 'int'],
  ['SWITCHYARD_METRICS_TOKEN', 'metricsToken', 'string'],
  ['SWITCHYARD_LEDGER_FLUSH_MS', 'ledgerFlushMs', 'int'],
  ['SWITCHYARD_WORKERS', 'workers', 'int'],
  ['SWITCHYARD_UPSTREAM_CONNECT_TIMEOUT_MS', 'upstreamConnectTimeoutMs', 'int'],
  ['SWITCHYARD_UPSTREAM_FIRST_BYTE_TIMEOUT_MS', 'upstreamFirstByteTimeoutMs', 'int'],
  ['SWITCHYARD_UPSTREAM_IDLE_TIMEOUT_MS', 'upstreamIdleTimeoutMs', 'int'],
  ['SWITCHYARD_UPSTREAM_MAX_ATTEMPTS', 'upstreamMaxAttempts', 'int'],
  ['SWITCHYARD_RETRY_BUDGET_RATIO', 'retryBudgetRatio', 'number'],
  ['SWITCHYARD_BREAKER_FAILURES', 'breakerFailures', 'int'],
  ['SWITCHYARD_BREAKER_EJECT_MS', 'breakerEjectMs', 'int'],
  ['SWITCHYARD_HEALTH_CHECK_INTERVAL_MS', 'healthCheckIntervalMs', 'int'],
  ['SWITCHYARD_UPSTREAM_ALLOW', 'upstreamAllow', 'list'],
  ['SWITCHYARD_MAX_IN_FLIGHT', 'maxInFlight', 'int'],
  ['SWITCHYARD_MAX_EVENT_LOOP_DELAY_MS', 'maxEventLoopDelayMs', 'int'],
  ['SWITCHYARD_MAX_HEADER_BYTES', 'maxHeaderBytes', 'int'],
  ['SWITCHYARD_BODY_TIMEOUT_MS', 'bodyTimeoutMs', 'int'],
  ['SWITCHYARD_UPSTREAM_MAX_BODY_BYTES', 'upstreamMaxBodyBytes', 'int'],
  ['SWITCHYARD_UPSTREAM_MAX_LINE_BYTES', 'upstreamMaxLineBytes', 'int'],
  ['SWITCHYARD_UPSTREAM_MAX_ERROR_BYTES', 'upstreamMaxErrorBytes', 'int'],
  ['SWITCHYARD_UPSTREAM_ATTEMPTS_TIMEOUT_MS', 'upstreamAttemptsTimeoutMs', 'int'],
  ['SWITCHYARD_UPSTREAM_KEY_VARS', 'upstreamKeyVars', 'list'],
  ['SWITCHYARD_SCHEMA_MAX_BYTES', 'schemaMaxBytes', 'int'],
  ['SWITCHYARD_SCHEMA_MAX_DEPTH', 'schemaMaxDepth', 'int'],
  ['SWITCHYARD_SCHEMA_MAX_NODES', 'schemaMaxNodes', 'int'],
  ['SWITCHYARD_SCHEMA_MAX_ENUM', 'schemaMaxEnum', 'int'],
  ['SWITCHYARD_SCHEMA_MAX_MIN_COUNT', 'schemaMaxMinCount', 'int'],
  ['SWITCHYARD_SCHEMA_CACHE_SIZE', 'schemaCacheSize', 'int'],
  ['SWITCHYARD_SCHEMA_COMPILE_TIMEOUT_MS', 'schemaCompileTimeoutMs', 'int'],
];

export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const DEFAULT_CATALOGUE_FILE = resolve(PACKAGE_ROOT, 'config', 'catalogue.yaml');

/**
 * Which database the settings name, for the start-up line: the SQLite file (the default, under the
 * data dir, which is relative to the working directory), or the URL without its password.
 */
export function databaseLocation(config: Pick<Config, 'databaseUrl' | 'dataDir'>): string {
  if (config.databaseUrl === undefined) return resolve(config.dataDir, 'switchyard.db');
  try {
    const url = new URL(config.databaseUrl);
    if (url.password) url.password = '***';
    return url.toString();
  } catch {
    return config.databaseUrl.replace(/:[^:@/]*@/, ':***@');
  }
}

/** The values an enumerated setting takes (for its error message), from a validation error's parameters. */
function allowedValues(params: unknown): string[] | undefined {
  const allowed = (params as { allowedValues?: unknown } | undefined)?.allowedValues;
  return Array.isArray(allowed) ? allowed.map(String) : undefined;
}

const DEFAULTS = {
  host: '127.0.0.1',
  port: 8080,
  dataDir: './data',
  modelsDir: DEFAULT_MODELS_DIR,
  bodyLimit: 16 * 1024 * 1024,
  shutdownTimeoutMs: 10_000,
  // Open Responses limits a Responses WebSocket to 60 minutes.
  websocketMaxConnectionMs: 60 * 60_000,
  // Open Responses WebSockets one organization may hold at once (each counts toward maxInFlight).
  websocketMaxPerOrg: 64,
  // Twice the default body limit: a turn reads about as much stored history as a large request sends.
  historyMaxBytes: 32 * 1024 * 1024,
  logLevel: 'info',
  // Log lines go out in blocks of this size, or after LOG_WAIT_MS (src/app.ts); 0 writes each line.
  logBufferBytes: 4096,
  // Revocations and limit changes made elsewhere (another instance, the CLI) apply within a second.
  keyCacheTtlMs: 1_000,
  catalogueRefreshMs: 5_000,
  // Closed: browsers are let in only when an operator names their origins (or '*').
  corsOrigin: '',
  localAuthor: 'local',
  defaultCatalogue: true,
  models: [],
  localModels: {},
  deployments: [],
  // One thread: on 2 cores llama.cpp's default collapsed to ~1 tok/s; concurrency comes from sequences.
  localThreads: 1,
  localParallel: 4,
  localQueueSize: 64,
  localMemoryBudgetMb: 4096,
  localGpu: 'auto',
  localPreload: false,
  responseStaleMs: 60_000,
  ledgerFlushMs: 1000,
  workers: availableParallelism(),
  upstreamConnectTimeoutMs: 5_000,
  // A non-stream upstream sends its head only when the whole answer is ready.
  upstreamFirstByteTimeoutMs: 300_000,
  upstreamIdleTimeoutMs: 60_000,
  upstreamMaxAttempts: 3,
  retryBudgetRatio: 0.2,
  breakerFailures: 5,
  breakerEjectMs: 30_000,
  healthCheckIntervalMs: 2_000,
  upstreamAllow: [],
  maxInFlight: 10_000,
  maxEventLoopDelayMs: 1_000,
  maxHeaderBytes: 16 * 1024,
  // Slowloris: a request that has not fully arrived in 30 s holds a slot for nothing.
  bodyTimeoutMs: 30_000,
  // A long non-stream answer is well under a megabyte of JSON; these leave room and bound memory.
  upstreamMaxBodyBytes: 8 * 1024 * 1024,
  upstreamMaxLineBytes: 4 * 1024 * 1024,
  upstreamMaxErrorBytes: 64 * 1024,
  // As long as one attempt may wait: a hung upstream costs this once, not once per attempt.
  upstreamAttemptsTimeoutMs: 300_000,
  upstreamKeyVars: [],
  // Every one of the 320 real-world schemas in shared/schemas fits these with room to spare
  // (largest 392 KB, depth 20, 2,309 subschemas, 251 enum values, minItems 15).
  schemaMaxBytes: 1024 * 1024,
  schemaMaxDepth: 64,
  schemaMaxNodes: 20_000,
  schemaMaxEnum: 1000,
  schemaMaxMinCount: 1000,
  schemaCacheSize: 256,
  schemaCompileTimeoutMs: 5_000,
} satisfies Partial<Config>;

function readStructuredFile(path: string, label: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`${label}: cannot read ${path}: ${(err as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = extname(path).toLowerCase() === '.json' ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ConfigError(`${label}: ${path} is not valid ${extname(path) === '.json' ? 'JSON' : 'YAML'}: ${(err as Error).message}`);
  }
  if (parsed === null || parsed === undefined) return {};
  if (typeof parsed !== 'object' || Array.isArray(parsed)) throw new ConfigError(`${label}: ${path} must hold an object`);
  return parsed as Record<string, unknown>;
}

/**
 * Why a value is not an origin as a browser sends it in `Origin` (undefined when it is one):
 * `scheme://host[:port]` with nothing after it (`https://app.example.com`, `http://localhost:3000`,
 * `chrome-extension://<id>`, `tauri://localhost`), or `null`. For http and https it must be written
 * as browsers write it (lowercase, no default port), since CORS compares it exactly.
 */
function originProblem(value: string): string | undefined {
  if (value === 'null') return undefined;
  if (value === '*') return "'*' allows every origin and stands alone, not in a list";
  const notOne = `'${value}' is not an origin (scheme://host[:port], no path or trailing slash)`;
  if (!/^[a-z][a-z0-9+.-]*:\/\/[^/?#\s]+$/i.test(value)) return notOne;
  if (!/^https?:/i.test(value)) return undefined;
  try {
    const origin = new URL(value).origin;
    return origin === value ? undefined : `'${value}' must be written as browsers send it: '${origin}'`;
  } catch {
    return notOne;
  }
}

export interface LoadConfigOptions {
  env?: NodeJS.ProcessEnv;
  /** Command-line overrides (`--port`, `--host`), which win over everything. */
  overrides?: Partial<Pick<Config, 'host' | 'port'>>;
}

/**
 * Defaults, then the shipped catalogue (authors and default models), then the config file named by
 * SWITCHYARD_CONFIG, then environment variables, then command-line flags. Fails with a message that
 * names the bad setting and where it came from.
 */
export function loadConfig(opts: LoadConfigOptions = {}): Config {
  const env = opts.env ?? process.env;
  const raw: Record<string, unknown> = { ...DEFAULTS };
  const origin = new Map<string, string>();

  const shipped = readStructuredFile(DEFAULT_CATALOGUE_FILE, 'default catalogue');
  raw['authors'] = shipped['authors'];

  const configFile = env['SWITCHYARD_CONFIG'];
  let fileModels: unknown = undefined;
  if (configFile) {
    const file = readStructuredFile(resolve(configFile), 'SWITCHYARD_CONFIG');
    for (const [k, v] of Object.entries(file)) {
      raw[k] = v;
      origin.set(k, `${configFile}: ${k}`);
    }
    fileModels = file['models'];
  }
  for (const [name, key, kind] of ENV) {
    const value = env[name];
    if (value === undefined || value === '') continue;
    raw[key] =
      kind === 'int' && /^-?\d+$/.test(value.trim())
        ? Number(value)
        : kind === 'number' && value.trim() !== '' && Number.isFinite(Number(value))
          ? Number(value)
          : kind === 'list'
            ? value
                .split(',')
                .map((v) => v.trim())
                .filter(Boolean)
            : kind === 'bool' && /^(true|false|1|0)$/.test(value.trim())
              ? /^(true|1)$/.test(value.trim())
              : value;
    origin.set(key, name);
  }
  for (const [k, v] of Object.entries(opts.overrides ?? {})) {
    if (v === undefined) continue;
    raw[k] = v;
    origin.set(k, `--${k}`);
  }

  const defaultCatalogue = raw['defaultCatalogue'] !== false;
  const shippedModels = defaultCatalogue && Array.isArray(shipped['models']) ? shipped['models'] : [];
  raw['models'] = [...shippedModels, ...(Array.isArray(fileModels) ? fileModels : fileModels === undefined ? [] : [fileModels])];

  const first = Value.Errors(ConfigSchema, raw)[0];
  if (first) {
    const path = first.instancePath.split('/').filter(Boolean);
    const top = path[0] ?? '';
    if (!(top in ConfigSchema.properties)) {
      throw new ConfigError(`Invalid configuration: unknown setting '${top}'${origin.has(top) ? ` in ${configFile}` : ''}`);
    }
    let where = origin.get(top) ?? `setting '${top}'`;
    if (top === 'models') {
      // Shipped entries come first; point at the entry where the operator wrote it.
      const index = Number(path[1]);
      where = index < shippedModels.length ? `${DEFAULT_CATALOGUE_FILE}: models` : `${configFile ?? 'config'}: models`;
      path[1] = String(index < shippedModels.length ? index : index - shippedModels.length);
    }
    const at = path.length > 1 ? ` (at ${path.slice(1).join('.')})` : '';
    const got =
      path.length === 1
        ? ` (got ${JSON.stringify(top === 'adminKey' || top === 'secretKey' || top === 'metricsToken' ? '<redacted>' : raw[top])?.slice(0, 80)})`
        : '';
    const allowed = allowedValues(first.params);
    const oneOf = allowed ? `: ${allowed.join(', ')}` : '';
    throw new ConfigError(`Invalid configuration: ${where}${at} ${first.message}${oneOf}${got}`);
  }
  const config = raw as Config;
  const where = (key: string) => origin.get(key) ?? `setting '${key}'`;
  for (const entry of config.upstreamAllow) {
    const problem = allowEntryProblem(entry);
    if (problem) throw new ConfigError(`Invalid configuration: ${where('upstreamAllow')}: ${problem}`);
  }
  if (config.corsOrigin.trim() !== '*') {
    for (const o of config.corsOrigin
      .split(',')
      .map((v) => v.trim())
      .filter(Boolean)) {
      const problem = originProblem(o);
      if (problem) throw new ConfigError(`Invalid configuration: ${where('corsOrigin')}: ${problem}`);
    }
  }
  const ids = new Set<string>();
  for (const m of config.models) {
    // A config file entry with the id of a shipped one replaces it.
    ids.add(m.id);
  }
  config.models = [...ids].map((id) => config.models.findLast((m) => m.id === id)!);
  for (const m of config.models) {
    const author = m.id.slice(0, m.id.indexOf('/'));
    if (!config.authors.includes(author)) {
      throw new ConfigError(
        `Invalid configuration: model '${m.id}' has author '${author}', which is not one of authors (${config.authors.join(', ')})`,
      );
    }
  }
  return config;
}

// The settings each component takes, read from the one set of defaults above (components keep no
// defaults of their own).

export function upstreamOptions(config: Config): UpstreamOptions {
  return {
    connectTimeoutMs: config.upstreamConnectTimeoutMs,
    firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs,
    idleTimeoutMs: config.upstreamIdleTimeoutMs,
    policy: new AddressPolicy(config.upstreamAllow),
    maxBodyBytes: config.upstreamMaxBodyBytes,
    maxLineBytes: config.upstreamMaxLineBytes,
    maxErrorBytes: config.upstreamMaxErrorBytes,
  };
}

export function routingPolicy(config: Config): RoutingPolicy {
  return {
    maxAttempts: config.upstreamMaxAttempts,
    attemptsTimeoutMs: config.upstreamAttemptsTimeoutMs,
    retryBudgetRatio: config.retryBudgetRatio,
    keyVars: config.upstreamKeyVars,
    health: { failures: config.breakerFailures, ejectMs: config.breakerEjectMs, probeIntervalMs: config.healthCheckIntervalMs },
  };
}

export function schemaLimits(config: Config): SchemaLimits {
  return {
    maxBytes: config.schemaMaxBytes,
    maxDepth: config.schemaMaxDepth,
    maxNodes: config.schemaMaxNodes,
    maxEnum: config.schemaMaxEnum,
    maxMinCount: config.schemaMaxMinCount,
  };
}
