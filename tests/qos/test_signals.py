"""Reader signals: the client's JSON, the channel's bytes and what the table records."""

from __future__ import annotations

import pytest

from qos.policy.table import NO_TOKEN, RequestTable
from qos.signals import (
    AWAY_LEASE_S,
    Presence,
    ReaderSignal,
    channel,
    decode_wire,
    encode_wire,
)


def test_json_round_trip_and_wire_round_trip() -> None:
    signal = ReaderSignal(Presence.AWAY, pace_tps=2.5, buffer_tokens=12)
    assert ReaderSignal.from_json(signal.to_json()) == signal
    assert decode_wire(encode_wire("abc", signal)) == ("abc", signal)
    assert ReaderSignal.from_json({"presence": "watching"}).to_json() == {"presence": "watching"}
    assert channel("tokenpace") == "tokenpace:reader"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "presence"),
        ({"presence": "asleep"}, "presence"),
        ({"presence": "away", "pace_tps": 0}, "pace_tps"),
        ({"presence": "away", "pace_tps": "fast"}, "pace_tps"),
        ({"presence": "away", "pace_tps": True}, "pace_tps"),
        ({"presence": "away", "pace_tps": float("nan")}, "pace_tps"),
        ({"presence": "away", "buffer_tokens": -1}, "buffer_tokens"),
        ({"presence": "away", "buffer_tokens": 1.5}, "buffer_tokens"),
        ({"presence": "away", "buffer_tokens": 10**9}, "buffer_tokens"),
    ],
)
def test_a_bad_field_is_named(body: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ReaderSignal.from_json(body)


@pytest.mark.parametrize(
    "message", [b"not json", b"[1]", b'{"presence": "away"}', b'{"request_id": 3}', b"\xff"]
)
def test_a_malformed_wire_message_is_refused(message: bytes) -> None:
    with pytest.raises(ValueError):
        decode_wire(message)


def test_the_table_records_presence_pace_and_buffer() -> None:
    table = RequestTable()
    r = table.add("a", arrival=0.0, prompt_tokens=10, ttft=1.0, tds=4.8)
    table.record_tokens(r, 1.0, 3)
    assert not table.reader_signal("gone", ReaderSignal(Presence.AWAY), 2.0)

    assert table.reader_signal("a", ReaderSignal(Presence.AWAY, buffer_tokens=2), 2.0)
    assert table.col("away_until")[r] == 2.0 + AWAY_LEASE_S
    assert table.col("stated_buffer")[r] == 2 and table.col("stated_at")[r] == 2.0
    assert table.col("stated_output")[r] == 3

    table.reader_signal("a", ReaderSignal(Presence.WATCHING, pace_tps=30.0), 3.0)
    assert table.col("away_until")[r] == NO_TOKEN
    assert table.col("reader_pace")[r] == 4.8  # never above the tier's pace
    assert table.col("stated_buffer")[r] == 2  # not restated: the last word stands
    table.reader_signal("a", ReaderSignal(Presence.WATCHING, pace_tps=2.0), 3.5)
    assert table.col("reader_pace")[r] == 2.0
