"""Deadlines on a stream's successive reads with one timer, moved lazily.

The relay waits for every read of a stream with a deadline (the next ping, the first-chunk
or between-chunk timeout). ``asyncio.timeout`` around each read arms and cancels a timer
per read, thousands of times a second under load; :class:`ReadDeadline` keeps one timer
per stream that fires no later than the current read's deadline and, when it fires early
(the deadline moved on since it was armed), re-arms itself once for the new deadline. A
read that outlives its deadline is cancelled as ``asyncio.timeout`` cancels it (the task
is cancelled, then uncancelled), so the reads it wraps must be cancel-safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from gateway.interruptible import Interruptible

T = TypeVar("T")


class ReadDeadline:
    """``await deadline.wait(read, until)``: the read's result, or ``None`` past ``until``.

    One task waits on it (a stream's reads are all made by its response's task).
    """

    def __init__(self) -> None:
        self._owner: asyncio.Task[object] | None = None  # the task that waits, once known
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # time.monotonic() at which the armed timer fires
        self._until = 0.0  # the deadline of the read under way
        self._read = Interruptible()  # the read under way

    async def wait(self, read: Awaitable[T], until: float) -> T | None:
        """Await ``read`` until ``until`` (``time.monotonic()``); ``None`` if it passed first.

        Any other cancellation of the waiting task propagates as usual.
        """
        task = self._owner
        if task is None:
            task = self._owner = asyncio.current_task()
            assert task is not None
        self._until = until
        if self._timer is None or self._timer_at > until:
            self._arm(until)
        self._read.enter(task)
        try:
            return await read
        except asyncio.CancelledError:
            if self._read.caught():
                return None
            raise
        finally:
            self._read.leave()

    def close(self) -> None:
        """Stop the timer (the stream ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        delay = max(at - time.monotonic(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._read.waiting:  # no read waiting: the next one arms the timer again
            return
        if time.monotonic() < self._until:  # the deadline moved since the timer was armed
            self._arm(self._until)
            return
        self._read.interrupt()
