/**
 * The QoE telemetry report (docs/protocol.md, "SDK → gateway: QoE telemetry"): built
 * from a stream's timelines, bounded by the coalescing rule, and sent without ever
 * throwing into the caller.
 *
 * - Normally with `fetch(url, {method: "POST", keepalive: true})`, authenticated with
 *   the request's telemetry token (`X-TokenPace-Telemetry-Token`, so a page never needs
 *   the tenant's API key) when the response had one, else with the API key.
 * - When the page is hidden or closed before the report went out, with
 *   `navigator.sendBeacon`: a `text/plain` body (no preflight, no headers) whose JSON
 *   carries the token as `"telemetry_token"`. Without a token it falls back to the
 *   keepalive fetch, which also outlives the page.
 *
 * keepalive requests and beacons are capped at 64 KiB, so a timeline longer than
 * `MAX_POINTS` entries is coalesced (src/coalesce.ts): at most about 20 bytes an entry,
 * two timelines of 1,000 entries stay near 40 KB.
 */
import { ceilMicroseconds, reportTimeline } from "./coalesce.js";
import { parseBody, refusal, TokenPaceError } from "./errors.js";
import { globalPage } from "./presence.js";
import type { Expectation, Outcome, Timeline, TimelineEntry, TimeSpan } from "./types.js";
import { SDK_NAME, SDK_VERSION } from "./version.js";

/** Entries a timeline may have in a report (the web SDK's coalescing limit L). */
export const MAX_POINTS = 1000;
/** What keepalive fetches and beacons may carry. */
export const MAX_BODY_BYTES = 64 * 1024;

/** Where and how to report. */
export interface TelemetryOptions {
  /** The report URL; `createClient` and the openai adapter default it to `{baseURL}/tokenpace/telemetry`. */
  url?: string;
  /** Used when the response carried no telemetry token. */
  apiKey?: string;
  /** The `fetch` to send with (default: the global one). */
  fetch?: typeof fetch;
  /** Told of every failure to report; reporting itself never throws. */
  onError?: (error: unknown) => void;
}

/** The report's body, as docs/protocol.md specifies it. */
export interface TelemetryReport {
  request_id: string;
  expected: Expectation;
  arrivals: TimelineEntry[];
  displayed: TimelineEntry[];
  outcome: Outcome;
  sdk: { name: string; version: string };
  /** The spans the reader was away (same clock as the timelines); left out when none. */
  away?: TimeSpan[];
}

/** The gateway's answer: the QoE it recomputed from the report. */
export interface TelemetryResult {
  object: "tokenpace.telemetry";
  request_id: string;
  tier: string;
  expected: Expectation;
  qoe: { andes: number; monotone: number; displayed_andes: number | null; displayed_monotone: number | null };
}

/** The report of one request, its timelines coalesced to `MAX_POINTS` and rounded up to the microsecond. */
export function buildReport(requestId: string, expected: Expectation, timeline: Timeline, outcome: Outcome): TelemetryReport {
  return {
    request_id: requestId,
    expected: { ttft: expected.ttft, tds: expected.tds },
    arrivals: reportTimeline(timeline.arrivals, MAX_POINTS),
    displayed: reportTimeline(timeline.displayed, MAX_POINTS),
    outcome,
    sdk: { name: SDK_NAME, version: SDK_VERSION },
    ...(timeline.away !== undefined && timeline.away.length > 0 && { away: timeline.away.map(([from, to]): TimeSpan => [ceilMicroseconds(from), ceilMicroseconds(to)]) }),
  };
}

/** How a report authenticates: the request's telemetry token, else the API key. */
export interface ReportAuth {
  token?: string | undefined;
  apiKey?: string | undefined;
}

/**
 * POST `payload` (one request's: a QoE report, a reader signal) to the gateway with a
 * keepalive fetch, authenticated with the response's telemetry token, else the API key;
 * resolves to the gateway's answer, rejects on any failure. `what` names it in errors.
 */
export async function postForRequest(
  url: string,
  payload: { request_id: string },
  auth: ReportAuth,
  what: string,
  fetchFn: typeof fetch = globalThis.fetch,
): Promise<unknown> {
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (auth.token !== undefined) headers["X-TokenPace-Telemetry-Token"] = auth.token;
  else if (auth.apiKey !== undefined) headers["Authorization"] = `Bearer ${auth.apiKey}`;
  else throw new TokenPaceError(`No telemetry token in the response and no API key: the ${what} was not sent.`);
  const body = JSON.stringify(payload);
  const response = await fetchFn(url, { method: "POST", keepalive: true, headers, body });
  const text = await response.text();
  if (!response.ok) {
    const refused = `${what.charAt(0).toUpperCase()}${what.slice(1)} refused (${response.status}): `;
    throw refusal(refused, response.status, text, payload.request_id);
  }
  return parseBody(text);
}

/** POST the report with a keepalive fetch; resolves to the gateway's answer, rejects on any failure. */
export async function postReport(
  url: string,
  report: TelemetryReport,
  auth: ReportAuth,
  fetchFn: typeof fetch = globalThis.fetch,
): Promise<TelemetryResult> {
  return (await postForRequest(url, report, auth, "QoE report", fetchFn)) as TelemetryResult;
}

/** The browser's `navigator.sendBeacon`, when there is one. */
export function beaconSender(): ((url: string, data: Blob) => boolean) | undefined {
  const nav = (globalThis as { navigator?: { sendBeacon?: (url: string, data: Blob) => boolean } }).navigator;
  return typeof nav?.sendBeacon === "function" ? nav.sendBeacon.bind(nav) : undefined;
}

/**
 * Queue the report with `navigator.sendBeacon` (`text/plain`, the token in the body as
 * `"telemetry_token"`); false when the page has no beacon or the browser refused it.
 */
export function beaconReport(url: string, report: TelemetryReport, token: string): boolean {
  const send = beaconSender();
  if (send === undefined) return false;
  const body = JSON.stringify({ ...report, telemetry_token: token });
  return send(url, new Blob([body], { type: "text/plain" }));
}

/**
 * Call `onExit` once when the page is hidden (`visibilitychange`) or closed (`pagehide`);
 * with `whenHidden` false, only when closed (a stream whose reader channel keeps it going
 * while hidden). Returns the unsubscribe.
 */
export function onPageExit(onExit: () => void, whenHidden = true): () => void {
  const page = globalPage();
  const doc = page?.document;
  if (page === undefined || doc === undefined) return () => undefined;
  const onVisibility = (): void => {
    if (whenHidden && doc.visibilityState === "hidden") fire();
  };
  const stop = (): void => {
    page.removeEventListener("pagehide", fire);
    doc.removeEventListener("visibilitychange", onVisibility);
  };
  function fire(): void {
    stop();
    onExit();
  }
  page.addEventListener("pagehide", fire);
  doc.addEventListener("visibilitychange", onVisibility);
  return stop;
}

/** Call `onError` with `error`, shielding the caller from a throwing handler. */
export function tellError(onError: ((error: unknown) => void) | undefined, error: unknown): void {
  try {
    onError?.(error);
  } catch {
    // A failing error handler must not break the stream either.
  }
}
