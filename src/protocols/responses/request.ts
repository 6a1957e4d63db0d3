import Type, { type Static } from 'typebox';
import { ApiError } from '../../core/errors.js';
import { allowTools, refuseChoiceWithoutTools } from '../validation.js';
import type { FunctionTool, ResponseFormat } from '../../core/canonical.js';
import type { ResponsesCreate } from '../../core/responses/format.js';
import {
  COUNT_MAX,
  Instructions,
  MAX_INPUT_ITEMS,
  MAX_TOOLS,
  MaxOutputTokens,
  Metadata,
  ModelField,
  NullableBoolean,
  Penalty,
  Temperature,
  TopLogprobs,
  TopP,
  nullable,
} from '../fields.js';
import { decodeInput } from './items.js';

// `type` and `name` are checked in decodeResponsesRequest: a built-in tool (web_search, …) has no
// name, and is refused by its type rather than for the name it lacks.
const FunctionTool = Type.Object({
  type: Type.String(),
  name: Type.Optional(Type.String({ pattern: '^[a-zA-Z0-9_.-]{1,64}$' })),
  description: nullable(Type.String()),
  parameters: nullable(Type.Record(Type.String(), Type.Unknown())),
  strict: NullableBoolean,
});

const INCLUDABLE = [
  'reasoning.encrypted_content',
  'message.output_text.logprobs',
  'message.input_image.image_url',
  'file_search_call.results',
  'web_search_call.results',
  'web_search_call.action.sources',
  'computer_call_output.output.image_url',
  'code_interpreter_call.outputs',
];

/**
 * `include` in a query (`GET /v1/responses/{id}` and its input items): `include=a&include=b`, or
 * `include[]=a`, as the OpenAI SDKs write arrays. A value that is not one of OpenAI's is a 400
 * naming it, as in a create request's body (it used to be ignored).
 */
export function decodeIncludeQuery(query: Readonly<Record<string, unknown>>): string[] {
  const values = [query['include'], query['include[]']].flatMap((v) => (v === undefined ? [] : Array.isArray(v) ? v : [v]));
  for (const v of values) {
    if (typeof v !== 'string' || !INCLUDABLE.includes(v))
      throw new ApiError(
        'invalid_value',
        `Invalid value for 'include': '${String(v)}'. Supported values are: ${INCLUDABLE.map((i) => `'${i}'`).join(', ')}.`,
        {
          param: 'include',
        },
      );
  }
  return values as string[];
}

/** `POST /v1/responses` (spec §4.2 with the wire doc's extra fields); unknown fields are ignored. */
export const ResponsesRequestSchema = Type.Object({
  model: ModelField,
  input: Type.Union([Type.String(), Type.Array(Type.Record(Type.String(), Type.Unknown()), { maxItems: MAX_INPUT_ITEMS })]),
  instructions: Instructions,
  max_output_tokens: MaxOutputTokens,
  temperature: Temperature,
  top_p: TopP,
  tools: nullable(Type.Array(FunctionTool, { maxItems: MAX_TOOLS })),
  tool_choice: nullable(
    Type.Union([
      Type.Enum(['auto', 'none', 'required']),
      Type.Object({ type: Type.Literal('function'), name: Type.String() }),
      Type.Object({
        type: Type.Literal('allowed_tools'),
        mode: Type.Optional(Type.Enum(['none', 'auto', 'required'])),
        tools: Type.Array(Type.Object({ type: Type.Literal('function'), name: Type.String() }), { minItems: 1, maxItems: 128 }),
      }),
    ]),
  ),
  parallel_tool_calls: NullableBoolean,
  stream: NullableBoolean,
  stream_options: nullable(Type.Object({ include_obfuscation: Type.Optional(Type.Boolean()) })),
  // One object for the three formats (not a union), so a bad `type` is answered with the three
  // allowed values; what json_schema needs besides is checked in decodeResponsesRequest.
  text: nullable(
    Type.Object(
      {
        format: nullable(
          Type.Object({
            type: Type.Enum(['text', 'json_object', 'json_schema']),
            name: Type.Optional(Type.String({ pattern: '^[a-zA-Z0-9_-]{1,64}$' })),
            description: nullable(Type.String()),
            schema: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
            strict: NullableBoolean,
          }),
        ),
        verbosity: nullable(Type.Enum(['low', 'medium', 'high'])),
      },
      { additionalProperties: false },
    ),
  ),
  presence_penalty: Penalty,
  frequency_penalty: Penalty,
  top_logprobs: TopLogprobs,
  max_tool_calls: nullable(Type.Integer({ minimum: 1, maximum: COUNT_MAX })),
  service_tier: nullable(Type.Enum(['auto', 'default', 'flex', 'priority'])),
  safety_identifier: nullable(Type.String({ maxLength: 64 })),
  prompt_cache_key: nullable(Type.String({ maxLength: 64 })),
  reasoning: nullable(
    Type.Object({
      effort: nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high'])),
      summary: nullable(Type.Enum(['auto', 'concise', 'detailed'])),
    }),
  ),
  store: NullableBoolean,
  previous_response_id: nullable(Type.String({ minLength: 1 })),
  conversation: nullable(Type.Union([Type.String({ minLength: 1 }), Type.Object({ id: Type.String({ minLength: 1 }) })])),
  background: NullableBoolean,
  // OpenAI's values (Open Responses names two of them): those for tools that are not here include
  // nothing; logprobs are refused (decodeResponsesRequest); anything else is a 400 listing them.
  include: nullable(Type.Array(Type.Enum(INCLUDABLE))),
  metadata: nullable(Metadata),
  truncation: nullable(Type.Enum(['auto', 'disabled'])),
  user: nullable(Type.String()),
});

export type ResponsesRequest = Static<typeof ResponsesRequestSchema>;

/** A validated `POST /v1/responses` body as the canonical request core runs. */
export function decodeResponsesRequest(body: ResponsesRequest): ResponsesCreate<ResponsesRequest> {
  const generation: ResponsesCreate<ResponsesRequest>['generation'] = { sampling: {} };
  if (body.temperature != null) generation.sampling.temperature = body.temperature;
  if (body.top_p != null) generation.sampling.topP = body.top_p;
  if (body.presence_penalty != null) generation.sampling.presencePenalty = body.presence_penalty;
  if (body.frequency_penalty != null) generation.sampling.frequencyPenalty = body.frequency_penalty;
  if (body.top_logprobs != null && body.top_logprobs > 0) {
    // Neither engine returns token log probabilities; saying so beats an empty list the client cannot tell apart.
    throw new ApiError(
      'unsupported_parameter',
      'top_logprobs is not supported: no model here returns log probabilities. Send 0 or leave it out.',
      {
        param: 'top_logprobs',
      },
    );
  }
  if (body.stream_options != null && body.stream !== true) {
    throw new ApiError('invalid_value', "The 'stream_options' parameter is only allowed when 'stream' is enabled.", {
      param: 'stream_options',
    });
  }
  if (body.include?.includes('message.output_text.logprobs')) {
    throw new ApiError(
      'unsupported_parameter',
      "include 'message.output_text.logprobs' is not supported: no model here returns log probabilities.",
      {
        param: 'include',
      },
    );
  }
  // Stored prompt templates (OpenAI's dashboard prompts) are not kept here.
  if ((body as Record<string, unknown>)['prompt'] != null) {
    throw new ApiError(
      'unsupported_parameter',
      'prompt (a stored prompt template) is not supported here; send the instructions and input.',
      {
        param: 'prompt',
      },
    );
  }
  if (body.max_output_tokens != null) generation.maxOutputTokens = body.max_output_tokens;
  if (body.tools?.length) {
    generation.tools = body.tools.map((t, i): FunctionTool => {
      if (t.type !== 'function')
        throw new ApiError('unsupported_parameter', `Tool type '${t.type}' is not supported here; only function tools.`, {
          param: `tools[${i}].type`,
        });
      if (t.name === undefined)
        throw new ApiError('missing_required_parameter', `Missing required parameter: 'tools[${i}].name'.`, { param: `tools[${i}].name` });
      return {
        position: i,
        name: t.name,
        ...(t.description != null && { description: t.description }),
        ...(t.parameters != null && { parameters: t.parameters }),
        // Left out, strict keeps its Responses meaning, which the engines give it as OpenAI
        // documents: held to the schema where it can be, best effort where not (docs/decisions.md).
        ...(t.strict != null && { strict: t.strict }),
      };
    });
    const choice = body.tool_choice;
    if (choice != null && typeof choice !== 'string' && choice.type === 'allowed_tools') {
      const allowed = allowTools(
        generation.tools,
        choice.tools.map((t) => t.name),
        choice.mode ?? 'auto',
        (i) => `tool_choice.tools[${i}].name`,
      );
      generation.tools = allowed.tools;
      generation.toolChoice = allowed.toolChoice;
    } else if (choice != null) {
      if (typeof choice !== 'string' && !body.tools.some((t) => t.name === choice.name)) {
        throw new ApiError('invalid_value', `tool_choice names '${choice.name}', which is not one of the tools.`, { param: 'tool_choice' });
      }
      generation.toolChoice = typeof choice === 'string' ? choice : { name: choice.name };
    }
    if (body.parallel_tool_calls != null) generation.parallelToolCalls = body.parallel_tool_calls;
  } else if (body.tool_choice != null) {
    const choice = body.tool_choice;
    refuseChoiceWithoutTools(typeof choice === 'string' || choice.type === 'function' ? choice : { name: choice.tools[0]!.name });
  }
  const fmt = body.text?.format;
  if (fmt && fmt.type === 'json_schema') {
    // Open Responses requires neither `name` nor `schema` (OpenAI's API requires both): a format
    // without a schema is any JSON document, as an empty schema is (docs/decisions.md).
    generation.responseFormat = {
      type: 'json_schema',
      name: fmt.name ?? '',
      schema: fmt.schema ?? {},
      ...(fmt.strict != null && { strict: fmt.strict }),
      param: 'text.format',
    };
  } else if (fmt && fmt.type === 'json_object') {
    generation.responseFormat = { type: 'json_object' } satisfies ResponseFormat;
  }
  if (body.reasoning?.effort != null) generation.reasoningEffort = body.reasoning.effort;
  const conversation = body.conversation;
  return {
    model: body.model,
    input: decodeInput(body.input),
    instructions: body.instructions ?? null,
    generation,
    stream: body.stream === true,
    store: body.store !== false,
    background: body.background === true,
    previousResponseId: body.previous_response_id ?? null,
    conversationId: conversation == null ? null : typeof conversation === 'string' ? conversation : conversation.id,
    includeSealedReasoning: body.include?.includes('reasoning.encrypted_content') === true,
    summary: body.reasoning?.summary ?? null,
    truncation: body.truncation ?? 'disabled',
    echo: body,
  };
}

/** `POST /v1/responses/compact` (Open Responses' CompactResponseMethodPublicBody); unknown fields are ignored. */
export const CompactRequestSchema = Type.Object({
  model: ModelField,
  input: nullable(Type.Union([Type.String(), Type.Array(Type.Record(Type.String(), Type.Unknown()), { maxItems: MAX_INPUT_ITEMS })])),
  previous_response_id: nullable(Type.String({ minLength: 1 })),
  instructions: Instructions,
  prompt_cache_key: nullable(Type.String({ maxLength: 64 })),
});
export type CompactRequest = Static<typeof CompactRequestSchema>;

/** What a compaction reads of its request: the same context a response would have. */
export function decodeCompactRequest(
  body: CompactRequest,
): Pick<ResponsesCreate<unknown>, 'model' | 'input' | 'instructions' | 'previousResponseId' | 'conversationId'> {
  return {
    model: body.model,
    input: body.input == null ? [] : decodeInput(body.input),
    instructions: body.instructions ?? null,
    previousResponseId: body.previous_response_id ?? null,
    conversationId: null,
  };
}
