/**
 * The operator's dashboard (/dashboard): behind the admin key, it polls the gateway's
 * own APIs every few seconds (GET /v1/tokenpace/qoe for every tenant's QoE, client side
 * and gateway side; GET /v1/tokenpace/admin/status for backends, load and fair share)
 * and plots them over time. On open, the QoE charts start with the last minutes'
 * history, rebuilt from the QoE endpoint's nested windows (src/qoe_history.ts), and the
 * load and fair-share charts with the samples the gateway keeps every 2 s
 * (GET /v1/tokenpace/admin/history).
 */
import { LiveChart, SeriesColors } from "./live_chart.js";
import { history, historyWindows, totals, type QoESummary } from "./qoe_history.js";
import { askAgain, askForKey, byId, getJSON, HttpError, KeyStore } from "./session.js";

const POLL_MS = 2000;
const WINDOW_S = 300; // the QoE window: the last 5 minutes
const HISTORY_S = 300; // QoE history shown on open
const HISTORY_STEP_S = 30;
const KEEP = 900; // samples kept per chart: 30 minutes at POLL_MS

interface Stats {
  mean: number;
  p50: number;
  p90: number;
  p99: number;
}

/** What the readers saw (qos.metrics.ReaderSummary): freezes and user idle latency. */
interface Reader {
  replies: number;
  frozen_over_2s: number;
  frozen_over_5s: number;
  frozen_over_10s: number;
  longest_freeze_s: number;
  median_freeze_s: number | null;
  idle_p50_s: number;
  idle_p99_s: number;
}

/** Of the client reports that said when their reader was away (reader signals). */
interface Away {
  replies: number;
  away_share: number;
  mean_away_s: number;
}

interface Side {
  count: number;
  andes?: Stats;
  monotone?: Stats;
  displayed_andes?: Stats;
  reader?: Reader;
  away?: Away;
}

interface Pair {
  gateway: Side;
  client: Side;
}

interface QoEDetails extends QoESummary {
  tenants: Record<string, { overall: Pair; tiers: Record<string, Pair> }>;
}

/** Load and tokens served so far, at `time`: a history sample, and part of the status. */
interface Load {
  time: number;
  requests_in_flight: number;
  requests_queued: number;
  tenants: Record<string, { output_tokens: number }>;
}

interface Status extends Load {
  ready: boolean;
  /** This replica's streams by their readers' last signal; the tier pace the away ones give back. */
  readers: { watching: number; away: number; pace_away_tps: number };
  backends: Array<{
    name: string;
    healthy: boolean;
    in_flight: number;
    outstanding_tokens: number;
    prompt_tokens: number; // routed there by cache-aware routing, this replica
    prefix_cached_tokens: number; // ... of those, held there by the router's estimate
    last_error: string | null;
  }>;
  tenants: Record<string, { weight: number; vtc_counter: number; output_tokens: number; requests: number }>;
}

const keys = new KeyStore("tokenpace.adminKey");
const keyForm = byId<HTMLFormElement>("key-form");
const problem = byId<HTMLParagraphElement>("problem");
const colors = new SeriesColors(); // a tenant/tier has one colour on both sides
const qoeChart = (id: string, title: string): LiveChart =>
  new LiveChart(byId(id), { title, unit: `Andes QoE, ${WINDOW_S / 60} min mean`, keep: KEEP, range: [0, 1], colors });
const qoeCharts = {
  gateway: qoeChart("qoe-gateway-chart", "Gateway side"),
  client: qoeChart("qoe-client-chart", "Client side (the SDKs' reports)"),
};
const serviceChart = new LiveChart(byId("service-chart"), {
  title: "Fair share: output tokens/s served per tenant",
  unit: "tokens/s",
  keep: KEEP,
});
const loadChart = new LiveChart(byId("load-chart"), {
  title: "Requests in flight and queued",
  unit: "requests",
  keep: KEEP,
});

let previous: Load | null = null;
let timer: number | undefined;

function fmt(value: number | undefined, digits = 3): string {
  return value === undefined ? "–" : value.toFixed(digits);
}

function percent(share: number | undefined): string {
  return share === undefined ? "–" : `${(share * 100).toFixed(1)} %`;
}

function seconds(value: number | undefined): string {
  return value === undefined ? "–" : `${value.toFixed(2)} s`;
}

/** The share of replies whose reader was away at some point, and the mean time away. */
function awayText(away: Away | undefined): string {
  return away === undefined ? "–" : `${percent(away.away_share)} (mean ${seconds(away.mean_away_s)})`;
}

function cell(row: HTMLTableRowElement, field: string, text: string): void {
  const td = row.insertCell();
  td.dataset["field"] = field;
  td.textContent = text;
}

function fillTable(id: string, rows: Array<{ key: string; cells: Array<[string, string]> }>): void {
  const body = byId<HTMLTableSectionElement>(id);
  body.replaceChildren();
  for (const { key, cells } of rows) {
    const row = body.insertRow();
    row.dataset["key"] = key;
    for (const [field, text] of cells) cell(row, field, text);
  }
}

function showQoE(summary: QoEDetails, time: number): void {
  const samples: Record<"gateway" | "client", Record<string, number | null>> = { gateway: {}, client: {} };
  const rows: Array<{ key: string; cells: Array<[string, string]> }> = [];
  for (const [tenant, { tiers }] of Object.entries(summary.tenants)) {
    for (const [tier, { gateway, client }] of Object.entries(tiers)) {
      const key = `${tenant}/${tier}`;
      samples.client[key] = client.andes?.mean ?? null;
      samples.gateway[key] = gateway.andes?.mean ?? null;
      rows.push({
        key,
        cells: [
          ["tenant", tenant],
          ["tier", tier],
          ["gateway-count", String(gateway.count)],
          ["gateway-andes", fmt(gateway.andes?.mean)],
          ["client-count", String(client.count)],
          ["client-andes", fmt(client.andes?.mean)],
          ["client-displayed-andes", fmt(client.displayed_andes?.mean)],
          ["client-andes-p50", fmt(client.andes?.p50)],
          ["gateway-frozen-2s", percent(gateway.reader?.frozen_over_2s)],
          ["client-frozen-2s", percent(client.reader?.frozen_over_2s)],
          ["client-longest-freeze", seconds(client.reader?.longest_freeze_s)],
          ["client-away", awayText(client.away)],
          ["gateway-idle-p99", seconds(gateway.reader?.idle_p99_s)],
          ["client-idle-p99", seconds(client.reader?.idle_p99_s)],
        ],
      });
    }
  }
  qoeCharts.gateway.push(time, samples.gateway);
  qoeCharts.client.push(time, samples.client);
  fillTable("qoe-rows", rows);
}

/** One point of the load and fair-share charts (the rates since the previous one). */
function pushLoad(load: Load): void {
  loadChart.push(load.time, { "in flight": load.requests_in_flight, queued: load.requests_queued });
  const rates: Record<string, number | null> = {};
  for (const [tenant, t] of Object.entries(load.tenants)) {
    const before = previous?.tenants[tenant];
    const dt = previous ? load.time - previous.time : 0;
    rates[tenant] = before && dt > 0 ? Math.max(0, t.output_tokens - before.output_tokens) / dt : null;
  }
  serviceChart.push(load.time, rates);
  previous = load;
}

/** "away of all, the pace they give back": e.g. "3 / 40 · 14.4 tok/s back". */
function readersAway(readers: Status["readers"]): string {
  const all = readers.watching + readers.away;
  return `${readers.away} / ${all} · ${readers.pace_away_tps.toFixed(1)} tok/s back`;
}

function showStatus(status: Status): void {
  byId("ready").textContent = status.ready ? "ready" : "NOT READY";
  byId("ready").dataset["ready"] = String(status.ready);
  byId("in-flight").textContent = String(status.requests_in_flight);
  byId("queued").textContent = String(status.requests_queued);
  byId("readers-away").textContent = readersAway(status.readers);
  pushLoad(status);
  fillTable(
    "backend-rows",
    status.backends.map((b) => ({
      key: b.name,
      cells: [
        ["name", b.name],
        ["healthy", b.healthy ? "healthy" : "DOWN"],
        ["in-flight", String(b.in_flight)],
        ["outstanding-tokens", String(b.outstanding_tokens)],
        [
          "cache-hits",
          b.prompt_tokens > 0 ? `${fmt((100 * b.prefix_cached_tokens) / b.prompt_tokens, 1)} %` : "",
        ],
        ["last-error", b.last_error ?? ""],
      ],
    })),
  );
  fillTable(
    "tenant-rows",
    Object.entries(status.tenants).map(([name, t]) => ({
      key: name,
      cells: [
        ["name", name],
        ["weight", String(t.weight)],
        ["vtc-counter", fmt(t.vtc_counter, 1)],
        ["output-tokens", String(t.output_tokens)],
        ["requests", String(t.requests)],
      ],
    })),
  );
}

/** Every chart's last `HISTORY_S` seconds, before the first live sample. */
async function loadHistory(key: string): Promise<void> {
  const windows = historyWindows(WINDOW_S, HISTORY_S, HISTORY_STEP_S);
  const [status, load, ...summaries] = await Promise.all([
    getJSON<Status>("/v1/tokenpace/admin/status", key),
    getJSON<{ samples: Load[] }>(`/v1/tokenpace/admin/history?seconds=${HISTORY_S}`, key),
    ...windows.map((w) => getJSON<QoESummary>(`/v1/tokenpace/qoe?window=${w}`, key)),
  ]);
  for (const sample of load.samples) pushLoad(sample);
  const sides = summaries.map(totals);
  for (const side of ["gateway", "client"] as const) {
    const byWindow = new Map(windows.map((w, i) => [w, sides[i]![side]]));
    for (const { ago, sample } of history(byWindow, WINDOW_S, HISTORY_S, HISTORY_STEP_S)) {
      qoeCharts[side].push(status.time - ago, sample);
    }
  }
}

async function poll(key: string): Promise<void> {
  try {
    const [summary, status] = await Promise.all([
      getJSON<QoEDetails>(`/v1/tokenpace/qoe?window=${WINDOW_S}`, key),
      getJSON<Status>("/v1/tokenpace/admin/status", key),
    ]);
    showStatus(status);
    showQoE(summary, status.time);
    problem.textContent = "";
    byId("updated").textContent = new Date(status.time * 1000).toLocaleTimeString();
    document.body.dataset["polls"] = String(Number(document.body.dataset["polls"] ?? "0") + 1);
  } catch (error) {
    if (error instanceof HttpError && (error.status === 401 || error.status === 403)) {
      window.clearInterval(timer);
      askAgain(keys, keyForm);
      problem.textContent = `The admin key was refused: ${error.message}`;
      return;
    }
    problem.textContent = `Refresh failed: ${error instanceof Error ? error.message : String(error)}`;
  }
}

async function open(key: string): Promise<void> {
  window.clearInterval(timer);
  try {
    await loadHistory(key);
  } catch {
    // no history (a refused key is told by the first poll): the charts start now
  }
  await poll(key);
  timer = window.setInterval(() => void poll(key), POLL_MS);
}

askForKey(keys, keyForm, (key) => void open(key));
byId("forget-key").addEventListener("click", () => {
  window.clearInterval(timer);
  askAgain(keys, keyForm);
});
