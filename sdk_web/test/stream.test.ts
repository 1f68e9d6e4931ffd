import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { paceStream } from "../src/stream.js";
import { tokenTimes } from "../src/qoe.js";
import type { ChatCompletionChunk, TimelineEntry } from "../src/types.js";
import {
  close,
  collect,
  contentChunk,
  finishChunk,
  REPO_ROOT,
  roleChunk,
  textOf,
  timedSource,
  VirtualClock,
} from "./helpers.js";

/** Tokens arriving at `times` (ms), one a chunk, between a role and a finish chunk. */
function tokensAt(times: number[], words?: string[]): Array<[number, ChatCompletionChunk]> {
  const first = times[0] ?? 0;
  return [
    [first, roleChunk()],
    ...times.map((t, i): [number, ChatCompletionChunk] => [t, contentChunk(words?.[i] ?? ` w${i}`)]),
    [times[times.length - 1] ?? 0, finishChunk()],
  ];
}

test("a server faster than TDS: the first token at once, then one every 1/TDS", async () => {
  const clock = new VirtualClock();
  const stream = paceStream(timedSource(clock, tokensAt([300, 310, 320, 330, 340])), { clock, requestStart: 0, tds: 10 });
  const out = await collect(clock, stream);
  const tokens = out.filter(([, c]) => textOf(c) !== "");
  assert.deepEqual(
    tokens.map(([t]) => t),
    [300, 400, 500, 600, 700],
  );
  assert.deepEqual(stream.timeline?.displayed, [
    [0.3, 1],
    [0.4, 1],
    [0.5, 1],
    [0.6, 1],
    [0.7, 1],
  ]);
  assert.deepEqual(
    stream.timeline?.arrivals.map(([t]) => t),
    [0.3, 0.31, 0.32, 0.33, 0.34],
  );
  assert.equal(out[0]?.[1].choices[0]?.delta?.["role"], "assistant", "the role chunk goes out first, undelayed");
  assert.equal(out[0]?.[0], 300);
  assert.equal(out.at(-1)?.[1].choices[0]?.finish_reason, "stop");
  assert.equal(out.at(-1)?.[0], 700, "the finish chunk follows the last token at once");
  assert.equal(stream.outcome, "completed");
});

test("a server slower than TDS adds no delay", async () => {
  const clock = new VirtualClock();
  const arrivals = [1000, 1500, 2100, 2600];
  const stream = paceStream(timedSource(clock, tokensAt(arrivals)), { clock, requestStart: 0, tds: 4 });
  const out = await collect(clock, stream);
  assert.deepEqual(
    out.filter(([, c]) => textOf(c) !== "").map(([t]) => t),
    arrivals,
  );
  assert.equal(stream.qoe?.displayedMonotone, stream.qoe?.monotone);
});

test("release times are the digestion schedule of the shared vectors, chunks of several tokens split", async () => {
  const vectors = JSON.parse(readFileSync(join(REPO_ROOT, "tests/vectors/qoe.json"), "utf8")).vectors as Array<{
    name: string;
    timeline: TimelineEntry[];
    tds: number;
    ttft: number;
    digestion: number[];
    freezes: { longest_s: number; count: number };
    idle: number;
  }>;
  for (const v of vectors) {
    const clock = new VirtualClock();
    let counted = 0;
    const events = v.timeline.map(([t, n]): [number, ChatCompletionChunk] => {
      counted += n;
      const words = Array.from({ length: n }, (_, i) => ` t${i}`).join("");
      return [t * 1000, contentChunk(words, counted)];
    });
    const stream = paceStream(timedSource(clock, events), { clock, requestStart: 0, tds: v.tds, ttft: v.ttft });
    const out = (await collect(clock, stream)).filter(([, c]) => textOf(c) !== "");
    assert.equal(out.length, v.digestion.length, `${v.name}: one chunk a token`);
    out.forEach(([at], k) =>
      assert.ok(close(at / 1000, v.digestion[k] as number), `${v.name} token ${k}: ${at / 1000} != ${v.digestion[k]}`),
    );
    assert.equal(out.map(([, c]) => textOf(c)).join(""), events.map(([, c]) => textOf(c)).join(""));
    const arrivals = stream.timeline?.arrivals ?? [];
    assert.deepEqual(
      arrivals.map(([, n]) => n),
      v.timeline.map(([, n]) => n),
      `${v.name}: arrivals as received`,
    );
    arrivals.forEach(([t], i) => assert.ok(close(t, (v.timeline[i] as TimelineEntry)[0]), `${v.name}: arrival ${i}`));
    assert.deepEqual(
      tokenTimes(stream.timeline?.displayed ?? []).map((t) => Math.round(t * 1e9)),
      v.digestion.map((t) => Math.round(t * 1e9)),
    );
    // the QoE's freezes and idle latency: of the arrivals, the vector's; of what was shown
    // (times rounded up to the microsecond), the same within that rounding
    const qoe = stream.qoe;
    assert.equal(qoe?.freezes?.count, v.freezes.count, `${v.name}: freezes of the arrivals`);
    assert.equal(qoe?.displayedFreezes?.count, v.freezes.count, `${v.name}: freezes of what was shown`);
    assert.ok(close(qoe?.freezes?.longestS ?? NaN, v.freezes.longest_s), `${v.name}: longest freeze`);
    assert.ok(Math.abs((qoe?.displayedFreezes?.longestS ?? NaN) - v.freezes.longest_s) < 2e-6, `${v.name}: longest shown`);
    assert.ok(close(qoe?.idleS ?? NaN, v.idle), `${v.name}: idle latency`);
    assert.ok(Math.abs((qoe?.displayedIdleS ?? NaN) - v.idle) < 2e-6, `${v.name}: idle latency of what was shown`);
  }
});

test("a chunk of several tokens (running usage) becomes copies of one token each", async () => {
  const clock = new VirtualClock();
  const chunk = contentChunk("Hello world!", 3);
  const stream = paceStream(timedSource(clock, [[0, chunk]]), { clock, requestStart: 0, tds: 2 });
  const out = await collect(clock, stream);
  const pieces = out.filter(([, c]) => textOf(c) !== "");
  assert.deepEqual(
    pieces.map(([t, c]) => [t, textOf(c)]),
    [
      [0, "Hel"],
      [500, "lo "],
      [1000, "world!"],
    ],
  );
  for (const [, c] of pieces) {
    assert.notEqual(c, chunk, "a copy, not the source chunk");
    assert.equal(c.id, chunk.id);
    assert.equal(c.usage, null, "the running usage stays on the source chunk's rest");
  }
  const rest = out.at(-1)?.[1];
  assert.deepEqual(rest?.usage, { completion_tokens: 3 });
  assert.equal(textOf(rest as ChatCompletionChunk), "");
});

test("single-token chunks go out as the same objects", async () => {
  const clock = new VirtualClock();
  const events = tokensAt([0, 1, 2]);
  const out = await collect(clock, paceStream(timedSource(clock, events), { clock, tds: 100 }));
  assert.deepEqual(
    out.map(([, c]) => c),
    events.map(([, c]) => c),
  );
});

test("the network is read at once, whatever the consumer's speed (no back-pressure)", async () => {
  const clock = new VirtualClock();
  const pulled: number[] = [];
  async function* source(): AsyncGenerator<ChatCompletionChunk> {
    for (let i = 0; i < 5; i++) {
      await clock.until(i * 10);
      pulled.push(clock.now());
      yield contentChunk(` w${i}`);
    }
  }
  const stream = paceStream(source(), { clock, requestStart: 0, tds: 1 });
  await clock.run(clock.until(5000)); // nobody consumes for 5 s
  assert.deepEqual(pulled, [0, 10, 20, 30, 40]);
  const out = await collect(clock, stream);
  assert.deepEqual(
    stream.timeline?.arrivals.map(([t]) => t),
    [0, 0.01, 0.02, 0.03, 0.04],
  );
  assert.deepEqual(
    out.map(([t]) => t),
    [5000, 6000, 7000, 8000, 9000],
    "released when asked for, then paced",
  );
});

test("end: drain keeps pacing after the reply ends, flush releases the rest at once", async () => {
  const arrivals = [0, 10, 20, 30, 40, 50];
  const released = async (end: "drain" | "flush"): Promise<number[]> => {
    const clock = new VirtualClock();
    const events = arrivals.map((t, i): [number, ChatCompletionChunk] => [t, contentChunk(` w${i}`)]);
    const stream = paceStream(timedSource(clock, events), { clock, requestStart: 0, tds: 10, end });
    return (await collect(clock, stream)).map(([t]) => t);
  };
  assert.deepEqual(await released("drain"), [0, 100, 200, 300, 400, 500]);
  assert.deepEqual(await released("flush"), [0, 50, 50, 50, 50, 50]);
});

test("unit word: whole words, a word of n tokens takes n/TDS", async () => {
  const clock = new VirtualClock();
  const events: Array<[number, ChatCompletionChunk]> = [
    [0, contentChunk("Hello")],
    [1, contentChunk(" wonder")],
    [2, contentChunk("ful")],
    [3, contentChunk(" world")],
    [4, contentChunk(".")],
    [5, finishChunk()],
  ];
  const stream = paceStream(timedSource(clock, events), { clock, requestStart: 0, tds: 10, unit: "word" });
  const out = await collect(clock, stream);
  assert.deepEqual(
    out.map(([t, c]) => [t, textOf(c), c.choices[0]?.finish_reason]),
    [
      [1, "Hello ", null], // complete once " wonder" began
      [101, "wonderful ", null], // 2 tokens: the next word waits 200 ms
      [301, "world.", null], // flushed by the finish chunk at 5
      [301, "", "stop"],
    ],
  );
  assert.deepEqual(stream.timeline?.displayed, [
    [0.001, 1],
    [0.101, 2],
    [0.301, 2],
  ]);
});

test("unit sentence: a sentence goes out once complete and once the previous one had its time", async () => {
  const clock = new VirtualClock();
  const tokens = ["Hi", " there", ".", " How", " are", " you", "?", " Fine", "."];
  const events = tokens.map((w, i): [number, ChatCompletionChunk] => [i * 10, contentChunk(w)]);
  const stream = paceStream(timedSource(clock, events), { clock, requestStart: 0, tds: 10, unit: "sentence" });
  const out = await collect(clock, stream);
  assert.deepEqual(
    out.map(([t, c]) => [t, textOf(c)]),
    [
      [30, "Hi there. "], // complete when " How" arrived at 30 ms; 3 tokens
      [330, "How are you? "], // 300 ms after: the first sentence's speaking time
      [730, "Fine."], // 4 tokens later
    ],
  );
});

test("a sentence of a slow server goes out when complete", async () => {
  const clock = new VirtualClock();
  const events: Array<[number, ChatCompletionChunk]> = [
    [0, contentChunk("One.")],
    [2000, contentChunk(" Two.")],
  ];
  const out = await collect(clock, paceStream(timedSource(clock, events), { clock, tds: 10, unit: "sentence" }));
  assert.deepEqual(
    out.map(([t, c]) => [t, textOf(c)]),
    [
      [2000, "One. "], // complete once " Two." began
      [2100, "Two."], // after One.'s 1 token at 10 tokens/s
    ],
  );
});

test("abort() closes the source, ends the iteration quietly and keeps what was shown", async () => {
  const clock = new VirtualClock();
  let cancelled = false;
  const source = new ReadableStream<ChatCompletionChunk>({
    start(controller) {
      for (let i = 0; i < 10; i++) controller.enqueue(contentChunk(` w${i}`));
    },
    cancel() {
      cancelled = true;
    },
  });
  const stream = paceStream(source, { clock, requestStart: 0, tds: 10 });
  const out = await clock.run(
    (async () => {
      const seen: number[] = [];
      for await (const _ of stream) {
        seen.push(clock.now());
        if (seen.length === 3) stream.abort();
      }
      return seen;
    })(),
  );
  assert.deepEqual(out, [0, 100, 200]);
  assert.ok(cancelled, "the ReadableStream was cancelled");
  assert.equal(stream.outcome, "aborted");
  assert.equal(stream.timeline?.displayed.length, 3);
  assert.equal(stream.timeline?.arrivals.length, 10);
});

test("an AbortSignal aborts; leaving the loop aborts too", async () => {
  const clock = new VirtualClock();
  let closed = 0;
  async function* source(): AsyncGenerator<ChatCompletionChunk> {
    try {
      for (let i = 0; ; i++) {
        await clock.until(i * 10);
        yield contentChunk(` w${i}`);
      }
    } finally {
      closed++;
    }
  }
  const controller = new AbortController();
  const viaSignal = paceStream(source(), { clock, tds: 10, signal: controller.signal });
  const seen = await clock.run(
    (async () => {
      let n = 0;
      for await (const _ of viaSignal) if (++n === 2) controller.abort();
      return n;
    })(),
  );
  assert.equal(seen, 2);
  assert.equal(viaSignal.outcome, "aborted");
  const viaBreak = paceStream(source(), { clock, tds: 10 });
  await clock.run(
    (async () => {
      for await (const _ of viaBreak) break;
    })(),
  );
  assert.equal(viaBreak.outcome, "aborted");
  await clock.run(clock.sleep(100));
  assert.equal(closed, 2, "both sources were closed");
});

test("an error after some tokens: those tokens are released (paced), then the error is thrown", async () => {
  const clock = new VirtualClock();
  const events = [0, 1, 2].map((t, i): [number, ChatCompletionChunk] => [t, contentChunk(` w${i}`)]);
  const stream = paceStream(timedSource(clock, events, new Error("upstream_truncated")), { clock, requestStart: 0, tds: 10 });
  const seen: number[] = [];
  await assert.rejects(
    clock.run(
      (async () => {
        for await (const _ of stream) seen.push(clock.now());
      })(),
    ),
    /upstream_truncated/,
  );
  assert.deepEqual(seen, [0, 100, 200]);
  assert.equal(stream.outcome, "error");
});

test("pacing numbers: arguments win over headers, headers over the chat defaults", async () => {
  const headers = new Headers({
    "X-TokenPace-TTFT": "0.5",
    "X-TokenPace-TDS": "25.0",
    "X-TokenPace-Tier": "fast",
    "X-Request-Id": "0123456789abcdef0123456789abcdef",
  });
  const empty = (async function* (): AsyncGenerator<ChatCompletionChunk> {})();
  const fromHeaders = paceStream(empty, { headers });
  assert.deepEqual(fromHeaders.expected, { ttft: 0.5, tds: 25 });
  assert.equal(fromHeaders.tier, "fast");
  assert.equal(fromHeaders.requestId, "0123456789abcdef0123456789abcdef");
  assert.equal(fromHeaders.headers, headers);
  assert.deepEqual(paceStream(empty, { headers, tds: 8 }).expected, { ttft: 0.5, tds: 8 });
  const plain = paceStream(empty);
  assert.deepEqual(plain.expected, { ttft: 1.0, tds: 4.8 });
  assert.equal(plain.tier, "chat");
  assert.equal(paceStream(empty, { tds: 9 }).tier, "custom");
  assert.throws(() => paceStream(empty, { tds: 0 }), /tds/);
  assert.throws(() => paceStream(empty, { unit: "line" as "word" }), /unit/);
});

test("a paced stream is iterated once", () => {
  const stream = paceStream((async function* (): AsyncGenerator<ChatCompletionChunk> {})());
  stream[Symbol.asyncIterator]();
  assert.throws(() => stream[Symbol.asyncIterator](), /only once/);
});

test("unit word: a last token that carries the finish reason (as vLLM sends it) is flushed before it", async () => {
  const clock = new VirtualClock();
  const last: ChatCompletionChunk = {
    object: "chat.completion.chunk",
    choices: [{ index: 0, delta: { content: " end" }, finish_reason: "length", logprobs: null } as ChatCompletionChunk["choices"][number]],
  };
  const events: Array<[number, ChatCompletionChunk]> = [
    [0, roleChunk()],
    [0, contentChunk("The")],
    [1, last],
  ];
  const out = await collect(clock, paceStream(timedSource(clock, events), { clock, tds: 10, unit: "word" }));
  assert.deepEqual(
    out.map(([t, c]) => [t, textOf(c), c.choices[0]?.finish_reason ?? null]),
    [
      [0, "", null],
      [1, "The ", null],
      [101, "end", null],
      [101, "", "length"],
    ],
  );
  assert.equal(out[0]?.[1], events[0]?.[1], "the role chunk is passed as it came");
  assert.deepEqual(out[3]?.[1].choices[0]?.delta, {}, "the finish chunk carries no text again");
});

test("a source that yields something other than a chunk: a clear error, and the source is closed", async () => {
  const clock = new VirtualClock();
  let closed = false;
  async function* source(): AsyncGenerator<ChatCompletionChunk> {
    try {
      yield contentChunk("ok");
      yield { id: "x" } as unknown as ChatCompletionChunk;
      yield contentChunk("never read");
    } finally {
      closed = true;
    }
  }
  const stream = paceStream(source(), { clock, tds: 10 });
  const seen: string[] = [];
  await assert.rejects(
    clock.run(
      (async () => {
        for await (const c of stream) seen.push(textOf(c));
      })(),
    ),
    /Not a chat completion chunk \(no choices array\): \{"id":"x"\}/,
  );
  assert.deepEqual(seen, ["ok"]);
  assert.ok(closed);
  assert.equal(stream.outcome, "error");
});

test("a signal aborted before pacing starts closes the source at once", async () => {
  let cancelled = false;
  const source = new ReadableStream<ChatCompletionChunk>({
    pull: () => new Promise(() => undefined),
    cancel() {
      cancelled = true;
    },
  });
  const stream = paceStream(source, { signal: AbortSignal.abort() });
  assert.equal(stream.outcome, "aborted");
  assert.ok(cancelled);
  for await (const _ of stream) assert.fail("nothing is released");
});
