// The dashboard's QoE history (src/qoe_history.ts) on made-up summaries: the means over
// past windows, rebuilt from the nested windows' counts and means. Bundled on the fly
// with esbuild (the pages' own bundler), then imported.
import assert from "node:assert/strict";
import { test } from "node:test";
import { build } from "esbuild";

const bundle = await build({
  entryPoints: [new URL("../src/qoe_history.ts", import.meta.url).pathname],
  bundle: true,
  format: "esm",
  write: false,
});
const { history, historyWindows, totals } = await import(
  `data:text/javascript;base64,${Buffer.from(bundle.outputFiles[0].text).toString("base64")}`
);

/** Records `[seconds ago, Andes QoE]` of demo/chat's gateway side; the summary of the last `w` s. */
function summary(records, w) {
  const inside = records.filter(([ago]) => ago <= w).map(([, qoe]) => qoe);
  const side = inside.length ? { count: inside.length, andes: { mean: inside.reduce((a, b) => a + b) / inside.length } } : { count: 0 };
  return { window_s: w, tenants: { demo: { tiers: { chat: { gateway: side, client: { count: 0 } } } } } };
}

test("the mean over each past window, from nested windows", () => {
  const records = [
    [10, 1.0],
    [20, 0.8], // within 30 s
    [45, 0.2], // 30-60 s ago
    [100, 0.5], // 90-120 s ago
  ];
  const window = 60;
  const windows = historyWindows(window, 120, 30);
  assert.deepEqual(windows, [30, 60, 90, 120, 150, 180]);
  const byWindow = new Map(windows.map((w) => [w, totals(summary(records, w)).gateway]));
  const past = history(byWindow, window, 120, 30);
  assert.deepEqual(
    past.map(({ ago }) => ago),
    [120, 90, 60, 30],
  );
  const at = (ago) => past.find((p) => p.ago === ago).sample["demo/chat"];
  // the 60 s before "30 s ago": the records 30-90 s ago
  assert.ok(Math.abs(at(30) - 0.2) < 1e-12);
  // 60-120 s ago: the record at 100 s
  assert.ok(Math.abs(at(60) - 0.5) < 1e-12);
  assert.ok(Math.abs(at(90) - 0.5) < 1e-12);
  assert.equal(at(120), null, "no record 120-180 s ago");
});

test("a record that arrived between two queries never gives a mean outside [0, 1]", () => {
  // the 30 s window was read after a new record came, the 60 s window before it
  const byWindow = new Map([
    [30, totals(summary([[1, 1.0]], 30)).gateway],
    [60, totals(summary([], 60)).gateway],
  ]);
  assert.deepEqual(history(byWindow, 30, 30, 30), [{ ago: 30, sample: { "demo/chat": null } }]);
});
