/**
 * The README's TypeScript runs as written, against the real gateway on its embedded
 * SIMULATED engine (test/gateway-process.ts), which runs one request at a time here so
 * that the queue-notice block's request waits.
 *
 * Every `ts` block runs, unless the line before it is `<!-- not run: REASON -->`; other
 * blocks never run here. The blocks are read from the README when the test runs. Each
 * is a module of its own (blocks reuse names such as `stream`, which one module cannot
 * redeclare), compiled by `tsc` with the package's settings (tsconfig.test.json) and run
 * by Node. What a block takes from its surroundings (the gateway's URL and key, a
 * request, `show`: test/readme-context.ts; a page's `response` and `chunks`:
 * test/readme-page.ts; a `client` whose request waits in the queue:
 * test/readme-queue.ts) is imported into it, only the names it uses and does not
 * declare. What a reader replaces is replaced: the printed key `tp-demo-...` by a real
 * key, the local gateway's address by the test gateway's, a page-relative path
 * (`"/v1/...`) by the gateway's URL; `TOKENPACE_BASE_URL` and `TOKENPACE_API_KEY` are
 * set as the README says to set them. After each block, the check for what it calls
 * (`CHECKS`) asserts that it streamed the reply at its tier's pace and that the
 * gateway accepted its QoE report; a block that no check matches fails.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { KEY, startGateway, type Gateway } from "./gateway-process.js";
import { REPO_ROOT } from "./helpers.js";

const SDK = join(REPO_ROOT, "sdk_web");
const README = join(SDK, "README.md");
const FENCE = /^```(\w*)\s*$/;
const LOCAL = "http://127.0.0.1:8000/v1";
const PRINTED_KEY = "tp-demo-...";
const PAGE_PATH = '"/v1/';
/** Where the blocks are generated, relative to sdk_web/, and where tsc puts them. */
const SOURCES = join("build", "readme");
const OUT = join("build", "readme-js");
const DONE = "README block checked";

/** The names a block may take from its surroundings, and the module that has them. */
const SURROUNDINGS: Record<string, string> = {
  baseURL: "readme-context",
  apiKey: "readme-context",
  model: "readme-context",
  messages: "readme-context",
  body: "readme-queue",
  client: "readme-queue",
  show: "readme-context",
  response: "readme-page",
  chunks: "readme-page",
};

/** What a block calls, and the code run after it that checks it did what it shows. */
const CHECKS: ReadonlyArray<{ calls: RegExp; check: string }> = [
  { calls: /\bonQueued\b/, check: 'await checkPaced(stream, await readText(stream), "fast");\ncheckQueued();' },
  { calls: /\bpaceOpenAI\(/, check: 'await checkPaced(stream, await readText(stream), "chat");' },
  { calls: /\bpaceStream\(/, check: 'await checkPaced(paced, await readText(paced), "fast");' },
  { calls: /\bcreateClient\(/, check: 'await checkPaced(stream, shown.join(""), "voice");' },
];

interface Block {
  line: number;
  code: string;
}

/** The blocks of the README that run, in order. */
function blocks(): Block[] {
  const lines = readFileSync(README, "utf8").split("\n");
  const out: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const lang = FENCE.exec(lines[i] as string)?.[1];
    if (lang === undefined) continue;
    const end = lines.findIndex((l, j) => j > i && l.startsWith("```"));
    const marker = i > 0 ? (lines[i - 1] as string).trim() : "";
    if (lang === "ts" && !marker.startsWith("<!-- not run:")) out.push({ line: i + 1, code: lines.slice(i + 1, end).join("\n") });
    i = end;
  }
  return out;
}

/** The names of `SURROUNDINGS` that `code` uses (not as a property key) and does not declare. */
function borrowed(code: string): string[] {
  const source = code.replace(/(^|\s)\/\/.*$/gm, "$1");
  return Object.keys(SURROUNDINGS).filter(
    (name) =>
      new RegExp(`\\b${name}\\b(?!\\s*:)`).test(source) &&
      !new RegExp(`\\b(?:const|let|var|function)\\s+${name}\\b`).test(source) &&
      !new RegExp(`^import\\b.*\\b${name}\\b`, "m").test(source),
  );
}

/** The module a block runs as: its surroundings, the block (filled in), its check. */
function moduleOf(block: Block, base: string): string {
  const check = CHECKS.find(({ calls }) => calls.test(block.code));
  assert.ok(check, `README.md:${block.line}: no check in test/readme.test.ts matches this block`);
  const filled = block.code.replaceAll(LOCAL, `${base}/v1`).replaceAll(PRINTED_KEY, KEY).replaceAll(PAGE_PATH, `"${base}/v1/`);
  const names = borrowed(block.code);
  const from = (file: string): string => {
    const these = names.filter((n) => SURROUNDINGS[n] === file);
    return these.length ? `import { ${these.join(", ")} } from "../../test/${file}.js";\n` : "";
  };
  const checks = ["checkPaced", "readText", "shown"].filter((n) => check.check.includes(n));
  const queued = check.check.includes("checkQueued") ? 'import { checkQueued } from "../../test/readme-queue.js";\n' : "";
  return [
    `// README.md:${block.line}`,
    filled,
    "",
    `// The check (test/readme.test.ts)`,
    `import { ${checks.join(", ")} } from "../../test/readme-context.js";`,
    from("readme-context") + from("readme-page") + from("readme-queue") + queued,
    check.check,
    `console.log(${JSON.stringify(DONE)});`,
    "",
  ].join("\n");
}

let gateway: Gateway | undefined;
const env = (base: string): NodeJS.ProcessEnv => {
  const vars = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("OPENAI_")));
  return { ...vars, TOKENPACE_BASE_URL: `${base}/v1`, TOKENPACE_API_KEY: KEY };
};

/**
 * The demo's tenant, and the embedded engine one request at a time with waiting streams
 * queued (not refused), so that a request can be made to wait for the queue-notice block.
 */
const CONFIG = `
tenants:
  - {name: demo, api_keys: [{key: ${KEY}}], allow_custom: true}
backends:
  - {name: embedded, kind: embedded, models: [tokenpace-sim], max_concurrent: 1}
admission: {overload: queue}
`;

before(async () => {
  gateway = await startGateway(CONFIG);
});

after(async () => {
  await gateway?.stop();
});

test("the README has TypeScript to run, and each block has a check", () => {
  const found = blocks();
  assert.ok(found.length >= 4, `${found.length} blocks`);
  for (const block of found) assert.ok(CHECKS.some(({ calls }) => calls.test(block.code)), `README.md:${block.line}`);
});

test("the README's TypeScript compiles with the package's settings and runs against the gateway", async (t) => {
  const base = (gateway as Gateway).base;
  const found = blocks();
  rmSync(join(SDK, SOURCES), { recursive: true, force: true });
  rmSync(join(SDK, OUT), { recursive: true, force: true });
  mkdirSync(join(SDK, SOURCES), { recursive: true });
  for (const block of found) writeFileSync(join(SDK, SOURCES, `line${block.line}.ts`), moduleOf(block, base));
  // "tokenpace-web" resolves, as for a user, through package.json's exports (dist/, built by `npm test`).
  const tsconfig = { extends: "../../tsconfig.test.json", compilerOptions: { rootDir: "../..", outDir: "../readme-js" }, include: ["*.ts"] };
  writeFileSync(join(SDK, SOURCES, "tsconfig.json"), JSON.stringify(tsconfig, null, 2));
  const tsc = spawnSync(process.execPath, [join(SDK, "node_modules", "typescript", "bin", "tsc"), "-p", join(SOURCES, "tsconfig.json")], {
    cwd: SDK,
    encoding: "utf8",
  });
  assert.equal(tsc.status, 0, `the README's TypeScript does not compile:\n${tsc.stdout}${tsc.stderr}`);
  for (const block of found) {
    await t.test(`README.md:${block.line}`, () => {
      const run = spawnSync(process.execPath, [join(OUT, SOURCES, `line${block.line}.js`)], {
        cwd: SDK,
        env: env(base),
        encoding: "utf8",
        timeout: 60_000,
      });
      assert.equal(run.status, 0, `README.md:${block.line} failed:\n${run.stdout}${run.stderr}`);
      assert.ok(run.stdout.includes(DONE), run.stdout);
    });
  }
});
