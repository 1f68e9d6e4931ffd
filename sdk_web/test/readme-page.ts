/**
 * A page that reads the stream itself, for the README's `paceStream` block: the
 * `fetch` response of a streamed request on the fast tier and its chunks
 * (`openAIChunks(parseSSE(body))`).
 */
import { openAIChunks, parseSSE } from "tokenpace-web";
import { apiKey, baseURL, messages, model } from "./readme-context.js";

export const response = await fetch(`${baseURL}/chat/completions`, {
  method: "POST",
  headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}`, "X-TokenPace-Tier": "fast" },
  body: JSON.stringify({ model, messages, max_tokens: 12, stream: true }),
});
if (!response.ok || response.body === null) throw new Error(`${response.status}: ${await response.text()}`);
export const chunks = openAIChunks(parseSSE(response.body), response.headers.get("X-Request-Id") ?? undefined);
