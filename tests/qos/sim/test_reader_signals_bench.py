"""``bench/reader_signals.py``: the three variants side by side, on a test-sized run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from reader_signals import VARIANTS, WITH, WITHOUT, capacity, main


def test_a_quick_run_reports_every_variant_at_every_load(tmp_path: Path) -> None:
    assert main(["--quick", "--profiles", "opt-66b-4xa100", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "results.json").read_text())
    assert out["readers"]["away_share"] == 0.3
    (profile,) = out["profiles"]
    assert set(profile["runs"]) == {v.name for v in VARIANTS}
    for runs in profile["runs"].values():
        assert [r["load"] for r in runs] == [0.8, 1.1]
        for r in runs:
            assert 0.0 <= r["qoe_watched"] <= 1.0 and r["tok_s"] > 0
            assert r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"]
    assert profile["runs"][WITHOUT][0]["signals"] == 0
    assert profile["runs"][WITH][0]["signals"] > 0  # told: its clients spoke


def test_capacity_is_where_watched_qoe_crosses_unless_a_watched_reply_froze_first() -> None:
    runs = [
        {"rate": 1.0, "qoe_watched": 0.99, "frozen_over_2s": 0.0},
        {"rate": 2.0, "qoe_watched": 0.95, "frozen_over_2s": 0.0},
        {"rate": 3.0, "qoe_watched": 0.85, "frozen_over_2s": 0.0},
    ]
    assert capacity(runs) == pytest.approx(2.5)
    runs[1]["frozen_over_2s"] = 0.001
    assert capacity(runs) == 1.0


def test_an_unknown_profile_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["--profiles", "gpt-9"])
    assert "opt-66b-4xa100" in capsys.readouterr().err
