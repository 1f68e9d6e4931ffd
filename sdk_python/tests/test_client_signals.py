"""The reader channel of a paced stream: what it sends, when, and what the pacer does.

The channel's constants and the watched-time rule are checked against
``tests/vectors/signals.json``, generated from ``qos`` (scripts/make_signal_vectors.py);
the rules run on a manual clock with a sender that records instead of posting.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from client_support import ManualClock, ScriptedReader, arrivals, chunk, text_of
from tokenpace_client import apace, pace
from tokenpace_client.headers import resolve
from tokenpace_client.qoe import freezes, token_times, watched_times
from tokenpace_client.signals import (
    AWAY_LEASE_S,
    MAX_BUFFER_TOKENS,
    MAX_PACE_TPS,
    MIN_INTERVAL_S,
    PRESENCES,
    ReaderChannel,
)
from tokenpace_client.stream import PacedStream
from tokenpace_client.telemetry import Delivery, TelemetrySender

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "signals.json").read_text()
)


class Recorder:
    """A ``submit`` that keeps (time, body)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, body: dict[str, Any]) -> None:
        self.sent.append((self.clock.now(), body))

    def presences(self) -> list[tuple[float, str]]:
        return [(t, b["presence"]) for t, b in self.sent]


class RecordingSender(TelemetrySender):
    """A sender that keeps what it is given instead of posting it; ``refuse`` answers
    that many deliveries with 429."""

    def __init__(self, refuse: int = 0) -> None:
        super().__init__()
        self.deliveries: list[Delivery] = []
        self.refuse = refuse

    def submit(self, delivery: Delivery) -> bool:
        self.deliveries.append(delivery)
        if self.refuse and delivery.on_refused is not None:
            self.refuse -= 1
            delivery.on_refused(429)
        return True

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(d.body) for d in self.deliveries]


def test_the_channels_timing_and_vocabulary_are_the_gateways():
    constants = VECTORS["constants"]
    assert constants["min_interval_s"] == MIN_INTERVAL_S
    assert constants["away_lease_s"] == AWAY_LEASE_S
    assert constants["max_pace_tps"] == MAX_PACE_TPS
    assert constants["max_buffer_tokens"] == MAX_BUFFER_TOKENS
    assert constants["presences"] == list(PRESENCES)


@pytest.mark.parametrize("vec", VECTORS["freezes"], ids=lambda v: v["name"])
def test_freezes_count_only_while_the_reader_watches(vec):
    timeline = [tuple(p) for p in vec["timeline"]]
    away = [tuple(s) for s in vec["away"]]
    assert watched_times(token_times(timeline), away) == pytest.approx(vec["watched"], rel=1e-9)
    got = freezes(timeline, vec["tds"], away)
    want = vec["freezes"]
    assert got.count == want["count"]
    assert got.longest_s == pytest.approx(want["longest_s"], rel=1e-9, abs=1e-12)
    assert got.total_s == pytest.approx(want["total_s"], rel=1e-9, abs=1e-12)


def test_malformed_away_spans_are_refused():
    with pytest.raises(ValueError, match="away: each span"):
        watched_times([1.0], [(2.0, 1.0)])
    with pytest.raises(ValueError, match="time order"):
        watched_times([1.0], [(0.0, 2.0), (1.0, 3.0)])


def channel(clock: ManualClock, buffer: int = 7) -> tuple[ReaderChannel, Recorder]:
    rec = Recorder(clock)
    return ReaderChannel("req-1", rec, clock, lambda: buffer), rec


def test_a_change_of_presence_goes_at_once_with_the_buffer():
    clock = ManualClock()
    ch, rec = channel(clock)
    ch.set_presence("away")
    ch.set_presence("away")
    ch.set_presence("watching")
    assert rec.sent == [
        (0.0, {"request_id": "req-1", "presence": "away", "buffer_tokens": 7}),
        (0.0, {"request_id": "req-1", "presence": "watching", "buffer_tokens": 7}),
    ]


def test_other_changes_wait_for_the_interval_and_carry_the_newest_state():
    clock = ManualClock()
    ch, rec = channel(clock)
    ch.set_presence("away")
    ch.set_presence("watching")
    ch.set_pace(3.0)
    ch.set_pace(2.5)
    assert ch.due() == MIN_INTERVAL_S
    clock.t = 0.1
    ch.tick()  # not yet
    clock.t = MIN_INTERVAL_S
    ch.tick()
    assert [(t, b["presence"], b.get("pace_tps")) for t, b in rec.sent] == [
        (0.0, "away", None),
        (0.0, "watching", None),
        (MIN_INTERVAL_S, "watching", 2.5),
    ]
    assert ch.due() is None
    clock.t = 1.0
    ch.stalled()  # the interval has passed: at once
    assert rec.sent[-1][0] == 1.0


def test_an_abusive_caller_gets_at_most_one_signal_per_interval():
    clock = ManualClock()
    ch, rec = channel(clock)
    for k in range(200):
        clock.t = k * 0.01
        ch.stalled()
        ch.set_pace(1.0 + k % 2)
        ch.tick()
    times = [t for t, _ in rec.sent]
    assert all(b - a >= MIN_INTERVAL_S - 1e-12 for a, b in itertools.pairwise(times))
    assert len(times) <= math.floor(2.0 / MIN_INTERVAL_S) + 1


def test_a_signal_refused_as_too_soon_goes_again_one_interval_later():
    clock = ManualClock()
    buffer = [3]
    rec = Recorder(clock)
    ch = ReaderChannel("req-1", rec, clock, lambda: buffer[0])
    ch.stalled()
    clock.t = 0.05
    ch.refused()  # the gateway's 429 for it
    buffer[0] = 5
    assert ch.due() == pytest.approx(0.05 + MIN_INTERVAL_S)
    clock.t = 0.05 + MIN_INTERVAL_S
    ch.tick()
    assert [(t, b["buffer_tokens"]) for t, b in rec.sent] == [(0.0, 3), (clock.t, 5)]


def test_away_is_renewed_every_half_lease_and_a_stall_is_not_told_while_away():
    clock = ManualClock()
    ch, rec = channel(clock)
    ch.set_presence("away")
    ch.stalled()
    for t in (4.9, 5.0, 9.0, 10.0, 12.0):
        clock.t = t
        ch.tick()
    ch.set_presence("watching")
    assert ch.due() is None
    assert rec.presences() == [(0.0, "away"), (5.0, "away"), (10.0, "away"), (12.0, "watching")]


def test_left_is_the_last_word():
    clock = ManualClock()
    ch, rec = channel(clock)
    ch.leave()
    ch.set_presence("away")
    ch.leave()
    assert ch.due() is None
    assert rec.presences() == [(0.0, "left")]
    with pytest.raises(ValueError, match="pace"):
        ch.set_pace(0.0)


def stream_with_signals(
    events: list[Any], refuse: int = 0
) -> tuple[PacedStream, RecordingSender, ManualClock]:
    clock = ManualClock()
    response = SimpleNamespace(
        request=SimpleNamespace(url="http://gw/v1/chat/completions", headers=httpx.Headers()),
        headers=httpx.Headers({"X-Request-Id": "req-9", "X-TokenPace-Telemetry-Token": "tok"}),
    )
    sender = RecordingSender(refuse)
    stream = PacedStream(
        ScriptedReader(clock, events),  # type: ignore[arg-type]
        resolve(response.headers, tds=4.0, ttft=1.0, unit="token", end="drain", max_drain_s=None),
        response=response,
        clock=clock,
        sent_at=0.0,
        telemetry=False,
        reader_signals=sender,
    )
    return stream, sender, clock


def test_while_away_nothing_is_released_and_the_reply_resumes_where_it_was():
    tokens = [(0.1 + 0.05 * k, chunk(f" w{k}")) for k in range(20)]
    events = sorted(
        [*arrivals(*tokens, end=9.0), ("presence", 1.2, "away"), ("presence", 8.0, "watching")],
        key=lambda e: e[1],
    )
    stream, sender, clock = stream_with_signals(events)
    shown = [clock.now() for c in stream if text_of(c)]
    assert shown[:5] == pytest.approx([0.1, 0.35, 0.6, 0.85, 1.1])
    # away 1.2-8.0, 0.15 s of the fifth token's reading left: on at 8.15, then at the pace
    assert shown[5:8] == pytest.approx([8.15, 8.4, 8.65])
    assert len(shown) == 20
    assert stream.timeline.away == ((1.2, 8.0),)
    assert stream.qoe.displayed_freezes.count == 0
    assert [d.url for d in sender.deliveries] == ["http://gw/v1/tokenpace/reader"] * 3
    assert sender.deliveries[0].headers == {"X-TokenPace-Telemetry-Token": "tok"}
    # away at 1.2, renewed at 6.2 (half a lease), back at 8.0; no stall: the buffer held
    # tokens until the upstream ended at 9.0
    assert [(b["presence"], b["buffer_tokens"]) for b in sender.bodies()] == [
        ("away", 15),
        ("away", 15),
        ("watching", 15),
    ]


def test_a_stall_is_told_once_the_reader_has_read_what_was_shown():
    events = arrivals((0.1, chunk("a")), (0.2, chunk(" b")), (3.0, chunk(" c")), end=3.1)
    stream, sender, _clock = stream_with_signals(events)
    assert [text_of(c) for c in stream] == ["a", " b", " c"]
    assert [(b["presence"], b["buffer_tokens"]) for b in sender.bodies()] == [("watching", 0)]


def test_a_stall_refused_as_too_soon_is_told_again_by_the_token_loop():
    events = arrivals((0.1, chunk("a")), (0.2, chunk(" b")), (3.0, chunk(" c")), end=3.1)
    stream, sender, _ = stream_with_signals(events, refuse=1)
    assert [text_of(c) for c in stream] == ["a", " b", " c"]
    # refused at 0.6 (the reader stalled), told again an interval later: still stalled
    assert [(b["presence"], b["buffer_tokens"]) for b in sender.bodies()] == [("watching", 0)] * 2


def test_closing_the_stream_before_its_end_says_left():
    events = arrivals((0.1, chunk("a")), (0.2, chunk(" b")), end=5.0)
    stream, sender, _ = stream_with_signals(events)
    next(iter(stream))
    stream.close()
    assert [b["presence"] for b in sender.bodies()] == ["left"]
    stream.set_pace(None)  # the stream is over: nothing more is sent
    assert len(sender.deliveries) == 1


def _slow_chunks(n: int, gap_s: float):
    for k in range(n):
        time.sleep(gap_s)
        yield chunk(f" w{k}")


def test_presence_set_from_another_thread_stops_and_resumes_a_real_token_loop():
    stream = pace(_slow_chunks(12, 0.01), tds=20.0, telemetry=False)
    shown: list[float] = []
    threading.Timer(0.2, stream.set_presence, args=("away",)).start()
    threading.Timer(0.8, stream.set_presence, args=("watching",)).start()
    start = time.monotonic()
    for c in stream:
        if text_of(c):
            shown.append(time.monotonic() - start)
    assert len(shown) == 12
    # at 20 tokens/s about 4 tokens by 0.2 s; none while away; the rest from about 0.8 s
    assert not [t for t in shown if 0.25 < t < 0.78]
    assert shown[-1] > 0.8
    (away,) = stream.timeline.away
    assert away[1] - away[0] == pytest.approx(0.6, abs=0.15)


async def _aslow_chunks(n: int, gap_s: float):
    for k in range(n):
        await asyncio.sleep(gap_s)
        yield chunk(f" w{k}")


def test_presence_set_from_another_thread_reaches_an_async_token_loop():
    async def main() -> tuple[list[float], Any]:
        stream = apace(_aslow_chunks(12, 0.01), tds=20.0, telemetry=False)
        shown: list[float] = []
        threading.Timer(0.2, stream.set_presence, args=("away",)).start()
        threading.Timer(0.8, stream.set_presence, args=("watching",)).start()
        start = time.monotonic()
        async for c in stream:
            if text_of(c):
                shown.append(time.monotonic() - start)
        return shown, stream.timeline

    shown, timeline = asyncio.run(main())
    assert len(shown) == 12
    assert not [t for t in shown if 0.25 < t < 0.78]
    assert len(timeline.away) == 1
