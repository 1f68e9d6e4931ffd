/**
 * The time source the pacing buffer runs on, injectable so that tests run on virtual
 * time and check exact release times.
 */
export interface Clock {
  /** Monotonic time in milliseconds (as `performance.now()`). */
  now(): number;
  /** Resolve after `ms` milliseconds, or as soon as `signal` aborts (never rejects). */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The longest delay `setTimeout` takes (a longer one fires at once); a longer sleep ends early and is taken again. */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/** `performance.now()` and `setTimeout`: the clock of browsers and Node. */
export const systemClock: Clock = {
  now: () => performance.now(),
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, Math.min(Math.max(ms, 0), MAX_TIMEOUT_MS));
      signal?.addEventListener("abort", done, { once: true });
    });
  },
};
