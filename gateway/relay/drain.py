"""Draining a gateway that is told to stop (SIGTERM): what is under way finishes, up to
``server.drain_s``; then each request still open ends with an answer of its own.

The server stops accepting connections and calls :meth:`Drain.begin` as it shuts down
(:mod:`gateway.runtime.server`); ``/readyz`` answers 503 from then on. Every request the
gateway is serving is open in the drain (:meth:`~Drain.add`) while it runs: a stream by its relay, a
request before its response by its disconnect watch. At the deadline each one's
``shut_down()`` is called: a stream ends with an OpenAI error event
(``server_shutting_down``) and ``data: [DONE]``, a request not yet answered gets 503 with
that code, as JSON. The server's own grace period (``drain_s`` plus a few seconds to
exit) leaves time for those last writes; the connections then close, and the process
exits. As Envoy's drain and nginx's graceful shutdown: new work goes elsewhere at once,
work under way is not cut.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from gateway.errors import SERVER_ERROR, GatewayError

log = logging.getLogger("tokenpace.gateway")

DRAIN_STATE_KEY = "tokenpace.drain"  # the app's lifespan state: where the server finds it
EXIT_S = 5.0  # past the drain: the last writes, the connections' close, the app's shutdown


def shutting_down() -> GatewayError:
    """What a request still open at the drain's deadline is told (503, or in its stream)."""
    return GatewayError(
        503,
        "The gateway is shutting down; send the request again (another replica serves it).",
        type=SERVER_ERROR,
        code="server_shutting_down",
        headers={"Retry-After": "1"},
    )


class Drainable(Protocol):
    def shut_down(self) -> None:
        """End now, with :func:`shutting_down`'s answer."""


class Drain:
    """The gateway's stop: :meth:`begin` once, then at ``drain_s`` everything still
    tracked is shut down."""

    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.deadline: float | None = None  # time.monotonic(), once draining
        self.expired = False
        self._open: set[Drainable] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def begin(self) -> None:
        """Start draining (idempotent): shut down what is still open in ``drain_s``."""
        if self.deadline is not None:
            return
        self.deadline = time.monotonic() + self.drain_s
        log.warning(
            "shutting down: %d request(s) under way get up to %g s to finish",
            len(self._open),
            self.drain_s,
        )
        self._timer = asyncio.get_running_loop().call_later(self.drain_s, self._expire)

    def close(self) -> None:
        """Stop the timer (the app is shutting down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def add(self, item: Drainable) -> None:
        """``item`` is open until :meth:`discard` (shut down at once past the deadline);
        two plain calls rather than a context manager: every request opens one or two."""
        if self.expired:
            item.shut_down()
        self._open.add(item)

    def discard(self, item: Drainable) -> None:
        """``item`` is done (call it in ``finally``)."""
        self._open.discard(item)

    def _expire(self) -> None:
        self._timer = None
        self.expired = True
        if self._open:
            log.warning("drain time over: ending %d request(s) still open", len(self._open))
        for item in list(self._open):
            item.shut_down()
