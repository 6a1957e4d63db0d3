import { ApiError } from './errors.js';
import type { GenerationRequest } from './canonical.js';
import type { Principal } from './principal.js';
import { costOf, type Ledger } from './ledger.js';
import type { Admission, Limiter, Maybe, WorstCase } from './limits.js';
import { MeteredStream, type GenerationStart, type MeterContext } from './metering.js';
import type { Metrics } from './metrics.js';
import type { Capability, Model } from './model-spec.js';
import type { Router } from './router.js';
import { checkSchemaLimits, type SchemaLimits } from './schema-limits.js';
import { estimateInputTokens } from './estimate.js';

/** A count of a request's input tokens (an estimate for an upstream model), with the rate-limit headers of its admission. */
export interface InputTokenCount {
  tokens: number;
  estimated: boolean;
  headers: Record<string, string>;
}
export type { GenerationStart };

/** Where each API family puts the output format and its JSON schema, for errors naming the parameter. */
const FORMAT_PARAMS = {
  chat: ['response_format', 'response_format.json_schema.schema'],
  responses: ['text.format', 'text.format.schema'],
  messages: ['output_config.format', 'output_config.format.schema'],
} as const;
/** Where each protocol carries a tool's name. */
const TOOL_NAME_PARAMS = {
  chat: (i: number) => `tools[${i}].function.name`,
  responses: (i: number) => `tools[${i}].name`,
  messages: (i: number) => `tools[${i}].name`,
} as const;
/** Where each protocol carries a tool's parameter schema. */
const TOOL_PARAMS = {
  chat: (i: number) => `tools[${i}].function.parameters`,
  responses: (i: number) => `tools[${i}].parameters`,
  messages: (i: number) => `tools[${i}].input_schema`,
} as const;

/**
 * Whether a tool's parameter schema can describe an object: a call's arguments are a JSON object
 * (the SDKs parse them into one, and Anthropic's `tool_use.input` must be one). A schema without a
 * `type` is read as an object's, as clients that send `{}` or only `properties` mean it.
 */
function describesObject(parameters: Record<string, unknown>): boolean {
  const type = parameters['type'];
  return type === undefined || type === 'object' || (Array.isArray(type) && type.includes('object'));
}

/** The most a request can use and cost: its estimated input and the largest output it may get. */
function worstCase(model: Model, req: GenerationRequest): WorstCase {
  const input = estimateInputTokens(req);
  // No answer outgrows the context: a max_tokens past it reserves only the room there is (a hostile
  // pass's 100,000,000 reserved the month's budget and a minute's tokens while one stream ran).
  const ctx = model.context_length;
  const room = ctx === undefined || ctx === null ? undefined : Math.max(0, ctx - input);
  const max = req.maxOutputTokens;
  const output = max === undefined ? (room ?? 0) : room === undefined ? max : Math.min(max, room);
  return { tokens: input + output, cost: costOf(model, { input, cached: 0, output }) };
}

/** A generation request's endpoint and timing, which every record of it carries. */
export type GenerationMeta = Omit<GenerationStart, 'model' | 'who'>;

/** An admitted generation: its model, what the admission says to the client, and how to start it. */
export interface Admitted {
  model: Model;
  admission: Admission;
  /** Starts the generation under metering; problems before its first event are thrown here. */
  open(): Promise<MeteredStream>;
}

/**
 * The one generation pipeline every endpoint runs, in one fixed order: resolve the model, check
 * what the canonical request needs of it (capabilities, images, JSON schemas against the limits),
 * admit it (limits and the budget reservation), then start it under metering. Nothing counts
 * against a limit for a request refused before admission, whichever protocol it came in.
 */
export class GenerationPipeline {
  constructor(
    private readonly router: Router,
    private readonly limiter: Limiter,
    private readonly ledger: Ledger,
    private readonly metrics: Metrics,
    private readonly schemaLimits: SchemaLimits,
  ) {}

  /** Step 1: the catalogue model the caller may generate with (or the answer decided in docs/decisions.md). */
  resolve(id: string, who: Principal): Model {
    return this.router.resolve(id, who);
  }

  /**
   * Steps 2 and 3: what the request needs of the model, then admission. At once when the limiter
   * answers from local counters (no promise per request for it), else a promise; a refusal is
   * thrown (or rejects).
   */
  admit(model: Model, req: GenerationRequest, who: Principal, meta: GenerationMeta): Maybe<Admitted> {
    this.checkNeeds(model, req, meta.endpoint);
    req.cacheScope = who.orgId;
    const admission = this.limiter.admit(who, model.id, () => worstCase(model, req));
    return admission instanceof Promise
      ? admission.then((a) => this.admitted(model, req, who, meta, a))
      : this.admitted(model, req, who, meta, admission);
  }

  private admitted(model: Model, req: GenerationRequest, who: Principal, meta: GenerationMeta, admission: Admission): Admitted {
    return {
      model,
      admission,
      // Each opening gets its own context (the router writes the deployment that served it into `trace`).
      open: () => {
        // Written out rather than spread from `meta`: the spread gave every request's context a
        // hidden class of its own, so each read of it in metering missed V8's caches (bench/README.md,
        // "Hidden classes made per request").
        const start: MeterContext = {
          model,
          who,
          endpoint: meta.endpoint,
          requestId: meta.requestId,
          stream: meta.stream,
          started: meta.started,
          trace: {},
          settle: admission.settle,
        };
        return MeteredStream.open(this.router, req, start, this.ledger, this.metrics);
      },
    };
  }

  /** A request's prompt tokens, counted without generating: the same checks, no admission (nothing runs or is billed). */
  async countInputTokens(model: Model, req: GenerationRequest): Promise<{ tokens: number; estimated: boolean }> {
    this.checkNeeds(model, req, 'responses');
    return this.router.countInputTokens(req, model);
  }

  /**
   * A client's count of a request's prompt tokens (the input-token endpoints): under the key's and
   * organization's allowed models and requests per minute, since a count loads a local model and
   * tokenizes; its requests are counted apart from generation's (as Anthropic limits its token
   * counting apart), and no token or spend limit applies, since nothing is generated or billed.
   */
  async countFor(model: Model, req: GenerationRequest, who: Principal): Promise<InputTokenCount> {
    this.checkNeeds(model, req, 'responses');
    const admission = await this.limiter.admit(who, model.id, undefined, 'count');
    try {
      // With the admission's x-ratelimit-* headers, as every other answer of a key with limits has them.
      return { ...(await this.router.countInputTokens(req, model)), headers: admission.headers };
    } finally {
      admission.settle(0, null);
    }
  }

  /** A request that needs what the model does not advertise gets a 400 naming the capability. */
  private checkNeeds(model: Model, req: GenerationRequest, endpoint: GenerationMeta['endpoint']): void {
    const need = (cap: Capability, param: string) => {
      if (!model.capabilities.includes(cap))
        throw new ApiError('missing_capability', `The model '${model.id}' does not support ${cap}.`, { param });
    };
    // Chat completions and Messages both name parameters by their `messages` list.
    const chat = endpoint === 'chat.completions' || endpoint === 'messages';
    const protocol = endpoint === 'messages' ? 'messages' : chat ? 'chat' : 'responses';
    const [format, schema] = FORMAT_PARAMS[protocol];
    if (req.tools?.length && req.toolChoice !== 'none') need('function_calling', 'tools');
    if (req.responseFormat && req.responseFormat.type !== 'text') need('structured_output', format);
    // Anthropic has no JSON mode: refused here, naming the client's parameter, for a model only
    // Anthropic deployments serve (the router sends it to a mixed model's other deployments, and
    // protocols/messages/client.ts refuses it as a last line).
    if (req.responseFormat?.type === 'json_object' && this.router.anthropicOnly(model)) {
      throw new ApiError(
        'unsupported_parameter',
        `A json_object format is not supported by '${model.id}' (it is served by Anthropic's API, which has no JSON mode); send a json_schema format instead.`,
        { param: format },
      );
    }
    // Images, on every endpoint.
    if (!model.capabilities.includes('vision')) {
      req.messages.forEach((m, i) => {
        if (typeof m.content === 'string' || m.content === null) return;
        const j = m.content.findIndex((p) => p.type === 'image');
        if (j < 0) return;
        throw new ApiError('unsupported_content', `The model '${model.id}' does not accept images (it lacks the vision capability).`, {
          param: chat ? `messages[${i}].content[${j}]` : 'input',
        });
      });
    }
    // A call names its tool: two tools of one name would make it ambiguous (Anthropic refuses them too).
    const names = new Set<string>();
    req.tools?.forEach((t, i) => {
      if (names.has(t.name))
        throw new ApiError('invalid_value', `Tool names must be unique: '${t.name}' is given twice.`, {
          param: TOOL_NAME_PARAMS[protocol](t.position ?? i),
        });
      names.add(t.name);
    });
    req.tools?.forEach((t, i) => {
      if (!t.parameters) return;
      const param = TOOL_PARAMS[protocol](t.position ?? i);
      checkSchemaLimits(t.parameters, this.schemaLimits, param);
      if (!describesObject(t.parameters)) {
        // OpenAI's own answer to the same request, word for word but for the quoting.
        throw new ApiError(
          'invalid_function_parameters',
          `Invalid schema for function '${t.name}': schema must be a JSON Schema of 'type: "object"', got 'type: ${JSON.stringify(t.parameters['type'])}'.`,
          { param },
        );
      }
    });
    if (req.responseFormat?.type === 'json_schema') {
      checkSchemaLimits(req.responseFormat.schema, this.schemaLimits, schema);
    }
  }
}
