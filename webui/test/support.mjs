// What the browser tests share: a real gateway (`tokenpace serve` on its embedded
// simulated engine, started from the project's .venv) and Debian's Chromium driven by
// playwright-core, headless, with a fresh profile and every request outside the
// gateway refused (the pages must need no network).
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
export const ARTIFACTS = fileURLToPath(new URL("../test-artifacts/", import.meta.url));
export const CHROMIUM = process.env.TOKENPACE_CHROMIUM ?? "/usr/bin/chromium";
const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

async function freePort() {
  return await new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

export const DEMO_KEY = "tp-demo-browser-tests-0001";

/**
 * `tokenpace serve` with known keys; resolves once ready. Without `config`, the demo
 * configuration; else `config` (YAML, whose tenant `demo` has the key `DEMO_KEY`).
 */
export async function startGateway({ config } = {}) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const demoKey = DEMO_KEY;
  const adminKey = "tp-admin-browser-tests-0001";
  const env = { ...process.env, TOKENPACE_DEMO_KEY: demoKey, TOKENPACE_ADMIN_KEY: adminKey };
  delete env.TOKENPACE_CONFIG;
  const args = ["serve", "--port", String(port)];
  const configDir = config === undefined ? undefined : await mkdtemp(join(tmpdir(), "tokenpace-gateway-"));
  if (configDir !== undefined) {
    await writeFile(join(configDir, "gateway.yaml"), config);
    args.push("--config", join(configDir, "gateway.yaml"));
  }
  const child = spawn(join(ROOT, ".venv/bin/tokenpace"), args, {
    cwd: ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const removeConfig = async () => {
    if (configDir !== undefined) await rm(configDir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) {
      await removeConfig();
      throw new Error(`the gateway exited:\n${output}`);
    }
    try {
      if ((await fetch(`${url}/readyz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill();
      await removeConfig();
      throw new Error(`the gateway did not get ready in 30 s:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    demoKey,
    adminKey,
    output: () => output,
    async get(path, key) {
      const response = await fetch(`${url}${path}`, { headers: { Authorization: `Bearer ${key}` } });
      if (!response.ok) throw new Error(`GET ${path}: ${response.status} ${await response.text()}`);
      return path === "/metrics" ? await response.text() : await response.json();
    },
    async stop() {
      child.kill("SIGTERM");
      await exited;
      await removeConfig();
    },
  };
}

/**
 * A scripted HTTP server on a loopback port, for what the gateway cannot be made to send
 * yet: `handle(req, res)` writes the response. Resolves to `{ url, close() }`.
 */
export async function startScriptedServer(handle) {
  const server = createHttpServer((req, res) => {
    req.resume();
    req.on("end", () => handle(req, res));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Chromium on a fresh profile; requests to anything but `origin` are aborted and listed. */
export async function launchBrowser(origin) {
  const profile = await mkdtemp(join(tmpdir(), "tokenpace-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1100, height: 1100 },
  });
  const refused = [];
  await context.route(
    (url) => url.origin !== origin,
    (route) => {
      refused.push(route.request().url());
      return route.abort();
    },
  );
  return {
    context,
    refused,
    async close() {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    },
  };
}

export async function screenshot(page, name) {
  await mkdir(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, name), fullPage: true });
}

/** Polls `probe` until it returns a truthy value (which it returns) or `timeoutMs` passes. */
export async function eventually(probe, timeoutMs = 10_000, what = "the condition") {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The value of a Prometheus counter summed over the samples whose labels include `labels`. */
export function counter(metrics, name, labels) {
  let total = 0;
  for (const line of metrics.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    const matches = Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`));
    if (matches) total += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return total;
}
