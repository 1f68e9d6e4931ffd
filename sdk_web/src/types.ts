/**
 * The shapes the SDK reads: OpenAI chat-completion chunks (structurally, so that the
 * `openai` package's own types fit), timelines and QoE.
 */

/** The streamed part of a chat message: what the SDK reads of it (other fields are kept). */
export interface ChunkDelta {
  role?: string | null;
  content?: string | null;
  reasoning_content?: string | null;
  reasoning?: string | null;
  refusal?: string | null;
  tool_calls?: readonly unknown[] | null;
}

/** One choice of a streamed chunk; `delta` for chat completions, `text` for completions. */
export interface ChunkChoice {
  index?: number;
  delta?: ChunkDelta | null;
  text?: string | null;
  finish_reason?: string | null;
}

/**
 * A `chat.completion.chunk` (or `text_completion`) event, as OpenAI streams it; the
 * `openai` package's `ChatCompletionChunk` fits it, and every other field is kept.
 */
export interface ChatCompletionChunk {
  id?: string;
  object?: string;
  created?: number;
  model?: string;
  choices: ChunkChoice[];
  usage?: { completion_tokens?: number } | null;
}

/** `[seconds since the request was sent, tokens]`, one entry per chunk or release. */
export type TimelineEntry = [seconds: number, tokens: number];

/** `[from, to]` in seconds since the request was sent. */
export type TimeSpan = [from: number, to: number];

/**
 * When tokens reached the client (`arrivals`) and when the buffer showed them
 * (`displayed`); `away`, when the reader looked away: the spans, in time order.
 */
export interface Timeline {
  arrivals: TimelineEntry[];
  displayed: TimelineEntry[];
  away?: TimeSpan[];
}

/** The freezes of one reply: display gaps beyond the reader's pace (docs/qoe.md), in seconds. */
export interface Freezes {
  /** The longest freeze (0 when the reply never froze). */
  longestS: number;
  /** How many gaps were longer than the pace by more than 1e-6 s. */
  count: number;
  /** The time frozen in all. */
  totalS: number;
}

/**
 * What the user got, scored on the arrivals and on what was displayed: Andes QoE (Eq. 1),
 * the monotone QoE, the freezes and the user idle latency (Wang et al. Eq. 9, seconds);
 * the last two undefined for an empty timeline. Of the arrivals, they are what the
 * release rule shows; of the displayed timeline, what was shown as measured, with the
 * unit's grouping, `flush`, and the lateness of the timer that released each piece.
 */
export interface QoE {
  andes: number;
  monotone: number;
  displayedAndes: number;
  displayedMonotone: number;
  freezes: Freezes | undefined;
  idleS: number | undefined;
  displayedFreezes: Freezes | undefined;
  displayedIdleS: number | undefined;
}

/** What the reader is expected to get: time to first token (s) and delivery speed (tokens/s). */
export interface Expectation {
  ttft: number;
  tds: number;
}

/** How the stream ended, as the telemetry report names it. */
export type Outcome = "completed" | "aborted" | "error";
