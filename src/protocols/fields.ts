import Type from 'typebox';

/**
 * The request limits of spec §8, as schema pieces shared by the chat and responses endpoints, so
 * both enforce them identically and at validation time (400, never a 500 or an engine error).
 */
const nullable = <T extends Parameters<typeof Type.Optional>[0]>(t: T) => Type.Optional(Type.Union([t, Type.Null()]));

export const ModelField = Type.String({ minLength: 1, maxLength: 255 });
export const Temperature = nullable(Type.Number({ minimum: 0, maximum: 2 }));
export const TopP = nullable(Type.Number({ minimum: 0, maximum: 1 }));
/**
 * The most any count in a request may be: engines hold counts as 32-bit integers, and JSON's `1e309`
 * parses to Infinity, which Ajv's integer check lets through (Infinity % 1 is NaN).
 */
export const COUNT_MAX = 2_147_483_647;
export const MaxOutputTokens = nullable(Type.Integer({ minimum: 1, maximum: COUNT_MAX }));
export const Instructions = nullable(Type.String({ maxLength: 32000 }));
export const Penalty = nullable(Type.Number({ minimum: -2, maximum: 2 }));
/** llama.cpp seeds are unsigned 32-bit, and 2^32−1 means "random" there: anything outside is refused, not wrapped. */
export const Seed = nullable(Type.Integer({ minimum: 0, maximum: 4_294_967_294 }));
/** Tools in one request, at most (OpenAI's documented bound, on every protocol). */
export const MAX_TOOLS = 128;
/**
 * Messages (chat, Messages) or input items (Responses) in one request, at most. Each is decoded,
 * checked and converted on the event loop, a few microseconds apiece (a Responses item about ten):
 * 50,000 small items in a 4 MB body held every other request on the worker for half a second. Ten
 * thousand is far past any conversation a context window holds, and keeps one request's hold
 * near a tenth of a second.
 */
export const MAX_INPUT_ITEMS = 10_000;

export const Stop = nullable(Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 4 })]));
export const NullableBoolean = nullable(Type.Boolean());
export const TopLogprobs = nullable(Type.Integer({ minimum: 0, maximum: 20 }));
/**
 * OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512. The key
 * bound is a pattern that every key must match (other keys are additional, hence refused): a
 * length on Type.Record's key schema is dropped (its pattern becomes `^.*$`), and `propertyNames`
 * does not exist in OpenAPI 3.0's schemas.
 */
export const Metadata = Type.Record(Type.String({ pattern: '^[\\s\\S]{0,64}$' }), Type.String({ maxLength: 512 }), {
  maxProperties: 16,
  additionalProperties: false,
});
export { nullable };
