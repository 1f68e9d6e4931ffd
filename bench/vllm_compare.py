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
chat and 30 % batch tier. Every request uses ``ignore_eos`` so its length is exact.

Scaled to the engine's speed, measured first (``calibrate``): the first server streams
a full batch (``--max-num-seqs`` requests at once) four times in a row, and S is the
median request's tokens/s after its first token in the fastest of them
(:func:`vllm_harness.full_batch_speed`). Tiers are scaled by
F = S / (4.8·``--speed-ratio``): chat expects its first token in 1/F s and F×4.8
tokens/s, so a full batch streams ``--speed-ratio`` times faster than a chat reader
reads (1.75: the engine of the first runs, 85 tokens/s against chat's 48; in the
paper's Table 4 vLLM delivered 6.45 tokens/s against 4.8 under load, prefills
included); batch 60/F s and F×2 tokens/s.
Requests arrive at ``--load`` times the full batch's decode capacity (``max_num_seqs``
× S tokens/s over the mean reply length). ``--speedup`` and ``--rate`` fix F and the
rate instead.

Each server runs the workload ``--repeats`` times per arrival process, the servers'
order rotated from one repeat to the next (on a shared or noisy machine one run's
throughput moves by ±20 %). Reported per scheduler and arrival process, as the median
over the repeats: average and p10 client-measured Andes QoE, p90 TTFT (all replies,
and the readers' alone), what the readers saw (the share of the chat replies freezing
for over 2 and 5 s and the longest freeze: a batch job's reply has nobody watching it
stall, ``qos.policy.reader.NON_READER_TIERS``, so every reply's share is beside; user
idle latency p99 over every reply; from the token times received by the client through
the SDKs' release rule, ``qos.metrics``), token
throughput (tokens received over the span from the first request to the last token;
and "loaded": tokens received up to the last arrival over the span of arrivals, the
rate while the load lasts, without the drain at the end), preemptions per request,
tokens the engine computed per token delivered (recompute after preemptions shows
here), and the scheduler's own time per step (schedule(), the policy included) against
the whole step (schedule + model + update). Then each scheduler's QoE and throughput
over FCFS's in the same repeat (QoE, tokens/s, the readers' p90 TTFT, user idle latency
p99): median (min–max) of those ratios.
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
from vllm_harness import (
    Job,
    VllmServer,
    full_batch_speed,
    gateway_config,
    run_jobs,
    serve_gateway,
    summarize,
)

from qos.sim.workload import build_workload, load_andes_trace

ROOT = Path(__file__).resolve().parent.parent
MODES = ("fcfs", "priority", "andes")
FIGURES = (
    ("avg_qoe", "avg QoE", "{:.3f}"),
    ("p10_qoe", "p10 QoE", "{:.3f}"),
    ("p90_ttft_s", "p90 TTFT (s)", "{:.2f}"),
    ("readers_p90_ttft_s", "readers' p90 TTFT (s)", "{:.2f}"),
    ("frozen_over_2s", "readers frozen > 2 s", "{:.1%}"),
    ("frozen_over_5s", "readers frozen > 5 s", "{:.1%}"),
    ("longest_freeze_s", "readers' longest freeze (s)", "{:.1f}"),
    ("frozen_over_2s_all", "all frozen > 2 s", "{:.1%}"),
    ("longest_freeze_all_s", "all: longest freeze (s)", "{:.1f}"),
    ("idle_p99_s", "idle p99 (s)", "{:.1f}"),
    ("throughput_tok_s", "tokens/s", "{:.0f}"),
    ("loaded_tok_s", "tokens/s loaded", "{:.0f}"),
    ("preemptions_per_request", "preemptions/req", "{:.2f}"),
    ("computed_per_token", "computed/token", "{:.2f}"),
    ("schedule_ms_per_step", "schedule ms/step", "{:.3f}"),
    ("step_ms", "step ms", "{:.2f}"),
    ("schedule_share", "schedule share", "{:.1%}"),
    ("schedule_cpu_share", "schedule CPU share", "{:.1%}"),
)


def tiers(speedup: float) -> dict[str, dict[str, float]]:
    return {
        "chat": {"ttft": 1.0 / speedup, "tds": 4.8 * speedup, "priority": 1},
        "batch": {"ttft": 60.0 / speedup, "tds": 2.0 * speedup, "priority": 2},
    }


def workload(args: argparse.Namespace, arrivals: str, rate: float | None = None) -> list[Job]:
    """The trace's lengths, scaled, arriving by ``arrivals`` at ``rate`` (default
    ``args.rate``) requests/s, 70 % chat / 30 % batch."""
    mix = {"chat": (1.0, 4.8, 0.7), "batch": (60.0, 2.0, 0.3)}  # tier names and shares
    requests = build_workload(
        load_andes_trace(),
        args.rate if rate is None else rate,
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


async def calibrate(args: argparse.Namespace, servers: list[VllmServer]) -> None:
    """Warm every server up, measure S on the first, and set ``args.speedup`` and
    ``args.rate`` from it where not given (module docstring)."""
    n = args.max_num_seqs
    async with serve_gateway(gateway_config(servers, tiers(1.0))) as url:
        for server in servers:  # warm-up: every batch size up to max_num_seqs compiles
            warm = [Job(0.0, "batch", "warm up " * (i + 1), 4 + 2 * i) for i in range(n)]
            await run_jobs(url, server.name, warm)
        try:
            full_batch = await full_batch_speed(url, servers[0].name, n, "batch")
        except ValueError as exc:
            raise SystemExit(f"calibration: {exc}") from exc
    mean_reply = float(np.mean([j.max_tokens for j in workload(args, "poisson", rate=1.0)]))
    if args.speedup is None:
        args.speedup = full_batch / (4.8 * args.speed_ratio)
    if args.rate is None:
        args.rate = args.load * n * full_batch / mean_reply
    args.calibration = {"full_batch_tok_s": full_batch, "mean_reply_tokens": mean_reply}
    print(
        f"calibration: a full batch of {n} streams {full_batch:.1f} tokens/s per request; "
        f"speedup F = {args.speedup:.2f} (chat {4.8 * args.speedup:.1f} tokens/s), "
        f"rate {args.rate:.2f} requests/s",
        flush=True,
    )


async def measure(args: argparse.Namespace, servers: list[VllmServer]) -> dict[str, Any]:
    """Every server on the same jobs, ``--repeats`` times per arrival process.

    Each repeat runs the servers in turn, the order rotated by one from the repeat
    before, so a slow stretch of the machine does not always land on the same scheduler.
    """
    await calibrate(args, servers)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    async with serve_gateway(gateway_config(servers, tiers(args.speedup))) as url:
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
    ("readers_p90_ttft_s", "readers' p90 TTFT / FCFS"),
    ("idle_p99_s", "idle p99 / FCFS"),
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
    p.add_argument("--rate", type=float, help="requests per second (default: from --load)")
    p.add_argument(
        "--load",
        type=float,
        default=1.4,
        help="offered reply tokens/s over the full batch's decode capacity (without --rate)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="runs of each server per arrival process")
    p.add_argument("--length-scale", type=float, default=0.25)
    p.add_argument("--speedup", type=float, help="tier scale F, 1: human (default: measured)")
    p.add_argument(
        "--speed-ratio",
        type=float,
        default=1.75,
        help="a full batch's tokens/s per request over chat's (sets F without --speedup)",
    )
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
        help="LABEL[:KEY=VALUE,...]: one more plugin server, its environment over "
        "--plugin-env's, reported as LABEL (e.g. p0.15:TOKENPACE_PREEMPTION_CAP=0.15)",
    )
    p.add_argument(
        "--variant-vllm-arg",
        action="append",
        default=[],
        help="LABEL=ARG: one more vLLM argument for the --variant LABEL server only "
        "(e.g. andes-sync=--no-async-scheduling: the plugin on synchronous scheduling)",
    )
    p.add_argument("--out", default=str(ROOT / "results" / "vllm_compare"))
    args = p.parse_args(argv)
    args.arrivals = args.arrivals.split(",")
    if args.repeats < 1:
        p.error(f"--repeats: must be at least 1, got {args.repeats}")
    for flag in ("rate", "load", "speedup", "speed_ratio"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            p.error(f"--{flag.replace('_', '-')}: must be > 0, got {value}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plugin_env = dict(kv.split("=", 1) for kv in args.plugin_env)
    plan = [(mode, mode, plugin_env if mode == "andes" else {}) for mode in args.modes.split(",")]
    for variant in args.variant:
        label, _, settings = variant.partition(":")
        own = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        plan.append((label, "andes", {**plugin_env, **own}))
    variant_args: dict[str, list[str]] = {}
    for item in args.variant_vllm_arg:
        label, _, arg = item.partition("=")
        if label not in {variant.partition(":")[0] for variant in args.variant}:
            p.error(f"--variant-vllm-arg {item!r}: no --variant named {label!r}")
        variant_args.setdefault(label, []).append(arg)
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
            extra_args=(
                "--stream-interval",
                str(args.stream_interval),
                *args.vllm_arg,
                *variant_args.get(label, ()),
            ),
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
