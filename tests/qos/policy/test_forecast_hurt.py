"""Forecast.hurt_at (closed form for requests with no token yet) against the forecast."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.latency import get_profile
from qos.policy.andes import UNGUARDED, tokenpace_andes
from qos.policy.forecast import Forecast, _fresh_hurt
from qos.policy.table import NO_TOKEN, Capacity, RequestTable


def forecast_of(
    rng: np.random.Generator, rows: int, now: float, horizon_s: float, fresh: float
) -> Forecast:
    """Waiting requests, a share ``fresh`` of them with no token yet, the others paused
    mid-reply; TTFTs due or missed, TDS up to 60 tokens/s (above any batch-1 speed),
    some ``max_tokens`` reached or nearly."""
    tds = np.where(rng.random(rows) < 0.2, 60.0, rng.uniform(0.5, 12.0, rows))
    n = np.where(rng.random(rows) < fresh, 0.0, rng.integers(1, 40, rows).astype(float))
    last = np.where(n > 0, now + rng.uniform(-20.0, 10.0, rows), NO_TOKEN)
    total = np.where(n > 0, n * (last - 0.5 * (n - 1) / tds), 0.0)
    limits = rng.integers(0, 4, rows).astype(float)
    return Forecast.build(
        kind="andes",
        n=n,
        dig_sum=total,
        dig_last=last,
        tds=tds,
        ttft=rng.choice([0.0, 1.0, 3.0, 30.0], rows),
        arrival=now - rng.choice([0.0, 1e-6, 0.5, 2.0, 60.0], rows) * rng.random(rows),
        now=now,
        horizon=now + horizon_s,
        first_delay=np.where(rng.random(rows) < 0.3, 0.0, rng.uniform(0.0, 3.0, rows)),
        remaining=np.where(rng.random(rows) < 0.6, np.inf, limits),
    )


@settings(max_examples=400, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    now=st.sampled_from([0.0, 600.0, 3.0e7]),
    horizon_s=st.sampled_from([1e-3, 0.3, 5.0, 45.0, 400.0]),
    tau=st.sampled_from([0.005, 0.03, 0.156, 1.0]),
    wait=st.sampled_from([None, 0.0, 1e-12, 1e-7, 1e-4, 0.01, 0.1, 2.0]),
    fresh=st.sampled_from([1.0, 0.8]),
)
def test_hurt_at_matches_the_forecast(seed, now, horizon_s, tau, wait, fresh):
    """Equal to ``of(rows, horizon).hurt(tau)`` at the claims' horizons (first token after
    a wait for room, capped at Δt), edge cases included: TTFT due or missed by h, TDS above
    1/τ, max_tokens 0 to 3, first tokens just before h, a clock at 3e7 s."""
    rng = np.random.default_rng(seed)
    forecast = forecast_of(rng, 48, now, horizon_s, fresh)
    rows = np.sort(rng.choice(48, 32, replace=False))
    first = now + (np.inf if wait is None else wait) + forecast.first_delay[rows]
    first += tau
    horizon = np.minimum(first, forecast.horizon)
    expected = forecast.of(rows, horizon).hurt(tau)
    np.testing.assert_array_equal(forecast.hurt_at(rows, horizon, tau), expected)
    hurt, known = _fresh_hurt(forecast, rows, horizon, tau)
    np.testing.assert_array_equal(hurt[known], expected[known])


@pytest.mark.parametrize("now", [0.0, 600.0, 3.0e7])
def test_closed_form_cases(now):
    """One fresh request per case, TDS 5, served at τ = 0.1 from t0 = now + 0.1."""
    tau = 0.1
    # arrival, ttft, remaining, per-row horizon h
    cases = {
        "ttft missed by h": (now - 5.0, 1.0, np.inf, now + 0.5),
        "ttft not due by h": (now - 0.2, 1.0, np.inf, now + 0.5),
        "ttft due exactly at h": (now, 0.5, np.inf, now + 0.5),
        "max_tokens reached": (now - 5.0, 1.0, 0.0, now + 0.5),
        "one token left": (now - 5.0, 1.0, 1.0, now + 0.5),
        "h before the first token": (now - 5.0, 1.0, np.inf, now + 0.05),
        "first token ends at h": (now - 5.0, 1.0, np.inf, now + 0.1),
    }
    arrival, ttft, remaining, horizon = (np.array(c) for c in zip(*cases.values(), strict=True))
    rows = len(cases)
    forecast = Forecast.build(
        kind="andes",
        n=np.zeros(rows),
        dig_sum=np.zeros(rows),
        dig_last=np.full(rows, NO_TOKEN),
        tds=np.full(rows, 5.0),
        ttft=ttft,
        arrival=arrival,
        now=now,
        horizon=now + 10.0,
        first_delay=np.zeros(rows),
        remaining=remaining,
    )
    every = np.arange(rows)
    hurt, known = _fresh_hurt(forecast, every, horizon, tau)
    assert dict(zip(cases, hurt.tolist(), strict=True)) == {
        "ttft missed by h": True,
        "ttft not due by h": False,
        "ttft due exactly at h": False,
        "max_tokens reached": False,
        "one token left": True,
        "h before the first token": False,
        "first token ends at h": False,  # it arrives at h: nothing read, Q_serve = 0
    }
    assert known[:-1].all()  # the last is left to the forecast unless k rounds to 0
    np.testing.assert_array_equal(hurt, forecast.of(every, horizon).hurt(tau))


def test_a_first_token_just_before_h_is_left_to_the_forecast():
    """Read for 1 µs before h, 100 s after the expected first token: Q_serve ≈ 1e-10, under
    the threshold; the closed form does not decide it, the forecast says not hurt."""
    forecast = Forecast.build(
        kind="andes",
        n=np.zeros(1),
        dig_sum=np.zeros(1),
        dig_last=np.full(1, NO_TOKEN),
        tds=np.full(1, 5.0),
        ttft=np.zeros(1),
        arrival=np.full(1, -100.0),
        now=0.0,
        horizon=10.0,
        first_delay=np.zeros(1),
        remaining=np.full(1, np.inf),
    )
    horizon = np.array([0.1 + 1e-6])
    _, known = _fresh_hurt(forecast, np.zeros(1, dtype=int), horizon, 0.1)
    assert not known[0]
    assert not forecast.hurt_at(np.zeros(1, dtype=int), horizon, 0.1)[0]


def test_the_closed_form_decides_every_claim_of_the_benchmark_decision():
    """bench/andes_decision.py's table: every admission is fresh and decided without a
    second forecast."""
    rng = np.random.default_rng(0)
    table, now = RequestTable(), 600.0
    for i in range(1280):
        table.add(
            f"r{i}",
            arrival=now - rng.uniform(1.0, 120.0),
            prompt_tokens=int(rng.integers(4, 600)),
            ttft=1.0,
            tds=float(rng.uniform(3.8, 5.1)),
        )
    for row in rng.permutation(1280)[:256].tolist():
        table.admit(row)
        for k in range(int(rng.integers(1, 300))):
            if now - 30.0 + k * 0.15 >= now:
                break
            table.record_tokens(row, now - 30.0 + k * 0.15)
    capacity = Capacity(kv_tokens=int(table.demand[table.running].sum()), max_batch=256)
    policy = tokenpace_andes(get_profile("opt-66b-4xa100"), **UNGUARDED)
    for row in range(table.n):
        policy.on_arrival(table, row, now)
    for k in range(10):
        policy.on_finish(table, k, now - 1.0 + 0.1 * k)
    chosen = policy.schedule(table, capacity, now)
    assert policy._forecast is not None
    forecast, tau = policy._forecast
    admitted = (chosen & ~table.running).nonzero()[0]
    assert admitted.size > 0
    first = now + policy.room_wait_s(now) + forecast.first_delay[admitted] + tau
    horizon = np.minimum(first, forecast.horizon)
    hurt, known = _fresh_hurt(forecast, admitted, horizon, tau)
    assert known.all()
    np.testing.assert_array_equal(hurt, forecast.of(admitted, horizon).hurt(tau))
