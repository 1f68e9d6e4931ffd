/**
 * The reading side of a paced stream: the source is read as fast as it delivers (no
 * back-pressure: a read never waits for the reader of the reply), and every chunk is
 * handed on at once. A source that fails, or a chunk the stream refuses, ends the read
 * and lets go of the source; `stop()` lets go of it at once.
 */
import { isReadableStream } from "./sse.js";

/** What chunks come from: an async iterable or a `ReadableStream` of chunk objects. */
export type ChunkSource<T> = AsyncIterable<T> | ReadableStream<T>;

/** Reads one source from construction on (see the module documentation). */
export class Reader<T> {
  private stopped = false;
  private cancel: () => void = () => undefined;

  /**
   * `onChunk` gets each chunk as it is read (what it throws fails the read); `onEnd` the
   * error that ended the read, undefined when the source finished. Neither is called after `stop()`.
   */
  constructor(
    source: ChunkSource<T>,
    private readonly onChunk: (chunk: T) => void,
    private readonly onEnd: (error: unknown) => void,
  ) {
    void this.read(source); // sets `cancel` before its first await
  }

  /** Stop reading and let go of the source (the request is closed with it). */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.cancel();
  }

  private async read(source: ChunkSource<T>): Promise<void> {
    let failure: unknown = undefined;
    try {
      if (isReadableStream(source)) {
        const reader = source.getReader();
        this.cancel = () => void reader.cancel().catch(() => undefined);
        for (;;) {
          const { done, value } = await reader.read();
          if (done || this.stopped) break;
          this.onChunk(value);
        }
      } else {
        const iterator = source[Symbol.asyncIterator]();
        this.cancel = () => void iterator.return?.()?.catch(() => undefined);
        for (;;) {
          const { done, value } = await iterator.next();
          if (done || this.stopped) break;
          this.onChunk(value);
        }
      }
    } catch (error) {
      if (!this.stopped) {
        failure = error;
        this.cancel(); // a chunk we could not read: let go of the request
      }
    }
    if (!this.stopped) this.onEnd(failure);
  }
}
