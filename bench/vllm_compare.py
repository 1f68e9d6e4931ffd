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

Reported per scheduler and arrival process: average and p10 client-measured Andes QoE,
p90 TTFT, token throughput (tokens received over the span from the first request to
the last token; and "loaded": tokens received up to the last arrival over the span of
arrivals, the rate while the load lasts, without the drain at the end), preemptions
per request, and the scheduler's own time per step (schedule(), the policy included)
against the whole step (schedule + model + update).
Results go to ``--out`` (JSON and a markdown table).

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
    results: dict[str, Any] = {}
    async with serve_gateway(gateway_config(servers, tiers(args.speedup))) as url:
        for server in servers:  # warm-up: every batch size up to max_num_seqs compiles
            n = args.max_num_seqs
            warm = [Job(0.0, "batch", "warm up " * (i + 1), 4 + 2 * i) for i in range(n)]
            await run_jobs(url, server.name, warm)
        for arrivals in args.arrivals:
            jobs = workload(args, arrivals)
            for server in servers:
                before = server.stats()
                runs = await run_jobs(url, server.name, jobs)
                await asyncio.sleep(STATS_SETTLE_S)  # stats are rewritten when the engine idles
                after = server.stats()
                delta = {
                    k: after[k] - before.get(k, 0)
                    for k in after
                    if isinstance(after[k], int | float) and not isinstance(after[k], bool)
                }
                incomplete = sum(r.completion_tokens != r.job.max_tokens for r in runs)
                figures = summarize(runs, delta)
                figures["incomplete"] = incomplete
                label = server.name.removeprefix("bench-")
                results.setdefault(arrivals, {})[label] = figures
                print(f"{arrivals:8s} {label:9s} " + _row(figures), flush=True)
                save(args, results)  # as it goes: a long run keeps what it measured
    return results


def save(args: argparse.Namespace, results: dict[str, Any]) -> None:
    out = Path(args.out)
    report = {"command": " ".join(sys.argv), "settings": vars(args), "results": results}
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))


STATS_SETTLE_S = 1.5


def _row(figures: dict[str, float]) -> str:
    return "  ".join(f"{label} {fmt.format(figures[key])}" for key, label, fmt in FIGURES)


def markdown(results: dict[str, Any]) -> str:
    head = "| arrivals | scheduler | " + " | ".join(label for _, label, _ in FIGURES) + " |"
    lines = [head, "|" + " --- |" * (len(FIGURES) + 2)]
    for arrivals, by_mode in results.items():
        for mode, f in by_mode.items():
            cells = " | ".join(fmt.format(f[key]) for key, _, fmt in FIGURES)
            lines.append(f"| {arrivals} | {mode} | {cells} |")
    return "\n".join(lines) + "\n"


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
