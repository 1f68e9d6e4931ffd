"""Reader signals: a client's word on its reader, from ``POST /v1/tokenpace/reader`` to
the engine that runs the reply (:mod:`qos.signals`; docs/architecture/reader-channel.md).

:meth:`ReaderChannel.accept` checks one signal and publishes it on the shared store's
channel :func:`qos.signals.channel` (``store.key_prefix``) as :func:`qos.signals.encode_wire`
bytes. Every replica subscribes (:meth:`ReaderChannel.start`) and, for a stream it
relays, hands the signal to the relay (:meth:`ReaderChannel.deliver`): the relay applies
it to an engine in this process (:meth:`gateway.backends.Backend.reader_signal`) and, on
``left``, ends the stream. A vLLM engine hears the same message on the channel itself
(:mod:`qos.vllm.reader_channel`). A signal reaching any replica thus reaches the engine.

The checks, cheapest first:

- the body: a JSON object (400), ``request_id`` a request id (400), the rest as
  :meth:`qos.signals.ReaderSignal.from_json` reads it (400 naming the field);
- the caller: with a telemetry token, the request it was issued for (403
  ``telemetry_token_mismatch``; the token is not used up); with the API key, a request of
  the tenant's (404), looked up in the store once per request and remembered;
- the pace: a request's signals at most every :data:`qos.signals.MIN_INTERVAL_S`
  unless its presence changes (429 ``reader_signal_rate`` with Retry-After; the newest
  state is then not applied, and the client sends it again after the interval). A
  change of presence always passes. The interval is kept per replica: behind a load
  balancer that spreads one client's signals over R replicas, a request gets at most R
  signals per interval, each bounded by the engine's own rules (a signal never buys more
  than the tier's pace, :mod:`qos.policy.reader`).

What this replica remembers of each request's signals is bounded (:data:`SEEN_MAX`
requests, the least recently signalled forgotten first).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.errors import RATE_LIMIT, GatewayError, bad_request, forbidden
from gateway.store import Store
from gateway.store.ratelimit import retry_after_header
from gateway.telemetry.errors import unknown_request
from gateway.telemetry.metrics import GatewayMetrics, series
from qos.signals import (
    MAX_REQUEST_ID_CHARS,
    MIN_INTERVAL_S,
    Presence,
    ReaderSignal,
    channel,
    decode_wire,
    encode_wire,
)

log = logging.getLogger("tokenpace.gateway.reader")

MAX_BODY_BYTES = 1024
"""A signal's body is under 200 bytes (the token included); larger ones are 413."""
SEEN_MAX = 100_000
"""Requests whose last signal this replica remembers (for the interval and the owner)."""


class ReaderListener(Protocol):
    """A stream this replica relays, told what its reader's client said."""

    def reader_signal(self, signal: ReaderSignal) -> None: ...


@dataclass(slots=True)
class _Seen:
    """A request's last signal accepted here."""

    tenant: str
    at: float  # time.monotonic()
    presence: Presence | None  # None: its owner checked, no signal accepted yet


@dataclass(slots=True)
class _Relayed:
    listener: ReaderListener
    pace_tps: float  # what its engine is asked to deliver (0 while queued in the gateway)
    away: bool = False


def signal_rate(retry_after_s: float) -> GatewayError:
    """429 for a signal sooner than the interval after the last, presence unchanged."""
    return GatewayError(
        429,
        f"Reader signals of one request come at most every {MIN_INTERVAL_S:g} s unless "
        "the presence changes; send the newest state again after Retry-After.",
        type=RATE_LIMIT,
        code="reader_signal_rate",
        headers=retry_after_header(retry_after_s * 1000.0),
    )


def _request_id(body: dict[str, Any]) -> str:
    value = body.get("request_id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REQUEST_ID_CHARS:
        raise bad_request(
            "'request_id' must be the stream's X-Request-Id.", "request_id", "invalid_value"
        )
    return value


class ReaderChannel:
    """Signals in (:meth:`accept`), out on the store's channel, and back in to the
    streams this replica relays (:meth:`deliver`)."""

    def __init__(self, store: Store, key_prefix: str, metrics: GatewayMetrics) -> None:
        self.store = store
        self.channel = channel(key_prefix)
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._relayed: dict[str, _Relayed] = {}
        self._accepted = series(metrics.reader_signals)
        refused = metrics.reader_signals_refused
        self._refused = {r: refused.labels(r) for r in ("rate", "invalid", "not_yours")}
        streams = metrics.reader_streams
        self._watching, self._away = streams.labels("watching"), streams.labels("away")
        self._pace_away = metrics.reader_pace_away
        self.malformed = 0  # channel messages that were not signals (dropped)

    def start(self) -> None:
        """Hear every replica's signals (within the app's running loop)."""
        self.store.subscribe(self.channel, self.deliver)

    # -- the streams this replica relays ------------------------------------------------
    def add(self, request_id: str, listener: ReaderListener, pace_tps: float) -> None:
        """``listener`` relays ``request_id`` until :meth:`discard`; ``pace_tps``: the
        tokens a second its engine is asked for (the tier's TDS; 0 while queued here)."""
        self._relayed[request_id] = _Relayed(listener, pace_tps)
        self._watching.inc()

    def discard(self, request_id: str) -> None:
        relayed = self._relayed.pop(request_id, None)
        if relayed is not None:
            (self._away if relayed.away else self._watching).dec()
            if relayed.away:
                self._pace_away.dec(relayed.pace_tps)

    def deliver(self, message: bytes) -> None:
        """One message of the channel: the signal to the stream it names, if relayed here."""
        try:
            request_id, signal = decode_wire(message)
        except ValueError as exc:
            self.malformed += 1
            log.warning("reader channel: dropped a message that is not a signal (%s)", exc)
            return
        relayed = self._relayed.get(request_id)
        if relayed is None:
            return
        away = signal.presence is not Presence.WATCHING
        if away != relayed.away:
            relayed.away = away
            (self._away if away else self._watching).inc()
            (self._watching if away else self._away).dec()
            self._pace_away.inc(relayed.pace_tps if away else -relayed.pace_tps)
        relayed.listener.reader_signal(signal)

    # -- POST /v1/tokenpace/reader ---------------------------------------------------------
    async def accept(
        self, tenant: str, body: bytes, token_request_id: str | None
    ) -> dict[str, str]:
        """Check one signal (see the module docstring) and publish it; the 202 body."""
        try:
            data = orjson.loads(body or b"null")
        except orjson.JSONDecodeError:
            self._refused["invalid"].inc()
            raise bad_request("The body must be a JSON object.", None, "invalid_json") from None
        try:
            if not isinstance(data, dict):
                raise bad_request("The body must be a JSON object.", None, "invalid_value")
            request_id = _request_id(data)
            try:
                signal = ReaderSignal.from_json(data)
            except ValueError as exc:
                field = str(exc).partition(":")[0]
                raise bad_request(str(exc), field, "invalid_value") from None
        except GatewayError:
            self._refused["invalid"].inc()
            raise
        seen = await self._owner(tenant, request_id, token_request_id)
        now = time.monotonic()
        wait = seen.at + MIN_INTERVAL_S - now
        if seen.presence is signal.presence and wait > 0:
            self._refused["rate"].inc()
            raise signal_rate(wait)
        seen.at, seen.presence = now, signal.presence
        await self.store.publish(self.channel, encode_wire(request_id, signal))
        self._accepted(tenant, signal.presence.value).inc()
        return {
            "object": "tokenpace.reader_signal",
            "request_id": request_id,
            "presence": signal.presence.value,
        }

    async def _owner(self, tenant: str, request_id: str, token_request_id: str | None) -> _Seen:
        """What is remembered of ``request_id``, once the caller may signal on it."""
        if token_request_id is not None and request_id != token_request_id:
            self._refused["not_yours"].inc()
            raise forbidden(
                f"The telemetry token is for request {token_request_id}, not {request_id}: "
                "send each request's signals with its own response's token.",
                "request_id",
                "telemetry_token_mismatch",
            )
        seen = self._seen.get(request_id)
        if seen is None:
            if token_request_id is None:  # the API key: the request must be the tenant's
                info = await self.store.request_info(request_id)
                if info is None or info.tenant != tenant:
                    self._refused["not_yours"].inc()
                    raise unknown_request(request_id)
            seen = self._seen[request_id] = _Seen(tenant, -math.inf, None)
            if len(self._seen) > SEEN_MAX:
                self._seen.popitem(last=False)
        elif seen.tenant != tenant:
            self._refused["not_yours"].inc()
            raise unknown_request(request_id)
        else:
            self._seen.move_to_end(request_id)
        return seen
