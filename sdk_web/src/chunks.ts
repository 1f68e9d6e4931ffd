/**
 * OpenAI chunks: reading them from server-sent events, counting the tokens each one
 * delivers, and copying one with a piece of its text.
 */
import { errorBody, TokenPaceError } from "./errors.js";
import type { ServerSentEvent } from "./sse.js";
import type { ChatCompletionChunk, ChunkChoice, ChunkDelta } from "./types.js";

/** Delta fields that carry streamed text; each is paced as its own text stream. */
export const TEXT_FIELDS = ["content", "reasoning_content", "reasoning", "refusal"] as const;
export type TextField = (typeof TEXT_FIELDS)[number] | "text";

/**
 * The chunks of an OpenAI stream: `data: {json}` events up to `data: [DONE]`. An error
 * event (`{"error": {...}}`, or an `event: error`) throws a `TokenPaceError`; so does a
 * stream that ends before `[DONE]` (the connection was cut).
 */
export async function* openAIChunks(
  events: AsyncIterable<ServerSentEvent>,
  requestId?: string,
): AsyncGenerator<ChatCompletionChunk> {
  for await (const { event, data } of events) {
    if (data === "[DONE]") return;
    let value: unknown;
    try {
      value = JSON.parse(data);
    } catch {
      throw new TokenPaceError(`The server sent an event that is not JSON: ${data.slice(0, 200)}`, {}, undefined, requestId);
    }
    const error = errorBody(value);
    if (error !== undefined || event === "error") {
      const body = error ?? {};
      throw new TokenPaceError(body.message ?? `The stream ended with an error event: ${data.slice(0, 200)}`, body, undefined, requestId);
    }
    if (typeof value !== "object" || value === null || !Array.isArray((value as { choices?: unknown }).choices)) {
      throw new TokenPaceError(`The server sent an event that is not a completion chunk: ${data.slice(0, 200)}`, {}, undefined, requestId);
    }
    yield value as ChatCompletionChunk;
  }
  throw new TokenPaceError("The stream ended before data: [DONE]: the connection was closed early.", {}, undefined, requestId);
}

/** One text stream of a reply: which choice, which field. */
export interface TextSlot {
  choice: number;
  field: TextField;
}

/** A chunk's text in one slot. */
export interface ChunkText extends TextSlot {
  text: string;
}

/** The non-empty texts a chunk carries, choice by choice. */
export function chunkTexts(chunk: ChatCompletionChunk): ChunkText[] {
  const out: ChunkText[] = [];
  chunk.choices.forEach((choice, position) => {
    const index = typeof choice.index === "number" ? choice.index : position;
    if (choice.delta) {
      for (const field of TEXT_FIELDS) {
        const text = choice.delta[field];
        if (typeof text === "string" && text !== "") out.push({ choice: index, field, text });
      }
    } else if (typeof choice.text === "string" && choice.text !== "") {
      out.push({ choice: index, field: "text", text: choice.text });
    }
  });
  return out;
}

/** Whether a choice delivers a tool call (a token, as the gateway counts it). */
function hasToolCall(choice: ChunkChoice): boolean {
  const calls = choice.delta?.tool_calls;
  return Array.isArray(calls) ? calls.length > 0 : Boolean(calls);
}

/**
 * Tokens a chunk delivers, counted as the gateway counts them (docs/protocol.md,
 * "Gateway-side measurements"): one per choice with new text or a tool call; more when
 * the chunk carries a running `usage.completion_tokens` above `countedBefore` + that.
 * Checked against the gateway's count on the shared vectors tests/vectors/chunk_tokens.json.
 */
export function chunkTokens(chunk: ChatCompletionChunk, countedBefore: number): number {
  let n = 0;
  for (const choice of chunk.choices) {
    const text = choice.delta ? TEXT_FIELDS.some((f) => choice.delta?.[f]) : Boolean(choice.text);
    if (text || hasToolCall(choice)) n++;
  }
  const total = chunk.usage?.completion_tokens;
  if (n > 0 && typeof total === "number" && total > countedBefore + n) n = total - countedBefore;
  return n;
}

/** A copy of `chunk` whose one choice carries `text` in the slot's field and nothing else new. */
export function withText<T extends ChatCompletionChunk>(chunk: T, where: TextSlot, text: string): T {
  const position = chunk.choices.findIndex((c, i) => (typeof c.index === "number" ? c.index : i) === where.choice);
  const choice = chunk.choices[position] as ChunkChoice;
  const copy: ChunkChoice =
    where.field === "text"
      ? { ...choice, text, finish_reason: null }
      : { ...choice, delta: { [where.field]: text }, finish_reason: null };
  const out: T = { ...chunk, choices: [copy] };
  if ("usage" in chunk) out.usage = null;
  return out;
}

/**
 * What is left of `chunk` once its texts are paced separately (the role, tool calls,
 * finish reason, usage), or `undefined` when nothing is.
 */
export function withoutText<T extends ChatCompletionChunk>(chunk: T): T | undefined {
  let rest = chunk.usage != null;
  const choices = chunk.choices.map((choice) => {
    const copy: ChunkChoice = { ...choice };
    if (choice.delta) {
      const delta: ChunkDelta = { ...choice.delta };
      for (const field of TEXT_FIELDS) delete delta[field];
      copy.delta = delta;
      if (Object.values(delta).some((v: unknown) => v !== null && v !== undefined)) rest = true;
    } else {
      delete copy.text;
    }
    if (choice.finish_reason != null) rest = true;
    return copy;
  });
  return rest ? { ...chunk, choices } : undefined;
}
