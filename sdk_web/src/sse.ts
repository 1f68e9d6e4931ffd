/**
 * Server-sent events, parsed as the HTML standard's event-stream format: fields
 * `data:` (joined with newlines) and `event:`, an event dispatched at each blank line,
 * lines ended by CRLF, LF or CR, and text that may be split anywhere between network
 * reads (inside a line or a UTF-8 character). Comments (`: ping`) make no event; an
 * `onComment` option hears them (the gateway's queue notices are comments: src/queue.ts).
 */

/** One dispatched event. */
export interface ServerSentEvent {
  event: string;
  data: string;
}

/** What to do with the lines that are not events. */
export interface SSEOptions {
  /** Called with each comment's text (the line after its `:`), in stream order with the events. */
  onComment?: (comment: string) => void;
}

/** Incremental parser: feed it text as it arrives, get the events completed so far. */
export class SSEParser {
  private buffer = "";
  private data: string[] = [];
  private event = "";
  private pendingCR = false;

  constructor(private readonly options: SSEOptions = {}) {}

  /** Events completed by `text` (appended to what was fed before). */
  push(text: string): ServerSentEvent[] {
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1); // CRLF split across reads
    this.pendingCR = false;
    this.buffer += text;
    const events: ServerSentEvent[] = [];
    for (;;) {
      const end = this.buffer.search(/[\r\n]/);
      if (end < 0) break;
      const line = this.buffer.slice(0, end);
      let next = end + 1;
      if (this.buffer[end] === "\r") {
        if (next === this.buffer.length) this.pendingCR = true;
        else if (this.buffer[next] === "\n") next++;
      }
      this.buffer = this.buffer.slice(next);
      const event = this.line(line);
      if (event) events.push(event);
    }
    return events;
  }

  /** The stream ended: an event without its final blank line is dropped, as the standard says. */
  end(): void {
    this.buffer = "";
    this.data = [];
    this.event = "";
  }

  private line(line: string): ServerSentEvent | undefined {
    if (line === "") {
      if (this.data.length === 0) {
        this.event = "";
        return undefined;
      }
      const event = { event: this.event || "message", data: this.data.join("\n") };
      this.data = [];
      this.event = "";
      return event;
    }
    if (line.startsWith(":")) {
      this.options.onComment?.(line.slice(1)); // a comment, e.g. ": ping"
      return undefined;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    return undefined;
  }
}

/** Bytes as they arrive: a `ReadableStream` (read with a reader) or any async iterable. */
export type ByteSource = ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** The events of a byte stream, read as fast as it delivers them; comments go to `onComment`. */
export async function* parseSSE(body: ByteSource, options: SSEOptions = {}): AsyncGenerator<ServerSentEvent> {
  const decoder = new TextDecoder();
  const parser = new SSEParser(options);
  for await (const bytes of iterateBytes(body)) {
    yield* parser.push(decoder.decode(bytes, { stream: true }));
  }
  yield* parser.push(decoder.decode());
  parser.end();
}

/** Whether `source` is a `ReadableStream` (of any realm or implementation): it has `getReader`. */
export function isReadableStream<T>(source: ReadableStream<T> | AsyncIterable<T>): source is ReadableStream<T> {
  return typeof (source as Partial<ReadableStream<T>>).getReader === "function";
}

/** A `ReadableStream` read chunk by chunk (cancelled when the loop stops), or the iterable itself. */
async function* iterateBytes(body: ByteSource): AsyncGenerator<Uint8Array> {
  if (!isReadableStream(body)) {
    yield* body;
    return;
  }
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.cancel().catch(() => undefined);
  }
}
