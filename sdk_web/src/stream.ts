/**
 * `paceStream`: the client-side pacing buffer of Andes (Liu et al.) §5. Chunks are read
 * from the network as fast as they come (src/reader.ts: no back-pressure, the read never
 * waits for the reader) into a buffer (src/pacer.ts), and released to the caller on the
 * digestion schedule (src/schedule.ts): the first token the moment it arrives, each next
 * token 1/TDS after the previous one, or when it arrives if that is later.
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
import { systemClock, type Clock } from "./clock.js";
import { requestInfo, type RequestInfo } from "./headers.js";
import { Pacer } from "./pacer.js";
import { timelineQoE } from "./qoe.js";
import { Reader, type ChunkSource } from "./reader.js";
import type { Unit } from "./segment.js";
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
import type { ChatCompletionChunk, Expectation, Outcome, QoE, Timeline } from "./types.js";

/** Options of `paceStream` (and of the client and the adapter). */
export interface PaceOptions {
  /** Tokens per second to release at (default: the `X-TokenPace-TDS` header, else the chat tier's, src/tiers.ts). */
  tds?: number;
  /** Expected time to first token in seconds, for QoE (default: `X-TokenPace-TTFT`, else the chat tier's). */
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
  /** Once ended: Andes and monotone QoE, freezes and user idle latency of both timelines. */
  readonly qoe: QoE | undefined;
  readonly outcome: Outcome | undefined;
  /** The gateway's answer to the telemetry report; undefined when none was sent or it failed. */
  readonly reported: Promise<TelemetryResult | undefined>;
}

/** Pace `source` (see the module documentation). */
export function paceStream<T extends ChatCompletionChunk>(source: ChunkSource<T>, options: PaceOptions = {}): PacedStream<T> {
  return new PacedChunks(source, options);
}

/** Pace `source`, calling `close` to close the underlying request when aborted. */
export function pace<T extends ChatCompletionChunk>(source: ChunkSource<T>, options: PaceOptions, close: () => void): PacedStream<T> {
  return new PacedChunks(source, options, close);
}

/** The reader and the pacer of one stream, its iteration, and its ending. */
class PacedChunks<T extends ChatCompletionChunk> implements PacedStream<T> {
  readonly headers: Headers | undefined;
  readonly reported: Promise<TelemetryResult | undefined>;
  timeline: Timeline | undefined;
  qoe: QoE | undefined;
  outcome: Outcome | undefined;

  private readonly info: RequestInfo;
  private readonly clock: Clock;
  private readonly pacer: Pacer<T>;
  private readonly reader: Reader<T>;
  private readonly telemetry: TelemetryOptions | undefined;
  private sourceError: unknown = undefined;
  private aborted = false;
  private iterating = false;
  private wakeup: AbortController | undefined;
  private waitingForData = false;
  private pull: Promise<unknown> = Promise.resolve();
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
    this.headers = options.headers;
    this.info = requestInfo(options.headers, {
      ...(options.ttft !== undefined && { ttft: options.ttft }),
      ...(options.tds !== undefined && { tds: options.tds }),
    });
    this.pacer = new Pacer<T>({
      tds: this.info.expected.tds,
      unit: options.unit ?? "token",
      end: options.end ?? "drain",
      start: options.requestStart ?? this.clock.now(),
    });
    this.telemetry = options.telemetry && options.telemetry.url !== undefined ? options.telemetry : undefined;
    this.reported = new Promise((resolve) => {
      this.resolveReported = resolve;
    });
    if (this.telemetry === undefined) this.resolveReported(undefined);
    else this.stopWatchingPage = onPageExit(() => this.reportOnExit());
    this.reader = new Reader(
      source,
      (chunk) => this.arrive(chunk),
      (error) => this.sourceEnded(error),
    );
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
    this.reader.stop();
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

  // -- reading: as fast as the source delivers (src/reader.ts) --------------------------
  private arrive(chunk: T): void {
    this.pacer.arrive(chunk, this.clock.now());
    if (this.waitingForData) this.notify();
  }

  private sourceEnded(error: unknown): void {
    this.sourceError = error;
    this.pacer.end(this.clock.now());
    this.notify();
  }

  // -- releasing: on the schedule (src/pacer.ts) ----------------------------------------
  private async next(): Promise<IteratorResult<T>> {
    for (;;) {
      if (this.aborted) return { done: true, value: undefined };
      const now = this.clock.now();
      const chunk = this.pacer.pop(now);
      if (chunk !== undefined) return { done: false, value: chunk };
      const at = this.pacer.nextRelease(now);
      if (at !== undefined) {
        await this.wait(at - now);
        continue;
      }
      if (this.pacer.ended) {
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

  // -- ending: timeline, QoE, report -----------------------------------------------------
  private finish(outcome: Outcome): void {
    if (this.outcome !== undefined) return;
    this.outcome = outcome;
    this.timeline = this.pacer.timeline();
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
    return buildReport(this.info.requestId, this.info.expected, this.timeline ?? this.pacer.timeline(), outcome);
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
