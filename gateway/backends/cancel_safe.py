"""Cancel-safe stepping of an async iterator, for the relay's deadlines.

The relay waits for a stream's next chunks with a deadline and cancels the wait when it
passes (to send a ping). Cancelling ``__anext__`` of an async generator ends the
generator; :class:`ShieldedSteps` runs each step in a task that a cancelled wait leaves
running, and the next wait picks up its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ShieldedSteps(Generic[T]):
    """``await steps.next()`` is ``await iterator.__anext__()``, but cancel-safe."""

    def __init__(self, iterator: AsyncIterator[T]) -> None:
        self._iterator = iterator
        self._step: asyncio.Future[T] | None = None

    async def next(self) -> T:
        """The next item (StopAsyncIteration at the end), waiting for the step under way."""
        step = self._step
        if step is None:
            step = self._step = asyncio.ensure_future(self._iterator.__anext__())
        try:
            item = await asyncio.shield(step)
        except asyncio.CancelledError:
            # The wait was cancelled: the step stays for the next wait, even if it
            # finished at that very moment (its item is not lost) - unless the step
            # itself was cancelled.
            if step.cancelled() and self._step is step:
                self._step = None
            raise
        except BaseException:
            if self._step is step:  # the step ended the iteration, or failed
                self._step = None
            raise
        if self._step is step:
            self._step = None
        return item

    async def cancel(self) -> None:
        """Cancel the step under way, if any (the iterator sees CancelledError), and wait."""
        step, self._step = self._step, None
        if step is not None and not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
