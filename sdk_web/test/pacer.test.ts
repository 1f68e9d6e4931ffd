import assert from "node:assert/strict";
import { test } from "node:test";
import { Pacer } from "../src/pacer.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { contentChunk, finishChunk, textOf } from "./helpers.js";

/** Every chunk due by `now`. */
function popAll(pacer: Pacer<ChatCompletionChunk>, now: number): string[] {
  const out: string[] = [];
  for (let chunk = pacer.pop(now); chunk !== undefined; chunk = pacer.pop(now)) out.push(textOf(chunk));
  return out;
}

test("the pacer alone: due chunks at the times the schedule gives, no clock of its own", () => {
  const pacer = new Pacer<ChatCompletionChunk>({ tds: 10, unit: "token", end: "drain", start: 0 });
  for (const word of [" a", " b", " c"]) pacer.arrive(contentChunk(word), 200);
  assert.deepEqual(popAll(pacer, 200), [" a"], "the first token as it arrives");
  assert.equal(pacer.nextRelease(200), 300, "the next 1/TDS later");
  assert.deepEqual(popAll(pacer, 299), []);
  assert.deepEqual(popAll(pacer, 300), [" b"]);
  pacer.arrive(finishChunk(), 310);
  pacer.end(310);
  assert.ok(!pacer.drained);
  assert.deepEqual(popAll(pacer, 400), [" c", ""], "the finish chunk follows the last token at once");
  assert.ok(pacer.drained);
  assert.deepEqual(pacer.timeline(0), {
    arrivals: [
      [0.2, 1],
      [0.2, 1],
      [0.2, 1],
    ],
    displayed: [
      [0.2, 1],
      [0.3, 1],
      [0.4, 1],
    ],
  });
});

test("end: flush releases what is left at the end", () => {
  const pacer = new Pacer<ChatCompletionChunk>({ tds: 1, unit: "word", end: "flush", start: 0 });
  pacer.arrive(contentChunk("one two six", 3), 0);
  assert.deepEqual(popAll(pacer, 0), ["one "]);
  assert.equal(pacer.nextRelease(0), 1000);
  pacer.end(50);
  assert.equal(pacer.nextRelease(50), 50);
  assert.deepEqual(popAll(pacer, 50), ["two ", "", "six"], "the words complete so far, the chunk's usage on its own, then the last word");
});

test("bad options and bad chunks are named", () => {
  assert.throws(() => new Pacer({ tds: 0, unit: "token", end: "drain", start: 0 }), /tds/);
  assert.throws(() => new Pacer({ tds: 1, unit: "line" as "word", end: "drain", start: 0 }), /unit/);
  assert.throws(() => new Pacer({ tds: 1, unit: "word", end: "stop" as "flush", start: 0 }), /end/);
  const pacer = new Pacer<ChatCompletionChunk>({ tds: 1, unit: "token", end: "drain", start: 0 });
  assert.throws(() => pacer.arrive({ nope: 1 } as unknown as ChatCompletionChunk, 0), /choices/);
});
