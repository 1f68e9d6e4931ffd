"""OpenTelemetry GenAI client metrics, recorded only where ``opentelemetry-api`` is importable.

Per finished stream: ``gen_ai.client.operation.time_to_first_chunk`` (s, from sending the
request to the first chunk with a token), ``gen_ai.client.operation.time_per_output_chunk``
(s, between consecutive chunks with tokens), ``gen_ai.client.token.usage`` ({token},
``gen_ai.token.type=output``) as the OpenTelemetry GenAI semantic conventions name
them, and ``tokenpace.client.displayed_qoe`` (the QoE of what the user was shown:
Andes (Liu et al.) §3.1 Eq. 1 and the monotone QoE of docs/qoe.md, ``tokenpace.qoe``
= ``andes`` or ``monotone``). Without the API this module records nothing.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

from tokenpace_client.timeline import QoE, Timeline
from tokenpace_client.version import __version__

try:
    from opentelemetry import metrics as _metrics
except ImportError:  # optional: no hard dependency on OpenTelemetry
    _metrics = None  # type: ignore[assignment]


@cache
def _instruments() -> tuple[Any, Any, Any, Any] | None:
    if _metrics is None:
        return None
    meter = _metrics.get_meter("tokenpace-client", __version__)
    return (
        meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to first chunk",
        ),
        meter.create_histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            unit="s",
            description="Time between consecutive output chunks",
        ),
        meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens used"
        ),
        meter.create_histogram(
            "tokenpace.client.displayed_qoe", unit="1", description="QoE of the displayed timeline"
        ),
    )


def record(timeline: Timeline, qoe: QoE, *, model: str | None, tier: str) -> None:
    """Record one finished stream's metrics (a no-op without ``opentelemetry-api``)."""
    instruments = _instruments()
    if instruments is None or not timeline.arrivals:
        return
    first_chunk, per_chunk, usage, displayed = instruments
    attrs: dict[str, str] = {"gen_ai.operation.name": "chat", "tokenpace.tier": tier}
    if model:
        attrs["gen_ai.response.model"] = model
    times = [t for t, _ in timeline.arrivals]
    first_chunk.record(times[0], attrs)
    for a, b in itertools.pairwise(times):
        per_chunk.record(b - a, attrs)
    usage.record(sum(n for _, n in timeline.arrivals), {**attrs, "gen_ai.token.type": "output"})
    if timeline.displayed:
        displayed.record(qoe.displayed_andes, {**attrs, "tokenpace.qoe": "andes"})
        displayed.record(qoe.displayed_monotone, {**attrs, "tokenpace.qoe": "monotone"})
