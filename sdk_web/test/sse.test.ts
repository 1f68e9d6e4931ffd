import assert from "node:assert/strict";
import { test } from "node:test";
import { openAIChunks } from "../src/chunks.js";
import { TokenPaceError } from "../src/errors.js";
import { parseSSE, SSEParser, type ServerSentEvent } from "../src/sse.js";
import type { ChatCompletionChunk } from "../src/types.js";

const encoder = new TextEncoder();

async function* reads(parts: Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const part of parts) yield part;
}

async function all<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

const STREAM =
  ": ping\n\n" +
  'data: {"choices":[{"index":0,"delta":{"content":"héllo 你好 👍"}}]}\r\n\r\n' +
  "data: first line\ndata: second line\n\n" +
  "event: custom\r" +
  "data: x\r\r" +
  ": ping\n" +
  "data: [DONE]\n\n";

const EXPECTED: ServerSentEvent[] = [
  { event: "message", data: '{"choices":[{"index":0,"delta":{"content":"héllo 你好 👍"}}]}' },
  { event: "message", data: "first line\nsecond line" },
  { event: "custom", data: "x" },
  { event: "message", data: "[DONE]" },
];

test("events split across reads at every byte (inside lines, CRLF and UTF-8 characters)", async () => {
  const bytes = encoder.encode(STREAM);
  for (let cut = 0; cut <= bytes.length; cut++) {
    const events = await all(parseSSE(reads([bytes.slice(0, cut), bytes.slice(cut)])));
    assert.deepEqual(events, EXPECTED, `split at byte ${cut}`);
  }
  const oneByOne = await all(parseSSE(reads(Array.from(bytes, (b) => Uint8Array.of(b)))));
  assert.deepEqual(oneByOne, EXPECTED);
});

test("a ReadableStream body is read the same way", async () => {
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(encoder.encode(STREAM.slice(0, 17)));
      controller.enqueue(encoder.encode(STREAM.slice(17)));
      controller.close();
    },
  });
  assert.deepEqual(await all(parseSSE(body)), EXPECTED);
});

test("comments make no events; an event without its blank line at the end is dropped", () => {
  const parser = new SSEParser();
  assert.deepEqual(parser.push(": ping\n\n: ping\n\n"), []);
  assert.deepEqual(parser.push("data:no space\n\ndata: cut"), [{ event: "message", data: "no space" }]);
  parser.end();
  assert.deepEqual(parser.push("\n\n"), []);
});

test("comments go to onComment in stream order, split across reads at every byte", async () => {
  const text = ": queued position=2 eta_s=1.5\n\n:ping\r\n" + STREAM;
  const bytes = encoder.encode(text);
  for (let cut = 0; cut <= bytes.length; cut++) {
    const heard: string[] = [];
    const seen: Array<string | ServerSentEvent> = [];
    const onComment = (comment: string): void => {
      heard.push(comment);
      seen.push(comment);
    };
    for await (const event of parseSSE(reads([bytes.slice(0, cut), bytes.slice(cut)]), { onComment })) seen.push(event);
    assert.deepEqual(heard, [" queued position=2 eta_s=1.5", "ping", " ping", " ping"], `split at byte ${cut}`);
    assert.deepEqual(
      seen.filter((x) => typeof x !== "string"),
      EXPECTED,
    );
    assert.equal(seen.indexOf(" queued position=2 eta_s=1.5"), 0, "before the first event");
  }
});

function events(...data: string[]): AsyncGenerator<ServerSentEvent> {
  return (async function* () {
    for (const d of data) yield { event: "message", data: d };
  })();
}

test("OpenAI chunks up to [DONE]", async () => {
  const chunks = await all(openAIChunks(events('{"choices":[]}', '{"choices":[{"delta":{"content":"a"}}]}', "[DONE]", '{"choices":[]}')));
  assert.equal(chunks.length, 2);
  assert.equal(chunks[1]?.choices[0]?.delta?.["content"], "a");
});

test("an error event is thrown as a TokenPaceError, after the chunks before it", async () => {
  const got: ChatCompletionChunk[] = [];
  const error = await all(
    (async function* () {
      for await (const c of openAIChunks(
        events(
          '{"choices":[{"delta":{"content":"a"}}]}',
          '{"error": {"message": "backend closed the stream", "type": "upstream_error", "param": null, "code": "upstream_truncated"}}',
          "[DONE]",
        ),
        "0123456789abcdef0123456789abcdef",
      ))
        yield got.push(c);
    })(),
  ).catch((e: unknown) => e);
  assert.equal(got.length, 1);
  assert.ok(error instanceof TokenPaceError);
  assert.equal(error.message, "backend closed the stream");
  assert.equal(error.code, "upstream_truncated");
  assert.equal(error.type, "upstream_error");
  assert.equal(error.requestId, "0123456789abcdef0123456789abcdef");
});

test("garbage, an `event: error`, and a stream cut before [DONE] are errors", async () => {
  await assert.rejects(all(openAIChunks(events("not json"))), /not JSON/);
  await assert.rejects(all(openAIChunks(events('{"id": 1}'))), /not a completion chunk/);
  await assert.rejects(
    all(openAIChunks((async function* () { yield { event: "error", data: '{"message": "x"}' }; })())),
    TokenPaceError,
  );
  await assert.rejects(all(openAIChunks(events('{"choices":[]}'))), /before data: \[DONE\]/);
});
