"""Waiting for a condition in an async test, with a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def eventually(predicate: Any, timeout: float = 2.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return bool(predicate())
