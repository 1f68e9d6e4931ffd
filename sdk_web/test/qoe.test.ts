import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { andesQoE, digestionStarts, monotoneQoE, tokenTimes } from "../src/qoe.js";
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

test("bad timelines and expectations are refused with a message that names the problem", () => {
  assert.throws(() => andesQoE([], { ttft: 1, tds: 4.8 }), /empty/);
  assert.throws(() => andesQoE([[2, 1], [1, 1]], { ttft: 1, tds: 4.8 }), /must not decrease/);
  assert.throws(() => monotoneQoE([[1, 0]], { ttft: 1, tds: 4.8 }), /positive integer/);
  assert.throws(() => monotoneQoE([[-1, 1]], { ttft: 1, tds: 4.8 }), /finite number >= 0/);
  assert.throws(() => andesQoE([[1, 1]], { ttft: 1, tds: 0 }), /tds/);
  assert.throws(() => andesQoE([[1, 1]], { ttft: Number.NaN, tds: 1 }), /ttft/);
});
