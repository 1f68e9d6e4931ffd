/**
 * Against the real gateway (`tokenpace serve` on its embedded SIMULATED engine, started
 * here from the repository's .venv): streams through `createClient` and through the
 * official `openai` client with `paceOpenAI`, checks the tier's pacing, and that the
 * gateway accepts the QoE reports (with the telemetry token, and with the API key).
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { createClient } from "../src/client.js";
import { paceOpenAI } from "../src/openai.js";
import type { PacedStream } from "../src/stream.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { KEY, startGateway, type Gateway } from "./gateway-process.js";

const TOKENS = 12;
const FAST = { ttft: 0.5, tds: 25 };
const messages = [{ role: "user" as const, content: "Tell me about pacing." }];

let gateway: Gateway | undefined;
let base = "";

before(async () => {
  gateway = await startGateway();
  base = gateway.base;
});

after(async () => {
  await gateway?.stop();
});

/** Read a stream to its end; its text. */
async function read(stream: AsyncIterable<ChatCompletionChunk>): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += String(chunk.choices[0]?.delta?.["content"] ?? "");
  return text;
}

/** What every paced stream from the gateway on the fast tier must show. */
function checkPacedOnFastTier(stream: PacedStream<ChatCompletionChunk>, tokens: number): void {
  assert.equal(stream.tier, "fast");
  assert.deepEqual(stream.expected, FAST, "TTFT and TDS read from the response headers");
  assert.match(stream.requestId ?? "", /^[0-9a-f]{32}$/);
  assert.equal(stream.outcome, "completed");
  const arrivals = stream.timeline?.arrivals ?? [];
  const shown = stream.timeline?.displayed ?? [];
  assert.equal(shown.reduce((n, [, c]) => n + c, 0), tokens);
  assert.equal(arrivals.reduce((n, [, c]) => n + c, 0), tokens);
  const firstWait = (shown[0]?.[0] ?? Infinity) - (arrivals[0]?.[0] ?? 0);
  // Not held back: shown once the consumer's loop runs (and, for words, once the next token began).
  assert.ok(firstWait >= 0 && firstWait < 0.25, `the first piece waited ${firstWait} s`);
  const costs = shown.map(([, c]) => c / FAST.tds);
  for (let i = 1; i < shown.length; i++) {
    const gap = (shown[i] as [number, number])[0] - (shown[i - 1] as [number, number])[0];
    assert.ok(gap >= (costs[i - 1] as number) - 1e-9, `release ${i} came ${gap} s after the previous one`);
  }
  const span = (t: Array<[number, number]>): number => (t.at(-1)?.[0] ?? 0) - (t[0]?.[0] ?? 0);
  const paced = costs.slice(0, -1).reduce((a, b) => a + b, 0);
  // The simulated engine streams far faster than 25 tokens/s; the buffer spreads the reply.
  assert.ok(span(arrivals) < paced, `arrivals spread over ${span(arrivals)} s, pacing needs ${paced} s`);
  assert.ok(span(shown) >= paced - 1e-9 && span(shown) < paced + 1.0, `displayed over ${span(shown)} s, expected ${paced} s`);
}

/** `fetch` that records the telemetry requests' headers and can hide the token header. */
function recordingFetch(hideToken: boolean): { fetch: typeof fetch; telemetryHeaders: Headers[] } {
  const telemetryHeaders: Headers[] = [];
  const wrapped: typeof fetch = async (input, init) => {
    const url = String(input instanceof Request ? input.url : input);
    if (url.endsWith("/tokenpace/telemetry")) telemetryHeaders.push(new Headers(init?.headers));
    const response = await fetch(input, init);
    if (!hideToken || !url.endsWith("/chat/completions")) return response;
    const headers = new Headers(response.headers);
    headers.delete("X-TokenPace-Telemetry-Token");
    return new Response(response.body, { status: response.status, headers });
  };
  return { fetch: wrapped, telemetryHeaders };
}

test("createClient against the gateway: paced at the tier's TDS, telemetry accepted with the token", async () => {
  const { fetch, telemetryHeaders } = recordingFetch(false);
  const client = createClient({ baseURL: `${base}/v1`, apiKey: KEY, tier: "fast", fetch });
  const stream = await client.chat.completions.create({ model: "tokenpace-sim", messages, max_tokens: TOKENS, stream: true });
  assert.ok(stream.headers?.get("X-TokenPace-Telemetry-Token"), "the gateway sends a telemetry token");
  const text = await read(stream);
  assert.match(text, /^Simulated reply:/);
  checkPacedOnFastTier(stream, TOKENS);
  const result = await stream.reported;
  assert.equal(result?.object, "tokenpace.telemetry", "the report was accepted");
  assert.equal(result?.request_id, stream.requestId);
  assert.equal(result?.tier, "fast");
  assert.ok(Math.abs((result?.qoe.displayed_andes ?? -1) - (stream.qoe?.displayedAndes ?? 0)) < 1e-3, "the gateway's QoE matches ours");
  assert.ok(Math.abs((result?.qoe.monotone ?? -1) - (stream.qoe?.monotone ?? 0)) < 1e-3);
  assert.equal(telemetryHeaders.length, 1);
  assert.ok(telemetryHeaders[0]?.get("X-TokenPace-Telemetry-Token"));
  assert.equal(telemetryHeaders[0]?.get("Authorization"), null, "the token path sends no key");
});

test("without a token in the response, the report is accepted with the API key", async () => {
  const { fetch, telemetryHeaders } = recordingFetch(true);
  const client = createClient({ baseURL: `${base}/v1`, apiKey: KEY, tier: "fast", fetch });
  const stream = await client.chat.completions.create({ model: "tokenpace-sim", messages, max_tokens: TOKENS, stream: true });
  await read(stream);
  checkPacedOnFastTier(stream, TOKENS);
  const result = await stream.reported;
  assert.equal(result?.object, "tokenpace.telemetry", "the report was accepted");
  assert.equal(telemetryHeaders[0]?.get("Authorization"), `Bearer ${KEY}`);
  assert.equal(telemetryHeaders[0]?.get("X-TokenPace-Telemetry-Token"), null);
});

test("the openai client with paceOpenAI: headers from .withResponse(), words paced, telemetry accepted", async () => {
  const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  const stream = await paceOpenAI(
    openai.chat.completions
      .create({ model: "tokenpace-sim", messages, max_tokens: TOKENS, stream: true }, { headers: { "X-TokenPace-Tier": "fast" } })
      .withResponse(),
    { unit: "word" },
  );
  const text = await read(stream);
  assert.match(text, /^Simulated reply: /);
  checkPacedOnFastTier(stream, TOKENS);
  const result = await stream.reported;
  assert.equal(result?.object, "tokenpace.telemetry", "the report was accepted (token from the response)");
  assert.equal(result?.request_id, stream.requestId);
});

test("aborting a reply closes it and reports the outcome aborted; the gateway lists the client reports", async () => {
  const client = createClient({ baseURL: `${base}/v1`, apiKey: KEY, tier: "fast" });
  const stream = await client.chat.completions.create({ model: "tokenpace-sim", messages, max_tokens: 400, stream: true });
  let n = 0;
  for await (const _ of stream) if (++n === 3) stream.abort();
  assert.equal(stream.outcome, "aborted");
  assert.ok((stream.timeline?.arrivals.reduce((s, [, c]) => s + c, 0) ?? 400) < 400, "the reply did not run to its end");
  assert.equal((await stream.reported)?.object, "tokenpace.telemetry");
  const summary = (await (await fetch(`${base}/v1/tokenpace/qoe`, { headers: { Authorization: `Bearer ${KEY}` } })).json()) as {
    tenants: Record<string, { tiers: Record<string, { client: { count: number } }> }>;
  };
  assert.equal(summary.tenants["demo"]?.tiers["fast"]?.client.count, 4, "the four reports of this file");
});
