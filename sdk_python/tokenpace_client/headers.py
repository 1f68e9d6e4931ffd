"""What a stream is paced to: explicit arguments, else the gateway's headers, else the chat tier.

The gateway announces the tier it serves in ``X-TokenPace-Tier``, ``X-TokenPace-TTFT``
and ``X-TokenPace-TDS`` (docs/protocol.md, "Gateway → client"), and the request id in
``X-Request-Id``. Without headers or arguments: the default tier of
:mod:`tokenpace_client.tiers` (chat). A header is the server's word, not the
developer's: a value outside :data:`~tokenpace_client.tiers.TTFT_RANGE` /
:data:`~tokenpace_client.tiers.TDS_RANGE` is clamped to the range (and logged), a value
that is no number is ignored.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpace_client.pacer import ENDS, End
from tokenpace_client.segment import UNITS, Unit
from tokenpace_client.tiers import DEFAULT_TIER, TDS_RANGE, TIERS, TTFT_RANGE

log = logging.getLogger("tokenpace_client")

MAX_DRAIN_S = 60.0
"""By default, pacing ends at most this long after the upstream ended (the rest at once)."""


@dataclass(frozen=True)
class Settings:
    tier: str
    ttft: float
    tds: float
    unit: Unit
    end: End
    request_id: str | None
    max_drain_s: float | None = MAX_DRAIN_S


def _number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name}: must be a finite number {bound}, got {value!r}")
    return number


def _header(headers: Mapping[str, str], name: str, bounds: tuple[float, float]) -> float | None:
    """The header's number clamped to ``bounds``; None when absent or not a number."""
    try:
        value = float(headers[name])
    except (KeyError, TypeError, ValueError):
        return None
    if math.isnan(value):
        return None
    low, high = bounds
    if not low <= value <= high:
        clamped = min(max(value, low), high)
        log.warning("%s: %r is outside [%g, %g]; pacing to %g", name, value, low, high, clamped)
        return clamped
    return value


def resolve(
    headers: Mapping[str, str],
    *,
    tds: float | None,
    ttft: float | None,
    unit: str,
    end: str,
    max_drain_s: float | None = MAX_DRAIN_S,
) -> Settings:
    """The pacing of one stream; ``ValueError`` naming the argument when one is bad."""
    if max_drain_s is not None:
        max_drain_s = _number("max_drain_s", max_drain_s, positive=False)
    if tds is not None:
        tds = _number("tds", tds, positive=True)
    if ttft is not None:
        ttft = _number("ttft", ttft, positive=False)
    if unit not in UNITS:
        raise ValueError(f"unit: must be one of {', '.join(UNITS)}; got {unit!r}")
    if end not in ENDS:
        raise ValueError(f"end: must be one of {', '.join(ENDS)}; got {end!r}")
    header_tds = _header(headers, "X-TokenPace-TDS", TDS_RANGE)
    header_ttft = _header(headers, "X-TokenPace-TTFT", TTFT_RANGE)
    tier = headers.get("X-TokenPace-Tier")
    if tier is None:
        tier = DEFAULT_TIER if tds is None and ttft is None else "custom"
    default = TIERS[DEFAULT_TIER]
    return Settings(
        tier=tier,
        ttft=ttft if ttft is not None else header_ttft if header_ttft is not None else default.ttft,
        tds=tds if tds is not None else header_tds if header_tds is not None else default.tds,
        unit=unit,
        end=end,
        request_id=headers.get("X-Request-Id"),
        max_drain_s=max_drain_s,
    )
