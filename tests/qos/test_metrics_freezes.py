"""Freezes and the reader summary (qos.metrics): what the reader sees stop."""

from __future__ import annotations

import numpy as np
import pytest

from qos.metrics import (
    FREEZE_THRESHOLDS_S,
    Freezes,
    ReplyQoE,
    andes_qoe,
    freezes,
    monotone_qoe,
    reader_summary,
    replies_qoe,
    reply_qoe,
    user_idle_latency,
    watched_times,
)


def test_a_reply_faster_than_its_reader_never_freezes():
    assert freezes([(1.0, 10), (1.1, 10), (1.2, 30)], 4.8) == Freezes(0.0, 0, 0.0)


def test_the_wait_for_the_first_token_is_not_a_freeze():
    assert freezes([(30.0, 1), (30.1, 5)], 5.0).count == 0


def test_a_pause_counts_only_once_the_buffer_is_read():
    # 20 tokens at 1 s are read by 5 s; the next arrives at 8 s: 3 s frozen; 5 more are
    # read until 9 s, the last arrives at 12 s: 3 s more
    got = freezes([(1.0, 20), (8.0, 5), (12.0, 1)], 5.0)
    assert got.count == 2
    assert got.longest_s == pytest.approx(3.0)
    assert got.total_s == pytest.approx(6.0)


def test_eq1_barely_charges_a_late_freeze_the_reader_summary_does():
    on_time = [1.0 + k / 5.0 for k in range(300)]
    late_freeze = [*on_time[:290], *(t + 120.0 for t in on_time[290:])]
    assert andes_qoe(late_freeze, 1.0, 5.0) > 0.95  # two minutes stopped: 0.97
    assert freezes(late_freeze, 5.0).longest_s == pytest.approx(120.0)


def test_reader_summary_shares_percentiles_and_median_freeze():
    longest = [0.0] * 90 + [1.0] * 5 + [3.0] * 3 + [12.0, 40.0]
    idle = [float(i) for i in range(100)]
    summary = reader_summary(longest, idle)
    assert summary.replies == 100
    assert summary.frozen_share == {2.0: 0.05, 5.0: 0.02, 10.0: 0.02}
    assert set(summary.frozen_share) == set(FREEZE_THRESHOLDS_S)
    assert summary.longest_freeze_s == 40.0
    assert summary.median_freeze_s == 2.0  # of 1, 1, 1, 1, 1, 3, 3, 3, 12, 40
    assert summary.idle_p50_s == pytest.approx(49.5)
    assert summary.idle_p99_s == pytest.approx(98.01)
    flat = summary.as_dict()
    assert flat["frozen_over_2s"] == 0.05 and flat["frozen_over_10s"] == 0.02
    assert reader_summary([0.0], [0.0]).median_freeze_s is None


def test_reader_summary_bad_input():
    with pytest.raises(ValueError, match="no replies"):
        reader_summary([], [])
    with pytest.raises(ValueError, match="lengths must match"):
        reader_summary([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="expected_tds"):
        freezes([(1.0, 1)], 0.0)


@pytest.mark.parametrize(
    ("timeline", "ttft", "tds"),
    [
        ([(0.2, 1), (0.25, 3), (1.9, 2), (2.0, 40)], 0.5, 10.0),  # early, then a stall
        ([(3.0, 5), (3.1, 5)], 1.0, 4.0),  # late first token
        ([(0.1, 1)], 0.0, 20.0),  # one token
        ([0.4 + k / 8.0 for k in range(50)], 1.0, 5.0),  # per-token, ahead of the reader
    ],
)
def test_reply_qoe_is_the_four_measures_at_once(timeline, ttft, tds):
    got = reply_qoe(timeline, ttft, tds)
    assert got == ReplyQoE(
        andes_qoe(timeline, ttft, tds),
        monotone_qoe(timeline, ttft, tds),
        freezes(timeline, tds),
        user_idle_latency(timeline, ttft, tds),
    )


@pytest.mark.parametrize(
    ("timeline", "ttft", "tds"),
    [
        ([], 1.0, 5.0),
        ([(1.0, 2), (0.5, 1)], 1.0, 5.0),
        ([(1.0, 2)], -1.0, 5.0),
        ([(1.0, 2)], 1.0, 0.0),
    ],
)
def test_reply_qoe_refuses_what_the_measures_refuse(timeline, ttft, tds):
    with pytest.raises(ValueError):
        reply_qoe(timeline, ttft, tds)


def test_a_gap_while_the_reader_is_away_is_not_a_freeze():
    # 5 tokens/s; nothing comes from 2 s to 12 s, while the reader is away from 1.5 s to 12 s
    timeline = [(1.0, 3), (12.0, 5)]
    assert freezes(timeline, 5.0).longest_s == pytest.approx(12.0 - 1.0 - 3 / 5.0)
    assert freezes(timeline, 5.0, away=[(1.5, 12.0)]) == Freezes(0.0, 0, 0.0)
    # back at 8 s: the 4 s watched before the next token, less the 0.1 s of buffer left
    got = freezes(timeline, 5.0, away=[(1.5, 8.0)])
    assert got.longest_s == pytest.approx(4.0 - 0.1)


def test_watched_times_take_out_the_time_away():
    times = np.array([0.5, 2.0, 3.5, 9.0])
    got = watched_times(times, [(1.0, 3.0), (4.0, 6.0)])
    # 2.0 arrives while away: there when the reader comes back (watched 1.0)
    assert got.tolist() == pytest.approx([0.5, 1.0, 1.5, 5.0])
    with pytest.raises(ValueError, match="overlap"):
        watched_times(times, [(1.0, 3.0), (2.0, 4.0)])
    with pytest.raises(ValueError, match="end >= start"):
        watched_times(times, [(3.0, 1.0)])


def _random_reply(rng: np.random.Generator, n: int) -> tuple[np.ndarray, float, float]:
    """Per-token times with bursts, stalls and ties; a TTFT and TDS around them."""
    steps = rng.choice([0.0, 0.01, 0.05, 0.3, 2.0], size=n, p=[0.3, 0.3, 0.2, 0.15, 0.05])
    times = rng.uniform(0.0, 3.0) + np.cumsum(steps)
    return times, float(rng.choice([0.0, 0.5, 2.0])), float(rng.choice([3.0, 5.0, 20.0]))


def test_replies_qoe_is_reply_qoe_of_each_reply_to_the_last_bit():
    rng = np.random.default_rng(7)
    # lengths past numpy's summation blocks (8, 128), and many replies of one length
    sizes = [1, 1, 1, 2, 7, 8, 9, 9, 9, 50, 127, 128, 129, 300, 1, 2, 300, 1000]
    replies = [_random_reply(rng, n) for n in sizes]
    got = replies_qoe(
        np.concatenate([times for times, _, _ in replies]),
        sizes,
        [ttft for _, ttft, _ in replies],
        [tds for _, _, tds in replies],
    )
    alone = [reply_qoe(times, ttft, tds) for times, ttft, tds in replies]
    assert got == alone  # exact: the same floats, not approximately
    assert any(q.freezes.count for q in got) and any(not q.freezes.count for q in got)
    assert replies_qoe([], [], [], []) == []


def test_replies_qoe_names_the_reply_it_refuses():
    good, late = [0.1, 0.2], [0.5, 0.4]
    with pytest.raises(ValueError, match=r"replies\[1\].*not non-decreasing"):
        replies_qoe([*good, *late], [2, 2], [1.0, 1.0], [5.0, 5.0])
    with pytest.raises(ValueError, match=r"replies\[0\].*expected_tds"):
        replies_qoe(good, [2], [1.0], [0.0])
    with pytest.raises(ValueError, match="summing to the 2 times"):
        replies_qoe(good, [3], [1.0], [5.0])
    with pytest.raises(ValueError, match="one of each per reply"):
        replies_qoe(good, [2], [1.0, 1.0], [5.0])
