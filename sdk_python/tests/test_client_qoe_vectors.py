"""The client's formulas give the values of ``qos.metrics`` on every shared test vector.

``tests/vectors/qoe.json`` is generated from ``qos.metrics`` (scripts/make_qoe_vectors.py)
and tied to it by the server's tests; this suite checks the client's pure-Python copy
(``tokenpace_client.qoe``) and its release schedule against the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenpace_client.qoe import (
    Freezes,
    andes_qoe,
    digestion_starts,
    freezes,
    monotone_qoe,
    token_times,
    user_idle_latency,
)
from tokenpace_client.schedule import ReleaseSchedule

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "qoe.json").read_text()
)["vectors"]


def test_there_are_vectors():
    assert len(VECTORS) >= 30


@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: v["name"])
def test_formulas_match_the_vectors(vec):
    timeline = [tuple(p) for p in vec["timeline"]]
    ttft, tds = vec["ttft"], vec["tds"]
    assert andes_qoe(timeline, ttft, tds) == pytest.approx(vec["andes"], rel=1e-9, abs=1e-12)
    assert monotone_qoe(timeline, ttft, tds) == pytest.approx(vec["monotone"], rel=1e-9)
    starts = digestion_starts(token_times(timeline), tds)
    assert starts == pytest.approx(vec["digestion"], rel=1e-9, abs=1e-12)
    frozen = freezes(timeline, tds)
    assert isinstance(frozen, Freezes)
    assert frozen.count == vec["freezes"]["count"]
    assert frozen.longest_s == pytest.approx(vec["freezes"]["longest_s"], rel=1e-9, abs=1e-12)
    assert frozen.total_s == pytest.approx(vec["freezes"]["total_s"], rel=1e-9, abs=1e-12)
    assert user_idle_latency(timeline, ttft, tds) == pytest.approx(vec["idle"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: v["name"])
def test_release_schedule_is_the_digestion_schedule(vec):
    schedule = ReleaseSchedule(vec["tds"])
    released = [
        schedule.release_time(t, 1) for t, n in vec["timeline"] for _ in range(n)
    ]  # token unit: a chunk of n tokens is n pieces
    assert released == pytest.approx(vec["digestion"], rel=1e-9, abs=1e-12)


def test_the_vectors_hold_freezes_and_replies_that_never_froze():
    counts = [vec["freezes"]["count"] for vec in VECTORS]
    assert any(counts) and not all(counts)  # both kinds, so neither branch goes untested


def test_bad_timelines_and_expectations_name_what_is_wrong():
    with pytest.raises(ValueError, match="empty"):
        andes_qoe([], 1.0, 4.8)
    with pytest.raises(ValueError, match="non-decreasing"):
        andes_qoe([(2.0, 1), (1.0, 1)], 1.0, 4.8)
    with pytest.raises(ValueError, match="positive integers"):
        monotone_qoe([(1.0, 0)], 1.0, 4.8)
    with pytest.raises(ValueError, match="tds"):
        andes_qoe([(1.0, 1)], 1.0, 0.0)
    with pytest.raises(ValueError, match="ttft"):
        monotone_qoe([(1.0, 1)], -1.0, 4.8)
    with pytest.raises(ValueError, match="tds"):
        freezes([(1.0, 1)], 0.0)
    with pytest.raises(ValueError, match="empty"):
        user_idle_latency([], 1.0, 4.8)
