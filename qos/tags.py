"""The ``tp_*`` tags: who a request is for, from the gateway to the engine's scheduler.

docs/protocol.md, "Gateway → engine". The gateway encodes a request's tags into its
``vllm_xargs`` (:func:`encode_tags`); vLLM hands them to the scheduler plugin as
``request.sampling_params.extra_args``, which decodes them (:func:`decode_tags`). Every
key starting with :data:`TAG_PREFIX` is the contract's: the gateway drops the ones a
client sent. A request without tags (a client talking to vLLM directly) gets the
engine's defaults; a tag with a bad value falls back to its default and is reported, so
one malformed request can never stop the engine. No vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard, TypeVar

TAG_PREFIX = "tp_"
TAG_KEYS = ("tp_tier", "tp_ttft", "tp_tds", "tp_tenant", "tp_weight", "tp_request_id")
"""Every tag, in the order the gateway writes them: ``tp_`` and a RequestTags field."""

_D = TypeVar("_D")


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


def encode_tags(tags: RequestTags) -> dict[str, str | float]:
    """The ``vllm_xargs`` entries that carry ``tags`` (no ``tp_request_id`` without an id)."""
    encoded: dict[str, str | float] = {
        "tp_tier": tags.tier,
        "tp_ttft": float(tags.ttft),
        "tp_tds": float(tags.tds),
        "tp_tenant": tags.tenant,
        "tp_weight": float(tags.weight),
    }
    if tags.request_id is not None:
        encoded["tp_request_id"] = tags.request_id
    return encoded


def decode_tags(
    extra_args: Mapping[str, object] | None, defaults: RequestTags
) -> tuple[RequestTags, list[str]]:
    """Tags of one request from its ``extra_args``; returns (tags, problems).

    Each missing tag takes its value from ``defaults``; each malformed one too, and is
    described in ``problems`` (empty when everything was well-formed). Keys other than
    the tags are ignored (they belong to other vLLM extensions).
    """
    if not extra_args:
        return defaults, []
    problems: list[str] = []
    tags = RequestTags(
        tier=_text(extra_args, "tp_tier", defaults.tier, problems),
        ttft=_number(extra_args, "tp_ttft", defaults.ttft, problems, zero_ok=True),
        tds=_number(extra_args, "tp_tds", defaults.tds, problems),
        tenant=_text(extra_args, "tp_tenant", defaults.tenant, problems),
        weight=_number(extra_args, "tp_weight", defaults.weight, problems),
        request_id=_text(extra_args, "tp_request_id", defaults.request_id, problems, empty_ok=True),
    )
    return tags, problems


def _number(
    args: Mapping[str, object],
    key: str,
    default: float,
    problems: list[str],
    *,
    zero_ok: bool = False,
) -> float:
    if key not in args:
        return default
    value = args[key]
    if _finite(value) and (value > 0 or (zero_ok and value == 0)):
        return float(value)
    problems.append(
        f"{key}={value!r} is not a number {'>=' if zero_ok else '>'} 0; using the default"
    )
    return default


def _text(
    args: Mapping[str, object],
    key: str,
    default: _D,
    problems: list[str],
    *,
    empty_ok: bool = False,
) -> str | _D:
    if key not in args:
        return default
    value = args[key]
    if isinstance(value, str) and (empty_ok or value != ""):
        return value
    kind = "a string" if empty_ok else "a non-empty string"
    problems.append(f"{key}={value!r} is not {kind}; using the default")
    return default


def _finite(x: object) -> TypeGuard[float]:
    """A real number (an int or a float, not a bool), neither infinite nor NaN."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
