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
    """One target: where it applies, its value at a point, and the limit the value must
    stay within (at most, or at least, ``limit``)."""

    name: str
    applies: Callable[[dict[str, Any]], bool]
    value: Callable[[dict[str, Any]], float]
    limit: float
    at_most: bool
    points: list[tuple[str, float]] = field(default_factory=list)  # (label, value)

    def met(self, value: float) -> bool:
        if self.at_most:
            return value <= self.limit + 1e-9
        return value >= self.limit - 1e-9

    def worst(self, values: list[float]) -> float:
        return max(values) if self.at_most else min(values)


def targets() -> list[Target]:
    def served_well(row: dict[str, Any]) -> bool:
        return bool(row["served_well_unweighted"])

    def shortfall(row: dict[str, Any]) -> bool:
        return not served_well(row)

    loses = NOBODY_LOSES_MAX
    return [
        Target(
            f"nobody loses: largest QoE change ≤ {loses}",
            served_well,
            lambda row: float(row["largest_change"]),
            loses,
            at_most=True,
        ),
        Target(
            f"... largest QoE loss ≤ {loses}",
            served_well,
            lambda row: float(row["largest_loss"]),
            loses,
            at_most=True,
        ),
        Target(
            "shortfall: QoE ordered by weight",
            shortfall,
            lambda row: float(row["ordered_by_weight"]),
            1.0,
            at_most=False,
        ),
        Target(
            f"shortfall: total ≥ {TOTAL_MIN:.0%} of unweighted",
            shortfall,
            lambda row: float(row["total_vs_unweighted"]),
            TOTAL_MIN,
            at_most=False,
        ),
        Target(
            f"shortfall: highest weight, fitting its share, within {loses} of alone",
            lambda row: shortfall(row) and "top_below_alone" in row,
            lambda row: float(row["top_below_alone"]),
            loses,
            at_most=True,
        ),
        Target(
            f"isolation: plans fitting their share ≥ {ISOLATION_QOE}",
            lambda row: bool(row["fit_share"]),
            lambda row: min(row["tenants"][k]["avg_qoe"] for k in row["fit_share"]),
            ISOLATION_QOE,
            at_most=False,
        ),
        Target(
            "no reply frozen over 2 s, every plan (largest share)",
            lambda row: True,
            lambda row: max(t["frozen_over_2s"] for t in row["tenants"].values()),
            0.0,
            at_most=True,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="result directories (results.json)")
    args = parser.parse_args(argv)
    table = targets()
    reports = 0
    for directory in args.runs:
        try:
            report = json.loads((directory / "results.json").read_text())
            tiering = report["analysis"].get("tiering", {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SystemExit(
                f"{directory}: no readable results.json of `tokenpace bench qoe` ({exc})"
            ) from None
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
