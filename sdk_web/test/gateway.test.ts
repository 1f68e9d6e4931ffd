/**
 * Against the real gateway (`tokenpace serve` on its embedded SIMULATED engine, started
 * here from the repository's .venv): streams through `createClient` and through the
 * official `openai` client with `paceOpenAI`, checks the tier's pacing, and that the
 * gateway accepts the QoE reports (with the telemetry token, and with the API key).
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { createClient } from "../src/client.js";
import { paceOpenAI } from "../src/openai.js";
import type { PacedStream } from "../src/stream.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { REPO_ROOT } from "./helpers.js";

const TOKENPACE = join(REPO_ROOT, ".venv", "bin", "tokenpace");
const KEY = "tp-demo-sdk-web-integration-test";
const TOKENS = 12;
const FAST = { ttft: 0.5, tds: 25 };
const messages = [{ role: "user" as const, content: "Tell me about pacing." }];

let gateway: ChildProcess | undefined;
let base = "";
let log = "";

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

before(async () => {
  if (!existsSync(TOKENPACE)) throw new Error(`${TOKENPACE} is missing: run \`make venv\` at the repository root first`);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const env: NodeJS.ProcessEnv = { ...process.env, TOKENPACE_DEMO_KEY: KEY };
  delete env["TOKENPACE_CONFIG"];
  gateway = spawn(TOKENPACE, ["serve", "--host", "127.0.0.1", "--port", String(port)], { env, stdio: ["ignore", "pipe", "pipe"] });
  gateway.stdout?.on("data", (b: Buffer) => (log += b.toString()));
  gateway.stderr?.on("data", (b: Buffer) => (log += b.toString()));
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (gateway.exitCode !== null) throw new Error(`tokenpace serve exited (${gateway.exitCode}):\n${log}`);
    const ok = await fetch(`${base}/readyz`).then((r) => r.ok, () => false);
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`tokenpace serve not ready in 60 s:\n${log}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
});

after(async () => {
  if (gateway === undefined || gateway.exitCode !== null) return;
  const exited = new Promise((resolve) => gateway?.once("exit", resolve));
  gateway.kill("SIGTERM");
  await exited;
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
