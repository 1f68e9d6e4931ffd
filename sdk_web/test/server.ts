/** A loopback HTTP server for tests, recording what it received. */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface Received {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

export interface TestServer {
  url: string;
  received: Received[];
  close(): Promise<void>;
}

/** Serve `handle` on a free loopback port; bodies are read before `handle` runs. */
export async function startServer(handle: (req: IncomingMessage, res: ServerResponse, body: string) => void): Promise<TestServer> {
  const received: Received[] = [];
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (b: Buffer) => parts.push(b));
    req.on("end", () => {
      const body = Buffer.concat(parts).toString("utf8");
      received.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      handle(req, res, body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    received,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Answer JSON. */
export function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(body));
}
