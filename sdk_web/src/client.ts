/**
 * `createClient`: chat completions streamed from a tokenpace gateway (or any
 * OpenAI-compatible server) with `fetch`, parsed from server-sent events, and paced.
 *
 * ```ts
 * const client = createClient({ baseURL: "http://127.0.0.1:8000/v1", apiKey, tier: "voice" });
 * const stream = await client.chat.completions.create({ model, messages, stream: true });
 * for await (const chunk of stream) show(chunk.choices[0]?.delta?.content ?? "");
 * stream.qoe; // once it ended
 * ```
 *
 * While the gateway holds the request for an engine, its queue notices go to the
 * request's `onQueued` (src/queue.ts).
 */
import { openAIChunks } from "./chunks.js";
import { systemClock } from "./clock.js";
import { refusal } from "./errors.js";
import { parseQueueNotice, type QueueNotice } from "./queue.js";
import { pace, type PacedStream, type PaceOptions } from "./stream.js";
import { parseSSE } from "./sse.js";
import type { TelemetryOptions } from "./telemetry.js";
import type { ChatCompletionChunk } from "./types.js";

/** How to reach the gateway. */
export interface ClientOptions {
  /** The API's base, as for the `openai` clients: `https://host/v1`. */
  baseURL: string;
  /** Sent as `Authorization: Bearer`; leave it out where a backend of your own adds it. */
  apiKey?: string;
  /** Sent as `X-TokenPace-Tier` (`chat`, `voice`, `fast`, `batch`, ...). */
  tier?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** QoE reports: `false` for none; by default to `{baseURL}/tokenpace/telemetry` with the telemetry token, else `apiKey`. */
  telemetry?: TelemetryOptions | false;
}

/** A chat completion request; `stream: true` is required (only streams can be paced). */
export interface ChatCompletionCreateParams {
  model: string;
  messages: unknown[];
  stream: true;
  [key: string]: unknown;
}

/** Per-request settings: pacing options, a tier for this request, extra headers. */
export interface RequestOptions extends Omit<PaceOptions, "headers" | "requestStart" | "telemetry"> {
  tier?: string;
  headers?: Record<string, string>;
  /** Called with each queue notice while the gateway holds the request for an engine. */
  onQueued?: (notice: QueueNotice) => void;
}

export interface TokenPaceClient {
  chat: {
    completions: {
      create(body: ChatCompletionCreateParams, options?: RequestOptions): Promise<PacedStream<ChatCompletionChunk>>;
    };
  };
}

/** A client whose chat completions come back paced (see the module documentation). */
export function createClient(options: ClientOptions): TokenPaceClient {
  if (typeof options.baseURL !== "string" || options.baseURL === "") {
    throw new TypeError("baseURL: give the API's base URL, e.g. http://127.0.0.1:8000/v1");
  }
  const base = options.baseURL.replace(/\/+$/, "");
  const telemetry: TelemetryOptions | false =
    options.telemetry === false
      ? false
      : {
          url: `${base}/tokenpace/telemetry`,
          ...(options.apiKey !== undefined && { apiKey: options.apiKey }),
          ...(options.fetch !== undefined && { fetch: options.fetch }),
          ...options.telemetry,
        };
  return {
    chat: {
      completions: {
        create: (body, request = {}) => streamChat(`${base}/chat/completions`, body, request, options, telemetry),
      },
    },
  };
}

async function streamChat(
  url: string,
  body: ChatCompletionCreateParams,
  request: RequestOptions,
  client: ClientOptions,
  telemetry: TelemetryOptions | false,
): Promise<PacedStream<ChatCompletionChunk>> {
  if (body.stream !== true) {
    throw new TypeError("stream: must be true; tokenpace-web paces streamed replies only");
  }
  const { tier = client.tier, headers: extraHeaders, signal, onQueued, ...paceOptions } = request;
  const headers: Record<string, string> = {
    "Content-Type": "application/json",
    Accept: "text/event-stream",
    ...extraHeaders,
  };
  if (client.apiKey !== undefined) headers["Authorization"] = `Bearer ${client.apiKey}`;
  if (tier !== undefined) headers["X-TokenPace-Tier"] = tier;
  const controller = new AbortController();
  const onAbort = (): void => controller.abort();
  if (signal?.aborted) controller.abort();
  signal?.addEventListener("abort", onAbort, { once: true });
  const clock = paceOptions.clock ?? systemClock;
  const requestStart = clock.now();
  const fetchFn = client.fetch ?? globalThis.fetch;
  let response: Response;
  try {
    response = await fetchFn(url, { method: "POST", headers, body: JSON.stringify(body), signal: controller.signal });
  } finally {
    signal?.removeEventListener("abort", onAbort); // from here the paced stream watches it
  }
  const requestId = response.headers.get("X-Request-Id") ?? undefined;
  if (!response.ok || response.body === null) {
    const text = await response.text().catch(() => "");
    throw refusal(`${response.status} `, response.status, text, requestId, response.statusText);
  }
  const onComment = (comment: string): void => {
    const notice = parseQueueNotice(comment);
    if (notice !== undefined) onQueued?.(notice);
  };
  const chunks = openAIChunks(parseSSE(response.body, { onComment }), requestId);
  const stream = pace(
    chunks,
    { ...paceOptions, ...(signal !== undefined && { signal }), clock, headers: response.headers, requestStart, telemetry },
    () => controller.abort(),
  );
  return stream;
}
