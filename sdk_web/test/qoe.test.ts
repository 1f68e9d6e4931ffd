import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { andesQoE, digestionStarts, freezes, freezeSpans, monotoneQoE, timelineQoE, tokenTimes, userIdleLatency } from "../src/qoe.js";
import { releaseTimes } from "../src/schedule.js";
import type { TimelineEntry } from "../src/types.js";
import { close, REPO_ROOT } from "./helpers.js";

interface Vector {
  name: string;
  timeline: TimelineEntry[];
  ttft: number;
  tds: number;
  andes: number;
  monotone: number;
  digestion: number[];
  freezes: { longest_s: number; count: number; total_s: number };
  idle: number;
}

const vectors: Vector[] = JSON.parse(readFileSync(join(REPO_ROOT, "tests/vectors/qoe.json"), "utf8")).vectors;

test("the shared vector file is read", () => {
  assert.ok(vectors.length >= 30, `only ${vectors.length} vectors`);
});

for (const v of vectors) {
  test(`QoE vector ${v.name}`, () => {
    const expected = { ttft: v.ttft, tds: v.tds };
    const andes = andesQoE(v.timeline, expected);
    const monotone = monotoneQoE(v.timeline, expected);
    assert.ok(close(andes, v.andes), `andes ${andes} != ${v.andes}`);
    assert.ok(close(monotone, v.monotone), `monotone ${monotone} != ${v.monotone}`);
    const starts = digestionStarts(tokenTimes(v.timeline), v.tds);
    assert.equal(starts.length, v.digestion.length);
    starts.forEach((d, k) => assert.ok(close(d, v.digestion[k] as number), `d_${k} ${d} != ${v.digestion[k]}`));
    const frozen = freezes(v.timeline, v.tds);
    assert.equal(frozen.count, v.freezes.count);
    assert.ok(close(frozen.longestS, v.freezes.longest_s), `longest freeze ${frozen.longestS} != ${v.freezes.longest_s}`);
    assert.ok(close(frozen.totalS, v.freezes.total_s), `time frozen ${frozen.totalS} != ${v.freezes.total_s}`);
    const spans = freezeSpans(v.timeline, v.tds);
    assert.equal(spans.length, v.freezes.count);
    const longest = Math.max(0, ...spans.map(([from, to]) => to - from));
    assert.ok(close(longest, v.freezes.longest_s), `longest span ${longest} != ${v.freezes.longest_s}`);
    const idle = userIdleLatency(v.timeline, expected);
    assert.ok(close(idle, v.idle), `idle ${idle} != ${v.idle}`);
  });

  test(`release schedule follows the digestion schedule: ${v.name}`, () => {
    const times = tokenTimes(v.timeline);
    const released = releaseTimes(
      times.map((t) => t * 1000),
      times.map(() => 1),
      v.tds,
    );
    released.forEach((r, k) => assert.ok(close(r / 1000, v.digestion[k] as number), `token ${k}: ${r / 1000} != ${v.digestion[k]}`));
  });
}

test("the vectors hold replies that froze and replies that never did", () => {
  const counts = vectors.map((v) => v.freezes.count);
  assert.ok(counts.some((n) => n > 0) && counts.some((n) => n === 0));
});

test("a freeze span runs from when the reader finished the last token to when the next was shown", () => {
  // two tokens at 1 s, two at 3 s, read at 2 tokens/s: frozen from 2 s (1 + 2/TDS) to 3 s
  const timeline: TimelineEntry[] = [
    [1, 2],
    [3, 2],
  ];
  assert.deepEqual(freezeSpans(timeline, 2), [[2, 3]]);
  assert.deepEqual(freezes(timeline, 2), { longestS: 1, count: 1, totalS: 1 });
  assert.equal(userIdleLatency(timeline, { ttft: 1, tds: 2 }), 1); // token 3 was due at 2 s
});

test("the QoE of both timelines carries their freezes and idle latency; an empty one has none", () => {
  const qoe = timelineQoE({ arrivals: [[1, 2], [3, 2]], displayed: [] }, { ttft: 1, tds: 2 });
  assert.deepEqual(qoe.freezes, { longestS: 1, count: 1, totalS: 1 });
  assert.equal(qoe.idleS, 1);
  assert.equal(qoe.displayedAndes, 0);
  assert.equal(qoe.displayedFreezes, undefined);
  assert.equal(qoe.displayedIdleS, undefined);
});

test("bad timelines and expectations are refused with a message that names the problem", () => {
  assert.throws(() => andesQoE([], { ttft: 1, tds: 4.8 }), /empty/);
  assert.throws(() => andesQoE([[2, 1], [1, 1]], { ttft: 1, tds: 4.8 }), /must not decrease/);
  assert.throws(() => monotoneQoE([[1, 0]], { ttft: 1, tds: 4.8 }), /positive integer/);
  assert.throws(() => monotoneQoE([[-1, 1]], { ttft: 1, tds: 4.8 }), /finite number >= 0/);
  assert.throws(() => andesQoE([[1, 1]], { ttft: 1, tds: 0 }), /tds/);
  assert.throws(() => andesQoE([[1, 1]], { ttft: Number.NaN, tds: 1 }), /ttft/);
  assert.throws(() => freezes([[1, 1]], 0), /tds/);
  assert.throws(() => freezeSpans([], 4.8), /empty/);
  assert.throws(() => userIdleLatency([], { ttft: 1, tds: 4.8 }), /empty/);
});
