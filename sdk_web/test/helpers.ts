/** Test helpers: a virtual clock, timed chunk sources, chunk builders. */
import { setImmediate } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import type { Clock } from "../src/clock.js";
import type { ChatCompletionChunk } from "../src/types.js";

/** The repository root (tests are compiled to sdk_web/build/test/). */
export const REPO_ROOT = fileURLToPath(new URL("../../../", import.meta.url));

interface Timer {
  at: number;
  seq: number;
  resolve: () => void;
}

/**
 * Virtual time: `sleep` waits for `run` to advance the clock, which it does (to the
 * earliest pending timer) whenever nothing else can run. Release times come out exact.
 */
export class VirtualClock implements Clock {
  private time = 0;
  private seq = 0;
  private timers: Timer[] = [];

  now(): number {
    return this.time;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal?.aborted) return resolve();
      const timer: Timer = { at: this.time + Math.max(ms, 0), seq: this.seq++, resolve };
      this.timers.push(timer);
      signal?.addEventListener(
        "abort",
        () => {
          this.timers = this.timers.filter((t) => t !== timer);
          resolve();
        },
        { once: true },
      );
    });
  }

  /** Sleep until the absolute virtual time `at`. */
  until(at: number): Promise<void> {
    return this.sleep(at - this.time);
  }

  /** Run `task` to completion on virtual time; throws if it waits on nothing the clock controls. */
  async run<R>(task: Promise<R>): Promise<R> {
    let settled = false;
    task.then(
      () => (settled = true),
      () => (settled = true),
    );
    for (;;) {
      for (let i = 0; i < 5 && !settled; i++) await setImmediate();
      if (settled) return task;
      this.timers.sort((a, b) => a.at - b.at || a.seq - b.seq);
      const next = this.timers.shift();
      if (next === undefined) throw new Error("virtual clock: the code under test waits on something that is not a timer");
      this.time = Math.max(this.time, next.at);
      next.resolve();
    }
  }
}

/** A content chunk, optionally with a running `usage.completion_tokens`. */
export function contentChunk(content: string, completionTokens?: number): ChatCompletionChunk {
  const chunk: ChatCompletionChunk = {
    id: "chatcmpl-test",
    object: "chat.completion.chunk",
    created: 0,
    model: "m",
    choices: [{ index: 0, delta: { content }, finish_reason: null }],
  };
  if (completionTokens !== undefined) chunk.usage = { completion_tokens: completionTokens };
  return chunk;
}

export const roleChunk = (): ChatCompletionChunk => ({
  object: "chat.completion.chunk",
  choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }],
});

export const finishChunk = (reason = "stop"): ChatCompletionChunk => ({
  object: "chat.completion.chunk",
  choices: [{ index: 0, delta: {}, finish_reason: reason }],
});

/** Chunks yielded at virtual times (ms); optionally throws `error` after the last. */
export async function* timedSource(
  clock: VirtualClock,
  events: Array<[number, ChatCompletionChunk]>,
  error?: Error,
): AsyncGenerator<ChatCompletionChunk> {
  for (const [at, chunk] of events) {
    await clock.until(at);
    yield chunk;
  }
  if (error) throw error;
}

/** Consume a paced stream on the virtual clock: each chunk with its release time. */
export async function collect<T>(clock: VirtualClock, stream: AsyncIterable<T>): Promise<Array<[number, T]>> {
  return clock.run(
    (async () => {
      const out: Array<[number, T]> = [];
      for await (const chunk of stream) out.push([clock.now(), chunk]);
      return out;
    })(),
  );
}

/** The text of a chunk's first choice. */
export function textOf(chunk: ChatCompletionChunk): string {
  const c = chunk.choices[0];
  return String(c?.delta?.["content"] ?? c?.text ?? "");
}

/** Relative closeness, as the shared vectors are compared (rel 1e-9). */
export function close(actual: number, expected: number, rel = 1e-9): boolean {
  return Math.abs(actual - expected) <= rel * Math.max(Math.abs(expected), 1e-12) || actual === expected;
}
