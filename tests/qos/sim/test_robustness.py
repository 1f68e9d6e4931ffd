"""Never worse than FCFS (``bench/robustness.py``): the shipped policy against first come,
first served on random workloads of the simulator, a seeded handful of the sweep's
points and a property over small random workloads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qos.policy.reader import GuardSettings
from qos.sim.workload import load_andes_trace
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from robustness import BASELINE, SHIPPED, draw_point, main, run_point, verdicts

ENTRIES = load_andes_trace()


@pytest.mark.parametrize("index", range(5))
def test_a_seeded_point_of_the_sweep_meets_fcfs(index: int) -> None:
    """Points 0-4 of the sweep (seed 0), 200 requests each: QoE within 0.01 of FCFS's,
    tokens/s within 3 %, no more readers frozen over 2 s (or at most 1 %)."""
    row = run_point(draw_point(index, 0, 200, ENTRIES), ENTRIES)
    missed = set(row["failures"]) & {"qoe", "qoe-where-good", "tokens", "frozen"}
    assert not missed, (row["point"], row[BASELINE], row[SHIPPED])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, 10**6))
@example(index=427549)  # a burst on the slow engine: its prefills once held past TTFTs
def test_the_shipped_policy_is_never_worse_than_fcfs_on_small_random_workloads(index: int) -> None:
    row = run_point(draw_point(index, 7, 120, ENTRIES), ENTRIES)
    assert row[SHIPPED]["qoe"] >= row[BASELINE]["qoe"] - 0.01, row["point"]


def test_the_verdicts_name_each_target_missed() -> None:
    fcfs = {"qoe": 0.95, "tok_s": 100.0, "idle_p99_s": 3.0, "frozen_over_2s": 0.0}
    assert verdicts(fcfs, dict(fcfs)) == []
    worse = {"qoe": 0.944, "tok_s": 96.0, "idle_p99_s": 3.5, "frozen_over_2s": 0.02}
    assert verdicts(fcfs, worse) == ["qoe-where-good", "tokens", "idle-p99", "frozen"]
    overloaded = {**fcfs, "qoe": 0.4}
    assert verdicts(overloaded, {**overloaded, "qoe": 0.5}) == ["overload-gain"]
    assert verdicts(overloaded, {**overloaded, "qoe": 0.53}) == []
    assert verdicts(fcfs, {**fcfs, "frozen_over_2s": 0.01}) == []  # at most 1 %


def test_a_guard_setting_reaches_the_shipped_policy_and_not_fcfs() -> None:
    """Point 60 of seed 0: a burst meets a cache full of paused replies whose slow readers
    (about 1.1 tokens/s) are minutes ahead; lending their KV lets the burst in before its
    TTFTs pass, and FCFS runs as before."""
    point = draw_point(60, 0, 400, ENTRIES)
    shipped = run_point(point, ENTRIES)
    lending = run_point(point, ENTRIES, GuardSettings(lend_after_s=30.0))
    assert lending[BASELINE]["qoe"] == shipped[BASELINE]["qoe"]
    assert lending[SHIPPED]["idle_p99_s"] < shipped[SHIPPED]["idle_p99_s"]


def test_the_sweep_records_the_guard_settings_it_ran(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    main(["--points", "1", "--requests", "40", "--lend-after-s", "30", "--out", str(out)])
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["guard"]["lend_after_s"] == 30.0


def test_the_sweep_refuses_a_loan_threshold_that_is_not_positive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--points", "1", "--lend-after-s", "0"])
    assert exc.value.code == 2
    assert "--lend-after-s: lend_after_s: must be > 0 seconds" in capsys.readouterr().err
