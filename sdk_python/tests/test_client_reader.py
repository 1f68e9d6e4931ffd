"""The async reader's waits: one timer each, ending on the shared tick grid, never early."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

from tokenpace_client import reader
from tokenpace_client.clock import MONOTONIC
from tokenpace_client.reader import TaskReader


async def _silent() -> AsyncIterator[Any]:
    await asyncio.Event().wait()  # an upstream that sends nothing until cancelled
    yield None


async def _opened() -> AsyncIterator[Any]:
    return _silent()


async def _closed() -> None:
    return None


def test_waits_of_one_tick_share_its_timer_and_never_end_early():
    async def run() -> tuple[list[float], list[float], list[float]]:
        loop = asyncio.get_running_loop()
        timers: list[float] = []
        call_at = loop.call_at

        def recording_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            timers.append(when)
            return call_at(when, *args, **kwargs)

        loop.call_at = recording_call_at  # type: ignore[method-assign]
        readers = [TaskReader(_opened, MONOTONIC, close=_closed) for _ in range(3)]
        base = math.ceil(MONOTONIC.now() / reader.TICK_S + 2) * reader.TICK_S
        deadlines = [
            base + 0.1 * reader.TICK_S,
            base + 0.5 * reader.TICK_S,
            base + 0.9 * reader.TICK_S,
        ]
        woke: list[float] = []

        async def wait(r: TaskReader, deadline: float) -> None:
            assert await r.get(deadline) is None  # no event: the deadline passed
            woke.append(MONOTONIC.now())

        await asyncio.gather(*(wait(r, d) for r, d in zip(readers, deadlines, strict=True)))
        for r in readers:
            await r.stop()
        return timers, deadlines, woke

    timers, deadlines, woke = asyncio.run(run())
    grid = [t for t in timers if abs(t / reader.TICK_S - round(t / reader.TICK_S)) < 1e-6]
    assert len(grid) == 3 and len(set(grid)) == 1  # the three waits end on one tick
    assert deadlines[-1] <= grid[0] < deadlines[0] + reader.TICK_S
    assert all(w >= d for w, d in zip(woke, deadlines, strict=True))  # never before its time
