"""`tokenpace bench qoe`: sweep request rates for several policies in the simulator.

Reproduces the Andes evaluation (§6.2-§6.3) on the simulated engine of :mod:`qos.sim`
(a simulation: no GPU runs here; the latency profile stands in for the hardware):
average QoE vs request rate (Fig. 10), capacity at average QoE ≥ 0.9 (§6.2.2) against
the theoretical bound TDS_actual / TDS_expected (§2.3), QoE/TTFT/TDS percentiles at one
rate (Table 4), token throughput and preemptions per request vs rate (Fig. 12-13) and
smooth goodput vs rate (Wang et al. Eq. 11). With ``--tenants``, price tiering: each
tenant's QoE, TTFT p90 and service against its weighted max-min fair share
(:mod:`qos.sim.shares`), and its share of service over time. Writes ``results.json``
and PNG plots, and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from qos.latency import PROFILES, LatencyProfile, get_profile
from qos.policy.reader import OVERDUE_AFTER_FCFS_WAITS, GuardSettings, chosen_guard
from qos.policy.registry import GUARDED, POLICIES, STOCK_POLICIES, make_policy
from qos.sim import (
    PROMPT_TOKEN_ESTIMATE,
    SPEAKING_TDS,
    SimRequest,
    build_workload,
    load_andes_trace,
    parse_tenants,
    parse_tier_mix,
    simulate,
)
from qos.sim.engine import SimResult
from qos.sim.shares import service_shares
from tokenpace.bench_plans import plan_references, verdicts

QOE_THRESHOLD = 0.9  # Andes §6.1: minimum acceptable average QoE
FROZEN_SHARE_MAX = 0.01  # stall-free: at most 1 % of replies freeze for over 2 s
OVERLOAD_FROZEN_MAX = 0.01  # under overload: at most 1 % of replies freeze for over 5 s

WORKLOADS = ("chat", "voice")


def guard_settings(cfg: dict[str, Any]) -> GuardSettings | None:
    """The reader guard's settings the flags chose (``--overdue-after-ttfts off``: never
    overdue), or None (:func:`qos.policy.reader.chosen_guard`). ValueError: one out of
    range."""
    overdue = cfg.get("overdue_after_ttfts")
    if overdue == "off":
        overdue = math.inf
    elif overdue is not None:
        try:
            overdue = float(overdue)
        except ValueError:
            raise ValueError(
                f"overdue_after_ttfts: must be a number of TTFTs > 0 or off, got {overdue!r}"
            ) from None
    return chosen_guard(
        overdue_after_ttfts=overdue,
        overdue_after_fcfs_waits=cfg.get("overdue_after_fcfs_waits"),
        lend_after_s=cfg.get("lend_after_s"),
    )


def run_one(args: tuple[str, float, dict]) -> dict:
    """One simulation (in a worker process): policy at rate on the configured workload."""
    policy_name, rate, cfg = args
    profile = bench_profile(cfg)
    entries = load_andes_trace(cfg["trace"])
    tier_mix = {"voice": (1.0, SPEAKING_TDS, 1.0)} if cfg["workload"] == "voice" else None
    if cfg.get("tier_mix"):
        tier_mix = parse_tier_mix(cfg["tier_mix"])
    tenants = parse_tenants(cfg["tenants"]) if cfg.get("tenants") else None
    workload = build_workload(
        entries,
        rate,
        arrivals=cfg["arrivals"],
        cv=cfg["cv"],
        seed=cfg["seed"],
        n=cfg["n"],
        tier_mix=tier_mix,
        tenants=tenants,
    )
    started = time.perf_counter()
    pause = policy_name not in STOCK_POLICIES
    guard = guard_settings(cfg)
    # the guard's flags set the guarded policies of the comparison; the others have no guard
    options = {"guard": guard} if guard is not None and policy_name in GUARDED else {}

    def simulate_one(requests: list[SimRequest]) -> SimResult:
        return simulate(
            requests,
            make_policy(policy_name, profile, **options),
            profile,
            preemption=cfg.get("preemption", "recompute"),
            pause=pause,
        )

    result = simulate_one(workload)
    summary = result.summary()
    summary.update(policy=policy_name, rate=rate, pause=pause, wall_s=time.perf_counter() - started)
    summary["expected_tds_mean"] = float(np.mean([r.tds for r in workload]))
    if tenants:
        weights = {name: w for name, w, _ in tenants}
        summary["tenants"] = tenant_results(result, weights)
        if policy_name == SHIPPED:
            for name, worth in plan_references(workload, weights, simulate_one).items():
                summary["tenants"][name].update(worth)
    return summary


def tenant_results(result: SimResult, weights: dict[str, float]) -> dict:
    """Per tenant: average QoE, TTFT p90, the share of its replies frozen over 2 s, its
    user idle latency p99 (Wang et al. Eq. 9), service against its weighted fair share; and
    the shares of service over time (10 s bins)."""
    shares = service_shares(result.requests, weights)
    over_time = shares.share_over_time()
    fair_fraction = shares.fair_fraction()
    out: dict = {"share_over_time": {"t_s": (shares.bin_edges[:-1] - shares.window[0]).tolist()}}
    for i, name in enumerate(shares.tenants):
        mine = [r for r in result.requests if r.tenant == name]
        qoe = [r.andes_qoe for r in mine]
        out[name] = {
            "weight": weights[name],
            "requests": len(mine),
            "avg_qoe": float(np.mean(qoe)) if qoe else None,
            "ttft_p90_s": float(np.percentile([r.actual_ttft for r in mine], 90)) if mine else None,
            "frozen_over_2s": float(np.mean([r.freezes.longest_s > 2.0 for r in mine]))
            if mine
            else None,
            "idle_p99_s": float(np.percentile([r.idle_s for r in mine], 99)) if mine else None,
            "service_share": float(shares.delivered[i] / shares.delivered.sum()),
            "fair_share": float(fair_fraction[i]),
            "service_vs_fair": shares.ratio(name),
            "backlogged": bool(shares.backlogged[i]),
        }
        out["share_over_time"][name] = [None if np.isnan(x) else float(x) for x in over_time[i]]
    return out


def bench_profile(cfg: dict) -> LatencyProfile:
    """The named profile, with the KV size, batch limit and swap cost the run overrides."""
    profile = get_profile(cfg["profile"])
    names = ("kv_capacity_tokens", "max_batch", "swap_per_token_s")
    overrides = {k: cfg[k] for k in names if cfg.get(k) is not None}
    if not overrides:
        return profile
    suffix = ",".join(f"{k}={v}" for k, v in overrides.items())
    return replace(profile, name=f"{profile.name}[{suffix}]", **overrides)


def capacity_at(rates: list[float], qoe: list[float], threshold: float = QOE_THRESHOLD) -> float:
    """Highest rate with average QoE ≥ threshold, interpolating linearly where it crosses."""
    best = 0.0
    for i, (rate, q) in enumerate(zip(rates, qoe, strict=True)):
        if q < threshold:
            if i > 0 and qoe[i - 1] >= threshold:
                r0, q0 = rates[i - 1], qoe[i - 1]
                best = r0 + (rate - r0) * (q0 - threshold) / (q0 - q)
            return best
        best = rate
    return best


def analyse(runs: list[dict], profile: LatencyProfile, table_rate: float | None) -> dict:
    """Capacities, the §2.3 bound, the Fig. 10 ratio and Table 4 from the raw runs."""
    by_policy: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: r["rate"]):
        by_policy.setdefault(run["policy"], []).append(run)
    capacity = {
        name: capacity_at([r["rate"] for r in rs], [r["avg_qoe"] for r in rs])
        for name, rs in by_policy.items()
    }
    out: dict = {"capacity_req_s": capacity}
    fcfs = by_policy.get("fcfs")
    if fcfs:
        # TDS_actual: the profile's per-request speed at FCFS's capacity, i.e. at the mean
        # batch of its first run past capacity (the engine saturated, as in §2.3 / Fig. 3b);
        # TDS_expected: the workload's mean expected TDS.
        past = [r for r in fcfs if r["rate"] > capacity["fcfs"]] or fcfs[-1:]
        at_cap = past[0]
        tds_actual = float(profile.tokens_per_s(max(at_cap["iterations"]["mean_batch"], 1.0)))
        tds_expected = at_cap["expected_tds_mean"]
        bound = tds_actual / tds_expected
        out["bound"] = {
            "tds_actual": tds_actual,
            "tds_expected": tds_expected,
            "ratio": bound,
            "saturated_rate": at_cap["rate"],
            "saturated_mean_batch": at_cap["iterations"]["mean_batch"],
        }
        for name, cap in capacity.items():
            if name != "fcfs" and capacity["fcfs"] > 0:
                ratio = cap / capacity["fcfs"]
                out[f"{name}_capacity_ratio"] = ratio
                out[f"{name}_share_of_bound"] = ratio / bound
        # Fig. 10: the first rate where FCFS drops to 0.35 or below, and each policy there.
        low = [r for r in fcfs if r["avg_qoe"] <= 0.35]
        if low:
            rate = low[0]["rate"]
            out["fcfs_collapse_rate"] = rate
            out["qoe_ratio_vs_fcfs_at_collapse"] = {
                name: next(r["avg_qoe"] for r in rs if r["rate"] == rate) / low[0]["avg_qoe"]
                for name, rs in by_policy.items()
                if any(r["rate"] == rate for r in rs)
            }
    # At the highest rate where Andes keeps average QoE ≥ 0.9: preemptions, throughput vs FCFS.
    for name, rs in by_policy.items():
        good = [r for r in rs if r["avg_qoe"] >= QOE_THRESHOLD]
        if name == "fcfs" or not good or not fcfs:
            continue
        top = good[-1]
        same = next((r for r in fcfs if r["rate"] == top["rate"]), None)
        out[f"{name}_at_highest_good_rate"] = {
            "rate": top["rate"],
            "preemptions_per_request": top["preemptions_per_request"],
            "throughput_tok_s": top["throughput_tok_s"],
            "fcfs_throughput_tok_s": same["throughput_tok_s"] if same else None,
            "throughput_vs_fcfs": top["throughput_tok_s"] / same["throughput_tok_s"]
            if same
            else None,
        }
    out["reader"] = analyse_reader(by_policy)
    tiering = analyse_tiering(by_policy)
    if tiering:
        out["tiering"] = tiering
    if table_rate is not None:
        out["table4"] = {
            name: {k: r[k] for k in ("avg_qoe", "qoe", "ttft_s", "tds")}
            for name, rs in by_policy.items()
            for r in rs
            if r["rate"] == table_rate
        }
    return out


def stall_free_capacity(runs: list[dict]) -> float:
    """Highest rate with average QoE ≥ 0.9 and at most 1 % of replies freezing for over
    2 s (each criterion interpolated where it crosses; the first to fail decides)."""
    rates = [r["rate"] for r in runs]
    qoe = capacity_at(rates, [r["avg_qoe"] for r in runs])
    frozen = [-r["reader"]["frozen_over_2s"] for r in runs]
    return min(qoe, capacity_at(rates, frozen, -FROZEN_SHARE_MAX))


def analyse_reader(by_policy: dict[str, list[dict]]) -> dict:
    """What the readers saw, against FCFS in the same run: stall-free capacity, peak
    smooth goodput, and, for every other policy, the light-load checks (rates where FCFS
    keeps QoE ≥ 0.9) and the overload checks (rates past FCFS's stall-free capacity, up
    to twice it)."""
    out: dict = {
        "stall_free_capacity_req_s": {n: stall_free_capacity(rs) for n, rs in by_policy.items()},
        "peak_smooth_goodput": {
            n: max(r["smooth_goodput"] for r in rs) for n, rs in by_policy.items()
        },
    }
    fcfs = {r["rate"]: r for r in by_policy.get("fcfs", [])}
    if not fcfs:
        return out
    fcfs_cap = out["stall_free_capacity_req_s"]["fcfs"]
    limit = 2 * fcfs_cap
    for name, rs in by_policy.items():
        if name == "fcfs":
            continue
        light, overload = [], []
        for run in rs:
            base = fcfs.get(run["rate"])
            if base is None:
                continue
            row = {
                "rate": run["rate"],
                "avg_qoe": run["avg_qoe"],
                "fcfs_avg_qoe": base["avg_qoe"],
                "throughput_vs_fcfs": run["throughput_tok_s"] / base["throughput_tok_s"],
            }
            if base["avg_qoe"] >= QOE_THRESHOLD:
                row["ok"] = (
                    run["avg_qoe"] >= base["avg_qoe"] - 0.005 and row["throughput_vs_fcfs"] >= 0.97
                )
                light.append(row)
            if fcfs_cap < run["rate"] <= limit:
                row = {
                    **row,
                    "frozen_over_5s": run["reader"]["frozen_over_5s"],
                    "idle_p99_s": run["reader"]["idle_p99_s"],
                    "fcfs_idle_p99_s": base["reader"]["idle_p99_s"],
                }
                row["ok"] = (
                    row["frozen_over_5s"] <= OVERLOAD_FROZEN_MAX
                    and run["avg_qoe"] >= base["avg_qoe"]
                    and row["idle_p99_s"] <= row["fcfs_idle_p99_s"]
                    and row["throughput_vs_fcfs"] >= 0.95
                )
                overload.append(row)
        fcfs_peak = out["peak_smooth_goodput"]["fcfs"]
        out[name] = {
            "stall_free_capacity_vs_fcfs": out["stall_free_capacity_req_s"][name] / fcfs_cap
            if fcfs_cap > 0
            else None,
            "peak_smooth_goodput_vs_fcfs": out["peak_smooth_goodput"][name] / fcfs_peak
            if fcfs_peak > 0
            else None,
            "light_load": light,
            "overload_up_to_req_s": limit,
            "overload": overload,
        }
    return out


SHIPPED, UNWEIGHTED = "andes-tp", "andes-tp-unweighted"
FAIR_TOLERANCE = 0.15  # a backlogged tenant's service within 15 % of its fair share


def analyse_tiering(by_policy: dict[str, list[dict]]) -> dict:
    """At each rate with tenants: the shipped policy against the plans' targets
    (:mod:`tokenpace.bench_plans`): per tenant its QoE, frozen share, TTFT p90 and idle
    p99, the unweighted policy's QoE in the same run and what its plan is worth (its
    share, its QoE alone), with the verdicts."""
    out = {}
    shipped = {r["rate"]: r for r in by_policy.get(SHIPPED, []) if "tenants" in r}
    blind = {r["rate"]: r for r in by_policy.get(UNWEIGHTED, []) if "tenants" in r}
    kept = (
        "weight",
        "avg_qoe",
        "frozen_over_2s",
        "ttft_p90_s",
        "idle_p99_s",
        "share_avg_qoe",
        "share_frozen_over_2s",
        "share_idle_p99_s",
        "alone_avg_qoe",
    )
    for rate, run in shipped.items():
        base = blind.get(rate)
        tenants = {}
        for name, t in run["tenants"].items():
            if name == "share_over_time":
                continue
            row = {k: t.get(k) for k in kept}
            other = base["tenants"][name] if base else {}
            row["unweighted_avg_qoe"] = other.get("avg_qoe")
            row["unweighted_frozen_over_2s"] = other.get("frozen_over_2s")
            tenants[name] = row
        total = run["avg_qoe"] / base["avg_qoe"] if base else None
        out[str(rate)] = {"tenants": tenants, **verdicts(tenants, total)}
    return out


def plot_transfer(runs: list[dict], out_dir: Path, title: str) -> Path:
    """Each plan's QoE under the shipped policy less the unweighted policy's in the same
    run, against the request rate: what the weights move between plans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shipped = sorted((r for r in runs if r["policy"] == SHIPPED and "tenants" in r), key=_rate)
    blind = {r["rate"]: r for r in runs if r["policy"] == UNWEIGHTED and "tenants" in r}
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    names = [k for k in shipped[0]["tenants"] if k != "share_over_time"] if shipped else []
    for name in names:
        pairs = [(r["rate"], r["tenants"][name]["avg_qoe"]) for r in shipped]
        xs = [x for x, _ in pairs if x in blind]
        ys = [q - blind[x]["tenants"][name]["avg_qoe"] for x, q in pairs if x in blind]
        weight = shipped[0]["tenants"][name]["weight"]
        ax.plot(xs, ys, marker="o", label=f"{name} (w={weight:g})")
    ax.axhline(0.0, color="grey", linewidth=1)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("QoE, weighted − unweighted")
    ax.set_title(f"QoE moved between plans · {title}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "plans_transfer.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rate(run: dict) -> float:
    return float(run["rate"])


def summary_table(runs: list[dict]) -> str:
    """One line per run (rate, then policy): QoE, throughput, preemptions, what the
    readers saw, and per tenant QoE / on its weighted share of the engine / alone on the
    whole engine / TTFT p90 / replies freezing over 2 s / idle p99."""
    tenants = next((r["tenants"] for r in runs if "tenants" in r), None)
    names = [k for k in tenants if k != "share_over_time"] if tenants else []
    head = (
        f"{'rate':>5} {'policy':<20} {'avg QoE':>7} {'tok/s':>6} {'pre/req':>7} "
        f"{'frozen>2s':>9} {'>10s':>6} {'idle p99':>8} {'goodput':>7}"
    )
    for name in names:
        head += (
            f" | {name + ' QoE':>9} {'share':>5} {'alone':>5} {'TTFT p90':>8} {'frozen':>6} "
            f"{'idle p99':>8}"
        )
    lines = [head, "-" * len(head)]
    for run in sorted(runs, key=lambda r: (r["rate"], r["policy"])):
        seen = run["reader"]
        line = (
            f"{run['rate']:>5g} {run['policy']:<20} {run['avg_qoe']:>7.3f} "
            f"{run['throughput_tok_s']:>6.0f} {run['preemptions_per_request']:>7.2f} "
            f"{seen['frozen_over_2s']:>9.1%} {seen['frozen_over_10s']:>6.1%} "
            f"{seen['idle_p99_s']:>7.1f}s {run['smooth_goodput']:>7.0f}"
        )
        for name in names:
            t = run["tenants"][name]
            worth = " ".join(
                f"{t[k]:>5.2f}" if t.get(k) is not None else f"{'-':>5}"
                for k in ("share_avg_qoe", "alone_avg_qoe")
            )
            line += (
                f" | {t['avg_qoe']:>9.3f} {worth} {t['ttft_p90_s']:>7.1f}s "
                f"{t['frozen_over_2s']:>6.1%} {t['idle_p99_s']:>7.1f}s"
            )
        lines.append(line)
    return "\n".join(lines)


def plot_service_share(runs: list[dict], out_dir: Path, rate: float, title: str) -> Path:
    """Each tenant's share of service over time, one panel per policy, at ``rate``; dashed:
    its fair share over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in runs if r["rate"] == rate and "tenants" in r]
    fig, axes = plt.subplots(
        len(chosen), 1, figsize=(6.5, 2.2 * len(chosen)), sharex=True, squeeze=False
    )
    for ax, run in zip(axes[:, 0], chosen, strict=True):
        series = run["tenants"]["share_over_time"]
        for i, name in enumerate(k for k in run["tenants"] if k != "share_over_time"):
            values = [np.nan if v is None else v for v in series[name]]
            color = f"C{i}"
            weight = run["tenants"][name]["weight"]
            ax.plot(series["t_s"], values, color=color, label=f"{name} (w={weight:g})")
            ax.axhline(run["tenants"][name]["fair_share"], color=color, linestyle="--", lw=1)
        ax.set_ylim(0, 1)
        ax.set_ylabel("share")
        ax.set_title(run["policy"], fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("time since the first arrival (s)")
    fig.suptitle(f"service share over time, {rate:g} req/s · {title}", fontsize=9)
    fig.tight_layout()
    path = out_dir / "service_share.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _field(run: dict, key: str) -> float:
    """``run[key]``, or a nested ``run[a][b]`` for a key ``"a.b"``."""
    value: object = run
    for part in key.split("."):
        assert isinstance(value, dict)
        value = value[part]
    assert isinstance(value, int | float)
    return float(value)


def plot(runs: list[dict], out_dir: Path, title: str) -> list[Path]:
    """Fig. 10, 12, 13, smooth goodput, the freezing share and idle latency p99 vs rate,
    one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {
        "avg_qoe.png": ("avg_qoe", "average QoE (Andes Eq. 1)"),
        "throughput.png": ("throughput_tok_s", "token throughput (tokens/s)"),
        "preemptions.png": ("preemptions_per_request", "preemptions per request"),
        "smooth_goodput.png": ("smooth_goodput", "smooth goodput (benefit/s)"),
        "avg_monotone_qoe.png": ("avg_monotone_qoe", "average monotone QoE"),
        "frozen_share.png": ("reader.frozen_over_2s", "replies freezing for over 2 s"),
        "idle_p99.png": ("reader.idle_p99_s", "user idle latency p99 (s, Wang et al. Eq. 9)"),
    }
    paths = []
    for filename, (key, label) in figures.items():
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for name in dict.fromkeys(r["policy"] for r in runs):
            rs = sorted((r for r in runs if r["policy"] == name), key=lambda r: r["rate"])
            ax.plot([r["rate"] for r in rs], [_field(r, key) for r in rs], marker="o", label=name)
        if key == "avg_qoe":
            ax.axhline(QOE_THRESHOLD, color="grey", linestyle=":", linewidth=1)
            ax.set_ylim(0, 1.05)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenpace bench qoe", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        default="fcfs,round-robin,andes",
        help=f"comma-separated, of: {', '.join(POLICIES)} (default: %(default)s)",
    )
    parser.add_argument(
        "--rates",
        default="1.5,2,2.5,3,3.5,4",
        help="requests/s, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="opt-66b-4xa100",
        help="latency profile of the simulated engine (qos.latency; default: %(default)s)",
    )
    parser.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="override the profile's KV capacity M (default: the profile's)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="override the profile's batch limit (default: the profile's)",
    )
    parser.add_argument(
        "--swap-s-per-token",
        type=float,
        default=None,
        help="override the profile's swap cost: seconds per token, each way "
        "(bench/kv_swap_cost.py measures it on a GPU)",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="chat",
        help="the trace's own expectations (chat) or all voice (default: %(default)s)",
    )
    parser.add_argument(
        "--tier-mix",
        default=None,
        help="tiers by share, e.g. chat=0.5,voice=0.3,fast=0.2 (overrides --workload)",
    )
    parser.add_argument(
        "--tenants",
        default=None,
        help="NAME:WEIGHT:SHARE,... e.g. free:1:0.33,pro:2:0.33,ent:4:0.34",
    )
    parser.add_argument(
        "--arrivals",
        choices=("poisson", "gamma"),
        default="poisson",
        help="Poisson, or bursty Gamma with --cv (default: %(default)s)",
    )
    parser.add_argument(
        "--cv",
        type=float,
        default=3.0,
        help="gamma arrivals' coefficient of variation (default: %(default)s)",
    )
    parser.add_argument("--n", type=int, default=None, help="requests (default: the whole trace)")
    parser.add_argument(
        "--seed", type=int, default=0, help="draws arrivals, tiers, tenants (default: %(default)s)"
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="Andes trace: the authors' JSON or a CSV (default: the shipped CSV)",
    )
    parser.add_argument(
        "--table-rate", type=float, default=None, help="rate for Table 4 percentiles"
    )
    parser.add_argument(
        "--preemption",
        choices=("recompute", "swap"),
        default="recompute",
        help="what a request that loses its KV pays: a recompute, or a swap to host memory "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--lend-after-s",
        type=float,
        default=None,
        help="andes-tp: replies whose readers need nothing for this long lend their KV "
        "to fresh requests (default: every started reply keeps its KV reserved)",
    )
    parser.add_argument(
        "--overdue-after-ttfts",
        default=None,
        help="andes-tp: waiting requests past this many TTFTs go first, oldest first "
        "('off': the solver's order only; default: the policy's, 10)",
    )
    parser.add_argument(
        "--overdue-after-fcfs-waits",
        type=float,
        default=None,
        help="andes-tp: ... and past this many times what FCFS would make a new request "
        f"wait (0: the TTFTs alone; default: the policy's, {OVERDUE_AFTER_FCFS_WAITS:g})",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="simulations run at once (default: the CPUs, %(default)s)",
    )
    parser.add_argument(
        "--out",
        default="results/qoe",
        help="folder for results.json and plots (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
    try:
        rates = sorted(float(r) for r in args.rates.split(","))
    except ValueError:
        raise SystemExit(f"--rates: expected comma-separated numbers, got {args.rates!r}") from None
    if not rates or min(rates) <= 0:
        raise SystemExit("--rates: every rate must be > 0")
    guard_flags = [
        flag
        for flag, value in (
            ("--lend-after-s", args.lend_after_s),
            ("--overdue-after-ttfts", args.overdue_after_ttfts),
            ("--overdue-after-fcfs-waits", args.overdue_after_fcfs_waits),
        )
        if value is not None
    ]
    if guard_flags and not GUARDED & set(policies):
        raise SystemExit(
            f"{', '.join(guard_flags)}: the reader guard's settings, and no policy of "
            f"--policies has the guard; add one of {', '.join(sorted(GUARDED))}"
        )
    cfg = {
        "profile": args.profile,
        "kv_capacity_tokens": args.kv_tokens,
        "max_batch": args.max_batch,
        "swap_per_token_s": args.swap_s_per_token,
        "workload": args.workload,
        "arrivals": args.arrivals,
        "cv": args.cv,
        "n": args.n,
        "seed": args.seed,
        "trace": args.trace,
        "tier_mix": args.tier_mix,
        "tenants": args.tenants,
        "preemption": args.preemption,
        "lend_after_s": args.lend_after_s,
        "overdue_after_ttfts": args.overdue_after_ttfts,
        "overdue_after_fcfs_waits": args.overdue_after_fcfs_waits,
    }
    try:
        if args.tier_mix:
            parse_tier_mix(args.tier_mix)
    except ValueError as exc:
        raise SystemExit(f"--tier-mix: {exc}") from None
    try:
        if args.tenants:
            parse_tenants(args.tenants)
    except ValueError as exc:
        raise SystemExit(f"--tenants: {exc}") from None
    try:
        guard_settings(cfg)
    except ValueError as exc:
        raise SystemExit(f"{', '.join(guard_flags)}: {exc}") from None
    try:
        profile = bench_profile(cfg)
    except ValueError as exc:
        raise SystemExit(f"--profile/--kv-tokens/--max-batch/--swap-s-per-token: {exc}") from None
    table_rate = args.table_rate if args.table_rate is not None else rates[len(rates) // 2]
    jobs = [(p, r, cfg) for r in reversed(rates) for p in policies]  # slowest first
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        runs = list(tqdm(pool.map(run_one, jobs), total=len(jobs), desc="simulating", unit="run"))
    elapsed = time.perf_counter() - started
    workload = args.tier_mix or args.workload
    title = f"{workload} · {profile.name} · {args.arrivals} (simulated)"
    report = {
        "simulation": "qos.sim discrete-event engine; latency from the named profile, no GPU",
        "config": {**cfg, "rates": rates, "policies": policies},
        "prompt_tokens": PROMPT_TOKEN_ESTIMATE,
        "wall_s": elapsed,
        "analysis": analyse(runs, profile, table_rate),
        "runs": runs,
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    plots = plot(runs, out_dir, title)
    if args.tenants:
        plots.append(plot_service_share(runs, out_dir, table_rate, title))
        plots.append(plot_transfer(runs, out_dir, title))
    print(summary_table(runs))
    reader = report["analysis"]["reader"]
    print(f"stall_free_capacity_req_s: {json.dumps(reader['stall_free_capacity_req_s'])}")
    for key in ("capacity_req_s", "tiering"):
        if key in report["analysis"]:
            print(f"{key}: {json.dumps(report['analysis'][key])}")
    print(
        f"{len(runs)} runs in {elapsed:.1f} s; wrote {out_dir / 'results.json'}, {len(plots)} plots"
    )
    return 0
