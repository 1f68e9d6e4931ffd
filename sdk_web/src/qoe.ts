/**
 * QoE of a delivery timeline, a dependency-free copy of the project's formulas
 * (docs/qoe.md), checked against the shared test vectors `tests/vectors/qoe.json`.
 *
 * - The digestion schedule (recursion D): token k starts being read at
 *   d_k = max(t_k, d_(k-1) + 1/TDS); this is also the pacing buffer's release schedule.
 * - Andes QoE, Andes (Liu et al.) §3.1 Eq. 1: the area under the digested curve over the
 *   area under the expected curve, both up to the last token's arrival.
 * - Monotone QoE: E / (E + deficit), which delaying a token can never raise.
 * - Freezes: display gaps beyond the reader's pace, (d_k − d_(k−1)) − 1/TDS > 1e-6 s; the
 *   wait for the first token is not one. Only those seen while the reader watches count:
 *   the display stands still while they are away, so the rule runs on watched time
 *   (`watchedTimes`, checked against `tests/vectors/signals.json`).
 * - User idle latency, Wang et al., "Revisiting SLOs and System Level Metrics in LLM
 *   Serving", Eq. 9: max_i (t_i − (TTFT + (i−1)/TDS))⁺.
 *
 * Times are seconds since the request was sent.
 */
import type { Expectation, Freezes, QoE, Timeline, TimelineEntry, TimeSpan } from "./types.js";

/** Per-token arrival times of a `[time, tokens]` timeline; throws `RangeError` on bad input. */
export function tokenTimes(timeline: readonly TimelineEntry[]): number[] {
  if (timeline.length === 0) throw new RangeError("timeline: empty; a reply needs at least one token");
  const times: number[] = [];
  let previous = 0;
  for (const [t, n] of timeline) {
    if (!Number.isFinite(t) || t < 0) throw new RangeError(`timeline: time ${t} is not a finite number >= 0`);
    if (t < previous) throw new RangeError(`timeline: time ${t} comes after ${previous}; times must not decrease`);
    if (!Number.isInteger(n) || n <= 0) throw new RangeError(`timeline: token count ${n} is not a positive integer`);
    for (let i = 0; i < n; i++) times.push(t);
    previous = t;
  }
  return times;
}

function checkExpectation({ ttft, tds }: Expectation): void {
  if (!Number.isFinite(ttft) || ttft < 0) throw new RangeError(`ttft: must be a finite number >= 0, got ${ttft}`);
  if (!Number.isFinite(tds) || tds <= 0) throw new RangeError(`tds: must be a finite number > 0, got ${tds}`);
}

/**
 * Digestion start of every token (recursion D), in its closed form
 * d_k = k/TDS + max_(j<=k)(t_j - j/TDS) (k from 0), tokens held until `holdUntil`.
 */
export function digestionStarts(times: readonly number[], tds: number, holdUntil = 0): number[] {
  const starts: number[] = [];
  let best = -Infinity;
  times.forEach((t, k) => {
    const offset = k / tds;
    best = Math.max(best, Math.max(t, holdUntil) - offset);
    starts.push(offset + best);
  });
  return starts;
}

/** ∫_0^until of a token's digestion ramp (0 at `start`, 1 at start + 1/TDS). */
function digestedArea(start: number, until: number, tds: number): number {
  const u = Math.max(until - start, 0);
  return u <= 1 / tds ? 0.5 * tds * u * u : u - 0.5 / tds;
}

/** ∫_0^until min(T(t), l) dt with T(t) = TDS·(t - TTFT)⁺: the denominator of Andes Eq. 1. */
function expectedArea(until: number, { ttft, tds }: Expectation, length: number): number {
  const u = Math.max(until - ttft, 0);
  const ramp = length / tds;
  return u <= ramp ? 0.5 * tds * u * u : 0.5 * length * ramp + length * (u - ramp);
}

/** Andes QoE, Andes (Liu et al.) §3.1 Eq. 1, clamped to [0, 1]; 1 if the reply ends by the TTFT. */
export function andesQoE(timeline: readonly TimelineEntry[], expected: Expectation): number {
  const times = tokenTimes(timeline);
  checkExpectation(expected);
  const ttlt = times[times.length - 1] as number;
  const sExpected = expectedArea(ttlt, expected, times.length);
  if (sExpected <= 0) return 1;
  let sActual = 0;
  for (const start of digestionStarts(times, expected.tds)) sActual += digestedArea(start, ttlt, expected.tds);
  return Math.min(Math.max(sActual / sExpected, 0), 1);
}

/**
 * Monotone QoE (docs/qoe.md): E / (E + deficit), E = l²/(2·TDS), deficit = Σ_k (d'_k − e_k)
 * with d' the digestion starts of the arrivals held until the expected TTFT and
 * e_k = TTFT + k/TDS the schedule. In (0, 1]; delaying a token never raises it.
 */
export function monotoneQoE(timeline: readonly TimelineEntry[], expected: Expectation): number {
  const times = tokenTimes(timeline);
  checkExpectation(expected);
  const { ttft, tds } = expected;
  let deficit = 0;
  digestionStarts(times, tds, ttft).forEach((start, k) => {
    deficit += start - (ttft + k / tds);
  });
  const area = (times.length * times.length) / (2 * tds);
  return area / (area + deficit);
}

/** Display gaps up to this much beyond the reader's pace (s) are float noise, not freezes. */
export const FREEZE_EPSILON_S = 1e-6;

/**
 * (d_k − d_(k−1)) − 1/TDS for k = 2..n, d the digestion starts of `times`: how long the
 * reader waited before each token after the first, beyond its own pace (s).
 */
export function displayGaps(times: readonly number[], tds: number): number[] {
  const starts = digestionStarts(times, tds);
  return starts.slice(1).map((d, k) => d - (starts[k] as number) - 1 / tds);
}

/**
 * When the reader of `timeline` was frozen: `[from, to]` in seconds since the request, one
 * span per display gap beyond the pace (`to` is when the next token was shown).
 */
export function freezeSpans(timeline: readonly TimelineEntry[], tds: number): Array<[from: number, to: number]> {
  const times = tokenTimes(timeline);
  checkExpectation({ ttft: 0, tds });
  const starts = digestionStarts(times, tds);
  const spans: Array<[number, number]> = [];
  displayGaps(times, tds).forEach((gap, k) => {
    const to = starts[k + 1] as number;
    if (gap > FREEZE_EPSILON_S) spans.push([to - gap, to]);
  });
  return spans;
}

/**
 * `times` on the reader's watched clock: the time spent `away` before each taken out; a
 * token that arrives while the reader is away is there when they come back
 * (`qos.metrics.watched_times`). `away`: spans in time order, not overlapping.
 */
export function watchedTimes(times: readonly number[], away: readonly TimeSpan[] = []): number[] {
  let previousEnd = -Infinity;
  for (const [start, end] of away) {
    if (!Number.isFinite(start) || !Number.isFinite(end) || end < start) {
      throw new RangeError(`away: each span must be [start, end] with end >= start, finite; got [${start}, ${end}]`);
    }
    if (start < previousEnd) throw new RangeError("away: spans must be in time order and must not overlap");
    previousEnd = end;
  }
  if (away.length === 0) return [...times];
  return times.map((t) => t - away.reduce((done, [start, end]) => done + Math.min(Math.max(t - start, 0), end - start), 0));
}

/**
 * The freezes of `timeline` shown by the release rule (recursion D) at `tds`: the longest,
 * how many, and the time frozen in all. The wait for the first token is the TTFT, not a
 * freeze; from the first token on, the reader is frozen whenever the next token is not
 * there when the previous one has been read. `away`: spans the reader was away; only the
 * freezes seen while watching count.
 */
export function freezes(timeline: readonly TimelineEntry[], tds: number, away: readonly TimeSpan[] = []): Freezes {
  const times = watchedTimes(tokenTimes(timeline), away);
  checkExpectation({ ttft: 0, tds });
  let longestS = 0;
  let count = 0;
  let totalS = 0;
  for (const gap of displayGaps(times, tds)) {
    if (gap <= FREEZE_EPSILON_S) continue;
    longestS = Math.max(longestS, gap);
    count++;
    totalS += gap;
  }
  return { longestS, count, totalS };
}

/**
 * User idle latency, Wang et al. Eq. 9: max_i (t_i − d_i)⁺ with deadlines
 * d_i = TTFT + (i−1)/TDS; the same for the arrivals and for their release by recursion D.
 */
export function userIdleLatency(timeline: readonly TimelineEntry[], expected: Expectation): number {
  const times = tokenTimes(timeline);
  checkExpectation(expected);
  const { ttft, tds } = expected;
  return times.reduce((idle, t, k) => Math.max(idle, t - (ttft + k / tds)), 0);
}

/** What `timelineQoE` gives for one timeline. */
interface Scores {
  andes: number;
  monotone: number;
  freezes: Freezes | undefined;
  idleS: number | undefined;
}

function scores(timeline: readonly TimelineEntry[], expected: Expectation, away: readonly TimeSpan[]): Scores {
  if (timeline.length === 0) return { andes: 0, monotone: 0, freezes: undefined, idleS: undefined };
  return {
    andes: andesQoE(timeline, expected),
    monotone: monotoneQoE(timeline, expected),
    freezes: freezes(timeline, expected.tds, away),
    idleS: userIdleLatency(timeline, expected),
  };
}

/**
 * Both timelines scored: both QoEs (an empty timeline scores 0, as at the gateway), the
 * freezes seen while watching and the user idle latency (undefined for an empty timeline).
 */
export function timelineQoE(timeline: Timeline, expected: Expectation): QoE {
  const away = timeline.away ?? [];
  const arrived = scores(timeline.arrivals, expected, away);
  const shown = scores(timeline.displayed, expected, away);
  return {
    andes: arrived.andes,
    monotone: arrived.monotone,
    displayedAndes: shown.andes,
    displayedMonotone: shown.monotone,
    freezes: arrived.freezes,
    idleS: arrived.idleS,
    displayedFreezes: shown.freezes,
    displayedIdleS: shown.idleS,
  };
}
