/** Errors the SDK throws to its caller, shaped as OpenAI's error body says. */

/** The OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`. */
export interface ErrorBody {
  message?: string;
  type?: string;
  param?: string | null;
  code?: string | null;
}

/** The gateway refused the request (`status` set) or ended the stream with an error event. */
export class TokenPaceError extends Error {
  override readonly name = "TokenPaceError";
  readonly status: number | undefined;
  readonly type: string | undefined;
  readonly param: string | null | undefined;
  readonly code: string | null | undefined;
  readonly requestId: string | undefined;

  constructor(message: string, body: ErrorBody = {}, status?: number, requestId?: string) {
    super(message);
    this.status = status;
    this.type = body.type;
    this.param = body.param;
    this.code = body.code;
    this.requestId = requestId;
  }
}

/** A response body's JSON, or undefined when it is not JSON. */
export function parseBody(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/**
 * The error of a refused request: `prefix`, then the body's OpenAI error message, else
 * the body's first 200 characters (`fallback` when it is empty).
 */
export function refusal(
  prefix: string,
  status: number,
  text: string,
  requestId: string | undefined,
  fallback = "",
): TokenPaceError {
  const error = errorBody(parseBody(text)) ?? {};
  return new TokenPaceError(`${prefix}${error.message ?? (text.slice(0, 200) || fallback)}`, error, status, requestId);
}

/** `error` of a parsed JSON body, when it has the OpenAI shape. */
export function errorBody(value: unknown): ErrorBody | undefined {
  if (typeof value !== "object" || value === null || !("error" in value)) return undefined;
  const error = (value as { error: unknown }).error;
  if (typeof error === "object" && error !== null) return error as ErrorBody;
  return { message: String(error) };
}
