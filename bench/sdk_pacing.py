"""What the Python client's pacing costs and how exact it is, and what its buffer is worth.

Starts the gateway (``tokenpace serve --config``, a process of its own) on its embedded
SIMULATED engine (qos.sim on the latency profile, no model runs), then in this process:

1. **Cost and accuracy.** ``--streams`` concurrent streams (started over ``--ramp``
   seconds) at each TDS in ``--tds`` (custom tiers), side by side: read with
   ``openai.AsyncOpenAI`` (not paced), and through ``tokenpace_client.AsyncOpenAI``
   with telemetry off and on. Release-time error: each token's display time minus its
   ideal release time, the digestion schedule d_k = max(t_k, d_(k-1) + 1/TDS) of its
   measured arrival times (Andes (Liu et al.) §3.1, docs/qoe.md). CPU: this process's
   CPU seconds (all threads) per 1,000 tokens and in % of a core; the difference to
   openai alone is what the client adds. The arrivals of the paced streams are then
   replayed from memory (no network, no openai) over the same ramp, ``--replay-repeats``
   rounds: read directly, with one bare ``asyncio.sleep`` per ideal release beside the
   read (the floor of any pacer that wakes for each release), and through ``apace`` with
   its release timers on each grid in ``--ticks``; the CPU difference to the direct read
   is the pacing's own cost. Loop lag: how late a 10 ms timer of the same event loop
   fires (p99), which separates the pacer's error from the process waiting for a CPU.
2. **What the buffer is worth.** An overloaded engine (``--overload-*``: the slower
   opt-66b profile with a small batch, Poisson arrivals of chat-tier streams), once with
   FCFS and once with the shipped Andes policy (``andes-tp``), the embedded backend's
   ``options.policy``. Per policy: rebuffering events (gaps over 2/TDS between
   consecutive tokens) per 100 tokens in the arrivals and in what the client displayed,
   with TTFT and QoE beside them.

Run it as ``flock /tmp/tokenpace-bench.lock .venv/bin/python bench/sdk_pacing.py``;
``--out DIR`` writes ``results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import tokenpace_client as tp
from launch import Server, free_port
from tokenpace_client import reader
from tokenpace_client.qoe import digestion_starts, token_times
from tokenpace_client.timeline import gaps_over

KEY = "tp-bench-sdk-0000000000000001"
PACED_MODEL, FCFS_MODEL, ANDES_MODEL = "sim", "sim-fcfs", "sim-andes"


def gateway_config(port: int, args: argparse.Namespace) -> dict[str, Any]:
    overload = {
        "profile": "opt-66b-4xa100",
        "max_batch": args.overload_batch,
        "default_output_tokens": [args.overload_tokens[0], args.overload_tokens[1]],
    }
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "tenants": [
            {
                "name": "bench",
                "api_keys": [{"key": KEY}],
                "allow_custom": True,
                "custom_tier_limits": {},  # any TDS the benchmark asks for
            }
        ],
        "backends": [
            {"name": "sim", "kind": "embedded", "models": [PACED_MODEL]},
            {
                "name": "fcfs",
                "kind": "embedded",
                "models": [FCFS_MODEL],
                "options": {**overload, "policy": "fcfs"},
            },
            {
                "name": "andes",
                "kind": "embedded",
                "models": [ANDES_MODEL],
                "options": {**overload, "policy": "andes-tp"},
            },
        ],
        "limits": {"max_tokens": 100000},
        "telemetry": {"requests_per_minute": 100000},
        "logging": {"level": "WARNING"},
    }


def start_gateway(tmp: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    cfg = tmp / "gateway.json"
    cfg.write_text(json.dumps(gateway_config(port, args)))
    tokenpace = Path(sys.executable).parent / "tokenpace"
    cmd = [str(tokenpace), "serve", "--config", str(cfg)]
    server = Server("gateway", cmd, port=port, ready_path="/readyz", log_dir=tmp)
    try:
        server.wait_ready(30.0, interval_s=0.1)
    except RuntimeError:
        server.stop()
        raise
    return server


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def release_errors(stream: tp.AsyncPacedStream) -> list[float]:
    """Per token: display time minus the ideal release time of its measured arrival."""
    ideal = digestion_starts(token_times(stream.timeline.arrivals), stream.tds)
    shown = token_times(stream.timeline.displayed)
    return [s - i for s, i in zip(shown, ideal, strict=True)]


def error_stats(errors: list[float]) -> dict[str, float]:
    return {
        "p50": 1000 * percentile(errors, 50),
        "p99": 1000 * percentile(errors, 99),
        "max": 1000 * max(errors),
        "min": 1000 * min(errors),
    }


async def one_stream(client: Any, model: str, i: int, tokens: int, body: dict) -> Any:
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"stream {i}"}],
        max_tokens=tokens,
        stream=True,
        extra_body=body,
    )
    got = 0
    async for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
    return stream, got


async def loop_lag(lags: list[float]) -> None:
    """Append how late each 10 ms sleep of this event loop wakes, until cancelled."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(0.01)
        lags.append(time.monotonic() - started - 0.01)


async def cost_run(base_url: str, tds: float, client_kind: str, args: argparse.Namespace) -> dict:
    """``--streams`` concurrent streams at ``tds``: CPU of this process, release errors."""
    tokens = min(args.max_tokens, max(20, round(tds * args.seconds)))
    paced = client_kind != "openai"
    if paced:
        sender = tp.TelemetrySender() if client_kind == "paced+telemetry" else False
        client = tp.AsyncOpenAI(
            base_url=base_url, api_key=KEY, max_retries=0, timeout=120.0, telemetry=sender
        )
    else:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120.0)
    body = {"tokenpace": {"tds": tds}}
    await one_stream(client, PACED_MODEL, -1, 5, body)  # warm the connection pool

    async def started(i: int) -> Any:
        await asyncio.sleep(args.ramp * i / args.streams)
        return await one_stream(client, PACED_MODEL, i, tokens, body)

    lags: list[float] = []
    ticker = asyncio.create_task(loop_lag(lags))
    cpu, wall = time.process_time(), time.monotonic()
    results = await asyncio.gather(*(started(i) for i in range(args.streams)))
    if client_kind == "paced+telemetry":
        await asyncio.to_thread(sender.flush, 30.0)  # its CPU counts
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    ticker.cancel()
    await client.close()
    total = sum(got for _, got in results)
    out = {
        "tds": tds,
        "client": client_kind,
        "streams": args.streams,
        "tokens_per_stream": tokens,
        "tokens": total,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_ms_per_1k_tokens": 1000 * cpu / total * 1000,
        "core_percent": 100 * cpu / wall,
        "loop_lag_ms": {"p50": 1000 * percentile(lags, 50), "p99": 1000 * percentile(lags, 99)},
    }
    if client_kind == "paced+telemetry":
        out["telemetry"] = dict(sender.stats)
    if paced:
        out["arrivals"] = [token_times(s.timeline.arrivals) for s, _ in results]
        out["release_error_ms"] = error_stats(
            [e for stream, _ in results for e in release_errors(stream)]
        )
    return out


async def replay_run(
    arrivals: list[list[float]], tds: float, ramp: float, mode: str, tick: float | None = None
) -> tuple[dict, list[float]]:
    """The measured arrival times replayed from memory (no network, no openai parsing).

    Each stream is an async generator that sleeps until each recorded arrival and yields
    a prebuilt chunk dict; stream i starts ``ramp · i / streams`` after the first, as
    in the measured run, so that the streams' releases are spread as they were.

    ``mode``: ``direct`` reads it as is; ``paced`` reads it through ``apace`` (telemetry
    off), its release timers on the ``tick`` grid (``tokenpace_client.reader.TICK_S``;
    ``None``: the shipped one); ``timers`` reads it as is while a second task per stream
    only sleeps (``asyncio.sleep``) until each token's ideal release time: one timer
    wake-up per release and nothing else, the floor of any pacer that wakes for each
    release. Paced or timers minus direct: the pacing's own CPU. Returns the row and the
    release errors (s).
    """
    chunk = {"choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}
    streams: list[tp.AsyncPacedStream] = []
    timer_errors: list[float] = []

    async def source(times: list[float], start: float):
        for t in times:
            delay = start + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            yield chunk

    async def sleep_through(times: list[float], start: float) -> int:
        for t in digestion_starts(times, tds):
            delay = start + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            timer_errors.append(time.monotonic() - start - t)
        return 0

    async def read(times: list[float], start: float) -> int:
        stream = source(times, start)
        if mode == "paced":
            stream = tp.apace(stream, tds=tds, telemetry=False)
            streams.append(stream)
        if mode == "timers":
            sleeping = asyncio.create_task(sleep_through(times, start))
            return sum([1 async for _ in stream]) + await sleeping
        return sum([1 async for _ in stream])

    shipped = reader.TICK_S
    reader.TICK_S = grid = shipped if tick is None else tick
    try:
        start, n = time.monotonic() + 0.1, len(arrivals)
        cpu, wall = time.process_time(), time.monotonic()
        tokens = sum(
            await asyncio.gather(
                *(read(times, start + ramp * i / n) for i, times in enumerate(arrivals))
            )
        )
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        reader.TICK_S = shipped
    names = {
        "direct": "replay, not paced",
        "timers": "replay + one asyncio.sleep per release (no pacer)",
        "paced": f"replay, paced, tick {1000 * grid:g} ms",
    }
    out = {
        "tds": tds,
        "client": names[mode],
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_ms_per_1k_tokens": 1000 * cpu / tokens * 1000,
        "core_percent": 100 * cpu / wall,
    }
    errors = [e for s in streams for e in release_errors(s)] + timer_errors
    if errors:
        out["release_error_ms"] = error_stats(errors)
    return out, errors


async def replays(arrivals: list[list[float]], tds: float, args: argparse.Namespace) -> list:
    """The replay read directly, with bare timers and paced (one per tick), side by side.

    ``--replay-repeats`` rounds, the configurations interleaved in each. A row: the
    median CPU over the rounds, the release errors of all rounds pooled (and each
    round's p99); rows other than direct add their own cost, minus direct per token
    (medians), and what it comes to in % of a core for ``--streams`` streams at ``tds``.
    """
    configs = [("direct", None), ("timers", None), *(("paced", t) for t in args.ticks)]
    runs: dict[tuple[str, float | None], list] = {c: [] for c in configs}
    for _ in range(args.replay_repeats):
        for mode, tick in configs:
            runs[mode, tick].append(await replay_run(arrivals, tds, args.ramp, mode, tick))
    direct = statistics.median(r["cpu_ms_per_1k_tokens"] for r, _ in runs["direct", None])
    rows = []
    for (mode, _tick), pairs in runs.items():
        done = [r for r, _ in pairs]
        row = {**done[0], "repeats": len(done)}
        for key in ("cpu_s", "wall_s", "cpu_ms_per_1k_tokens", "core_percent"):
            row[key] = statistics.median(r[key] for r in done)
        row["cpu_ms_per_1k_tokens_each"] = [r["cpu_ms_per_1k_tokens"] for r in done]
        if mode != "direct":
            row["release_error_ms"] = error_stats([e for _, errors in pairs for e in errors])
            row["release_error_p99_each"] = [r["release_error_ms"]["p99"] for r in done]
            row["pacing_us_per_token"] = row["cpu_ms_per_1k_tokens"] - direct
            row["pacing_core_percent"] = (
                100 * row["pacing_us_per_token"] * 1e-6 * args.streams * tds
            )
        rows.append(row)
    return rows


async def overload_run(base_url: str, model: str, args: argparse.Namespace) -> dict:
    """Poisson arrivals of paced chat-tier streams on an overloaded engine."""
    rng = random.Random(args.seed)
    client = tp.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, tier="chat")
    streams: list[Any] = []

    async def one(i: int, delay: float) -> None:
        await asyncio.sleep(delay)
        stream, _ = await one_stream(client, model, i, rng_tokens[i], {})
        streams.append(stream)

    starts, t = [], 0.0
    for _ in range(args.overload_requests):
        t += rng.expovariate(args.overload_rate)
        starts.append(t)
    lo, hi = args.overload_tokens
    rng_tokens = [rng.randint(lo, hi) for _ in starts]
    await asyncio.gather(*(one(i, s) for i, s in enumerate(starts)))
    await client.close()
    tds = streams[0].tds
    limit = 2.0 / tds
    tokens = sum(n for s in streams for _, n in s.timeline.arrivals)

    def per_100(kind: str) -> float:
        events = sum(gaps_over(getattr(s.timeline, kind), limit) for s in streams)
        return 100.0 * events / tokens

    ttfts = [s.timeline.arrivals[0][0] for s in streams]
    return {
        "model": model,
        "requests": len(streams),
        "tokens": tokens,
        "rebuffering_per_100_tokens": {
            "arrivals": per_100("arrivals"),
            "displayed": per_100("displayed"),
        },
        "ttft_s": {"p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90)},
        "qoe_mean": {
            name: statistics.fmean(getattr(s.qoe, name) for s in streams)
            for name in ("andes", "monotone", "displayed_andes", "displayed_monotone")
        },
    }


def table(results: dict) -> str:
    lines = [
        "| TDS | client | tokens | CPU ms / 1k tokens | % of a core "
        "| release error p50 / p99 / max (ms) | loop lag p50 / p99 (ms) "
        "| pacing's own µs / token (% of a core) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["cost"]:
        err = r.get("release_error_ms")
        shown = f"{err['p50']:.2f} / {err['p99']:.2f} / {err['max']:.2f}" if err else "-"
        lag = r.get("loop_lag_ms")
        lags = f"{lag['p50']:.2f} / {lag['p99']:.2f}" if lag else "-"
        own = r.get("pacing_us_per_token")
        pacing = f"{own:.1f} ({r['pacing_core_percent']:.2f})" if own is not None else "-"
        lines.append(
            f"| {r['tds']:g} | {r['client']} | {r['tokens']} | "
            f"{r['cpu_ms_per_1k_tokens']:.1f} | {r['core_percent']:.2f} | {shown} | {lags} "
            f"| {pacing} |"
        )
    lines += [
        "",
        "| policy | requests | tokens | rebuffering / 100 tokens: arrivals | displayed "
        "| TTFT p50 / p90 (s) | QoE arrivals (Andes / monotone) | QoE displayed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["overload"]:
        q, reb = r["qoe_mean"], r["rebuffering_per_100_tokens"]
        lines.append(
            f"| {r['model']} | {r['requests']} | {r['tokens']} | {reb['arrivals']:.2f} | "
            f"{reb['displayed']:.2f} | {r['ttft_s']['p50']:.2f} / {r['ttft_s']['p90']:.2f} | "
            f"{q['andes']:.3f} / {q['monotone']:.3f} | "
            f"{q['displayed_andes']:.3f} / {q['displayed_monotone']:.3f} |"
        )
    return "\n".join(lines)


async def run(base_url: str, args: argparse.Namespace) -> dict:
    results: dict[str, Any] = {"cost": [], "overload": []}
    recorded: list[list[float]] = []
    for tds in args.tds:
        for kind in ("openai", "paced", "paced+telemetry"):
            results["cost"].append(await cost_run(base_url, tds, kind, args))
            recorded = results["cost"][-1].pop("arrivals", None) or recorded
            print(json.dumps(results["cost"][-1]), flush=True)
        for row in await replays(recorded, tds, args):
            results["cost"].append(row)
            print(json.dumps(row), flush=True)
    for model in (FCFS_MODEL, ANDES_MODEL) if args.overload_requests else ():
        results["overload"].append(await overload_run(base_url, model, args))
        print(json.dumps(results["overload"][-1]), flush=True)
    sender = tp.default_sender()
    await asyncio.to_thread(sender.flush, 30.0)  # the reports, before the gateway goes
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--tds", type=float, nargs="+", default=[4.8, 50.0])
    parser.add_argument("--seconds", type=float, default=10.0, help="reading time per stream")
    parser.add_argument("--max-tokens", type=int, default=300, help="cap on tokens per stream")
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds to start the streams")
    parser.add_argument(
        "--ticks",
        type=float,
        nargs="+",
        default=[0.0, reader.TICK_S, 0.004, 0.008],
        help="release timer grids (s) the replay is paced with, side by side",
    )
    parser.add_argument("--replay-repeats", type=int, default=3)
    parser.add_argument("--overload-requests", type=int, default=80)
    parser.add_argument("--overload-rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--overload-batch", type=int, default=8)
    parser.add_argument("--overload-tokens", type=int, nargs=2, default=[30, 90])
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gateway = start_gateway(Path(tmp), args)
        try:
            results = asyncio.run(run(f"http://127.0.0.1:{gateway.port}/v1", args))
        finally:
            gateway.stop()
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    results["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    print(table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
