"""The price plans' targets over many `tokenpace bench qoe --tenants` runs: seeds,
arrival processes, tenant mixes and rates (docs/benchmarks.md, "Price plans").

Each run directory holds the `results.json` of one sweep with `andes-tp` and
`andes-tp-unweighted`; the verdicts at each rate are the benchmark's own
(`tokenpace/bench_plans.py`). One seed is one draw of arrivals, tiers and tenants: a
target met at seed 0 alone can be luck, so the sweeps run over several and this prints,
per target, at how many points it applies, how many meet it, the worst value and the
points that miss (named by their directory and rate)::

    .venv/bin/python bench/plans_targets.py results/plans-*-s*
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpace.bench_plans import ISOLATION_QOE, NOBODY_LOSES_MAX, TOTAL_MIN


@dataclass
class Target:
    """One target: where it applies, its value at a point, and whether that meets it."""

    name: str
    applies: Callable[[dict[str, Any]], bool]
    value: Callable[[dict[str, Any]], float]
    met: Callable[[float], bool]
    worst: Callable[[list[float]], float]
    points: list[tuple[str, float]] = field(default_factory=list)  # (label, value)


def targets() -> list[Target]:
    def shortfall(row: dict[str, Any]) -> bool:
        return not row["served_well_unweighted"]

    return [
        Target(
            f"nobody loses: largest QoE change ≤ {NOBODY_LOSES_MAX}",
            lambda row: bool(row["served_well_unweighted"]),
            lambda row: float(row["largest_change"]),
            lambda v: v <= NOBODY_LOSES_MAX + 1e-9,
            max,
        ),
        Target(
            f"... largest QoE loss ≤ {NOBODY_LOSES_MAX}",
            lambda row: bool(row["served_well_unweighted"]),
            lambda row: float(row["largest_loss"]),
            lambda v: v <= NOBODY_LOSES_MAX + 1e-9,
            max,
        ),
        Target(
            "shortfall: QoE ordered by weight",
            shortfall,
            lambda row: float(row["ordered_by_weight"]),
            lambda v: v == 1.0,
            min,
        ),
        Target(
            f"shortfall: total ≥ {TOTAL_MIN:.0%} of unweighted",
            shortfall,
            lambda row: float(row["total_vs_unweighted"]),
            lambda v: v >= TOTAL_MIN - 1e-9,
            min,
        ),
        Target(
            f"shortfall: highest weight, fitting its share, within {NOBODY_LOSES_MAX} of alone",
            lambda row: shortfall(row) and "top_below_alone" in row,
            lambda row: float(row["top_below_alone"]),
            lambda v: v <= NOBODY_LOSES_MAX + 1e-9,
            max,
        ),
        Target(
            f"isolation: plans fitting their share ≥ {ISOLATION_QOE}",
            lambda row: bool(row["fit_share"]),
            lambda row: min(row["tenants"][k]["avg_qoe"] for k in row["fit_share"]),
            lambda v: v >= ISOLATION_QOE - 1e-9,
            min,
        ),
        Target(
            "no reply frozen over 2 s, every plan (largest share)",
            lambda row: True,
            lambda row: max(t["frozen_over_2s"] for t in row["tenants"].values()),
            lambda v: v == 0.0,
            max,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="result directories (results.json)")
    args = parser.parse_args(argv)
    table = targets()
    reports = 0
    for directory in args.runs:
        report = json.loads((directory / "results.json").read_text())
        tiering = report["analysis"].get("tiering", {})
        if not tiering:
            raise SystemExit(f"{directory}: no tenants' analysis (run with --tenants)")
        reports += 1
        for rate, row in tiering.items():
            if "total_vs_unweighted" not in row:
                raise SystemExit(f"{directory}: andes-tp-unweighted missing at {rate} req/s")
            for target in table:
                if target.applies(row):
                    point = f"{directory.name} @ {float(rate):g}"
                    target.points.append((point, target.value(row)))
    print(f"{reports} sweeps\n")
    print("| target | points | met | worst | misses |")
    print("| --- | --- | --- | --- | --- |")
    for target in table:
        values = [v for _, v in target.points]
        misses = [f"{name}: {v:.3f}" for name, v in target.points if not target.met(v)]
        worst = f"{target.worst(values):.3f}" if values else "-"
        met = sum(target.met(v) for v in values)
        print(f"| {target.name} | {len(values)} | {met} | {worst} | {'; '.join(misses)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
