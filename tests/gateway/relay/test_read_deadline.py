"""ReadDeadline: one lazily moved timer gives each read its own deadline, as asyncio.timeout.

Each read is made as the relay makes it (:func:`_wait`, the pattern of ReadDeadline's
docstring). Real time with short deadlines; the bounds are loose enough for a loaded
2-core CI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from gateway.relay.read_deadline import ReadDeadline

T = TypeVar("T")


async def _wait(deadline: ReadDeadline, read: Awaitable[T], until: float) -> T | None:
    """``read``'s result, or None once ``until`` passed first."""
    task = asyncio.current_task()
    assert task is not None
    deadline.begin(task, until)
    try:
        return await read
    except asyncio.CancelledError:
        if not deadline.passed():
            raise
        return None
    finally:
        deadline.end()


async def _after(delay: float, value: str) -> str:
    await asyncio.sleep(delay)
    return value


async def test_a_read_that_comes_in_time_returns_its_result() -> None:
    deadline = ReadDeadline()
    assert await _wait(deadline, _after(0.0, "x"), time.monotonic() + 5.0) == "x"
    deadline.close()


async def test_a_read_past_its_deadline_is_cancelled_and_gives_none() -> None:
    deadline = ReadDeadline()
    queue: asyncio.Queue[str] = asyncio.Queue()
    started = time.monotonic()
    assert await _wait(deadline, queue.get(), started + 0.05) is None
    assert 0.04 <= time.monotonic() - started < 2.0
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the cancellation was taken back
    # The cancelled read lost nothing: a queue's get is cancel-safe.
    queue.put_nowait("later")
    assert await _wait(deadline, queue.get(), time.monotonic() + 5.0) == "later"
    deadline.close()


async def test_each_read_gets_its_own_deadline_after_many_quick_ones() -> None:
    """The timer armed for the first read (soon) must not end a later read early, and a
    later read with an earlier deadline than the armed timer must still end on time."""
    deadline = ReadDeadline()
    first = time.monotonic()
    for _ in range(200):  # each deadline 0.3 s after its read: the timer stays on the first
        assert await _wait(deadline, _after(0.0, "ok"), time.monotonic() + 0.3) == "ok"
    await asyncio.sleep(max(0.0, first + 0.35 - time.monotonic()))  # the first timer fired
    assert await _wait(deadline, _after(0.2, "slow"), time.monotonic() + 2.0) == "slow"
    started = time.monotonic()
    assert await _wait(deadline, _after(5.0, "never"), started + 3.0) is None
    assert time.monotonic() - started >= 2.9
    started = time.monotonic()
    assert await _wait(deadline, _after(5.0, "never"), started + 0.05) is None  # earlier
    assert time.monotonic() - started < 2.0
    deadline.close()


async def test_a_deadline_already_past_ends_the_read_at_once() -> None:
    deadline = ReadDeadline()
    started = time.monotonic()
    assert await _wait(deadline, _after(5.0, "never"), started - 1.0) is None
    assert time.monotonic() - started < 2.0
    deadline.close()


async def test_another_cancellation_goes_through() -> None:
    deadline = ReadDeadline()

    async def reader() -> str | None:
        return await _wait(deadline, _after(5.0, "never"), time.monotonic() + 5.0)

    task = asyncio.ensure_future(reader())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline.close()


async def test_a_cancellation_at_the_deadline_is_not_swallowed() -> None:
    """The task is cancelled from outside as its read's deadline passes (the deadline's
    timer is due in the same loop iteration): the outside cancellation wins, as with
    asyncio.timeout."""
    deadline = ReadDeadline()

    async def reader() -> str | None:
        return await _wait(deadline, _after(5.0, "never"), time.monotonic() - 1.0)

    task = asyncio.ensure_future(reader())
    await asyncio.sleep(0)  # the reader waits; the deadline's timer is due next
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)
    deadline.close()


async def test_close_stops_the_timer() -> None:
    deadline = ReadDeadline()
    assert await _wait(deadline, _after(0.0, "x"), time.monotonic() + 0.05) == "x"
    deadline.close()
    await asyncio.sleep(0.1)  # a timer left armed would fire here, with nothing to cancel
    assert await _wait(deadline, _after(0.0, "y"), time.monotonic() + 5.0) == "y"
    deadline.close()
