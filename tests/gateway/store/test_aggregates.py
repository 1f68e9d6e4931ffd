"""The QoE aggregates' arithmetic: bucket plans cover a window exactly, estimates stay
within a bin of the exact statistics, and the reader summary agrees with
:func:`qos.metrics.reader_summary` (one definition of the shares and the longest freeze)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.store import QoERecord, aggregates
from gateway.store.aggregates import LEVELS, kept, plan
from qos.metrics import reader_summary

RETENTION = 7 * 86400


def covered(buckets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(start, start + LEVELS[level].size_s) for level, start in buckets]


@settings(max_examples=300, deadline=None)
@given(
    now=st.floats(1.7e9, 1.8e9),
    window=st.floats(1.0, RETENTION),
)
def test_a_plan_covers_the_window_once_with_few_buckets(now: float, window: float) -> None:
    buckets = plan(now, window, RETENTION)
    spans = covered(buckets)
    # contiguous, no overlap, from at or before the window's start to the current bucket
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert spans[0][0] <= now - window
    assert spans[-1][0] <= now < spans[-1][1]
    # the start is at most one bucket early, of the finest level that still keeps it
    for level, lvl in enumerate(LEVELS):
        aligned = math.floor(now - window) // lvl.size_s * lvl.size_s
        if kept(level, aligned, now, RETENTION):
            break
    assert spans[0][0] == aligned and now - window - aligned < lvl.size_s
    # every bucket is still kept
    assert all(kept(lvl, start, now, RETENTION) for lvl, start in buckets)
    # 10 s buckets at the ends, 5 min ones, then hours: bounded, whatever the traffic
    assert len(buckets) <= 84 + max(0.0, window - 7200) / 3600 + 1


def test_a_short_window_is_read_at_10_s_and_a_week_mostly_in_hours() -> None:
    now = 1_750_000_003.5
    assert covered(plan(now, 30, RETENTION)) == [
        (1_749_999_970, 1_749_999_980),
        (1_749_999_980, 1_749_999_990),
        (1_749_999_990, 1_750_000_000),
        (1_750_000_000, 1_750_000_010),
    ]
    week = plan(now, RETENTION, RETENTION)
    assert sum(1 for level, _ in week if level == 2) >= 160
    assert len(week) < 220


def records(andes: list[float], longest: list[float], idle: list[float]) -> list[QoERecord]:
    return [
        QoERecord(f"r{i}", "t", "chat", "client", a, a, "completed", a, a, 0.0, f, int(f > 0), d)
        for i, (a, f, d) in enumerate(zip(andes, longest, idle, strict=True))
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.just(1.0), st.floats(0, 1)),
            st.one_of(st.just(0.0), st.floats(0, 600)),
            st.one_of(st.just(0.0), st.floats(0, 3600)),
        ),
        min_size=1,
        max_size=200,
    )
)
def test_estimates_stay_within_a_bin_and_exact_numbers_are_exact(rows) -> None:
    andes, longest, idle = (list(x) for x in zip(*rows, strict=True))
    sums, maxima = aggregates.contributions(records(andes, longest, idle))["t"]
    acc: dict = {}
    aggregates.merge_into(acc, "t", {**sums, **maxima})
    g = acc[("t", "chat", "client")]
    stats = aggregates.qoe_stats(g, "andes")
    assert stats is not None
    assert stats["mean"] == pytest.approx(np.mean(andes))
    for q in (50, 90, 99):
        # the histogram's quantile and numpy's are both within the quantile's bin
        exact = float(np.percentile(andes, q, method="inverted_cdf"))
        assert abs(stats[f"p{q}"] - exact) <= 1 / aggregates.QOE_BINS + 1e-9
    got = aggregates.reader_summary(g)
    want = reader_summary(longest, idle)
    assert got is not None
    assert got.replies == want.replies
    assert got.frozen_share == pytest.approx(want.frozen_share)
    assert got.longest_freeze_s == pytest.approx(want.longest_freeze_s)
    assert (got.median_freeze_s is None) == (want.median_freeze_s is None)
    for q, mine in ((50, got.idle_p50_s), (99, got.idle_p99_s)):
        # in the exact quantile's bin: a quarter power of two wide, the lowest 2^-6.75 s
        exact = float(np.percentile(idle, q, method="inverted_cdf"))
        assert abs(mine - exact) <= exact * (2**0.25 - 1) + 2**-6.75


def test_groups_combine_by_sum_and_by_max() -> None:
    a = {"n": 2.0, "xf": 3.0, "f2": 1.0}
    b = {"n": 1.0, "xf": 9.0}
    assert aggregates.combine([a, b]) == {"n": 3.0, "xf": 9.0, "f2": 1.0}


def test_a_record_out_of_range_cannot_be_made() -> None:
    for bad in (
        {"andes": float("nan")},
        {"monotone": 1.5},
        {"longest_freeze_s": float("inf")},
        {"idle_s": -1.0},
        {"freezes": -2},
        {"side": "server"},
    ):
        fields = {
            "request_id": "r",
            "tenant": "t",
            "tier": "chat",
            "side": "client",
            "andes": 0.5,
            "monotone": 0.5,
            "outcome": "completed",
            **bad,
        }
        with pytest.raises(ValueError, match="QoE record"):
            QoERecord(**fields)
