"""The gateway's tags on a vLLM request: parsing and validation (no vLLM import).

The tokenpace gateway sends ``"vllm_xargs": {"tp_tier", "tp_ttft", "tp_tds",
"tp_tenant", "tp_weight", "tp_request_id"}`` (docs/protocol.md, "Gateway → engine");
vLLM hands them to the scheduler as ``request.sampling_params.extra_args``. A request
without them (a client talking to vLLM directly) gets the engine's defaults. A tag with
a bad value falls back to its default and is reported, so one malformed request can
never stop the engine; the scheduler logs the problems.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestTags:
    """What the scheduler needs to know about one request's user."""

    tier: str = "default"
    ttft: float = 1.0  # expected time to first token, seconds
    tds: float = 4.8  # expected token delivery speed, tokens per second
    tenant: str = "default"
    weight: float = 1.0
    request_id: str | None = None  # the gateway's X-Request-Id

    def __post_init__(self) -> None:
        if not _finite(self.ttft) or self.ttft < 0:
            raise ValueError(f"ttft: must be a finite number >= 0 seconds, got {self.ttft!r}")
        if not _finite(self.tds) or self.tds <= 0:
            raise ValueError(f"tds: must be a finite number > 0 tokens/s, got {self.tds!r}")
        if not _finite(self.weight) or self.weight <= 0:
            raise ValueError(f"weight: must be a finite number > 0, got {self.weight!r}")


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def parse_tags(
    extra_args: Mapping[str, Any] | None, defaults: RequestTags
) -> tuple[RequestTags, list[str]]:
    """Tags of one request from its ``extra_args``; returns (tags, problems).

    Each missing tag takes its value from ``defaults``; each malformed one too, and is
    described in ``problems`` (empty when everything was well-formed). Keys other than
    ``tp_*`` are ignored (they belong to other vLLM extensions).
    """
    if not extra_args:
        return defaults, []
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, field, check, describe in (
        ("tp_ttft", "ttft", lambda v: _finite(v) and v >= 0, "a number >= 0"),
        ("tp_tds", "tds", lambda v: _finite(v) and v > 0, "a number > 0"),
        ("tp_weight", "weight", lambda v: _finite(v) and v > 0, "a number > 0"),
        ("tp_tier", "tier", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        ("tp_tenant", "tenant", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        ("tp_request_id", "request_id", lambda v: isinstance(v, str), "a string"),
    ):
        if key not in extra_args:
            continue
        value = extra_args[key]
        if check(value):
            values[field] = float(value) if field in ("ttft", "tds", "weight") else value
        else:
            problems.append(f"{key}={value!r} is not {describe}; using the default")
    if not values:
        return defaults, problems
    base = {f: getattr(defaults, f) for f in RequestTags.__dataclass_fields__}
    base.update(values)
    return RequestTags(**base), problems
