"""One task's await that another party can interrupt, as ``asyncio.timeout`` does it.

The interrupter cancels the waiting task; the waiter, catching the ``CancelledError``,
asks :meth:`Interruptible.caught` whether that cancellation is the interrupt alone (the
task is then uncancelled and carries on) or also comes from elsewhere (it propagates).
:class:`~gateway.relay.disconnect.DisconnectWatch` interrupts when the client leaves,
:class:`~gateway.relay.read_deadline.ReadDeadline` when a read's deadline passes; the await
stays in the waiter's own frame, with no task or coroutine per await.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Interruptible:
    """``enter(task)``, ``try: await ... except CancelledError: if caught(): ...``,
    ``finally: leave()``; :meth:`interrupt` from elsewhere."""

    __slots__ = ("_cancelling", "_interrupted", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None  # the task awaiting, while it awaits
        self._cancelling = 0  # its cancellation requests when the await began
        self._interrupted = False  # interrupt() cancelled it

    @property
    def waiting(self) -> bool:
        """Whether an await is under way."""
        return self._task is not None

    def enter(self, task: asyncio.Task[Any]) -> None:
        """``task`` begins the await."""
        self._task = task
        self._cancelling = task.cancelling()

    def leave(self) -> None:
        """The await ended, however it ended (call it in ``finally``)."""
        self._task = None
        self._interrupted = False

    def interrupt(self) -> None:
        """Cancel the await under way, once; nothing if none is."""
        task = self._task
        if task is not None and not self._interrupted:
            self._interrupted = True
            task.cancel()

    def caught(self) -> bool:
        """In the waiter's ``except CancelledError``: whether the cancellation is the
        interrupt alone (then the task is uncancelled, as ``asyncio.timeout`` does)."""
        task = self._task
        assert task is not None
        return self._interrupted and task.uncancel() <= self._cancelling
