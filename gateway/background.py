"""Stopping the gateway's background tasks for sure.

A background loop that calls a client library can lose a cancellation: when the
``CancelledError`` it was interrupted with comes out of the library as an error the loop
handles, the loop carries on, and ``task.cancel(); await task`` waits forever (the Redis
key watcher did so once, while Redis restarted). :func:`stop` cancels again until every
task has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.1  # how long a cancelled task has to end before it is cancelled again


async def stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every
    ``RECANCEL_S`` any that caught its cancellation; their results and errors are
    dropped."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning
