import assert from "node:assert/strict";
import { test } from "node:test";
import { parseQueueNotice } from "../src/queue.js";

test("queue notices are parsed as the protocol defines them", () => {
  const cases: Array<[string, { position: number; etaS: number } | undefined]> = [
    [" queued position=3 eta_s=2.5", { position: 3, etaS: 2.5 }],
    [" queued position=1 eta_s=0", { position: 1, etaS: 0 }],
    ["queued position=12 eta_s=1e1", { position: 12, etaS: 10 }],
    [" queued position=2 tier=chat eta_s=4.", { position: 2, etaS: 4 }], // unknown fields skipped
    [" ping", undefined],
    ["", undefined],
    [" queued", undefined],
    [" queued position=2", undefined],
    [" queued eta_s=1.0", undefined],
    [" queued position=0 eta_s=1.0", undefined], // positions count from 1
    [" queued position=-1 eta_s=1.0", undefined],
    [" queued position=1.5 eta_s=1.0", undefined],
    [" queued position=1 eta_s=-1", undefined],
    [" queued position=1 eta_s=NaN", undefined],
    [" queued position=1 eta_s=Infinity", undefined],
    [" queued position=1 eta_s=1e999", undefined], // not finite
    [" queued position=0x10 eta_s=1", undefined],
    [" queued position=1 eta_s=", undefined],
    [" queuedposition=1 eta_s=1", undefined],
    [" waiting position=1 eta_s=1", undefined],
  ];
  for (const [comment, notice] of cases) assert.deepEqual(parseQueueNotice(comment), notice, JSON.stringify(comment));
});
