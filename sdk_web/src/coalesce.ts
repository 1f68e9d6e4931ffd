/**
 * Bounding a timeline for the telemetry report, by the coalescing rule both SDKs share
 * (docs/protocol.md, "SDK → gateway: QoE telemetry").
 *
 * A timeline of n > L entries becomes L entries: the first entry (the first token's
 * arrival) stays alone, and the other n − 1 are cut into L − 1 runs of consecutive
 * entries, run j holding entries floor(j·m/(L−1)) … floor((j+1)·m/(L−1)) − 1 of them
 * (m = n − 1). A run is reported at the time of its LAST entry with the sum of its
 * counts, so coalescing only moves tokens later: the QoE the gateway recomputes can only
 * be lower than the true one, never flattered. Times are then rounded UP to the
 * microsecond, never earlier than measured.
 */
import type { TimelineEntry } from "./types.js";

/** The timeline cut to at most `limit` entries (`limit` >= 2) by the rule above. */
export function coalesce(timeline: readonly TimelineEntry[], limit: number): TimelineEntry[] {
  if (!Number.isInteger(limit) || limit < 2) throw new RangeError(`limit: must be an integer >= 2, got ${limit}`);
  const n = timeline.length;
  if (n <= limit) return timeline.map(([t, c]) => [t, c]);
  const [first, ...rest] = timeline as [TimelineEntry, ...TimelineEntry[]];
  const out: TimelineEntry[] = [[first[0], first[1]]];
  const runs = limit - 1;
  for (let j = 0; j < runs; j++) {
    const from = Math.floor((j * rest.length) / runs);
    const to = Math.floor(((j + 1) * rest.length) / runs);
    let tokens = 0;
    for (let i = from; i < to; i++) tokens += (rest[i] as TimelineEntry)[1];
    out.push([(rest[to - 1] as TimelineEntry)[0], tokens]);
  }
  return out;
}

/** Seconds rounded up to the microsecond, as the report writes them (never earlier than measured). */
export function ceilMicroseconds(seconds: number): number {
  const rounded = Math.round(seconds * 1e6) / 1e6;
  return rounded >= seconds ? rounded : (Math.round(rounded * 1e6) + 1) / 1e6;
}

/** A timeline as the report carries it: coalesced to `limit` entries, times rounded up. */
export function reportTimeline(timeline: readonly TimelineEntry[], limit: number): TimelineEntry[] {
  return coalesce(timeline, limit).map(([t, c]) => [ceilMicroseconds(t), c]);
}
