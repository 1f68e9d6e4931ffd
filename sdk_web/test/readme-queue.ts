/**
 * A client whose request has to wait, for the README's queue-notice block: the test
 * gateway runs its engine one request at a time (test/readme.test.ts), and loading this
 * module starts a long reply that holds that slot. `client` (on the fast tier) and
 * `body` (a short request) then wait in the gateway's queue until it ends.
 */
import assert from "node:assert/strict";
import { createClient } from "tokenpace-web";
import { apiKey, baseURL, messages, model, shown } from "./readme-context.js";

const holder = await fetch(`${baseURL}/chat/completions`, {
  method: "POST",
  headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
  body: JSON.stringify({ model, messages, max_tokens: 400, stream: true }),
});
if (!holder.ok || holder.body === null) throw new Error(`${holder.status}: ${await holder.text()}`);
// Read as it comes, so that the gateway is never held up sending it.
void holder.body.pipeTo(new WritableStream());

export const client = createClient({ baseURL, apiKey, tier: "fast" });
/** A request as `createClient`'s `create` takes it: short, so that pacing ends soon. */
export const body = { model, messages, max_tokens: 12, stream: true as const };

/** The block showed the gateway's queue notices: at least one, first in line. */
export function checkQueued(): void {
  assert.ok(shown.length > 0, "the request waited, and the gateway's notices reached onQueued");
  for (const line of shown) assert.match(line, /^waiting, about \d+ s \(number 1 in line\)$/);
}
