/**
 * What the gateway's response headers say about a request (docs/protocol.md,
 * "Gateway → client"): its id, the tier served and what to pace to, and the telemetry token.
 */
import { DEFAULT_EXPECTATION, DEFAULT_TIER } from "./tiers.js";
import type { Expectation } from "./types.js";

/** A request as the SDK paces and reports it. */
export interface RequestInfo {
  requestId: string | undefined;
  tier: string;
  expected: Expectation;
  telemetryToken: string | undefined;
}

function positiveNumber(value: string | null): number | undefined {
  if (value === null) return undefined;
  const n = Number(value);
  return Number.isFinite(n) && n >= 0 ? n : undefined;
}

/**
 * Numbers given as arguments win, then the `X-TokenPace-TTFT`/`-TDS` headers, then the
 * default tier's (src/tiers.ts). The tier is the header's, else `custom` when numbers were given,
 * else `chat`.
 */
export function requestInfo(headers: Headers | undefined, given: { ttft?: number; tds?: number } = {}): RequestInfo {
  const header = (name: string): string | null => headers?.get(name) ?? null;
  const ttft = given.ttft ?? positiveNumber(header("X-TokenPace-TTFT")) ?? DEFAULT_EXPECTATION.ttft;
  const tdsHeader = positiveNumber(header("X-TokenPace-TDS"));
  const tds = given.tds ?? (tdsHeader !== undefined && tdsHeader > 0 ? tdsHeader : DEFAULT_EXPECTATION.tds);
  const explicit = given.ttft !== undefined || given.tds !== undefined;
  return {
    requestId: header("X-Request-Id") ?? undefined,
    tier: header("X-TokenPace-Tier") ?? (explicit ? "custom" : DEFAULT_TIER),
    expected: { ttft, tds },
    telemetryToken: header("X-TokenPace-Telemetry-Token") ?? undefined,
  };
}
