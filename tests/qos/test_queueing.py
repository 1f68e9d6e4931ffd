"""Tests for qos.queueing: QLM's request waiting time estimate (§6, Eq. 2)."""

from __future__ import annotations

import math

import pytest

from qos.queueing import request_waiting_time


def test_waiting_time_is_tokens_ahead_over_throughput():
    # Three requests ahead with 100, 250 and 50 output tokens at Θ = 200 tokens/s: 2 s.
    assert request_waiting_time(100 + 250 + 50, 200.0) == pytest.approx(2.0)
    assert request_waiting_time(0, 1000.0) == 0.0  # an empty queue: no wait


def test_waiting_time_is_linear_in_queue_position():
    # QLM Fig. 3: with equal requests ahead, the wait grows linearly with the position.
    waits = [request_waiting_time(q * 300, 1500.0) for q in range(5)]
    assert waits == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])


@pytest.mark.parametrize("tps", [0.0, -1.0, math.inf, math.nan])
def test_bad_throughput_is_rejected(tps):
    with pytest.raises(ValueError, match="throughput_tps"):
        request_waiting_time(10, tps)


@pytest.mark.parametrize("tokens", [-1.0, math.inf, math.nan])
def test_bad_tokens_ahead_are_rejected(tokens):
    with pytest.raises(ValueError, match="tokens_ahead"):
        request_waiting_time(tokens, 100.0)
