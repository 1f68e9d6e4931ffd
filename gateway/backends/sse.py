"""Server-sent events from an upstream response, read as OpenAI chunks."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import httpx
import msgspec
import orjson

from gateway.backends.base import BackendError, Batch, ChunkStream
from gateway.backends.chunk import ChunkView, read_chunk
from gateway.backends.upstream import body_reader

MAX_ERROR_BODY = 64 * 1024  # the most of an error (or a stream's tail) the gateway reads
_DRAIN_S = 0.25  # longest wait for the end of a stream's body after [DONE]


def is_openai_error(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


class HttpChunkStream(ChunkStream):
    """Server-sent events from an upstream response, read as chunks.

    Each :meth:`next_batch` is one read of the body (:func:`gateway.backends.upstream.body_reader`:
    everything the connection has buffered), split into events as bytes (SSE is UTF-8 by
    definition), each decoded only as far as the relay reads it
    (:func:`~gateway.backends.chunk.read_chunk`) and counted; a read of whole ``data:``
    events that are all chunks is relayed as read. A failure after some good events of
    a read is raised at the next call, after those events are relayed. After ``data:
    [DONE]``, :meth:`aclose` reads the end of the body (normally just the
    chunked-encoding terminator, already received) so that the connection goes back to
    the pool; closing it half-read would make every stream open a new TCP connection.
    """

    def __init__(self, backend: str, resp: httpx.Response) -> None:
        self._backend = backend
        self._resp = resp
        self._read = body_reader(resp)
        self._buf = b""  # an incomplete line
        self._data: list[bytes] = []  # the data lines of the event being read
        self._events: list[bytes] = []  # complete event payloads, not yet returned
        self._whole: bytes | None = None  # the last read, when it was just its events
        self._counted = 0  # tokens delivered so far
        self._error: BackendError | None = None  # raised at the next call
        self._eof = False
        self._done = False
        self._clean_end = False  # [DONE] arrived
        self._closed = False

    async def next_batch(self) -> Batch:
        if self._error is not None:
            raise self._error
        while not self._events:
            if self._done:
                return Batch()
            if self._eof:
                self._done = True
                raise BackendError(
                    f"Backend {self._backend!r} closed the stream before [DONE].",
                    code="upstream_truncated",
                )
            try:
                part = await self._read()
            except httpx.HTTPError as exc:
                self._done = True
                raise BackendError(
                    f"Backend {self._backend!r} failed mid-stream ({type(exc).__name__}).",
                    code="upstream_truncated",
                    unhealthy=not isinstance(exc, httpx.TimeoutException),
                ) from exc
            if part:
                self._feed(part)
            else:
                self._eof = True
                self._feed(b"\n\n")  # a last event without its blank line
        events, self._events = self._events, []
        whole = self._whole
        views: list[ChunkView] = []
        for payload in events:
            try:
                view = read_chunk(payload)
            except ValueError as exc:
                if payload.strip() == b"[DONE]":  # decoded first: one failed decode per stream
                    self._done = self._clean_end = True
                    whole = None
                    break
                if isinstance(exc, msgspec.ValidationError):  # not an object, or bad fields
                    failure = self._failure(f"a stream event that is not an OpenAI chunk ({exc})")
                else:
                    failure = self._failure("malformed data in its stream")
            else:
                if view.error is None:
                    views.append(view)
                    continue
                failure = BackendError(  # an OpenAI error event, relayed as it came
                    str(view.error.get("message") or "the backend reported an error"),
                    retryable=False,
                    body=orjson.loads(payload),
                )
            self._done = True
            if not views:
                raise failure
            self._error = failure
            whole = None
            break
        if not views:  # [DONE] alone
            return Batch()
        payloads = events[: len(views)]
        if whole is None:
            # One data line per event: relayed as it came. A payload split over several
            # data lines is JSON, so its line breaks are whitespace between tokens: joined
            # onto one line.
            whole = b"".join(b"data: " + p.replace(b"\n", b"") + b"\n\n" for p in payloads)
        batch = Batch.of(payloads, views, whole, self._counted)
        self._counted += batch.tokens
        return batch

    def _feed(self, part: bytes) -> None:
        """Add ``part`` of the body; complete events go to ``_events``.

        The usual event, one ``data: {...}`` line and a blank line, is cut out by one
        split of the whole read (a read that is just one such event, the commonest under
        load, by one slice); anything else (other fields, comments, several data lines,
        CR line ends) goes through the line parser. ``_whole`` is ``part`` when it was
        nothing but such events, whole.
        """
        if (
            not self._buf
            and not self._data
            and part.startswith(b"data: ")
            and part.find(b"\n") == len(part) - 2
            and part.endswith(b"\n\n")
            and b"\r" not in part
        ):  # the most common read of all: one such event
            self._events.append(part[6:-2])
            self._whole = part
            return
        buf = self._buf + part
        self._whole = None
        if b"\r" in buf or self._data:
            self._buf = self._feed_lines(buf)
            return
        *blocks, rest = buf.split(b"\n\n")
        simple = not self._buf and not rest
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                self._events.append(block[6:])
            else:
                simple = False
                self._feed_lines(block + b"\n\n")
        self._buf = rest
        if simple:
            self._whole = part

    def _feed_lines(self, buf: bytes) -> bytes:
        """Split ``buf`` into lines (LF, CRLF or CR) and events; return the incomplete end."""
        if b"\r" in buf:
            held = b"\r" if buf.endswith(b"\r") else b""  # may be the first half of CRLF
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            *lines, rest = buf.split(b"\n")
            rest += held
        else:
            *lines, rest = buf.split(b"\n")
        data = self._data
        for line in lines:
            if not line:
                if data:
                    self._events.append(b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                data.append(b"")
            # comments (":"), "event:", "id:", "retry:" carry nothing for OpenAI streams
        return rest

    def _failure(self, what: str) -> BackendError:
        return BackendError(f"Backend {self._backend!r} sent {what}.", code="upstream_bad_response")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._clean_end:  # read the rest of the body, so the connection can be reused
            with contextlib.suppress(Exception), anyio.move_on_after(_DRAIN_S):
                left = MAX_ERROR_BODY
                while left >= 0 and (part := await self._read()):
                    left -= len(part)
        await self._resp.aclose()
