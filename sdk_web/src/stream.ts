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
 * While it streams, its reader channel (src/channel.ts) tells the gateway about the
 * reader: the page hidden or shown (src/presence.ts), `setPresence` (the speech paused),
 * `setPace`, a stall (the buffer empty once the reader has read what was shown, the
 * stream still open), and `left` when the page closes or the user aborts. While the reader
 * is away nothing is released; they come back to the next unread token (src/pacer.ts).
 *
 * Once the stream ends it records when tokens arrived and when they were displayed
 * (seconds since the request was sent), when the reader was away, their QoE, and sends
 * the telemetry report.
 */
import { ReaderChannel, type SentSignal } from "./channel.js";
import { systemClock, type Clock } from "./clock.js";
import { requestInfo, type RequestInfo } from "./headers.js";
import { Pacer } from "./pacer.js";
import { timelineQoE } from "./qoe.js";
import { globalPage, watchPage, type PageLike } from "./presence.js";
import { Reader, type ChunkSource } from "./reader.js";
import type { Unit } from "./segment.js";
import { httpTransport, readerURL, type SignalTransport } from "./signals.js";
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
  /** The live reader channel; `false`: none (the page's visibility is then not followed either). */
  readerSignals?: ReaderSignalOptions | false;
}

/** Where and how the reader channel speaks; every field has a default. */
export interface ReaderSignalOptions {
  /** The endpoint (default: next to the telemetry URL, `.../tokenpace/reader`); none: no signals sent. */
  url?: string;
  /** Used when the response carried no telemetry token (default: the telemetry's). */
  apiKey?: string;
  /** The `fetch` to send with (default: the telemetry's, else the global one). */
  fetch?: typeof fetch;
  /** How signals are sent (default: keepalive fetch and `navigator.sendBeacon` to `url`). */
  transport?: SignalTransport;
  /** The page whose visibility and `pagehide` are followed (default: the global page; `null`: none). */
  page?: PageLike | null;
  /** Told of every signal sent. */
  onSignal?: (sent: SentSignal) => void;
  /** Told of every failure to send; sending never throws. */
  onError?: (error: unknown) => void;
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
  /** The reader looks away (`away`: releases stop, the place is kept) or back (`watching`); told to the gateway. */
  setPresence(presence: "watching" | "away"): void;
  /** The reader's own pace in tokens a second (a speech rate; undefined: the tier's), told to the gateway. */
  setPace(tps: number | undefined): void;
  /** The live reader channel; undefined when signals are off or the response had no request id. */
  readonly readerChannel: ReaderChannel | undefined;
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
  readonly readerChannel: ReaderChannel | undefined;
  private stallTold = false;
  private stopWatchingPresence: () => void = () => undefined;
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
    const signals = options.readerSignals;
    this.readerChannel = signals === false ? undefined : this.openChannel(signals ?? {});
    if (this.telemetry === undefined) this.resolveReported(undefined);
    else this.stopWatchingPage = onPageExit(() => this.reportOnExit(), signals === false);
    if (signals !== false) {
      const page = signals?.page === null ? undefined : (signals?.page ?? globalPage());
      this.stopWatchingPresence = watchPage(
        { hidden: (hidden) => this.setPresence(hidden ? "away" : "watching"), leaving: () => this.readerChannel?.leave({ beacon: true }) },
        page,
      );
    }
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

  setPresence(presence: "watching" | "away"): void {
    if (this.outcome !== undefined) return;
    const now = this.clock.now();
    if (presence === "away") this.pacer.away(now);
    else this.pacer.back(now);
    this.readerChannel?.setPresence(presence);
    this.notify();
  }

  setPace(tps: number | undefined): void {
    this.readerChannel?.setPace(tps);
  }

  /** The channel of this stream, when it can speak: a request id and somewhere to send. */
  private openChannel(signals: ReaderSignalOptions): ReaderChannel | undefined {
    const requestId = this.info.requestId;
    const url = signals.url ?? (this.telemetry?.url !== undefined ? readerURL(this.telemetry.url) : undefined);
    if (requestId === undefined || (url === undefined && signals.transport === undefined)) return undefined;
    const fetchFn = signals.fetch ?? this.telemetry?.fetch;
    const apiKey = signals.apiKey ?? this.telemetry?.apiKey;
    const transport =
      signals.transport ??
      httpTransport({ url: url as string, token: this.info.telemetryToken, apiKey, ...(fetchFn !== undefined && { fetch: fetchFn }) });
    return new ReaderChannel({ requestId, transport, clock: this.clock, buffer: () => this.pacer.buffered, onSignal: signals.onSignal, onError: signals.onError });
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
    this.readerChannel?.leave();
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
    this.stallTold = false;
    if (this.waitingForData) this.notify();
  }

  private sourceEnded(error: unknown): void {
    this.readerChannel?.close(); // the reply is no longer the gateway's to pace
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
      if (!this.pacer.ended && !this.pacer.isAway && this.readerChannel !== undefined) {
        // Nothing to show, the stream open: once the reader has read what was shown, they wait.
        const readBy = this.pacer.readBy();
        if (readBy !== undefined && readBy > now) {
          await this.wait(readBy - now, true);
          continue;
        }
        if (readBy !== undefined && !this.stallTold) {
          this.stallTold = true;
          this.readerChannel.stalled();
        }
      }
      if (this.pacer.drained) {
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
   * Sleep `ms`, or until a chunk arrives when `ms` is undefined or `orData`; the source's
   * end, a change of presence and `abort()` wake either (under `flush`, the end releases
   * what a sleep was waiting for).
   */
  private async wait(ms: number | undefined, orData = false): Promise<void> {
    const wakeup = new AbortController();
    this.wakeup = wakeup;
    this.waitingForData = ms === undefined || orData;
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
    this.readerChannel?.close();
    this.stopWatchingPresence();
    this.timeline = this.pacer.timeline(this.clock.now());
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
    return buildReport(this.info.requestId, this.info.expected, this.timeline ?? this.pacer.timeline(this.clock.now()), outcome);
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
    this.readerChannel?.leave({ beacon: true });
    const report = this.report("aborted");
    if (report === undefined) return;
    const url = (this.telemetry as TelemetryOptions & { url: string }).url;
    const token = this.info.telemetryToken;
    if (token !== undefined && beaconReport(url, report, token)) this.resolveReported(undefined);
    else void this.post(report);
  }
}
