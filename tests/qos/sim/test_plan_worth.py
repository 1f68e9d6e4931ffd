"""What a price plan is worth in the simulator (tokenpace/bench_plans.py): the tenant's
demand scaled to the whole engine, and the targets read off one rate."""

from __future__ import annotations

import json
import sys

import pytest

from qos.latency import get_profile
from qos.policy.registry import make_policy
from qos.sim import SimRequest, build_workload, load_andes_trace, scale_demand, simulate
from tests.support.paths import ROOT
from tokenpace.bench_plans import fits_share, plan_references, verdicts


def request(i: int, arrival: float) -> SimRequest:
    return SimRequest(
        id=f"r{i}", arrival=arrival, prompt_tokens=10, output_tokens=5, ttft=1.0, tds=5.0
    )


def test_scaled_demand_repeats_each_request_at_its_arrival_evenly():
    requests = [request(i, float(i)) for i in range(4)]
    scaled = scale_demand(requests, 1.75)
    # 4 · 1.75 = 7 copies: request i repeated ⌊(i+1)·1.75⌋ − ⌊i·1.75⌋ times: 1, 2, 2, 2
    assert [r.id for r in scaled] == ["r0~0", "r1~0", "r1~1", "r2~0", "r2~1", "r3~0", "r3~1"]
    assert [r.arrival for r in scaled] == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert [r.id for r in scale_demand(requests, 1.0)] == ["r0~0", "r1~0", "r2~0", "r3~0"]
    assert len(scale_demand([request(i, 0.0) for i in range(100)], 7.0)) == 700
    for bad in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="factor"):
            scale_demand(requests, bad)


def test_a_share_of_the_engine_is_worth_what_the_whole_engine_gives_its_demand_scaled():
    """Two tenants of weights 1 : 3, each sending half the trace's requests at 3 req/s
    (OPT-66B's capacity is about 2.4): the weight-3 one asks two thirds of its three
    quarters and fits; the weight-1 one asks twice its quarter. Alone on the whole
    engine both are served."""
    profile = get_profile("opt-66b-4xa100")
    workload = build_workload(
        load_andes_trace(), 3.0, n=240, tenants=[("low", 1.0, 0.5), ("high", 3.0, 0.5)]
    )

    def simulate_one(requests):
        return simulate(requests, make_policy("andes-tp", profile), profile, pause=True)

    worth = plan_references(workload, {"low": 1.0, "high": 3.0}, simulate_one)
    low, high = worth["low"], worth["high"]
    assert high["alone_avg_qoe"] > 0.95 and low["alone_avg_qoe"] > 0.95
    assert high["share_avg_qoe"] > 0.95 > 0.9 > low["share_avg_qoe"]
    assert low["share_idle_p99_s"] > 10 * high["share_idle_p99_s"]
    assert fits_share(high) and not fits_share(low)


def tenant(weight, qoe, blind, share=None, alone=None, frozen=0.0):
    return {
        "weight": weight,
        "avg_qoe": qoe,
        "frozen_over_2s": frozen,
        "unweighted_avg_qoe": blind,
        "unweighted_frozen_over_2s": 0.0,
        "share_avg_qoe": share,
        "share_frozen_over_2s": 0.0,
        "alone_avg_qoe": alone,
    }


def test_the_targets_at_one_rate():
    # everyone served well without weights: the plans may move nobody's QoE by 0.02
    calm = verdicts({"a": tenant(1, 0.95, 0.98), "b": tenant(4, 0.99, 0.97)}, 1.0)
    assert calm["served_well_unweighted"] and calm["largest_loss"] == pytest.approx(0.03)
    assert calm["largest_change"] == pytest.approx(0.03) and calm["ordered_by_weight"]
    # a shortfall: b fits its share and gets nearly its QoE alone; a pays, out of order
    # only if it is ahead of b
    short = {
        "a": tenant(1, 0.50, 0.70, share=0.30, alone=1.0),
        "b": tenant(4, 0.97, 0.75, share=0.99, alone=1.0),
    }
    got = verdicts(short, 0.97)
    assert not got["served_well_unweighted"] and got["ordered_by_weight"]
    assert got["fit_share"] == ["b"] and got["isolation_misses"] == []
    assert got["top_below_alone"] == pytest.approx(0.03)
    short["b"]["avg_qoe"], short["b"]["frozen_over_2s"] = 0.96, 0.01  # a reply froze
    assert verdicts(short, 0.97)["isolation_misses"] == ["b"]
    short["a"]["avg_qoe"] = 0.97
    assert not verdicts(short, 0.97)["ordered_by_weight"]
    # without the unweighted run, only what the run itself tells
    alone = verdicts({"a": tenant(1, 0.5, None), "b": tenant(4, 0.9, None)}, None)
    assert "total_vs_unweighted" not in alone and alone["fit_share"] == []


def test_the_targets_over_many_sweeps_count_each_point_and_name_the_misses(tmp_path, capsys):
    """Two sweeps (directories of results.json): the summary counts where each target
    applies and is met, and names the points that miss by directory and rate."""
    sys.path.insert(0, str(ROOT / "bench"))
    from plans_targets import main as plans_targets

    rates = {
        "calm": {"2.0": ({"a": tenant(1, 0.97, 0.98), "b": tenant(4, 1.0, 0.98)}, 1.0)},
        "short": {
            "3.0": (
                {
                    "a": tenant(1, 0.40, 0.70, share=0.3, alone=1.0),
                    "b": tenant(4, 0.93, 0.72, share=0.99, alone=1.0),
                },
                0.95,
            )
        },
    }
    for name, points in rates.items():
        tiering = {
            rate: {"tenants": tenants, **verdicts(tenants, total)}
            for rate, (tenants, total) in points.items()
        }
        (tmp_path / name).mkdir()
        report = {"analysis": {"tiering": tiering}}
        (tmp_path / name / "results.json").write_text(json.dumps(report))
    assert plans_targets([str(tmp_path / "calm"), str(tmp_path / "short")]) == 0
    rows = {
        line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()
    }
    assert "| 1 | 1 | 0.020 |" in rows["nobody loses: largest QoE change ≤ 0.02"]
    total = rows["shortfall: total ≥ 97% of unweighted"]
    assert "| 1 | 0 | 0.950 | short @ 3: 0.950 |" in total
    assert (
        "short @ 3: 0.070"
        in rows["shortfall: highest weight, fitting its share, within 0.02 of alone"]
    )
    assert "short @ 3: 0.930" in rows["isolation: plans fitting their share ≥ 0.95"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("[1]")
    for bad in ("missing", "broken"):
        with pytest.raises(SystemExit, match=f"{bad}: no readable results.json"):
            plans_targets([str(tmp_path / bad)])
