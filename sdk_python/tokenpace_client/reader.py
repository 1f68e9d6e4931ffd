"""Readers: a thread (sync) or a task (async) that reads the upstream eagerly.

A reader never waits for the display: it timestamps each chunk with the clock and puts
it in an unbounded queue, so the HTTP read runs at the network's pace. It owns the
upstream and closes it when it stops, whether the stream ended, failed or was closed
(:meth:`ThreadReader.stop`, :meth:`TaskReader.cancel`). The paced stream waits on
``get(deadline)``: the next event, or ``None`` once ``deadline`` (clock time) passes.

An event is ``(kind, at, payload)``: ``("chunk", at, chunk)``, ``("queued", at, notice)``
(a :class:`~tokenpace_client.notices.QueueNotice` read from an openai stream while the
request waits for an engine), ``("end", at, None)`` or ``("error", at, exception)``; and
what the paced stream posts from any thread (:meth:`ThreadReader.post`): ``("presence",
at, "away" | "watching")``, ``("pace", at, tokens_per_s | None)``, ``("refused", at,
None)`` (the gateway refused a reader signal as too soon).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

from tokenpace_client.clock import Clock
from tokenpace_client.notices import QueueNotice, listen

Event = tuple[str, float, Any]

TICK_S = 0.002
"""The grid a paced async stream's release timer ends on (seconds of the loop's clock).

Each release wakes the process, and on a small VM a wake-up costs more CPU than the
release itself (tens of µs: measured in docs/benchmarks.md). Ending every wait on the
next multiple of ``TICK_S`` lets the streams of one event loop whose releases fall in
the same tick share one wake-up, for at most ``TICK_S`` of added lateness (the display
time recorded is still when the chunk is handed out). 0: each wait ends at its deadline.
"""


class ThreadReader:
    """Reads a sync iterable in a daemon thread."""

    def __init__(
        self,
        iterable: Iterable[Any],
        clock: Clock,
        *,
        close: Callable[[], None],
        interrupt: Callable[[], None],
    ) -> None:
        self._clock = clock
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._close = close
        self._interrupt = interrupt
        listen(iterable, self._queued)
        self._thread = threading.Thread(
            target=self._run, args=(iterable,), name="tokenpace-reader", daemon=True
        )
        self._thread.start()

    def _queued(self, notice: QueueNotice) -> None:
        self._events.put(("queued", self._clock.now(), notice))

    def _run(self, iterable: Iterable[Any]) -> None:
        clock, put = self._clock, self._events.put
        try:
            for chunk in iterable:
                if self._stopped.is_set():
                    return
                put(("chunk", clock.now(), chunk))
            put(("end", clock.now(), None))
        except Exception as exc:  # handed to the consumer, raised after what arrived
            put(("error", clock.now(), exc))
        finally:
            with contextlib.suppress(Exception):
                self._close()

    def post(self, event: Event) -> None:
        """Queue ``event`` for the consumer from any thread; it wakes a waiting :meth:`get`."""
        self._events.put(event)

    def get(self, deadline: float | None, chunk_wakes: bool = True) -> Event | None:
        """The next event, or ``None`` once ``deadline`` passes (any event wakes it)."""
        timeout = None if deadline is None else max(0.0, deadline - self._clock.now())
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self, wait_s: float) -> None:
        """Stop reading and close the upstream: wake a blocked read, wait up to ``wait_s``."""
        self._stopped.set()
        with contextlib.suppress(Exception):
            self._interrupt()
        if wait_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(wait_s)


class TaskReader:
    """Reads an async iterable in a task of the running event loop.

    Events go into a deque; a waiting :meth:`get` is woken by a timer at its deadline,
    rounded up to the :data:`TICK_S` grid (one future and one timer handle per wait, no
    exception on the usual timed-out wait), or by the next event. While a release is
    pending (a deadline, unless ``chunk_wakes``), a chunk does not wake it: its pieces go
    out after the pending one, so it is read at the deadline, with the time the reader
    stamped on it; the end of the stream, errors and posted events wake it.
    """

    def __init__(
        self,
        open_iterable: Callable[[], Awaitable[AsyncIterable[Any]]],
        clock: Clock,
        *,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._clock = clock
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._timed = False  # the waiter has a deadline
        self._close = close
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(open_iterable), name="tokenpace-reader")

    def _put(self, event: Event) -> None:
        self._events.append(event)
        if not (self._timed and event[0] == "chunk"):
            _wake(self._waiter)

    def _queued(self, notice: QueueNotice) -> None:
        self._put(("queued", self._clock.now(), notice))

    def post(self, event: Event) -> None:
        """Queue ``event`` for the consumer from any thread; it wakes a waiting :meth:`get`."""
        self._loop.call_soon_threadsafe(self._put, event)

    async def _run(self, open_iterable: Callable[[], Awaitable[AsyncIterable[Any]]]) -> None:
        clock, put = self._clock, self._put
        try:
            iterable = await open_iterable()
            listen(iterable, self._queued)
            async for chunk in iterable:
                put(("chunk", clock.now(), chunk))
            put(("end", clock.now(), None))
        except Exception as exc:
            put(("error", clock.now(), exc))
        finally:
            with contextlib.suppress(Exception):
                await self._close()

    async def get(self, deadline: float | None, chunk_wakes: bool = False) -> Event | None:
        if not self._events:
            timer = None
            if deadline is not None:
                delay = deadline - self._clock.now()
                if delay <= 0:
                    return None
            loop = self._loop
            waiter = self._waiter = loop.create_future()
            if deadline is not None:
                at = loop.time() + delay
                if TICK_S:
                    at = math.ceil(at / TICK_S) * TICK_S
                timer = loop.call_at(at, _wake, waiter)
            self._timed = timer is not None and not chunk_wakes
            try:
                await waiter
            finally:
                self._waiter = None
                self._timed = False
                if timer is not None:
                    timer.cancel()
            if not self._events:
                return None
        return self._events.popleft()

    def cancel(self) -> None:
        """Stop reading; the task closes the upstream as it ends."""
        self._task.cancel()

    async def stop(self) -> None:
        """Stop reading and wait until the upstream is closed."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
