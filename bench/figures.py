"""The benchmarks page's plots, one per question, redrawn from the raw results kept in
the repository.

Each section of docs/benchmarks.md that measures something keeps the JSON its own
benchmark wrote (``--out``; per-request arrays dropped) under
``docs/benchmarks/results/``, named ``<date>-<name>.json``; the newest of each name is
drawn to ``docs/img/<figure>.svg``::

    .venv/bin/python bench/figures.py                  # every plot whose JSON is there
    .venv/bin/python bench/figures.py --only vllm_compare

A plot whose JSON is missing is named, with the command that writes it, and skipped.
Each drawing prints one line with its key figures (for the image's alt text). The SVGs
keep their text as text and carry no date (Matplotlib, the ``bench`` extra), so the same
JSON draws the same bytes. Where a benchmark compares against a baseline (FCFS, today's
routing, the stack floor), the baseline is drawn beside tokenpace in the same plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"

BASELINE_COLOR = "#c0392b"  # FCFS, today's routing, the stack floor
TOKENPACE_COLOR = "#1f6fb2"
OTHER_COLORS = ("#7f7f7f", "#2ca02c", "#9467bd")

Data = dict[str, Any]


def pyplot():  # type: ignore[no-untyped-def]
    """Matplotlib's pyplot on the Agg backend, set to write reproducible SVG."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "tokenpace"
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, diffable
    import matplotlib.pyplot as plt

    return plt


def save_svg(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    """Write ``fig`` as SVG without a date or creator (the same figure, the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
    pyplot().close(fig)


# --- ratios against a baseline, per repeat -------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One measure drawn as tokenpace's value over the baseline's."""

    key: str
    label: str  # with the direction that is better: ↑ higher, ↓ lower


def ratio_panel(
    ax,  # type: ignore[no-untyped-def]
    metrics: Sequence[Metric],
    baseline: Data,
    ours: Data,
    baseline_runs: Sequence[Data],
    our_runs: Sequence[Data],
) -> list[float]:
    """Per metric, the medians' ratio (a bar) and each repeat's (points: repeat i over
    the baseline's repeat i, run beside it), with a line at 1; the medians' ratios."""
    medians = [ours[m.key] / baseline[m.key] for m in metrics]
    top = max(medians)
    xs = range(len(metrics))
    ax.bar(xs, medians, width=0.55, color=TOKENPACE_COLOR, alpha=0.35, label="medians' ratio")
    for i, m in enumerate(metrics):
        repeats = [o[m.key] / b[m.key] for b, o in zip(baseline_runs, our_runs, strict=False)]
        ax.plot(
            [i] * len(repeats),
            repeats,
            "o",
            color=TOKENPACE_COLOR,
            markersize=4,
            label="each repeat" if i == 0 else None,
        )
        top = max(top, *repeats)
        ax.annotate(
            f"{medians[i]:.2f}×",
            (i + 0.3, medians[i]),
            ha="left",
            va="center",
            fontsize=7,
        )
    ax.axhline(1.0, color=BASELINE_COLOR, linewidth=1.5, label="baseline = 1")
    ax.set_xticks(list(xs), [m.label for m in metrics], fontsize=8)
    ax.set_xlabel("↑ higher is better, ↓ lower is better", fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, top * 1.3)  # room for the legend above the points
    return medians


# --- the real vLLM engine --------------------------------------------------------------

VLLM_METRICS = (
    Metric("avg_qoe", "avg QoE\n↑"),
    Metric("throughput_tok_s", "tokens/s\n↑"),
    Metric("readers_p90_ttft_s", "readers'\np90 TTFT ↓"),
    Metric("idle_p99_s", "user idle\nlatency p99 ↓"),
)


def vllm_compare(data: Data, path: Path) -> str:
    """bench/vllm_compare.py: the plugin over FCFS on vLLM's CPU engine, per arrival
    process, medians and every repeat."""
    plt = pyplot()
    arrivals = list(data["results"])
    fig, axes = plt.subplots(1, len(arrivals), figsize=(3.7 * len(arrivals), 3.6), sharey=True)
    axes = [axes] if len(arrivals) == 1 else list(axes)
    lines = []
    for ax, arr in zip(axes, arrivals, strict=True):
        med, reps = data["results"][arr], data["repeats"][arr]
        ratios = ratio_panel(
            ax, VLLM_METRICS, med["fcfs"], med["andes"], reps["fcfs"], reps["andes"]
        )
        frozen = {m: max(r["frozen_over_2s"] for r in reps[m]) for m in ("fcfs", "andes")}
        longest = {m: max(r["longest_freeze_s"] for r in reps[m]) for m in ("fcfs", "andes")}
        ax.set_title(
            f"{arr.capitalize()} arrivals. Readers' replies frozen > 2 s, worst repeat:\n"
            f"FCFS {frozen['fcfs']:.1%}, tokenpace {frozen['andes']:.1%}; longest freeze "
            f"{longest['fcfs']:.1f} / {longest['andes']:.1f} s",
            fontsize=7,
        )
        lines.append(
            f"{arr}: QoE {ratios[0]:.2f}x, tokens/s {ratios[1]:.2f}x, readers' p90 TTFT "
            f"{ratios[2]:.2f}x, idle p99 {ratios[3]:.2f}x FCFS's; frozen > 2 s up to "
            f"{frozen['andes']:.1%} (FCFS {frozen['fcfs']:.1%})"
        )
    axes[0].set_ylabel("tokenpace (plugin) / FCFS")
    axes[0].legend(fontsize=7, loc="upper center", ncol=3)
    s = data["settings"]
    fig.suptitle(
        "Real vLLM CPU engine: does the plugin beat FCFS? "
        f"({s['requests']} requests at {s['load']:g}x full-batch speed, {s['repeats']} repeats)",
        fontsize=9,
    )
    fig.tight_layout()
    save_svg(fig, path)
    return "; ".join(lines)


# --- cache-aware routing on real engines -------------------------------------------------

ROUTING_METRICS = (
    Metric("ttft_p90_s", "p90\nTTFT ↓"),
    Metric("ttft_p99_s", "p99\nTTFT ↓"),
    Metric("tokens_per_s", "tokens/s\n↑"),
    Metric("qoe_mean", "QoE\nmean ↑"),
    Metric("hit_rate", "prefix-cache\nhit rate ↑"),
)


def routing_vllm(shared: Data, history: Data, path: Path) -> str:
    """bench/routing_vllm.py, one panel per workload: cache-aware routing over least
    waiting time (today's), medians of the repeats and each repeat."""
    plt = pyplot()
    workloads = (shared, history)
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(4.3 * len(workloads), 3.6), sharey=True, squeeze=False
    )
    lines = []
    for ax, data in zip(axes[0], workloads, strict=True):
        med, runs = data["medians"], data["runs"]
        ratios = ratio_panel(
            ax,
            ROUTING_METRICS,
            med["least_waiting"],
            med["cache_aware"],
            runs["least_waiting"],
            runs["cache_aware"],
        )
        w = data["workload"]
        ax.set_title(
            f"'{w['name']}': {w['conversations']} chats x {w['turns']} turns, "
            f"{w['reply_tokens']}-token replies",
            fontsize=8,
        )
        lines.append(
            f"{w['name']}: p90 TTFT {ratios[0]:.2f}x, p99 {ratios[1]:.2f}x, tokens/s "
            f"{ratios[2]:.2f}x, QoE {ratios[3]:.2f}x, hit rate {ratios[4]:.2f}x least waiting's"
        )
    axes[0][0].set_ylabel("cache-aware / least waiting")
    axes[0][0].legend(fontsize=7, loc="upper center", ncol=3)
    fig.suptitle(
        "Two vLLM CPU servers: does cache-aware routing beat least waiting time?", fontsize=9
    )
    fig.tight_layout()
    save_svg(fig, path)
    return "; ".join(lines)


# --- the throughput ceiling ---------------------------------------------------------------


def throughput_ceiling(
    ceilings: Data,
    opt_poisson: Data,
    opt_gamma: Data,
    llama_poisson: Data,
    llama_gamma: Data,
    path: Path,
) -> str:
    """bench/throughput_ceiling.py: per profile, the request rate no order exceeds (the
    batch bound) and, without swap, the KV bound, with tokens/s and the batch; beside
    them the stall-free capacity FCFS and tokenpace reach on the trace (the reader
    sweeps of ``tokenpace bench qoe``, Poisson and Gamma arrivals)."""
    plt = pyplot()
    sweeps = [opt_poisson, opt_gamma, llama_poisson, llama_gamma]
    names = sorted(ceilings)
    fig, axes = plt.subplots(len(names), 1, figsize=(7.6, 1.0 + 1.6 * len(names)), squeeze=False)
    lines = []
    for ax, name in zip(axes[:, 0], names, strict=True):
        bounds = ceilings[name]
        kv_binds = bounds["kv_bound"]["req_s"] < bounds["batch_bound"]["req_s"]
        rows = [("batch bound (any policy)", bounds["batch_bound"], OTHER_COLORS[0])]
        rows += [("KV bound (no swap)", bounds["kv_bound"], OTHER_COLORS[2])] if kv_binds else []
        for y, (_, b, color) in enumerate(rows):
            ax.barh(y, b["req_s"], color=color, alpha=0.6)
            ax.annotate(
                f" {b['req_s']:.2f} req/s, {b['tok_s']:,.0f} tokens/s, batch {b['batch']}",
                (b["req_s"], y),
                va="center",
                fontsize=7,
            )
        labels = [r[0] for r in rows]
        mine = [w for w in sweeps if w["config"]["profile"] == name]
        for policy, label, color in (
            ("fcfs", "FCFS", BASELINE_COLOR),
            ("andes-tp", "tokenpace", TOKENPACE_COLOR),
        ):
            for w in mine:
                rate = w["analysis"]["reader"]["stall_free_capacity_req_s"][policy]
                y = len(labels)
                ax.barh(y, rate, color=color, alpha=0.7)
                ax.annotate(f" {rate:.2f} req/s", (rate, y), va="center", fontsize=7)
                labels.append(f"{label} stall-free, {w['config']['arrivals']}")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlim(0, bounds["batch_bound"]["req_s"] * 1.9)
        ax.set_title(name, fontsize=8, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.invert_yaxis()
        bound = min(b["req_s"] for _, b, _ in rows)
        best = max(
            (w["analysis"]["reader"]["stall_free_capacity_req_s"]["andes-tp"] for w in mine),
            default=None,
        )
        reached = (
            f", tokenpace's stall-free capacity up to {best / bound:.0%} of it" if best else ""
        )
        lines.append(f"{name} {bound:.2f} req/s{reached}")
    axes[-1, 0].set_xlabel("requests/s on the Andes trace")
    fig.suptitle(
        "What can no scheduling order sustain, and how close do FCFS and tokenpace come?\n"
        "(bounds: sustained, computed from the profiles; capacities: stall-free over one "
        "simulated run of the trace,\nchat 60 % / voice 40 %, which a finite run can hold "
        "past a sustained bound)",
        fontsize=9,
    )
    fig.tight_layout()
    save_svg(fig, path)
    return "ceilings: " + "; ".join(lines)


# --- reader signals ---------------------------------------------------------------------

SIGNAL_VARIANTS = (
    ("fcfs", "FCFS", BASELINE_COLOR, "-"),
    ("andes-tp", "tokenpace, not told", OTHER_COLORS[0], "--"),
    ("andes-tp+signals", "tokenpace, told", TOKENPACE_COLOR, "-"),
)


def reader_signals(data: Data, path: Path) -> str:
    """bench/reader_signals.py: per engine, watched QoE and user idle latency p99 against
    the load, FCFS and the shipped policy untold / told, the capacities marked."""
    plt = pyplot()
    profiles = data["profiles"]
    fig, axes = plt.subplots(
        2, len(profiles), figsize=(3.5 * len(profiles), 5.4), sharex=True, squeeze=False
    )
    lines = []
    for col, p in enumerate(profiles):
        top, bottom = axes[0][col], axes[1][col]
        for key, label, color, style in SIGNAL_VARIANTS:
            runs = p["runs"][key]
            loads = [r["load"] for r in runs]
            for ax, field in ((top, "qoe_watched"), (bottom, "idle_p99_s")):
                values = [r[field] for r in runs]
                ax.plot(loads, values, style, color=color, marker="o", markersize=3, label=label)
        top.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        cap = p["capacity_req_s"]
        frozen = {k: max(r["frozen_over_2s"] for r in p["runs"][k]) for k, *_ in SIGNAL_VARIANTS}
        top.set_title(
            f"{p['profile']}\nstall-free: told {cap['andes-tp+signals']:.2f}, untold "
            f"{cap['andes-tp']:.2f}, FCFS {cap['fcfs']:.2f} req/s\nfrozen > 2 s watched, worst: "
            f"told {frozen['andes-tp+signals']:.1%}, FCFS {frozen['fcfs']:.1%}",
            fontsize=7,
        )
        bottom.set_xlabel(f"load (x ceiling, {p['ceiling_req_s']:.2f} req/s)")
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
        ratio = p["capacity_ratio"]
        told = (
            f"stall-free capacity told / untold {ratio:.2f}x"
            if ratio is not None
            else "no stall-free capacity untold"
        )
        lines.append(
            f"{p['profile']}: {told}, frozen > 2 s told up to "
            f"{frozen['andes-tp+signals']:.1%} (FCFS {frozen['fcfs']:.1%})"
        )
    axes[0][0].set_ylabel("avg QoE, watched time")
    axes[1][0].set_ylabel("user idle latency p99 (s)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    r = data["readers"]
    fig.suptitle(
        f"Does telling the engine who is away help? {r['away_share']:.0%} of readers away "
        f"{r['away_s'][0]:g}-{r['away_s'][1]:g} s (simulated)",
        fontsize=9,
    )
    fig.tight_layout()
    save_svg(fig, path)
    return "; ".join(lines)


# --- price plans ---------------------------------------------------------------------


def price_plans(data: Data, path: Path) -> str:
    """``tokenpace bench qoe --tenants ...``: each plan's QoE and user idle latency p99
    against the request rate, weights honoured (solid) and ignored (dashed)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.9), sharex=True)
    runs = sorted(data["runs"], key=lambda r: r["rate"])
    policies = data["config"]["policies"]
    plans = [k for k in runs[0]["tenants"] if k != "share_over_time"]
    plans.sort(key=lambda k: runs[0]["tenants"][k]["weight"])
    colors = dict(zip(plans, (BASELINE_COLOR, OTHER_COLORS[1], TOKENPACE_COLOR), strict=False))
    worst: dict[str, float] = {}
    for policy in policies:
        mine = [r for r in runs if r["policy"] == policy]
        rates = [r["rate"] for r in mine]
        style = "-" if policy == "andes-tp" else "--"
        for plan in plans:
            qoe = [r["tenants"][plan]["avg_qoe"] for r in mine]
            idle = [r["tenants"][plan]["idle_p99_s"] for r in mine]
            weights = "weights honoured" if policy == "andes-tp" else "weights ignored"
            label = f"{plan} (weight {mine[0]['tenants'][plan]['weight']:g}), {weights}"
            kw = {"color": colors[plan], "marker": "o", "markersize": 3}
            left.plot(rates, qoe, style, label=label, **kw)
            right.plot(rates, idle, style, **kw)
            worst[f"{plan} {policy}"] = min(qoe)
    left.set_ylabel("avg QoE of the plan's replies")
    right.set_ylabel("plan's user idle latency p99 (s)")
    for ax in (left, right):
        ax.set_xlabel("requests/s (all plans)")
        ax.grid(alpha=0.3)
    fig.legend(*left.get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=2)
    frozen = max(r["tenants"][plan]["frozen_over_2s"] for r in runs for plan in plans)
    c = data["config"]
    fig.suptitle(
        f"Who absorbs the shortfall? Plans {c['tenants']} (name:weight:demand), "
        f"{c['profile']}, {c['arrivals']},\nseed {c['seed']}, {c['n']} requests (simulated); "
        f"replies frozen over 2 s, any plan, any rate: {frozen:.1%}",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0.13, 1, 1))  # the legend below
    save_svg(fig, path)
    top = plans[-1]
    return (
        f"lowest QoE of plan {top}: {worst[f'{top} andes-tp']:.2f} weighted, "
        f"{worst.get(f'{top} andes-tp-unweighted', float('nan')):.2f} unweighted; "
        f"of plan {plans[0]}: {worst[f'{plans[0]} andes-tp']:.2f} weighted; frozen > 2 s "
        f"at most {frozen:.1%}"
    )


# --- the SDKs ------------------------------------------------------------------------


SDK_CLIENTS = {  # bench/sdk_pacing.py's ways of reading, as the plot names them
    "paced": "network, paced",
    "paced+telemetry": "network, paced + telemetry",
    "replay + one asyncio.sleep per release (no pacer)": "replay, bare timers",
}


def sdk_pacing(data: Data, path: Path) -> str:
    """bench/sdk_pacing.py: the release error (p50, p99) of each way of reading at the
    lowest TDS measured, and on an overloaded engine the QoE as arrived and as displayed
    by the client, FCFS beside tokenpace's engine."""
    plt = pyplot()
    tds = min(r["tds"] for r in data["cost"])
    rows = [r for r in data["cost"] if r["tds"] == tds and r.get("release_error_ms")]
    overload = data["overload"]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(8.8, 3.6), gridspec_kw={"width_ratios": [3, 2] if overload else [1, 0.01]}
    )
    ys = range(len(rows))
    p50 = [r["release_error_ms"]["p50"] for r in rows]
    p99 = [r["release_error_ms"]["p99"] for r in rows]
    left.barh([y + 0.2 for y in ys], p99, height=0.4, color=TOKENPACE_COLOR, label="p99")
    left.barh([y - 0.2 for y in ys], p50, height=0.4, color=OTHER_COLORS[0], label="p50")
    left.axvline(5.0, color=BASELINE_COLOR, linestyle=":", label="target p99 5 ms")
    left.set_yticks(list(ys), [SDK_CLIENTS.get(r["client"], r["client"]) for r in rows], fontsize=7)
    left.set_xscale("log")
    left.invert_yaxis()
    left.set_xlabel("release error (ms, log scale)")
    left.set_title(
        f"How exact is the pacing? {data['args']['streams']} streams at {tds:g} tokens/s",
        fontsize=8,
    )
    left.legend(fontsize=7, loc="lower right", framealpha=0.9)
    left.grid(axis="x", alpha=0.3)
    summary = f"release error p99 {min(p99):.1f}-{max(p99):.1f} ms at {tds:g} tokens/s"
    if overload:
        labels = ["FCFS" if "fcfs" in r["model"] else "tokenpace" for r in overload]
        xs = range(len(overload))
        arrived = [r["qoe_mean"]["andes"] for r in overload]
        shown = [r["qoe_mean"]["displayed_andes"] for r in overload]
        right.bar(
            [x - 0.2 for x in xs], arrived, width=0.4, color=OTHER_COLORS[0], label="as arrived"
        )
        right.bar(
            [x + 0.2 for x in xs],
            shown,
            width=0.4,
            color=TOKENPACE_COLOR,
            label="as the client displayed",
        )
        for x, r in zip(xs, overload, strict=True):
            reb = r["rebuffering_per_100_tokens"]
            right.annotate(
                f"gaps/100 tok\n{reb['arrivals']:.2f} → {reb['displayed']:.2f}",
                (x, 0.05),
                ha="center",
                fontsize=6,
            )
        right.set_xticks(list(xs), [f"{n} engine" for n in labels], fontsize=7)
        right.set_ylim(0, 1.3)
        right.set_ylabel("avg QoE")
        right.set_title("What is the buffer worth? (overloaded engine)", fontsize=8)
        right.legend(fontsize=6, loc="upper left", ncol=2)
        summary += "; QoE displayed / arrived: " + ", ".join(
            f"{n} {b:.3f} / {a:.3f}" for n, a, b in zip(labels, arrived, shown, strict=True)
        )
    else:
        right.axis("off")
    fig.suptitle("The Python client on the gateway's embedded (simulated) engine", fontsize=9)
    fig.tight_layout()
    save_svg(fig, path)
    return summary


# --- gateway cost and workers (bench/gateway_load.py) ------------------------------------

GATEWAY_COLORS = {"direct": OTHER_COLORS[0], "floor": BASELINE_COLOR, "gateway": TOKENPACE_COLOR}


def _added(run: Data, direct: Data, key: str, q: str) -> float:
    """A fixed-rate run's percentile ``q`` of ``key`` (ms) over direct's."""
    return float(run[key][q] - direct[key][q])


def _group_xs(count: int, j: int, groups: int) -> tuple[list[float], float]:
    """Where the ``j``-th of ``groups`` bars side by side stands at x = 0..``count``-1,
    and the bars' width."""
    width = 0.8 / groups
    return [i + (j - (groups - 1) / 2) * width for i in range(count)], width


def _points(ax: Any, xs: list[float], repeats: list[list[float]]) -> None:
    """Each bar's repeats, as black points on it."""
    for x, reps in zip(xs, repeats, strict=True):
        ax.plot([x] * len(reps), reps, "o", color="black", markersize=2.5)


def _saturation_bars(
    ax: Any, data: Data, ns: list[str], t: str, xs: list[float], width: float, color: str | None
) -> None:
    """Target ``t``'s sustained chunks/s at each stream count: the median and the repeats."""
    runs = data["runs"]
    chunks = [runs[n][t]["saturation"]["chunks_per_s"] for n in ns]
    ax.bar(xs, chunks, width=width, color=color, alpha=0.7, label=t)
    _points(ax, xs, [runs[n][t]["saturation_chunks_per_s"] for n in ns])


def _added_ttft_bars(
    ax: Any,
    data: Data,
    ns: list[str],
    t: str,
    xs: list[float],
    width: float,
    color: str | None,
    styles: tuple[tuple[str, float, str | None], ...],
) -> None:
    """Target ``t``'s TTFT over direct's at each stream count, a half-width bar per
    (percentile, alpha, hatch) of ``styles``, p50 left of ``xs``, p99 right."""
    runs = data["runs"]
    for q, alpha, hatch in styles:
        added = [_added(runs[n][t]["fixed"], runs[n]["direct"]["fixed"], "ttft_ms", q) for n in ns]
        offset = -width / 4 if q == "p50" else width / 4
        ax.bar(
            [x + offset for x in xs],
            added,
            width=width / 2,
            color=color,
            alpha=alpha,
            hatch=hatch,
            label=f"{t} {q}",
        )


def _stream_axes(panels: tuple[tuple[Any, str, str], ...], ns: list[str]) -> None:
    """The stream-count panels' ticks, labels, grid and a legend with room above the bars."""
    for ax, ylabel, title in panels:
        ax.set_xticks(range(len(ns)), [f"{n} streams" for n in ns], fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
        ax.legend(fontsize=6, ncol=2)


def gateway_cost(data: Data, path: Path) -> str:
    """bench/gateway_load.py (direct, floor, gateway): per stream count, CPU per 1k
    tokens, added TTFT p50/p99 against direct, sustained chunks/s, and (where measured)
    CPU per one-token request; the stack floor beside the gateway, the repeats as points."""
    plt = pyplot()
    runs = data["runs"]
    ns = sorted(runs, key=int)
    per_request = {t: rs for t, rs in data.get("per_request_repeats", {}).items() if rs}
    fig, axes = plt.subplots(
        1, 4 if per_request else 3, figsize=(12.4 if per_request else 9.6, 3.4)
    )
    cpu, ttft, sat = axes[:3]
    proxies = [t for t in ("floor", "gateway") if t in runs[ns[0]]]
    for j, t in enumerate(proxies):
        xs, width = _group_xs(len(ns), j, len(proxies))
        color = GATEWAY_COLORS[t]
        per_token = [runs[n][t]["fixed"]["cpu_s_per_1k_tokens"] for n in ns]
        cpu.bar(xs, per_token, width=width, color=color, alpha=0.7, label=t)
        _points(
            cpu, xs, [[r["cpu_s_per_1k_tokens"] for r in runs[n][t]["fixed_repeats"]] for n in ns]
        )
        _added_ttft_bars(
            ttft, data, ns, t, xs, width, color, (("p50", 0.7, None), ("p99", 0.4, "//"))
        )
    targets = ["direct", *proxies]
    for j, t in enumerate(targets):
        xs, width = _group_xs(len(ns), j, len(targets))
        _saturation_bars(sat, data, ns, t, xs, width, GATEWAY_COLORS[t])
    _stream_axes(
        (
            (cpu, "server CPU ms per token", "CPU per token (fixed rate)"),
            (ttft, "added TTFT over direct (ms)", "Added TTFT p50 / p99 (fixed rate)"),
            (sat, "chunks/s", "Sustained chunks/s (saturation)"),
        ),
        ns,
    )
    if per_request:
        ax = axes[3]
        for x, (t, repeats) in enumerate(per_request.items()):
            values = [r["cpu_ms_per_request"] for r in repeats]
            ax.bar(x, statistics.median(values), width=0.6, color=GATEWAY_COLORS.get(t), alpha=0.7)
            _points(ax, [x], [values])
        ax.set_xticks(range(len(per_request)), list(per_request), fontsize=8)
        ax.set_ylabel("server CPU ms per request", fontsize=8)
        ax.set_title("CPU per one-token request", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    # the key figures as the benchmark judged them (repeat pairs against the floor)
    lines = [
        f"{t['target']}: {t['measured']:.3g} ({'met' if t['met'] else 'missed'})"
        for t in data.get("targets", [])
    ]
    fig.suptitle(
        "What does a request pay for the gateway? Against the stack floor (same libraries, "
        "none of the gateway's work)",
        fontsize=9,
    )
    fig.tight_layout()
    save_svg(fig, path)
    return "; ".join(lines)


def gateway_workers(data: Data, path: Path) -> str:
    """bench/gateway_load.py --workers 1,2: per stream count, sustained chunks/s of
    direct and of each gateway (median and the repeats) and added TTFT p50/p99."""
    plt = pyplot()
    runs = data["runs"]
    ns = sorted(runs, key=int)
    targets = [t for t in runs[ns[0]] if t == "direct" or t.startswith("gateway")]
    colors = dict(
        zip(
            targets,
            (OTHER_COLORS[0], BASELINE_COLOR, TOKENPACE_COLOR, OTHER_COLORS[1]),
            strict=False,
        )
    )
    fig, (sat, ttft) = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for j, t in enumerate(targets):
        xs, width = _group_xs(len(ns), j, len(targets))
        _saturation_bars(sat, data, ns, t, xs, width, colors[t])
        for x, n in zip(xs, ns, strict=True):
            run = runs[n][t]["saturation"]
            if "server_cpu_s" in run:  # the gateway's CPUs used while saturated
                cpus = run["server_cpu_s"] / run["wall_s"]
                top = max(runs[n][t]["saturation_chunks_per_s"])
                sat.annotate(f"{cpus:.2f}\nCPUs", (x, top), ha="center", va="bottom", fontsize=6)
        if t != "direct":
            _added_ttft_bars(
                ttft, data, ns, t, xs, width, colors[t], (("p50", 0.7, None), ("p99", 0.4, None))
            )
    lines = [
        f"{n} streams, sustained chunks/s: "
        + ", ".join(
            f"{t} {runs[n][t]['saturation']['chunks_per_s']:,.0f}" for t in targets if t != "direct"
        )
        for n in ns
    ]
    _stream_axes(
        (
            (sat, "chunks/s", "Sustained chunks/s (saturation; the gateway's CPUs used)"),
            (ttft, "added TTFT over direct (ms)", "Added TTFT p50 / p99 (fixed rate)"),
        ),
        ns,
    )
    fig.suptitle("What does a second gateway worker buy? (gateway-2w: two processes)", fontsize=9)
    fig.tight_layout()
    save_svg(fig, path)
    return "; ".join(lines)


# --- the plots and their inputs ------------------------------------------------------------


@dataclass(frozen=True)
class Plot:
    """One section's figure: the JSON names it reads (newest ``<date>-<name>.json``
    each), how it draws them, and the command that writes the JSON."""

    figure: str  # docs/img/<figure>.svg
    inputs: tuple[str, ...]
    draw: Callable[..., str]  # (one Data per input, path) -> its key figures
    command: str


PLOTS = (
    Plot(
        "vllm_compare",
        ("vllm-compare",),
        vllm_compare,
        "bench/vllm_compare.py --modes fcfs,andes --load 2.2 --repeats 3 --out DIR",
    ),
    Plot(
        "routing_vllm",
        ("routing-vllm-shared", "routing-vllm-history"),
        routing_vllm,
        "bench/routing_vllm.py --workload shared|history --repeats 3 --out DIR",
    ),
    Plot(
        "throughput_ceiling",
        (
            "throughput-ceiling",
            "reader-qoe-opt-poisson",
            "reader-qoe-opt-gamma",
            "reader-qoe-llama-poisson",
            "reader-qoe-llama-gamma",
        ),
        throughput_ceiling,
        "bench/throughput_ceiling.py --out FILE; the reader sweeps: docs/benchmarks.md, "
        "'QoE and frozen replies against FCFS'",
    ),
    Plot(
        "reader_signals",
        ("reader-signals",),
        reader_signals,
        "bench/reader_signals.py --out DIR",
    ),
    Plot(
        "price_plans",
        ("price-plans",),
        price_plans,
        "tokenpace bench qoe --policies andes-tp,andes-tp-unweighted --tenants ... --out DIR",
    ),
    Plot("sdk_pacing", ("sdk-pacing",), sdk_pacing, "bench/sdk_pacing.py --out DIR"),
    Plot(
        "gateway_cost",
        ("gateway-cost",),
        gateway_cost,
        "bench/gateway_load.py --targets direct,floor,gateway --ns 64,256 --out DIR",
    ),
    Plot(
        "gateway_workers",
        ("gateway-workers",),
        gateway_workers,
        "bench/gateway_load.py --targets direct,gateway --workers 1,2 --redis --out DIR",
    ),
)


def newest(results: Path, name: str) -> Path | None:
    """The newest ``<date>-<name>.json`` under ``results`` (dates sort as text)."""
    found = sorted(results.glob(f"????-??-??-{name}.json"))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the raw JSON files")
    parser.add_argument("--img", type=Path, default=IMG, help="where the SVGs go")
    parser.add_argument("--only", action="append", choices=[p.figure for p in PLOTS])
    args = parser.parse_args(argv)
    missing = 0
    for plot in PLOTS:
        if args.only and plot.figure not in args.only:
            continue
        files = [newest(args.results, name) for name in plot.inputs]
        absent = [n for n, f in zip(plot.inputs, files, strict=True) if f is None]
        if absent:
            missing += 1
            wanted = ", ".join(f"<date>-{n}.json" for n in absent)
            print(f"missing {plot.figure}: no {wanted} in {args.results} (from: {plot.command})")
            continue
        data = [json.loads(f.read_text()) for f in files if f is not None]
        path = args.img / f"{plot.figure}.svg"
        summary = plot.draw(*data, path)
        print(f"wrote {path} from {', '.join(f.name for f in files if f)}: {summary}")
    print(f"{missing} plot(s) without their results" if missing else "every plot drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
