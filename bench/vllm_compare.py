"""vLLM with FCFS, with its priority policy, and with the tokenpace plugin, side by side.

One run starts three vLLM OpenAI servers on the same model and settings, differing only
in the scheduler: vLLM's FCFS, vLLM's priority policy (``--scheduling-policy priority``,
priority from the tier, lower sooner), and ``--scheduler-cls qos.vllm.AndesScheduler``.
The stock ones run as ``qos.vllm.TimedScheduler``, which schedules exactly as vLLM's and
adds the same step statistics as the plugin. The tokenpace gateway is in front of all
three; the official ``openai`` client streams the same workload through it to each in
turn, for each arrival process (Poisson, then bursty Gamma with CV 3, Andes §6.4).

Workload: the Andes ShareGPT QoE trace (``qos.sim.workload``): its prompt and reply
lengths scaled by ``--length-scale`` (the model's context is short), requests drawn 70 %
chat and 30 % batch tier, arriving at ``--rate`` requests/s. Tiers are scaled by
``--speedup`` to the engine's speed: chat expects its first token in 1/F s and F×4.8
tokens/s (a reader F times faster), batch 60/F s and F×2 tokens/s. Every request uses
``ignore_eos`` so its length is exact.

Each server runs the workload ``--repeats`` times per arrival process, the servers'
order rotated from one repeat to the next (on a shared or noisy machine one run's
throughput moves by ±20 %). Reported per scheduler and arrival process, as the median
over the repeats: average and p10 client-measured Andes QoE, p90 TTFT, token
throughput (tokens received over the span from the first request to the last token;
and "loaded": tokens received up to the last arrival over the span of arrivals, the
rate while the load lasts, without the drain at the end), preemptions per request,
tokens the engine computed per token delivered (recompute after preemptions shows
here), and the scheduler's own time per step (schedule(), the policy included) against
the whole step (schedule + model + update). Then each scheduler's QoE and throughput
over FCFS's in the same repeat: median (min–max) of those ratios.
Results go to ``--out`` (JSON with every repeat, and markdown tables).

CPU (default, what docs/benchmarks.md reports)::

    .venv/bin/python bench/vllm_compare.py --out results/vllm_compare

GPU with a real model: ``bench/vllm_compare_gpu.sh`` (not part of CI).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_harness import Job, VllmServer, gateway_config, run_jobs, serve_gateway, summarize

from qos.sim.workload import build_workload, load_andes_trace

ROOT = Path(__file__).resolve().parent.parent
MODES = ("fcfs", "priority", "andes")
FIGURES = (
    ("avg_qoe", "avg QoE", "{:.3f}"),
    ("p10_qoe", "p10 QoE", "{:.3f}"),
    ("p90_ttft_s", "p90 TTFT (s)", "{:.2f}"),
    ("throughput_tok_s", "tokens/s", "{:.0f}"),
    ("loaded_tok_s", "tokens/s loaded", "{:.0f}"),
    ("preemptions_per_request", "preemptions/req", "{:.2f}"),
    ("computed_per_token", "computed/token", "{:.2f}"),
    ("schedule_ms_per_step", "schedule ms/step", "{:.3f}"),
    ("step_ms", "step ms", "{:.2f}"),
    ("schedule_share", "schedule share", "{:.1%}"),
)


def tiers(speedup: float) -> dict[str, dict[str, float]]:
    return {
        "chat": {"ttft": 1.0 / speedup, "tds": 4.8 * speedup, "priority": 1},
        "batch": {"ttft": 60.0 / speedup, "tds": 2.0 * speedup, "priority": 2},
    }


def workload(args: argparse.Namespace, arrivals: str) -> list[Job]:
    """The trace's lengths, scaled, arriving by ``arrivals``, 70 % chat / 30 % batch."""
    mix = {"chat": (1.0, 4.8, 0.7), "batch": (60.0, 2.0, 0.3)}  # tier names and shares
    requests = build_workload(
        load_andes_trace(),
        args.rate,
        arrivals=arrivals,
        seed=args.seed,
        n=args.requests,
        tier_mix=mix,
    )
    limit = args.max_model_len - 8
    jobs = []
    for r in requests:
        prompt_words = int(np.clip(round(r.prompt_tokens * args.length_scale), 4, limit // 2))
        max_tokens = int(np.clip(round(r.output_tokens * args.length_scale), 4, limit // 2))
        prompt = f"{r.id}: " + " ".join(["lazy"] * prompt_words)  # about a token a word
        jobs.append(Job(r.arrival, r.tier, prompt, max_tokens))
    return jobs


async def measure(args: argparse.Namespace, servers: list[VllmServer]) -> dict[str, Any]:
    """Every server on the same jobs, ``--repeats`` times per arrival process.

    Each repeat runs the servers in turn, the order rotated by one from the repeat
    before, so a slow stretch of the machine does not always land on the same scheduler.
    """
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    async with serve_gateway(gateway_config(servers, tiers(args.speedup))) as url:
        for server in servers:  # warm-up: every batch size up to max_num_seqs compiles
            n = args.max_num_seqs
            warm = [Job(0.0, "batch", "warm up " * (i + 1), 4 + 2 * i) for i in range(n)]
            await run_jobs(url, server.name, warm)
        for arrivals in args.arrivals:
            jobs = workload(args, arrivals)
            for repeat in range(args.repeats):
                turn = repeat % len(servers)
                for server in servers[turn:] + servers[:turn]:
                    figures = await run_once(url, server, jobs)
                    label = server.name.removeprefix("bench-")
                    runs.setdefault(arrivals, {}).setdefault(label, []).append(figures)
                    print(f"{arrivals:8s} {label:9s} #{repeat} " + _row(figures), flush=True)
                    save(args, runs)  # as it goes: a long run keeps what it measured
    return runs


async def run_once(url: str, server: VllmServer, jobs: list[Job]) -> dict[str, float]:
    """The jobs through the gateway to one server; its figures (``summarize``)."""
    before = server.stats()
    results = await run_jobs(url, server.name, jobs)
    await asyncio.sleep(STATS_SETTLE_S)  # stats are rewritten when the engine idles
    after = server.stats()
    delta = {
        k: after[k] - before.get(k, 0)
        for k in after
        if isinstance(after[k], int | float) and not isinstance(after[k], bool)
    }
    figures = summarize(results, delta)
    figures["incomplete"] = sum(r.completion_tokens != r.job.max_tokens for r in results)
    return figures


def medians(repeats: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the repeats."""
    return {k: float(np.median([f[k] for f in repeats])) for k in repeats[0]}


def ratios(runs: dict[str, list[dict[str, float]]], key: str, label: str) -> list[float]:
    """``label``'s figure over FCFS's in the same repeat, one per repeat."""
    return [f[key] / base[key] for f, base in zip(runs[label], runs["fcfs"], strict=False)]


def save(args: argparse.Namespace, runs: dict[str, Any]) -> None:
    out = Path(args.out)
    summary = {
        arrivals: {label: medians(repeats) for label, repeats in by_label.items()}
        for arrivals, by_label in runs.items()
    }
    report = {
        "command": " ".join(sys.argv),
        "settings": vars(args),
        "results": summary,  # medians over the repeats
        "repeats": runs,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(markdown(runs))


STATS_SETTLE_S = 1.5


def _row(figures: dict[str, float]) -> str:
    return "  ".join(f"{label} {fmt.format(figures[key])}" for key, label, fmt in FIGURES)


def markdown(runs: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    """Medians over the repeats, then each scheduler against FCFS repeat by repeat."""
    head = "| arrivals | scheduler | " + " | ".join(label for _, label, _ in FIGURES) + " |"
    lines = [head, "|" + " --- |" * (len(FIGURES) + 2)]
    for arrivals, by_label in runs.items():
        for label, repeats in by_label.items():
            f = medians(repeats)
            cells = " | ".join(fmt.format(f[key]) for key, _, fmt in FIGURES)
            lines.append(f"| {arrivals} | {label} | {cells} |")
    lines += ["", "| arrivals | scheduler | " + " | ".join(c for _, c in VERSUS) + " |"]
    lines.append("|" + " --- |" * (len(VERSUS) + 2))
    for arrivals, by_label in runs.items():
        if "fcfs" not in by_label:
            continue
        for label in by_label:
            if label == "fcfs":
                continue
            cells = " | ".join(_spread(ratios(by_label, key, label)) for key, _ in VERSUS)
            lines.append(f"| {arrivals} | {label} | {cells} |")
    return "\n".join(lines) + "\n"


VERSUS = (
    ("avg_qoe", "avg QoE / FCFS"),
    ("throughput_tok_s", "tokens/s / FCFS"),
    ("loaded_tok_s", "tokens/s loaded / FCFS"),
)


def _spread(values: list[float]) -> str:
    """Median (min–max) of per-repeat ratios."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--model", default=str(ROOT / ".models" / "small-llama"))
    p.add_argument("--real-weights", action="store_true", help="load weights (GPU runs)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--arrivals", default="poisson,gamma")
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--rate", type=float, default=10.0, help="requests per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="runs of each server per arrival process")
    p.add_argument("--length-scale", type=float, default=0.25)
    p.add_argument("--speedup", type=float, default=10.0, help="tier scale F (1: human)")
    p.add_argument("--kv-blocks", type=int, default=48)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--stream-interval", type=int, default=4)
    p.add_argument("--nice", type=int, default=10, help="niceness of the vLLM servers")
    p.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM argument")
    p.add_argument(
        "--plugin-env", action="append", default=[], help="KEY=VALUE for the plugin's server"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL:KEY=VALUE[,KEY=VALUE...]: one more plugin server, its environment "
        "over --plugin-env's, reported as LABEL (e.g. p0.15:TOKENPACE_PREEMPTION_CAP=0.15)",
    )
    p.add_argument("--out", default=str(ROOT / "results" / "vllm_compare"))
    args = p.parse_args(argv)
    args.arrivals = args.arrivals.split(",")
    if args.repeats < 1:
        p.error(f"--repeats: must be at least 1, got {args.repeats}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plugin_env = dict(kv.split("=", 1) for kv in args.plugin_env)
    plan = [(mode, mode, plugin_env if mode == "andes" else {}) for mode in args.modes.split(",")]
    for variant in args.variant:
        label, _, settings = variant.partition(":")
        plan.append(
            (label, "andes", {**plugin_env, **dict(kv.split("=", 1) for kv in settings.split(","))})
        )
    servers = [
        VllmServer(
            args.python,
            args.model,
            f"bench-{label}",
            mode,
            out,
            kv_blocks=args.kv_blocks,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            extra_args=("--stream-interval", str(args.stream_interval), *args.vllm_arg),
            dummy_weights=not args.real_weights,
            nice=args.nice,
            env=env,
        )
        for label, mode, env in plan
    ]
    started = time.perf_counter()
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(timeout_s=900)
        print(f"servers ready in {time.perf_counter() - started:.0f} s", flush=True)
        results = asyncio.run(measure(args, servers))
    finally:
        for server in servers:
            server.stop()
    print(markdown(results))
    print(f"total {time.perf_counter() - started:.0f} s; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
