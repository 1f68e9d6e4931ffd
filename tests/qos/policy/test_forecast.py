"""The scheduler's closed-form QoE forecast against the digestion recursion, token by token."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from qos.policy.forecast import Digest, Forecast, append_stream, digested_area_at, score
from qos.policy.table import RequestTable
from qos.timeline import digested_area, digestion_starts, expected_area

times_strategy = st.lists(st.floats(0.0, 20.0), min_size=0, max_size=30).map(sorted)


def table_with(times: list[float], tds: float, ttft: float) -> RequestTable:
    table = RequestTable()
    table.add("r", arrival=0.0, prompt_tokens=5, ttft=ttft, tds=tds)
    for t in times:
        table.record_tokens(0, t)
    return table


def digest_of(table: RequestTable, held: bool) -> Digest:
    tds = table.col("tds")
    prefix = "held" if held else "dig"
    return Digest(
        n=table.col("output").astype(float),
        total=table.col(f"{prefix}_sum").copy(),
        last=table.col(f"{prefix}_last").copy(),
        step=1.0 / tds,
        tds=tds,
    )


@settings(max_examples=300, deadline=None)
@given(
    times=times_strategy,
    tds=st.floats(0.5, 10.0),
    ttft=st.floats(0.0, 5.0),
    now_extra=st.floats(0.0, 5.0),
    tau=st.floats(0.01, 2.0),
    horizon=st.floats(0.0, 30.0),
    delay=st.floats(0.0, 2.0),
    cap=st.integers(0, 50),
)
def test_forecast_matches_recursion(times, tds, ttft, now_extra, tau, horizon, delay, cap):
    now = (times[-1] if times else 0.0) + now_extra
    h = now + horizon
    t0 = now + tau + delay
    k = int(min(max(np.floor((h - t0) / tau) + 1, 0), cap))
    future = [t0 + j * tau for j in range(k)]
    table = table_with(times, tds, ttft)
    for held in (False, True):
        state = digest_of(table, held)
        served = append_stream(state, np.array([t0]), tau, np.array([float(k)]))
        all_times = np.array(times + future)
        hold = ttft if held else 0.0
        if all_times.size:
            starts = digestion_starts(all_times, tds, hold_until=hold)
            assert np.isclose(served.total[0], starts.sum(), rtol=1e-9, atol=1e-7)
            assert np.isclose(served.last[0], starts[-1], rtol=1e-9, atol=1e-7)
            brute = float(np.sum(digested_area(starts, h, tds)))
        else:
            brute = 0.0
        if not held or h > ttft:  # held: valid past the hold, see digested_area_at
            assert np.isclose(digested_area_at(served, h)[0], brute, rtol=1e-9, atol=1e-6)


def test_score_kinds():
    actual, expected = np.array([5.0, 10.0, 0.0]), np.array([10.0, 10.0, 0.0])
    assert np.allclose(score("andes", actual, expected), [0.5, 1.0, 1.0])
    # monotone: E / (E + deficit), deficit = E - actual
    assert np.allclose(score("monotone", actual, expected), [10 / 15, 1.0, 1.0])


def test_expected_area_unknown_length_is_the_ramp():
    assert float(expected_area(3.0, 1.0, 2.0, np.inf)) == 0.5 * 2.0 * 2.0**2


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    tau=st.floats(0.005, 2.0),
    horizon=st.floats(0.0, 30.0),
    kind=st.sampled_from(["andes", "monotone"]),
)
def test_fused_q_serve_matches_the_reference_composition(seed, tau, horizon, kind):
    """Forecast.q_serve (fused) = score(digested_area_at(append_stream(...))) row by row."""
    rng = np.random.default_rng(seed)
    rows, now = 64, 50.0
    n = rng.integers(0, 40, rows).astype(float)
    tds = rng.uniform(0.5, 30.0, rows)
    last = np.where(n > 0, now + rng.uniform(-20.0, 10.0, rows), -1e18)
    total = np.where(n > 0, n * (last - 0.5 * (n - 1) / tds), 0.0)
    forecast = Forecast.build(
        kind=kind,
        n=n,
        dig_sum=total,
        dig_last=last,
        tds=tds,
        ttft=rng.uniform(0.0, 3.0, rows),
        arrival=now - rng.uniform(0.0, 40.0, rows),
        now=now,
        horizon=now + horizon,
        first_delay=np.where(rng.random(rows) < 0.5, 0.0, rng.uniform(0.0, 2.0, rows)),
        remaining=np.where(rng.random(rows) < 0.5, np.inf, rng.integers(0, 30, rows)),
    )
    h = now + horizon
    t0 = forecast.first_delay + now + tau
    # tokens at t0, t0 + τ, ... ≤ h: ⌊(h - t0)/τ⌋ + 1 = ⌊(h - t0 + τ)/τ⌋ (written so, to
    # round exactly as q_serve does)
    k = np.clip(np.floor(np.maximum(h - (t0 - tau), 0.0) / tau), 0.0, forecast.remaining)
    served = append_stream(forecast.state, t0, tau, k)
    reference = score(kind, digested_area_at(served, h), forecast.expected)
    np.testing.assert_allclose(forecast.q_serve(tau), reference, rtol=1e-9, atol=1e-9)
    waiting = score(kind, digested_area_at(forecast.state, h), forecast.expected)
    np.testing.assert_allclose(forecast.q_wait, waiting, rtol=1e-9, atol=1e-9)
