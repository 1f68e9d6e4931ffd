"""Test helpers for the client's unit tests: a manual clock and a scripted reader.

The scripted reader stands in for the reader thread or task: it hands the paced stream
scripted arrivals and moves the manual clock to each one, or to the deadline the stream
waits for, so release times are exact.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tokenpace_client.headers import resolve
from tokenpace_client.reader import Event
from tokenpace_client.stream import AsyncPacedStream, PacedStream


class ManualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class ScriptedReader:
    """Events ``(kind, at, payload)`` in time order; ``waits`` records every deadline asked."""

    def __init__(self, clock: ManualClock, events: list[Event]) -> None:
        self.clock = clock
        self.events = deque(events)
        self.waits: list[float | None] = []
        self.stopped = False

    def get(self, deadline: float | None, chunk_wakes: bool = True) -> Event | None:
        self.waits.append(deadline)
        if self.events and (deadline is None or self.events[0][1] <= deadline):
            event = self.events.popleft()
            self.clock.t = max(self.clock.t, event[1])
            return event
        assert deadline is not None, "the stream would wait forever"
        self.clock.t = max(self.clock.t, deadline)
        return None

    def post(self, event: Event) -> None:
        """An event posted now: it comes before the scripted ones still to come."""
        self.events.appendleft(event)

    def stop(self, wait_s: float) -> None:
        self.stopped = True


class AsyncScriptedReader(ScriptedReader):
    async def get(self, deadline: float | None, chunk_wakes: bool = False) -> Event | None:  # type: ignore[override]
        return ScriptedReader.get(self, deadline)

    def cancel(self) -> None:
        self.stopped = True

    async def stop(self) -> None:  # type: ignore[override]
        self.stopped = True


def chunk(text: str | None = None, *, finish: str | None = None, usage: int | None = None) -> dict:
    """An OpenAI chat-completion chunk as a dict."""
    delta = {} if text is None else {"content": text}
    out: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = {"prompt_tokens": 1, "completion_tokens": usage, "total_tokens": usage + 1}
    return out


def arrivals(*items: tuple[float, dict], end: float | None = None) -> list[Event]:
    events: list[Event] = [("chunk", t, c) for t, c in items]
    if end is not None:
        events.append(("end", end, None))
    return events


def paced(events: list[Event], **options: Any) -> tuple[PacedStream, ScriptedReader, ManualClock]:
    clock = ManualClock()
    reader = ScriptedReader(clock, events)
    settings = resolve(
        {},
        tds=options.pop("tds", 4.8),
        ttft=options.pop("ttft", 1.0),
        unit=options.pop("unit", "token"),
        end=options.pop("end", "drain"),
        max_drain_s=options.pop("max_drain_s", None),
    )
    stream = PacedStream(
        reader,  # type: ignore[arg-type]
        settings,
        response=None,
        clock=clock,
        sent_at=0.0,
        telemetry=False,
        on_queued=options.pop("on_queued", None),
    )
    return stream, reader, clock


def apaced(
    events: list[Event], **options: Any
) -> tuple[AsyncPacedStream, AsyncScriptedReader, ManualClock]:
    clock = ManualClock()
    reader = AsyncScriptedReader(clock, events)
    settings = resolve(
        {},
        tds=options.pop("tds", 4.8),
        ttft=options.pop("ttft", 1.0),
        unit=options.pop("unit", "token"),
        end=options.pop("end", "drain"),
        max_drain_s=options.pop("max_drain_s", None),
    )
    stream = AsyncPacedStream(
        lambda: reader, settings, response=None, clock=clock, sent_at=0.0, telemetry=False
    )  # type: ignore[arg-type]
    return stream, reader, clock


def text_of(c: Any) -> str:
    choice = c["choices"][0] if c["choices"] else {}
    return (choice.get("delta") or {}).get("content") or ""


def drain(stream: PacedStream, clock: ManualClock) -> list[tuple[float, str]]:
    """(release time, text) of every chunk the stream yields."""
    return [(clock.now(), text_of(c)) for c in stream]
