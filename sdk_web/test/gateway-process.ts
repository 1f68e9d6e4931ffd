/**
 * The real gateway for the tests that talk to one: `tokenpace serve` from the
 * repository's .venv on its embedded SIMULATED engine (no model runs), on a free
 * loopback port, with a known key: the demo configuration, or a given one.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "./helpers.js";

const TOKENPACE = join(REPO_ROOT, ".venv", "bin", "tokenpace");

/** The demo key the test gateways accept. */
export const KEY = "tp-demo-sdk-web-integration-test";

export interface Gateway {
  /** The gateway's origin, `http://127.0.0.1:PORT` (the API is under `/v1`). */
  readonly base: string;
  /** Stops the gateway and waits for it to exit. */
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * Starts `tokenpace serve` and waits (60 s at most) until `/readyz` answers; with
 * `config` (YAML, which must accept `KEY`), on that configuration, else on the demo's.
 */
export async function startGateway(config?: string): Promise<Gateway> {
  if (!existsSync(TOKENPACE)) throw new Error(`${TOKENPACE} is missing: run \`make venv\` at the repository root first`);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const env: NodeJS.ProcessEnv = { ...process.env, TOKENPACE_DEMO_KEY: KEY };
  delete env["TOKENPACE_CONFIG"];
  const args = ["serve", "--host", "127.0.0.1", "--port", String(port)];
  if (config !== undefined) {
    const file = join(mkdtempSync(join(tmpdir(), "tokenpace-test-")), "gateway.yaml");
    writeFileSync(file, config);
    args.push("--config", file);
  }
  const child: ChildProcess = spawn(TOKENPACE, args, {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  child.stdout?.on("data", (b: Buffer) => (log += b.toString()));
  child.stderr?.on("data", (b: Buffer) => (log += b.toString()));
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await exited;
  };
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`tokenpace serve exited (${child.exitCode}):\n${log}`);
    const ok = await fetch(`${base}/readyz`).then((r) => r.ok, () => false);
    if (ok) return { base, stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`tokenpace serve not ready in 60 s:\n${log}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}
