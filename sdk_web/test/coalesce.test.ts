import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { ceilMicroseconds, coalesce, reportTimeline } from "../src/coalesce.js";
import { monotoneQoE } from "../src/qoe.js";
import { buildReport, MAX_BODY_BYTES, MAX_POINTS } from "../src/telemetry.js";
import type { TimelineEntry } from "../src/types.js";
import { REPO_ROOT } from "./helpers.js";

/** The shared rule's vectors, generated from the Python client (scripts/make_coalesce_vectors.py). */
const vectors = JSON.parse(readFileSync(join(REPO_ROOT, "tests/vectors/coalesce.json"), "utf8")) as {
  coalesce: Array<{ name: string; timeline: TimelineEntry[]; limit: number; coalesced: TimelineEntry[] }>;
  rounding: Array<[number, number]>;
};

test("the shared coalescing vectors", () => {
  assert.ok(vectors.coalesce.length >= 20, `only ${vectors.coalesce.length} vectors`);
  for (const v of vectors.coalesce) assert.deepEqual(coalesce(v.timeline, v.limit), v.coalesced, v.name);
});

test("the shared rounding vectors", () => {
  assert.ok(vectors.rounding.length >= 50, `only ${vectors.rounding.length} vectors`);
  for (const [seconds, up] of vectors.rounding) assert.equal(ceilMicroseconds(seconds), up, `${seconds}`);
});

test("the coalescing rule: the first entry alone, the rest in L - 1 runs at their last time", () => {
  const timeline: TimelineEntry[] = Array.from({ length: 10 }, (_, i) => [i + 1, i + 1]);
  // L = 4: entry 0 alone; the 9 others in 3 runs: rest[0..2], rest[3..5], rest[6..8]
  assert.deepEqual(coalesce(timeline, 4), [
    [1, 1],
    [4, 2 + 3 + 4],
    [7, 5 + 6 + 7],
    [10, 8 + 9 + 10],
  ]);
  // 8 others in 3 runs: floor(j·8/3): 0, 2, 5, 8
  assert.deepEqual(coalesce(timeline.slice(0, 9), 4), [
    [1, 1],
    [3, 2 + 3],
    [6, 4 + 5 + 6],
    [9, 7 + 8 + 9],
  ]);
  assert.deepEqual(coalesce(timeline, 10), timeline, "at the limit: unchanged");
  assert.throws(() => coalesce(timeline, 1), /limit/);
});

test("times are rounded up to the microsecond, never earlier than measured", () => {
  for (const t of [0.1, 0.4123456, 1.0000001, 2.5, 1234.5678901]) {
    const r = ceilMicroseconds(t);
    assert.ok(r >= t, `${r} < ${t}`);
    assert.ok(r - t < 1.000001e-6, `${r} too far from ${t}`);
    assert.ok(Number.isInteger(Math.round(r * 1e6)) && Math.abs(r * 1e6 - Math.round(r * 1e6)) < 1e-6);
  }
  assert.deepEqual(reportTimeline([[0.4123451, 1]], 10), [[0.412346, 1]]);
  assert.equal(ceilMicroseconds(0.412), 0.412, "a time already on the microsecond is kept");
});

test("a 20,000-token reply reports under 64 KiB, and coalescing never flatters the QoE", () => {
  const expected = { ttft: 1.0, tds: 4.8 };
  const arrivals: TimelineEntry[] = [];
  const displayed: TimelineEntry[] = [];
  for (let k = 0; k < 20000; k++) {
    arrivals.push([0.523417 + k * 0.0123457 + (k % 97 === 96 ? 0.8 : 0), 1]);
    displayed.push([0.523417 + k / 4.8 + 0.0000004, 1]);
  }
  for (let k = 1; k < 20000; k++) {
    const a = arrivals[k] as TimelineEntry;
    a[0] = Math.max(a[0], (arrivals[k - 1] as TimelineEntry)[0]);
  }
  const report = buildReport("0123456789abcdef0123456789abcdef", expected, { arrivals, displayed }, "completed");
  const body = JSON.stringify({ ...report, telemetry_token: "t".repeat(300) });
  const bytes = new TextEncoder().encode(body).length;
  assert.ok(bytes < MAX_BODY_BYTES, `${bytes} bytes`);
  assert.equal(report.arrivals.length, MAX_POINTS);
  assert.equal(report.displayed.length, MAX_POINTS);
  assert.deepEqual(report.arrivals[0], [0.523417, 1], "the first token's arrival stays alone");
  const tokens = (t: TimelineEntry[]): number => t.reduce((n, [, c]) => n + c, 0);
  assert.equal(tokens(report.arrivals), 20000);
  assert.equal(tokens(report.displayed), 20000);
  assert.ok(monotoneQoE(report.arrivals, expected) <= monotoneQoE(arrivals, expected));
  assert.ok(monotoneQoE(report.displayed, expected) <= monotoneQoE(displayed, expected));
});
