"""A deadline on a store call that counts the store's time, not the event loop's.

Under a burst on a loaded machine the gateway's own event loop lags by tenths of a
second: a reply Redis sent in a millisecond waits in the socket, or its call waits for
its next step, while the loop runs other work, and an ``asyncio.timeout`` of
``store.timeout_s`` cancels a call that Redis had long answered. 300 streams at once
were refused ``store_busy`` by the hundred while Redis' slowlog showed nothing over
20 ms. Two parts:

- :class:`LoopLag` measures how late the loop runs: while any deadline is open, a timer
  every :data:`TICK_S` adds how late it fired to a running total;
- :class:`StoreDeadline` expires once the call has had ``timeout_s`` of the loop's
  time *less what the loop lagged meanwhile*, up to ``hard_s`` in all; and when it
  expires it first lets the loop turn :data:`SETTLE_TURNS` times, so that a reply
  already received (and the steps of the call it completes) runs before the call is
  cancelled.

A Redis that does not answer while the loop is responsive still times out after
``timeout_s`` (a few loop turns more); one that does not answer while the loop lags,
after ``hard_s`` at most.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

TICK_S = 0.01  # how often the lag is sampled while a store call is open
SETTLE_TURNS = 3  # I/O already received, then the call's wake-up, then its next step


class LoopLag:
    """How long, in all, the event loop ran late while store calls were open."""

    def __init__(self) -> None:
        self.total = 0.0
        self._open = 0
        self._handle: asyncio.TimerHandle | None = None

    def enter(self, loop: asyncio.AbstractEventLoop) -> float:
        """A call opens: the lag so far (sampling starts with the first open call)."""
        self._open += 1
        if self._handle is None:
            when = loop.time() + TICK_S
            self._handle = loop.call_at(when, self._tick, loop, when)
        return self.total

    def leave(self) -> None:
        self._open -= 1
        if not self._open and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        now = loop.time()
        self.total += max(0.0, now - when)
        self._handle = loop.call_at(now + TICK_S, self._tick, loop, now + TICK_S)


class StoreDeadline:
    """``async with StoreDeadline(lag, timeout_s, hard_s):`` raises ``TimeoutError`` out
    of the block once the store took ``timeout_s`` of the loop's time (module doc)."""

    __slots__ = (
        "_cancelling",
        "_expired",
        "_handle",
        "_hard_at",
        "_lag_at_start",
        "_loop",
        "_start",
        "_task",
        "hard_s",
        "lag",
        "timeout_s",
    )

    def __init__(self, lag: LoopLag, timeout_s: float, hard_s: float) -> None:
        self.lag = lag
        self.timeout_s = timeout_s
        self.hard_s = hard_s
        self._expired = False
        self._handle: asyncio.Handle | None = None

    async def __aenter__(self) -> StoreDeadline:
        self._loop = loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._lag_at_start = self.lag.enter(loop)
        self._start = now = loop.time()
        self._hard_at = now + self.hard_s
        self._handle = loop.call_at(now + self.timeout_s, self._due, now + self.timeout_s)
        return self

    def _due(self, when: float) -> None:
        now = self._loop.time()
        lagged = max(self.lag.total - self._lag_at_start, now - when)
        remaining = self.timeout_s - (now - self._start - lagged)
        if remaining > 0 and now < self._hard_at:
            at = min(now + remaining, self._hard_at)
            self._handle = self._loop.call_at(at, self._due, at)
            return
        self._settle(SETTLE_TURNS)

    def _settle(self, turns: int) -> None:
        if turns:
            self._handle = self._loop.call_soon(self._settle, turns - 1)
            return
        self._handle = None
        self._expired = True
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lag.leave()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._expired:
            return
        self._expired = False
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
