import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { SDK_NAME, SDK_VERSION } from "../src/version.js";

test("telemetry names the package and version package.json declares", () => {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { name: string; version: string; dependencies?: object };
  assert.equal(SDK_NAME, pkg.name);
  assert.equal(SDK_VERSION, pkg.version);
  assert.equal(pkg.dependencies, undefined, "no runtime dependencies");
});
