"""Reader signals: what a paced stream tells the gateway about its reader while it streams.

``POST {base}/v1/tokenpace/reader`` (docs/protocol.md, "SDK → gateway: reader signals"),
authenticated like the QoE report (the response's telemetry token, else the request's
API key). The vocabulary and the timing are the gateway's (``qos/signals.py``); this is a
copy, checked against ``tests/vectors/signals.json``, which is generated from it.

:class:`ReaderChannel` holds the rules, free of I/O and of threads: it lives in the
paced stream's token loop, which tells it what changed and wakes at :meth:`ReaderChannel.due`
to send what waited (:meth:`ReaderChannel.tick`):

- a change of presence (``watching``, ``away``, ``left``) goes at once;
- anything else (a new pace, a stall: the buffer empty once the reader has read what was
  shown, the stream open) at most every :data:`MIN_INTERVAL_S` after the previous signal,
  carrying the state as it then stands;
- while away, the away is renewed every ``AWAY_LEASE_S / 2``;
- every signal carries ``buffer_tokens``: tokens received and not yet shown;
- a signal the gateway refuses as too soon (429) goes again, as the state then stands,
  one interval later;
- ``left`` is the last signal; after :meth:`ReaderChannel.close` (the reply has fully
  arrived, or the stream ended: the gateway has nothing left to pace) nothing is sent.

Bodies go to ``submit``, which must not block (by default a background sender,
:mod:`tokenpace_client.telemetry`, without retries: a stale signal is worth nothing).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, Literal

from tokenpace_client.clock import Clock

MIN_INTERVAL_S = 0.25
"""A client sends at most one signal per reply this often; a change of presence goes at once."""

AWAY_LEASE_S = 10.0
"""An away holds this long at the gateway unless renewed; a client renews it every half lease."""

MAX_PACE_TPS = 1000.0
"""The largest pace a signal may state (tokens a second)."""

MAX_BUFFER_TOKENS = 1_000_000
"""The largest buffer a signal may state (tokens)."""

Presence = Literal["watching", "away", "left"]
PRESENCES: tuple[Presence, ...] = ("watching", "away", "left")

Submit = Callable[[dict[str, Any]], object]
"""Hands one signal's JSON body on for sending; must not block."""


def check_pace(tps: float | None) -> float | None:
    """``tps`` if it is a pace a signal may state; ValueError naming the bound otherwise."""
    if tps is not None and not (math.isfinite(tps) and 0 < tps <= MAX_PACE_TPS):
        raise ValueError(f"pace: must be tokens a second in (0, {MAX_PACE_TPS:g}], got {tps!r}")
    return tps


class ReaderChannel:
    """The throttled signals of one stream (see the module documentation)."""

    def __init__(
        self, request_id: str, submit: Submit, clock: Clock, buffer: Callable[[], int]
    ) -> None:
        self._request_id = request_id
        self._submit = submit
        self._clock = clock
        self._buffer = buffer
        self._lock = threading.Lock()  # the token loop and a closing thread may meet here
        self._presence: Presence = "watching"
        self._pace: float | None = None
        self._last_sent = -math.inf
        self._pending = False
        self._closed = False

    @property
    def presence(self) -> Presence:
        return self._presence

    def set_presence(self, presence: Literal["watching", "away"]) -> None:
        """The reader looked away or back: sent at once if it changed."""
        if presence not in ("watching", "away"):
            raise ValueError(f'presence: must be "watching" or "away", got {presence!r}')
        with self._lock:
            if self._closed or presence == self._presence:
                return
            self._presence = presence
            self._send()

    def set_pace(self, tps: float | None) -> None:
        """The reader's own pace (``None``: the tier's): sent within the interval."""
        check_pace(tps)
        with self._lock:
            if self._closed or tps == self._pace:
                return
            self._pace = tps
            self._request()

    def stalled(self) -> None:
        """The reader waits with nothing to read and the stream open: said within the interval."""
        with self._lock:
            if not self._closed and self._presence == "watching":
                self._request()

    def leave(self) -> None:
        """The reader is gone (the stream closed by the user): the last signal."""
        with self._lock:
            if self._closed:
                return
            self._presence = "left"
            try:
                self._send()
            finally:
                self._closed = True

    def close(self) -> None:
        """The reply has fully arrived or the stream ended: nothing more is sent."""
        with self._lock:
            self._closed = True

    def refused(self) -> None:
        """The gateway refused a signal as too soon (429: it reached the gateway within the
        interval of the previous one): the state as it then stands goes again after the
        interval."""
        with self._lock:
            if not self._closed:
                self._last_sent = self._clock.now()
                self._pending = True

    def due(self) -> float | None:
        """When the channel next wants to send (clock time): a waiting update, a renewal."""
        if self._closed:
            return None
        if self._pending:
            return self._last_sent + MIN_INTERVAL_S
        if self._presence == "away":
            return self._last_sent + AWAY_LEASE_S / 2
        return None

    def tick(self) -> None:
        """Send what is due now."""
        with self._lock:
            due = self.due()
            if due is not None and self._clock.now() >= due:
                self._send()

    def _request(self) -> None:
        if self._clock.now() - self._last_sent >= MIN_INTERVAL_S:
            self._send()
        else:
            self._pending = True

    def _send(self) -> None:
        self._last_sent = self._clock.now()
        self._pending = False
        body: dict[str, Any] = {
            "request_id": self._request_id,
            "presence": self._presence,
            "buffer_tokens": self._buffer(),
        }
        if self._pace is not None:
            body["pace_tps"] = self._pace
        self._submit(body)
