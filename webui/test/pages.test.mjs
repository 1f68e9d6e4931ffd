// The demo, the dashboard and /docs end to end: a real gateway on its embedded engine,
// the pages it serves, Debian's Chromium. Timing checks are on medians and rates with
// tolerances that hold on a loaded 2-core machine; the pacing logic itself is tested on
// an injectable clock in sdk_web's unit tests.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { counter, DEMO_KEY, eventually, launchBrowser, screenshot, startGateway, startScriptedServer } from "./support.mjs";

/** The gateway's default tiers (generated from its table by scripts/make_tier_vectors.py). */
const TIERS = JSON.parse(readFileSync(new URL("../../tests/vectors/tiers.json", import.meta.url), "utf8")).tiers;
/** The dashboard's QoE history on open: 5 minutes in steps of 30 s (src/dashboard.ts). */
const HISTORY_SAMPLES = 10;
const HISTORY_STEP_MS = 30_000;

let gw;
let browser;
let firstReplyAt; // when the first demo reply ended: the dashboard's history holds it 30 s later

before(async () => {
  gw = await startGateway();
  browser = await launchBrowser(gw.url);
});

after(async () => {
  await browser?.close();
  await gw?.stop();
});

/**
 * Every response of `page` that failed (a 404 favicon included), as "status url", and
 * everything its Content-Security-Policy refused, as "csp message".
 */
function failures(page) {
  const failed = [];
  page.on("response", (response) => {
    if (response.status() >= 400) failed.push(`${response.status()} ${response.url()}`);
  });
  page.on("requestfailed", (request) => failed.push(`failed ${request.url()} ${request.failure()?.errorText}`));
  page.on("console", (message) => {
    if (message.type() === "error" && message.text().includes("Content Security Policy")) failed.push(`csp ${message.text()}`);
  });
  return failed;
}

/** A new tab on /demo (of `on`, in `using`) that records when the reply's text grows and what it speaks. */
async function openDemo(using = browser, on = gw) {
  const page = await using.context.newPage();
  const failed = failures(page);
  await page.addInitScript(() => {
    window.__shown = [];
    window.__spoken = [];
    window.__statuses = [];
    document.addEventListener("DOMContentLoaded", () => {
      const reply = document.getElementById("reply");
      new MutationObserver(() => {
        window.__shown.push([performance.now(), reply.textContent.length]);
      }).observe(reply, { childList: true, characterData: true, subtree: true });
      const status = document.getElementById("status");
      new MutationObserver(() => {
        window.__statuses.push([status.dataset.state, status.textContent]);
      }).observe(status, { attributes: true, childList: true, characterData: true, subtree: true });
    });
    if ("speechSynthesis" in window) {
      const speak = speechSynthesis.speak.bind(speechSynthesis);
      speechSynthesis.speak = (utterance) => {
        window.__spoken.push(utterance.text);
        speak(utterance);
      };
    }
  });
  const reports = [];
  page.on("request", (request) => {
    if (request.url().endsWith("/v1/tokenpace/telemetry")) reports.push(request);
  });
  await page.goto(`${on.url}/demo`);
  return { page, reports, failed };
}

async function enterKey(page, key) {
  await page.fill("#key-form input[name=key]", key);
  await page.click("#key-form button[type=submit]");
  await page.waitForSelector("#model:has-text('model:')");
}

async function sendMessage(page, { tier, maxTokens, text }) {
  await page.selectOption("#tier", tier);
  await page.fill("#max-tokens", String(maxTokens));
  await page.fill("#message", text);
  await page.evaluate(() => (window.__shown = []));
  await page.click("#send");
}

/** [ms, length] each time the reply grew. */
async function growth(page) {
  const shown = await page.evaluate(() => window.__shown);
  const out = [];
  for (const [t, length] of shown) {
    if (length > (out.at(-1)?.[1] ?? 0)) out.push([t, length]);
  }
  return out;
}

/** The statuses the demo showed, in order, as `[state, text]` (recorded from the page's start). */
async function statuses(page) {
  return await page.evaluate(() => window.__statuses);
}

/** How many pixels of a row through the plot (a quarter down) are freeze shading alone. */
async function shadedPixels(page) {
  return await page.evaluate(() => {
    const canvas = document.querySelector("#plot canvas");
    const y = Math.round(canvas.height * 0.25);
    const row = canvas.getContext("2d").getImageData(0, y, canvas.width, 1).data;
    let shaded = 0;
    for (let i = 0; i < row.length; i += 4) {
      const [r, g, b, a] = row.slice(i, i + 4);
      if (a > 20 && a < 90 && r > 150 && g < 120 && b < 120) shaded++; // rgba(229, 57, 53, 0.18)
    }
    return shaded;
  });
}

/** Per displayed token after the first: the wait beyond the pace 1/TDS (recursion D), s. */
function displayGaps(displayed, tds) {
  const times = displayed.flatMap(([t, n]) => Array(n).fill(t));
  const shown = [];
  for (const t of times) shown.push(shown.length ? Math.max(t, shown.at(-1) + 1 / tds) : t);
  return shown.slice(1).map((d, k) => d - shown[k] - 1 / tds);
}

/** A gateway configuration (YAML): tenant `demo` with `DEMO_KEY`, one embedded engine. */
function oneEngine(model, options, more = []) {
  return [
    "tenants:",
    "  - name: demo",
    "    api_keys:",
    `      - key: "${DEMO_KEY}"`,
    "backends:",
    "  - name: engine",
    "    kind: embedded",
    `    models: [${model}]`,
    `    options: ${options}`,
    ...more.map((line) => `    ${line}`),
    "",
  ].join("\n");
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

describe("demo page", () => {
  test("before a key: Send disabled, a placeholder in the plot box, an icon and no failed request", { timeout: 60_000 }, async () => {
    const { page, failed } = await openDemo();
    assert.equal(await page.isVisible("#key-form"), true);
    assert.equal(await page.isDisabled("#send"), true, "nothing can be sent without a key");
    assert.equal(await page.getAttribute("#status", "data-state"), "no-key");
    assert.match(await page.textContent("#status"), /API key/);
    const placeholder = page.locator("#plot .placeholder");
    assert.equal(await placeholder.isVisible(), true);
    assert.match(await placeholder.textContent(), /delivery timeline is drawn here/);
    const icon = await page.evaluate(async () => {
      const href = document.querySelector("link[rel=icon]").href;
      const response = await fetch(href);
      return { status: response.status, type: response.headers.get("content-type") };
    });
    assert.deepEqual(icon, { status: 200, type: "image/svg+xml" });
    await screenshot(page, "demo-no-key.png");

    await enterKey(page, gw.demoKey);
    assert.equal(await page.isEnabled("#send"), true, "a key: Send is enabled");
    assert.equal(await page.getAttribute("#status", "data-state"), "idle");
    assert.equal(await placeholder.isVisible(), true, "the placeholder stays until a reply starts");
    await page.click("#forget-key");
    assert.equal(await page.isDisabled("#send"), true, "a forgotten key disables Send again");
    assert.deepEqual(failed, [], "no request of the page failed (no favicon 404)");
    await page.close();
  });

  test("the voice tier says whether this browser can speak", { timeout: 60_000 }, async () => {
    const { page } = await openDemo();
    await enterKey(page, gw.demoKey);
    assert.equal(await page.isVisible("#speech"), false, "said on the voice tier only");
    await page.selectOption("#tier", "voice");
    assert.equal(await page.isVisible("#speech"), true);
    const voices = await page.evaluate(() => ("speechSynthesis" in window ? speechSynthesis.getVoices().length : -1));
    const said = await page.textContent("#speech");
    if (voices < 0) assert.match(said, /no speech synthesis/);
    else if (voices === 0) assert.match(said, /no voices installed: the voice tier's reply is shown, not spoken/);
    else assert.match(said, /speaks the voice tier's reply/);
    await screenshot(page, "demo-voice-tier.png");
    await page.close();
  });

  test("asks for the key once, paces the reply at the tier's speed and reports with the token", { timeout: 60_000 }, async (t) => {
    const { page, reports } = await openDemo();
    assert.equal(await page.isVisible("#key-form"), true);
    await enterKey(page, gw.demoKey);
    await page.reload();
    await page.waitForSelector("#model:has-text('model:')");
    assert.equal(await page.isVisible("#key-form"), false, "the key is kept for the tab");

    await sendMessage(page, { tier: "chat", maxTokens: 16, text: "Hello from Chromium" });
    await page.waitForSelector("#status[data-state=done]", { timeout: 30_000 });
    firstReplyAt = Date.now();
    assert.equal(await page.isVisible("#plot .placeholder"), false, "the plot replaced the placeholder");
    const steps = await growth(page);
    assert.equal(steps.length, 16, "one step on screen per token");
    const gaps = steps.slice(1).map(([t], i) => (t - steps[i][0]) / 1000);
    const expectedGap = 1 / TIERS.chat.tds;
    // never faster than the tier (the buffer paces), not much slower on a loaded machine
    const rate = (steps.length - 1) / ((steps.at(-1)[0] - steps[0][0]) / 1000);
    assert.ok(rate <= TIERS.chat.tds * 1.1, `displayed at ${rate.toFixed(2)} tokens/s`);
    assert.ok(rate >= TIERS.chat.tds * 0.6, `displayed at ${rate.toFixed(2)} tokens/s`);
    const typical = median(gaps);
    t.diagnostic(`chat tier: displayed at ${rate.toFixed(2)} tokens/s, median gap ${typical.toFixed(3)} s`);
    assert.ok(typical >= expectedGap * 0.85 && typical <= expectedGap * 1.5, `median gap ${typical} s`);
    assert.equal(await page.isVisible("#qoe"), true);
    const displayedQoE = Number(await page.textContent("#qoe-displayed"));
    assert.ok(displayedQoE > 0 && displayedQoE <= 1, `QoE ${displayedQoE}`);
    const requestId = (await page.textContent("#qoe-request")).trim();
    assert.match(requestId, /^[0-9a-f]{32}$/);
    await screenshot(page, "demo.png");

    // the report went out with the response's token, never the key
    const report = await eventually(() => reports[0], 10_000, "the telemetry report");
    const headers = await report.allHeaders();
    assert.equal(headers.authorization, undefined);
    const body = JSON.parse(report.postData());
    const token = headers["x-tokenpace-telemetry-token"] ?? body.telemetry_token;
    assert.ok(token, "the report carries the telemetry token");
    assert.equal(body.request_id, requestId);
    const sum = (timeline) => timeline.reduce((n, [, k]) => n + k, 0);
    assert.equal(sum(body.arrivals), 16);
    assert.equal(sum(body.displayed), 16);
    // the engine is faster than the tier: the buffer, not the network, set the pace
    assert.ok(body.arrivals.at(-1)[0] < body.displayed.at(-1)[0]);
    const response = await eventually(() => report.response(), 10_000, "the report's answer");
    assert.equal(response.status(), 200, await response.text());

    // the gateway holds the client-side record of this request
    const summary = await eventually(async () => {
      const qoe = await gw.get("/v1/tokenpace/qoe?window=600", gw.demoKey);
      return qoe.tenants.demo?.tiers.chat?.client.count >= 1 ? qoe : null;
    }, 10_000, "the client-side QoE record");
    const client = summary.tenants.demo.tiers.chat.client;
    assert.ok(Math.abs(client.displayed_andes.mean - displayedQoE) < 0.01);
    assert.deepEqual(browser.refused, [], "the page needs no outside network");
    await page.close();
  });

  test("stop aborts the stream and the gateway sees the disconnect", { timeout: 60_000 }, async () => {
    const { page } = await openDemo();
    await enterKey(page, gw.demoKey);
    const before = counter(await gw.get("/metrics", gw.adminKey), "tokenpace_requests_total", {
      endpoint: "chat.completions",
      outcome: "aborted",
    });
    await sendMessage(page, { tier: "chat", maxTokens: 400, text: "A long answer, please" });
    await eventually(async () => (await growth(page)).length >= 3, 20_000, "three tokens on screen");
    await page.click("#stop");
    await page.waitForSelector("#status[data-state=aborted]", { timeout: 10_000 });
    const stoppedAt = (await page.textContent("#reply")).length;
    await eventually(async () => {
      const metrics = await gw.get("/metrics", gw.adminKey);
      const aborted = counter(metrics, "tokenpace_requests_total", {
        endpoint: "chat.completions",
        outcome: "aborted",
      });
      return aborted === before + 1;
    }, 10_000, "the gateway to count the aborted stream");
    const status = await gw.get("/v1/tokenpace/admin/status", gw.adminKey);
    assert.equal(status.requests_in_flight, 0);
    assert.equal(status.backends[0].in_flight, 0);
    await page.waitForTimeout(1000);
    assert.equal((await page.textContent("#reply")).length, stoppedAt, "nothing shown after stop");
    assert.ok(stoppedAt < 400 * 3, "the reply was cut short");
    await page.close();
  });

  test("a hidden tab says away and stops showing; shown again, it says watching and the reply resumes; closing says left", { timeout: 90_000 }, async () => {
    const { page, reports } = await openDemo();
    const signals = [];
    page.on("request", (request) => {
      if (request.url().endsWith("/v1/tokenpace/reader")) signals.push(request);
    });
    /** Switch the tab away or back: what the browser does (headless Chromium never hides a page). */
    const setHidden = (hidden) =>
      page.evaluate((hidden) => {
        Object.defineProperty(document, "visibilityState", { configurable: true, get: () => (hidden ? "hidden" : "visible") });
        document.dispatchEvent(new Event("visibilitychange"));
        return performance.now();
      }, hidden);
    const bodies = () => signals.map((r) => JSON.parse(r.postData()));
    await enterKey(page, gw.demoKey);
    // a reply long enough that the gateway still streams it when the tab is hidden and shown
    // (the simulated engine writes about 5 ms a token; the page shows 4.8 tokens a second)
    await sendMessage(page, { tier: "chat", maxTokens: 3000, text: "A long answer, please" });
    await eventually(async () => (await growth(page)).length >= 3, 20_000, "three tokens on screen");

    await setHidden(true);
    const away = await eventually(() => bodies().find((b) => b.presence === "away"), 10_000, "the away signal");
    const request = signals.find((r) => JSON.parse(r.postData()).presence === "away");
    const headers = await request.allHeaders();
    assert.ok(headers["x-tokenpace-telemetry-token"]?.startsWith("tpt1."), "authenticated by the telemetry token");
    assert.equal(headers.authorization, undefined, "never by the key");
    const answer = await eventually(() => request.response(), 10_000, "the gateway's answer");
    assert.equal(answer.status(), 202, "the gateway took it");
    assert.match(away.request_id, /^[0-9a-f]{32}$/);
    assert.ok(Number.isInteger(away.buffer_tokens) && away.buffer_tokens >= 0);
    const hiddenAt = (await page.textContent("#reply")).length;
    await page.waitForTimeout(1500);
    assert.equal((await page.textContent("#reply")).length, hiddenAt, "nothing is shown while away");
    assert.equal(await page.textContent("#presence"), "away");

    await page.evaluate(() => (window.__shown = []));
    const shownAt = await setHidden(false);
    const back = await eventually(() => bodies().find((b) => b.presence === "watching"), 10_000, "the watching signal");
    assert.equal(back.request_id, away.request_id);
    assert.ok(back.buffer_tokens > 0, "the tokens that came while away wait in the buffer");
    const resumed = await eventually(async () => (await growth(page))[0]?.[0], 10_000, "the reply to resume");
    const resumeS = (resumed - shownAt) / 1000;
    console.log(`# reader back: the reply resumed ${resumeS.toFixed(3)} s after the tab was shown`);
    assert.ok(resumeS <= 2.0, `resumed ${resumeS.toFixed(3)} s after the return: more than a 2 s freeze`);
    await eventually(async () => (await page.textContent("#signals")).includes("accepted"), 10_000, "the panel to show the answers");

    await page.evaluate(() => window.dispatchEvent(new PageTransitionEvent("pagehide", { persisted: false })));
    const left = await eventually(() => signals.find((r) => JSON.parse(r.postData()).presence === "left"), 10_000, "the left beacon");
    assert.equal(left.resourceType(), "ping", "sent with navigator.sendBeacon");
    assert.match((await left.allHeaders())["content-type"], /^text\/plain/);
    const leftBody = JSON.parse(left.postData());
    assert.ok(leftBody.telemetry_token.startsWith("tpt1."));
    assert.equal(leftBody.request_id, away.request_id);
    const report = JSON.parse((await eventually(() => reports[0], 10_000, "the report beacon")).postData());
    assert.equal(report.outcome, "aborted");
    assert.equal(report.away.length, 1, "the report says when the reader was away");
    const [from, to] = report.away[0];
    assert.ok(to - from >= 1.5, `away ${from}-${to} s`);
    await page.close();
  });

  test("on the voice tier, pausing the speech says away and holds the reply; resuming says watching", { timeout: 90_000 }, async () => {
    const { page } = await openDemo();
    const signals = [];
    page.on("request", (request) => {
      if (request.url().endsWith("/v1/tokenpace/reader")) signals.push(JSON.parse(request.postData()));
    });
    await enterKey(page, gw.demoKey);
    assert.equal(await page.isVisible("#pause-speech"), false, "offered only while a voice reply streams");
    await sendMessage(page, { tier: "voice", maxTokens: 3000, text: "Read me a long story" });
    await eventually(async () => (await growth(page)).length >= 2, 20_000, "two tokens on screen");
    await page.click("#pause-speech");
    await eventually(() => signals.find((b) => b.presence === "away"), 10_000, "the away signal");
    assert.equal(await page.textContent("#pause-speech"), "Resume speech");
    const pausedAt = (await page.textContent("#reply")).length;
    await page.waitForTimeout(1200);
    assert.equal((await page.textContent("#reply")).length, pausedAt, "nothing is shown or spoken while paused");
    await page.evaluate(() => (window.__shown = []));
    const resumedAt = await page.evaluate(() => performance.now());
    await page.click("#pause-speech");
    await eventually(() => signals.find((b) => b.presence === "watching"), 10_000, "the watching signal");
    const resumed = await eventually(async () => (await growth(page))[0]?.[0], 10_000, "the reply to resume");
    assert.ok((resumed - resumedAt) / 1000 <= 2.0, `resumed ${((resumed - resumedAt) / 1000).toFixed(3)} s after the speech did`);
    await page.click("#stop");
    await page.waitForSelector("#status[data-state=aborted]", { timeout: 10_000 });
    await eventually(() => signals.find((b) => b.presence === "left"), 10_000, "the left signal on Stop");
    assert.equal(await page.isVisible("#pause-speech"), false);
    await page.close();
  });

  test("the voice tier speaks the reply sentence by sentence", { timeout: 60_000 }, async (t) => {
    const { page } = await openDemo();
    assert.equal(await page.evaluate(() => "speechSynthesis" in window), true);
    await enterKey(page, gw.demoKey);
    await sendMessage(page, { tier: "voice", maxTokens: 12, text: "Say something" });
    await page.waitForSelector("#status[data-state=done]", { timeout: 30_000 });
    const spoken = await page.evaluate(() => window.__spoken);
    const reply = await page.textContent("#reply");
    assert.ok(spoken.length >= 1);
    assert.equal(spoken.join(" ").replace(/\s+/g, " ").trim(), reply.replace(/\s+/g, " ").trim());
    const steps = await growth(page);
    const rate = (steps.length - 1) / ((steps.at(-1)[0] - steps[0][0]) / 1000);
    t.diagnostic(`voice tier: displayed at ${rate.toFixed(2)} tokens/s, ${spoken.length} utterance(s)`);
    assert.ok(rate <= TIERS.voice.tds * 1.1 && rate >= TIERS.voice.tds * 0.6, `${rate} tokens/s`);
    await page.close();
  });
});

describe("demo page: queue notices and freezes", () => {
  test("while queue notices come, the page says how long the wait should be (a scripted server response)", { timeout: 60_000 }, async () => {
    // Exact notices and an exact stop: the page's completions request is routed to a
    // scripted server that answers as the protocol says (docs/protocol.md, "Queue
    // notices"): notices, then (told by the test) a reply with a 1.2 s stop. The real
    // gateway's notices are the next test's.
    const steps = [];
    let next = () => undefined;
    const scripted = await startScriptedServer(async (_req, res) => {
      res.writeHead(200, {
        "Content-Type": "text/event-stream",
        "X-Request-Id": "5c41a7ed5c41a7ed5c41a7ed5c41a7ed",
        "X-TokenPace-Tier": "chat",
        "X-TokenPace-TTFT": "1.0",
        "X-TokenPace-TDS": "10.0",
      });
      const step = () => new Promise((resolve) => (next = resolve));
      const token = (text) => `data: ${JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: text }, finish_reason: null }] })}\n\n`;
      res.write(": queued position=3 eta_s=2.4\n\n");
      steps.push("queued 3");
      await step();
      res.write(": ping\n\n: queued position=1 eta_s=0\n\n");
      steps.push("queued 1");
      await step();
      res.write(token("One") + token(" two") + token(" three"));
      await new Promise((r) => setTimeout(r, 1200));
      res.end(token(" four") + token(" five") + token(" six") + "data: [DONE]\n\n");
      steps.push("replied");
    });
    const { page } = await openDemo();
    try {
      await page.route("**/v1/chat/completions", (route) => route.continue({ url: `${scripted.url}/v1/chat/completions` }));
      await enterKey(page, gw.demoKey);
      await sendMessage(page, { tier: "chat", maxTokens: 6, text: "Wait for me" });
      await page.waitForSelector("#status[data-state=queued]", { timeout: 10_000 });
      assert.equal(await page.textContent("#status"), "Waiting for an engine, about 3 s (number 3 in line)…");
      assert.equal(await page.textContent("#reply"), "");
      await screenshot(page, "demo-queued.png");
      next();
      await page.waitForSelector("#status:has-text('number 1 in line')", { timeout: 10_000 });
      assert.equal(await page.textContent("#status"), "Waiting for an engine (number 1 in line)…", "eta_s 0: no time said");
      next();
      await page.waitForSelector("#status[data-state=done]", { timeout: 20_000 });
      assert.deepEqual(steps, ["queued 3", "queued 1", "replied"]);
      assert.equal(await page.textContent("#reply"), "One two three four five six");
      assert.deepEqual(
        (await statuses(page)).map(([state]) => state),
        ["idle", "waiting", "queued", "queued", "streaming", "done"],
        "queued until the first token, then streaming",
      );

      // the stop: tokens 1-3 shown 0.1 s apart, token 4 came 1.2 s after them: a freeze of
      // about 1.2 - 0.2 - 0.1 = 0.9 s, less when token 3 was shown late, more when the
      // scripted server's timer ran late
      const freeze = await page.textContent("#qoe-freeze");
      const longest = Number(/^([0-9.]+) s \(/.exec(freeze)?.[1]);
      assert.ok(longest > 0.7 && longest < 1.5, `longest freeze: ${freeze}`);
      assert.ok(Number(await page.getAttribute("#plot", "data-freezes")) >= 1);
      await page.waitForTimeout(100); // the plot draws on the next frame
      assert.ok((await shadedPixels(page)) >= 20, "the freeze is shaded on the plot");
      await screenshot(page, "demo-freeze-scripted.png");
    } finally {
      next();
      await page.close();
      await scripted.close();
    }
  });

  test("a real overloaded gateway: the page says the request is queued, then streams it", { timeout: 90_000 }, async () => {
    // One engine slot (max_concurrent: 1) on an embedded engine at 0.05x speed: a
    // 40-token reply holds it for about 4 s, and the page's request waits behind it.
    const busy = await startGateway({
      config: oneEngine("tokenpace-sim-one", "{time_scale: 0.05}", ["max_concurrent: 1"]),
    });
    const busyBrowser = await launchBrowser(busy.url);
    try {
      const holder = await fetch(`${busy.url}/v1/chat/completions`, {
        method: "POST",
        headers: { Authorization: `Bearer ${DEMO_KEY}`, "Content-Type": "application/json" },
        body: JSON.stringify({ model: "tokenpace-sim-one", messages: [{ role: "user", content: "hold" }], stream: true, max_tokens: 40 }),
      });
      assert.equal(holder.status, 200);
      const held = holder.text(); // read to the end meanwhile
      const { page } = await openDemo(busyBrowser, busy);
      await enterKey(page, busy.demoKey);
      await sendMessage(page, { tier: "chat", maxTokens: 4, text: "Wait in line" });
      await page.waitForSelector("#status[data-state=queued]", { timeout: 10_000 });
      const waiting = await page.textContent("#status");
      assert.match(waiting, /^Waiting for an engine(, about \d+ s)? \(number 1 in line\)…$/);
      await screenshot(page, "demo-queued-gateway.png");
      await page.waitForSelector("#status[data-state=done]", { timeout: 30_000 });
      assert.match(await held, /data: \[DONE\]/);
      const states = (await statuses(page)).map(([state]) => state);
      assert.deepEqual(
        states.filter((s, i) => s !== states[i - 1]),
        ["idle", "waiting", "queued", "streaming", "done"],
        "queued until the first token, then streaming",
      );
      assert.ok((await page.textContent("#reply")).length > 0);
      const metrics = await busy.get("/metrics", busy.adminKey);
      assert.equal(counter(metrics, "tokenpace_queued_with_notice_total", { tenant: "demo", tier: "chat" }), 1);
      assert.deepEqual(busyBrowser.refused, []);
      await page.close();
    } finally {
      await busyBrowser.close();
      await busy.stop();
    }
  });

  test("a reply from an engine slower than the tier: its freezes are shaded and the longest shown", { timeout: 90_000 }, async (t) => {
    // The embedded engine run at 0.08x of opt-66b's speed: about 0.5 s a token against the
    // chat tier's 4.8 tokens/s, so the reader waits about 0.3 s for every token after the first.
    const slow = await startGateway({
      config: oneEngine("tokenpace-sim-slow", "{profile: opt-66b-4xa100, time_scale: 0.08}"),
    });
    const slowBrowser = await launchBrowser(slow.url);
    try {
      const { page, reports } = await openDemo(slowBrowser, slow);
      await enterKey(page, slow.demoKey);
      assert.equal(await page.textContent("#model"), "model: tokenpace-sim-slow");
      await sendMessage(page, { tier: "chat", maxTokens: 6, text: "Take your time" });
      await page.waitForSelector("#status[data-state=done]", { timeout: 30_000 });
      const freeze = await page.textContent("#qoe-freeze");
      const [, longest, count] = /^([0-9.]+) s \((\d+) freezes?, [0-9.]+ s in all\)$/.exec(freeze) ?? [];
      t.diagnostic(`slow engine, chat tier: longest freeze ${freeze}`);
      assert.ok(Number(longest) > 0.15, `a real stop: ${freeze}`);

      // the page's numbers are the freezes of the displayed timeline it reported: one
      // before every token after the first
      const report = JSON.parse((await eventually(() => reports[0], 10_000, "the telemetry report")).postData());
      const tokens = report.displayed.reduce((n, [, k]) => n + k, 0);
      assert.ok(tokens >= 4, `${tokens} tokens`);
      assert.equal(Number(count), tokens - 1, freeze);
      const gaps = displayGaps(report.displayed, TIERS.chat.tds);
      assert.ok(Math.abs(Math.max(...gaps) - Number(longest)) < 0.0015, `${Math.max(...gaps)} vs ${longest}`);
      assert.equal(gaps.filter((g) => g > 1e-6).length, Number(count));
      const idle = Number((await page.textContent("#qoe-idle")).replace(" s", ""));
      assert.ok(idle > 0.5, `user idle latency ${idle} s: the last token came well after its deadline`);

      assert.equal(Number(await page.getAttribute("#plot", "data-freezes")), Number(count));
      await page.waitForTimeout(100);
      assert.ok((await shadedPixels(page)) >= 40, "the freezes are shaded on the plot");
      await screenshot(page, "demo-freezes.png");
      assert.deepEqual(slowBrowser.refused, []);
      await page.close();
    } finally {
      await slowBrowser.close();
      await slow.stop();
    }
  });
});

describe("dashboard", () => {
  test("shows the QoE reports, fair share, load and backends, live", { timeout: 90_000 }, async () => {
    // the history on open holds a reply once it is a history step old
    const wait = (firstReplyAt ?? Date.now()) + HISTORY_STEP_MS + 2_000 - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const page = await browser.context.newPage();
    const failed = failures(page);
    await page.goto(`${gw.url}/dashboard`);
    await page.fill("#key-form input[name=key]", gw.demoKey);
    await page.click("#key-form button[type=submit]");
    await page.waitForSelector("#problem:has-text('refused')");
    assert.equal(await page.isVisible("#key-form"), true, "a tenant key does not open it");
    await page.fill("#key-form input[name=key]", gw.adminKey);
    await page.click("#key-form button[type=submit]");
    const cell = 'tr[data-key="demo/chat"] td[data-field="client-count"]';
    await page.waitForSelector(cell, { timeout: 10_000 });
    assert.ok(Number(await page.textContent(cell)) >= 1, "the client-side report is shown");
    // the readers away now, of the streams this replica relays, and the pace they give back
    await page.waitForSelector("#readers-away:has-text('tok/s back')");
    assert.match(await page.textContent("#readers-away"), /^\d+ \/ \d+ · \d+\.\d tok\/s back$/);
    const clientQoE = Number(await page.textContent('tr[data-key="demo/chat"] td[data-field="client-andes"]'));
    assert.ok(clientQoE > 0 && clientQoE <= 1);
    // what the readers saw, both sides: the share of replies frozen over 2 s and idle p99
    const field = (name) => page.textContent(`tr[data-key="demo/chat"] td[data-field="${name}"]`);
    for (const side of ["gateway", "client"]) {
      const frozen = await field(`${side}-frozen-2s`);
      assert.match(frozen, /^\d+\.\d %$/, `${side} frozen share: ${frozen}`);
      assert.ok(Number(frozen.replace(" %", "")) <= 100);
      const idle = await field(`${side}-idle-p99`);
      assert.match(idle, /^\d+\.\d\d s$/, `${side} idle p99: ${idle}`);
    }
    // the same numbers as the gateway's summary over the page's window
    const api = await gw.get("/v1/tokenpace/qoe?window=300", gw.adminKey);
    const reader = api.tenants.demo.tiers.chat.client.reader;
    assert.equal(await field("client-frozen-2s"), `${(reader.frozen_over_2s * 100).toFixed(1)} %`);
    assert.equal(await field("client-idle-p99"), `${reader.idle_p99_s.toFixed(2)} s`);
    assert.match(await field("client-longest-freeze"), /^\d+\.\d\d s$/);
    // readers away: the gateway's summary of the reports that said when (reader signals)
    const away = api.tenants.demo.tiers.chat.client.away;
    const awayCell = away === undefined ? "–" : `${(away.away_share * 100).toFixed(1)} % (mean ${away.mean_away_s.toFixed(2)} s)`;
    assert.equal(await field("client-away"), awayCell);
    assert.match(await page.textContent("#reader-hint"), /Eq\. 9/);
    assert.equal(await page.textContent('tr[data-key="embedded"] td[data-field="healthy"]'), "healthy");
    assert.ok(Number(await page.textContent('tr[data-key="demo"] td[data-field="output-tokens"]')) >= 16);
    assert.equal(await page.textContent("#ready"), "ready");
    // it refreshes by itself
    const polls = Number(await page.getAttribute("body", "data-polls"));
    await page.waitForFunction((n) => Number(document.body.dataset.polls) > n + 1, polls, { timeout: 10_000 });
    assert.equal(await page.locator(".uplot").count(), 4, "QoE gateway side, QoE client side, fair share, load");

    // the QoE charts began with the last minutes' history, before the first poll
    const drawn = await page.evaluate(() => {
      const of = (id) => ({ ...document.getElementById(id).dataset });
      return {
        polls: Number(document.body.dataset.polls),
        gateway: of("qoe-gateway-chart"),
        client: of("qoe-client-chart"),
        load: of("load-chart"),
        service: of("service-chart"),
      };
    });
    for (const side of ["gateway", "client"]) {
      assert.equal(Number(drawn[side].samples), HISTORY_SAMPLES + drawn.polls, `${side}: history, then one sample a poll`);
      assert.ok(Number(drawn[side].values) > drawn.polls, `${side}: the history has values (${drawn[side].values})`);
    }
    // and the load and fair-share charts with the gateway's samples, one every 2 s (the
    // gateway has run for over half a minute by now)
    const history = await (
      await fetch(`${gw.url}/v1/tokenpace/admin/history?seconds=300`, { headers: { Authorization: `Bearer ${gw.adminKey}` } })
    ).json();
    assert.ok(history.samples.length >= 10, `the gateway's history: ${history.samples.length} samples`);
    assert.ok(history.samples.at(-1).tenants.demo.output_tokens >= 16, "the demo's tokens are in it");
    for (const chart of ["load", "service"]) {
      const samples = Number(drawn[chart].samples);
      assert.ok(samples >= 10 + drawn.polls, `${chart}: history, then the polls (${samples} samples)`);
      assert.ok(Number(drawn[chart].values) >= 10, `${chart}: the history has values (${drawn[chart].values})`);
    }

    // the legends show the latest values without hovering
    for (const id of ["qoe-gateway-chart", "qoe-client-chart", "service-chart", "load-chart"]) {
      const values = await page.locator(`#${id} .u-legend .u-series:not(:first-child) .u-value`).allTextContents();
      assert.ok(values.length >= 1, `${id}: a legend`);
      assert.ok(values.every((v) => v !== "--" && Number.isFinite(Number(v))), `${id}: legend values ${values}`);
    }
    // throughput axes start at zero
    for (const id of ["service-chart", "load-chart"]) {
      assert.equal(await page.getAttribute(`#${id}`, "data-y-min"), "0", `${id} starts at zero`);
    }
    assert.match(await page.textContent("#load-hint"), /nearly always 0/);
    await screenshot(page, "dashboard.png");
    const pageFailures = failed.filter((f) => !f.includes("/v1/")); // the tenant key's 401s were meant
    assert.deepEqual(pageFailures, [], "no request for the page failed (no favicon 404)");
    assert.deepEqual(browser.refused, []);
    await page.close();
  });
});

describe("what the pages let the browser do", () => {
  test("every page forbids framing and code from elsewhere, and runs within its policy", { timeout: 60_000 }, async () => {
    for (const path of ["/demo", "/dashboard", "/docs"]) {
      const page = await browser.context.newPage();
      const failed = failures(page);
      const response = await page.goto(`${gw.url}${path}`);
      const headers = response.headers();
      assert.match(headers["content-security-policy"], /frame-ancestors 'none'/, path);
      assert.match(headers["content-security-policy"], /script-src 'self';/, path);
      assert.equal(headers["x-frame-options"], "DENY", path);
      assert.equal(headers["x-content-type-options"], "nosniff", path);
      if (path === "/demo") {
        await enterKey(page, gw.demoKey);
        await sendMessage(page, { tier: "fast", maxTokens: 5, text: "policy" });
        await page.waitForSelector("#status[data-state=done]", { timeout: 20_000 });
      } else if (path === "/dashboard") {
        await page.fill("#key-form input[name=key]", gw.adminKey);
        await page.click("#key-form button[type=submit]");
        await page.waitForFunction(() => Number(document.body.dataset.polls) >= 1, null, { timeout: 10_000 });
      } else {
        // Swagger UI, served by the gateway, on the gateway's own document
        await page.waitForSelector(".opblock-summary-path[data-path='/v1/chat/completions']", { timeout: 20_000 });
      }
      const problems = failed.filter((f) => !f.endsWith("/v1/chat/completions net::ERR_ABORTED")); // the reply's read, ended
      assert.deepEqual(problems, [], `${path}: nothing failed or was refused by the policy`);
      await page.close();
    }
    assert.deepEqual(browser.refused, [], "no page asked for anything outside the gateway");
  });

  test("another page cannot frame the dashboard's admin key form", { timeout: 60_000 }, async () => {
    const page = await browser.context.newPage();
    const framed = page.waitForResponse(`${gw.url}/dashboard`);
    await page.setContent(`<iframe id="f" src="${gw.url}/dashboard" width="800" height="600"></iframe>`);
    assert.equal((await framed).status(), 200, "the gateway answered; the browser refused to show it");
    await new Promise((r) => setTimeout(r, 500));
    const frame = page.frames().find((f) => f !== page.mainFrame());
    assert.ok(frame !== undefined);
    assert.notEqual(frame.url(), `${gw.url}/dashboard`, "the frame shows an error page, not the dashboard");
    assert.equal(await frame.locator("#key-form").count(), 0, "no key form in the frame");
    await page.close();
  });
});
