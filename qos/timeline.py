"""Token delivery timelines: parsing, validation and the user's digestion schedule.

A timeline is when the tokens of one reply reached the user, in seconds since the
request was sent. It is given either per token (``[0.41, 0.43, 0.47, ...]``) or per
chunk (``[(0.41, 1), (0.43, 1), (0.47, 2)]``: time, tokens in that chunk).

The user digests (reads, listens to) tokens one after another, each taking
``1 / TDS`` seconds, never before it arrives (Andes §3.1: the slope of the actual
delivery curve is capped by the expected TDS). Token ``k`` starts being digested at

    d_k = max(t_k, d_{k-1} + 1/TDS)                                            (D)

a max-plus recursion with the closed form
``d_k = (k-1)/TDS + max_{j<=k}(t_j - (j-1)/TDS)``, which is one
``np.maximum.accumulate``. Every QoE formula in :mod:`qos.metrics` is built on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TimelineInput = Sequence[float] | Sequence[tuple[float, int]] | np.ndarray


def token_times(timeline: TimelineInput, *, name: str = "token_times") -> np.ndarray:
    """Return per-token arrival times as a float array, validated.

    Accepts per-token times or ``(time, n_tokens)`` chunk pairs. Raises ``ValueError``
    naming ``name`` when the timeline is empty, has negative or non-finite times, is
    not non-decreasing, or has a chunk with a non-positive token count.
    """
    arr = np.asarray(timeline, dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name}: empty timeline; a reply needs at least one token")
    if arr.ndim == 2 and arr.shape[1] == 2:
        times, counts = arr[:, 0], arr[:, 1]
        if np.any(counts <= 0) or np.any(counts != np.round(counts)):
            raise ValueError(f"{name}: chunk token counts must be positive integers")
        times = np.repeat(times, counts.astype(np.int64))
    elif arr.ndim == 1:
        times = arr
    else:
        raise ValueError(
            f"{name}: expected a list of times or of (time, n_tokens) pairs, got shape {arr.shape}"
        )
    steps = times[1:] - times[:-1]  # np.diff, without its checks: this runs per reply
    if times[0] >= 0 and math.isfinite(times[-1]) and bool((steps >= 0).all()):
        return times  # non-decreasing from a time >= 0 to a finite one: every check holds
    if not np.all(np.isfinite(times)):
        raise ValueError(f"{name}: times must be finite numbers")
    if np.any(times < 0):
        raise ValueError(
            f"{name}: negative time {times.min()}; times are seconds since the request"
        )
    if np.any(steps < 0):
        i = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name}: timeline is not non-decreasing (token {i + 1} at {times[i + 1]} "
            f"after token {i} at {times[i]})"
        )
    return times


def check_expectation(expected_ttft: float, expected_tds: float) -> None:
    """Raise ``ValueError`` unless TTFT >= 0 and TDS > 0 (both finite)."""
    if not math.isfinite(expected_ttft) or expected_ttft < 0:
        raise ValueError(f"expected_ttft: must be a finite number >= 0, got {expected_ttft}")
    if not math.isfinite(expected_tds) or expected_tds <= 0:
        raise ValueError(f"expected_tds: must be a finite number > 0, got {expected_tds}")


def digestion_starts(
    times: np.ndarray, tds: float | np.ndarray, *, hold_until: float | np.ndarray = 0.0
) -> np.ndarray:
    """Digestion start time of every token, recursion (D) above.

    ``hold_until`` holds tokens back until that time (used by the monotone QoE, which
    holds tokens that arrive before the expected TTFT until the expected TTFT). ``times``
    may also be one reply per row (all of one length), ``tds`` and ``hold_until`` then a
    column, one per row: each row's starts are those of the reply alone.
    """
    held = np.maximum(times, hold_until)
    offsets = np.arange(held.shape[-1], dtype=float) / tds
    starts: np.ndarray = offsets + np.maximum.accumulate(held - offsets, axis=-1)
    return starts


def digested_area(
    starts: np.ndarray | float, until: np.ndarray | float, tds: np.ndarray | float
) -> np.ndarray | float:
    """∫_0^until of each token's digestion ramp, elementwise.

    Token k contributes a ramp from 0 at ``d_k`` to 1 at ``d_k + 1/TDS``; its integral
    up to ``until`` is ``g(until - d_k)`` with g(u) = 0 (u <= 0), TDS·u²/2
    (u <= 1/TDS), u - 1/(2·TDS) (otherwise). Summed over tokens this is the area
    under the actual delivery curve A(t) of Andes Eq. 1.
    """
    u = np.maximum(np.asarray(until, dtype=float) - starts, 0.0)
    step = 1.0 / tds
    return np.where(u <= step, 0.5 * tds * u * u, u - 0.5 * step)


def expected_area(
    until: np.ndarray | float, ttft: np.ndarray | float, tds: np.ndarray | float, length: float
) -> np.ndarray | float:
    """∫_0^until min(T(t), l) dt with T(t) = TDS·(t - TTFT)⁺ (denominator of Andes Eq. 1).

    ``length`` may be ``inf`` (unknown reply length: the expected curve never saturates).
    """
    u = np.maximum(np.asarray(until, dtype=float) - ttft, 0.0)
    if np.isinf(length):
        return 0.5 * tds * u * u
    ramp = length / tds  # seconds the expected curve takes to reach l
    return np.where(u <= ramp, 0.5 * tds * u * u, 0.5 * length * ramp + length * (u - ramp))
