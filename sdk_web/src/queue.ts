/**
 * Queue notices: the SSE comments a tokenpace gateway sends while a streamed request
 * waits for an engine (docs/protocol.md, "Queue notices"), before the first chunk, about
 * once a second:
 *
 * ```text
 * : queued position=2 eta_s=3.5
 *
 * ```
 *
 * `position` counts from 1 (next to be admitted); `eta_s` is the gateway's estimate of
 * the wait in seconds. Other comments (`: ping`) and malformed notices are not notices.
 * Hear them with `parseSSE(body, { onComment })` or the client's `onQueued` option.
 */

/** The request waits for an engine: its place in line (1: next) and the expected wait (s). */
export interface QueueNotice {
  position: number;
  etaS: number;
}

const INTEGER = /^[0-9]+$/;
const NUMBER = /^[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?$/;

/**
 * The notice in an SSE comment's text (the line after its `:`), else undefined. Fields it
 * does not know are skipped, so the gateway may add some; a notice needs position >= 1
 * and eta_s a finite number >= 0.
 */
export function parseQueueNotice(comment: string): QueueNotice | undefined {
  const [kind, ...words] = comment.trim().split(/\s+/);
  if (kind !== "queued") return undefined;
  const fields = new Map(words.map((word): [string, string] => {
    const at = word.indexOf("=");
    return at < 0 ? [word, ""] : [word.slice(0, at), word.slice(at + 1)];
  }));
  const position = fields.get("position") ?? "";
  const eta = fields.get("eta_s") ?? "";
  if (!INTEGER.test(position) || !NUMBER.test(eta)) return undefined;
  const notice = { position: Number(position), etaS: Number(eta) };
  return notice.position >= 1 && Number.isFinite(notice.etaS) ? notice : undefined;
}
