"""QoE telemetry: the report a finished stream posts to the gateway, delivered in the background.

``POST {base}/v1/tokenpace/telemetry`` (docs/protocol.md, "SDK → gateway: QoE
telemetry"). The report is authenticated with the response's
``X-TokenPace-Telemetry-Token`` when the gateway sent one, else with the API key the
request carried. Timelines are coalesced (:mod:`tokenpace_client.coalesce`) to fit the
gateway's default limits: 20,000 entries a timeline and a 256 KiB body.

Delivery never blocks the caller and never raises into it: reports go into a bounded
queue (a full queue drops the report) served by one daemon thread; 5xx answers and
connection failures are retried with exponential back-off, 4xx answers never; reports
still queued when the interpreter exits get one last try, bounded in time.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tokenpace_client.coalesce import coalesce
from tokenpace_client.timeline import Timeline, ceil_us

log = logging.getLogger("tokenpace_client.telemetry")

SDK_NAME = "tokenpace-python"
TOKEN_HEADER = "X-TokenPace-Telemetry-Token"
MAX_POINTS = 20_000  # the gateway's telemetry.max_points default
MAX_BODY_BYTES = 256 * 1024  # the gateway's telemetry.max_body_bytes default
_COMPLETIONS = ("/chat/completions", "/completions")


@dataclass(frozen=True)
class Delivery:
    """One report (or reader signal), ready to post; ``on_refused`` is told the status of
    a 4xx answer, in the sender's thread."""

    url: str
    headers: Mapping[str, str]
    body: bytes
    request_id: str
    on_refused: Callable[[int], object] | None = None


def destination(
    request_url: str,
    request_headers: Mapping[str, str],
    response_headers: Mapping[str, str],
    endpoint: str = "telemetry",
) -> tuple[str, dict[str, str]] | None:
    """The URL of ``/tokenpace/{endpoint}`` (``telemetry``: QoE reports; ``reader``: reader
    signals) and its auth headers for a completions request, ``None`` if unknown.

    The telemetry token (``X-TokenPace-Telemetry-Token``) is preferred when the response
    carries one; otherwise the request's own ``Authorization`` (its API key).
    """
    url = request_url.split("?", 1)[0].rstrip("/")
    base = next((url[: -len(s)] for s in _COMPLETIONS if url.endswith(s)), None)
    if base is None:
        return None
    token = response_headers.get(TOKEN_HEADER)
    if token:
        return f"{base}/tokenpace/{endpoint}", {TOKEN_HEADER: token}
    auth = request_headers.get("authorization")
    if not auth:
        return None
    return f"{base}/tokenpace/{endpoint}", {"Authorization": auth}


def report_body(
    request_id: str, ttft: float, tds: float, timeline: Timeline, outcome: str, version: str
) -> bytes:
    """The JSON report, its timelines coalesced until it fits the gateway's limits."""
    limit = MAX_POINTS
    while True:
        body = {
            "request_id": request_id,
            "expected": {"ttft": ttft, "tds": tds},
            "arrivals": coalesce(timeline.arrivals, limit),
            "displayed": coalesce(timeline.displayed, limit),
            "outcome": outcome,
            "sdk": {"name": SDK_NAME, "version": version},
        }
        if timeline.away:
            body["away"] = [[ceil_us(a), ceil_us(b)] for a, b in timeline.away]
        data = json.dumps(body, separators=(",", ":")).encode()
        if len(data) <= MAX_BODY_BYTES or limit == 2:
            return data
        limit = max(2, int(limit * MAX_BODY_BYTES / len(data) * 0.95))


class TelemetrySender:
    """Posts reports from a bounded queue in a daemon thread (started on first use).

    ``stats`` counts ``queued``, ``delivered``, ``rejected`` (4xx), ``failed`` (retries
    spent or an unexpected error), ``dropped`` (queue full) and ``attempts``;
    ``responses`` keeps the last answers as ``(request_id, status, body)``. ``transport``
    is httpx's (default: the network).
    """

    def __init__(
        self,
        *,
        max_queue: int = 1000,
        retries: int = 3,
        backoff_s: float = 0.5,
        timeout_s: float = 5.0,
        exit_flush_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._queue: queue.Queue[Delivery] = queue.Queue(max_queue)
        self._retries = retries
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s
        self._exit_flush_s = exit_flush_s
        self._transport = transport
        self._stopping = threading.Event()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._atexit = False
        self.stats: Counter[str] = Counter()
        self.responses: deque[tuple[str, int, Any]] = deque(maxlen=64)

    def submit(self, delivery: Delivery) -> bool:
        """Queue ``delivery``; ``False`` (and dropped) when the queue is full. Never blocks."""
        with self._idle:
            try:
                self._queue.put_nowait(delivery)
            except queue.Full:
                self.stats["dropped"] += 1
                return False
            self._pending += 1
            self.stats["queued"] += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tokenpace-telemetry", daemon=True
                )
                self._thread.start()
                if not self._atexit:
                    atexit.register(self.close)
                    self._atexit = True
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every queued report is settled; ``True`` if they are."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self) -> None:
        """Stop backing off and give queued reports a last try, for ``exit_flush_s`` at most."""
        self._stopping.set()
        self.flush(self._exit_flush_s)

    def _run(self) -> None:
        with httpx.Client(timeout=self._timeout_s, transport=self._transport) as http:
            while True:
                delivery = self._queue.get()
                try:
                    self.stats[self._deliver(http, delivery)] += 1
                except Exception:  # never let one report stop the thread
                    log.exception("telemetry for %s failed", delivery.request_id)
                    self.stats["failed"] += 1
                finally:
                    with self._idle:
                        self._pending -= 1
                        self._idle.notify_all()

    def _deliver(self, http: httpx.Client, delivery: Delivery) -> str:
        headers = {**delivery.headers, "Content-Type": "application/json"}
        for attempt in range(self._retries + 1):
            if attempt and not self._stopping.is_set():
                self._stopping.wait(self._backoff_s * 2 ** (attempt - 1))
            self.stats["attempts"] += 1
            try:
                response = http.post(delivery.url, content=delivery.body, headers=headers)
            except httpx.TransportError as exc:
                log.debug("telemetry for %s: %s (attempt %d)", delivery.request_id, exc, attempt)
                continue
            if response.status_code >= 500:
                continue
            try:
                answer = response.json()
            except ValueError:
                answer = response.text
            self.responses.append((delivery.request_id, response.status_code, answer))
            if response.status_code >= 400:
                log.warning(
                    "telemetry for %s refused: %d %s",
                    delivery.request_id,
                    response.status_code,
                    response.text[:200],
                )
                if delivery.on_refused is not None:
                    delivery.on_refused(response.status_code)
                return "rejected"
            return "delivered"
        log.warning("telemetry for %s dropped after %d attempts", delivery.request_id, attempt + 1)
        return "failed"


_default: TelemetrySender | None = None
_signals: TelemetrySender | None = None
_default_lock = threading.Lock()


def default_sender() -> TelemetrySender:
    """The process-wide sender that paced streams use unless given their own."""
    global _default
    with _default_lock:
        if _default is None:
            _default = TelemetrySender()
        return _default


def signal_sender() -> TelemetrySender:
    """The process-wide sender of reader signals (:mod:`tokenpace_client.signals`): its own
    queue, so a signal never waits behind reports, and no retries (a late signal is stale)."""
    global _signals
    with _default_lock:
        if _signals is None:
            _signals = TelemetrySender(retries=0, timeout_s=2.0)
        return _signals
