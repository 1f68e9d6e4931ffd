"""bench/figures.py, the benchmarks page's plots: each draws an SVG from a small results
file of its benchmark's shape, the committed SVGs are what their committed JSON draws,
and a plot whose results are missing is named with the command that writes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import figures


def _vllm_run(qoe: float, tok_s: float, ttft: float, idle: float) -> dict[str, Any]:
    return {
        "avg_qoe": qoe,
        "throughput_tok_s": tok_s,
        "readers_p90_ttft_s": ttft,
        "idle_p99_s": idle,
        "frozen_over_2s": 0.025 if qoe > 0.3 else 0.0,
        "longest_freeze_s": 2.5,
    }


def vllm_compare() -> dict[str, Any]:
    fcfs = [_vllm_run(0.2, 700, 8.0, 9.0), _vllm_run(0.25, 720, 7.0, 8.0)]
    andes = [_vllm_run(0.4, 690, 9.0, 9.5), _vllm_run(0.35, 700, 8.0, 9.0)]
    return {
        "settings": {"requests": 120, "load": 2.2, "repeats": 2},
        "results": {"poisson": {"fcfs": fcfs[0], "andes": andes[0]}},
        "repeats": {"poisson": {"fcfs": fcfs, "andes": andes}},
    }


def _routing_run(p90: float, hit: float) -> dict[str, Any]:
    return {
        "ttft_p90_s": p90,
        "ttft_p99_s": p90 * 1.5,
        "tokens_per_s": 100.0,
        "qoe_mean": 0.4,
        "hit_rate": hit,
    }


def routing(name: str) -> dict[str, Any]:
    lw, ca = _routing_run(2.0, 0.6), _routing_run(1.5, 0.8)
    return {
        "workload": {"name": name, "conversations": 8, "turns": 7, "reply_tokens": 64},
        "medians": {"least_waiting": lw, "cache_aware": ca},
        "runs": {"least_waiting": [lw, lw], "cache_aware": [ca, ca]},
    }


def _bound(batch: int, req_s: float) -> dict[str, Any]:
    return {"batch": batch, "decode_s_per_token": 0.001, "req_s": req_s, "tok_s": req_s * 330}


def ceiling() -> dict[str, Any]:
    return {
        "opt-66b-4xa100": {"batch_bound": _bound(256, 4.09), "kv_bound": _bound(151, 2.91)},
        "llama-3.1-8b-h100": {"batch_bound": _bound(200, 36.4), "kv_bound": _bound(200, 36.4)},
    }


def reader_qoe(profile: str, arrivals: str, fcfs: float, ours: float) -> dict[str, Any]:
    capacity = {"fcfs": fcfs, "andes-tp": ours}
    return {
        "config": {"profile": profile, "arrivals": arrivals},
        "analysis": {"reader": {"stall_free_capacity_req_s": capacity}},
    }


def reader_signals() -> dict[str, Any]:
    def runs(qoe: float) -> list[dict[str, Any]]:
        return [
            {
                "load": load,
                "qoe_watched": qoe / load,
                "idle_p99_s": 10 * load,
                "frozen_over_2s": 0.0 if qoe == 1.0 else 0.05 * load,
            }
            for load in (0.8, 1.1)
        ]

    return {
        "readers": {"away_share": 0.3, "away_s": [10, 60], "jitter_s": 0.0},
        "profiles": [
            {
                "profile": "opt-66b-4xa100",
                "ceiling_req_s": 2.9,
                "capacity_req_s": {"fcfs": 2.2, "andes-tp": 2.5, "andes-tp+signals": 2.6},
                "capacity_ratio": 1.04,
                "runs": {"fcfs": runs(0.8), "andes-tp": runs(0.9), "andes-tp+signals": runs(1.0)},
            }
        ],
    }


def price_plans() -> dict[str, Any]:
    def run(policy: str, rate: float) -> dict[str, Any]:
        tenants: dict[str, Any] = {"share_over_time": {"t_s": [0.0]}}
        for plan, weight in (("free", 1), ("pro", 2), ("ent", 4)):
            qoe = 1.0 if policy == "andes-tp" and plan == "ent" else 1.0 / rate
            tenants[plan] = {
                "weight": weight,
                "avg_qoe": qoe,
                "idle_p99_s": rate / weight,
                "frozen_over_2s": 0.0,
            }
        return {"policy": policy, "rate": rate, "tenants": tenants}

    policies = ["andes-tp", "andes-tp-unweighted"]
    return {
        "config": {
            "policies": policies,
            "tenants": "free:1:0.70,pro:2:0.15,ent:4:0.15",
            "profile": "opt-66b-4xa100",
            "arrivals": "poisson",
            "seed": 0,
            "n": 600,
        },
        "runs": [run(p, r) for p in policies for r in (2.0, 4.0)],
    }


def sdk_pacing() -> dict[str, Any]:
    def row(client: str, p99: float) -> dict[str, Any]:
        return {"tds": 4.8, "client": client, "release_error_ms": {"p50": 1.0, "p99": p99}}

    def overload(model: str, qoe: float) -> dict[str, Any]:
        return {
            "model": model,
            "rebuffering_per_100_tokens": {"arrivals": 0.5, "displayed": 0.4},
            "qoe_mean": {"andes": qoe, "displayed_andes": qoe + 0.04},
        }

    return {
        "args": {"streams": 100},
        "cost": [row("paced", 10.2), row("replay, paced, tick 2 ms", 3.1), {"tds": 50.0}],
        "overload": [overload("bench-fcfs", 0.8), overload("bench-andes", 0.86)],
    }


def _fixed(ttft_p50: float, cpu: float | None) -> dict[str, Any]:
    run: dict[str, Any] = {"ttft_ms": {"p50": ttft_p50, "p99": 3 * ttft_p50}}
    if cpu is not None:
        run["cpu_s_per_1k_tokens"] = cpu
    return run


def _target(ttft_p50: float, cpu: float | None, chunks: float) -> dict[str, Any]:
    fixed = _fixed(ttft_p50, cpu)
    return {
        "fixed": fixed,
        "fixed_repeats": [fixed, fixed],
        "saturation": {"chunks_per_s": chunks, "server_cpu_s": 6.0, "wall_s": 6.0},
        "saturation_chunks_per_s": [chunks, chunks * 0.9],
    }


def gateway_cost() -> dict[str, Any]:
    by = {
        "direct": _target(1.0, None, 80_000),
        "floor": _target(1.6, 0.08, 120_000),
        "gateway": _target(2.5, 0.09, 75_000),
    }
    return {
        "runs": {"64": by, "256": by},
        "per_request_repeats": {
            "floor": [{"cpu_ms_per_request": 0.89}, {"cpu_ms_per_request": 0.9}],
            "gateway": [{"cpu_ms_per_request": 1.5}, {"cpu_ms_per_request": 1.6}],
        },
        "targets": [
            {"target": "CPU per token <= 1.15x the floor's at 64", "measured": 1.11, "met": True}
        ],
    }


def gateway_workers() -> dict[str, Any]:
    by = {
        "direct": _target(1.0, None, 68_000),
        "gateway": _target(13.0, 0.1, 45_000),
        "gateway-2w": _target(8.7, 0.12, 60_000),
    }
    return {"runs": {"256": by}}


SMALL = {
    "vllm-compare": vllm_compare(),
    "routing-vllm-shared": routing("shared"),
    "routing-vllm-history": routing("history"),
    "throughput-ceiling": ceiling(),
    "reader-qoe-opt-poisson": reader_qoe("opt-66b-4xa100", "poisson", 2.4, 2.62),
    "reader-qoe-opt-gamma": reader_qoe("opt-66b-4xa100", "gamma", 2.24, 2.54),
    "reader-qoe-llama-poisson": reader_qoe("llama-3.1-8b-h100", "poisson", 36.2, 42.5),
    "reader-qoe-llama-gamma": reader_qoe("llama-3.1-8b-h100", "gamma", 36.8, 43.68),
    "reader-signals": reader_signals(),
    "price-plans": price_plans(),
    "sdk-pacing": sdk_pacing(),
    "gateway-cost": gateway_cost(),
    "gateway-workers": gateway_workers(),
}

# what each plot's key-figure line must say of the small results above
KEY_FIGURES = {
    "vllm_compare": "poisson: QoE 2.00x, tokens/s 0.99x",
    "routing_vllm": "shared: p90 TTFT 0.75x",
    "throughput_ceiling": "opt-66b-4xa100 2.91 req/s, tokenpace's stall-free capacity up to 90%",
    "reader_signals": "told / untold 1.04x, frozen > 2 s told up to 0.0% (FCFS 5.5%)",
    "price_plans": "lowest QoE of plan ent: 1.00 weighted, 0.25 unweighted",
    "sdk_pacing": "release error p99 3.1-10.2 ms at 4.8 tokens/s",
    "gateway_cost": "CPU per token <= 1.15x the floor's at 64: 1.11 (met)",
    "gateway_workers": "gateway-2w 60,000",
}


def test_every_plot_is_tested() -> None:
    assert {p.figure for p in figures.PLOTS} == set(KEY_FIGURES)
    assert {n for p in figures.PLOTS for n in p.inputs} == set(SMALL)


@pytest.mark.parametrize("plot", figures.PLOTS, ids=lambda p: p.figure)
def test_each_plot_draws_an_svg_from_results_of_its_benchmarks_shape(
    plot: figures.Plot, tmp_path: Path
) -> None:
    path = tmp_path / f"{plot.figure}.svg"
    summary = plot.draw(*(SMALL[name] for name in plot.inputs), path)
    assert KEY_FIGURES[plot.figure] in summary
    svg = path.read_text()
    assert svg.startswith("<?xml") and "</svg>" in svg
    assert "?" in svg  # the title states the question, kept as text


def test_missing_results_are_named_with_their_command_and_the_rest_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, img = tmp_path / "results", tmp_path / "img"
    results.mkdir()
    (results / "2026-12-01-vllm-compare.json").write_text("{}")  # older: not drawn
    (results / "2026-12-06-vllm-compare.json").write_text(json.dumps(SMALL["vllm-compare"]))
    (results / "2026-12-06-routing-vllm-shared.json").write_text(json.dumps(routing("shared")))
    assert figures.main(["--results", str(results), "--img", str(img)]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in img.iterdir()) == ["vllm_compare.svg"]
    assert "from 2026-12-06-vllm-compare.json" in out
    assert "missing routing_vllm: no <date>-routing-vllm-history.json" in out
    assert "bench/gateway_load.py --targets direct,floor,gateway" in out
    assert "7 plot(s) without their results" in out


def test_the_committed_figures_are_what_their_committed_results_draw(tmp_path: Path) -> None:
    figures.main(["--img", str(tmp_path)])
    drawn = sorted(tmp_path.iterdir())
    assert drawn, "no committed results"
    for path in drawn:
        assert path.read_bytes() == (figures.IMG / path.name).read_bytes(), path.name


def test_the_committed_results_are_small() -> None:
    for path in figures.RESULTS.glob("*.json"):
        assert path.stat().st_size < 300_000, path.name
