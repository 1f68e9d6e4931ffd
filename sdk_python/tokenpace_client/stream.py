"""``pace`` and ``apace``: a stream's chunks released on the reader's schedule.

The reader (:mod:`tokenpace_client.reader`) reads the upstream eagerly; the paced stream
releases what the :class:`~tokenpace_client.pacer.Pacer` says is due, sleeping until the
next release or the next arrival, whichever comes first (no busy waiting, one monotonic
clock). While the request waits for an engine, the gateway's queue notices (SSE comments
that openai's decoder drops, :mod:`tokenpace_client.notices`) go to ``on_queued(position,
eta_s)``, called in the task or thread that iterates the stream; the last one is
``queued``. While it streams, its reader channel (:mod:`tokenpace_client.signals`) tells
the gateway about the reader: :meth:`set_presence` (the app backgrounded, the speech
paused: nothing is released while away, and the reader's place is kept), :meth:`set_pace`,
a stall (nothing to show once the reader has read what was shown, the upstream open),
``left`` when the stream is closed before its end; a signal refused as too soon (429)
goes again one interval later. These may be called from any thread;
the token loop applies them and sends. When the stream ends (completed, aborted or
error) it exposes ``timeline`` and ``qoe``, posts its report in the background
(:mod:`tokenpace_client.telemetry`) and records the OpenTelemetry metrics
(:mod:`tokenpace_client.otel`).

Closing the paced stream (``close()``, leaving its ``with`` block, dropping it, or
cancelling the task that reads it) closes the upstream response at once. An upstream
error is raised after the tokens that had arrived have been released.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import socket
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from tokenpace_client import otel
from tokenpace_client.chunks import get_field
from tokenpace_client.clock import MONOTONIC, Clock
from tokenpace_client.headers import MAX_DRAIN_S, Settings, resolve
from tokenpace_client.notices import QueueNotice
from tokenpace_client.pacer import Pacer
from tokenpace_client.reader import Event, TaskReader, ThreadReader
from tokenpace_client.signals import ReaderChannel, check_pace
from tokenpace_client.telemetry import (
    Delivery,
    TelemetrySender,
    default_sender,
    destination,
    report_body,
    signal_sender,
)
from tokenpace_client.timeline import QoE, Timeline
from tokenpace_client.version import __version__

log = logging.getLogger("tokenpace_client")

OnQueued = Callable[[int, float], object]
"""Called with a queue notice's position (1: next to be admitted) and the gateway's eta_s."""

CLOSE_WAIT_S = 1.0  # how long close() waits for the reader thread to let go of the upstream


def _response_of(stream: Any) -> Any:
    """The HTTP response behind an openai stream or raw response, else ``None``."""
    for name in ("http_response", "response"):
        response = getattr(stream, name, None)
        if response is not None and hasattr(response, "headers"):
            return response
    return None


def _is_raw(stream: Any) -> bool:
    """An openai ``with_raw_response`` / ``with_streaming_response`` result (has ``parse()``)."""
    return hasattr(stream, "http_response") and callable(getattr(stream, "parse", None))


def _shutdown_socket(response: Any) -> None:
    """Wake a read blocked on the response's socket and tell the server at once (FIN)."""
    network = (getattr(response, "extensions", None) or {}).get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if isinstance(sock, socket.socket):
        sock.shutdown(socket.SHUT_RDWR)


class _Paced:
    """What the sync and async paced streams share: the pacer, the records, the report."""

    def __init__(
        self,
        settings: Settings,
        response: Any,
        clock: Clock,
        sent_at: float,
        telemetry: bool | TelemetrySender,
        on_queued: OnQueued | None = None,
        reader_signals: bool | TelemetrySender | None = None,
    ) -> None:
        self.request_id: str | None = settings.request_id
        self.tier: str = settings.tier
        self.ttft: float = settings.ttft
        self.tds: float = settings.tds
        self.unit = settings.unit
        self.end = settings.end
        self.response = response
        self.timeline: Timeline | None = None
        self.qoe: QoE | None = None
        self.outcome: str | None = None
        self.queued: QueueNotice | None = None  # the last queue notice, if any came
        self._on_queued = on_queued
        self._clock = clock
        self._pacer = Pacer(
            tds=settings.tds,
            unit=settings.unit,
            end=settings.end,
            sent_at=sent_at,
            max_drain_s=settings.max_drain_s,
        )
        self._sender = (
            None if telemetry is False else default_sender() if telemetry is True else telemetry
        )
        self._error: BaseException | None = None
        self._model: str | None = None
        self._stall_told = False
        signals = telemetry is not False if reader_signals is None else reader_signals
        self.reader_channel: ReaderChannel | None = self._open_channel(signals)

    def _open_channel(self, reader_signals: bool | TelemetrySender) -> ReaderChannel | None:
        """The stream's reader channel, when it can speak: a request id and a gateway URL."""
        request = getattr(self.response, "request", None)
        if reader_signals is False or self.request_id is None or request is None:
            return None
        target = destination(
            str(request.url), request.headers, self.response.headers, endpoint="reader"
        )
        if target is None:
            return None
        url, headers = target
        sender = signal_sender() if reader_signals is True else reader_signals
        request_id = self.request_id

        def refused(status: int) -> None:  # in the sender's thread: the loop applies it
            if status == 429:
                with contextlib.suppress(RuntimeError):  # the stream's event loop has closed
                    self._post(("refused", self._clock.now(), None))

        def submit(body: dict[str, Any]) -> None:
            data = json.dumps(body, separators=(",", ":")).encode()
            sender.submit(Delivery(url, headers, data, request_id, on_refused=refused))

        return ReaderChannel(request_id, submit, self._clock, lambda: self._pacer.buffered)

    def _post(self, event: Event) -> None:
        """Hand the token loop an event from any thread (the reader's queue wakes it)."""
        raise NotImplementedError

    def set_presence(self, presence: str) -> None:
        """The reader looked away (``"away"``: the app backgrounded, the speech paused;
        nothing is released meanwhile) or back (``"watching"``); told to the gateway."""
        if presence not in ("watching", "away"):
            raise ValueError(f'presence: must be "watching" or "away", got {presence!r}')
        self._post(("presence", self._clock.now(), presence))

    def set_pace(self, tps: float | None) -> None:
        """The reader's own pace in tokens a second (a speech rate; ``None``: the tier's),
        told to the gateway."""
        self._post(("pace", self._clock.now(), check_pace(tps)))

    def _deadline(self) -> float | None:
        """When the token loop must wake: the next release, the reader's stall, the
        channel's next send; ``None``: at the next event."""
        pacer, channel = self._pacer, self.reader_channel
        if channel is None:
            return pacer.next_release()
        candidates = [pacer.next_release(), channel.due()]
        if not (pacer.ended or pacer.is_away or pacer.buffered or self._stall_told):
            candidates.append(pacer.read_by())
        due = [t for t in candidates if t is not None]
        return min(due) if due else None

    def _woke(self) -> None:
        """The token loop woke: tell a stall (once per stall), send what the channel owes."""
        channel, pacer = self.reader_channel, self._pacer
        if channel is None:
            return
        read_by = pacer.read_by()
        idle = not (pacer.ended or pacer.is_away or pacer.buffered or self._stall_told)
        if idle and read_by is not None and self._clock.now() >= read_by:
            self._stall_told = True
            channel.stalled()
        channel.tick()

    def _on_event(self, event: Event) -> None:
        kind, at, payload = event
        if kind == "chunk":
            if self._model is None:
                self._model = get_field(payload, "model")
            self._pacer.arrive(at, payload)
            self._stall_told = False
        elif kind == "presence":
            if payload == "away":
                self._pacer.away(at)
            else:
                self._pacer.back(at)
            if self.reader_channel is not None:
                self.reader_channel.set_presence(payload)
        elif kind == "pace":
            if self.reader_channel is not None:
                self.reader_channel.set_pace(payload)
        elif kind == "refused":
            if self.reader_channel is not None:
                self.reader_channel.refused()
        elif kind == "queued":
            self.queued = payload
            if self._on_queued is not None:
                self._on_queued(payload.position, payload.eta_s)
        else:
            if kind == "error":
                self._error = payload
            self._pacer.end(at)
            if self.reader_channel is not None:  # the reply is no longer the gateway's to pace
                self.reader_channel.close()

    def _finish(self, outcome: str) -> None:
        """Record the end once: timeline, QoE, telemetry, metrics (never raising)."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        if self.reader_channel is not None:
            try:
                if outcome == "aborted":
                    self.reader_channel.leave()
            except Exception:  # e.g. no thread to send with at interpreter exit
                log.exception("tokenpace reader signal of request %s failed", self.request_id)
            self.reader_channel.close()
        self.timeline = self._pacer.timeline(self._clock.now())
        self.qoe = QoE.of(self.timeline, self.ttft, self.tds)
        try:
            self._report(self.timeline, outcome)
            otel.record(self.timeline, self.qoe, model=self._model, tier=self.tier)
        except Exception:
            log.exception("tokenpace telemetry of request %s failed", self.request_id)

    def _report(self, timeline: Timeline, outcome: str) -> None:
        if self._sender is None or self.request_id is None or self.response is None:
            return
        request = getattr(self.response, "request", None)
        if request is None:
            return
        target = destination(str(request.url), request.headers, self.response.headers)
        if target is None:
            return
        body = report_body(self.request_id, self.ttft, self.tds, timeline, outcome, __version__)
        self._sender.submit(Delivery(target[0], target[1], body, self.request_id))

    def _raise_or_stop(self, stop: type[Exception]) -> None:
        self._finish("error" if self._error is not None else "completed")
        if self._error is not None:
            raise self._error
        raise stop


class PacedStream(_Paced):
    """A sync stream of chunks released on the reader's schedule (see :func:`pace`)."""

    def __init__(self, reader: ThreadReader, settings: Settings, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        self._reader = reader

    def _post(self, event: Event) -> None:
        self._reader.post(event)

    def __iter__(self) -> PacedStream:
        return self

    def __next__(self) -> Any:
        if self.outcome is not None:
            raise StopIteration
        pacer, clock = self._pacer, self._clock
        while True:
            piece = pacer.pop(clock.now())
            if piece is not None:
                return piece.chunk
            if pacer.drained:
                self._raise_or_stop(StopIteration)
            event = self._reader.get(self._deadline())
            if event is not None:
                self._on_event(event)
            self._woke()

    def close(self) -> None:
        """Close the upstream response now; the stream ends as ``aborted`` unless it had ended."""
        if self.outcome is None:
            self._reader.stop(CLOSE_WAIT_S)
            self._finish("aborted")

    def __enter__(self) -> PacedStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "outcome", "") is None:
            self._reader.stop(0.0)
            self._finish("aborted")


class AsyncPacedStream(_Paced):
    """An async stream of chunks released on the reader's schedule (see :func:`apace`)."""

    def __init__(
        self, start_reader: Callable[[], TaskReader], settings: Settings, **kwargs: Any
    ) -> None:
        super().__init__(settings, **kwargs)
        self._start_reader = start_reader
        self._reader: TaskReader | None = None
        with contextlib.suppress(RuntimeError):  # outside a running loop: at first use
            asyncio.get_running_loop()
            self._reader = start_reader()

    def _post(self, event: Event) -> None:
        self._started().post(event)

    def _started(self) -> TaskReader:
        if self._reader is None:
            self._reader = self._start_reader()
        return self._reader

    def __aiter__(self) -> AsyncPacedStream:
        return self

    async def __anext__(self) -> Any:
        if self.outcome is not None:
            raise StopAsyncIteration
        reader, pacer, clock = self._started(), self._pacer, self._clock
        try:
            while True:
                piece = pacer.pop(clock.now())
                if piece is not None:
                    return piece.chunk
                if pacer.drained:
                    self._raise_or_stop(StopAsyncIteration)
                event = await reader.get(self._deadline(), pacer.next_release() is None)
                if event is not None:
                    self._on_event(event)
                self._woke()
        except asyncio.CancelledError:  # the consuming task was cancelled: let go at once
            reader.cancel()
            self._finish("aborted")
            raise

    async def close(self) -> None:
        """Close the upstream response now; the stream ends as ``aborted`` unless it had ended."""
        if self.outcome is None:
            if self._reader is not None:
                await self._reader.stop()
            self._finish("aborted")

    aclose = close

    async def __aenter__(self) -> AsyncPacedStream:
        self._started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __del__(self) -> None:
        if getattr(self, "outcome", "") is None:
            if self._reader is not None:
                self._reader.cancel()
            self._finish("aborted")


def _headers(response: Any) -> Mapping[str, str]:
    return response.headers if response is not None else {}


def pace(
    stream: Any,
    *,
    tds: float | None = None,
    ttft: float | None = None,
    unit: str = "token",
    end: str = "drain",
    max_drain_s: float | None = MAX_DRAIN_S,
    telemetry: bool | TelemetrySender = True,
    clock: Clock | None = None,
    sent_at: float | None = None,
    on_queued: OnQueued | None = None,
    reader_signals: bool | TelemetrySender | None = None,
) -> PacedStream:
    """Release the chunks of ``stream`` at the reader's speed.

    ``stream``: an openai ``Stream`` (or its ``with_raw_response`` result) of chat
    completion chunks, or any iterable of chunk objects or dicts. ``tds``/``ttft``
    override the gateway's ``X-TokenPace-TDS``/``X-TokenPace-TTFT``; without either, the
    chat tier. ``unit``: ``token``, ``word`` or ``sentence``; ``end``: ``drain`` (keep
    pacing) or ``flush`` (release the rest when the upstream ends). ``telemetry``:
    ``False`` sends no report, a :class:`TelemetrySender` sends it there.
    ``reader_signals``: the live reader channel (:mod:`tokenpace_client.signals`) to
    ``/v1/tokenpace/reader``; ``None`` (default): on when ``telemetry`` is, ``False``: off,
    a :class:`TelemetrySender`: sent there. ``clock``: the
    pacing clock (``time.monotonic``); ``sent_at``: when the request was sent on that
    clock (default: now), the origin of the timelines.
    """
    response = _response_of(stream)
    settings = resolve(
        _headers(response), tds=tds, ttft=ttft, unit=unit, end=end, max_drain_s=max_drain_s
    )
    clock = clock or MONOTONIC
    sent_at = clock.now() if sent_at is None else sent_at
    if _is_raw(stream):
        stream = stream.parse()
    if not isinstance(stream, Iterable):
        raise TypeError(
            "stream: expected an openai Stream or an iterable of chunks, "
            f"got {type(stream).__name__}"
            + (" (use apace for async streams)" if isinstance(stream, AsyncIterable) else "")
        )
    close = getattr(stream, "close", None)
    reader = ThreadReader(
        stream,
        clock,
        close=close if callable(close) else lambda: None,
        interrupt=lambda: _shutdown_socket(response),
    )
    return PacedStream(
        reader,
        settings,
        response=response,
        clock=clock,
        sent_at=sent_at,
        telemetry=telemetry,
        on_queued=on_queued,
        reader_signals=reader_signals,
    )


def apace(
    stream: Any,
    *,
    tds: float | None = None,
    ttft: float | None = None,
    unit: str = "token",
    end: str = "drain",
    max_drain_s: float | None = MAX_DRAIN_S,
    telemetry: bool | TelemetrySender = True,
    clock: Clock | None = None,
    sent_at: float | None = None,
    on_queued: OnQueued | None = None,
    reader_signals: bool | TelemetrySender | None = None,
) -> AsyncPacedStream:
    """:func:`pace` for an openai ``AsyncStream`` or any async iterable of chunks.

    The reader task starts at once when called in a running event loop, else at first use.
    """
    response = _response_of(stream)
    settings = resolve(
        _headers(response), tds=tds, ttft=ttft, unit=unit, end=end, max_drain_s=max_drain_s
    )
    clock = clock or MONOTONIC
    sent_at = clock.now() if sent_at is None else sent_at
    raw = _is_raw(stream)
    if not raw and not isinstance(stream, AsyncIterable):
        raise TypeError(
            f"stream: expected an openai AsyncStream or an async iterable of chunks, "
            f"got {type(stream).__name__}"
            + (" (use pace for sync streams)" if isinstance(stream, Iterable) else "")
        )

    async def open_iterable() -> AsyncIterable[Any]:
        if not raw:
            chunks: AsyncIterable[Any] = stream
            return chunks
        parsed = stream.parse()
        chunks = await parsed if inspect.isawaitable(parsed) else parsed
        return chunks

    async def close() -> None:
        target = response if raw else stream
        closer = getattr(target, "aclose", None) or getattr(target, "close", None)
        if callable(closer):
            result = closer()
            if isinstance(result, Awaitable):
                await result

    return AsyncPacedStream(
        lambda: TaskReader(open_iterable, clock, close=close),
        settings,
        response=response,
        clock=clock,
        sent_at=sent_at,
        telemetry=telemetry,
        on_queued=on_queued,
        reader_signals=reader_signals,
    )
