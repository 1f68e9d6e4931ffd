"""`tokenpace bench qoe`'s reader-guard flags: they set the guarded policies of the
comparison, and are refused where no policy compared has the guard."""

from __future__ import annotations

import pytest

from tokenpace.bench_qoe import main, run_one


def test_guard_flags_without_a_guarded_policy_are_refused(tmp_path) -> None:
    argv = ["--policies", "fcfs,andes", "--rates", "3", "--n", "10", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="--lend-after-s: the reader guard's settings"):
        main([*argv, "--lend-after-s", "10"])
    with pytest.raises(SystemExit, match="add one of andes-tp, andes-tp-unweighted"):
        main([*argv, "--overdue-after-ttfts", "off"])


def test_guard_flags_leave_fcfs_in_the_comparison_as_it_is() -> None:
    """With the guard's flags set, FCFS still runs beside the guarded policy: the flags
    go to the guarded one only (make_policy would refuse them for FCFS)."""
    cfg = {
        "profile": "llama-3.1-8b-h100",
        "kv_capacity_tokens": None,
        "max_batch": None,
        "swap_per_token_s": None,
        "workload": "chat",
        "arrivals": "poisson",
        "cv": 1.0,
        "n": 20,
        "seed": 0,
        "trace": None,
        "tier_mix": None,
        "tenants": None,
        "preemption": "recompute",
        "lend_after_s": 10.0,
        "overdue_after_ttfts": "off",
        "overdue_after_fcfs_waits": None,
    }
    for policy in ("fcfs", "andes-tp"):
        summary = run_one((policy, 30.0, cfg))
        assert summary["policy"] == policy and summary["rate"] == 30.0


def test_guard_flags_out_of_range_are_refused_naming_the_flags(tmp_path) -> None:
    """A value the guard cannot take stops the run before it starts, naming the flag:
    ``--lend-after-s 0`` was once read as unset."""
    argv = ["--policies", "andes-tp", "--rates", "3", "--n", "10", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="--lend-after-s: lend_after_s: must be > 0"):
        main([*argv, "--lend-after-s", "0"])
    with pytest.raises(SystemExit, match="--overdue-after-fcfs-waits: overdue_after_fcfs_waits"):
        main([*argv, "--overdue-after-fcfs-waits", "-1"])
    soon = "--overdue-after-ttfts: overdue_after_ttfts: must be a number of TTFTs > 0 or off"
    with pytest.raises(SystemExit, match=soon):
        main([*argv, "--overdue-after-ttfts", "soon"])
