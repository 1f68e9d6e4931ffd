/**
 * What the README's TypeScript blocks take from their surroundings (test/readme.test.ts
 * imports into each block only the names it uses and does not declare): the gateway's
 * URL and key, a request, and `show`, the page's way of putting text on the
 * screen, which here records what it was given. Also the checks that each block did what
 * it shows. The gateway's URL and key come from `TOKENPACE_BASE_URL` and
 * `TOKENPACE_API_KEY`, as the README has a reader set them.
 */
import assert from "node:assert/strict";
import { TIERS, type PacedStream } from "tokenpace-web";

function required(name: string): string {
  const value = process.env[name];
  if (value === undefined) throw new Error(`$${name} is not set`);
  return value;
}

export const baseURL = required("TOKENPACE_BASE_URL");
export const apiKey = required("TOKENPACE_API_KEY");
export const model = "tokenpace-sim";
export const messages = [{ role: "user" as const, content: "Hello!" }];

/** Everything `show` was given, in order. */
export const shown: string[] = [];
/** The page's display (a DOM update in a browser): recorded. */
export function show(text: string): void {
  shown.push(text);
}

interface TextChunk {
  choices: ReadonlyArray<{ delta?: { content?: string | null } | null }>;
}

/** Reads a paced stream to its end; the text it released. */
export async function readText(stream: AsyncIterable<TextChunk>): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
  return text;
}

/**
 * A block's stream did what the README shows: the simulated engine's reply came out
 * whole, on `tier`, released at the tier's pace (the engine streams far faster), and
 * the gateway accepted the QoE report for this request.
 */
export async function checkPaced(stream: PacedStream<unknown>, text: string, tier: string): Promise<void> {
  assert.match(text, /^Simulated reply:/, "the reply was released to the reader");
  assert.equal(stream.outcome, "completed");
  assert.equal(stream.tier, tier, "the gateway served the tier the block asked for");
  assert.deepEqual(stream.expected, TIERS[tier as keyof typeof TIERS], "the tier's TTFT and TDS came with the response");
  const { arrivals = [], displayed = [] } = stream.timeline ?? {};
  const tokens = (t: Array<[number, number]>): number => t.reduce((n, [, c]) => n + c, 0);
  assert.ok(tokens(arrivals) > 1 && tokens(displayed) === tokens(arrivals), "every token that came was shown");
  const paced = displayed.slice(0, -1).reduce((s, [, c]) => s + c / stream.expected.tds, 0);
  const span = (displayed.at(-1)?.[0] ?? 0) - (displayed[0]?.[0] ?? 0);
  assert.ok(span >= paced - 1e-6, `shown over ${span} s; the tier's pace (${stream.expected.tds}/s) needs ${paced} s`);
  assert.ok(stream.qoe !== undefined && stream.qoe.displayedAndes > 0, "the QoE of what was shown is scored");
  const report = await stream.reported;
  assert.equal(report?.object, "tokenpace.telemetry", "the gateway accepted the QoE report");
  assert.equal(report?.request_id, stream.requestId);
}
