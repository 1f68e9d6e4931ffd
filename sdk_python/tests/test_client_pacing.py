"""Release times of the paced stream on a manual clock: exact, against the digestion schedule.

Token k goes out at max(arrival_k, release_(k-1) + 1/TDS) (Andes (Liu et al.) §3.1,
docs/qoe.md recursion D); the first token the moment it arrives; a slow server adds no
delay. The scripted reader stands in for the reader thread or task (client_support).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from client_support import apaced, arrivals, chunk, drain, paced, text_of
from tokenpace_client import TDS_RANGE, TTFT_RANGE, pace
from tokenpace_client.headers import resolve
from tokenpace_client.qoe import digestion_starts, token_times
from tokenpace_client.timeline import ceil_us

TDS = 4.8


def test_server_ahead_releases_at_tds_and_the_first_token_at_once():
    toks = [(0.5 + 0.001 * k, chunk(f" w{k}")) for k in range(10)]
    stream, _, clock = paced(arrivals((0.5, chunk("")), *toks, end=0.52))
    out = drain(stream, clock)
    assert out[0] == (0.5, "")  # the role chunk, as it arrived
    released = [t for t, text in out if text]
    assert released[0] == 0.5  # the first token is never delayed
    assert released == pytest.approx([0.5 + k / TDS for k in range(10)], abs=1e-12)
    assert [text for _, text in out[1:]] == [f" w{k}" for k in range(10)]
    assert stream.outcome == "completed"
    assert stream.timeline.displayed == tuple((ceil_us(t), 1) for t in released)


def test_burst_after_a_pause_is_released_at_tds_not_dumped():
    items = [(0.3, chunk("a")), (0.5, chunk(" b")), *[(3.0, chunk(f" c{k}")) for k in range(30)]]
    stream, _, clock = paced(arrivals(*items, end=3.0))
    released = [t for t, _ in drain(stream, clock)]
    ideal = digestion_starts([t for t, _ in items], TDS)
    assert released == pytest.approx(ideal, abs=1e-12)
    burst = released[2:]
    assert burst[0] == 3.0 and burst[-1] == pytest.approx(3.0 + 29 / TDS)
    assert all(b - a == pytest.approx(1 / TDS) for a, b in itertools.pairwise(burst))


def test_a_server_slower_than_tds_adds_no_delay():
    items = [(1.0 + 0.5 * k, chunk(f" t{k}")) for k in range(8)]  # 2 tokens/s < 4.8
    stream, _, clock = paced(arrivals(*items, end=5.0))
    assert [t for t, _ in drain(stream, clock)] == [t for t, _ in items]
    assert stream.qoe.displayed_andes == pytest.approx(stream.qoe.andes)


def test_the_stream_sleeps_until_the_next_release_or_arrival():
    items = [(0.2, chunk(f" t{k}")) for k in range(20)]
    stream, reader, clock = paced(arrivals(*items, end=0.2))
    out = drain(stream, clock)
    assert len(out) == 20
    # one wait per arrival or release, each until the next release: no polling
    assert len(reader.waits) <= 2 * len(items) + 2
    assert all(w is None or w >= 0.2 for w in reader.waits)


def test_end_flush_releases_the_rest_when_the_upstream_ends():
    items = [(0.1, chunk(f" t{k}")) for k in range(10)]
    stream, _, clock = paced(arrivals(*items, end=0.3), end="flush")
    out = drain(stream, clock)
    released = [t for t, _ in out]
    before = [0.1 + k / TDS for k in range(10) if 0.1 + k / TDS <= 0.3]
    assert released[: len(before)] == pytest.approx(before)
    assert released[len(before) :] == [0.3] * (10 - len(before))


def test_the_drain_ends_max_drain_s_after_the_upstream():
    """A slow reader's pace keeps going after the upstream ended, but not for ever."""
    items = [(0.1, chunk(f" t{k}")) for k in range(3)]
    stream, _, clock = paced(arrivals(*items, end=0.2), tds=0.1, max_drain_s=5.0)
    assert [t for t, _ in drain(stream, clock)] == [0.1, 5.2, 5.2]  # 10.1 and 20.1 paced
    stream, _, clock = paced(arrivals(*items, end=0.2), tds=0.1, max_drain_s=None)
    assert [t for t, _ in drain(stream, clock)] == pytest.approx([0.1, 10.1, 20.1])


@pytest.mark.parametrize(
    ("headers", "tds", "ttft"),
    [
        ({"X-TokenPace-TDS": "0.0001", "X-TokenPace-TTFT": "1e9"}, 0.1, 600.0),
        ({"X-TokenPace-TDS": "1e12", "X-TokenPace-TTFT": "-3"}, 1000.0, 0.0),
        ({"X-TokenPace-TDS": "nan", "X-TokenPace-TTFT": "soon"}, 4.8, 1.0),  # the chat tier
        ({"X-TokenPace-TDS": "25", "X-TokenPace-TTFT": "0.5"}, 25.0, 0.5),
    ],
)
def test_the_servers_pacing_headers_are_bounded(headers, tds, ttft):
    settings = resolve(headers, tds=None, ttft=None, unit="token", end="drain")
    assert (settings.tds, settings.ttft) == (tds, ttft)
    assert (TDS_RANGE, TTFT_RANGE) == ((0.1, 1000.0), (0.0, 600.0))


def test_upstream_error_is_raised_after_what_arrived_is_released():
    stream, _, clock = paced(
        [("chunk", 0.1, chunk("a")), ("chunk", 0.1, chunk(" b")), ("error", 0.15, OSError("gone"))]
    )
    got = []
    with pytest.raises(OSError, match="gone"):
        for c in stream:
            got.append((clock.now(), text_of(c)))
    assert got == [(0.1, "a"), (pytest.approx(0.1 + 1 / TDS), " b")]
    assert stream.outcome == "error" and stream.timeline.displayed[-1][1] == 1


def test_a_chunk_of_several_tokens_is_released_in_pieces():
    # a running usage.completion_tokens says the second chunk carries 3 tokens
    items = [(0.1, chunk("One", usage=1)), (0.1, chunk(" two three four", usage=4))]
    stream, _, clock = paced(arrivals(*items, end=0.1))
    out = drain(stream, clock)
    assert [text for _, text in out] == ["One", " two", " three", " four"]
    assert [t for t, _ in out] == pytest.approx([0.1 + k / TDS for k in range(4)])
    assert stream.timeline.arrivals == ((0.1, 1), (0.1, 3))
    assert sum(n for _, n in stream.timeline.displayed) == 4


def test_word_unit_releases_whole_words_each_taking_its_tokens():
    parts = ["Hel", "lo", " wor", "ld", " again", "!"]
    items = [(0.1 * (k + 1), chunk(p)) for k, p in enumerate(parts)]
    stream, _, clock = paced(arrivals(*items, end=0.7), unit="word")
    out = drain(stream, clock)
    assert [text for _, text in out] == ["Hello", " world", " again!"]
    # "Hello" is complete when " wor" arrives (0.3); 2 tokens take 2/TDS to read
    assert [t for t, _ in out] == pytest.approx([0.3, 0.3 + 2 / TDS, 0.3 + 4 / TDS])
    assert [n for _, n in stream.timeline.displayed] == [2, 2, 2]


def test_sentence_unit_waits_for_completion_and_the_previous_speaking_time():
    parts = ["Hi", " there.", " How", " are", " you?", " Fine"]
    items = [(0.1 * (k + 1), chunk(p)) for k, p in enumerate(parts)]
    stream, _, clock = paced(arrivals(*items, end=0.7), unit="sentence", tds=3.3)
    out = drain(stream, clock)
    assert [text for _, text in out] == ["Hi there.", " How are you?", " Fine"]
    first = 0.3  # complete when the whitespace after "there." arrives
    second = max(0.6, first + 2 / 3.3)  # complete at 0.6, after 2 tokens of speaking time
    third = max(0.7, second + 3 / 3.3)
    assert [t for t, _ in out] == pytest.approx([first, second, third])


def test_non_text_chunks_keep_their_order_and_flush_pending_text():
    items = [(0.1, chunk("")), (0.1, chunk("Hi")), (0.2, chunk(" yo")), (0.3, chunk(finish="stop"))]
    stream, _, clock = paced(arrivals(*items, end=0.3), unit="word")
    out = drain(stream, clock)
    assert [text for _, text in out] == ["", "Hi", " yo", ""]
    assert out[-1][0] == out[-2][0]  # the finish chunk takes no reading time


def test_close_stops_the_reader_and_records_an_abort():
    items = [(0.1, chunk(f" t{k}")) for k in range(10)]
    stream, reader, clock = paced(arrivals(*items))
    with stream:
        for _ in stream:
            if clock.now() > 0.5:
                break
    assert reader.stopped and stream.outcome == "aborted"
    assert 0 < sum(n for _, n in stream.timeline.displayed) < 10
    assert list(stream) == []


def test_async_stream_releases_on_the_same_schedule():
    items = [(0.5, chunk(f" t{k}")) for k in range(6)]

    async def run():
        stream, _, clock = apaced(arrivals(*items, end=0.5))
        return [clock.now() async for _ in stream], stream

    released, stream = asyncio.run(run())
    assert released == pytest.approx([0.5 + k / TDS for k in range(6)])
    assert stream.outcome == "completed"
    assert stream.qoe.displayed_monotone == pytest.approx(stream.qoe.monotone)


def test_timelines_and_qoe_match_the_formulas():
    items = [(1.2, chunk("a")), (1.2, chunk(" b")), (2.5, chunk(" c"))]
    stream, _, clock = paced(arrivals(*items, end=2.5))
    released = [t for t, _ in drain(stream, clock)]
    assert token_times(stream.timeline.arrivals) == [1.2, 1.2, 2.5]
    assert token_times(stream.timeline.displayed) == pytest.approx(released)


def test_the_qoe_carries_the_freezes_and_idle_latency_of_both_timelines():
    # two tokens, a pause, two more: one freeze of 3.0 - (1.0 + 2/TDS), seen on both
    items = [(1.0, chunk("a")), (1.0, chunk(" b")), (3.0, chunk(" c")), (3.0, chunk(" d"))]
    stream, _, clock = paced(arrivals(*items, end=3.0), ttft=1.0)
    drain(stream, clock)
    qoe = stream.qoe
    frozen = 3.0 - (1.0 + 2 / TDS)
    for freezes in (qoe.freezes, qoe.displayed_freezes):
        assert freezes.count == 1
        assert freezes.longest_s == pytest.approx(frozen, abs=2e-6)  # timelines in µs
        assert freezes.total_s == freezes.longest_s
    # Wang et al. Eq. 9: token 3 (deadline 1 + 2/TDS) arrived at 3.0
    assert qoe.idle_s == pytest.approx(frozen, abs=2e-6)
    assert qoe.displayed_idle_s == pytest.approx(frozen, abs=2e-6)


def test_a_reply_on_pace_has_no_freezes_and_nothing_shown_has_none_measured():
    items = [(0.5 + k / TDS, chunk(f" t{k}")) for k in range(6)]
    stream, _, clock = paced(arrivals(*items, end=2.0), ttft=1.0)
    drain(stream, clock)
    assert stream.qoe.freezes.count == 0 and stream.qoe.displayed_freezes.longest_s == 0.0
    assert stream.qoe.idle_s == 0.0  # every token before its deadline

    stream, _, clock = paced(arrivals((0.4, chunk("")), end=0.5))  # no token at all
    drain(stream, clock)
    assert stream.qoe.freezes is None and stream.qoe.displayed_idle_s is None
    assert stream.qoe.andes == 0.0


# -- arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"tds": 0}, "tds"),
        ({"tds": -4.8}, "tds"),
        ({"tds": float("nan")}, "tds"),
        ({"ttft": -1}, "ttft"),
        ({"unit": "syllable"}, "unit"),
        ({"end": "never"}, "end"),
        ({"max_drain_s": -1}, "max_drain_s"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        pace([chunk("a")], telemetry=False, **kwargs)


def test_a_stream_that_is_not_iterable_is_a_type_error():
    with pytest.raises(TypeError, match=r"^stream:"):
        pace(42)


def test_plain_iterables_of_dicts_are_paced_in_real_time():
    stream = pace([chunk("a"), chunk(" b"), chunk(" c")], tds=1000.0, telemetry=False)
    assert [text_of(c) for c in stream] == ["a", " b", " c"]
    assert stream.tier == "custom" and stream.tds == 1000.0 and stream.ttft == 1.0
    assert stream.request_id is None
