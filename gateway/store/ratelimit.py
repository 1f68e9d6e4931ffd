"""Per-tenant rate limits and token budgets: the window arithmetic and the headers.

Requests and tokens per minute are counted in a *sliding window*, estimated from two
fixed one-minute windows (the count of the previous minute weighted by the part of it
still inside the sliding minute, plus the current minute's count). It needs two
counters per tenant and limit, so a check is O(1) and atomic in one Lua script, and a
burst never gets more than the limit in any minute, wherever the minute boundary falls
(the previous minute's count only fades as the sliding window leaves it).

Token budgets are a quota per fixed period (``budget_period_s``, a day by default).

The stores apply these rules: :mod:`gateway.store.memory` with the functions below,
:mod:`gateway.store.redis` in Lua (the same arithmetic; ``tests/gateway/store/test_stores.py`` runs
the same cases against both). Tokens are prompt tokens (estimated at admission) plus
output tokens as they stream; a request is admitted when its prompt plus its expected
output fits (OpenAI's rule for ``max_tokens``).

Headers, as OpenAI sends them: ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests`` and the same for
``tokens``; the reset is a duration such as ``1s``, ``6m0s`` or ``250ms``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_MS = 60_000


def window_position(now_ms: float) -> tuple[int, float]:
    """(index of the current one-minute window, fraction of it elapsed)."""
    idx = int(now_ms // WINDOW_MS)
    return idx, (now_ms - idx * WINDOW_MS) / WINDOW_MS


def estimate(prev: float, cur: float, frac: float) -> float:
    """Sliding-window count: the previous window's share still inside, plus this one's."""
    return prev * (1.0 - frac) + cur


def wait_ms(limit: float, cost: float, prev: float, cur: float, frac: float) -> float:
    """Milliseconds until ``cost`` more fits under ``limit`` (0: now; -1: never)."""
    if estimate(prev, cur, frac) + cost <= limit:
        return 0.0
    if cost > limit:
        return -1.0
    if prev > 0 and cur + cost <= limit:  # fits once enough of the previous window fades
        f = 1.0 - (limit - cost - cur) / prev
        return math.ceil(max(0.0, f - frac) * WINDOW_MS)
    # In the next window this window's count fades instead.
    f2 = max(0.0, 1.0 - (limit - cost) / cur) if cur > 0 else 0.0
    return math.ceil((1.0 - frac + f2) * WINDOW_MS)


def reset_ms(prev: float, cur: float, frac: float) -> float:
    """Milliseconds until the window holds nothing (its initial state)."""
    if cur > 0:
        return math.ceil((2.0 - frac) * WINDOW_MS)
    if prev > 0:
        return math.ceil((1.0 - frac) * WINDOW_MS)
    return 0.0


def format_duration(ms: float) -> str:
    """OpenAI's reset format: ``250ms``, ``12s``, ``6m0s``."""
    if ms < 1000:
        return f"{max(0, math.ceil(ms))}ms"
    s = math.ceil(ms / 1000)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60}s"


@dataclass(frozen=True, slots=True)
class RateState:
    """A tenant's limits after a decision: what the ``x-ratelimit-*`` headers say."""

    limit_requests: int = 0  # 0: no such limit
    remaining_requests: int = 0
    reset_requests_ms: float = 0.0
    limit_tokens: int = 0
    remaining_tokens: int = 0
    reset_tokens_ms: float = 0.0

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.limit_requests:
            out["x-ratelimit-limit-requests"] = str(self.limit_requests)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.remaining_requests))
            out["x-ratelimit-reset-requests"] = format_duration(self.reset_requests_ms)
        if self.limit_tokens:
            out["x-ratelimit-limit-tokens"] = str(self.limit_tokens)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.remaining_tokens))
            out["x-ratelimit-reset-tokens"] = format_duration(self.reset_tokens_ms)
        return out


def retry_after_header(ms: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1), the HTTP form."""
    return {"Retry-After": str(max(1, math.ceil(ms / 1000)))}
