/**
 * The reader channel of one stream: the signals its client sends while the reply streams
 * (src/signals.ts), on change and throttled.
 *
 * - A change of presence (`watching` → `away` → `watching`, or `left`) goes at once.
 * - Anything else (a new pace, a stall: the buffer empty while the reader watches and the
 *   stream is open) goes at most every `MIN_INTERVAL_S` after the previous signal: a later
 *   one waits for the interval and carries the state as it then stands.
 * - While away, the away is renewed every `AWAY_LEASE_S / 2`, so a lost `watching` costs
 *   at most one lease of away treatment at the gateway.
 * - Every signal carries `buffer_tokens`: tokens received and not yet shown.
 * - A signal the gateway refuses as too soon (429) goes again, as the state then stands,
 *   one interval later.
 * - `left` is the last signal; `close()` (the reply has fully arrived, or the stream
 *   ended) sends nothing more: the gateway has nothing left to pace.
 *
 * Time comes from the injected `Clock`, transport from the injected `SignalTransport`,
 * so the rules are tested on virtual time with a recording transport.
 */
import type { Clock } from "./clock.js";
import { TokenPaceError } from "./errors.js";
import { AWAY_LEASE_S, MAX_PACE_TPS, MIN_INTERVAL_S, type Presence, type ReaderSignalBody, type SignalTransport } from "./signals.js";

/** A signal as it was sent: the body, when (ms on the channel's clock), and how. */
export interface SentSignal {
  body: ReaderSignalBody;
  at: number;
  via: "fetch" | "beacon";
}

/** One stream's channel: whom it speaks for and how. */
export interface ReaderChannelOptions {
  /** The stream's `X-Request-Id`. */
  requestId: string;
  transport: SignalTransport;
  clock: Clock;
  /** Tokens received and not yet shown, as the pacer holds them now. */
  buffer: () => number;
  /** Told of every signal sent (e.g. a panel that shows them). */
  onSignal?: ((sent: SentSignal) => void) | undefined;
  /** Told of every failure to send; sending never throws. */
  onError?: ((error: unknown) => void) | undefined;
}

const INTERVAL_MS = MIN_INTERVAL_S * 1000;
const RENEW_MS = (AWAY_LEASE_S / 2) * 1000;

/** The throttled signals of one stream (see the module documentation). */
export class ReaderChannel {
  private state: Presence = "watching";
  private pace: number | undefined = undefined;
  private lastSentAt = -Infinity;
  private pending = false;
  private closed = false;
  private timer: AbortController | undefined;

  constructor(private readonly options: ReaderChannelOptions) {}

  /** What the channel last said, or will say, of the reader. */
  get presence(): Presence {
    return this.state;
  }

  /** The reader looks away (`away`) or back (`watching`): sent at once if it changed. */
  setPresence(presence: "watching" | "away"): void {
    if (this.closed || presence === this.state) return;
    this.state = presence;
    this.sendNow();
  }

  /** The reader's own pace (tokens a second; undefined: the tier's), sent within the interval. */
  setPace(tps: number | undefined): void {
    if (tps !== undefined && !(Number.isFinite(tps) && tps > 0 && tps <= MAX_PACE_TPS)) {
      throw new RangeError(`pace: must be a number of tokens a second in (0, ${MAX_PACE_TPS}], got ${tps}`);
    }
    if (this.closed || tps === this.pace) return;
    this.pace = tps;
    this.request();
  }

  /** The reader has read everything and waits while the stream is open: said within the interval. */
  stalled(): void {
    if (this.closed || this.state !== "watching") return;
    this.request();
  }

  /** The reader is gone (the user cancelled, the page closes): the last signal, by beacon if asked. */
  leave(options: { beacon?: boolean } = {}): void {
    if (this.closed) return;
    this.state = "left";
    this.sendNow(options.beacon === true);
    this.close();
  }

  /** The reply has fully arrived or the stream ended: nothing more is sent. */
  close(): void {
    this.closed = true;
    this.timer?.abort();
    this.timer = undefined;
  }

  /**
   * The gateway refused a signal as too soon (429: it reached the gateway within the
   * interval of the previous one): the state as it then stands goes again after the interval.
   */
  private refused(): void {
    if (this.closed) return;
    this.lastSentAt = this.options.clock.now();
    this.pending = true;
    this.arm();
  }

  /** Send now if the interval has passed since the last signal, else once it has. */
  private request(): void {
    if (this.options.clock.now() - this.lastSentAt >= INTERVAL_MS) this.sendNow();
    else {
      this.pending = true;
      this.arm();
    }
  }

  private sendNow(beacon = false): void {
    const now = this.options.clock.now();
    this.lastSentAt = now;
    this.pending = false;
    const body: ReaderSignalBody = { request_id: this.options.requestId, presence: this.state, buffer_tokens: this.options.buffer() };
    if (this.pace !== undefined) body.pace_tps = this.pace;
    const sent = beacon && this.options.transport.beacon(body);
    if (!sent) {
      this.options.transport.send(body).catch((error: unknown) => {
        if (error instanceof TokenPaceError && error.status === 429) this.refused();
        this.tell(this.options.onError, error);
      });
    }
    this.tell(this.options.onSignal, { body, at: now, via: sent ? "beacon" : "fetch" });
    this.arm();
  }

  /** Wake for the next due send: a waiting update, or the away's renewal. */
  private arm(): void {
    this.timer?.abort();
    this.timer = undefined;
    if (this.closed) return;
    const due = this.pending ? this.lastSentAt + INTERVAL_MS : this.state === "away" ? this.lastSentAt + RENEW_MS : undefined;
    if (due === undefined) return;
    const timer = new AbortController();
    this.timer = timer;
    void this.options.clock.sleep(due - this.options.clock.now(), timer.signal).then(() => {
      if (!timer.signal.aborted && !this.closed) this.sendNow();
    });
  }

  private tell<A>(handler: ((arg: A) => void) | undefined, arg: A): void {
    try {
      handler?.(arg);
    } catch {
      // A failing handler must not break the stream.
    }
  }
}
