import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { chunkTokens } from "../src/chunks.js";
import type { ChatCompletionChunk } from "../src/types.js";
import { REPO_ROOT } from "./helpers.js";

/** A chunk and its token count, generated from the gateway's (scripts/make_chunk_vectors.py). */
interface Vector {
  name: string;
  chunk: ChatCompletionChunk;
  counted: number;
  tokens: number;
}

const vectors: Vector[] = JSON.parse(
  readFileSync(join(REPO_ROOT, "tests/vectors/chunk_tokens.json"), "utf8"),
).vectors;

test("the shared chunk vector file is read", () => {
  assert.ok(vectors.length >= 20, `only ${vectors.length} vectors`);
});

for (const v of vectors) {
  test(`tokens of chunk vector ${v.name}, as the gateway counts them`, () => {
    assert.equal(chunkTokens(v.chunk, v.counted), v.tokens);
  });
}
