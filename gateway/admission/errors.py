"""Admission's answers: a rate limit or budget reached (429), too many requests queued
(429), no engine able to start the request within its tier's bound (503 ``overloaded``),
the queue's wait run out (503)."""

from __future__ import annotations

import math

from gateway.errors import RATE_LIMIT, SERVER_ERROR, GatewayError
from gateway.store.ratelimit import RateState, retry_after_header


def rate_limited(limited_by: str | None, retry_after_ms: float, rate: RateState) -> GatewayError:
    """429 for a rate limit (``requests``, ``tokens``) or the token ``budget``."""
    by = limited_by or "requests"
    headers = rate.headers()
    if retry_after_ms >= 0:
        headers.update(retry_after_header(retry_after_ms))
    if by == "budget":
        return GatewayError(
            429,
            "You exceeded your token budget for this period; see Retry-After.",
            type="insufficient_quota",
            code="insufficient_quota",
            headers=headers,
        )
    what = "requests" if by == "requests" else "tokens"
    never = " (this request alone is larger than the limit)" if retry_after_ms < 0 else ""
    return GatewayError(
        429,
        f"Rate limit reached for {what} per minute{never}; see Retry-After.",
        type=RATE_LIMIT,
        code=f"rate_limit_{what}",
        headers=headers,
    )


def queue_full(max_queued: int | None, retry_after_ms: float, rate: RateState) -> GatewayError:
    return GatewayError(
        429,
        f"Too many requests of yours are waiting (at most {max_queued}); retry shortly.",
        type=RATE_LIMIT,
        code="queue_full",
        headers={**rate.headers(), **retry_after_header(retry_after_ms)},
    )


def queue_timeout(max_wait_s: float) -> GatewayError:
    return GatewayError(
        503,
        f"The request waited {max_wait_s:g} s in the gateway's queue; try again later.",
        type=SERVER_ERROR,
        code="queue_timeout",
        headers={"Retry-After": "1"},
    )


def overloaded(
    model: str, bound_s: float, wait_s: float, retry_after_s: float, *, waited: bool
) -> GatewayError:
    """503: no engine serving ``model`` can start the request within ``bound_s``, its
    tier's bound: it ``waited`` that long already, or would wait ``wait_s`` (the estimate)."""
    if waited:
        why = f"this request waited {bound_s:g} s for one, its tier's bound"
        why += f" (about {wait_s:.0f} s more expected)"
    else:
        why = f"this request would wait about {wait_s:.0f} s for one,"
        why += f" beyond its tier's bound of {bound_s:g} s"
    return GatewayError(
        503,
        f"The engines serving `{model}` are overloaded: {why}; try again later.",
        type=SERVER_ERROR,
        code="overloaded",
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )
