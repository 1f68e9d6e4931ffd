"""Reader signals: what telling the engine about its readers buys (a simulation: the
latency profiles stand in for the hardware).

Every point runs one workload three times side by side on the same simulated engine,
with the same readers (:mod:`qos.sim.readers`: a share of them goes away once mid-reply,
for a drawn time, and comes back):

- ``fcfs``: first come, first served (stock vLLM: a request left out loses its KV);
- ``andes-tp``: the shipped policy, pausing with the KV kept, not told of the readers
  (they still go away: the client's display stops, the engine's model runs on);
- ``andes-tp+signals``: the same policy, told by each client what the SDKs send.

Measures are the readers' own, counting only the time they watch: Andes QoE on the
watched clock (all readers; those who never went away; those who did), the share of
replies frozen over 2 s while watched and the longest such freeze (the return included),
user idle latency p99, tokens/s, TTFT p50/p90. Per policy, the stall-free capacity:
the highest rate with average watched QoE >= 0.9 and no reply frozen over 2 s while
watched (interpolated where QoE crosses), and the capacity ratio with/without signals::

    nice -n 10 .venv/bin/python bench/reader_signals.py --out results/reader_signals
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qos.latency import LatencyProfile
from qos.metrics import reader_summary
from qos.policy.registry import STOCK_POLICIES, make_policy
from qos.sim.engine import simulate
from qos.sim.readers import ReaderModel, ReaderSim
from qos.sim.workload import TraceEntry, build_workload, load_andes_trace
from tokenpace.bench_qoe import QOE_THRESHOLD, capacity_at

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import ENGINES, SLOW_ENGINE, engine_ceiling


@dataclass(frozen=True)
class Variant:
    """A policy, and whether the engine hears the clients' signals."""

    name: str
    policy: str
    signals: bool


VARIANTS = (
    Variant("fcfs", "fcfs", False),
    Variant("andes-tp", "andes-tp", False),
    Variant("andes-tp+signals", "andes-tp", True),
)
WITHOUT, WITH = "andes-tp", "andes-tp+signals"

PROFILES = ("opt-66b-4xa100", "llama-3.1-8b-h100", SLOW_ENGINE.name)
LOADS = (0.6, 0.8, 0.9, 1.0, 1.05, 1.1, 1.2, 1.4)  # of the engine's ceiling
QUICK_LOADS = (0.8, 1.1)
REQUESTS = {"opt-66b-4xa100": 1500, "llama-3.1-8b-h100": 3000, SLOW_ENGINE.name: 1500}
FROZEN_S = 2.0


def run(
    variant: Variant,
    profile: LatencyProfile,
    entries: list[TraceEntry],
    rate: float,
    model: ReaderModel,
    requests: int,
    seed: int,
) -> dict[str, Any]:
    """One variant at ``rate``: what its readers saw (module doc)."""
    workload = build_workload(entries, rate, seed=seed, n=requests)
    readers = ReaderSim(workload, model, signals=variant.signals, seed=seed)
    started = time.perf_counter()
    result = simulate(
        workload,
        make_policy(variant.policy, profile),
        profile,
        pause=variant.policy not in STOCK_POLICIES,
        readers=readers,
    )
    wall_s = time.perf_counter() - started
    by_id = {r.id: r for r in workload}
    seen = [readers.outcome(by_id[r.id]) for r in result.requests]
    qoe = np.array([o.qoe for o in seen])
    away = np.array([o.went_away for o in seen])
    summary = reader_summary([o.freezes.longest_s for o in seen], [o.idle_s for o in seen])
    ttft = np.array([r.actual_ttft for r in result.requests])
    # what was generated, the replies of readers who left included (they are charged)
    tokens = result.output_tokens + sum(readers.left.values())
    return {
        "policy": variant.name,
        "rate": rate,
        "qoe_watched": float(qoe.mean()),
        "qoe_watched_p10": float(np.percentile(qoe, 10)),
        "qoe_never_away": float(qoe[~away].mean()) if (~away).any() else None,
        "qoe_went_away": float(qoe[away].mean()) if away.any() else None,
        "frozen_over_2s": summary.frozen_share[FROZEN_S],
        "longest_freeze_s": summary.longest_freeze_s,
        "idle_p99_s": summary.idle_p99_s,
        "tok_s": tokens / result.makespan,
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p90_s": float(np.percentile(ttft, 90)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "signals": readers.sent,
        "left": len(readers.left),
        "decision_ms_p99": result.summary()["iterations"]["decision_ms_p99"],
        "wall_s": wall_s,
    }


def capacity(runs: list[dict[str, Any]]) -> float:
    """Stall-free capacity (module doc): the lower of the rate where watched QoE
    crosses 0.9 and the highest rate with no reply frozen over 2 s while watched."""
    rates = [r["rate"] for r in runs]
    by_qoe = capacity_at(rates, [r["qoe_watched"] for r in runs], QOE_THRESHOLD)
    by_freezes = capacity_at(rates, [-r["frozen_over_2s"] for r in runs], 0.0)
    return min(by_qoe, by_freezes)


def sweep_profile(
    name: str,
    entries: list[TraceEntry],
    loads: tuple[float, ...],
    model: ReaderModel,
    requests: int,
    seed: int,
) -> dict[str, Any]:
    """Every variant at every load on one profile, the capacities and the verdicts."""
    profile = ENGINES[name]
    ceiling = engine_ceiling(profile, entries)
    rows: dict[str, list[dict[str, Any]]] = {v.name: [] for v in VARIANTS}
    for load in loads:
        rate = round(load * ceiling, 4)
        for variant in VARIANTS:
            row = run(variant, profile, entries, rate, model, requests, seed)
            row["load"] = load
            rows[variant.name].append(row)
            print(_line(name, row), flush=True)
    capacities = {v: capacity(rs) for v, rs in rows.items()}
    without = capacities[WITHOUT]
    worse = [
        w["rate"]
        for w, o in zip(rows[WITH], rows[WITHOUT], strict=True)
        if w["qoe_never_away"] is not None and w["qoe_never_away"] < o["qoe_never_away"]
    ]
    return {
        "profile": name,
        "ceiling_req_s": ceiling,
        "requests": requests,
        "capacity_req_s": capacities,
        "capacity_ratio": capacities[WITH] / without if without > 0 else None,
        "rates_where_watching_qoe_lower": worse,
        "replies_frozen_over_2s_with_signals": max(r["frozen_over_2s"] for r in rows[WITH]),
        "runs": rows,
    }


def _line(profile: str, r: dict[str, Any]) -> str:
    return (
        f"{profile:22s} load {r['load']:.2f} {r['policy']:17s} qoe {r['qoe_watched']:.3f} "
        f"(watching {r['qoe_never_away'] or 0:.3f}, away {r['qoe_went_away'] or 0:.3f}) "
        f"frozen>2s {r['frozen_over_2s']:.3f} longest {r['longest_freeze_s']:.1f}s "
        f"idle p99 {r['idle_p99_s']:.1f}s tok/s {r['tok_s']:.0f} ttft p50/p90 "
        f"{r['ttft_p50_s']:.1f}/{r['ttft_p90_s']:.1f}s signals {r['signals']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a test-sized run")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated")
    parser.add_argument("--away-share", type=float, default=0.3, help="readers away (0.3)")
    parser.add_argument("--away-s", default="10,60", help="how long away, uniform (10,60)")
    parser.add_argument("--jitter-s", type=float, default=0.0, help="mean network delay")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/reader_signals"))
    args = parser.parse_args(argv)
    names = args.profiles.split(",")
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        parser.error(f"--profiles: unknown {unknown}; choose from {sorted(ENGINES)}")
    try:
        low, high = (float(x) for x in args.away_s.split(","))
        model = ReaderModel(away_share=args.away_share, away_s=(low, high), jitter_s=args.jitter_s)
    except ValueError as exc:
        parser.error(f"--away-share/--away-s/--jitter-s: {exc}")
    entries = load_andes_trace()
    loads = QUICK_LOADS if args.quick else LOADS
    started = time.perf_counter()
    profiles = [
        sweep_profile(name, entries, loads, model, 300 if args.quick else REQUESTS[name], args.seed)
        for name in names
    ]
    out = {
        "readers": {
            "away_share": model.away_share,
            "away_s": model.away_s,
            "jitter_s": model.jitter_s,
        },
        "profiles": profiles,
        "wall_s": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(out, indent=1))
    for p in profiles:
        print(
            f"{p['profile']}: capacity {json.dumps(p['capacity_req_s'])} ratio "
            f"{p['capacity_ratio']}; watching QoE lower with signals at "
            f"{p['rates_where_watching_qoe_lower']}; "
            f"frozen>2s with signals (max share) {p['replies_frozen_over_2s_with_signals']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
