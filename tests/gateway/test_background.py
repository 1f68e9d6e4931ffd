"""gateway.background.stop: a background task ends even when it caught a cancellation."""

from __future__ import annotations

import asyncio

from gateway.background import stop


async def test_a_task_that_caught_its_cancellation_is_cancelled_again() -> None:
    caught = 0

    async def loop() -> None:
        nonlocal caught
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if caught:  # the second cancellation ends it
                    raise
                caught += 1  # as a client library that turned it into its own error

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop(task), 5.0)
    assert caught == 1
    assert task.cancelled()


async def test_ended_and_failed_tasks_are_awaited_quietly() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fail())
    running = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0.01)
    await stop(done, failed, running)
    assert done.done() and not done.cancelled()
    assert isinstance(failed.exception(), RuntimeError)
    assert running.cancelled()
    await stop()  # nothing to stop
