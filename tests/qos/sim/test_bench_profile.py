"""The profile a `tokenpace bench qoe` run simulates: the shipped one, or with the
KV size, batch limit and swap cost the command line overrides."""

from __future__ import annotations

import pytest

from qos.latency import get_profile
from tokenpace.bench_qoe import bench_profile, main


def test_a_measured_swap_cost_overrides_the_profiles_and_names_the_run() -> None:
    shipped = get_profile("opt-66b-4xa100")
    profile = bench_profile({"profile": "opt-66b-4xa100", "swap_per_token_s": 1.2e-5})
    assert profile.swap_per_token_s == 1.2e-5 != shipped.swap_per_token_s
    assert profile.preempt_s(500, "swap") == pytest.approx(0.006)
    assert profile.name == "opt-66b-4xa100[swap_per_token_s=1.2e-05]"
    assert profile.decode_s_at == shipped.decode_s_at
    assert bench_profile({"profile": "opt-66b-4xa100"}) is shipped


@pytest.mark.parametrize("value", ["0", "-1e-5", "nan"])
def test_a_swap_cost_that_is_not_positive_is_refused(tmp_path, value: str) -> None:
    with pytest.raises(SystemExit, match="--swap-s-per-token: swap_per_token_s"):
        main(["--rates", "3", "--n", "10", f"--swap-s-per-token={value}", "--out", str(tmp_path)])
