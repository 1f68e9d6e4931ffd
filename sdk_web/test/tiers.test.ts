import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { requestInfo } from "../src/headers.js";
import { DEFAULT_EXPECTATION, DEFAULT_TIER, TIERS } from "../src/tiers.js";
import { REPO_ROOT } from "./helpers.js";

/** The gateway's default tiers, generated from its own table (scripts/make_tier_vectors.py). */
const gateway = JSON.parse(readFileSync(join(REPO_ROOT, "tests/vectors/tiers.json"), "utf8")) as {
  default: string;
  tiers: Record<string, { ttft: number; tds: number }>;
};

test("the tiers are the gateway's default tiers", () => {
  assert.deepEqual({ ...TIERS }, gateway.tiers);
  assert.equal(DEFAULT_TIER, gateway.default);
  assert.deepEqual(DEFAULT_EXPECTATION, gateway.tiers[gateway.default]);
});

test("without headers or options a stream is paced to the default tier", () => {
  const info = requestInfo(new Headers());
  assert.equal(info.tier, DEFAULT_TIER);
  assert.deepEqual(info.expected, { ...DEFAULT_EXPECTATION });
});
