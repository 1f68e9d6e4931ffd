/**
 * The demo page's view of its reader channel: each signal the page sent to the gateway
 * (`POST /v1/tokenpace/reader`): when (seconds since the request), the presence, the
 * buffer (tokens received, not yet shown), the pace when stated, how it went (fetch or
 * beacon) and the gateway's answer. It wraps the SDK's transport, so what it shows is
 * what was sent, not what the page meant to send.
 */
import { httpTransport, TokenPaceError, type ReaderSignalBody, type SignalEndpoint, type SignalTransport } from "../../sdk_web/src/index.js";

/** The signals table and the presence line of one reply. */
export class SignalPanel {
  private sentAt = 0;

  constructor(
    private readonly rows: HTMLTableSectionElement,
    private readonly presence: HTMLElement,
  ) {}

  /** A new reply, sent at `sentAt` (ms, `performance.now()`): the table starts empty. */
  reset(sentAt: number): void {
    this.sentAt = sentAt;
    this.rows.replaceChildren();
    this.presence.textContent = "watching";
    this.presence.dataset["presence"] = "watching";
  }

  /** The SDK's transport to `endpoint`, each signal it sends shown as a row with its answer. */
  transport(endpoint: SignalEndpoint): SignalTransport {
    const base = httpTransport(endpoint);
    return {
      send: (body) => {
        const answer = this.row(body, "fetch");
        return base.send(body).then(
          () => {
            answer.textContent = "accepted";
          },
          (error: unknown) => {
            answer.textContent = error instanceof TokenPaceError && error.status !== undefined ? `refused (${error.status})` : "failed";
            throw error;
          },
        );
      },
      beacon: (body) => {
        const queued = base.beacon(body);
        if (queued) this.row(body, "beacon").textContent = "queued by the browser";
        return queued;
      },
    };
  }

  /** Add the row of one signal; returns the cell its answer goes in. */
  private row(body: ReaderSignalBody, via: "fetch" | "beacon"): HTMLTableCellElement {
    this.presence.textContent = body.presence;
    this.presence.dataset["presence"] = body.presence;
    const tr = document.createElement("tr");
    tr.dataset["presence"] = body.presence;
    const cells = [
      ((performance.now() - this.sentAt) / 1000).toFixed(2),
      body.presence,
      String(body.buffer_tokens ?? "–"),
      body.pace_tps === undefined ? "tier's" : `${body.pace_tps} tokens/s`,
      via,
      "sending…",
    ];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    this.rows.append(tr);
    return tr.lastElementChild as HTMLTableCellElement;
  }
}
