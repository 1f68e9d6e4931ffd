"""The gateway's default tiers: what a stream is paced to when nothing else says.

A tokenpace gateway announces the tier it serves in ``X-TokenPace-TTFT`` and
``X-TokenPace-TDS`` (docs/protocol.md, "QoE tiers"); without those headers and without
arguments, a stream is paced to the chat tier. The table is the gateway's default one,
copied so that the client needs no gateway; tests/test_sdk_tiers.py checks it against
the gateway's own table. chat: reading speed (Andes (Liu et al.) Table 1); voice:
speaking speed (Andes Table 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Expectation:
    """What the reader is expected to get: time to first token (s), delivery speed (tokens/s)."""

    ttft: float
    tds: float


TIERS: Mapping[str, Expectation] = MappingProxyType(
    {
        "chat": Expectation(ttft=1.0, tds=4.8),
        "voice": Expectation(ttft=1.0, tds=3.3),
        "fast": Expectation(ttft=0.5, tds=25.0),
        "batch": Expectation(ttft=60.0, tds=50.0),
    }
)

DEFAULT_TIER = "chat"
"""A tenant's default tier at the gateway, and what a stream without headers is paced to."""

TTFT_RANGE = (0.0, 600.0)
"""The TTFT (s) an ``X-TokenPace-TTFT`` header may announce: the widest range a gateway
plan accepts without limits of its own; a value outside is clamped to it."""

TDS_RANGE = (0.1, 1000.0)
"""The TDS (tokens/s) an ``X-TokenPace-TDS`` header may announce, likewise: ``0.0001``
would keep a three-token reply pacing for hours."""
