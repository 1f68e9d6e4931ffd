"""The pacing clock: ``time.monotonic`` by default, injectable for tests and simulations."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on a monotonic scale; only differences matter."""

    def now(self) -> float: ...


class MonotonicClock:
    """``time.monotonic``: what the reader thread or task and the pacer share."""

    def now(self) -> float:
        return time.monotonic()


MONOTONIC = MonotonicClock()
