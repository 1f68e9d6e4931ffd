/**
 * The shapes the SDK reads: OpenAI chat-completion chunks (structurally, so that the
 * `openai` package's own types fit), timelines and QoE.
 */

/** One choice of a streamed chunk; `delta` for chat completions, `text` for completions. */
export interface ChunkChoice {
  index?: number;
  delta?: Record<string, unknown> | null;
  text?: string | null;
  finish_reason?: string | null;
  [key: string]: unknown;
}

/** A `chat.completion.chunk` (or `text_completion`) event, as OpenAI streams it. */
export interface ChatCompletionChunk {
  id?: string;
  object?: string;
  created?: number;
  model?: string;
  choices: ChunkChoice[];
  usage?: { completion_tokens?: number; [key: string]: unknown } | null;
  [key: string]: unknown;
}

/** `[seconds since the request was sent, tokens]`, one entry per chunk or release. */
export type TimelineEntry = [seconds: number, tokens: number];

/** When tokens reached the client (`arrivals`) and when the buffer showed them (`displayed`). */
export interface Timeline {
  arrivals: TimelineEntry[];
  displayed: TimelineEntry[];
}

/** Andes QoE (Eq. 1) and the monotone QoE of the arrivals and of what was displayed. */
export interface QoE {
  andes: number;
  monotone: number;
  displayedAndes: number;
  displayedMonotone: number;
}

/** What the reader is expected to get: time to first token (s) and delivery speed (tokens/s). */
export interface Expectation {
  ttft: number;
  tds: number;
}

/** How the stream ended, as the telemetry report names it. */
export type Outcome = "completed" | "aborted" | "error";
