/**
 * The one registry of error codes. Every error Switchyard raises, in any layer, is an ApiError with
 * one of these codes; the HTTP layer turns it into a reply, so the status, the OpenAI-style `type`
 * and the `code` can never drift apart.
 */
export const ERRORS = {
  invalid_json: { status: 400, type: 'invalid_request_error' },
  invalid_request: { status: 400, type: 'invalid_request_error' },
  invalid_value: { status: 400, type: 'invalid_request_error' },
  invalid_function_parameters: { status: 400, type: 'invalid_request_error' },
  missing_required_parameter: { status: 400, type: 'invalid_request_error' },
  invalid_url: { status: 400, type: 'invalid_request_error' },
  model_inactive: { status: 400, type: 'invalid_request_error' },
  context_length_exceeded: { status: 400, type: 'invalid_request_error' },
  unsupported_parameter: { status: 400, type: 'invalid_request_error' },
  unsupported_content: { status: 400, type: 'invalid_request_error' },
  unsupported_schema: { status: 400, type: 'invalid_request_error' },
  schema_too_large: { status: 400, type: 'invalid_request_error' },
  missing_capability: { status: 400, type: 'invalid_request_error' },
  // Anthropic's: a request with `thread` (server-held message threads), which this server does not keep.
  thread_unsupported_request: { status: 400, type: 'invalid_request_error' },
  // Open Responses' codes (400, as its WebSocket example and OpenAI's HTTP API answer them).
  previous_response_not_found: { status: 400, type: 'invalid_request_error' },
  websocket_connection_limit_reached: { status: 400, type: 'invalid_request_error' },
  missing_api_key: { status: 401, type: 'authentication_error' },
  invalid_api_key: { status: 401, type: 'authentication_error' },
  permission_denied: { status: 403, type: 'permission_error' },
  not_found: { status: 404, type: 'not_found_error' },
  model_not_found: { status: 404, type: 'not_found_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  request_timeout: { status: 408, type: 'invalid_request_error' },
  conflict: { status: 409, type: 'invalid_request_error' },
  request_too_large: { status: 413, type: 'invalid_request_error' },
  expectation_failed: { status: 417, type: 'invalid_request_error' },
  unsupported_media_type: { status: 415, type: 'invalid_request_error' },
  model_not_allowed: { status: 403, type: 'permission_error' },
  rate_limited: { status: 429, type: 'rate_limit_error' },
  rate_limit_exceeded: { status: 429, type: 'rate_limit_error' },
  budget_exceeded: { status: 429, type: 'insufficient_quota' },
  internal_error: { status: 500, type: 'server_error' },
  // The model's output failed the JSON schema on every attempt (a retry samples anew; clients retry 500s).
  structured_output_failed: { status: 500, type: 'server_error' },
  upstream_error: { status: 502, type: 'server_error' },
  upstream_unreachable: { status: 502, type: 'server_error' },
  upstream_timeout: { status: 504, type: 'server_error' },
  request_header_too_large: { status: 431, type: 'invalid_request_error' },
  no_deployment: { status: 503, type: 'server_error' },
  overloaded: { status: 503, type: 'server_error' },
  model_load_failed: { status: 503, type: 'server_error' },
  model_not_ready: { status: 503, type: 'server_error' },
  service_unavailable: { status: 503, type: 'server_error' },
  // The client went away or cancelled: nobody reads the answer (nginx's 499), but the ledger records it.
  cancelled: { status: 499, type: 'invalid_request_error' },
} as const satisfies Record<string, { status: number; type: string }>;

export type ErrorCode = keyof typeof ERRORS;

export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.hasOwn(ERRORS, code);
}

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

export interface ApiErrorOptions {
  param?: string | null;
  /** Another deployment of the same model may succeed (an upstream 5xx, a connection failure, a 429). */
  failover?: boolean;
  /** How long to wait before trying again (an upstream's retry-after, a rate-limit window), in ms. */
  retryAfterMs?: number;
  /** Retrying cannot help (configuration or a spent budget must change): clients are told not to. */
  final?: boolean;
  /** Extra reply headers the protocol defines (rate-limit state, `allow`). */
  headers?: Record<string, string>;
}

export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly code: ErrorCode;
  readonly param: string | null;
  readonly failover: boolean;
  readonly retryAfterMs: number | undefined;
  readonly final: boolean;
  readonly headers: Readonly<Record<string, string>>;

  constructor(code: ErrorCode, message: string, opts: ApiErrorOptions = {}) {
    super(message);
    const entry = ERRORS[code];
    this.status = entry.status;
    this.type = entry.type;
    this.code = code;
    this.param = opts.param ?? null;
    this.failover = opts.failover ?? false;
    this.retryAfterMs = opts.retryAfterMs;
    this.final = opts.final ?? false;
    this.headers = opts.headers ?? {};
  }

  /** The same error naming another parameter: a protocol's own name for what a lower layer named by the chat convention. */
  naming(param: string, message = this.message): ApiError {
    return new ApiError(this.code, message, {
      param,
      failover: this.failover,
      ...(this.retryAfterMs !== undefined && { retryAfterMs: this.retryAfterMs }),
      final: this.final,
      headers: { ...this.headers },
    });
  }

  toBody(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** The request was cancelled (its client left, or a cancel call): not a failure of the request. */
export class CancelledError extends ApiError {
  constructor(message = 'The request was cancelled.') {
    super('cancelled', message);
  }
}

/** `suggestion`: a model the caller may use whose id differs only in case (ids are lower case; file names often are not). */
export const modelNotFound = (id: string, suggestion?: string): ApiError =>
  new ApiError(
    'model_not_found',
    `The model '${id}' does not exist or you do not have access to it.${suggestion === undefined ? '' : ` Did you mean '${suggestion}'?`}`,
    { param: 'model' },
  );
