"""When each piece of a reply goes out: the reader's digestion schedule.

Andes (Liu et al.) §3.1, docs/qoe.md recursion (D): the reader takes 1/TDS per token and
never sees a token before it arrives, so piece j is released at

    r_j = max(ready_j, r_(j-1) + tokens_(j-1) / TDS)

``ready_j`` is when the piece is complete (its chunk arrived; for a word or a sentence,
the chunk that completed it). The first piece goes out the moment it is ready, and a
server slower than TDS adds no delay. Pieces without tokens (a role, a finish reason,
usage) go out in order as soon as they are ready and take no reading time.
"""

from __future__ import annotations

import math


class ReleaseSchedule:
    """Release times of consecutive pieces at ``tds`` tokens per second."""

    def __init__(self, tds: float) -> None:
        self._interval = 1.0 / tds
        self._free = -math.inf  # when the next piece with tokens may go
        self._last = -math.inf  # the previous release: order is kept

    @property
    def free(self) -> float:
        """When the pieces scheduled so far have been read (``-inf`` before the first)."""
        return self._free

    def release_time(self, ready: float, tokens: int) -> float:
        """The release time of the next piece, ready at ``ready`` with ``tokens`` tokens."""
        at = max(ready, self._last)
        if tokens:
            at = max(at, self._free)
            self._free = at + tokens * self._interval
        self._last = at
        return at
