/**
 * The display side of a paced stream, free of I/O: chunks in, due chunks out.
 *
 * The stream hands every chunk the reader (src/reader.ts) reads to `Pacer.arrive`, with
 * the time it was read. The pacer counts its tokens (src/chunks.ts), cuts it into the
 * pieces of the `unit` (src/segment.ts: a token, a word or a sentence) and queues them;
 * `pop` hands out the head of the queue once the release schedule (src/schedule.ts) says
 * it is due, and `nextRelease` says when that will be. It records both timelines: when
 * tokens arrived and when they were displayed, in seconds since the request was sent.
 *
 * While the reader is away (`away`/`back`: the page hidden, the speech paused) nothing is
 * released and the reader's place is kept: the schedule runs on watched time (the time
 * away taken out, `qos.metrics.watched_times`), so when they come back the next unread
 * token goes out at once and the rest follow at the pace, as if no time had passed.
 */
import { chunkTexts, chunkTokens, withoutText, withText, type ChunkText, type TextSlot } from "./chunks.js";
import { ReleaseSchedule } from "./schedule.js";
import { splitTokens, TextCutter, type Unit } from "./segment.js";
import type { ChatCompletionChunk, Timeline, TimelineEntry, TimeSpan } from "./types.js";

/** How a stream is paced; times in milliseconds of the stream's clock. */
export interface PacerOptions {
  /** Tokens per second. */
  tds: number;
  unit: Unit;
  /** At the reply's end: keep pacing (`drain`) or release the rest at once (`flush`). */
  end: "drain" | "flush";
  /** When the request was sent: the origin of the timelines. */
  start: number;
}

interface Item<T> {
  chunk: T;
  tokens: number;
  /** When it was ready, on watched time (ms). */
  ready: number;
}

/** The chunks waiting for their release time, and the two timelines of one stream. */
export class Pacer<T extends ChatCompletionChunk> {
  private readonly schedule: ReleaseSchedule;
  private readonly unit: Unit;
  private readonly flushAtEnd: boolean;
  private readonly start: number;
  /** The buffer: items not yet released are `queue[head...]`. */
  private queue: Array<Item<T>> = [];
  private head = 0;
  /** Word and sentence cutters, one per text slot (choice and field). */
  private readonly cutters = new Map<string, { slot: TextSlot; cutter: TextCutter<T> }>();
  private readonly arrivals: TimelineEntry[] = [];
  private readonly displayed: TimelineEntry[] = [];
  private counted = 0;
  private isEnded = false;
  /** Tokens in the buffer: received, not yet released. */
  private held = 0;
  /** Time spent away in closed spans (ms), the span under way, and all spans in seconds. */
  private awayMs = 0;
  private awaySince: number | undefined = undefined;
  private readonly aways: TimeSpan[] = [];

  constructor(options: PacerOptions) {
    this.schedule = new ReleaseSchedule(options.tds);
    this.unit = options.unit;
    if (!["token", "word", "sentence"].includes(this.unit)) {
      throw new RangeError(`unit: must be "token", "word" or "sentence", got ${JSON.stringify(this.unit)}`);
    }
    if (options.end !== "drain" && options.end !== "flush") {
      throw new RangeError(`end: must be "drain" or "flush", got ${JSON.stringify(options.end)}`);
    }
    this.flushAtEnd = options.end === "flush";
    this.start = options.start;
  }

  /** No more chunks will arrive: the source finished, failed or was closed. */
  get ended(): boolean {
    return this.isEnded;
  }

  /** Tokens received and not yet released. */
  get buffered(): number {
    return this.held;
  }

  /** Whether the reader is away (nothing is released). */
  get isAway(): boolean {
    return this.awaySince !== undefined;
  }

  /** The reader looked away at `now`: releases stop, the place is kept. */
  away(now: number): void {
    if (this.awaySince === undefined) this.awaySince = now;
  }

  /** The reader is back at `now`: releases resume from the next unread token. */
  back(now: number): void {
    if (this.awaySince === undefined) return;
    this.aways.push([this.seconds(this.awaySince), this.seconds(now)]);
    this.awayMs += Math.max(now - this.awaySince, 0);
    this.awaySince = undefined;
  }

  /**
   * When the reader will have read every token released so far (ms), undefined before the
   * first: past it with the buffer empty and the stream open, the reader is stalled.
   */
  readBy(): number | undefined {
    const free = this.schedule.free;
    return free === -Infinity ? undefined : free + this.awayMs;
  }

  /** `chunk` was read at `now`; a `TypeError` when it is not a chat completion chunk. */
  arrive(chunk: T, now: number): void {
    if (typeof chunk !== "object" || chunk === null || !Array.isArray(chunk.choices)) {
      throw new TypeError(`Not a chat completion chunk (no choices array): ${JSON.stringify(chunk)?.slice(0, 200)}`);
    }
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
  }

  /** The source ended at `now`: words and sentences still pending go out; under `flush`, everything now. */
  end(now: number): void {
    this.flushCutters(now);
    this.isEnded = true;
  }

  /** Ended, and everything released. */
  get drained(): boolean {
    return this.isEnded && this.head >= this.queue.length;
  }

  /** When the head of the buffer may go out; undefined when the buffer is empty. */
  nextRelease(now: number): number | undefined {
    const item = this.queue[this.head];
    if (item === undefined || this.awaySince !== undefined) return undefined;
    return this.isEnded && this.flushAtEnd ? now : this.schedule.releaseAt(item.ready, item.tokens) + this.awayMs;
  }

  /** The head of the buffer if it is due at `now`, recorded as displayed at `now`. */
  pop(now: number): T | undefined {
    const at = this.nextRelease(now);
    const item = this.queue[this.head];
    if (at === undefined || at > now || item === undefined) return undefined;
    this.dequeue();
    this.held -= item.tokens;
    this.schedule.released(this.watched(now), item.tokens);
    if (item.tokens > 0) this.displayed.push([this.seconds(now), item.tokens]);
    return item.chunk;
  }

  /**
   * Arrivals and displayed tokens so far, `[seconds since the request, tokens]`, and the
   * spans the reader was away (one under way ends at `now`).
   */
  timeline(now: number): Timeline {
    const away = [...this.aways];
    if (this.awaySince !== undefined) away.push([this.seconds(this.awaySince), this.seconds(now)]);
    return { arrivals: [...this.arrivals], displayed: [...this.displayed], ...(away.length > 0 && { away }) };
  }

  /** `now` on watched time: the time away before it taken out (a time away counts as its start). */
  private watched(now: number): number {
    return (this.awaySince ?? now) - this.awayMs;
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

  private enqueue(chunk: T, tokens: number, now: number): void {
    this.queue.push({ chunk, tokens, ready: this.watched(now) });
    this.held += tokens;
  }

  /** Take the head of the buffer (dropping released items in bulk, not one shift at a time). */
  private dequeue(): void {
    this.head++;
    if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
  }

  private seconds(ms: number): number {
    return Math.max(ms - this.start, 0) / 1000;
  }
}
