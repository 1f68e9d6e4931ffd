/**
 * The release schedule of the pacing buffer: the digestion schedule (recursion D,
 * docs/qoe.md) applied to what the buffer holds. An item of k tokens that is ready at
 * `ready` goes out at max(ready, previous release + its tokens / TDS): the first token is
 * never delayed, and a server slower than TDS adds no delay. Items of no tokens (a role,
 * a finish reason, usage) go out as soon as they are at the head of the buffer.
 */
export class ReleaseSchedule {
  private readonly msPerToken: number;
  private nextFree = -Infinity;

  /** `tds` in tokens per second; times in milliseconds. */
  constructor(tds: number) {
    if (!Number.isFinite(tds) || tds <= 0) throw new RangeError(`tds: must be a finite number > 0, got ${tds}`);
    this.msPerToken = 1000 / tds;
  }

  /** The earliest time an item of `tokens` tokens, ready at `ready`, may go out. */
  releaseAt(ready: number, tokens: number): number {
    return tokens > 0 ? Math.max(ready, this.nextFree) : ready;
  }

  /** When the tokens released so far have been read: -Infinity before the first. */
  get free(): number {
    return this.nextFree;
  }

  /** The item went out at `at`: the next token may follow its reading time later. */
  released(at: number, tokens: number): void {
    if (tokens > 0) this.nextFree = at + tokens * this.msPerToken;
  }
}

/**
 * Release times (ms) of items ready at `ready[i]` with `tokens[i]` tokens when the
 * consumer takes each one the moment it may: the schedule as a pure function.
 */
export function releaseTimes(ready: readonly number[], tokens: readonly number[], tds: number): number[] {
  const schedule = new ReleaseSchedule(tds);
  let last = -Infinity;
  return ready.map((r, i) => {
    const n = tokens[i] ?? 0;
    last = Math.max(last, schedule.releaseAt(r, n));
    schedule.released(last, n);
    return last;
  });
}
