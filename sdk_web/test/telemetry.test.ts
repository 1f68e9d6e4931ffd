import assert from "node:assert/strict";
import { test } from "node:test";
import { TokenPaceError } from "../src/errors.js";
import { paceStream } from "../src/stream.js";
import type { TelemetryReport } from "../src/telemetry.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { SDK_NAME, SDK_VERSION } from "../src/version.js";
import { contentChunk } from "./helpers.js";
import { json, startServer } from "./server.js";

const REQUEST_ID = "0123456789abcdef0123456789abcdef";
const accepted = {
  object: "tokenpace.telemetry",
  request_id: REQUEST_ID,
  tier: "chat",
  expected: { ttft: 1.0, tds: 4.8 },
  qoe: { andes: 1, monotone: 1, displayed_andes: 1, displayed_monotone: 1 },
};

async function* tokens(n: number): AsyncGenerator<ChatCompletionChunk> {
  for (let i = 0; i < n; i++) yield contentChunk(` w${i}`);
}

function gatewayHeaders(token?: string): Headers {
  const headers = new Headers({ "X-Request-Id": REQUEST_ID, "X-TokenPace-TDS": "1000", "X-TokenPace-TTFT": "1.0" });
  if (token !== undefined) headers.set("X-TokenPace-Telemetry-Token", token);
  return headers;
}

async function drain(stream: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of stream);
}

test("the report goes with the telemetry token when the response had one, and no key", async () => {
  const server = await startServer((_req, res) => json(res, 200, accepted));
  try {
    const stream = paceStream(tokens(3), {
      headers: gatewayHeaders("tok.en"),
      telemetry: { url: `${server.url}/v1/tokenpace/telemetry`, apiKey: "tp-secret" },
    });
    await drain(stream);
    assert.deepEqual(await stream.reported, accepted);
    const [sent] = server.received;
    assert.equal(sent?.method, "POST");
    assert.equal(sent?.url, "/v1/tokenpace/telemetry");
    assert.equal(sent?.headers["x-tokenpace-telemetry-token"], "tok.en");
    assert.equal(sent?.headers["authorization"], undefined, "the key never leaves the page when a token exists");
    assert.equal(sent?.headers["content-type"], "application/json");
    const report = JSON.parse(sent?.body ?? "") as TelemetryReport;
    assert.deepEqual(Object.keys(report).sort(), ["arrivals", "displayed", "expected", "outcome", "request_id", "sdk"]);
    assert.equal(report.request_id, REQUEST_ID);
    assert.equal(report.outcome, "completed");
    assert.deepEqual(report.expected, { ttft: 1.0, tds: 1000 });
    assert.deepEqual(report.sdk, { name: SDK_NAME, version: SDK_VERSION });
    assert.equal(report.arrivals.reduce((n, [, c]) => n + c, 0), 3);
    assert.equal(report.displayed.reduce((n, [, c]) => n + c, 0), 3);
  } finally {
    await server.close();
  }
});

test("without a token the report goes with the API key", async () => {
  const server = await startServer((_req, res) => json(res, 200, accepted));
  try {
    const stream = paceStream(tokens(2), {
      headers: gatewayHeaders(),
      telemetry: { url: `${server.url}/v1/tokenpace/telemetry`, apiKey: "tp-secret" },
    });
    await drain(stream);
    assert.deepEqual(await stream.reported, accepted);
    assert.equal(server.received[0]?.headers["authorization"], "Bearer tp-secret");
    assert.equal(server.received[0]?.headers["x-tokenpace-telemetry-token"], undefined);
  } finally {
    await server.close();
  }
});

test("a refused report, a dead server, no credentials, no request id: onError is told, nothing throws", async () => {
  const server = await startServer((_req, res) =>
    json(res, 401, { error: { message: "Invalid telemetry token.", type: "invalid_request_error", param: null, code: "invalid_telemetry_token" } }),
  );
  const errors: unknown[] = [];
  const onError = (e: unknown): void => {
    errors.push(e);
  };
  try {
    const refused = paceStream(tokens(2), { headers: gatewayHeaders("forged"), telemetry: { url: `${server.url}/t`, onError } });
    await drain(refused);
    assert.equal(await refused.reported, undefined);
    assert.ok(errors[0] instanceof TokenPaceError);
    assert.equal(errors[0].status, 401);
    assert.equal(errors[0].code, "invalid_telemetry_token");
    assert.match(errors[0].message, /Invalid telemetry token/);
  } finally {
    await server.close();
  }
  const dead = paceStream(tokens(1), { headers: gatewayHeaders("t"), telemetry: { url: server.url, onError } });
  await drain(dead);
  assert.equal(await dead.reported, undefined);
  assert.equal(errors.length, 2, "a connection refused is reported to onError");
  const noAuth = paceStream(tokens(1), { headers: gatewayHeaders(), telemetry: { url: server.url, onError } });
  await drain(noAuth);
  assert.match(String(errors[2]), /no API key/);
  const noId = paceStream(tokens(1), { telemetry: { url: server.url, apiKey: "k", onError } });
  await drain(noId);
  assert.match(String(errors[3]), /X-Request-Id/);
  const throwing = paceStream(tokens(1), {
    headers: gatewayHeaders("t"),
    telemetry: {
      url: server.url,
      onError: () => {
        throw new Error("handler bug");
      },
    },
  });
  await drain(throwing);
  assert.equal(await throwing.reported, undefined, "a throwing onError is contained too");
});

test("telemetry: false, or no URL, sends nothing", async () => {
  const server = await startServer((_req, res) => json(res, 200, accepted));
  try {
    for (const telemetry of [false as const, { apiKey: "k" }]) {
      const stream = paceStream(tokens(1), { headers: gatewayHeaders("t"), telemetry });
      await drain(stream);
      assert.equal(await stream.reported, undefined);
    }
    assert.equal(server.received.length, 0);
  } finally {
    await server.close();
  }
});

/** A page for the test: window and document events, `navigator.sendBeacon`. */
function fakePage(): { hide(): void; close(): void; beacons: Array<{ url: string; data: Blob }>; remove(): void } {
  const window = new EventTarget();
  const document = Object.assign(new EventTarget(), { visibilityState: "visible" });
  const beacons: Array<{ url: string; data: Blob }> = [];
  const g = globalThis as Record<string, unknown>;
  const saved = { addEventListener: g["addEventListener"], removeEventListener: g["removeEventListener"], document: g["document"], navigator: g["navigator"] };
  Object.defineProperty(globalThis, "navigator", { value: { sendBeacon: (url: string, data: Blob) => beacons.push({ url, data }) > 0 }, configurable: true, writable: true });
  g["document"] = document;
  g["addEventListener"] = window.addEventListener.bind(window);
  g["removeEventListener"] = window.removeEventListener.bind(window);
  return {
    beacons,
    hide() {
      document.visibilityState = "hidden";
      document.dispatchEvent(new Event("visibilitychange"));
    },
    close() {
      window.dispatchEvent(new Event("pagehide"));
    },
    remove() {
      for (const [k, v] of Object.entries(saved)) Object.defineProperty(globalThis, k, { value: v, configurable: true, writable: true });
    },
  };
}

/** A source that delivers `n` tokens, then waits until aborted. */
function hanging(n: number): AsyncIterable<ChatCompletionChunk> {
  return {
    [Symbol.asyncIterator]() {
      let i = 0;
      return {
        next: () => (i < n ? Promise.resolve({ done: false, value: contentChunk(` w${i++}`) }) : new Promise(() => undefined)),
        return: async () => ({ done: true, value: undefined }),
      };
    },
  };
}

test("without reader signals, the page hidden mid-stream: the report goes by sendBeacon, text/plain, token in the body, once", async () => {
  const page = fakePage();
  const server = await startServer((_req, res) => json(res, 200, accepted));
  try {
    const stream = paceStream(hanging(2), {
      headers: gatewayHeaders("tok.en"),
      tds: 1000,
      telemetry: { url: `${server.url}/v1/tokenpace/telemetry`, apiKey: "tp-secret" },
      readerSignals: false,
    });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    await it.next();
    page.hide();
    assert.equal(page.beacons.length, 1);
    const [beacon] = page.beacons;
    assert.equal(beacon?.url, `${server.url}/v1/tokenpace/telemetry`);
    assert.equal(beacon?.data.type, "text/plain");
    const body = JSON.parse(await (beacon as { data: Blob }).data.text()) as TelemetryReport & { telemetry_token: string };
    assert.equal(body.telemetry_token, "tok.en");
    assert.equal(body.request_id, REQUEST_ID);
    assert.equal(body.outcome, "aborted", "the user left before the reply ended");
    assert.equal(body.displayed.reduce((n, [, c]) => n + c, 0), 2);
    assert.equal(await stream.reported, undefined);
    stream.abort();
    page.close();
    assert.equal(page.beacons.length, 1, "one report per request");
    assert.equal(server.received.length, 0);
  } finally {
    page.remove();
    await server.close();
  }
});

test("with reader signals, a hidden page is away, not gone: the report waits; closing it sends left and the report by beacon", async () => {
  const page = fakePage();
  const server = await startServer((_req, res) => json(res, 202, {}));
  try {
    const stream = paceStream(hanging(2), {
      headers: gatewayHeaders("tok.en"),
      tds: 1000,
      telemetry: { url: `${server.url}/v1/tokenpace/telemetry` },
    });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    await it.next();
    page.hide();
    assert.equal(page.beacons.length, 0, "hidden is not gone: no report yet");
    for (let i = 0; i < 100 && server.received.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    const [away] = server.received;
    assert.equal(away?.url, "/v1/tokenpace/reader");
    assert.equal(away?.headers["x-tokenpace-telemetry-token"], "tok.en");
    assert.deepEqual(JSON.parse(away?.body ?? ""), { request_id: REQUEST_ID, presence: "away", buffer_tokens: 0 });
    page.close();
    const bodies = await Promise.all(page.beacons.map(async (b) => [b.url, JSON.parse(await b.data.text())] as const));
    assert.deepEqual(
      bodies.map(([url, body]) => [url.slice(server.url.length), body.presence ?? body.outcome, body.telemetry_token]),
      [
        ["/v1/tokenpace/reader", "left", "tok.en"],
        ["/v1/tokenpace/telemetry", "aborted", "tok.en"],
      ],
    );
    assert.ok((bodies[1]?.[1] as { away?: unknown }).away !== undefined, "the report says when the reader was away");
    stream.abort();
    assert.equal(page.beacons.length, 2, "nothing more after the end");
  } finally {
    page.remove();
    await server.close();
  }
});

test("the page closes without a token: a keepalive fetch with the key; after the end, nothing more", async () => {
  const page = fakePage();
  const server = await startServer((_req, res) => json(res, 200, accepted));
  try {
    const stream = paceStream(hanging(1), {
      headers: gatewayHeaders(),
      telemetry: { url: `${server.url}/t`, apiKey: "tp-secret" },
    });
    await stream[Symbol.asyncIterator]().next();
    page.close();
    assert.deepEqual(await stream.reported, accepted);
    assert.equal(page.beacons.length, 0, "a beacon cannot carry the key");
    assert.equal(server.received[0]?.headers["authorization"], "Bearer tp-secret");
    assert.equal(JSON.parse(server.received[0]?.body ?? "").outcome, "aborted");
    stream.abort();
    const done = paceStream(tokens(1), { headers: gatewayHeaders("t"), telemetry: { url: `${server.url}/t` } });
    await drain(done);
    await done.reported;
    page.hide();
    assert.equal(page.beacons.length, 0, "a finished stream has reported already");
    assert.equal(server.received.length, 2);
  } finally {
    page.remove();
    await server.close();
  }
});
