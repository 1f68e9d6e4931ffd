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
from typing import Any

from gateway.relay.interruptible import Interruptible


class ReadDeadline:
    """A stream's reads, each with its deadline; one task makes them all::

        deadline.begin(task, until)
        try:
            got = await read()
        except asyncio.CancelledError:
            if not deadline.passed():
                raise  # cancelled from elsewhere
            got = None  # ``until`` passed first
        finally:
            deadline.end()

    The read's await stays in the reader's frame: no coroutine per read.
    """

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # time.monotonic() at which the armed timer fires
        self._until = 0.0  # the deadline of the read under way
        self._read = Interruptible()  # the read under way

    def begin(self, task: asyncio.Task[Any], until: float) -> None:
        """``task`` begins a read due by ``until`` (``time.monotonic()``)."""
        self._until = until
        if self._timer is None or self._timer_at > until:
            self._arm(until)
        self._read.enter(task)

    def passed(self) -> bool:
        """In the reader's ``except CancelledError``: whether the deadline alone
        cancelled the read (the task is then uncancelled and carries on)."""
        return self._read.caught()

    def end(self) -> None:
        """The read ended, however it ended (call it in ``finally``)."""
        self._read.leave()

    def expire(self) -> None:
        """The read under way (or the next one) is due now: it ends as at its deadline."""
        self._until = 0.0
        self._read.interrupt()

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
