import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { test } from "node:test";
import { createClient } from "../src/client.js";
import { TokenPaceError } from "../src/errors.js";
import { telemetryURL } from "../src/openai.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { json, startServer } from "./server.js";

const REQUEST_ID = "00112233445566778899aabbccddeeff";
const body = { model: "m", messages: [{ role: "user", content: "Hi" }], stream: true as const };

function sseHead(res: ServerResponse, tds = "200.0"): void {
  res.writeHead(200, {
    "Content-Type": "text/event-stream",
    "X-Request-Id": REQUEST_ID,
    "X-TokenPace-Tier": "fast",
    "X-TokenPace-TTFT": "0.5",
    "X-TokenPace-TDS": tds,
  });
}

const event = (data: unknown): string => `data: ${JSON.stringify(data)}\n\n`;
const delta = (content: string): unknown => ({ object: "chat.completion.chunk", choices: [{ index: 0, delta: { content }, finish_reason: null }] });

test("create() hands the queue notices that come before the reply to onQueued, as they come", async () => {
  let heardFirstInLine: () => void = () => undefined;
  const firstInLine = new Promise<void>((resolve) => (heardFirstInLine = resolve));
  let sentFirstChunk = false;
  const server = await startServer((_req, res) => {
    sseHead(res);
    res.write(": queued position=2 eta_s=1.5\n\n");
    res.write(": ping\n\n");
    res.write(": queued position=1 eta_s=0.4\n\n");
    // the reply is held until the client has heard position 1 (or 10 s): the notices
    // must reach onQueued while the request waits, not with the first chunk
    void Promise.race([firstInLine, new Promise((resolve) => setTimeout(resolve, 10_000))]).then(() => {
      sentFirstChunk = true;
      res.end(event(delta("Hi")) + event(delta(" there")) + "data: [DONE]\n\n");
    });
  });
  try {
    const client = createClient({ baseURL: `${server.url}/v1`, telemetry: false });
    const notices: Array<[number, number, boolean]> = [];
    const started = performance.now();
    const stream = await client.chat.completions.create(body, {
      onQueued: ({ position, etaS }) => {
        notices.push([position, etaS, sentFirstChunk]);
        if (position === 1) heardFirstInLine();
      },
    });
    let text = "";
    for await (const chunk of stream) text += String(chunk.choices[0]?.delta?.["content"] ?? "");
    assert.ok(performance.now() - started < 5_000, "the reply waited for the notices to be heard");
    assert.deepEqual(notices, [
      [2, 1.5, false],
      [1, 0.4, false],
    ]);
    assert.equal(text, "Hi there");
    assert.equal(stream.outcome, "completed");
  } finally {
    await server.close();
  }
});

test("create() streams over fetch: sends key, tier and body; reads the headers; paces to their TDS", async () => {
  const server = await startServer((_req, res) => {
    sseHead(res);
    res.write(": ping\n\n");
    res.write(event({ object: "chat.completion.chunk", choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }] }));
    // Ten tokens in one write (faster than any reader), the event of the tenth split across writes.
    res.write(Array.from({ length: 9 }, (_, i) => event(delta(` w${i}`))).join("") + 'data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " w');
    setTimeout(() => {
      res.write('9"}, "finish_reason": null}]}\n\n');
      res.end(event({ object: "chat.completion.chunk", choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }) + "data: [DONE]\n\n");
    }, 5);
  });
  try {
    const client = createClient({ baseURL: `${server.url}/v1/`, apiKey: "tp-key", tier: "fast", telemetry: false });
    const stream = await client.chat.completions.create(body);
    assert.equal(stream.requestId, REQUEST_ID);
    assert.equal(stream.tier, "fast");
    assert.deepEqual(stream.expected, { ttft: 0.5, tds: 200 });
    assert.equal(stream.headers?.get("x-tokenpace-tds"), "200.0");
    let text = "";
    const chunks: ChatCompletionChunk[] = [];
    for await (const chunk of stream) {
      chunks.push(chunk);
      text += String(chunk.choices[0]?.delta?.["content"] ?? "");
    }
    assert.equal(text, " w0 w1 w2 w3 w4 w5 w6 w7 w8 w9");
    assert.equal(chunks.at(-1)?.choices[0]?.finish_reason, "stop");
    const [sent] = server.received;
    assert.equal(sent?.url, "/v1/chat/completions");
    assert.equal(sent?.headers["authorization"], "Bearer tp-key");
    assert.equal(sent?.headers["x-tokenpace-tier"], "fast");
    assert.deepEqual(JSON.parse(sent?.body ?? ""), body);
    const shown = stream.timeline?.displayed.map(([t]) => t) ?? [];
    assert.equal(shown.length, 10);
    for (let i = 1; i < shown.length; i++) {
      // Released on the schedule: never before the previous token's 1/TDS (5 ms) has passed.
      assert.ok((shown[i] as number) - (shown[i - 1] as number) >= 0.005 - 1e-9, `gap ${i}: ${shown}`);
    }
    assert.equal(stream.outcome, "completed");
    assert.ok(stream.qoe !== undefined && stream.qoe.displayedAndes > 0);
  } finally {
    await server.close();
  }
});

test("an error event after some tokens: they are released, then the error is thrown", async () => {
  const server = await startServer((_req, res) => {
    sseHead(res);
    res.end(
      event(delta("a")) +
        event(delta("b")) +
        event({ error: { message: "The backend closed the stream.", type: "upstream_error", param: null, code: "upstream_truncated" } }) +
        "data: [DONE]\n\n",
    );
  });
  try {
    const stream = await createClient({ baseURL: `${server.url}/v1`, telemetry: false }).chat.completions.create(body);
    let text = "";
    const error = await (async () => {
      for await (const c of stream) text += String(c.choices[0]?.delta?.["content"] ?? "");
    })().catch((e: unknown) => e);
    assert.equal(text, "ab");
    assert.ok(error instanceof TokenPaceError);
    assert.equal(error.code, "upstream_truncated");
    assert.equal(error.requestId, REQUEST_ID);
    assert.equal(stream.outcome, "error");
    assert.equal(server.received[0]?.headers["authorization"], undefined, "no key given, none sent");
  } finally {
    await server.close();
  }
});

test("a refused request throws a TokenPaceError with the gateway's status, code and request id", async () => {
  const server = await startServer((_req, res) => {
    res.setHeader("X-Request-Id", REQUEST_ID);
    json(res, 403, { error: { message: "Tier 'fast' is not in your plan.", type: "permission_error", param: "X-TokenPace-Tier", code: "tier_not_allowed" } });
  });
  try {
    const client = createClient({ baseURL: `${server.url}/v1`, apiKey: "k", tier: "fast" });
    const error = await client.chat.completions.create(body).catch((e: unknown) => e);
    assert.ok(error instanceof TokenPaceError);
    assert.equal(error.status, 403);
    assert.equal(error.code, "tier_not_allowed");
    assert.equal(error.param, "X-TokenPace-Tier");
    assert.equal(error.requestId, REQUEST_ID);
    assert.match(error.message, /not in your plan/);
    await assert.rejects(
      client.chat.completions.create({ ...body, stream: false } as unknown as typeof body),
      /stream: must be true/,
    );
  } finally {
    await server.close();
  }
});

test("abort() closes the HTTP request: the server sees the client go away", async () => {
  let closed!: () => void;
  const serverSawClose = new Promise<void>((resolve) => (closed = resolve));
  let timer: NodeJS.Timeout | undefined;
  const server = await startServer((_req, res) => {
    sseHead(res, "1000.0");
    let i = 0;
    timer = setInterval(() => res.write(event(delta(` w${i++}`))), 10);
    res.on("close", () => {
      clearInterval(timer);
      closed();
    });
  });
  try {
    const stream = await createClient({ baseURL: `${server.url}/v1`, telemetry: false }).chat.completions.create(body);
    let n = 0;
    for await (const _ of stream) if (++n === 3) stream.abort();
    assert.equal(n, 3);
    assert.equal(stream.outcome, "aborted");
    await Promise.race([serverSawClose, new Promise((_, reject) => setTimeout(() => reject(new Error("the server never saw the request close")), 5000))]);
  } finally {
    clearInterval(timer);
    await server.close();
  }
});

test("an AbortSignal given to create() aborts the request too", async () => {
  let closed!: () => void;
  const serverSawClose = new Promise<void>((resolve) => (closed = resolve));
  const server = await startServer((_req, res) => {
    sseHead(res);
    res.write(event(delta("a")));
    res.on("close", () => closed());
  });
  try {
    const controller = new AbortController();
    const stream = await createClient({ baseURL: `${server.url}/v1`, telemetry: false }).chat.completions.create(body, {
      signal: controller.signal,
    });
    for await (const _ of stream) controller.abort();
    assert.equal(stream.outcome, "aborted");
    await serverSawClose;
  } finally {
    await server.close();
  }
});

test("the telemetry URL sits next to the completions URL", () => {
  assert.equal(telemetryURL("http://h:1/v1/chat/completions"), "http://h:1/v1/tokenpace/telemetry");
  assert.equal(telemetryURL("https://h/api/v1/completions"), "https://h/api/v1/tokenpace/telemetry");
  assert.equal(telemetryURL("https://h/other"), undefined);
});
