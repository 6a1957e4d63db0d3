import type { Options } from 'ajv';
import { parse as parseSecureJson } from 'secure-json-parse';
import { ApiError } from '../core/errors.js';
import type { FunctionTool, ToolChoice } from '../core/canonical.js';

/**
 * How request bodies are checked, on every transport alike (HTTP, the Responses WebSocket): as sent
 * (no coercion: a string is never a number), defaults filled in, the first error only. `verbose` puts
 * the failing schema and value in an error (and costs nothing until one fails), so a union's error
 * can come from the branch of the value's own `type` (validationError, below).
 */
export const BODY_VALIDATION: Options = {
  coerceTypes: false,
  useDefaults: true,
  removeAdditional: false,
  allErrors: false,
  strict: false,
  // `strict: false` turns this off too, and then a number literal past the double range (1e309, which
  // JSON.parse reads as Infinity) passed every `integer` and `minimum`: an admin limit of 1e309
  // was stored as null and read back as "null requests per minute".
  strictNumbers: true,
  verbose: true,
};

/**
 * A request body's JSON text, parsed as every transport parses it (HTTP, the Responses WebSocket):
 * a `__proto__` key is refused, since assigning it could alter an object's prototype (a WebSocket
 * message took it before, and its `constructor` key then went through a setter into the live event
 * but not the stored response). `what` names the text in the error ("request body", "message").
 */
export function parseRequestJson(text: string, what: string): unknown {
  try {
    return parseSecureJson(text, undefined, { protoAction: 'error', constructorAction: 'ignore' });
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    if (reason === 'Object contains forbidden prototype property') {
      throw new ApiError(
        'invalid_json',
        `The ${what} has a '__proto__' key, which is refused (it could alter objects' prototypes); remove it.`,
      );
    }
    throw new ApiError('invalid_json', `The ${what} is not valid JSON: ${reason}.`);
  }
}

/**
 * A request that failed its schema, as one clear error naming the parameter: shared by every
 * transport that validates a request body against a route's schema (HTTP, the Responses WebSocket).
 */
export interface ValidationIssue {
  keyword: string;
  instancePath: string;
  message?: string | undefined;
  params: Record<string, unknown>;
  /** Where in the schema (ajv's `schemaPath`, e.g. `#/properties/tool_choice/anyOf/1/required`): which branch of a union. */
  schemaPath?: string | undefined;
  /** With ajv's `verbose`: the schema of the failing keyword (a union's branches) and the value it failed on. */
  schema?: unknown;
  data?: unknown;
}

/** `/messages/0/content` → `messages[0].content` */
function paramName(pointer: string, extra?: string): string {
  const parts = pointer
    .split('/')
    .filter(Boolean)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  if (extra !== undefined) parts.push(extra);
  return parts.reduce((acc, p) => (/^\d+$/.test(p) ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

/** How far into the value an issue is (a missing property counts as its own place). */
const depthOf = (i: ValidationIssue): number => i.instancePath.split('/').length + (i.keyword === 'required' ? 1 : 0);

/** The `type` values a union branch takes (`{type: {const: "function"}}`, or an enum), if it is an object shape told apart by one. */
function branchTypes(branch: unknown): unknown[] {
  const t = (branch as { properties?: Record<string, { const?: unknown; enum?: unknown[] }> } | null)?.properties?.['type'];
  return t === undefined ? [] : t.const !== undefined ? [t.const] : Array.isArray(t.enum) ? t.enum : [];
}

/**
 * What is really wrong with a value no branch of a union took. The branch whose shape got
 * furthest into the value says it: the deepest issue (`response_format.json_schema.name` of the
 * json_schema branch, not the text branch's enum on `type`), a range or an enum before a type; a
 * wrong type inside the value (`limits.rpm: 1.5` in a nullable `limits`); else any range or enum.
 */
function unionIssue(issues: readonly ValidationIssue[], union: ValidationIssue): ValidationIssue | undefined {
  let under = issues.filter((i) => i.instancePath.startsWith(union.instancePath) && i.keyword !== 'anyOf' && i.keyword !== 'oneOf');
  // Branches told apart by a `type` (`{type: "function", name}`, `{type: "allowed_tools", mode, tools}`):
  // only the branch of the value's own `type` says what is wrong (not another shape's missing
  // `name`), and a `type` that is no branch's is itself the error. Needs ajv's `verbose` (the union's
  // branches and the value); without it, the deepest issue decides as below.
  const branches = Array.isArray(union.schema) ? (union.schema as unknown[]) : undefined;
  const type = (union.data as { type?: unknown } | null | undefined)?.type;
  const types = branches?.map(branchTypes) ?? [];
  if (branches && union.schemaPath && typeof type === 'string' && types.some((t) => t.length > 0)) {
    const k = types.findIndex((t) => t.includes(type));
    const typePath = `${union.instancePath}/type`;
    if (k < 0) return { keyword: 'enum', instancePath: typePath, params: { allowedValues: types.flat() } };
    const own = `${union.schemaPath}/${k}/`;
    const mine = under.filter((i) => i.schemaPath?.startsWith(own));
    if (mine.length > 0) under = mine;
  }
  if (under.length === 0) return undefined;
  const deepest = Math.max(...under.map(depthOf));
  const top = under.filter((i) => depthOf(i) === deepest);
  return (
    top.find((i) => i.keyword !== 'type' && i.keyword !== 'const') ??
    (deepest > depthOf(union) ? top.find((i) => i.keyword === 'type') : undefined) ??
    under.find((i) => i.keyword !== 'type' && i.keyword !== 'const')
  );
}

export function validationError(issues: readonly ValidationIssue[], where: string): ApiError {
  // A literal past the double range (1e309) is read as Infinity: "expected number" would puzzle.
  const infinite = issues.find((i) => i.keyword === 'type' && typeof i.data === 'number' && !Number.isFinite(i.data));
  if (infinite) {
    const param = paramName(infinite.instancePath) || where;
    return new ApiError('invalid_value', `Invalid value for '${param}': the number is beyond the range of a double (about ±1.8e308).`, {
      param,
    });
  }
  // For unions ajv reports each branch, then the union; the branch that got past the type check
  // (a range, an enum) says what is really wrong.
  const union = issues.find((i) => i.keyword === 'anyOf' || i.keyword === 'oneOf');
  const specific = union && unionIssue(issues, union);
  if (union && !specific) {
    // Every branch refused the value's type (`limits: "x"` for an object or null): say which they take.
    const under = issues.filter((i) => i.instancePath === union.instancePath && i.keyword !== 'anyOf' && i.keyword !== 'oneOf');
    if (under.length > 0 && under.every((i) => i.keyword === 'type')) {
      const param = paramName(union.instancePath) || where;
      const types = [...new Set(under.map((i) => String(i.params['type'])))].join(' or ');
      return new ApiError('invalid_value', `Invalid type for '${param}': expected ${types}.`, { param });
    }
  }
  const issue = specific ?? union ?? issues[0];
  if (!issue) return new ApiError('invalid_request', `Invalid ${where}.`);
  if (issue.keyword === 'required') {
    const param = paramName(issue.instancePath, String(issue.params['missingProperty']));
    return new ApiError('missing_required_parameter', `Missing required parameter: '${param}'.`, { param });
  }
  const param = paramName(issue.instancePath) || where;
  let detail: string;
  switch (issue.keyword) {
    case 'enum': {
      // Every branch of a union at the same place says what it takes (`text` and `json_object` in one
      // branch, `json_schema` as another's const): the value may be any of them.
      const allowed = new Set<unknown>(issue.params['allowedValues'] as unknown[]);
      for (const i of union ? issues : []) {
        if (i.instancePath !== issue.instancePath) continue;
        if (i.keyword === 'enum') for (const v of i.params['allowedValues'] as unknown[]) allowed.add(v);
        else if (i.keyword === 'const') allowed.add(i.params['allowedValue']);
      }
      detail = `must be one of ${[...allowed].map((v) => `'${String(v)}'`).join(', ')}`;
      break;
    }
    case 'type':
      return new ApiError('invalid_value', `Invalid type for '${param}': expected ${String(issue.params['type'])}.`, { param });
    case 'anyOf':
    case 'oneOf':
      detail = 'does not match any of the accepted shapes';
      break;
    case 'additionalProperties': {
      const key = String(issue.params['additionalProperty']);
      // The one object with free keys but a bound on them (protocols/fields.ts, Metadata).
      const why = param === 'metadata' || param.endsWith('.metadata') ? ': keys are at most 64 characters' : '';
      detail = `the key '${key.length > 40 ? `${key.slice(0, 40)}…` : key}' is not accepted${why}`;
      break;
    }
    default:
      detail = issue.message ?? 'is invalid';
  }
  return new ApiError('invalid_value', `Invalid value for '${param}': ${detail}.`, { param });
}

/**
 * A `tool_choice` in a request without tools: `required` or a named function cannot be honoured
 * (OpenAI refuses both), `auto` and `none` mean what no tools means anyway and pass.
 */
export function refuseChoiceWithoutTools(choice: string | { name: string }): void {
  if (typeof choice !== 'string')
    throw new ApiError('invalid_value', `tool_choice names '${choice.name}', but the request has no tools.`, { param: 'tool_choice' });
  if (choice === 'required') throw new ApiError('invalid_value', "tool_choice 'required' needs tools.", { param: 'tool_choice' });
}

/**
 * `tool_choice: {type: "allowed_tools"}` (Open Responses, and OpenAI's chat completions): the model
 * may call only the named tools, which must be among the request's. Enforced for every engine alike
 * by offering the engine only those tools (docs/decisions.md, "Allowed tools"); `mode` is the
 * choice among them. `names[i]` is reported as `param(i)` when it names no tool of the request.
 */
export function allowTools(
  tools: readonly FunctionTool[],
  names: readonly string[],
  mode: 'none' | 'auto' | 'required',
  param: (i: number) => string,
): { tools: FunctionTool[]; toolChoice: ToolChoice } {
  names.forEach((name, i) => {
    if (!tools.some((t) => t.name === name))
      throw new ApiError('invalid_value', `allowed_tools names '${name}', which is not one of the tools.`, { param: param(i) });
  });
  const allowed = new Set(names);
  return { tools: tools.filter((t) => allowed.has(t.name)), toolChoice: mode };
}
