/**
 * Pacing for the official `openai` clients: give `paceOpenAI` what
 * `client.chat.completions.create({..., stream: true}).withResponse()` returns, so that
 * the `X-TokenPace-*` headers are read from `response`.
 *
 * ```ts
 * const stream = await paceOpenAI(
 *   openai.chat.completions.create({ model, messages, stream: true }).withResponse(),
 *   { telemetry: { apiKey } },
 * );
 * ```
 *
 * Structural types keep the `openai` package out of this SDK's dependencies.
 */
import { systemClock } from "./clock.js";
import { pace, type PacedStream, type PaceOptions } from "./stream.js";
import type { TelemetryOptions } from "./telemetry.js";
import type { ChatCompletionChunk } from "./types.js";

/** An `openai` stream: async iterable, with the `AbortController` of its request. */
export interface OpenAIStream<T> extends AsyncIterable<T> {
  controller?: AbortController;
}

/** What `.withResponse()` resolves to. */
export interface OpenAIStreamWithResponse<T> {
  data: OpenAIStream<T>;
  response: Response;
}

/**
 * The report URL next to the request's: `.../v1/chat/completions` (or `/completions`)
 * becomes `.../v1/tokenpace/telemetry`; undefined for any other URL.
 */
export function telemetryURL(requestURL: string): string | undefined {
  const match = /^(.*?)\/(?:chat\/)?completions(?:\?.*)?$/.exec(requestURL);
  return match ? `${match[1]}/tokenpace/telemetry` : undefined;
}

/**
 * Pace an `openai` stream. Telemetry goes to the URL next to the request's, with the
 * telemetry token from the response, else `telemetry.apiKey`; `telemetry: false` sends none.
 * The request counts as sent when `paceOpenAI` is called (give `requestStart` otherwise).
 */
export async function paceOpenAI<T extends ChatCompletionChunk>(
  withResponse: PromiseLike<OpenAIStreamWithResponse<T>> | OpenAIStreamWithResponse<T>,
  options: Omit<PaceOptions, "headers"> = {},
): Promise<PacedStream<T>> {
  const clock = options.clock ?? systemClock;
  const requestStart = options.requestStart ?? clock.now();
  const { data, response } = await withResponse;
  let telemetry: TelemetryOptions | false = false;
  if (options.telemetry !== false) {
    const url = options.telemetry?.url ?? telemetryURL(response.url);
    telemetry = { ...options.telemetry, ...(url !== undefined && { url }) };
  }
  return pace(data, { ...options, clock, requestStart, headers: response.headers, telemetry }, () => data.controller?.abort());
}
