"""One reply's delivery timeline, FCFS against tokenpace, under the same simulated load.

Runs the simulator (``qos.sim``, no GPU) twice on one workload, stock FCFS (a request left
out loses its KV, as in vLLM) and ``andes-tp`` (the shipped policy), picks one reply that
FCFS froze (the median of FCFS's replies frozen over 2 s, by their longest freeze) and
draws what its reader saw under each: tokens shown against time since the request
arrived, through the release rule (token k shown at max(arrival_k, shown_(k-1) + 1/TDS),
docs/qoe.md), beside the reader's own pace from the expected TTFT. A second figure gives
every reply's longest freeze under each policy.

    .venv/bin/python bench/reply_timeline.py --out docs/img

writes ``reply_timeline.svg``, ``longest_freeze.svg`` and ``reply_timeline.json`` (the
figures' data and the run's settings). The defaults are the "What the reader sees" run
of docs/benchmarks.md at 2.6 req/s (OPT-66B, Poisson, chat 60 % / voice 40 %, seed 0):
about a minute on one core. Matplotlib (the ``bench`` extra) draws the figures as SVG
with fixed ids and no timestamp, so the same run writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qos.latency import get_profile
from qos.policy.registry import STOCK_POLICIES, make_policy
from qos.sim import RequestResult, build_workload, load_andes_trace, parse_tier_mix, simulate
from qos.timeline import digestion_starts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import BASELINE_COLOR, TOKENPACE_COLOR, pyplot, save_svg

BASELINE = "fcfs"
SHIPPED = "andes-tp"
FROZEN_S = 2.0  # docs/qoe.md: a reply "froze" when its longest freeze passes this


@dataclass(frozen=True)
class Settings:
    profile: str = "opt-66b-4xa100"
    rate: float = 2.6
    n: int = 3000
    arrivals: str = "poisson"
    tier_mix: str = "chat=0.6,voice=0.4"
    seed: int = 0


def run_policies(s: Settings) -> dict[str, dict[str, RequestResult]]:
    """Each policy's finished replies, by request id, on one workload."""
    profile = get_profile(s.profile)
    workload = build_workload(
        load_andes_trace(),
        s.rate,
        arrivals="gamma" if s.arrivals == "gamma" else "poisson",
        seed=s.seed,
        n=s.n,
        tier_mix=parse_tier_mix(s.tier_mix),
    )
    out = {}
    for name in (BASELINE, SHIPPED):
        result = simulate(
            workload,
            make_policy(name, profile),
            profile,
            pause=name not in STOCK_POLICIES,
        )
        out[name] = {r.id: r for r in result.requests}
    return out


def pick_reply(runs: dict[str, dict[str, RequestResult]]) -> str:
    """The reply at the median longest freeze among those FCFS froze over 2 s; else the
    one FCFS froze longest."""
    base = runs[BASELINE]
    ranked = sorted(base.values(), key=lambda r: (r.freezes.longest_s, r.id))
    frozen = [r for r in ranked if r.freezes.longest_s > FROZEN_S] or ranked[-1:]
    return frozen[len(frozen) // 2].id


def shown_times(reply: RequestResult) -> np.ndarray:
    """When the reader sees each token, seconds since the request arrived."""
    return digestion_starts(np.asarray(reply.times, dtype=float), reply.tds)


def figure_data(runs: dict[str, dict[str, RequestResult]], s: Settings) -> dict:
    """Everything the two figures draw, as plain numbers."""
    rid = pick_reply(runs)
    replies = {name: runs[name][rid] for name in runs}
    first = replies[BASELINE]
    return {
        "settings": s.__dict__,
        "reply": {
            "id": rid,
            "tier": first.tier,
            "ttft_s": first.ttft,
            "tds": first.tds,
            "tokens": first.output_tokens,
        },
        "policies": {
            name: {
                "shown_s": [round(float(t), 4) for t in shown_times(r)],
                "andes_qoe": round(r.andes_qoe, 4),
                "longest_freeze_s": round(r.freezes.longest_s, 3),
                "ttft_s": round(r.actual_ttft, 3),
                "all_longest_freeze_s": sorted(
                    round(x.freezes.longest_s, 3) for x in runs[name].values()
                ),
            }
            for name, r in replies.items()
        },
    }


COLORS = {BASELINE: BASELINE_COLOR, SHIPPED: TOKENPACE_COLOR}
LABELS = {BASELINE: "FCFS (stock vLLM)", SHIPPED: "tokenpace (andes-tp)"}


def draw_timeline(data: dict, path: Path) -> None:
    plt = pyplot()
    reply = data["reply"]
    fig, ax = plt.subplots(figsize=(7.2, 3.4))
    n = reply["tokens"]
    tokens = np.arange(1, n + 1)
    pace = reply["ttft_s"] + (tokens - 1) / reply["tds"]
    ax.plot(pace, tokens, color="grey", linestyle=":", linewidth=1.5, label="the reader's pace")
    for name, p in data["policies"].items():
        label = (
            f"{LABELS[name]}: first token {p['ttft_s']:.1f} s, "
            f"longest freeze {p['longest_freeze_s']:.1f} s, QoE {p['andes_qoe']:.2f}"
        )
        ax.step(p["shown_s"], tokens, where="post", color=COLORS[name], linewidth=2, label=label)
    ax.set_xlabel("seconds since the request arrived")
    ax.set_ylabel("tokens shown to the reader")
    s = data["settings"]
    ax.set_title(
        f"one {reply['tier']} reply ({n} tokens, {reply['tds']:g} tokens/s) "
        f"at {s['rate']:g} req/s, {s['profile']} (simulated)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, n * 1.05)
    fig.tight_layout()
    save_svg(fig, path)


def draw_freezes(data: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    for name, p in data["policies"].items():
        xs = np.asarray(p["all_longest_freeze_s"], dtype=float)
        share = 1.0 - np.arange(xs.size) / xs.size  # replies whose longest freeze >= x
        frozen = float(np.mean(xs > FROZEN_S))
        ax.step(
            np.maximum(xs, 1e-2),
            share,
            where="post",
            color=COLORS[name],
            linewidth=2,
            label=f"{LABELS[name]}: {frozen:.1%} froze over {FROZEN_S:g} s",
        )
    ax.axvline(FROZEN_S, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("longest freeze of a reply (s)")
    ax.set_ylabel("share of replies at least that long")
    s = data["settings"]
    ax.set_title(f"every reply, {s['rate']:g} req/s, {s['profile']} (simulated)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    save_svg(fig, path)


def main(argv: list[str] | None = None) -> int:
    defaults = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the SVGs and the JSON")
    p.add_argument("--profile", default=defaults.profile, help="latency profile (qos.latency)")
    p.add_argument("--rate", type=float, default=defaults.rate, help="requests/s")
    p.add_argument("--n", type=int, default=defaults.n, help="requests from the trace")
    p.add_argument("--arrivals", choices=("poisson", "gamma"), default=defaults.arrivals)
    p.add_argument("--tier-mix", default=defaults.tier_mix, help="tier=share,...")
    p.add_argument("--seed", type=int, default=defaults.seed)
    args = p.parse_args(argv)
    s = Settings(args.profile, args.rate, args.n, args.arrivals, args.tier_mix, args.seed)
    data = figure_data(run_policies(s), s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reply_timeline.json").write_text(json.dumps(data, indent=1) + "\n")
    draw_timeline(data, args.out / "reply_timeline.svg")
    draw_freezes(data, args.out / "longest_freeze.svg")
    for name, pol in data["policies"].items():
        print(
            f"{name:9} reply {data['reply']['id']}: first token {pol['ttft_s']:.2f} s, "
            f"longest freeze {pol['longest_freeze_s']:.2f} s, QoE {pol['andes_qoe']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
