"""A store call's deadline counts the store's time, not the event loop's lag."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.store.deadline import LoopLag, StoreDeadline

pytestmark = pytest.mark.asyncio


async def test_a_call_that_never_answers_times_out_on_a_responsive_loop() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with StoreDeadline(LoopLag(), 0.2, 2.0):
            await asyncio.Event().wait()
    assert 0.2 <= time.monotonic() - started < 0.6


async def test_a_reply_that_came_while_the_loop_was_busy_is_not_cancelled() -> None:
    """The loop is blocked for 3 timeouts by other work, and the reply comes in
    meanwhile: it is read at the loop's next turn, the turn at which an
    ``asyncio.timeout`` cancels the call."""
    loop = asyncio.get_running_loop()

    def busy_while_the_reply_comes(reply: asyncio.Future[str]) -> None:
        time.sleep(0.3)  # the loop's other work, past the deadline
        loop.call_soon(reply.set_result, "ok")  # what the socket got meanwhile

    reply: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.005, busy_while_the_reply_comes, reply)
    async with StoreDeadline(LoopLag(), 0.1, 2.0):
        assert await reply == "ok"
    reply = loop.create_future()
    loop.call_later(0.005, busy_while_the_reply_comes, reply)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await reply


async def test_the_loops_lag_is_given_back_up_to_the_hard_bound() -> None:
    """A loop that lags in steps of 50 ms (far beyond a 10 ms tick) for good: the
    deadline moves with the lag, then ends at the hard bound."""
    loop = asyncio.get_running_loop()
    busy = True

    def work() -> None:
        time.sleep(0.05)
        if busy:
            loop.call_soon(work)

    loop.call_soon(work)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            async with StoreDeadline(LoopLag(), 0.1, 1.0):
                await asyncio.Event().wait()
    finally:
        busy = False
    assert 0.5 < time.monotonic() - started < 1.5


async def test_an_outer_cancel_is_not_turned_into_a_timeout() -> None:
    async def call() -> None:
        async with StoreDeadline(LoopLag(), 5.0, 10.0):
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
