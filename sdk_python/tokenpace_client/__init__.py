"""tokenpace-client: releases a streamed LLM reply at the reader's speed and reports its QoE.

The scheduler of a QoE-aware server (Andes (Liu et al.) §4–§5) streams in bursts and
pauses streams that are ahead of their reader; this client's token buffer turns that
into a smooth stream at the tier's speed (``X-TokenPace-TDS``) and tells the gateway
what the user saw. ``pace``/``apace`` wrap any openai stream or iterable of chunks;
``OpenAI``/``AsyncOpenAI`` (with the ``openai`` extra) are drop-in clients.
"""

from __future__ import annotations

from typing import Any

from tokenpace_client.notices import QueueNotice, parse_queue_notice
from tokenpace_client.qoe import (
    Freezes,
    andes_qoe,
    digestion_starts,
    freezes,
    monotone_qoe,
    user_idle_latency,
)
from tokenpace_client.stream import AsyncPacedStream, PacedStream, apace, pace
from tokenpace_client.telemetry import TelemetrySender, default_sender
from tokenpace_client.tiers import DEFAULT_TIER, TDS_RANGE, TIERS, TTFT_RANGE, Expectation
from tokenpace_client.timeline import QoE, Timeline
from tokenpace_client.version import __version__

__all__ = [
    "DEFAULT_TIER",
    "TDS_RANGE",
    "TIERS",
    "TTFT_RANGE",
    "AsyncOpenAI",
    "AsyncPacedStream",
    "Expectation",
    "Freezes",
    "OpenAI",
    "PacedStream",
    "QoE",
    "QueueNotice",
    "TelemetrySender",
    "Timeline",
    "__version__",
    "andes_qoe",
    "apace",
    "default_sender",
    "digestion_starts",
    "freezes",
    "monotone_qoe",
    "pace",
    "parse_queue_notice",
    "user_idle_latency",
]


def __getattr__(name: str) -> Any:
    """``OpenAI`` and ``AsyncOpenAI`` need the ``openai`` extra; imported on first use."""
    if name in ("OpenAI", "AsyncOpenAI"):
        try:
            from tokenpace_client import client
        except ImportError as exc:
            raise ImportError(
                f"tokenpace_client.{name} needs openai: pip install 'tokenpace-client[openai]'"
            ) from exc
        return getattr(client, name)
    raise AttributeError(f"module 'tokenpace_client' has no attribute {name!r}")
