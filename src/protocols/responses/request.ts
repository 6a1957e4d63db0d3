import Type, { type Static } from 'typebox';
import { ApiError } from '../../core/errors.js';
import type { FunctionTool, ResponseFormat } from '../../core/canonical.js';
import type { ResponsesCreate } from '../../core/responses/format.js';
import { Instructions, MaxOutputTokens, ModelField, NullableBoolean, Temperature, TopP, nullable } from '../fields.js';
import { decodeInput } from './items.js';

const FunctionTool = Type.Object({
  type: Type.Literal('function'),
  name: Type.String({ pattern: '^[a-zA-Z0-9_.-]{1,64}$' }),
  description: nullable(Type.String()),
  parameters: nullable(Type.Record(Type.String(), Type.Unknown())),
  strict: NullableBoolean,
});

/** `POST /v1/responses` (spec §4.2 with the wire doc's extra fields); unknown fields are ignored. */
export const ResponsesRequestSchema = Type.Object({
  model: ModelField,
  input: Type.Union([Type.String(), Type.Array(Type.Record(Type.String(), Type.Unknown()))]),
  instructions: Instructions,
  max_output_tokens: MaxOutputTokens,
  temperature: Temperature,
  top_p: TopP,
  tools: nullable(Type.Array(FunctionTool)),
  tool_choice: nullable(
    Type.Union([Type.Enum(['auto', 'none', 'required']), Type.Object({ type: Type.Literal('function'), name: Type.String() })]),
  ),
  parallel_tool_calls: NullableBoolean,
  stream: NullableBoolean,
  text: nullable(
    Type.Object({
      format: Type.Optional(
        Type.Union([
          Type.Object({ type: Type.Enum(['text', 'json_object']) }),
          Type.Object({
            type: Type.Literal('json_schema'),
            name: Type.String(),
            schema: Type.Record(Type.String(), Type.Unknown()),
            strict: NullableBoolean,
          }),
        ]),
      ),
    }),
  ),
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
  include: nullable(Type.Array(Type.String())),
  metadata: nullable(Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 })),
  truncation: nullable(Type.Enum(['auto', 'disabled'])),
  user: nullable(Type.String()),
});

export type ResponsesRequest = Static<typeof ResponsesRequestSchema>;

/** A validated `POST /v1/responses` body as the canonical request core runs. */
export function decodeResponsesRequest(body: ResponsesRequest): ResponsesCreate<ResponsesRequest> {
  const generation: ResponsesCreate<ResponsesRequest>['generation'] = { sampling: {} };
  if (body.temperature != null) generation.sampling.temperature = body.temperature;
  if (body.top_p != null) generation.sampling.topP = body.top_p;
  if (body.max_output_tokens != null) generation.maxOutputTokens = body.max_output_tokens;
  if (body.tools?.length) {
    generation.tools = body.tools.map((t): FunctionTool => ({
      name: t.name,
      ...(t.description != null && { description: t.description }),
      ...(t.parameters != null && { parameters: t.parameters }),
      ...(t.strict != null && { strict: t.strict }),
    }));
    const choice = body.tool_choice;
    if (choice != null) {
      if (typeof choice !== 'string' && !body.tools.some((t) => t.name === choice.name)) {
        throw new ApiError('invalid_value', `tool_choice names '${choice.name}', which is not one of the tools.`, { param: 'tool_choice' });
      }
      generation.toolChoice = typeof choice === 'string' ? choice : { name: choice.name };
    }
    if (body.parallel_tool_calls != null) generation.parallelToolCalls = body.parallel_tool_calls;
  }
  const fmt = body.text?.format;
  if (fmt && fmt.type !== 'text') {
    generation.responseFormat =
      fmt.type === 'json_schema'
        ? { type: 'json_schema', name: fmt.name, schema: fmt.schema, ...(fmt.strict != null && { strict: fmt.strict }) }
        : ({ type: 'json_object' } satisfies ResponseFormat);
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
    echo: body,
  };
}
