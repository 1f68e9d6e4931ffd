/**
 * The gateway's default tiers: what a stream is paced to when nothing else says.
 *
 * A tokenpace gateway announces the tier it serves in `X-TokenPace-TTFT` and
 * `X-TokenPace-TDS` (docs/protocol.md, "QoE tiers"); without those headers and without
 * options, a stream is paced to the chat tier. The table is the gateway's default one,
 * copied so that the SDK needs no gateway; test/tiers.test.ts checks it against
 * `tests/vectors/tiers.json`, which is generated from the gateway's own table. chat:
 * reading speed (Andes, Liu et al., Table 1); voice: speaking speed (Andes Table 2).
 */
import type { Expectation } from "./types.js";

/** The default tiers by name: expected time to first token (s) and delivery speed (tokens/s). */
export const TIERS: Readonly<Record<"chat" | "voice" | "fast" | "batch", Readonly<Expectation>>> = Object.freeze({
  chat: Object.freeze({ ttft: 1.0, tds: 4.8 }),
  voice: Object.freeze({ ttft: 1.0, tds: 3.3 }),
  fast: Object.freeze({ ttft: 0.5, tds: 25.0 }),
  batch: Object.freeze({ ttft: 60.0, tds: 50.0 }),
});

/** A tenant's default tier at the gateway, and what a stream without headers is paced to. */
export const DEFAULT_TIER = "chat";

/** The default tier's expectation. */
export const DEFAULT_EXPECTATION: Readonly<Expectation> = TIERS[DEFAULT_TIER];
