"""Cache-aware routing in the simulator: replicas with prefix caches, multi-turn chat.

SIMULATED (no GPU here): engine replicas of a latency profile (default
``llama-3.1-8b-h100``), each with a prefix cache (:mod:`qos.sim.cluster`), behind round
robin, today's ``least_waiting`` and ``cache_aware`` routing, fed the same conversations
(:mod:`qos.sim.conversations`: an app's shared system prompt, turns that resend the
history, think time between turns).

**Load.** A replica's capacity is the turn rate that keeps its engine busy under today's
routing, in full decode batches: ``1 / (prefill_s(u + h (1 - 1/R)) + mean reply x
decode_s(max_batch) / max_batch)``, with ``u`` the mean user message and ``h`` the mean
history of a turn, of which today's routing finds ``1/R`` on the replica it picks (it
places turns without regard to the conversation), and the system prompt cached
everywhere. Conversations start as a Poisson process at ``load x R x capacity / mean
turns`` a second, for ``--window`` seconds; the run goes on until every turn is
answered. The figures are those of the turns that arrived after ``--warmup`` seconds
and within the window (the steady state: the caches and the conversations in flight have
filled up, and no conversation has yet stopped starting); tokens/s is their output over
that span.

**Single prompts** (``--single``): one turn per conversation and no system prompt, so no
prefix is shared: cache-aware routing must not be worse there. ``--no-system``:
multi-turn chats without a shared system prompt (every first turn is cold).

**Gateway replicas** (``--gateways N``): cache-aware routing by ``N`` routers, each with
its own index, a turn at one of them by hash (:class:`qos.sim.cluster.ClusterSim`).

    nice -n 10 .venv/bin/python bench/routing_sim.py --replicas 2,4,8,16 \\
        --loads 0.6,0.75,0.9 --out /tmp/routing_sim

Writes ``OUT/results.json``, prints a markdown table per workload, and with
``--figure`` draws p90 TTFT and hit rate against load per replica count.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from result_files import save

from qos.latency import get_profile
from qos.sim.cluster import ROUTINGS, ClusterSim, Routing, turn_seconds
from qos.sim.conversations import ChatShape, build_conversations


def run_point(
    profile_name: str,
    shape: ChatShape,
    replicas: int,
    load: float,
    window: tuple[float, float],
    seed: int,
    routings: tuple[Routing, ...] = ROUTINGS,
    gateways: int = 1,
) -> dict[str, Any]:
    """Every routing on the same conversations at one (replicas, load)."""
    profile = get_profile(profile_name)
    probe = build_conversations(shape, 2000, 1.0, seed=seed + 1)
    turns_all = [t for c in probe for t in c.turns]
    user = sum(t.user_tokens for t in turns_all) / len(turns_all)
    history = sum(t.history_tokens for t in turns_all) / len(turns_all)
    reply = sum(t.reply_tokens for t in turns_all) / len(turns_all)
    capacity = 1.0 / turn_seconds(profile, user + history * (1 - 1 / replicas), reply)
    turns = sum(len(c.turns) for c in probe) / len(probe)
    rate = load * replicas * capacity / turns
    conversations = build_conversations(shape, max(round(rate * window[1]), 1), rate, seed=seed)
    out: dict[str, Any] = {
        "replicas": replicas,
        "load": load,
        "capacity_turns_per_s_per_replica": capacity,
        "conversations": len(conversations),
        "routing": {},
    }
    for routing in routings:
        started = time.monotonic()
        sim = ClusterSim(profile, replicas, routing, gateways=gateways)
        run = sim.run(conversations, shape.ttft, shape.tds)
        s = run.steady(*window).summary()
        reader = s["reader"] or {}
        out["routing"][routing] = {
            "requests": s["requests"],
            "ttft_p50_s": s["ttft_s"]["p50"],
            "ttft_p90_s": s["ttft_s"]["p90"],
            "ttft_p99_s": s["ttft_s"]["p99"],
            "qoe_mean": s["avg_qoe"],
            "qoe_p10": s["qoe"]["p10"],
            "monotone_qoe_mean": s["avg_monotone_qoe"],
            "tokens_per_s": s["throughput_tok_s"],
            "frozen_over_2s": reader.get("frozen_over_2s"),
            "idle_p99_s": reader.get("idle_p99_s"),
            "hit_rate": run.hit_rate,
            "prefill_tokens": s["iterations"]["prefill_tokens"],
            "load_max_over_mean": run.load_ratio(),
            "wall_s": time.monotonic() - started,
        }
    return out


def table(points: list[dict[str, Any]]) -> str:
    head = (
        "| replicas | load | routing | TTFT p50 s | TTFT p90 s | TTFT p99 s | QoE mean | QoE p10 "
        "| tokens/s | frozen >2 s | idle p99 s | hit rate | max/mean requests | max/mean busy |"
    )
    lines = [head, "|" + " --- |" * 14]
    for p in points:
        for routing, r in p["routing"].items():
            lr = r["load_max_over_mean"]
            lines.append(
                f"| {p['replicas']} | {p['load']:.2f} | {routing} | {r['ttft_p50_s']:.3f} "
                f"| {r['ttft_p90_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['qoe_mean']:.4f} "
                f"| {r['qoe_p10']:.4f} | {r['tokens_per_s']:.0f} | {r['frozen_over_2s']:.4f} "
                f"| {r['idle_p99_s']:.3f} | {r['hit_rate']:.3f} | {lr['requests']:.3f} "
                f"| {lr['busy']:.3f} |"
            )
    return "\n".join(lines)


def targets(points: list[dict[str, Any]]) -> str:
    """Each point against the targets: cache_aware's p90 TTFT over least_waiting's, its
    tokens/s and QoE against least_waiting's, its most loaded replica over the mean."""
    lines = [
        "| replicas | load | p90 TTFT ratio (<= 0.5) | tokens/s ratio (>= 1) "
        "| QoE ca - lw (>= 0) | max/mean busy (<= 1.25) |",
        "|" + " --- |" * 6,
    ]
    for p in points:
        ca, lw = p["routing"]["cache_aware"], p["routing"]["least_waiting"]
        lines.append(
            f"| {p['replicas']} | {p['load']:.2f} | {ca['ttft_p90_s'] / lw['ttft_p90_s']:.3f} "
            f"| {ca['tokens_per_s'] / lw['tokens_per_s']:.4f} "
            f"| {ca['qoe_mean'] - lw['qoe_mean']:+.5f} "
            f"| {ca['load_max_over_mean']['busy']:.3f} |"
        )
    return "\n".join(lines)


COLORS = {"round_robin": "tab:blue", "least_waiting": "tab:orange", "cache_aware": "tab:green"}


def figure(points: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({p["replicas"] for p in points})
    fig, axes = plt.subplots(2, len(counts), figsize=(4 * len(counts), 7), squeeze=False)
    for col, n in enumerate(counts):
        mine = sorted((p for p in points if p["replicas"] == n), key=lambda p: p["load"])
        loads = [p["load"] for p in mine]
        for routing in mine[0]["routing"]:
            style: dict[str, Any] = {"color": COLORS[routing], "label": routing, "marker": "o"}
            axes[0][col].plot(loads, [p["routing"][routing]["ttft_p90_s"] for p in mine], **style)
            axes[1][col].plot(loads, [p["routing"][routing]["hit_rate"] for p in mine], **style)
        axes[0][col].set_title(f"{n} replicas")
        axes[0][col].set_ylabel("p90 TTFT (s)")
        axes[0][col].set_yscale("log")
        axes[1][col].set_ylabel("prefix-cache hit rate")
        axes[1][col].set_xlabel("load (share of capacity)")
    for ax in axes.flat:
        ax.legend(fontsize=8)
    fig.suptitle("SIMULATED: multi-turn chat, replicas with prefix caches")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="2,4,8,16")
    ap.add_argument("--loads", default="0.6,0.75,0.9")
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of conversation starts")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds left out at the start")
    ap.add_argument("--think", type=float, default=2.0, help="mean think time between turns (s)")
    ap.add_argument(
        "--round-robin-upto", type=int, default=4, help="round robin too, up to this many replicas"
    )
    ap.add_argument("--single", action="store_true", help="single prompts: no shared prefix")
    ap.add_argument(
        "--no-system", action="store_true", help="multi-turn chats without a shared system prompt"
    )
    ap.add_argument(
        "--gateways", type=int, default=1, help="gateway replicas, each with its own index"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/routing_sim")
    ap.add_argument("--figure", action="store_true")
    args = ap.parse_args()
    started = time.monotonic()
    shape = ChatShape(think_s=args.think)
    if args.single:
        shape = replace(shape, system_tokens=0, turns=(1, 1), user_tokens=(200, 2000))
    if args.no_system:
        shape = replace(shape, system_tokens=0)
    points = []
    for n in (int(x) for x in args.replicas.split(",")):
        for load in (float(x) for x in args.loads.split(",")):
            routings = ROUTINGS if n <= args.round_robin_upto else ROUTINGS[1:]
            window = (args.warmup, args.window)
            point = run_point(
                args.profile, shape, n, load, window, args.seed, routings, args.gateways
            )
            points.append(point)
            print(table([point]).splitlines()[-3:], flush=True)
    print(table(points))
    print()
    print(targets(points))
    results = {
        "simulated": True,
        "profile": args.profile,
        "shape": shape.__dict__,
        "window_s": [args.warmup, args.window],
        "seed": args.seed,
        "gateways": args.gateways,
        "points": points,
    }
    path = save(results, args.out, started)
    if args.figure:
        figure(points, str(path.parent / "routing_sim.png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
