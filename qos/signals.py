"""Reader signals: what a client tells the scheduler about its reader while a reply streams.

The reader guard (:mod:`qos.policy.reader`) models each reader's buffer from the
server's send times and the tier's pace. A client SDK sees what the model cannot: the
page hidden or the speech paused, the reader's real pace, the tokens it holds unshown,
the reader gone. It says so in a :class:`ReaderSignal`, sent on change (at most every
:data:`MIN_INTERVAL_S`), and the gateway hands it to the engine that runs the reply
(docs/protocol.md, "SDK → gateway: reader signals").

One vocabulary everywhere: the gateway parses a client's body with
:meth:`ReaderSignal.from_json`, passes it to an in-process engine as is and to a vLLM
engine on the shared store's channel as :func:`encode_wire` bytes, which the plugin reads
back with :func:`decode_wire`. No vLLM or gateway import.

A signal can make a reader more patient (away, a slower pace) or report a real buffer
below the server's model; it never buys more than the tier's pace, so a client that lies
gains nothing over an honest one (:mod:`qos.policy.reader` applies those bounds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MIN_INTERVAL_S = 0.25
"""A client sends at most one signal per reply this often; a change of presence is sent
at once, and a buffer or pace change waits for the interval to pass."""

AWAY_LEASE_S = 10.0
"""An away signal holds this long unless renewed: a client whose reader stays away sends
it again every half lease. A lost "watching" signal then costs at most one lease of
away treatment, never the rest of the reply."""

MAX_PACE_TPS = 1000.0
"""The largest pace a signal may state (tokens a second): a bound on input, not a rate
anyone is served at (the tier's pace caps that)."""

MAX_BUFFER_TOKENS = 1_000_000
"""The largest buffer a signal may state (tokens received and not yet shown)."""

MAX_REQUEST_ID_CHARS = 128
"""The longest request id a wire message may carry (the gateway's ids are 32 hex)."""


class Presence(StrEnum):
    """Whether anyone is reading or listening."""

    WATCHING = "watching"  # the page shown, the speech playing
    AWAY = "away"  # the tab hidden, the app backgrounded, the speech paused
    LEFT = "left"  # the reader is gone: the gateway ends the reply


@dataclass(frozen=True, slots=True)
class ReaderSignal:
    """One client's word on its reader, as it stood when sent.

    ``pace_tps``: the reader's own pace (a speech rate, a speed control), when it differs
    from the tier's. ``buffer_tokens``: tokens the client has received and not yet shown
    or spoken. ``None`` means not stated: the server's model stands.
    """

    presence: Presence
    pace_tps: float | None = None
    buffer_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.presence, Presence):
            raise ValueError(f"presence: must be a Presence, got {self.presence!r}")
        pace = self.pace_tps
        if pace is not None and not (math.isfinite(pace) and 0 < pace <= MAX_PACE_TPS):
            raise ValueError(
                f"pace_tps: must be a number of tokens a second in (0, {MAX_PACE_TPS:g}], "
                f"got {pace!r}"
            )
        buffer = self.buffer_tokens
        if buffer is not None and not 0 <= buffer <= MAX_BUFFER_TOKENS:
            raise ValueError(
                f"buffer_tokens: must be a whole number of tokens in [0, {MAX_BUFFER_TOKENS}], "
                f"got {buffer!r}"
            )

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ReaderSignal:
        """The signal a client's JSON object states; ValueError naming the field to fix."""
        presence = body.get("presence")
        if not isinstance(presence, str) or presence not in Presence._value2member_map_:
            choices = ", ".join(f'"{p.value}"' for p in Presence)
            raise ValueError(f"presence: must be one of {choices}, got {presence!r}")
        return cls(
            Presence(presence),
            pace_tps=_number(body, "pace_tps"),
            buffer_tokens=_whole(body, "buffer_tokens"),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads back (unstated fields left out)."""
        out: dict[str, Any] = {"presence": self.presence.value}
        if self.pace_tps is not None:
            out["pace_tps"] = self.pace_tps
        if self.buffer_tokens is not None:
            out["buffer_tokens"] = self.buffer_tokens
        return out


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number or null, got {value!r}")
    return float(value)


def _whole(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be a whole number or null, got {value!r}")
    return value


def channel(key_prefix: str) -> str:
    """The shared store's channel the gateway publishes signals on, for ``key_prefix``
    (the gateway's ``store.key_prefix``; the plugin's ``TOKENPACE_KEY_PREFIX``)."""
    return f"{key_prefix}:reader"


def encode_wire(request_id: str, signal: ReaderSignal) -> bytes:
    """One channel message: the gateway's request id (the ``tp_request_id`` tag) and
    the signal."""
    body = {"request_id": request_id, **signal.to_json()}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_wire(message: bytes | str) -> tuple[str, ReaderSignal]:
    """The request id and signal of one channel message; ValueError when malformed."""
    try:
        body = json.loads(message)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"reader signal: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError("reader signal: must be a JSON object")
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
        raise ValueError(f"request_id: must be a string of 1 to {MAX_REQUEST_ID_CHARS} chars")
    return request_id, ReaderSignal.from_json(body)
