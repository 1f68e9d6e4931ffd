/**
 * Reader signals (docs/protocol.md, "SDK → gateway: reader signals"): what a stream's
 * client tells the gateway about its reader while the reply streams, and how it sends it.
 *
 * The vocabulary and the timing are the gateway's (`qos/signals.py`); this is a copy,
 * checked against `tests/vectors/signals.json` (test/signals.test.ts), which is generated
 * from it, so the two cannot drift.
 *
 * - Updates go with `fetch(url, {method: "POST", keepalive: true})`, authenticated with
 *   the response's telemetry token (`X-TokenPace-Telemetry-Token`), else the API key.
 * - The last word of a page that is going away (`left` on `pagehide`) goes with
 *   `navigator.sendBeacon`: a `text/plain` body (no preflight, no headers) whose JSON
 *   carries the token as `"telemetry_token"`.
 */
import { beaconSender, postForRequest } from "./telemetry.js";

/** A client sends at most one signal per reply this often (s); a change of presence goes at once. */
export const MIN_INTERVAL_S = 0.25;
/** An away holds this long at the gateway unless renewed (s); a client renews it every half lease. */
export const AWAY_LEASE_S = 10.0;
/** The largest pace a signal may state (tokens a second). */
export const MAX_PACE_TPS = 1000.0;
/** The largest buffer a signal may state (tokens). */
export const MAX_BUFFER_TOKENS = 1_000_000;

/** Whether anyone reads: the page shown or the speech playing; hidden or paused; gone. */
export type Presence = "watching" | "away" | "left";
export const PRESENCES: readonly Presence[] = Object.freeze(["watching", "away", "left"]);

/** The body of `POST /v1/tokenpace/reader`. */
export interface ReaderSignalBody {
  request_id: string;
  presence: Presence;
  pace_tps?: number;
  buffer_tokens?: number;
  telemetry_token?: string;
}

/** How signals leave the client: a keepalive fetch for updates, a beacon for the last one. */
export interface SignalTransport {
  /** Send one update; rejects on any failure (the caller reports it, never throws it). */
  send(body: ReaderSignalBody): Promise<void>;
  /** Queue the page's last signal; false when the page has no beacon or the browser refused it. */
  beacon(body: ReaderSignalBody): boolean;
}

/** Where and how to send: the endpoint and the credentials of one stream. */
export interface SignalEndpoint {
  url: string;
  /** The response's telemetry token (preferred: a page never needs the tenant's key). */
  token?: string | undefined;
  apiKey?: string | undefined;
  fetch?: typeof fetch;
}

/**
 * The signal endpoint next to a telemetry URL: `.../v1/tokenpace/telemetry` becomes
 * `.../v1/tokenpace/reader`; undefined for any other URL.
 */
export function readerURL(telemetryURL: string): string | undefined {
  const match = /^(.*\/tokenpace)\/telemetry$/.exec(telemetryURL);
  return match ? `${match[1]}/reader` : undefined;
}

/** The transport of a real page or Node: keepalive `fetch`, `navigator.sendBeacon`. */
export function httpTransport(endpoint: SignalEndpoint): SignalTransport {
  const fetchFn = endpoint.fetch ?? globalThis.fetch;
  return {
    async send(body: ReaderSignalBody): Promise<void> {
      await postForRequest(endpoint.url, body, endpoint, "reader signal", fetchFn);
    },
    beacon(body: ReaderSignalBody): boolean {
      const send = beaconSender();
      if (send === undefined || endpoint.token === undefined) return false;
      const data = JSON.stringify({ ...body, telemetry_token: endpoint.token });
      return send(endpoint.url, new Blob([data], { type: "text/plain" }));
    },
  };
}
