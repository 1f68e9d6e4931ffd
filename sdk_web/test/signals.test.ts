import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { ReaderChannel } from "../src/channel.js";
import { TokenPaceError } from "../src/errors.js";
import type { PageLike } from "../src/presence.js";
import { freezes, tokenTimes, watchedTimes } from "../src/qoe.js";
import { AWAY_LEASE_S, MAX_BUFFER_TOKENS, MAX_PACE_TPS, MIN_INTERVAL_S, PRESENCES, readerURL, type ReaderSignalBody, type SignalTransport } from "../src/signals.js";
import { paceStream } from "../src/stream.js";
import type { ChatCompletionChunk, TimelineEntry, TimeSpan } from "../src/types.js";
import { close, collect, contentChunk, finishChunk, REPO_ROOT, roleChunk, textOf, timedSource, VirtualClock } from "./helpers.js";

/** The channel's vocabulary and timing, and the watched-time rule, generated from `qos` (scripts/make_signal_vectors.py). */
const VECTORS = JSON.parse(readFileSync(join(REPO_ROOT, "tests/vectors/signals.json"), "utf8")) as {
  constants: { min_interval_s: number; away_lease_s: number; max_pace_tps: number; max_buffer_tokens: number; presences: string[] };
  freezes: Array<{ name: string; timeline: TimelineEntry[]; tds: number; away: TimeSpan[]; watched: number[]; freezes: { longest_s: number; count: number; total_s: number } }>;
};

/** A transport that records what it was given, when. */
class Recorder implements SignalTransport {
  readonly sent: Array<{ at: number; body: ReaderSignalBody; via: "fetch" | "beacon" }> = [];
  constructor(private readonly clock: VirtualClock) {}
  send(body: ReaderSignalBody): Promise<void> {
    this.sent.push({ at: this.clock.now(), body, via: "fetch" });
    return Promise.resolve();
  }
  beacon(body: ReaderSignalBody): boolean {
    this.sent.push({ at: this.clock.now(), body, via: "beacon" });
    return true;
  }
  get presences(): string[] {
    return this.sent.map((s) => s.body.presence);
  }
}

/** A page whose visibility the test sets. */
class FakePage implements PageLike {
  private readonly listeners = new Map<string, Set<() => void>>();
  readonly document = {
    visibilityState: "visible",
    addEventListener: (type: string, l: () => void) => this.on(`doc:${type}`, l),
    removeEventListener: (type: string, l: () => void) => this.listeners.get(`doc:${type}`)?.delete(l),
  };
  addEventListener(type: string, l: () => void): void {
    this.on(type, l);
  }
  removeEventListener(type: string, l: () => void): void {
    this.listeners.get(type)?.delete(l);
  }
  setHidden(hidden: boolean): void {
    this.document.visibilityState = hidden ? "hidden" : "visible";
    for (const l of [...(this.listeners.get("doc:visibilitychange") ?? [])]) l();
  }
  hide(): void {
    for (const l of [...(this.listeners.get("pagehide") ?? [])]) l();
  }
  get listening(): number {
    return [...this.listeners.values()].reduce((n, s) => n + s.size, 0);
  }
  private on(type: string, l: () => void): void {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type)?.add(l);
  }
}

function channel(clock: VirtualClock, transport: SignalTransport, buffer = () => 7): ReaderChannel {
  return new ReaderChannel({ requestId: "req-1", transport, clock, buffer });
}

/** Tokens arriving at `times` (ms), one a chunk, between a role and a finish chunk. */
function tokensAt(times: number[]): Array<[number, ChatCompletionChunk]> {
  return [[times[0] ?? 0, roleChunk()], ...times.map((t, i): [number, ChatCompletionChunk] => [t, contentChunk(` w${i}`)]), [times[times.length - 1] ?? 0, finishChunk()]];
}

test("the channel's timing and vocabulary are the gateway's", () => {
  assert.equal(MIN_INTERVAL_S, VECTORS.constants.min_interval_s);
  assert.equal(AWAY_LEASE_S, VECTORS.constants.away_lease_s);
  assert.equal(MAX_PACE_TPS, VECTORS.constants.max_pace_tps);
  assert.equal(MAX_BUFFER_TOKENS, VECTORS.constants.max_buffer_tokens);
  assert.deepEqual([...PRESENCES], VECTORS.constants.presences);
});

test("freezes count only while the reader watches: the shared vectors", () => {
  assert.ok(VECTORS.freezes.length >= 15);
  for (const v of VECTORS.freezes) {
    const watched = watchedTimes(tokenTimes(v.timeline), v.away);
    v.watched.forEach((w, i) => assert.ok(close(watched[i] as number, w), `${v.name}: token ${i}: ${watched[i]} != ${w}`));
    const got = freezes(v.timeline, v.tds, v.away);
    assert.equal(got.count, v.freezes.count, v.name);
    assert.ok(close(got.longestS, v.freezes.longest_s, 1e-9), `${v.name}: longest ${got.longestS} != ${v.freezes.longest_s}`);
    assert.ok(close(got.totalS, v.freezes.total_s, 1e-9), `${v.name}: total`);
  }
});

test("away spans out of order or inverted are refused, naming the field", () => {
  assert.throws(() => watchedTimes([1], [[2, 1]]), /away: each span/);
  assert.throws(() => watchedTimes([1], [[0, 2], [1, 3]]), /away: spans must be in time order/);
});

test("the signal endpoint is next to the telemetry endpoint", () => {
  assert.equal(readerURL("http://gw/v1/tokenpace/telemetry"), "http://gw/v1/tokenpace/reader");
  assert.equal(readerURL("http://gw/v1/other"), undefined);
});

test("a change of presence goes at once, with the buffer", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const ch = channel(clock, rec);
  ch.setPresence("away");
  ch.setPresence("away"); // no change: nothing sent
  ch.setPresence("watching");
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body]),
    [
      [0, { request_id: "req-1", presence: "away", buffer_tokens: 7 }],
      [0, { request_id: "req-1", presence: "watching", buffer_tokens: 7 }],
    ],
  );
  ch.close();
});

test("other changes wait for the interval and carry the state as it then stands", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const ch = channel(clock, rec);
  ch.setPresence("away");
  ch.setPresence("watching"); // at 0
  ch.setPace(3.0);
  ch.setPace(2.5); // both within the interval: one signal, the newest pace
  await clock.run(clock.until(1000));
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body.presence, s.body.pace_tps]),
    [
      [0, "away", undefined],
      [0, "watching", undefined],
      [MIN_INTERVAL_S * 1000, "watching", 2.5],
    ],
  );
  ch.stalled(); // the interval has passed: at once
  assert.equal(rec.sent.length, 4);
  assert.equal(rec.sent[3]?.at, 1000);
  ch.close();
});

test("an abusive caller still gets at most one signal per interval without a change of presence", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const ch = channel(clock, rec);
  for (let t = 0; t < 2000; t += 10) {
    await clock.run(clock.until(t));
    ch.stalled();
    ch.setPace(1 + (t % 20));
  }
  ch.close();
  const times = rec.sent.map((s) => s.at);
  for (let i = 1; i < times.length; i++) assert.ok((times[i] as number) - (times[i - 1] as number) >= MIN_INTERVAL_S * 1000);
  assert.ok(rec.sent.length <= 2000 / (MIN_INTERVAL_S * 1000) + 1);
});

test("a signal refused as too soon goes again one interval later, as the state then stands", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  let refuse = true;
  const transport: SignalTransport = {
    send: (body) => {
      void rec.send(body);
      if (!refuse) return Promise.resolve();
      refuse = false;
      return Promise.reject(new TokenPaceError("too soon", { code: "reader_signal_rate" }, 429));
    },
    beacon: (body) => rec.beacon(body),
  };
  let buffer = 3;
  const ch = new ReaderChannel({ requestId: "req-1", transport, clock, buffer: () => buffer });
  ch.stalled();
  buffer = 5;
  await clock.run(clock.until(1000));
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body.presence, s.body.buffer_tokens]),
    [
      [0, "watching", 3],
      [MIN_INTERVAL_S * 1000, "watching", 5],
    ],
  );
  ch.close();
});

test("away is renewed every half lease, and a stall is not told while away", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const ch = channel(clock, rec);
  ch.setPresence("away");
  ch.stalled();
  await clock.run(clock.until(12_000));
  ch.setPresence("watching");
  await clock.run(clock.until(30_000));
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body.presence]),
    [
      [0, "away"],
      [5000, "away"],
      [10_000, "away"],
      [12_000, "watching"],
    ],
  );
  ch.close();
});

test("left is the last word; nothing goes after close", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const ch = channel(clock, rec);
  ch.setPresence("away");
  ch.leave({ beacon: true });
  ch.setPresence("watching");
  await clock.run(clock.until(20_000));
  assert.deepEqual(
    rec.sent.map((s) => [s.body.presence, s.via]),
    [
      ["away", "fetch"],
      ["left", "beacon"],
    ],
  );
  assert.throws(() => ch.setPace(0), /pace: must be/);
});

test("a hidden page stops the pacer, keeps the place, and the reply resumes where it was", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const page = new FakePage();
  const arrivals = Array.from({ length: 20 }, (_, i) => 100 + i * 50); // faster than 4 tokens/s
  const events = tokensAt(arrivals);
  events[events.length - 1] = [7000, finishChunk()]; // the stream stays open until 7 s
  const stream = paceStream(timedSource(clock, events), {
    clock,
    requestStart: 0,
    tds: 4,
    headers: new Headers({ "X-Request-Id": "req-7" }),
    readerSignals: { transport: rec, page },
  });
  void clock.until(1200).then(() => page.setHidden(true));
  void clock.until(6200).then(() => page.setHidden(false));
  const out = await collect(clock, stream);
  const shown = out.filter(([, c]) => textOf(c) !== "").map(([t]) => t);
  // 100, 350, ..., 1100 (5 tokens); away 1200-6200, when 150 ms of the fifth token's
  // reading time were left: the sixth goes out 150 ms after the return, the rest at the pace
  assert.deepEqual(shown.slice(0, 5), [100, 350, 600, 850, 1100]);
  assert.deepEqual(shown.slice(5, 8), [6350, 6600, 6850]);
  assert.equal(shown.length, 20);
  assert.deepEqual(stream.timeline?.away, [[1.2, 6.2]]);
  assert.equal(stream.qoe?.displayedFreezes?.count, 0);
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body.presence, s.body.buffer_tokens]),
    [
      [1200, "away", 15],
      [6200, "watching", 15],
    ],
  );
  assert.equal(page.listening, 0, "the page's events are let go when the stream ends");
});

test("a stall is told once the reader has read what was shown, and once per stall", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const stream = paceStream(timedSource(clock, tokensAt([100, 200, 3000, 3100])), {
    clock,
    requestStart: 0,
    tds: 4,
    headers: new Headers({ "X-Request-Id": "req-8" }),
    readerSignals: { transport: rec, page: null },
  });
  await collect(clock, stream);
  // shown at 100 and 350; read by 600; then the reader waits until 3000
  assert.deepEqual(
    rec.sent.map((s) => [s.at, s.body.presence, s.body.buffer_tokens]),
    [[600, "watching", 0]],
  );
});

test("the user's cancel sends left; the page closing sends left by beacon", async () => {
  const clock = new VirtualClock();
  const rec = new Recorder(clock);
  const page = new FakePage();
  const headers = new Headers({ "X-Request-Id": "req-9" });
  const cancelled = paceStream(timedSource(clock, tokensAt([100, 200])), { clock, headers, readerSignals: { transport: rec, page } });
  cancelled.abort();
  const closing = paceStream(timedSource(clock, tokensAt([100, 200])), { clock, headers, readerSignals: { transport: rec, page } });
  page.hide();
  closing.abort();
  assert.deepEqual(
    rec.sent.map((s) => [s.body.presence, s.via]),
    [
      ["left", "fetch"],
      ["left", "beacon"],
    ],
  );
});

test("a stream whose reader looked away reports when, and its freezes exclude it", async () => {
  const clock = new VirtualClock();
  const posted: unknown[] = [];
  const fetchFn = (async (_url: string, init: RequestInit) => {
    posted.push(JSON.parse(String(init.body)));
    return new Response("{}", { status: 200 });
  }) as unknown as typeof fetch;
  const stream = paceStream(timedSource(clock, tokensAt([100, 200, 5000, 5100])), {
    clock,
    requestStart: 0,
    tds: 4,
    headers: new Headers({ "X-Request-Id": "req-10", "X-TokenPace-Telemetry-Token": "tok" }),
    telemetry: { url: "http://gw/v1/tokenpace/telemetry", fetch: fetchFn },
    readerSignals: { page: null },
  });
  void clock.until(400).then(() => stream.setPresence("away"));
  void clock.until(5200).then(() => stream.setPresence("watching"));
  await collect(clock, stream);
  await stream.reported;
  const report = posted.find((p) => (p as { arrivals?: unknown }).arrivals !== undefined) as { away: TimeSpan[] };
  assert.deepEqual(report.away, [[0.4, 5.2]]);
  assert.equal(stream.qoe?.freezes?.count, 0, "the server's stall fell while the reader was away");
  const signals = posted.filter((p) => (p as { presence?: string }).presence !== undefined) as ReaderSignalBody[];
  assert.deepEqual(
    signals.map((s) => s.presence),
    ["away"],
    "the reply had fully arrived by the return: nothing more to tell the gateway",
  );
});

test("without a request id or an endpoint there is no channel, and the pacer still follows presence", async () => {
  const clock = new VirtualClock();
  const stream = paceStream(timedSource(clock, tokensAt([100, 200])), { clock, requestStart: 0, tds: 4, readerSignals: { page: null } });
  assert.equal(stream.readerChannel, undefined);
  stream.setPresence("away");
  void clock.until(1000).then(() => stream.setPresence("watching"));
  const out = await collect(clock, stream);
  assert.deepEqual(
    out.filter(([, c]) => textOf(c) !== "").map(([t]) => t),
    [1000, 1250],
  );
});
