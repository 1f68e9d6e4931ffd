"""Per-tenant service against the weighted max-min fair share (qos/sim/shares.py), the
tier and tenant mixes of the benchmark, and `tokenpace bench qoe` with tenants."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.config.schema import DEFAULT_TIERS
from qos.fairness import W_OUTPUT, W_PROMPT, water_fill
from qos.metrics import Freezes
from qos.sim import TIERS, parse_tenants, parse_tier_mix
from qos.sim.engine import RequestResult
from qos.sim.shares import service_shares
from tokenpace.bench_qoe import main


def test_water_fill_is_weighted_max_min():
    w = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(water_fill(np.array([10.0, 10.0, 20.0]), w, 21.0), [3, 6, 12])
    # the weight-4 tenant asks for less than its share: it gets all of it, the rest goes
    # 1 : 2 until the weight-2 tenant has all it asks, then to the last one
    np.testing.assert_allclose(water_fill(np.array([10.0, 10.0, 5.0]), w, 21.0), [6, 10, 5])
    np.testing.assert_allclose(
        water_fill(np.array([10.0, 20.0, 5.0]), w, 21.0), [16 / 3, 32 / 3, 5]
    )
    # enough for everyone: everyone gets what it asks
    np.testing.assert_allclose(water_fill(np.array([1.0, 2.0, 3.0]), w, 6.0), [1, 2, 3])


def result(rid: str, tenant: str, arrival: float, times: list[float], prompt: int = 10):
    return RequestResult(
        id=rid,
        tenant=tenant,
        tier="chat",
        ttft=1.0,
        tds=5.0,
        arrival=arrival,
        prompt_tokens=prompt,
        output_tokens=len(times),
        times=np.asarray(times),
        preemptions=0,
        andes_qoe=1.0,
        monotone_qoe=1.0,
        freezes=Freezes(0.0, 0, 0.0),
        idle_s=0.0,
    )


def test_a_tenant_served_on_or_ahead_of_schedule_is_delivered_what_it_asked():
    # one request a second for 100 s, ttft 1 s, tds 5 tokens/s: tenant a gets each token
    # at its deadline; tenant b gets every reply at once on arrival, ahead of its reader;
    # one reply in four is 200 tokens long (40 s of reading), the rest 2 tokens
    def length(i: int) -> int:
        return 200 if i % 4 == 0 else 2

    reqs = [
        result(f"a{i}", "a", float(i), list(1.0 + np.arange(length(i)) / 5)) for i in range(101)
    ]
    reqs += [result(f"b{i}", "b", float(i), [0.01] * length(i)) for i in range(101)]
    shares = service_shares(reqs, {"a": 1.0, "b": 3.0})
    np.testing.assert_allclose(shares.delivered, shares.asked, rtol=1e-12)
    # asked: what falls due in [0, 100]; the long replies of the last 40 s only in part
    due = sum(
        W_OUTPUT * int(np.count_nonzero(i + 1.0 + np.arange(length(i)) / 5 <= 100.0))
        + W_PROMPT * 10 * (i + 1.0 <= 100.0)
        for i in range(101)
    )
    np.testing.assert_allclose(shares.asked, due / 100.0)
    assert not shares.backlogged.any()
    assert shares.ratio("a") == pytest.approx(1.0) and shares.ratio("b") == pytest.approx(1.0)


def test_a_tenant_served_late_is_delivered_less_than_it_asked():
    # the same requests, every reply 20 s late: the readers get the last 20 s of the
    # window's service after it
    reqs = [result(f"a{i}", "a", float(i), [1.0, 1.2]) for i in range(101)]
    reqs += [result(f"b{i}", "b", float(i), [21.0, 21.2]) for i in range(101)]
    shares = service_shares(reqs, {"a": 1.0, "b": 1.0})
    assert shares.delivered[0] == pytest.approx(shares.asked[0])
    assert shares.delivered[1] == pytest.approx(shares.asked[1] * 80 / 100, rel=0.02)


def test_a_short_engine_divides_by_weight():
    # both ask for one request a second; the engine serves a's and b's alternately,
    # 1 : 1, though b weighs 3: b is owed more
    reqs = [result(f"a{i}", "a", float(i), [1.0 + i, 1.5 + i]) for i in range(0, 200, 2)]
    reqs += [result(f"b{i}", "b", float(i), [2.0 + i, 2.5 + i]) for i in range(1, 200, 2)]
    reqs += [result(f"a{i}", "a", float(i), [300.0]) for i in range(1, 200, 2)]
    reqs += [result(f"b{i}", "b", float(i), [300.0]) for i in range(0, 200, 2)]
    shares = service_shares(reqs, {"a": 1.0, "b": 3.0})
    assert shares.backlogged.all()
    assert shares.ratio("a") > 1.5 and shares.ratio("b") < 0.8
    assert shares.fair_fraction() == pytest.approx([0.25, 0.75])
    over_time = shares.share_over_time()
    assert over_time.shape == shares.service.shape
    assert np.nanmax(np.abs(np.nansum(over_time, axis=0) - 1.0)) < 1e-9


def test_service_shares_bad_input():
    with pytest.raises(ValueError, match="weights"):
        service_shares([result("x", "x", 0.0, [1.0])], {"a": 1.0})
    with pytest.raises(ValueError, match="requests"):
        service_shares([], {"a": 1.0})
    with pytest.raises(ValueError, match="bin_s"):
        service_shares([result("x", "a", 0.0, [1.0])], {"a": 1.0}, bin_s=0)


def test_tiers_are_the_gateway_defaults():
    assert {n: (t.ttft, t.tds) for n, t in TIERS.items()} == {
        n: (t.ttft, t.tds) for n, t in DEFAULT_TIERS.items()
    }


def test_tier_mix_and_tenants_parse_or_say_what_to_fix():
    assert [(t.name, s) for t, s in parse_tier_mix("chat=0.5,voice=0.3,fast=0.2")] == [
        ("chat", 0.5),
        ("voice", 0.3),
        ("fast", 0.2),
    ]
    assert parse_tenants("free:1:0.33,pro:2:0.33,ent:4:0.34")[2] == ("ent", 4.0, 0.34)
    for bad, message in (
        ("chat=0.5,slow=0.5", "unknown tier 'slow'"),
        ("chat=half", "NAME=SHARE"),
        ("chat=0.5", "sum to 1"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_tier_mix(bad)
    for bad, message in (
        ("free:1", "NAME:WEIGHT:SHARE"),
        ("free:x:1", "NAME:WEIGHT:SHARE"),
        ("free:0:1", "weights must be finite and > 0"),
        ("a:1:0.5,a:2:0.5", "unique"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_tenants(bad)


def test_bench_qoe_with_tenants_writes_per_tenant_results_and_a_summary(tmp_path, capsys):
    out = tmp_path / "qoe"
    args = ["--policies", "fcfs,andes-tp", "--rates", "4", "--n", "150", "--jobs", "1"]
    args += ["--tier-mix", "chat=0.5,voice=0.3,fast=0.2", "--tenants", "a:1:0.5,b:4:0.5"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "a QoE" in printed and "b QoE" in printed
    assert "share" in printed and "alone" in printed
    assert "tiering" in printed and not printed.lstrip().startswith("{")
    report = json.loads((out / "results.json").read_text())
    run = next(r for r in report["runs"] if r["policy"] == "andes-tp")
    assert set(run["tenants"]) == {"a", "b", "share_over_time"}
    assert run["tenants"]["b"]["weight"] == 4.0 and 0 < run["tenants"]["a"]["avg_qoe"] <= 1
    assert (out / "service_share.png").stat().st_size > 0
    tiering = report["analysis"]["tiering"]["4.0"]["tenants"]
    for name in ("a", "b"):  # the reader's tails beside each plan's average
        assert tiering[name]["idle_p99_s"] == run["tenants"][name]["idle_p99_s"] >= 0
        assert tiering[name]["ttft_p90_s"] == run["tenants"][name]["ttft_p90_s"] >= 0
        # what the plan is worth: its fifth or four fifths of the engine, the whole one
        assert 0 < tiering[name]["share_avg_qoe"] <= tiering[name]["alone_avg_qoe"] <= 1
        assert tiering[name]["unweighted_avg_qoe"] is None  # not run
    # a's demand, half of everything, on a fifth of the engine, and b's on four fifths
    assert tiering["a"]["share_avg_qoe"] < tiering["b"]["share_avg_qoe"]
    assert "isolation_misses" in report["analysis"]["tiering"]["4.0"]
    assert "idle p99" in printed


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--tenants", "a:1", "--tenants"), ("--tier-mix", "chat=2", "--tier-mix")],
)
def test_bench_qoe_rejects_bad_mixes(tmp_path, option, value, message):
    with pytest.raises(SystemExit, match=message):
        main(["--rates", "3", "--n", "10", option, value, "--out", str(tmp_path)])
