"""ShieldedSteps: a wait cancelled at the moment its step finishes loses nothing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.backends.cancel_safe import ShieldedSteps


async def test_a_wait_cancelled_as_its_step_finishes_keeps_the_item() -> None:
    async def items():
        yield 1
        yield 2

    steps = ShieldedSteps(items())
    waiting = asyncio.create_task(steps.next())
    await asyncio.sleep(0)  # the wait starts the step
    await asyncio.sleep(0)  # the step has its item; the wait has not resumed yet
    waiting.cancel()  # a deadline passing at that moment (the relay's ping)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await steps.next() == 1  # was lost: the next wait got 2
    assert await steps.next() == 2
    with pytest.raises(StopAsyncIteration):
        await steps.next()
