/**
 * `paceStream`: the client-side pacing buffer of Andes (Liu et al.) §5. Chunks are read
 * from the network as fast as they come (no back-pressure: the read never waits for the
 * reader) into a buffer, and released to the caller on the digestion schedule
 * (src/schedule.ts): the first token the moment it arrives, each next token 1/TDS after
 * the previous one, or when it arrives if that is later.
 *
 * `unit` chooses what is released at a time: a token (a chunk that carries several is
 * split into one copy per token), a word, or a sentence (src/segment.ts). `end` chooses
 * what happens when the reply has fully arrived: `drain` keeps pacing until the buffer
 * is empty, `flush` releases the rest at once. Aborting (`abort()`, the `signal`, or
 * leaving the `for await` loop) closes the request and ends the iteration quietly.
 *
 * Once the stream ends it records when tokens arrived and when they were displayed
 * (seconds since the request was sent), their QoE, and sends the telemetry report.
 */
import { chunkTexts, chunkTokens, withoutText, withText, type ChunkText, type TextSlot } from "./chunks.js";
import { systemClock, type Clock } from "./clock.js";
import { requestInfo, type RequestInfo } from "./headers.js";
import { timelineQoE } from "./qoe.js";
import { ReleaseSchedule } from "./schedule.js";
import { splitTokens, TextCutter, type Unit } from "./segment.js";
import { isReadableStream } from "./sse.js";
import {
  beaconReport,
  buildReport,
  onPageExit,
  postReport,
  tellError,
  type TelemetryOptions,
  type TelemetryReport,
  type TelemetryResult,
} from "./telemetry.js";
import type { ChatCompletionChunk, Expectation, Outcome, QoE, Timeline, TimelineEntry } from "./types.js";

/** Options of `paceStream` (and of the client and the adapter). */
export interface PaceOptions {
  /** Tokens per second to release at (default: the `X-TokenPace-TDS` header, else 4.8). */
  tds?: number;
  /** Expected time to first token in seconds, for QoE (default: `X-TokenPace-TTFT`, else 1.0). */
  ttft?: number;
  /** What is released at a time (default `token`). */
  unit?: Unit;
  /** At the reply's end: keep pacing (`drain`, the default) or release the rest at once (`flush`). */
  end?: "drain" | "flush";
  /** Aborting it aborts the stream. */
  signal?: AbortSignal;
  /** The time source (default: `performance.now` and `setTimeout`). */
  clock?: Clock;
  /** Where to report QoE; `false` or no `url`: no report. */
  telemetry?: TelemetryOptions | false;
  /** The response's headers: request id, tier, TTFT/TDS, telemetry token. */
  headers?: Headers;
  /** When the request was sent, on `clock` (ms; default: when `paceStream` is called). */
  requestStart?: number;
}

/** The paced chunks, and once they end, what the user got. */
export interface PacedStream<T> extends AsyncIterable<T> {
  /** Stop: close the request, end the iteration, report the outcome `aborted`. */
  abort(): void;
  readonly headers: Headers | undefined;
  readonly requestId: string | undefined;
  readonly tier: string;
  /** The TTFT and TDS paced to and scored against. */
  readonly expected: Expectation;
  /** Once ended: arrivals and displayed tokens, `[seconds since the request, tokens]`. */
  readonly timeline: Timeline | undefined;
  /** Once ended: Andes and monotone QoE of both timelines. */
  readonly qoe: QoE | undefined;
  readonly outcome: Outcome | undefined;
  /** The gateway's answer to the telemetry report; undefined when none was sent or it failed. */
  readonly reported: Promise<TelemetryResult | undefined>;
}

/** What chunks come from: an async iterable or a `ReadableStream` of chunk objects. */
export type ChunkSource<T> = AsyncIterable<T> | ReadableStream<T>;

interface Item<T> {
  chunk: T;
  tokens: number;
  ready: number;
}

/** Pace `source` (see the module documentation). */
export function paceStream<T extends ChatCompletionChunk>(source: ChunkSource<T>, options: PaceOptions = {}): PacedStream<T> {
  return new Pacer(source, options);
}

/** Pace `source`, calling `close` to close the underlying request when aborted. */
export function pace<T extends ChatCompletionChunk>(source: ChunkSource<T>, options: PaceOptions, close: () => void): PacedStream<T> {
  return new Pacer(source, options, close);
}

class Pacer<T extends ChatCompletionChunk> implements PacedStream<T> {
  readonly headers: Headers | undefined;
  readonly reported: Promise<TelemetryResult | undefined>;
  timeline: Timeline | undefined;
  qoe: QoE | undefined;
  outcome: Outcome | undefined;

  private readonly info: RequestInfo;
  private readonly clock: Clock;
  private readonly unit: Unit;
  private readonly flushAtEnd: boolean;
  private readonly start: number;
  private readonly schedule: ReleaseSchedule;
  private readonly telemetry: TelemetryOptions | undefined;
  /** The buffer: items not yet released are `queue[head...]`. */
  private queue: Array<Item<T>> = [];
  private head = 0;
  /** Word and sentence cutters, one per text slot (choice and field). */
  private readonly cutters = new Map<string, { slot: TextSlot; cutter: TextCutter<T> }>();
  private readonly arrivals: TimelineEntry[] = [];
  private readonly displayed: TimelineEntry[] = [];
  private counted = 0;
  private sourceDone = false;
  private sourceError: unknown = undefined;
  private aborted = false;
  private iterating = false;
  private wakeup: AbortController | undefined;
  private waitingForData = false;
  private pull: Promise<unknown> = Promise.resolve();
  private closeSource: () => void = () => undefined;
  private reportSent = false;
  private resolveReported: (result: TelemetryResult | undefined) => void = () => undefined;
  private stopWatchingPage: () => void = () => undefined;
  private detachSignal: () => void = () => undefined;

  constructor(
    source: ChunkSource<T>,
    options: PaceOptions,
    private readonly closeRequest: () => void = () => undefined,
  ) {
    this.clock = options.clock ?? systemClock;
    this.start = options.requestStart ?? this.clock.now();
    this.headers = options.headers;
    this.info = requestInfo(options.headers, {
      ...(options.ttft !== undefined && { ttft: options.ttft }),
      ...(options.tds !== undefined && { tds: options.tds }),
    });
    this.schedule = new ReleaseSchedule(this.info.expected.tds);
    this.unit = options.unit ?? "token";
    if (!["token", "word", "sentence"].includes(this.unit)) {
      throw new RangeError(`unit: must be "token", "word" or "sentence", got ${JSON.stringify(this.unit)}`);
    }
    if (options.end !== undefined && options.end !== "drain" && options.end !== "flush") {
      throw new RangeError(`end: must be "drain" or "flush", got ${JSON.stringify(options.end)}`);
    }
    this.flushAtEnd = options.end === "flush";
    this.telemetry = options.telemetry && options.telemetry.url !== undefined ? options.telemetry : undefined;
    this.reported = new Promise((resolve) => {
      this.resolveReported = resolve;
    });
    if (this.telemetry === undefined) this.resolveReported(undefined);
    else this.stopWatchingPage = onPageExit(() => this.reportOnExit());
    void this.read(source); // sets closeSource before its first await
    const signal = options.signal;
    if (signal?.aborted) this.abort();
    else if (signal !== undefined) {
      const onAbort = (): void => this.abort();
      signal.addEventListener("abort", onAbort, { once: true });
      this.detachSignal = () => signal.removeEventListener("abort", onAbort);
    }
  }

  get requestId(): string | undefined {
    return this.info.requestId;
  }

  get tier(): string {
    return this.info.tier;
  }

  get expected(): Expectation {
    return this.info.expected;
  }

  abort(): void {
    if (this.aborted || this.outcome !== undefined) return;
    this.aborted = true;
    this.closeSource();
    try {
      this.closeRequest();
    } catch {
      // The request is being torn down anyway.
    }
    this.finish("aborted");
    this.notify();
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    if (this.iterating) throw new TypeError("A paced stream can be iterated only once.");
    this.iterating = true;
    return {
      next: () => {
        const step = this.pull.then(() => this.next());
        this.pull = step.catch(() => undefined);
        return step;
      },
      return: async (): Promise<IteratorResult<T>> => {
        this.abort();
        return { done: true, value: undefined };
      },
    };
  }

  // -- reading: as fast as the source delivers ------------------------------------------
  private async read(source: ChunkSource<T>): Promise<void> {
    try {
      if (isReadableStream(source)) {
        const reader = source.getReader();
        this.closeSource = () => void reader.cancel().catch(() => undefined);
        for (;;) {
          const { done, value } = await reader.read();
          if (done || this.aborted) break;
          this.arrive(value);
        }
      } else {
        const iterator = source[Symbol.asyncIterator]();
        this.closeSource = () => void iterator.return?.()?.catch(() => undefined);
        for (;;) {
          const { done, value } = await iterator.next();
          if (done || this.aborted) break;
          this.arrive(value);
        }
      }
    } catch (error) {
      if (!this.aborted) {
        this.sourceError = error;
        this.closeSource(); // a chunk we could not read: let go of the request
      }
    }
    if (!this.aborted) this.flushCutters(this.clock.now());
    this.sourceDone = true;
    this.notify();
  }

  private arrive(chunk: T): void {
    if (typeof chunk !== "object" || chunk === null || !Array.isArray(chunk.choices)) {
      throw new TypeError(`Not a chat completion chunk (no choices array): ${JSON.stringify(chunk)?.slice(0, 200)}`);
    }
    const now = this.clock.now();
    const tokens = chunkTokens(chunk, this.counted);
    this.counted += tokens;
    if (tokens > 0) this.arrivals.push([this.seconds(now), tokens]);
    const texts = chunkTexts(chunk);
    if (texts.length === 0) {
      if (this.unit !== "token") this.flushCutters(now);
      this.enqueue(chunk, tokens, now);
    } else if (this.unit === "token") {
      if (texts.length === 1 && tokens > 1) {
        const where = texts[0] as ChunkText;
        for (const piece of splitTokens(where.text, tokens)) this.enqueue(withText(chunk, where, piece.text), piece.tokens, now);
        this.enqueueRest(chunk, now);
      } else {
        this.enqueue(chunk, tokens, now);
      }
    } else {
      texts.forEach((where, i) => {
        const share = Math.floor(((i + 1) * tokens) / texts.length) - Math.floor((i * tokens) / texts.length);
        const key = `${where.choice}:${where.field}`;
        let entry = this.cutters.get(key);
        if (entry === undefined) {
          entry = { slot: { choice: where.choice, field: where.field }, cutter: new TextCutter<T>(this.unit as "word" | "sentence") };
          this.cutters.set(key, entry);
        }
        for (const piece of entry.cutter.push(where.text, share, chunk)) {
          this.enqueue(withText(piece.source, where, piece.text), piece.tokens, now);
        }
      });
      if (chunk.choices.some((c) => c.finish_reason != null)) this.flushCutters(now);
      this.enqueueRest(chunk, now);
    }
    if (this.waitingForData) this.notify();
  }

  /** The role, finish reason or usage of a chunk whose text went out in pieces. */
  private enqueueRest(chunk: T, now: number): void {
    const rest = withoutText(chunk);
    if (rest !== undefined) this.enqueue(rest, 0, now);
  }

  private flushCutters(now: number): void {
    for (const { slot, cutter } of this.cutters.values()) {
      for (const piece of cutter.flush()) this.enqueue(withText(piece.source, slot, piece.text), piece.tokens, now);
    }
  }

  private enqueue(chunk: T, tokens: number, ready: number): void {
    this.queue.push({ chunk, tokens, ready });
  }

  /** Take the head of the buffer (dropping released items in bulk, not one shift at a time). */
  private dequeue(): void {
    this.head++;
    if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
  }

  // -- releasing: on the schedule -------------------------------------------------------
  private async next(): Promise<IteratorResult<T>> {
    for (;;) {
      if (this.aborted) return { done: true, value: undefined };
      const item = this.queue[this.head];
      if (item !== undefined) {
        const now = this.clock.now();
        const at = this.sourceDone && this.flushAtEnd ? now : this.schedule.releaseAt(item.ready, item.tokens);
        if (at > now) {
          await this.wait(at - now);
          continue;
        }
        this.dequeue();
        this.schedule.released(now, item.tokens);
        if (item.tokens > 0) this.displayed.push([this.seconds(now), item.tokens]);
        return { done: false, value: item.chunk };
      }
      if (this.sourceDone) {
        if (this.sourceError !== undefined) {
          const error = this.sourceError;
          this.sourceError = undefined; // thrown once; the iteration is then done
          this.finish("error");
          throw error;
        }
        this.finish("completed");
        return { done: true, value: undefined };
      }
      await this.wait(undefined);
    }
  }

  /**
   * Sleep `ms`, or until a chunk arrives when `ms` is undefined; the source's end and
   * `abort()` wake either (under `flush`, the end releases what a sleep was waiting for).
   */
  private async wait(ms: number | undefined): Promise<void> {
    const wakeup = new AbortController();
    this.wakeup = wakeup;
    this.waitingForData = ms === undefined;
    if (ms !== undefined) await this.clock.sleep(ms, wakeup.signal);
    else await new Promise<void>((resolve) => wakeup.signal.addEventListener("abort", () => resolve(), { once: true }));
    this.waitingForData = false;
  }

  private notify(): void {
    this.wakeup?.abort();
  }

  private seconds(ms: number): number {
    return Math.max(ms - this.start, 0) / 1000;
  }

  // -- ending: timeline, QoE, report -----------------------------------------------------
  private finish(outcome: Outcome): void {
    if (this.outcome !== undefined) return;
    this.outcome = outcome;
    this.timeline = { arrivals: [...this.arrivals], displayed: [...this.displayed] };
    this.qoe = timelineQoE(this.timeline, this.info.expected);
    this.stopWatchingPage();
    this.detachSignal();
    const report = this.report(outcome);
    if (report !== undefined) void this.post(report);
  }

  /** The report of what happened so far, once only; undefined when none can be sent. */
  private report(outcome: Outcome): TelemetryReport | undefined {
    if (this.telemetry === undefined || this.reportSent) return undefined;
    this.reportSent = true;
    if (this.info.requestId === undefined) {
      tellError(this.telemetry.onError, new Error("No X-Request-Id in the response: the QoE report was not sent."));
      this.resolveReported(undefined);
      return undefined;
    }
    const timeline = this.timeline ?? { arrivals: [...this.arrivals], displayed: [...this.displayed] };
    return buildReport(this.info.requestId, this.info.expected, timeline, outcome);
  }

  private async post(report: TelemetryReport): Promise<void> {
    const telemetry = this.telemetry as TelemetryOptions & { url: string };
    try {
      const auth = { token: this.info.telemetryToken, apiKey: telemetry.apiKey };
      this.resolveReported(await postReport(telemetry.url, report, auth, telemetry.fetch));
    } catch (error) {
      tellError(telemetry.onError, error);
      this.resolveReported(undefined);
    }
  }

  /** The page is going away before the stream ended: report what the user saw, by beacon. */
  private reportOnExit(): void {
    const report = this.report("aborted");
    if (report === undefined) return;
    const url = (this.telemetry as TelemetryOptions & { url: string }).url;
    const token = this.info.telemetryToken;
    if (token !== undefined && beaconReport(url, report, token)) this.resolveReported(undefined);
    else void this.post(report);
  }
}
